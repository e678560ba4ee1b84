"""The server's backpressure on every bridge route (/ws, Deepgram's, Flux's, OpenAI
Realtime's): a server slower than the audio ends the session with a reason and close
1013, before the socket's keepalive would end it without one; and a client that leaves
while a write waits on the server frees its gRPC stream at once, not when the write
gives up."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import soxr
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from asr_server.engine.fake import FakeEngine
from tests.helpers import encode_container, entered, eventually, serve_fake, tone
from tests.integration.test_bridge import events_until_close, health

pytestmark = pytest.mark.timeout(60)

FRAME_S = 0.05


def _pcm16(rate: int) -> bytes:
    samples = (tone(FRAME_S) * 32767).astype(np.int16)
    if rate != 16_000:
        samples = soxr.resample(samples, 16_000, rate)
    return samples.astype("<i2").tobytes()


@dataclass(frozen=True)
class Route:
    path: str
    #: one frame of FRAME_S seconds of tone, as this route's client sends it
    frame: Callable[[], str | bytes]
    #: the message the route sends when the socket opens, before any audio (or None)
    greeting: str | None = None
    #: what the client sends first (or None), which the greeting answers
    start: str | None = None


ROUTES = {
    "ws": Route(
        "/ws",
        lambda: _pcm16(16_000),
        greeting="ready",
        start=json.dumps({"type": "start", "sample_rate": 16_000}),
    ),
    "deepgram": Route("/v1/listen?encoding=linear16&sample_rate=16000", lambda: _pcm16(16_000)),
    "flux": Route(
        "/v2/listen?model=flux-general-en&encoding=linear16&sample_rate=16000",
        lambda: _pcm16(16_000),
    ),
    "realtime": Route(
        "/v1/realtime?intent=transcription",
        lambda: json.dumps(
            {
                "type": "input_audio_buffer.append",
                "audio": base64.b64encode(_pcm16(24_000)).decode(),
            }
        ),
        greeting="session.created",
    ),
}


async def open_route(bridge: Any, route: Route) -> ClientConnection:
    # (the socket's own keepalive is off: the bridge must end the session first)
    ws = await connect(f"ws://127.0.0.1:{bridge.port}{route.path}", ping_interval=None)
    if route.start is not None:
        await ws.send(route.start)
    if route.greeting is not None:
        assert json.loads(await ws.recv())["type"] == route.greeting
    return ws


def server_takes_audio_at(monkeypatch: pytest.MonkeyPatch, speed: float) -> None:
    """Every gRPC write of audio takes its length divided by ``speed`` (16-bit at 16 kHz
    counted; the fake engine itself is instant)."""
    from asr_client.resume import ResumableStream

    send_audio = ResumableStream.send_audio

    async def at_speed(self: ResumableStream, data: bytes) -> None:
        await asyncio.sleep(len(data) / 32_000 / speed)
        await send_audio(self, data)

    monkeypatch.setattr(ResumableStream, "send_audio", at_speed)


async def transcribed_whole(
    url: str, data: bytes, piece: int, seconds: float, command: str | None = None
) -> None:
    """``data`` (``seconds`` of audio) to a Deepgram route as fast as the socket takes it,
    in pieces of ``piece`` bytes (each followed by ``command``, if any), then
    CloseStream: the session must end normally, its Metadata counting all the audio."""
    async with connect(url) as ws:

        async def send() -> None:
            with contextlib.suppress(ConnectionClosed):
                for i in range(0, len(data), piece):
                    await ws.send(data[i : i + piece])
                    if command is not None:
                        await ws.send(json.dumps({"type": command}))
                await ws.send(json.dumps({"type": "CloseStream"}))

        sender = asyncio.create_task(send())
        messages = await asyncio.wait_for(events_until_close(ws), 30)
        await sender
    assert ws.close_code == 1000, (ws.close_code, ws.close_reason, messages[-1:])
    assert messages[-1]["type"] == "Metadata"
    assert messages[-1]["duration"] == pytest.approx(seconds, abs=0.01)


@pytest.mark.parametrize("name", ROUTES)
async def test_a_server_slower_than_the_audio_ends_the_session_with_a_reason(  # type: ignore[no-untyped-def]
    make_server, make_bridge, monkeypatch, name: str
) -> None:
    """Each write completes (the server takes audio at a third of its speed or slower), so
    no one write waits past the deadline; but the client's pong waits behind the audio
    the bridge has not read, and the socket's ping timeout ended the session with 1011
    and no reason. The bridge ends it first: an error saying why, and 1013."""
    from asr_bridge import app, session

    monkeypatch.setattr(app, "WS_PING_INTERVAL_S", 0.5)
    monkeypatch.setattr(app, "WS_PING_TIMEOUT_S", 3.0)
    monkeypatch.setattr(session, "UPSTREAM_WRITE_DEADLINE_S", 1.0)
    server_takes_audio_at(monkeypatch, 0.5)
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port)
    route = ROUTES[name]
    frame = route.frame()
    ws = await open_route(bridge, route)

    async def real_time() -> None:
        with contextlib.suppress(ConnectionClosed):
            while True:
                await ws.send(frame)
                await asyncio.sleep(FRAME_S)

    sender = asyncio.create_task(real_time())
    try:
        messages = await asyncio.wait_for(events_until_close(ws), 20)
    finally:
        sender.cancel()
    # (1013 is the bridge's: the ping timeout, 3 s here, would have closed with 1011)
    assert ws.close_code == 1013, (ws.close_code, ws.close_reason)
    assert "the server fell behind" in json.dumps(messages[-1]), messages[-1]
    await eventually(lambda: server.servicer.active == 0)


@pytest.mark.parametrize("name", ROUTES)
async def test_a_client_leaving_during_push_back_frees_the_stream_at_once(  # type: ignore[no-untyped-def]
    make_server, make_bridge, name: str
) -> None:
    """The bridge reads nothing while a write waits on the server, so the socket closing
    went unseen until the write deadline (20 s), and was counted as the server's fault."""
    gate = threading.Event()
    engine = FakeEngine(gate=gate)
    stuck = entered(engine)
    server = await serve_fake(make_server, engine, streaming={"max_buffered_audio_s": 0.5})
    bridge = await make_bridge(server.port)
    route = ROUTES[name]
    frame = route.frame()
    try:
        ws = await open_route(bridge, route)
        sent = 0

        async def flood() -> None:
            nonlocal sent
            while True:
                await ws.send(frame)
                sent += 1

        sender = asyncio.create_task(flood())
        await asyncio.wait_for(stuck.wait(), 10)
        last = -1
        while sent != last:  # noqa: ASYNC110 - waiting for the push-back to reach the client
            last = sent
            await asyncio.sleep(0.3)
        sender.cancel()
        ws.transport.abort()
        # well within the write deadline (20 s), which would also count an error; not a
        # tighter bound: the backlog read before the close is seen takes seconds on a
        # loaded machine (the realtime route's JSON most)
        await eventually(lambda: server.servicer.active == 0, timeout_s=10.0)
        assert (await asyncio.to_thread(health, bridge))["sessions"] == 0
    finally:
        gate.set()
    errors = bridge.metrics.registry.get_sample_value(
        "asr_bridge_session_errors_total", {"code": "RESOURCE_EXHAUSTED"}
    )
    assert not errors


