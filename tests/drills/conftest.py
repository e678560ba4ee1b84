"""The drills share the real-speech fixtures of tests/integration/test_resume_real.py."""

from tests.integration.test_resume_real import pcm, reference  # noqa: F401
