"""asr-bridge as an OpenAI Realtime transcription endpoint (``/v1/realtime``).

With the official ``openai`` package (pinned in the test extra), unmodified, pointed at the
bridge by its base URL: a real recording through the real tiny.en, at 24 kHz pcm16 (the GA
``session.update``) and as 8 kHz μ-law (the beta ``transcription_session.update``). With a
plain WebSocket client and the fake engine: manual turns (commit, clear), every client
mistake as an ``error`` event with the session going on, the key, and a client leaving.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections import defaultdict
from typing import Any

import numpy as np
import pytest
import soxr
from openai import AsyncOpenAI
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from asr_client.scoring import wer
from asr_server.audio.g711 import mulaw_encode
from tests.helpers import corpus, eventually, read_pcm16, serve_fake, silence, tone

pytestmark = pytest.mark.timeout(180)

KEY = "sk-test-not-a-real-key"
RECORDING = "libri_1089-134686-0000"  # 10 s


def resampled(pcm: np.ndarray, rate: int, to: int) -> np.ndarray:
    audio = soxr.resample(pcm.astype(np.float32) / 32768, rate, to)
    return (np.clip(audio, -1, 1) * 32767).astype("<i2")


def recording(rate: int) -> tuple[np.ndarray, str]:
    rec = corpus()[RECORDING]
    pcm, sr = read_pcm16(rec.path)
    speech = resampled(pcm[:, 0], sr, rate)
    return np.concatenate([speech, np.zeros(rate, "<i2")]), rec.transcript  # 1 s of quiet after


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def check_sequence(events: list[Any]) -> dict[str, str]:
    """The documented order per item; deltas only append; the transcripts by item."""
    ids = [e.event_id for e in events]
    assert len(set(ids)) == len(ids), "event ids repeat"
    kinds = [e.type for e in events]
    assert kinds[:2] == ["session.created", "session.updated"] or kinds[:2] == [
        "session.created",
        "transcription_session.updated",
    ], kinds[:3]
    seen: dict[str, list[str]] = defaultdict(list)
    deltas: dict[str, str] = defaultdict(str)
    done: dict[str, str] = {}
    for e in events[2:]:
        item = getattr(e, "item_id", None)
        if item is None:
            continue
        seen[item].append(e.type)
        if e.type.endswith("transcription.delta"):
            deltas[item] += e.delta
        if e.type.endswith("transcription.completed"):
            done[item] = e.transcript
            assert e.transcript.startswith(deltas[item]), (deltas[item], e.transcript)
            assert e.usage.type == "duration" and e.usage.seconds > 0
    for item, order in seen.items():
        vad = [k.rsplit(".", 1)[-1] for k in order if k.startswith("input_audio_buffer.")]
        assert vad == ["speech_started", "speech_stopped", "committed"], (item, order)
        assert order[-1] == "conversation.item.input_audio_transcription.completed", order
    # each committed item is added to the conversation (GA: .added; beta: .created)
    added = [
        e.item.id if hasattr(e.item, "id") else e.item["id"]
        for e in events
        if e.type in ("conversation.item.added", "conversation.item.created")
    ]
    assert sorted(added) == sorted(seen), (added, list(seen))
    return done


async def transcribe_with_the_sdk(
    port: int, session_event: str, session: dict[str, Any], audio: np.ndarray, chunk: int
) -> list[Any]:
    """The official client: update the session, append the audio at about 4x real time,
    read events until every committed item is completed and the audio is all sent."""
    client = AsyncOpenAI(api_key=KEY, base_url=f"http://127.0.0.1:{port}/v1")
    events: list[Any] = []
    async with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        if session_event == "session.update":
            await conn.session.update(session=session)  # type: ignore[arg-type]
        else:  # the beta event has no helper in this SDK: sent as a raw event
            await conn.send({"type": session_event, "session": session})  # type: ignore[arg-type]
        sent = asyncio.Event()

        async def send() -> None:
            for i in range(0, len(audio), chunk):
                await conn.input_audio_buffer.append(audio=b64(audio[i : i + chunk].tobytes()))
                await asyncio.sleep(0.025)
            sent.set()

        sender = asyncio.create_task(send())
        committed, completed = 0, 0
        deadline = asyncio.get_running_loop().time() + 90
        while not (sent.is_set() and completed and completed == committed):
            try:  # short waits: the last item may be done before the last audio is sent
                event = await asyncio.wait_for(conn.recv(), 1.0)
            except TimeoutError:
                assert asyncio.get_running_loop().time() < deadline, [e.type for e in events]
                continue
            events.append(event)
            committed += event.type == "input_audio_buffer.committed"
            completed += event.type.endswith("transcription.completed")
        await sender
    await client.close()
    return events


async def test_the_official_sdk_transcribes_a_recording(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    server = await make_server()  # the real tiny.en
    bridge = await make_bridge(server.port, token=KEY)
    audio, reference = recording(24_000)
    session = {
        "type": "transcription",
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": 24_000},
                "transcription": {"model": "gpt-4o-transcribe", "language": "en"},
                "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
                "noise_reduction": {"type": "near_field"},
            }
        },
    }
    events = await transcribe_with_the_sdk(bridge.port, "session.update", session, audio, 2400)
    updated = events[1].session
    assert updated.type == "transcription"
    assert updated.audio.input.turn_detection.silence_duration_ms == 500
    done = check_sequence(events)
    assert done
    assert any(e.type.endswith("transcription.delta") for e in events)
    text = " ".join(done.values())
    assert wer([reference], [text]) <= 0.15, text
    await eventually(lambda: server.servicer.active == 0)


async def test_phone_audio_with_the_beta_session_update(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    server = await make_server()
    bridge = await make_bridge(server.port)
    audio, reference = recording(8_000)
    ulaw = np.frombuffer(mulaw_encode(audio), np.uint8)
    session = {
        "input_audio_format": "g711_ulaw",
        "input_audio_transcription": {"model": "whisper-1", "language": "en"},
        "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
    }
    events = await transcribe_with_the_sdk(
        bridge.port, "transcription_session.update", session, ulaw, 800
    )
    assert events[1].type == "transcription_session.updated"
    # an event this SDK has no model for comes as it was sent: the beta session's shape
    session_back = events[1].session  # type: ignore[union-attr]
    assert session_back["input_audio_format"] == "g711_ulaw"
    assert session_back["turn_detection"]["silence_duration_ms"] == 500
    done = check_sequence(events)
    assert wer([reference], [" ".join(done.values())]) <= 0.25, done


async def test_the_beta_sdk_gets_a_beta_session_from_the_start(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    """The SDK's beta client (``client.beta.realtime``, header ``OpenAI-Beta: realtime=v1``),
    as pre-GA agent code uses it: the session opens with ``transcription_session.created``
    in the beta shape, which such clients wait for before their update (it opened with
    the GA ``session.created``), and its items are ``.created``."""
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=KEY)
    client = AsyncOpenAI(
        api_key=KEY,
        base_url=f"http://127.0.0.1:{bridge.port}/v1",
        websocket_base_url=f"ws://127.0.0.1:{bridge.port}/v1",
    )
    events: list[Any] = []
    async with client.beta.realtime.connect(
        model="", extra_query={"intent": "transcription"}
    ) as conn:
        created = await asyncio.wait_for(conn.recv(), 10)
        assert created.type == "transcription_session.created"
        session = created.session  # (the SDK's model for it, or the event's dict)
        fields = session if isinstance(session, dict) else session.model_dump()
        assert fields["input_audio_format"] == "pcm16"
        assert fields["turn_detection"]["type"] == "server_vad"
        await conn.transcription_session.update(
            session={"input_audio_format": "pcm16", "turn_detection": {"type": "server_vad"}}
        )
        audio = pcm24(np.concatenate([tone(1.0), silence(0.8)]))
        await conn.input_audio_buffer.append(audio=b64(audio))
        while not events or not events[-1].type.endswith("transcription.completed"):
            events.append(await asyncio.wait_for(conn.recv(), 10))
    await client.close()
    kinds = [e.type for e in events]
    assert kinds[0] == "transcription_session.updated", kinds
    assert "conversation.item.created" in kinds and "conversation.item.added" not in kinds
    assert events[-1].transcript == "w0 w1 w2 w3"
    await eventually(lambda: server.servicer.active == 0)


# -- the protocol with a plain WebSocket client and the fake engine --------------------------


async def open_session(port: int, **headers: str) -> ClientConnection:
    ws = await connect(
        f"ws://127.0.0.1:{port}/v1/realtime?intent=transcription",
        additional_headers={"Authorization": f"Bearer {KEY}", **headers},
    )
    created = json.loads(await ws.recv())
    assert created["type"] == "session.created"
    assert created["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    return ws


async def send(ws: ClientConnection, kind: str, **fields: Any) -> None:
    await ws.send(json.dumps({"type": kind, **fields}))


async def next_of(ws: ClientConnection, *kinds: str) -> dict[str, Any]:
    """The next event of one of ``kinds`` (others are skipped)."""
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 10))
        if event["type"] in kinds:
            return event


def pcm24(x: np.ndarray) -> bytes:
    return resampled((x * 32767).astype(np.int16), 16_000, 24_000).tobytes()


MANUAL = {"type": "transcription", "audio": {"input": {"turn_detection": None}}}


async def test_manual_turns_commit_and_clear(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port)
    async with await open_session(bridge.port) as ws:
        await send(ws, "session.update", session=MANUAL)
        updated = await next_of(ws, "session.updated")
        assert updated["session"]["audio"]["input"]["turn_detection"] is None
        await send(ws, "input_audio_buffer.append", audio=b64(pcm24(tone(1.0))))
        await send(ws, "input_audio_buffer.commit")
        committed = await next_of(ws, "input_audio_buffer.committed", "error")
        assert committed["type"] == "input_audio_buffer.committed"
        completed = await next_of(ws, "conversation.item.input_audio_transcription.completed")
        assert completed["transcript"] == "w0 w1 w2 w3"
        assert completed["item_id"] == committed["item_id"]
        # appended, then cleared: that audio never becomes a transcript
        await send(ws, "input_audio_buffer.append", audio=b64(pcm24(tone(2.0))))
        await send(ws, "input_audio_buffer.clear")
        await next_of(ws, "input_audio_buffer.cleared")
        await send(ws, "input_audio_buffer.commit", event_id="evt_empty")
        error = await next_of(ws, "error")
        assert error["error"]["code"] == "input_audio_buffer_commit_empty"
        assert error["error"]["event_id"] == "evt_empty"
        await send(ws, "input_audio_buffer.append", audio=b64(pcm24(tone(0.5))))
        await send(ws, "input_audio_buffer.commit")
        after = await next_of(ws, "conversation.item.input_audio_transcription.completed")
        assert after["transcript"] == "w0 w1"  # 0.5 s, not the 2 s that were cleared
        # turn detection off: the server says nothing of speech starting or stopping
        # a push-to-talk press without speech: its commit still gets an item, completed empty
        await send(ws, "input_audio_buffer.append", audio=b64(pcm24(silence(0.5))))
        await send(ws, "input_audio_buffer.commit")
        quiet = await next_of(ws, "input_audio_buffer.committed")
        assert quiet["previous_item_id"] == after["item_id"]
        empty = await next_of(ws, "conversation.item.input_audio_transcription.completed")
        assert empty["item_id"] == quiet["item_id"] and empty["transcript"] == ""
    await eventually(lambda: server.servicer.active == 0)


async def test_replies_come_in_the_order_the_client_sent_its_events(  # type: ignore[no-untyped-def]
    make_server, make_bridge
) -> None:
    """OpenAI answers a commit at once, so its clients read replies in the order they sent
    events. Here a commit waits for the server's answer: the error for a second, empty
    commit sent at once after the first came before the first's ``committed``, and so
    did a clear's ``cleared`` and an update's ``session.updated`` (the compat reviewer's)."""
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port)
    async with await open_session(bridge.port) as ws:
        await send(ws, "session.update", session=MANUAL)
        await next_of(ws, "session.updated")
        await send(ws, "input_audio_buffer.append", audio=b64(pcm24(tone(1.0))))
        await send(ws, "input_audio_buffer.commit", event_id="c1")
        await send(ws, "input_audio_buffer.commit", event_id="c2")
        await send(ws, "input_audio_buffer.clear", event_id="x1")
        await send(ws, "session.update", session={"include": []})
        await send(ws, "input_audio_buffer.append", audio=b64(pcm24(tone(0.5))))
        await send(ws, "input_audio_buffer.commit", event_id="c3")
        events = []
        while len([e for e in events if e["type"].endswith("transcription.completed")]) < 2:
            events.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
    replies = [
        e["type"] if e["type"] != "error" else f"error {e['error']['event_id']}"
        for e in events
        if e["type"]
        in (
            "input_audio_buffer.committed",
            "error",
            "input_audio_buffer.cleared",
            "session.updated",
        )
    ]
    assert replies == [
        "input_audio_buffer.committed",  # c1
        "error c2",  # empty
        "input_audio_buffer.cleared",
        "session.updated",
        "input_audio_buffer.committed",  # c3
    ], replies
    completed = [e["transcript"] for e in events if e["type"].endswith("transcription.completed")]
    assert completed == ["w0 w1 w2 w3", "w0 w1"]
    await eventually(lambda: server.servicer.active == 0)