async def test_a_container_sent_faster_than_real_time_with_commands_is_not_cut(  # type: ignore[no-untyped-def]
    make_server, make_bridge, monkeypatch
) -> None:
    """A WAV file sent as fast as the socket takes it, a command after each piece, to a
    server that keeps up (four times real time). The commands' waits on the decoder were
    counted against the audio's pace, which a container's bytes never paid back: the
    session ended with 1013 "the server fell behind" while the server kept up."""
    from asr_bridge import session

    monkeypatch.setattr(session, "UPSTREAM_WRITE_DEADLINE_S", 1.0)
    server_takes_audio_at(monkeypatch, 4)
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port)
    pcm = (tone(12.0) * 32767).astype(np.int16).reshape(-1, 1)
    data = encode_container(pcm, 16_000, "wav", "pcm_s16le", out_rate=16_000)
    url = f"ws://127.0.0.1:{bridge.port}/v1/listen"
    # (half-second pieces; every command takes the same path: KeepAlive stands for all)
    await transcribed_whole(url, data, 16_000, 12.0, "KeepAlive")


async def test_a_file_sent_faster_than_the_server_takes_it_is_not_cut_by_the_ping_timeout(  # type: ignore[no-untyped-def]
    make_server, make_bridge, monkeypatch
) -> None:
    """Raw audio sent as fast as the socket takes it, to a server that keeps up (sixteen
    times real time) but slower than it comes: the audio queued in TCP takes longer to
    read than the ping timeout, and the client's pong is behind it. The session ended
    with 1011 "keepalive ping timeout", mid-transcript; the bridge now waits for a pong
    while it is still reading the client's bytes (asr_bridge/socket_protocol.py)."""
    from asr_bridge import app

    monkeypatch.setattr(app, "WS_PING_INTERVAL_S", 0.3)
    monkeypatch.setattr(app, "WS_PING_TIMEOUT_S", 1.5)
    server_takes_audio_at(monkeypatch, 16)
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port)
    audio = (tone(48.0) * 32767).astype("<i2").tobytes()  # 3 s to read: past the 1.5 s
    url = f"ws://127.0.0.1:{bridge.port}/v1/listen?encoding=linear16&sample_rate=16000"
    # the bridge reads the socket 256 KiB at a time, then not until those messages are
    # handled: 0.5 s of the server's pace here, and each message's own time, which a
    # loaded machine stretches (so few, large ones); well under the ping timeout
    await transcribed_whole(url, audio, 32_768, 48.0)


async def test_a_client_that_answers_nothing_is_still_ended_by_the_ping_timeout(  # type: ignore[no-untyped-def]
    make_server, make_bridge, monkeypatch
) -> None:
    """The patience above is for pongs behind unread bytes: a client whose network has
    gone (here: it reads nothing, so it answers no ping) once what it sent has been read
    is ended by the ping timeout, and its gRPC stream freed."""
    from asr_bridge import app

    monkeypatch.setattr(app, "WS_PING_INTERVAL_S", 0.3)
    monkeypatch.setattr(app, "WS_PING_TIMEOUT_S", 1.0)
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port)
    url = f"ws://127.0.0.1:{bridge.port}/v1/listen?encoding=linear16&sample_rate=16000"
    ws = await connect(url, ping_interval=None)
    try:
        await ws.send((tone(2.0) * 32767).astype("<i2").tobytes())
        await eventually(lambda: server.servicer.active == 1)
        ws.transport.pause_reading()  # (its pongs are sent by its reading)
        await eventually(lambda: server.servicer.active == 0, timeout_s=5.0)
        assert (await asyncio.to_thread(health, bridge))["sessions"] == 0
    finally:
        ws.transport.abort()  # (a close would wait for the answer it cannot read)
