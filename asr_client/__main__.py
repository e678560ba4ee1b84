"""``python -m asr_client`` is ``asr-client``."""

from asr_client.cli import main

main()
