"""The bridge's message shapes and token check, without sockets."""

from __future__ import annotations

import base64
import json

import pytest

from asr_api.v1 import asr_pb2
from asr_bridge.auth import presented_token, token_ok
from asr_bridge.protocol import (
    Audio,
    Finalize,
    OpenAIEvents,
    ProtocolError,
    Start,
    Stop,
    StreamasrEvents,
    close_code_for,
    close_reason,
    parse_binary,
    parse_text,
    streaming_config,
)


def test_start_message_becomes_a_linear16_mono_config() -> None:
    start = parse_text(
        json.dumps(
            {
                "type": "start",
                "sample_rate": 48000,
                "language": "en",
                "languages": ["en", "de"],
                "hotwords": ["Kubernetes"],
            }
        )
    )
    assert start == Start(48000, language="en", languages=("en", "de"), hotwords=("Kubernetes",))
    config = streaming_config(start)  # type: ignore[arg-type]
    assert config.format.encoding == asr_pb2.AudioFormat.LINEAR16
    assert (config.format.sample_rate_hz, config.format.channels) == (48000, 1)
    assert config.interim_results and list(config.hotwords) == ["Kubernetes"]
    assert list(config.languages) == ["en", "de"]


def test_a_semantic_start_may_set_its_turn_threshold() -> None:
    start = parse_text(
        '{"type": "start", "sample_rate": 16000, "endpointing": "semantic", "turn_threshold": 0.9}'
    )
    config = streaming_config(start)  # type: ignore[arg-type]
    assert config.endpointing.mode == asr_pb2.EndpointingConfig.SEMANTIC
    assert config.endpointing.turn_threshold == pytest.approx(0.9)


@pytest.mark.parametrize(
    ("text", "phrase"),
    [
        ("nope", "not JSON"),
        ("[1]", "JSON object"),
        ('{"type": "dance"}', "unknown message type"),
        ('{"type": "start"}', "sample_rate"),
        ('{"type": "start", "sample_rate": 96000}', "8000 to 48000"),
        ('{"type": "start", "sample_rate": 16000.0}', "integer"),
        ('{"type": "start", "sample_rate": 16000, "silence_ms": true}', "silence_ms"),
        ('{"type": "start", "sample_rate": 16000, "events": "grpc"}', "events"),
        ('{"type": "start", "sample_rate": 16000, "hotwords": "a"}', "hotwords"),
        ('{"type": "start", "sample_rate": 16000, "languages": "de,fr"}', "languages"),
        ('{"type": "start", "sample_rate": 16000, "turn_threshold": 2}', "turn_threshold"),
        ('{"type": "start", "sample_rate": 16000, "turn_threshold": true}', "turn_threshold"),
        ('{"type": "input_audio_buffer.append", "audio": "%%%"}', "base64"),
        ('{"type": "input_audio_buffer.append", "audio": "\u00e9"}', "base64"),
        ('{"type": "start", "sample_rate": 16000, "silence_ms": -1}', "silence_ms"),
        # under the server's 100 ms: refused before the stream opens, not after `ready`
        ('{"type": "start", "sample_rate": 16000, "silence_ms": 1}', "from 100 to 10000"),
        ('{"type": "start", "sample_rate": 16000, "silence_ms": 99}', "from 100 to 10000"),
        ('{"type": "start", "sample_rate": 16000, "silence_ms": 4294967296}', "silence_ms"),
        # JSON can spell a lone UTF-16 surrogate, which no protobuf string can hold
        ('{"type": "start", "sample_rate": 16000, "language": "\\ud800"}', "surrogate"),
        ('{"type": "start", "sample_rate": 16000, "hotwords": ["a\\udfff"]}', "surrogate"),
        # past the parser's recursion limit in 3 kB: a bad message, not a crashed session
        ("[" * 1500 + "]" * 1500, "not JSON: nested too deeply"),
    ],
)
def test_bad_text_messages_say_what_is_wrong(text: str, phrase: str) -> None:
    with pytest.raises(ProtocolError, match=phrase):
        parse_text(text)


