"""A /ws session under strain: hostile JSON, a resume while the page is silent. (A server
slower than the audio, and a page leaving mid-push-back: test_bridge_routes_pushback.py,
for every route.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosedError

from tests.faultproxy import FaultProxy
from tests.helpers import serve_fake, speech_pcm
from tests.integration.test_bridge import events_until_close, send_pcm, ws_url

pytestmark = pytest.mark.timeout(60)

DEEP_JSON = "[" * 1500 + "]" * 1500  # past json's recursion limit, in 3 kB


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
        # at once: a keepalive task that swallowed its cancellation while it read the
        # server's idle timeout slept on for 20 s, and the socket closed after it
        async with asyncio.timeout(5):
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
            reconnecting = await next_event(ws, "reconnecting")  # as the call broke
            assert reconnecting["cause"].startswith("UNAVAILABLE"), reconnecting
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


@pytest.mark.parametrize("route", ["/ws", "/v1/listen?encoding=linear16&sample_rate=16000"])
async def test_a_browser_is_not_told_the_servers_address(make_bridge, route: str) -> None:  # type: ignore[no-untyped-def]
    """With the server down, gRPC's message names the address it could not connect to
    (a replica's internal address and port, in a deployment): the browser got it in the
    error event and the close reason. The bridge's log keeps it."""
    from tests.processes import free_port

    port = free_port()  # nothing listens there
    bridge = await make_bridge(port, resume=False)
    async with connect(f"ws://127.0.0.1:{bridge.port}{route}") as ws:
        if route == "/ws":
            await ws.send(json.dumps({"type": "start", "sample_rate": 16_000}))
        else:
            await ws.send(speech_pcm(0.2).tobytes())
        told = []
        with contextlib.suppress(ConnectionClosedError):  # (not a normal close: 1013, 1011)
            async with asyncio.timeout(10):
                told += [message async for message in ws]
    told.append(ws.close_reason)
    assert any("UNAVAILABLE" in str(m) and "the server" in str(m) for m in told), told
    assert not any("127.0.0.1" in str(m) or str(port) in str(m) for m in told), told