async def test_a_long_press_the_server_splits_is_one_commit_and_one_item(  # type: ignore[no-untyped-def]
    make_server, make_bridge
) -> None:
    """A 9.5 s push-to-talk press with a breath after 7 s: the server splits it there (its
    utterances end at a pause once over 6 s), but the client committed once, and OpenAI
    answers one commit with one item. A beta session: its item is ``.created``."""
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port)
    async with await open_session(bridge.port) as ws:
        await send(ws, "transcription_session.update", session={"turn_detection": None})
        await next_of(ws, "transcription_session.updated")
        press = pcm24(np.concatenate([tone(7.0), silence(0.5), tone(2.0)]))
        await send(ws, "input_audio_buffer.append", audio=b64(press))
        await send(ws, "input_audio_buffer.commit")
        events = []
        while not events or not events[-1]["type"].endswith("transcription.completed"):
            events.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
    kinds = [e["type"] for e in events]
    assert kinds.count("input_audio_buffer.committed") == 1, kinds
    words = [f"w{i}" for i in range(28)] + [f"w{i}" for i in range(8)]  # 7 s, then 2 s
    assert events[-1]["transcript"] == " ".join(words)
    committed = events[kinds.index("input_audio_buffer.committed")]
    assert {e["item_id"] for e in events if "item_id" in e} == {committed["item_id"]}
    created = events[kinds.index("input_audio_buffer.committed") + 1]
    assert created["type"] == "conversation.item.created"
    assert created["item"]["id"] == committed["item_id"]
    assert created["item"]["content"] == [{"type": "input_audio", "transcript": None}]
    await eventually(lambda: server.servicer.active == 0)