def test_control_messages_and_openai_aliases() -> None:
    assert parse_text('{"type": "finalize"}') == Finalize()
    assert parse_text('{"type": "input_audio_buffer.commit"}') == Finalize()
    assert parse_text('{"type": "stop"}') == Stop()
    audio = base64.b64encode(b"\x01\x00\x02\x00").decode()
    assert parse_text(json.dumps({"type": "input_audio_buffer.append", "audio": audio})) == Audio(
        b"\x01\x00\x02\x00"
    )


def test_binary_frames_are_whole_int16_samples_of_bounded_size() -> None:
    assert parse_binary(b"\x00\x01") == Audio(b"\x00\x01")
    with pytest.raises(ProtocolError, match="odd"):
        parse_binary(b"\x00")
    with pytest.raises(ProtocolError, match="over"):
        parse_binary(bytes(1 << 20))


def test_close_codes_and_reasons() -> None:
    assert close_code_for("INVALID_ARGUMENT") == 4400
    assert close_code_for("RESOURCE_EXHAUSTED") == 1013
    assert close_code_for("UNAVAILABLE") == 1013
    assert close_code_for("UNAUTHENTICATED") == 4401
    assert close_code_for("INTERNAL") == 1011
    long = "é" * 200
    assert len(close_reason(long).encode()) <= 123
    assert close_reason("short") == "short"


def partial(stable: str, unstable: str, utterance: int = 0) -> asr_pb2.StreamingRecognizeResponse:
    text = " ".join(t for t in (stable, unstable) if t)
    return asr_pb2.StreamingRecognizeResponse(
        result=asr_pb2.Result(
            text=text, stable_text=stable, unstable_text=unstable, utterance_id=utterance
        ),
        progress=asr_pb2.Progress(lag_s=0.25),
    )


def final(text: str, utterance: int = 0) -> asr_pb2.StreamingRecognizeResponse:
    return asr_pb2.StreamingRecognizeResponse(
        result=asr_pb2.Result(
            is_final=True,
            text=text,
            stable_text=text,
            utterance_id=utterance,
            words=[asr_pb2.Word(word="hi", start_s=0.1, end_s=0.3, probability=0.9)],
            confidence=0.8765,
        )
    )


def test_streamasr_events_flatten_the_responses() -> None:
    events = StreamasrEvents()
    (p,) = events.response(partial("hello", "wor"))
    assert p["type"] == "partial" and p["text"] == "hello wor" and p["lag_s"] == 0.25
    assert "confidence" not in p  # a partial has none
    (f,) = events.response(final("hello world"))
    assert f["type"] == "final" and f["words"][0]["word"] == "hi"
    assert f["confidence"] == 0.877
    started = asr_pb2.StreamingRecognizeResponse(
        speech_event=asr_pb2.SpeechEvent(type=asr_pb2.SpeechEvent.SPEECH_STARTED, offset_s=1.5)
    )
    assert events.response(started)[0]["type"] == "speech_started"
    assert events.response(asr_pb2.StreamingRecognizeResponse()) == []


def test_a_finalize_and_its_acknowledgement_reach_the_browser() -> None:
    events = StreamasrEvents()
    answer = final("hello world")
    (f,) = events.response(final("hello world"))
    assert "from_finalize" not in f  # ended by the server's endpointing
    answer.result.from_finalize = True
    (f,) = events.response(answer)
    assert f["type"] == "final" and f["from_finalize"] is True
    done = asr_pb2.StreamingRecognizeResponse(
        speech_event=asr_pb2.SpeechEvent(
            type=asr_pb2.SpeechEvent.FINALIZED, offset_s=2.75, utterance_id=4
        )
    )
    (d,) = events.response(done)
    assert d == {"type": "finalized", "utterance_id": 4, "offset_s": 2.75, "lag_s": 0.0}
    # the first utterance is 0; a finalize before any utterance names none
    done.speech_event.utterance_id = 0
    assert events.response(done)[0]["utterance_id"] == 0
    done.speech_event.ClearField("utterance_id")
    assert events.response(done)[0]["utterance_id"] is None


