"""A /ws session under strain: hostile JSON, a server slower than the audio, a browser
leaving mid-push-back, a resume while the page is silent."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from asr_server.engine.fake import FakeEngine
from tests.faultproxy import FaultProxy
from tests.helpers import entered, eventually, serve_fake, speech_pcm, tone
from tests.integration.test_bridge import events_until_close, health, send_pcm, ws_url

pytestmark = pytest.mark.timeout(60)

DEEP_JSON = "[" * 1500 + "]" * 1500  # past json's recursion limit, in 3 kB
FRAME_S = 0.05


def tone_frame() -> bytes:
    return (tone(FRAME_S) * 32767).astype("<i2").tobytes()


@pytest.mark.parametrize("after_start", [False, True])
async def test_deeply_nested_json_is_a_bad_message(  # type: ignore[no-untyped-def]
    make_server, make_bridge, after_start: bool
) -> None:
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port)
    async with connect(ws_url(bridge)) as ws:
        if after_start:
            await ws.send(json.dumps({"type": "start", "sample_rate": 16_000}))
            assert json.loads(await ws.recv())["type"] == "ready"
        await ws.send(DEEP_JSON)
        events = await events_until_close(ws)
    assert [e["code"] for e in events if e["type"] == "error"] == ["INVALID_ARGUMENT"]
    assert "not JSON" in events[-1]["message"]
    assert ws.close_code == 4400


async def test_deeply_nested_json_is_invalid_json_on_the_realtime_route(  # type: ignore[no-untyped-def]
    make_server, make_bridge
) -> None:
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port)
    url = f"ws://127.0.0.1:{bridge.port}/v1/realtime?intent=transcription"
    async with connect(url) as ws:
        await ws.send(DEEP_JSON)
        async with asyncio.timeout(5):
            while (event := json.loads(await ws.recv()))["type"] != "error":
                pass
    assert event["error"]["code"] == "invalid_json"


async def test_a_server_slower_than_the_audio_ends_the_session_with_a_reason(  # type: ignore[no-untyped-def]
    make_server, make_bridge, monkeypatch
) -> None:
    """Each write completes (the server takes audio at half its speed), so no one write
    waits past the deadline; but the page's pong waits behind the audio the bridge has
    not read, and the socket's ping timeout ended the session with 1011 and no reason.
    The bridge ends it first: RESOURCE_EXHAUSTED, 1013."""
    from asr_bridge import app, session
    from asr_client.resume import ResumableStream

    monkeypatch.setattr(app, "WS_PING_INTERVAL_S", 0.5)
    monkeypatch.setattr(app, "WS_PING_TIMEOUT_S", 3.0)
    monkeypatch.setattr(session, "UPSTREAM_WRITE_DEADLINE_S", 1.0)
    send_audio = ResumableStream.send_audio

    async def at_half_speed(self: ResumableStream, data: bytes) -> None:
        await asyncio.sleep(len(data) / 32_000 * 2)
        await send_audio(self, data)

    monkeypatch.setattr(ResumableStream, "send_audio", at_half_speed)
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port)
    began = time.monotonic()
    async with connect(ws_url(bridge), ping_interval=None) as ws:
        await ws.send(json.dumps({"type": "start", "sample_rate": 16_000}))

        async def real_time() -> None:
            with contextlib.suppress(ConnectionClosed):
                while True:
                    await ws.send(tone_frame())
                    await asyncio.sleep(FRAME_S)

        sender = asyncio.create_task(real_time())
        events = await asyncio.wait_for(events_until_close(ws), 20)
        sender.cancel()
    assert ws.close_code == 1013, (ws.close_code, ws.close_reason)
    assert events[-1]["type"] == "error" and events[-1]["code"] == "RESOURCE_EXHAUSTED"
    assert "the server fell behind" in events[-1]["message"]
    assert time.monotonic() - began < 3.0 + 2.0  # (1 s behind takes about 2 s)


async def test_a_browser_leaving_during_push_back_frees_the_stream_at_once(  # type: ignore[no-untyped-def]
    make_server, make_bridge
) -> None:
    """The bridge reads nothing while a write waits on the server, so the socket closing
    went unseen until the write deadline (20 s), and was counted as the server's fault."""
    gate = threading.Event()
    engine = FakeEngine(gate=gate)
    stuck = entered(engine)
    server = await serve_fake(make_server, engine, streaming={"max_buffered_audio_s": 0.5})
    bridge = await make_bridge(server.port)
    try:
        ws = await connect(ws_url(bridge))
        await ws.send(json.dumps({"type": "start", "sample_rate": 16_000}))
        await ws.recv()
        sent = 0

        async def flood() -> None:
            nonlocal sent
            while True:
                await ws.send(tone_frame())
                sent += 1

        sender = asyncio.create_task(flood())
        await stuck.wait()
        last = -1
        while sent != last:  # noqa: ASYNC110 - waiting for the push-back to reach the client
            last = sent
            await asyncio.sleep(0.3)
        sender.cancel()
        ws.transport.abort()
        await eventually(lambda: server.servicer.active == 0, timeout_s=3.0)
        assert (await asyncio.to_thread(health, bridge))["sessions"] == 0
    finally:
        gate.set()
    errors = bridge.metrics.registry.get_sample_value(
        "asr_bridge_session_errors_total", {"code": "RESOURCE_EXHAUSTED"}
    )
    assert not errors


async def test_the_page_hears_of_a_resume_while_it_sends_nothing(  # type: ignore[no-untyped-def]
    make_server, make_bridge
) -> None:
    """A push-to-talk page between presses: the stream breaks and resumes, and the page
    is told then, not at the server's next response (which may be the next press)."""
    server = await serve_fake(make_server)
    proxy = await FaultProxy(server.port).start()
    bridge = await make_bridge(proxy.port)
    try:
        async with connect(ws_url(bridge)) as ws:
            await ws.send(json.dumps({"type": "start", "sample_rate": 16_000}))
            await send_pcm(ws, speech_pcm(1.0).tobytes())
            await ws.send(json.dumps({"type": "finalize"}))
            await next_event(ws, "finalized")
            proxy.cut()
            resumed = await next_event(ws, "resumed")
            assert resumed["count"] == 1
            await ws.send(json.dumps({"type": "stop"}))
            await events_until_close(ws)
        assert ws.close_code == 1000
    finally:
        await proxy.close()


async def next_event(ws: ClientConnection, kind: str, timeout_s: float = 5.0) -> dict[str, Any]:
    async with asyncio.timeout(timeout_s):
        while (event := json.loads(await ws.recv()))["type"] != kind:
            pass
    return event  # type: ignore[no-any-return]