async def test_push_to_talk_pauses_outlast_the_servers_idle_timeout(  # type: ignore[no-untyped-def]
    make_server, make_bridge
) -> None:
    """A push-to-talk client sends nothing between presses; OpenAI keeps the session, and
    so does the bridge: its stream gets KEEPALIVEs (after a third of the idle timeout the
    server says it has) while the server would end an idle one after 1 s."""
    server = await serve_fake(make_server, idle_timeout_s=1.0)
    bridge = await make_bridge(server.port)
    async with await open_session(bridge.port) as ws:
        await send(ws, "session.update", session=MANUAL)
        await next_of(ws, "session.updated")
        texts = []
        for press in range(2):
            await send(ws, "input_audio_buffer.append", audio=b64(pcm24(tone(1.0))))
            await send(ws, "input_audio_buffer.commit")
            done = await next_of(
                ws, "conversation.item.input_audio_transcription.completed", "error"
            )
            texts.append(done.get("transcript"))
            if press == 0:
                await asyncio.sleep(3.0)  # three idle timeouts between the presses
    assert texts == ["w0 w1 w2 w3", "w0 w1 w2 w3"]
    await eventually(lambda: server.servicer.active == 0)


async def test_commits_and_clears_sent_at_once_are_each_answered(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    """A client far ahead of the server (a file, sent as fast as it goes): each commit and
    clear takes effect where it came in the audio, whatever the server's lag."""
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port)
    async with await open_session(bridge.port) as ws:
        await send(ws, "session.update", session=MANUAL)
        await next_of(ws, "session.updated")
        for seconds, action in ((1.0, "commit"), (2.0, "clear"), (0.5, "commit"), (0, "commit")):
            audio = tone(seconds) if seconds else silence(0.3)
            await send(ws, "input_audio_buffer.append", audio=b64(pcm24(audio)))
            await send(ws, f"input_audio_buffer.{action}")
        transcripts = []
        while len(transcripts) < 3:
            event = await next_of(ws, "conversation.item.input_audio_transcription.completed")
            transcripts.append(event["transcript"])
    assert transcripts == ["w0 w1 w2 w3", "w0 w1", ""]
    await eventually(lambda: server.servicer.active == 0)


