"""The engine plug point (asr_server/engine/factory.py) and what engines declare."""

from __future__ import annotations

import pydantic
import pytest

from asr_server.engine.base import EngineCapabilities
from asr_server.engine.factory import EngineConfigError, check_engine, create_engine
from asr_server.engine.fake import FakeEngine
from asr_server.settings import Settings


def test_the_backend_setting_chooses_the_engine() -> None:
    assert isinstance(create_engine(Settings(engine={"backend": "fake"})), FakeEngine)
    # the older spelling, kept for scripts that use it
    assert isinstance(create_engine(Settings(engine={"model": "fake"})), FakeEngine)
    with pytest.raises(pydantic.ValidationError, match="faster-whisper"):
        Settings(engine={"backend": "kaldi"})


def test_an_engine_at_another_sample_rate_is_refused_with_a_reason() -> None:
    engine = FakeEngine(capabilities=EngineCapabilities(sample_rate=8_000))
    with pytest.raises(EngineConfigError, match="takes 8000 Hz audio.*works at 16000 Hz"):
        check_engine(engine)
    check_engine(FakeEngine())  # 16 kHz: fine
