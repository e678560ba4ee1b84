"""What the client library and the server must agree on outside the proto."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from asr_client import api
from asr_client.connection import ConnectionOptions
from asr_client.resume import ResumePolicy
from asr_client.retry import balancing_service_config, retry_delay
from asr_server.transport import servicer


def test_client_and_server_name_the_admission_headers_alike() -> None:
    assert api.ADMITTED_HEADER == servicer.ADMITTED_HEADER
    assert api.IDLE_TIMEOUT_HEADER == servicer.IDLE_TIMEOUT_HEADER


def test_grpc_retries_nothing_itself() -> None:
    # grpc core's replay of a bidi stream lost messages, and its retry policy retried a
    # request over the server's message limit five times (see retry.py): no retry policy
    config = json.loads(balancing_service_config())
    assert config == {"loadBalancingConfig": [{"round_robin": {}}]}


@pytest.mark.parametrize(
    ("code", "trailing", "attempt", "delay"),
    [
        # an admission refusal: after the server's pushback
        (grpc.StatusCode.RESOURCE_EXHAUSTED, [("grpc-retry-pushback-ms", "235")], 1, 0.235),
        (grpc.StatusCode.UNAVAILABLE, [("grpc-retry-pushback-ms", "50")], 4, 0.05),
        # grpc's own "message larger than max", or the server's: final
        (grpc.StatusCode.RESOURCE_EXHAUSTED, [], 1, None),
        # a proxy's refusal, no replica there: backoff, doubling to 1 s
        (grpc.StatusCode.UNAVAILABLE, None, 1, 0.1),
        (grpc.StatusCode.UNAVAILABLE, [], 3, 0.4),
        (grpc.StatusCode.UNAVAILABLE, [], 4, 0.8),
        # the server says no, the attempts are spent, or it is no refusal
        (grpc.StatusCode.UNAVAILABLE, [("grpc-retry-pushback-ms", "-1")], 1, None),
        (grpc.StatusCode.UNAVAILABLE, [("grpc-retry-pushback-ms", "soon")], 1, None),
        (grpc.StatusCode.UNAVAILABLE, [("grpc-retry-pushback-ms", "50")], 5, None),
        (grpc.StatusCode.INVALID_ARGUMENT, [("grpc-retry-pushback-ms", "50")], 1, None),
    ],
)
def test_a_refused_recognize_is_made_again_only_after_an_admission_refusal(
    code: grpc.StatusCode, trailing: list[tuple[str, str]] | None, attempt: int, delay: float | None
) -> None:
    assert retry_delay(code, trailing, attempt) == delay


def test_a_stream_update_names_only_what_changes_and_a_new_call_starts_from_it() -> None:
    update = api.stream_update(turn_threshold=0.9, hotwords=["Ishmael"])
    assert update.HasField("turn_threshold") and not update.HasField("max_silence_ms")
    assert update.replace_hotwords and list(update.hotwords) == ["Ishmael"]
    assert not api.stream_update(turn_threshold=0.9).replace_hotwords  # hotwords unchanged
    assert api.stream_update(hotwords=[]).replace_hotwords  # cleared
    config = api.audio_config(endpointing="semantic", max_silence_ms=3000, hotwords=["old"])
    merged = api.updated_config(config, update)
    assert merged.endpointing.turn_threshold == pytest.approx(0.9)  # (a float32 on the wire)
    assert merged.endpointing.max_silence_ms == 3000
    assert list(merged.hotwords) == ["Ishmael"]
    assert list(config.hotwords) == ["old"]  # the original is left as it was
    assert not merged.endpointing.eager_finals
    eager = api.stream_update(eager_finals=True)
    assert eager.HasField("eager_finals") and not update.HasField("eager_finals")
    assert api.updated_config(config, eager).endpointing.eager_finals
    on = api.updated_config(config, eager)
    off = api.updated_config(on, api.stream_update(eager_finals=False))
    assert not off.endpointing.eager_finals


async def channel_arguments(monkeypatch: pytest.MonkeyPatch, **client: object) -> dict[str, object]:
    """The channel arguments an ``AsrClient(**client)`` gets, as grpc reads them (the
    first of two equal names counts)."""
    given: list[tuple[str, object]] = []
    make = ConnectionOptions.channel

    def channel(self: ConnectionOptions, options: list[tuple[str, object]]) -> object:
        given.extend(options)
        return make(self, options)

    monkeypatch.setattr(ConnectionOptions, "channel", channel)
    await api.AsrClient("127.0.0.1:1", **client).close()  # type: ignore[arg-type]
    first: dict[str, object] = {}
    for name, value in given:
        first.setdefault(name, value)
    return first


async def test_the_channel_reconnects_at_least_as_often_as_a_resume_tries(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # grpc's own reconnect backoff grows to 120 s: a resume within give_up_after_s would
    # find the channel still waiting out its backoff after the server came back
    policy = ResumePolicy(max_backoff_s=0.5)
    args = await channel_arguments(monkeypatch, resume=policy)
    assert args["grpc.max_reconnect_backoff_ms"] == 500
    assert args["grpc.initial_reconnect_backoff_ms"] <= 500  # type: ignore[operator]
    default = await channel_arguments(monkeypatch)  # the default policy; and with no resume
    assert default["grpc.max_reconnect_backoff_ms"] == ResumePolicy().max_backoff_s * 1000
    assert await channel_arguments(monkeypatch, resume=None) == default
    # a caller's own choice comes first
    mine = await channel_arguments(monkeypatch, options=[("grpc.max_reconnect_backoff_ms", 9000)])
    assert mine["grpc.max_reconnect_backoff_ms"] == 9000


class ReadyOnCue:
    """A channel whose ``channel_ready()`` is a future the test completes."""

    def __init__(self) -> None:
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def channel_ready(self) -> asyncio.Future[None]:
        return self.ready


async def test_wait_ready_gives_up_after_its_timeout() -> None:
    client = api.AsrClient("127.0.0.1:1")
    client._channel = ReadyOnCue()  # type: ignore[assignment]
    with pytest.raises(TimeoutError):
        await client.wait_ready(0.01)


async def test_a_cancel_as_the_channel_becomes_ready_still_cancels() -> None:
    # Ctrl-C landing in the same turn of the loop as the connection: the command must
    # stop (on Python 3.11 asyncio.wait_for returned instead, and the cancel was lost)
    client = api.AsrClient("127.0.0.1:1")
    channel = ReadyOnCue()
    client._channel = channel  # type: ignore[assignment]
    waiting = asyncio.create_task(client.wait_ready(5))
    await asyncio.sleep(0)
    channel.ready.set_result(None)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting


@pytest.mark.parametrize("audio_bytes", [0, 1, 127, 128, 16_383, 16_384, 2_097_152, 67_108_864])
def test_a_recognize_requests_size_is_known_without_building_it(audio_bytes: int) -> None:
    # the CLI checks a file against the per-call limit before it sends it; building the
    # request to measure it would hold a second copy of the audio
    config = api.audio_config(sample_rate_hz=8_000, channels=2, language="en")
    built = api.asr_pb2.RecognizeRequest(config=config, audio=bytes(audio_bytes)).ByteSize()
    assert api.recognize_request_size(config, audio_bytes) == built


def test_the_names_the_docs_use_come_from_asr_client() -> None:
    """The README and docs/scale-out.md told users to use ResumePolicy(...) and
    balancing_service_config(), and `from asr_client import` found neither."""
    import re

    import asr_client
    from tests.helpers import ROOT

    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    text = "\n".join(p.read_text() for p in docs)
    for name in ("ResumePolicy", "ResumeInfo", "ResumeError", "balancing_service_config"):
        assert re.search(rf"\b{name}\b", text), name  # (the docs name it)
        assert name in asr_client.__all__ and getattr(asr_client, name) is not None