@pytest.mark.parametrize(
    ("event", "code", "phrase"),
    [
        ("not json", "invalid_json", "not JSON"),
        ('{"no": "type"}', "invalid_event", '"type"'),
        ('{"type": "response.create"}', "invalid_event", "unsupported event type"),
        ('{"type": "input_audio_buffer.append", "audio": "%%%"}', "invalid_value", "base64"),
        ('{"type": "input_audio_buffer.append", "audio": "AA=="}', "invalid_value", "whole"),
        (
            '{"type": "session.update", "session": {"type": "realtime"}}',
            "invalid_value",
            "transcribes",
        ),
        (
            '{"type": "session.update", "session": {"audio": {"input": {"format": '
            '{"type": "audio/flac"}}}}}',
            "invalid_value",
            "unsupported audio format",
        ),
        (
            '{"type": "session.update", "session": {"audio": {"input": {"turn_detection": '
            '{"type": "magic_vad"}}}}}',
            "invalid_value",
            "use server_vad",
        ),
        (
            '{"type": "transcription_session.update", "session": {"turn_detection": '
            '{"type": "server_vad", "silence_duration_ms": 50}}}',
            "invalid_value",
            "silence_duration_ms",
        ),
        (
            '{"type": "transcription_session.update", "session": '
            '{"input_audio_transcription": null}}',
            "invalid_value",
            "cannot be turned off",
        ),
        # values of the wrong JSON type where a name is looked up: a list or an object
        # ended the session with a traceback and no error (the compat reviewer's)
        (
            '{"type": "transcription_session.update", "session": '
            '{"input_audio_format": ["pcm16"]}}',
            "invalid_value",
            "unsupported audio format",
        ),
        (
            '{"type": "session.update", "session": {"audio": {"input": {"format": '
            '{"type": {"name": "audio/pcm"}}}}}}',
            "invalid_value",
            "unsupported audio format",
        ),
        (
            '{"type": "session.update", "session": {"audio": {"input": {"turn_detection": '
            '{"type": "semantic_vad", "eagerness": ["low"]}}}}}',
            "invalid_value",
            "eagerness must be one of",
        ),
    ],
)
async def test_client_mistakes_are_error_events_and_the_session_goes_on(  # type: ignore[no-untyped-def]
    make_server, make_bridge, event: str, code: str, phrase: str
) -> None:
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port)
    async with await open_session(bridge.port) as ws:
        await ws.send(event)
        error = await next_of(ws, "error")
        assert error["error"]["type"] == "invalid_request_error"
        assert error["error"]["code"] == code and phrase in error["error"]["message"], error
        # nothing was lost: the session still transcribes
        await send(
            ws,
            "input_audio_buffer.append",
            audio=b64(pcm24(np.concatenate([tone(1.0), silence(0.8)]))),
        )
        completed = await next_of(ws, "conversation.item.input_audio_transcription.completed")
        assert completed["transcript"] == "w0 w1 w2 w3"
    await eventually(lambda: server.servicer.active == 0)
    # a session that went on did not end with an error: a chatty client cannot inflate it
    errors = bridge.metrics.registry.get_sample_value(
        "asr_bridge_session_errors_total", {"code": "INVALID_ARGUMENT"}
    )
    assert not errors, errors