def test_eager_finals_are_asked_for_and_reach_the_browser() -> None:
    start = parse_text(json.dumps({"type": "start", "sample_rate": 16000, "eager_finals": True}))
    assert isinstance(start, Start) and streaming_config(start).endpointing.eager_finals
    with pytest.raises(ProtocolError, match="eager_finals"):
        parse_text(json.dumps({"type": "start", "sample_rate": 16000, "eager_finals": "yes"}))
    events = StreamasrEvents()
    eager = partial("", "hello world", utterance=3)
    eager.result.eager = True
    (e,) = events.response(eager)
    assert e["type"] == "eager" and e["text"] == "hello world" and e["utterance_id"] == 3
    resumed = asr_pb2.StreamingRecognizeResponse(
        speech_event=asr_pb2.SpeechEvent(
            type=asr_pb2.SpeechEvent.SPEECH_RESUMED, offset_s=2.5, utterance_id=3
        )
    )
    (r,) = events.response(resumed)
    assert r["type"] == "speech_resumed" and r["utterance_id"] == 3 and r["offset_s"] == 2.5


def test_end_of_turn_reaches_the_browser() -> None:
    response = asr_pb2.StreamingRecognizeResponse(
        end_of_turn=asr_pb2.EndOfTurn(
            offset_s=3.25, utterance_id=2, probability=0.912, reason=asr_pb2.EndOfTurn.MODEL
        )
    )
    (event,) = StreamasrEvents().response(response)
    assert event == {
        "type": "end_of_turn",
        "utterance_id": 2,
        "offset_s": 3.25,
        "probability": 0.912,
        "reason": "model",
        "lag_s": 0.0,
    }


def test_openai_deltas_carry_newly_stable_text_then_the_rest_with_the_final() -> None:
    events = OpenAIEvents()
    events.ready("abc", 16000)
    got = [
        e.get("delta")
        for r in (partial("", "he"), partial("hello", "wor"), partial("hello", "world"))
        for e in events.response(r)
    ]
    got += [e.get("delta") for e in events.response(partial("hello world", "how"))]
    # the final of an utterance with no SPEECH_ENDED seen (the server split it, or the
    # audio ended inside it): the item goes on ...
    got += [e.get("delta") for e in events.response(final("hello world how are you"))]
    # (no delta comes before its item is committed: OpenAI's never do)
    assert got == []
    # ... until the stream ends inside it: then committed, the text, and completed
    committed, created, *deltas, done = events.closed()
    assert committed["type"] == "input_audio_buffer.committed"
    assert created["type"] == "conversation.item.created"  # (the beta shape of the session)
    assert [d["delta"] for d in deltas] == ["hello", " world", " how are you"]
    assert done["type"] == "conversation.item.input_audio_transcription.completed"
    assert done["transcript"] == "hello world how are you"
    assert done["item_id"] == created["item"]["id"] == "item_abc_0"
    assert events.closed() == []
    error = events.error("RESOURCE_EXHAUSTED", "too many")[0]
    assert (
        error["error"]["type"] == "server_error" and error["error"]["code"] == "RESOURCE_EXHAUSTED"
    )


def test_token_check() -> None:
    assert token_ok(None, None) and token_ok("", "anything")
    assert token_ok("s3cret", "s3cret")
    assert not token_ok("s3cret", None) and not token_ok("s3cret", "s3cre")
    assert presented_token({"token": "q"}, ["streamasr.v1", "bearer.p"]) == "p"
    assert presented_token({"token": "q"}, ["streamasr.v1"]) == "q"
    assert presented_token({}, []) is None


def test_a_surrogate_pair_is_text_and_passes() -> None:
    start = parse_text('{"type": "start", "sample_rate": 16000, "hotwords": ["\\ud83d\\ude00"]}')
    assert isinstance(start, Start) and start.hotwords == ("\U0001f600",)
    assert streaming_config(start).hotwords == ["\U0001f600"]
