"""The engine plug point (asr_server/engine/factory.py) and what engines declare."""

from __future__ import annotations

import numpy as np
import pydantic
import pytest

from asr_server.engine.base import DecodeKind, DecodeRequest, EngineCapabilities
from asr_server.engine.factory import EngineConfigError, check_engine, create_engine
from asr_server.engine.fake import FakeEngine
from asr_server.engine.whisper import engine_layout
from asr_server.settings import Settings


def test_the_backend_setting_chooses_the_engine() -> None:
    assert isinstance(create_engine(Settings(engine={"backend": "fake"})), FakeEngine)
    # the older spelling, kept for scripts that use it
    assert isinstance(create_engine(Settings(engine={"model": "fake"})), FakeEngine)
    with pytest.raises(pydantic.ValidationError, match="faster-whisper"):
        Settings(engine={"backend": "kaldi"})


def test_a_server_on_the_fake_backend_keeps_no_request_audio() -> None:
    """A drill replica (``ASR_ENGINE__MODEL=fake``) may stream for hours: the requests,
    each with a copy of its utterance's audio, must not pile up (half an hour of one
    stream kept 290 MB before). A FakeEngine made by a test still records them for inspection."""
    request = DecodeRequest(np.full(16_000, 0.1, np.float32), DecodeKind.FINAL)
    served = create_engine(Settings(engine={"backend": "fake"}))
    assert served.transcribe([request])[0].text == "w0 w1 w2 w3"
    assert served.calls == []  # type: ignore[attr-defined]
    inspected = FakeEngine()
    inspected.transcribe([request])
    assert inspected.calls == [[request]]


def test_an_engine_at_another_sample_rate_is_refused_with_a_reason() -> None:
    engine = FakeEngine(capabilities=EngineCapabilities(sample_rate=8_000))
    with pytest.raises(EngineConfigError, match="takes 8000 Hz audio.*works at 16000 Hz"):
        check_engine(engine)
    check_engine(FakeEngine())  # 16 kHz: fine


@pytest.mark.parametrize(
    ("device", "cores", "asked", "layout"),
    [
        ("cpu", 2, (0, 0), (2, 1)),
        # one single-threaded call per core on big machines too (it was 8 calls of 2
        # threads on 16 cores, slower on both machines measured)
        ("cpu", 16, (0, 0), (16, 1)),
        ("cpu", 96, (0, 0), (64, 1)),
        ("cpu", 16, (1, 0), (1, 1)),
        ("cpu", 16, (4, 4), (4, 4)),  # what the operator sets is kept
        ("cuda", 16, (0, 0), (1, 4)),
    ],
)
def test_the_engine_layout_is_one_single_threaded_call_per_core_on_a_cpu(
    device: str, cores: int, asked: tuple[int, int], layout: tuple[int, int]
) -> None:
    assert engine_layout(device, cores, *asked) == layout