async def test_a_fault_in_the_bridge_is_an_error_event_and_close_1011(  # type: ignore[no-untyped-def]
    make_server, make_bridge, monkeypatch, caplog
) -> None:
    """A bug in a session's handling (here: an update that raises what no check expected)
    ends that session with a server_error event and close 1011, logged with its
    traceback: not a dropped connection (1006) with nothing said, and the bridge serves
    the next session."""
    from asr_bridge import realtime_session

    async def broken(self: object, event: object) -> None:
        raise KeyError("an unforeseen fault")

    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port)
    monkeypatch.setattr(realtime_session.RealtimeSession, "_update", broken)
    with caplog.at_level("ERROR", logger="asr_bridge.app"):
        async with await open_session(bridge.port) as ws:
            await send(ws, "input_audio_buffer.append", audio=b64(pcm24(tone(0.5))))
            await send(ws, "session.update", session={"include": []})
            error = await next_of(ws, "error")
            assert error["error"]["type"] == "server_error"
            assert error["error"]["code"] == "internal", error
            with pytest.raises(ConnectionClosed):
                await next_of(ws, "never")
        assert ws.close_code == 1011
    assert any("an unforeseen fault" in (r.exc_text or "") for r in caplog.records)
    await eventually(lambda: server.servicer.active == 0)
    monkeypatch.undo()
    async with await open_session(bridge.port) as ws:
        await send(ws, "input_audio_buffer.append", audio=b64(pcm24(tone(1.0))))
        await send(ws, "input_audio_buffer.append", audio=b64(pcm24(silence(0.8))))
        completed = await next_of(ws, "conversation.item.input_audio_transcription.completed")
        assert completed["transcript"] == "w0 w1 w2 w3"


