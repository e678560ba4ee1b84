"""Deepgram Flux on asr-bridge (``/v2/listen``): turns from the server's SEMANTIC endpointing.

The official ``deepgram-sdk``, unmodified, against the bridge, the real tiny.en model and
the real turn model on recorded speech; and a plain WebSocket client against the fake
engine for ForceEndTurn, bad messages and every refusal.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.client import connect

from asr_client.scoring import wer
from asr_server.engine.base import DecodeKind
from asr_server.engine.fake import FakeEngine
from asr_server.vad.turn import TurnDetection, TurnVerdict
from tests.faultproxy import FaultProxy
from tests.helpers import (
    corpus,
    encode_container,
    eventually,
    read_pcm16,
    serve_fake,
    silence,
    speech_pcm,
    tone,
)
from tests.integration.test_bridge import events_until_close
from tests.integration.test_deepgram import TOKEN, auth, handshake_refused, sdk_client

pytestmark = pytest.mark.timeout(120)

# two read sentences with a pause between, then silence: at least one turn ends
RECORDINGS = ("libri_1089-134686-0000", "libri_1995-1837-0001")
GOOD = "model=flux-general-en&encoding=linear16&sample_rate=16000"


def flux_url(bridge: Any, query: str) -> str:
    return f"ws://127.0.0.1:{bridge.port}/v2/listen?{query}"


def check_flux_rules(messages: list[dict[str, Any]]) -> None:
    """Flux's documented state machine: Connected first, sequence ids counting from 0,
    StartOfTurn opens a turn, EagerEndOfTurn has words, TurnResumed only after it,
    EndOfTurn's transcript is the eager one just before it, turn_index counts on after
    each EndOfTurn."""
    assert messages[0]["type"] == "Connected"
    assert [m["sequence_id"] for m in messages] == list(range(len(messages)))
    state, eager, index = "idle", None, 0
    for m in (m for m in messages if m["type"] == "TurnInfo"):
        event = m["event"]
        assert m["turn_index"] == index, m
        assert m["request_id"] == messages[0]["request_id"]
        if event == "StartOfTurn":
            assert state == "idle" and m["transcript"], m
            state = "ongoing"
            continue
        assert state != "idle", m
        if event == "EagerEndOfTurn":
            assert m["transcript"]
            state, eager = "awaiting", m["transcript"]
        elif event == "TurnResumed":
            assert state == "awaiting", m
            state, eager = "ongoing", None
        elif event == "EndOfTurn":
            assert eager is None or m["transcript"] == eager, m
            assert m["trigger"] in ("model", "timeout", "manual")
            state, eager, index = "idle", None, index + 1
        else:
            assert event == "Update", m
            assert state == "ongoing", m


async def sdk_turns(port: int, audio: bytes, **query: str) -> list[Any]:
    """Stream ``audio`` through the official SDK at about 2× real time, in Flux's
    recommended 80 ms chunks, then CloseStream; every message the SDK parsed, in order."""
    client = sdk_client(port)
    received: list[Any] = []
    chunk = 2_560  # 80 ms of 16 kHz linear16
    async with client.listen.v2.connect(
        model="flux-general-en", encoding="linear16", sample_rate="16000", **query
    ) as socket:

        async def send() -> None:
            for i in range(0, len(audio), chunk):
                await socket.send_media(audio[i : i + chunk])
                await asyncio.sleep(0.04)
            await socket.send_close_stream()

        sender = asyncio.create_task(send())
        async for message in socket:
            received.append(message)
        await sender
    return received


@pytest.mark.model
@pytest.mark.timeout(300)
async def test_official_sdk_gets_turns_from_semantic_endpointing(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    server = await make_server()  # tiny.en and the turn model from asr-server turn-model
    bridge = await make_bridge(server.port, token=TOKEN)
    recordings = [corpus()[r] for r in RECORDINGS]
    pieces = []
    for rec in recordings:
        pcm, rate = read_pcm16(rec.path)
        assert rate == 16_000
        pieces += [pcm[:, 0], np.zeros(rate * 2, np.int16)]  # 2 s after each: a turn end
    audio = np.concatenate(pieces).astype("<i2").tobytes()
    received = await sdk_turns(bridge.port, audio, eager_eot_threshold="0.5")
    kinds = [type(m).__name__ for m in received]
    assert kinds[0] == "ListenV2Connected", kinds
    messages = [m.dict() if hasattr(m, "dict") else dict(m) for m in received]
    check_flux_rules(messages)
    turns = [m for m in received if type(m).__name__ == "ListenV2TurnInfo"]
    ends = [t for t in turns if t.event == "EndOfTurn"]
    # each sentence is followed by 2 s of silence: each ends a turn (the turn model,
    # or the longest pause the server holds open)
    assert len(ends) == 2, [(t.event, t.transcript) for t in turns]
    for end, rec in zip(ends, recordings, strict=True):
        assert wer([rec.transcript], [end.transcript]) <= 0.15, end.transcript
        assert end.words and all(w.word in end.transcript for w in end.words)
        assert all(w.start is not None and w.end is not None for w in end.words)
        assert end.audio_window_start < end.audio_window_end
    assert {t.event for t in turns} >= {"StartOfTurn", "Update", "EndOfTurn"}
    # the first turn's StartOfTurn came while the sentence was still being spoken
    first_end = turns.index(ends[0])
    assert sum(t.event == "Update" for t in turns[:first_end]) >= 3
    await eventually(lambda: server.servicer.active == 0)


@pytest.mark.parametrize("query", [GOOD, GOOD + "&eot_threshold=1"])
async def test_force_end_turn_ends_the_turn_at_once(make_server, make_bridge, query: str) -> None:  # type: ignore[no-untyped-def]
    """Semantic turns, and turns left to the client (eot_threshold 1: the turn model is
    not asked): the turn a ForceEndTurn ended is "manual"."""
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=TOKEN)
    tone = speech_pcm(1.0)[:16_000].tobytes()  # speech with no silence after it
    async with connect(flux_url(bridge, query), additional_headers=auth()) as ws:
        assert ws.response.headers["dg-request-id"]
        await ws.send(tone)
        await ws.send(json.dumps({"type": "ForceEndTurn"}))
        messages = []
        while not messages or messages[-1].get("event") != "EndOfTurn":
            messages.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
        # the stream goes on: a second turn, left open by CloseStream (as Flux does)
        await ws.send(tone)
        await ws.send(json.dumps({"type": "CloseStream"}))
        messages += await events_until_close(ws)
    assert ws.close_code == 1000
    check_flux_rules(messages)
    ends = [m for m in messages if m.get("event") == "EndOfTurn"]
    assert len(ends) == 1 and ends[0]["trigger"] == "manual"
    assert ends[0]["transcript"] == "w0 w1 w2 w3"
    last = messages[-1]
    # (a StartOfTurn when the final is the turn's first result, else an Update)
    assert last["event"] in ("StartOfTurn", "Update") and last["turn_index"] == 1
    assert last["transcript"] == "w0 w1 w2 w3"
    await eventually(lambda: server.servicer.active == 0)


async def test_a_webm_container_gets_turns_like_raw_audio(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    """Flux takes WebM/Opus without encoding, as a browser records it; a stereo one is
    heard as one channel, and ForceEndTurn ends the turn after the audio sent before it."""
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=TOKEN)
    tone = speech_pcm(1.0)[:16_000]  # speech with no silence after it
    webm = encode_container(np.concatenate([tone, tone], axis=1), 16_000, "webm", "libopus")
    url = flux_url(bridge, "model=flux-general-en")
    async with connect(url, subprotocols=["token", TOKEN]) as ws:  # type: ignore[list-item]
        assert ws.subprotocol == "token"
        for i in range(0, len(webm), 1_000):
            await ws.send(webm[i : i + 1_000])
        await ws.send(json.dumps({"type": "ForceEndTurn"}))
        await ws.send(json.dumps({"type": "CloseStream"}))
        messages = await events_until_close(ws)
    assert ws.close_code == 1000
    check_flux_rules(messages)
    ends = [m for m in messages if m.get("event") == "EndOfTurn"]
    assert len(ends) == 1 and ends[0]["trigger"] == "manual"
    assert ends[0]["transcript"] == "w0 w1 w2 w3"  # the whole second of it
    await eventually(lambda: server.servicer.active == 0)


async def test_a_container_session_says_connected_before_its_audio(
    make_server, make_bridge
) -> None:  # type: ignore[no-untyped-def]
    """As hosted Flux: Connected comes at once, also where the audio is a container whose
    format FFmpeg learns from the audio (a client waiting for it would wait forever)."""
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=TOKEN)
    webm = encode_container(speech_pcm(1.0), 16_000, "webm", "libopus")
    url = flux_url(bridge, "model=flux-general-en")
    async with connect(url, subprotocols=["token", TOKEN]) as ws:  # type: ignore[list-item]
        connected = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert connected["type"] == "Connected" and connected["sequence_id"] == 0
        await ws.send(webm)
        await ws.send(json.dumps({"type": "ForceEndTurn"}))
        await ws.send(json.dumps({"type": "CloseStream"}))
        messages = [connected, *await asyncio.wait_for(events_until_close(ws), 20)]
    assert ws.close_code == 1000
    check_flux_rules(messages)  # (one Connected, the sequence unbroken)
    assert [m["type"] for m in messages].count("Connected") == 1
    ends = [m for m in messages if m.get("event") == "EndOfTurn"]
    assert [e["transcript"] for e in ends] == ["w0 w1 w2 w3"]


async def test_a_container_session_silent_before_its_audio_is_ended(  # type: ignore[no-untyped-def]
    make_server, make_bridge, monkeypatch
) -> None:
    """As on /v1/listen: no gRPC stream yet, so no server idle timeout; the session held
    its place under the bridge's limit for ever. Flux's FatalError, then 1011 NET-0001."""
    from asr_bridge.deepgram_session import ContainerRelay

    monkeypatch.setattr(ContainerRelay, "identify_idle_s", 1.0)
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=TOKEN)
    webm = encode_container(speech_pcm(1.0), 16_000, "webm", "libopus")
    async with connect(  # type: ignore[list-item]
        flux_url(bridge, "model=flux-general-en"), subprotocols=["token", TOKEN]
    ) as ws:
        await ws.send(webm[:100])  # the start of the file, then nothing
        messages = await asyncio.wait_for(events_until_close(ws), 10)
    assert ws.close_code == 1011 and ws.close_reason.startswith("NET-0001: no audio")
    assert [m["type"] for m in messages] == ["Connected", "Error"], messages


async def test_commands_before_any_container_audio_are_bounded(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    """A container session holds the commands sent before its first audio until its stream
    opens: a client that sends only commands is ended, not given memory without end
    (KeepAlives are not held)."""
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=TOKEN)
    url = flux_url(bridge, "model=flux-general-en")
    configure = json.dumps({"type": "Configure", "keyterms": ["x" * 1000] * 20})
    async with connect(url, subprotocols=["token", TOKEN]) as ws:  # type: ignore[list-item]
        for _ in range(200):
            await ws.send(json.dumps({"type": "KeepAlive"}))
        for _ in range(100):
            await ws.send(configure)
        messages = await asyncio.wait_for(events_until_close(ws), 20)
    assert ws.close_code == 1008, messages
    assert any("commands before any audio" in json.dumps(m) for m in messages), messages
    assert server.servicer.active == 0


class SureOf:
    """A turn model that gives the same answer at every pause."""

    def __init__(self, probability: float) -> None:
        self.probability = probability

    def predict(self, audio: np.ndarray) -> TurnVerdict:
        return TurnVerdict(self.probability)


async def serve_fake_sure_of(make_server, probability: float, engine: FakeEngine | None = None):  # type: ignore[no-untyped-def]
    """A fake-engine server whose turn model is ``probability`` sure at every pause (the
    server's thresholds otherwise: first ask 0.98 at 150 ms, second 0.7 at 600 ms)."""
    server = await serve_fake(make_server, engine)
    server.servicer.services = dataclasses.replace(
        server.servicer.services,
        turn=TurnDetection(
            SureOf(probability), 0.98, 150, 600, 0.7, eager_threshold=0.5, narrowband_threshold=0.99
        ),  # type: ignore[arg-type]
    )
    return server


async def send_at_4x(ws: Any, pcm: bytes) -> None:
    for i in range(0, len(pcm), 2_560):  # 80 ms chunks at 4x real time
        await ws.send(pcm[i : i + 2_560])
        await asyncio.sleep(0.02)


async def test_eager_ends_are_withdrawn_and_confirmed_end_to_end(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    # the server's SEMANTIC endpointing with a turn model 0.8 sure at every pause: each
    # pause gets an eager end at the first ask (0.8 is under 0.98); the one inside the
    # turn is withdrawn when speech resumes, the last is confirmed at the second ask
    server = await serve_fake_sure_of(make_server, 0.8)
    bridge = await make_bridge(server.port, token=TOKEN)
    audio = np.concatenate([tone(2.0), silence(0.35), tone(1.0), silence(1.5)])
    pcm = (audio * 32767).astype("<i2").tobytes()
    async with connect(
        flux_url(bridge, f"{GOOD}&eager_eot_threshold=0.5"), additional_headers=auth()
    ) as ws:
        await send_at_4x(ws, pcm)
        await ws.send(json.dumps({"type": "CloseStream"}))
        messages = await events_until_close(ws)
    check_flux_rules(messages)
    turns = [(m["event"], m["transcript"]) for m in messages if m["type"] == "TurnInfo"]
    events = [e for e, _ in turns if e != "Update"]
    assert events == [
        "StartOfTurn",
        "EagerEndOfTurn",
        "TurnResumed",
        "EagerEndOfTurn",
        "EndOfTurn",
    ], turns
    eager = [m for m in messages if m.get("event") == "EagerEndOfTurn"]
    assert [m["end_of_turn_confidence"] for m in eager] == [0.8, 0.8]
    assert eager[0]["transcript"] == " ".join(f"w{i}" for i in range(8))
    (end,) = [m for m in messages if m.get("event") == "EndOfTurn"]
    assert end["transcript"] == eager[1]["transcript"] == " ".join(f"w{i}" for i in range(12))
    assert end["trigger"] == "model" and end["end_of_turn_confidence"] == 0.8
    await eventually(lambda: server.servicer.active == 0)


async def test_a_configure_turns_eager_ends_on_mid_stream(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    # connected without eager ends: the first turn has none; a Configure with an
    # eager_eot_threshold turns them on for the next (StreamingUpdate.eager_finals)
    server = await serve_fake_sure_of(make_server, 0.8)
    bridge = await make_bridge(server.port, token=TOKEN)
    turn = np.concatenate([tone(1.0), silence(1.5)])
    pcm = (turn * 32767).astype("<i2").tobytes()

    async with connect(flux_url(bridge, GOOD), additional_headers=auth()) as ws:
        await send_at_4x(ws, pcm)
        configure = {"type": "Configure", "thresholds": {"eager_eot_threshold": 0.5}}
        await ws.send(json.dumps(configure))
        await send_at_4x(ws, pcm)
        await ws.send(json.dumps({"type": "CloseStream"}))
        messages = await events_until_close(ws)
    check_flux_rules(messages)
    (success,) = [m for m in messages if m["type"] == "ConfigureSuccess"]
    assert success["thresholds"]["eager_eot_threshold"] == 0.5
    turns = [(m["turn_index"], m["event"]) for m in messages if m["type"] == "TurnInfo"]
    events = [t for t in turns if t[1] != "Update"]
    assert events == [
        (0, "StartOfTurn"),
        (0, "EndOfTurn"),
        (1, "StartOfTurn"),
        (1, "EagerEndOfTurn"),
        (1, "EndOfTurn"),
    ], turns
    await eventually(lambda: server.servicer.active == 0)


async def test_bad_text_messages_get_a_warning_and_lose_nothing(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=TOKEN)
    url = flux_url(bridge, f"{GOOD}&eot_timeout_ms=500")
    async with connect(url, additional_headers=auth()) as ws:
        pcm = speech_pcm(1.0).tobytes()
        await ws.send(pcm[: len(pcm) // 2 + 1])  # an odd cut: the bridge holds the half sample
        await ws.send("{not json")
        await ws.send(json.dumps({"type": "Finalize"}))
        await ws.send(json.dumps({"type": "Configure", "thresholds": {"eot_threshold": 2}}))
        await ws.send(pcm[len(pcm) // 2 + 1 :])
        await ws.send(json.dumps({"type": "CloseStream"}))
        messages = await events_until_close(ws)
    assert ws.close_code == 1000
    check_flux_rules(messages)
    warnings = [m for m in messages if m["type"] == "Warning"]
    assert [w["code"] for w in warnings] == ["UNPARSABLE_CLIENT_MESSAGE"] * 2
    assert "unknown message type 'Finalize'" in warnings[1]["description"]
    (failure,) = [m for m in messages if m["type"] == "ConfigureFailure"]
    assert failure["code"] == "CONFIGURE_INVALID" and "eot_threshold" in failure["description"]
    # the tone's 0.7 s of silence is over the 500 ms timeout: the turn ended on it
    (end,) = [m for m in messages if m.get("event") == "EndOfTurn"]
    assert end["transcript"] == "w0 w1 w2 w3" and end["trigger"] in ("model", "timeout")
    await eventually(lambda: server.servicer.active == 0)


async def test_configure_changes_the_running_stream(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=TOKEN)
    url = flux_url(bridge, f"{GOOD}&eot_timeout_ms=500")
    async with connect(url, additional_headers=auth()) as ws:
        # turns are the client's from here on: the turn model is not even asked
        configure = {"type": "Configure", "thresholds": {"eot_threshold": 1}, "keyterms": ["x"]}
        await ws.send(json.dumps(configure))
        await ws.send(speech_pcm(1.0).tobytes())  # a second of speech, 0.7 s of silence
        await ws.send(json.dumps({"type": "CloseStream"}))
        messages = await events_until_close(ws)
    check_flux_rules(messages)
    (success,) = [m for m in messages if m["type"] == "ConfigureSuccess"]
    assert success["thresholds"] == {"eot_threshold": 1, "eot_timeout_ms": 500}
    assert success["keyterms"] == ["x"]
    (end,) = [m for m in messages if m.get("event") == "EndOfTurn"]
    assert end["trigger"] == "timeout" and end["transcript"] == "w0 w1 w2 w3"
    assert end["end_of_turn_confidence"] == 0.0  # never asked
    await eventually(lambda: server.servicer.active == 0)


async def test_an_eager_threshold_that_can_give_nothing_is_warned_of_once(
    make_server, make_bridge
) -> None:  # type: ignore[no-untyped-def]
    # with eot_threshold 1 the turn model is not asked: no EagerEndOfTurn could come
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=TOKEN)
    url = flux_url(bridge, f"{GOOD}&eot_threshold=1&eager_eot_threshold=0.5")
    async with connect(url, additional_headers=auth()) as ws:
        for thresholds in ({"eot_threshold": 0.9}, {"eot_threshold": 1}, {"eot_threshold": 1}):
            await ws.send(json.dumps({"type": "Configure", "thresholds": thresholds}))
        await ws.send(json.dumps({"type": "CloseStream"}))
        messages = await events_until_close(ws)
    assert [m["sequence_id"] for m in messages] == list(range(len(messages)))
    assert [m["type"] for m in messages] == [
        "Connected",
        "Warning",
        "ConfigureSuccess",  # 0.9: eager ends can come
        "ConfigureSuccess",  # 1 again: warned again
        "Warning",
        "ConfigureSuccess",  # still 1: already warned
    ]
    assert messages[1]["code"] == messages[4]["code"] == "EAGER_EOT_THRESHOLD_IGNORED"
    await eventually(lambda: server.servicer.active == 0)


@pytest.mark.parametrize(
    ("query", "token", "status", "phrase"),
    [
        ("encoding=linear16&sample_rate=16000", TOKEN, 400, "model is required"),
        (GOOD.replace("flux-general-en", "nova-3"), TOKEN, 400, "is not a Flux model"),
        (f"{GOOD}&eot_threshold=2", TOKEN, 400, "eot_threshold must be a number"),
        (f"{GOOD}&channels=2", TOKEN, 400, "unknown query parameter 'channels'"),
        (GOOD, "wrong", 401, "Invalid credentials."),
    ],
)
async def test_refusals_are_http_errors_on_the_handshake(
    make_server,  # type: ignore[no-untyped-def]
    make_bridge,
    query: str,
    token: str,
    status: int,
    phrase: str,
) -> None:
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=TOKEN)
    code, body, headers = await handshake_refused(flux_url(bridge, query), token)
    assert code == status
    assert phrase in body["err_msg"]
    assert body["request_id"] == headers["dg-request-id"]
    assert server.servicer.active == 0


async def test_a_server_refusal_is_a_flux_error(make_server, make_bridge, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # a server without the turn model refuses SEMANTIC streams: Flux's Error, then 1011
    server = await serve_fake(make_server, cache_dir=str(tmp_path))  # no turn model there
    bridge = await make_bridge(server.port, token=TOKEN)
    async with connect(flux_url(bridge, GOOD), additional_headers=auth()) as ws:
        await ws.send(speech_pcm(0.2).tobytes())
        messages = await events_until_close(ws)
    assert [m["type"] for m in messages] == ["Connected", "Error"]
    error = messages[1]
    assert error["code"] == "INTERNAL_SERVER_ERROR" and error["sequence_id"] == 1
    assert "FAILED_PRECONDITION" in error["description"]
    assert "turn-model" in error["description"]
    assert ws.close_code == 1011
    await eventually(lambda: server.servicer.active == 0)


async def test_client_leaving_mid_turn_frees_the_grpc_stream(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=TOKEN)
    async with connect(flux_url(bridge, GOOD), additional_headers=auth()) as ws:
        await ws.send(speech_pcm(0.5).tobytes())
        await eventually(lambda: server.servicer.active == 1)
    await eventually(lambda: server.servicer.active == 0)


async def test_a_resume_before_the_final_of_a_turn_ends_it_once(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    # the gRPC call breaks after the speech end, while the final is decoded: the new call
    # hears the utterance again, under a new utterance id; the client sees one turn
    gate = threading.Event()
    gate.set()
    engine = FakeEngine(gate=gate)
    server = await serve_fake_sure_of(make_server, 0.1, engine)  # turns end on the timeout
    proxy = await FaultProxy(server.port).start()
    bridge = await make_bridge(proxy.port, token=TOKEN)
    pcm = speech_pcm(1.0).tobytes()
    try:
        url = flux_url(bridge, f"{GOOD}&eot_timeout_ms=500")
        async with connect(url, additional_headers=auth()) as ws:
            await send_at_4x(ws, pcm[: 2 * 16_000])
            await eventually(lambda: len(engine.calls) >= 3)  # partials heard words
            gate.clear()  # the final waits
            await send_at_4x(ws, pcm[2 * 16_000 :] + (silence(1.0) * 32767).astype("<i2").tobytes())
            await eventually(lambda: engine.calls[-1][0].kind == DecodeKind.FINAL)
            await asyncio.sleep(0.2)  # the speech end and the EndOfTurn reach the bridge
            assert proxy.cut() == 1
            gate.set()
            await ws.send(json.dumps({"type": "CloseStream"}))
            messages = await events_until_close(ws)
    finally:
        gate.set()
        await proxy.close()
    check_flux_rules(messages)
    turns = [(m["event"], m["transcript"]) for m in messages if m["type"] == "TurnInfo"]
    assert turns[0][0] == "StartOfTurn" and turns[-1] == ("EndOfTurn", "w0 w1 w2 w3"), turns
    assert [e for e, _ in turns[1:-1]] == ["Update"] * (len(turns) - 2), turns
    (end,) = [m for m in messages if m.get("event") == "EndOfTurn"]
    assert end["turn_index"] == 0 and end["trigger"] == "timeout"
    # the replay's partials repeated what the client had: none was told again (the
    # EndOfTurn's transcript may be the last Update's, when a partial had every word)
    told = [t for e, t in turns if e != "EndOfTurn"]
    assert told == sorted(set(told), key=told.index) and len(told) == len(set(told)), turns
