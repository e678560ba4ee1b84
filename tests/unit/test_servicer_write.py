"""A response write that fails because the client left: the client's leaving, not an error."""

from __future__ import annotations

import grpc
import pytest

from asr_server.metrics import Metrics
from asr_server.session import Progress, RecognitionResult
from asr_server.settings import Settings
from asr_server.transport.admission import Admission
from asr_server.transport.servicer import ClientLeft, RecognizerServicer, response_writer

RESULT = RecognitionResult(
    is_final=True,
    stable_text="hello",
    unstable_text="",
    start_s=0,
    end_s=1,
    utterance_id=0,
    channel=0,
    language="en",
)
PROGRESS = Progress(1.0, 1.0, 1.0)


class FailingWrites:
    """A servicer context whose writes fail, as grpc's do on a call the client cancelled
    ("Failed execute_batch")."""

    def __init__(self, *, cancelled: bool) -> None:
        self._cancelled = cancelled
        self.aborted: tuple[object, ...] | None = None

    async def write(self, message: object) -> None:
        raise RuntimeError('Failed "execute_batch": (SendMessageOperation)')

    def cancelled(self) -> bool:
        return self._cancelled

    def done(self) -> bool:
        return self._cancelled

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5000"

    def invocation_metadata(self) -> tuple[()]:
        return ()

    async def abort(self, *args: object) -> None:
        self.aborted = args

    def add_done_callback(self, callback: object) -> None:
        pass  # (admission's count of unanswered calls: the call is never answered here)


async def test_a_write_the_client_cancelled_raises_client_left() -> None:
    with pytest.raises(ClientLeft):
        await response_writer(FailingWrites(cancelled=True), 0.0)(RESULT, PROGRESS)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError):  # the call still open: a real failure, as it was
        await response_writer(FailingWrites(cancelled=False), 0.0)(RESULT, PROGRESS)  # type: ignore[arg-type]


async def test_a_call_whose_client_left_mid_write_counts_as_cancelled(caplog) -> None:  # type: ignore[no-untyped-def]
    """It was counted and logged as INTERNAL ("unexpected server error", a traceback)."""
    metrics = Metrics()
    servicer = RecognizerServicer(
        None, admission=Admission(Settings(), metrics), model_name="fake", languages=None
    )
    servicer.services = object()  # type: ignore[assignment]  # (ready: the body needs none)
    context = FailingWrites(cancelled=True)

    async def body(services: object, ticket: object) -> None:
        await response_writer(context, 0.0)(RESULT, PROGRESS)  # type: ignore[arg-type]

    await servicer._serve_call("s1", context, body)  # type: ignore[arg-type]
    assert context.aborted is None
    streams = {
        s.labels["code"]: s.value
        for m in metrics.registry.collect()
        if m.name == "asr_streams"
        for s in m.samples
        if s.name == "asr_streams_total" and s.value  # (every outcome's series is there)
    }
    assert streams == {"CANCELLED": 1.0}, streams
    assert "unexpected server error" not in caplog.text
    assert grpc.StatusCode.INTERNAL.name not in caplog.text