async def test_settings_cannot_change_once_audio_flows_but_binary_frames_are_refused(  # type: ignore[no-untyped-def]
    make_server, make_bridge
) -> None:
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port)
    async with await open_session(bridge.port) as ws:
        await send(ws, "input_audio_buffer.append", audio=b64(pcm24(tone(0.3))))
        german = {"audio": {"input": {"transcription": {"language": "de"}}}}
        await send(ws, "session.update", session=german)
        error = await next_of(ws, "error")
        assert error["error"]["code"] == "session_update_after_audio"
        await ws.send(b"\x00\x01")
        error = await next_of(ws, "error")
        assert "base64" in error["error"]["message"]
        # an update that changes nothing the stream uses is fine
        await send(ws, "session.update", session={"include": []})
        assert (await next_of(ws, "session.updated", "error"))["type"] == "session.updated"


async def test_a_wrong_key_opens_no_stream(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=KEY)
    async with connect(
        f"ws://127.0.0.1:{bridge.port}/v1/realtime",
        additional_headers={"Authorization": "Bearer sk-wrong"},
    ) as ws:
        error = json.loads(await ws.recv())
        assert error["type"] == "error" and error["error"]["code"] == "unauthenticated"
        await ws.wait_closed()
    assert ws.close_code == 4401
    assert server.servicer.active == 0
    assert bridge.metrics.registry.get_sample_value("asr_bridge_sessions_total") in (0, None)


async def test_a_client_leaving_mid_utterance_frees_the_server_stream(
    make_server, make_bridge
) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port)
    async with await open_session(bridge.port) as ws:
        await send(ws, "input_audio_buffer.append", audio=b64(pcm24(tone(1.0))))
        await next_of(ws, "input_audio_buffer.speech_started")
        assert server.servicer.active == 1
    await eventually(lambda: server.servicer.active == 0)


async def test_semantic_vad_is_the_servers_semantic_endpointing(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port)
    semantic = {
        "audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}}
    }
    async with await open_session(bridge.port) as ws:
        await send(ws, "session.update", session=semantic)
        updated = await next_of(ws, "session.updated", "error")
        assert updated["session"]["audio"]["input"]["turn_detection"] == {
            "type": "semantic_vad",
            "eagerness": "high",
        }
        audio = np.concatenate([tone(1.0), silence(2.5)])  # high: 2 s at the most
        await send(ws, "input_audio_buffer.append", audio=b64(pcm24(audio)))
        completed = await next_of(ws, "conversation.item.input_audio_transcription.completed")
        assert completed["transcript"] == "w0 w1 w2 w3"
    await eventually(lambda: server.servicer.active == 0)


async def test_a_server_that_cannot_be_reached_is_an_error_event_and_a_close(make_bridge) -> None:  # type: ignore[no-untyped-def]
    # the stream opens at the first append: that it cannot is said, not a dropped socket
    from tests.processes import free_port

    bridge = await make_bridge(free_port())  # nobody listens there
    async with await open_session(bridge.port) as ws:
        await send(ws, "input_audio_buffer.append", audio=b64(pcm24(tone(0.2))))
        error = await next_of(ws, "error")
        assert error["error"]["type"] == "server_error"
        assert error["error"]["code"] == "unavailable", error
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
    refusals = bridge.metrics.registry.get_sample_value(
        "asr_bridge_refusals_total", {"reason": "server_unavailable"}
    )
    assert refusals == 1


