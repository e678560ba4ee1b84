"""The one place an engine is chosen and made: ``ASR_ENGINE__BACKEND`` names it.

Each backend is a function from the settings to an ``Engine`` that declares its
``EngineCapabilities``. ``check_engine`` refuses, at start-up and with one clear line, an
engine the pipeline cannot feed (another sample rate); the sessions adapt to the rest
(no prefix forcing: nothing is committed from partials; no word timestamps: a stream that
asks for them is refused).
"""

from __future__ import annotations

from collections.abc import Callable

from asr_server.audio.decode import SAMPLE_RATE
from asr_server.engine.base import Engine
from asr_server.settings import Settings

#: ``ASR_ENGINE__MODEL=fake`` (kept for existing scripts): the same as ``BACKEND=fake``
FAKE_MODEL = "fake"


class EngineConfigError(RuntimeError):
    """An engine the server cannot use; the message says why and what to change."""


def _faster_whisper(settings: Settings) -> Engine:
    from asr_server.engine.models import resolve_model
    from asr_server.engine.whisper import WhisperEngine

    e = settings.engine
    return WhisperEngine(
        resolve_model(e.model, e.cache_dir),
        device=e.device,
        compute_type=e.compute_type,
        cpu_threads=e.cpu_threads,
        workers=e.workers,
        max_batch_size=e.max_batch_size,
        min_window_s=e.min_window_s,
        final_min_window_s=e.final_min_window_s,
        final_beam_size=e.final_beam_size,
    )


def _fake(settings: Settings) -> Engine:
    """The scripted fake engine: for tests and load-balancer drills, where real processes
    and proxies matter and recognition does not."""
    from asr_server.engine.fake import FakeEngine

    return FakeEngine(record_calls=False)  # nothing reads its calls: keeping them would grow


BACKENDS: dict[str, Callable[[Settings], Engine]] = {
    "faster-whisper": _faster_whisper,
    "fake": _fake,
}


def create_engine(settings: Settings) -> Engine:
    """The configured engine (runs in a worker thread at start-up; the app then checks it,
    as it checks an engine from any other factory)."""
    backend = "fake" if settings.engine.model == FAKE_MODEL else settings.engine.backend
    return BACKENDS[backend](settings)


def check_engine(engine: Engine) -> None:
    rate = engine.capabilities.sample_rate
    if rate != SAMPLE_RATE:
        raise EngineConfigError(
            f"engine {engine.name!r} takes {rate} Hz audio; this server's pipeline (voice "
            f"detection, resampling) works at {SAMPLE_RATE} Hz"
        )
