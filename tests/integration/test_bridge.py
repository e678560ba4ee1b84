"""asr-bridge on 127.0.0.1 in front of a fake-engine server, driven by a Python WebSocket
client: the event flow, both event shapes, the token, errors, disconnects, backpressure."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
import urllib.request
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from asr_server.engine.fake import FakeEngine
from tests.helpers import entered, eventually, serve_fake, silence, speech_pcm, tone

pytestmark = pytest.mark.timeout(60)

FRAME = int(0.05 * 16_000) * 2  # 50 ms of 16 kHz int16, as the page sends


def ws_url(bridge: Any, query: str = "") -> str:
    return f"ws://127.0.0.1:{bridge.port}/ws{query}"


async def send_pcm(ws: ClientConnection, pcm: bytes) -> None:
    for i in range(0, len(pcm), FRAME):
        await ws.send(pcm[i : i + FRAME])


async def events_until_close(ws: ClientConnection) -> list[dict[str, Any]]:
    events = []
    try:
        async for message in ws:
            events.append(json.loads(message))
    except ConnectionClosed:
        pass
    return events


async def test_speech_becomes_partials_finals_and_a_clean_close(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port)
    async with connect(ws_url(bridge), subprotocols=["streamasr.v1"]) as ws:  # type: ignore[list-item]
        assert ws.subprotocol == "streamasr.v1"
        await ws.send(json.dumps({"type": "start", "sample_rate": 16_000}))
        pcm = speech_pcm(2.0).tobytes()
        for i in range(0, len(pcm), FRAME):  # at 4x real time, as a page streams (paced):
            await ws.send(pcm[i : i + FRAME])  # sent at once under load, the final could
            await asyncio.sleep(0.0125)  # overtake every partial, which is then not shown
        await ws.send(json.dumps({"type": "stop"}))
        events = await events_until_close(ws)
    assert ws.close_code == 1000
    kinds = [e["type"] for e in events]
    assert kinds[0] == "ready" and kinds[-1] == "closed"
    assert kinds.index("speech_started") < kinds.index("partial") < kinds.index("final")
    partials = [e for e in events if e["type"] == "partial"]
    assert partials
    for e in partials:
        assert e["text"] == " ".join(t for t in (e["stable_text"], e["unstable_text"]) if t)
    assert [e["text"] for e in events if e["type"] == "final"] == ["w0 w1 w2 w3 w4 w5 w6 w7"]
    await eventually(lambda: server.servicer.active == 0)


async def test_a_page_finalizes_and_is_told_when_it_is_done(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    """Push-to-talk: the page sends ``finalize`` when the button is released; the final
    says it answers it, and ``finalized`` follows, also for a press without speech."""
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port)
    async with connect(ws_url(bridge)) as ws:
        await ws.send(json.dumps({"type": "start", "sample_rate": 16_000}))
        await send_pcm(ws, (tone(1.0) * 32767).astype("<i2").tobytes())
        await ws.send(json.dumps({"type": "finalize"}))
        await send_pcm(ws, bytes(16_000))  # a press without speech
        await ws.send(json.dumps({"type": "finalize"}))
        await ws.send(json.dumps({"type": "stop"}))
        events = await events_until_close(ws)
    kinds = [e["type"] for e in events]
    assert kinds.count("finalized") == 2
    (final,) = [e for e in events if e["type"] == "final"]
    assert final["from_finalize"] is True and final["text"] == "w0 w1 w2 w3"
    first, second = (e for e in events if e["type"] == "finalized")
    assert kinds.index("final") < events.index(first)
    assert first["offset_s"] == 1.0 and second["offset_s"] == 1.5
    await eventually(lambda: server.servicer.active == 0)


async def test_a_push_to_talk_page_may_pause_past_the_servers_idle_timeout(  # type: ignore[no-untyped-def]
    make_server, make_bridge
) -> None:
    """Between presses a push-to-talk page sends nothing; the session's stream gets
    KEEPALIVEs while the server ends an idle stream after 1 s (a third of that without a
    write: the server says its timeout when it admits the stream; the bridge's 20 s, fixed
    before, let a server with a timeout under 20 s end the session between presses), and
    the second press is heard where the audio resumed."""
    server = await serve_fake(make_server, idle_timeout_s=1.0)
    bridge = await make_bridge(server.port)
    async with connect(ws_url(bridge)) as ws:
        await ws.send(json.dumps({"type": "start", "sample_rate": 16_000}))
        press = (tone(1.0) * 32767).astype("<i2").tobytes()
        await send_pcm(ws, press)
        await ws.send(json.dumps({"type": "finalize"}))
        await asyncio.sleep(3.0)  # three idle timeouts between the presses
        await send_pcm(ws, press)
        await ws.send(json.dumps({"type": "finalize"}))
        await ws.send(json.dumps({"type": "stop"}))
        events = await events_until_close(ws)
    assert ws.close_code == 1000, [e for e in events if e["type"] == "error"]
    finals = [e for e in events if e["type"] == "final"]
    assert [f["text"] for f in finals] == ["w0 w1 w2 w3"] * 2
    assert finals[1]["start_s"] == pytest.approx(1.0, abs=0.25)  # no pause added
    await eventually(lambda: server.servicer.active == 0)


async def test_openai_realtime_event_shape(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port)
    pcm = speech_pcm(2.0).tobytes()  # 2 s of speech, then the silence that ends it
    async with connect(ws_url(bridge, "?events=openai")) as ws:
        await ws.send(json.dumps({"type": "start", "sample_rate": 16_000}))
        await send_pcm(ws, pcm)
        await ws.send(json.dumps({"type": "stop"}))
        events = await events_until_close(ws)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "transcription_session.created"
    assert "input_audio_buffer.speech_started" in kinds
    assert "input_audio_buffer.committed" in kinds
    deltas = [
        e["delta"]
        for e in events
        if e["type"] == "conversation.item.input_audio_transcription.delta"
    ]
    (done,) = [
        e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed"
    ]
    assert deltas, kinds
    assert done["transcript"] == "w0 w1 w2 w3 w4 w5 w6 w7"
    assert "".join(deltas) == done["transcript"]  # deltas append up to the transcript
    last_delta = max(i for i, k in enumerate(kinds) if k.endswith("transcription.delta"))
    assert last_delta < kinds.index("conversation.item.input_audio_transcription.completed")
    assert all(e["event_id"] and e.get("item_id", done["item_id"]) for e in events)


async def test_openai_shape_keeps_its_items_across_a_resume(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    """The bridge's gRPC stream breaks after an item was committed, before its final: the
    new call's final completes that item (as on /v1/realtime), not a second item of the
    same speech while the committed one is never completed."""
    from tests.helpers import SocketEvents, bridge_with_a_cut, to_pcm16

    gate, proxy, bridge = await bridge_with_a_cut(make_server, make_bridge)
    events = SocketEvents()

    try:
        async with connect(ws_url(bridge, "?events=openai")) as ws:
            await ws.send(json.dumps({"type": "start", "sample_rate": 16_000}))
            await ws.send(to_pcm16(tone(1.0)).tobytes())
            await events.until(ws, "input_audio_buffer.speech_started")
            gate.clear()  # the engine stalls: the speech ends, its final waits
            await ws.send(to_pcm16(silence(1.0)).tobytes())
            await events.until(ws, "conversation.item.created")
            proxy.cut()
            gate.set()
            await events.until(ws, "conversation.item.input_audio_transcription.completed")
            await ws.send(json.dumps({"type": "stop"}))
            events.extend(await events_until_close(ws))
    finally:
        gate.set()
        await proxy.close()
    assert ws.close_code == 1000
    kinds = [e["type"] for e in events]
    assert kinds.count("input_audio_buffer.speech_started") == 1, kinds
    assert kinds.count("input_audio_buffer.committed") == 1, kinds
    items = {e["item_id"] for e in events if "item_id" in e}
    (done,) = [e for e in events if e["type"].endswith("transcription.completed")]
    assert items == {done["item_id"]} and done["transcript"] == "w0 w1 w2 w3"
    assert bridge.metrics.registry.get_sample_value("asr_bridge_resumes_total") == 1


@pytest.mark.parametrize(
    ("message", "error"),
    [
        # over the frame limit, and an odd length: told as for a binary frame, not as bad
        # base64 (an OpenAI-style client only sends audio this way)
        (bytes(288_000), "audio frame of 288000 bytes is over 262144"),
        (bytes(3), "bytes is odd"),
    ],
)
async def test_an_appended_audio_error_says_what_is_wrong(  # type: ignore[no-untyped-def]
    make_server, make_bridge, message: bytes, error: str
) -> None:
    import base64

    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port)
    async with connect(ws_url(bridge, "?events=openai"), max_size=None) as ws:
        await ws.send(json.dumps({"type": "start", "sample_rate": 16_000}))
        audio = base64.b64encode(message).decode()
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
        events = await events_until_close(ws)
    assert ws.close_code == 4400
    (bad,) = [e for e in events if e["type"] == "error"]
    assert error in bad["error"]["message"], bad


async def test_a_text_message_that_is_not_utf8_is_closed_with_a_reason_and_no_traceback(  # type: ignore[no-untyped-def]
    make_server, make_bridge, caplog
) -> None:
    """uvicorn logged each such message as an ERROR with a UnicodeDecodeError traceback
    (any client could fill the bridge's log with them) and closed with 1007, no reason."""
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port)
    async with connect(ws_url(bridge)) as ws:
        await ws.send(b'{"type": "start", "sample_rate": 16000, "language": "\xff"}', text=True)
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 10)
    assert ws.close_code == 1007
    assert ws.close_reason == "a text message must be UTF-8"
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    # and the bridge goes on: the next session is served
    async with connect(ws_url(bridge)) as ws:
        await ws.send(json.dumps({"type": "start", "sample_rate": 16_000}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "ready"


@pytest.mark.parametrize(
    ("how", "accepted"),
    [
        ({}, False),
        ({"query": "?token=wrong"}, False),
        ({"query": "?token=s3cret-token"}, True),
        ({"subprotocols": ["streamasr.v1", "bearer.s3cret-token"]}, True),
        ({"subprotocols": ["streamasr.v1", "bearer.nope"]}, False),
    ],
)
async def test_token_is_checked_before_any_grpc_stream(
    make_server,  # type: ignore[no-untyped-def]
    make_bridge,
    how: dict[str, Any],
    accepted: bool,
) -> None:
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token="s3cret-token")
    url = ws_url(bridge, how.get("query", ""))
    async with connect(url, subprotocols=how.get("subprotocols")) as ws:
        if accepted:
            await ws.send(json.dumps({"type": "start", "sample_rate": 16_000}))
            assert json.loads(await ws.recv())["type"] == "ready"
            await ws.send(json.dumps({"type": "stop"}))
        events = await events_until_close(ws)
    if accepted:
        assert ws.close_code == 1000
    else:
        assert events == [
            {"type": "error", "code": "UNAUTHENTICATED", "message": "missing or wrong token"}
        ]
        assert ws.close_code == 4401
        assert ws.close_reason == "UNAUTHENTICATED: missing or wrong token"
        assert streams_opened(server) == 0


def streams_opened(server: Any) -> float:
    """Streams the gRPC server has finished, whatever their outcome."""
    families = server.metrics.registry.collect()
    return sum(
        s.value
        for f in families
        if f.name == "asr_streams"
        for s in f.samples
        if s.name.endswith("_total")
    )


@pytest.mark.parametrize(
    ("start", "code", "close", "phrase"),
    [
        ({"type": "start", "sample_rate": 4000}, "INVALID_ARGUMENT", 4400, "sample_rate"),
        ({"type": "stop"}, "INVALID_ARGUMENT", 4400, "first message must be"),
        # the bridge passes the language on; the server refuses it: a gRPC error, forwarded
        ({"type": "start", "sample_rate": 16000, "language": "xx"}, "INVALID_ARGUMENT", 4400, "xx"),
    ],
)
async def test_errors_arrive_as_readable_events_then_a_close(
    make_server,  # type: ignore[no-untyped-def]
    make_bridge,
    start: dict[str, Any],
    code: str,
    close: int,
    phrase: str,
) -> None:
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port)
    async with connect(ws_url(bridge)) as ws:
        await ws.send(json.dumps(start))
        await send_pcm(ws, speech_pcm(0.2).tobytes())
        events = await events_until_close(ws)
    errors = [e for e in events if e["type"] == "error"]
    assert len(errors) == 1 and errors[0]["code"] == code, events
    assert phrase in errors[0]["message"]
    assert ws.close_code == close
    assert ws.close_reason.startswith(code)