async def test_an_append_of_seconds_in_one_event_is_taken(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    # 6 s of 24 kHz PCM in one event is about 384 KB of JSON, under the 1 MB the API takes
    # (over the 256 KiB the sockets once allowed: a 1009 close)
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port)
    async with await open_session(bridge.port) as ws:
        audio = pcm24(np.concatenate([tone(1.0), silence(0.8), tone(1.0), silence(3.2)]))
        assert len(b64(audio)) > 300_000
        await send(ws, "input_audio_buffer.append", audio=b64(audio))
        first = await next_of(ws, "conversation.item.input_audio_transcription.completed")
        second = await next_of(ws, "conversation.item.input_audio_transcription.completed")
        assert first["transcript"] == second["transcript"] == "w0 w1 w2 w3"
        # over 1 MB: the API's own error, and the session goes on
        await send(ws, "input_audio_buffer.append", audio="A" * (1 << 20))
        error = await next_of(ws, "error")
        assert error["error"]["code"] == "too_large"


async def test_a_server_that_falls_behind_ends_the_session_with_1013(
    make_server, make_bridge, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """As on /ws and /v1/listen: a server that takes no audio for the write deadline gets an
    error event saying so and close 1013, not the socket keepalive's reasonless 1011 some
    40 s later (the client's pong waits unread behind the append the bridge is stuck on)."""
    from tests.integration.test_bridge import client_of_a_stalled_server

    bridge, gate = await client_of_a_stalled_server(make_server, make_bridge, monkeypatch)
    append = json.dumps({"type": "input_audio_buffer.append", "audio": b64(pcm24(tone(0.05)))})

    async def append_until_closed(ws: ClientConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            while True:
                await ws.send(append)

    async def events_until_close(ws: ClientConnection) -> list[dict[str, Any]]:
        events = []
        with contextlib.suppress(ConnectionClosed):
            async for message in ws:
                events.append(json.loads(message))
        return events

    try:
        async with await open_session(bridge.port) as ws:
            sender = asyncio.create_task(append_until_closed(ws))
            events = await asyncio.wait_for(events_until_close(ws), 10)
            await sender
    finally:
        gate.set()
    assert ws.close_code == 1013, (ws.close_code, ws.close_reason)
    error = events[-1]
    assert error["type"] == "error" and error["error"]["code"] == "resource_exhausted"
    assert "the server fell behind" in error["error"]["message"]


@pytest.mark.parametrize("cut", ["mid_speech", "after_speech_end"])
async def test_a_broken_grpc_stream_resumes_without_the_client_noticing(  # type: ignore[no-untyped-def]
    make_server, make_bridge, cut
) -> None:
    """The bridge's gRPC stream breaks in the middle of speech, or after its end (the item
    committed) and before its final: the bridge goes on on a new call, and the client sees
    one speech_started and one commit, and its item completed."""
    from tests.helpers import SocketEvents, bridge_with_a_cut

    gate, proxy, bridge = await bridge_with_a_cut(make_server, make_bridge)
    events = SocketEvents()

    try:
        async with await open_session(bridge.port) as ws:
            await send(ws, "input_audio_buffer.append", audio=b64(pcm24(tone(1.0))))
            await events.until(ws, "input_audio_buffer.speech_started")
            if cut == "after_speech_end":
                gate.clear()  # the engine stalls: the speech ends, its final waits
                await send(ws, "input_audio_buffer.append", audio=b64(pcm24(silence(1.0))))
                await events.until(ws, "conversation.item.added")
            proxy.cut()
            gate.set()
            if cut == "mid_speech":
                await send(ws, "input_audio_buffer.append", audio=b64(pcm24(silence(1.0))))
            await events.until(ws, "conversation.item.done")
    finally:
        gate.set()
        await proxy.close()
    assert [e["type"] for e in events] == [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.input_audio_transcription.delta",
        "conversation.item.input_audio_transcription.completed",
        "conversation.item.done",
    ]
    assert len({e.get("item_id", e.get("item", {}).get("id")) for e in events}) == 1
    assert events[-2]["transcript"] == "w0 w1 w2 w3"
    assert bridge.metrics.registry.get_sample_value("asr_bridge_resumes_total") == 1