async def test_server_at_its_stream_limit_is_resource_exhausted(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server, max_streams=1)
    bridge = await make_bridge(server.port)
    async with connect(ws_url(bridge)) as first:
        await first.send(json.dumps({"type": "start", "sample_rate": 16_000}))
        assert json.loads(await first.recv())["type"] == "ready"
        await send_pcm(first, speech_pcm(0.5).tobytes())
        await eventually(lambda: server.servicer.active == 1)
        async with connect(ws_url(bridge)) as second:
            await second.send(json.dumps({"type": "start", "sample_rate": 16_000}))
            events = await events_until_close(second)
        assert events[-1]["type"] == "error"
        assert events[-1]["code"] == "RESOURCE_EXHAUSTED"
        assert "limit of 1" in events[-1]["message"]
        assert second.close_code == 1013  # try again later


async def test_browser_leaving_cancels_the_grpc_stream(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    gate = threading.Event()
    engine = FakeEngine(gate=gate)
    stuck = entered(engine)
    server = await serve_fake(make_server, engine)
    bridge = await make_bridge(server.port)
    try:
        ws = await connect(ws_url(bridge))
        await ws.send(json.dumps({"type": "start", "sample_rate": 16_000}))
        await send_pcm(ws, speech_pcm(2.0).tobytes())
        await stuck.wait()  # a decode is stuck inside the engine; the stream is open
        assert server.servicer.active == 1
        ws.transport.abort()  # no close handshake: the tab crashed or the network went
        await eventually(lambda: server.servicer.active == 0)
        assert server.metrics.active_streams._value.get() == 0
        assert (await asyncio.to_thread(health, bridge))["sessions"] == 0
    finally:
        gate.set()


def health(bridge: Any) -> dict[str, Any]:
    """GET /healthz (blocking: call it in a thread, the bridge runs on this loop)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{bridge.port}/healthz", timeout=5) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


async def test_backpressure_reaches_the_browser_and_nothing_is_lost(
    make_server, make_bridge
) -> None:  # type: ignore[no-untyped-def]
    gate = threading.Event()
    engine = FakeEngine(gate=gate)
    stalled = entered(engine)
    cap_s = 2.0
    server = await serve_fake(make_server, engine, streaming={"max_buffered_audio_s": cap_s})
    bridge = await make_bridge(server.port)
    audio = np.concatenate([tone(1.0), silence(1.0), tone(60.0), silence(1.0)])
    data = (audio * 32767).astype("<i2").tobytes()
    # Loopback TCP autotunes to megabytes each way, which would hide the push-back in this
    # test's minute of audio; browser-sized buffers make it show within seconds.
    bridge.server.servers[0].sockets[0].setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 15)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 15)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", bridge.port))
    sent = 0
    try:
        async with connect(ws_url(bridge), sock=sock) as ws:
            start = {"type": "start", "sample_rate": 16_000, "interim_results": False}
            await ws.send(json.dumps(start))

            async def send() -> None:
                nonlocal sent
                for i in range(0, len(data), FRAME):
                    await ws.send(data[i : i + FRAME])  # waits once the socket buffers are full
                    sent += len(data[i : i + FRAME])
                await ws.send(json.dumps({"type": "stop"}))

            sender = asyncio.create_task(send())
            await stalled.wait()
            last = -1
            while sent != last:  # noqa: ASYNC110 - measuring that nothing happens
                last = sent
                await asyncio.sleep(0.5)
            blocked_at_s = sent / 32_000
            print(
                f"the WebSocket client blocked after {blocked_at_s:.1f} s of audio (cap {cap_s} s)"
            )
            assert not sender.done()
            # the engine stalled at ~2 s; past the server's cap, only what TCP, the WebSocket
            # layers and HTTP/2 hold in transit was accepted: the bridge itself queues nothing
            assert blocked_at_s < 2.0 + cap_s + 10.0, blocked_at_s
            gate.set()
            events = await events_until_close(ws)
            await sender
    finally:
        gate.set()
    assert sent == len(data)
    finals = [e for e in events if e["type"] == "final"]
    assert sum(len(e["text"].split()) for e in finals) == pytest.approx(4 + 240, abs=len(finals))
    assert events[-1]["type"] == "closed"


async def test_unreachable_server_is_unavailable(make_bridge) -> None:  # type: ignore[no-untyped-def]
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bridge = await make_bridge(port)
    async with connect(ws_url(bridge)) as ws:
        await ws.send(json.dumps({"type": "start", "sample_rate": 16_000}))
        events = await events_until_close(ws)
    assert events[-1]["type"] == "error" and events[-1]["code"] == "UNAVAILABLE", events
    assert ws.close_code == 1013


async def client_of_a_stalled_server(
    make_server, make_bridge, monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, threading.Event]:  # type: ignore[no-untyped-def]
    """A bridge before a server whose engine has stalled (it holds ``max_buffered_audio_s``
    of audio, then pushes back), with a write deadline of a third of a second."""
    from asr_bridge import session

    monkeypatch.setattr(session, "UPSTREAM_WRITE_DEADLINE_S", 0.3)
    gate = threading.Event()
    server = await serve_fake(
        make_server, FakeEngine(gate=gate), streaming={"max_buffered_audio_s": 0.5}
    )
    return await make_bridge(server.port), gate


async def send_until_closed(ws: ClientConnection, frame: bytes) -> None:
    """Audio as fast as the socket takes it, until it closes."""
    with contextlib.suppress(ConnectionClosed):
        while True:
            await ws.send(frame)


async def test_a_server_that_falls_behind_ends_the_session_with_a_reason(
    make_server, make_bridge, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """A server that takes no audio for the write deadline: an error event saying so, and
    close 1013 (try again later). The session used to wait until the socket's keepalive
    ended it, 40 s on, with 1011 and no reason: the client's pong waits unread behind the
    audio the bridge is not reading."""
    bridge, gate = await client_of_a_stalled_server(make_server, make_bridge, monkeypatch)
    try:
        async with connect(ws_url(bridge)) as ws:
            await ws.send(json.dumps({"type": "start", "sample_rate": 16_000}))
            speech = (tone(0.05) * 32767).astype("<i2").tobytes()  # what the engine stalls on
            sender = asyncio.create_task(send_until_closed(ws, speech))
            events = await asyncio.wait_for(events_until_close(ws), 10)
            await sender
    finally:
        gate.set()
    assert ws.close_code == 1013, (ws.close_code, ws.close_reason)
    assert events[-1]["type"] == "error" and events[-1]["code"] == "RESOURCE_EXHAUSTED"
    assert "the server fell behind" in events[-1]["message"]


def test_the_keepalive_waits_longer_than_a_write() -> None:
    """The socket's ping timeout would end a live client waiting on the server, without a
    reason: the write deadline must come well before it."""
    from asr_bridge.app import WS_PING_TIMEOUT_S
    from asr_bridge.session import UPSTREAM_WRITE_DEADLINE_S

    assert WS_PING_TIMEOUT_S >= UPSTREAM_WRITE_DEADLINE_S + 10


async def test_a_quiet_stream_resumed_on_a_server_with_a_shorter_idle_timeout_is_kept(  # type: ignore[no-untyped-def]
    make_server,
) -> None:
    """The keeper slept out the first server's 20 s before it read the new server's idle
    timeout: a stream resumed onto a server ending idle streams after 1.5 s was ended
    there (DEADLINE_EXCEEDED) between a push-to-talk page's presses."""
    from asr_bridge.keepalive import StreamKeeper
    from asr_client import AsrClient, audio_config
    from asr_client.resume import ResumePolicy
    from tests.faultproxy import FaultProxy

    first = await serve_fake(make_server)  # idle timeout 60 s: a keepalive every 20 s
    proxy = await FaultProxy(first.port).start()
    second = await serve_fake(make_server, idle_timeout_s=1.5)
    press = (tone(1.0) * 32767).astype("<i2").tobytes()
    try:
        async with AsrClient(f"127.0.0.1:{proxy.port}") as client:
            stream = client.stream(audio_config(interim_results=False), resume=ResumePolicy())
            await stream.open()
            keeper = StreamKeeper(stream)
            finals: list[str] = []

            async def read() -> None:
                async for response in stream:
                    if response.result.is_final:
                        finals.append(response.result.text)

            reading = asyncio.create_task(read())
            keeping = asyncio.create_task(keeper.run())
            await keeper.write(stream.send_audio(press))
            await keeper.write(stream.finalize())
            await eventually(lambda: len(finals) == 1)
            proxy.upstream_port = second.port
            proxy.cut()
            await eventually(lambda: second.servicer.active == 1)
            await asyncio.sleep(5.0)  # three of its idle timeouts, nothing sent
            assert not reading.done() and second.servicer.active == 1
            await keeper.write(stream.send_audio(press))
            await keeper.end()
            await asyncio.wait_for(reading, 10)
            keeping.cancel()
        assert finals == ["w0 w1 w2 w3"] * 2 and stream.resumes == 1  # type: ignore[attr-defined]
    finally:
        await proxy.close()
