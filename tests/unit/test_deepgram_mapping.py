"""The pure Deepgram mapping: query → config, text → commands, responses → messages."""

from __future__ import annotations

from urllib.parse import parse_qsl

import numpy as np
import pytest

from asr_api.v1 import asr_pb2
from asr_bridge.deepgram import (
    AudioFramer,
    CloseStream,
    Configure,
    DeepgramMessages,
    Finalize,
    KeepAlive,
    ListenOptions,
    ListenQueryError,
    SchemaError,
    handshake_refusal,
    parse_listen_query,
    parse_text,
    streaming_config,
)
from asr_server.audio.g711 import mulaw_decode, mulaw_encode

BASE = [("encoding", "linear16"), ("sample_rate", "16000")]


def query(**params: str) -> ListenOptions:
    return parse_listen_query(BASE + list(params.items()))


def test_defaults_follow_deepgram() -> None:
    options = query()
    assert options == ListenOptions()  # no interim results, no vad events, English
    config = streaming_config(options)
    assert config.format.encoding == asr_pb2.AudioFormat.LINEAR16
    assert config.format.sample_rate_hz == 16_000 and config.format.channels == 1
    assert config.language == "en" and not config.interim_results
    assert config.endpointing.silence_ms == 0  # the server's default
    assert config.word_timestamps  # Deepgram's finals always carry words


def test_every_supported_parameter_maps() -> None:
    options = parse_listen_query(
        [
            ("encoding", "mulaw"),
            ("sample_rate", "8000"),
            ("channels", "2"),
            ("multichannel", "true"),
            ("interim_results", "True"),  # Python SDK users pass True: "True" on the wire
            ("endpointing", "300"),
            ("utterance_end_ms", "1000"),
            ("vad_events", "true"),
            ("smart_format", "true"),
            ("language", "en-US"),
            ("keywords", "streamasr:2"),
            ("keywords", "Kubernetes"),
            ("keyterm", "gRPC stream"),
            ("model", "nova-3"),
            # bookkeeping, repeated as Deepgram documents and its SDK sends lists
            ("tag", "billing"),
            ("tag", "agent-7"),
            ("extra", "customer:acme"),
            ("extra", "call:42"),
            ("diarize", "false"),  # an unsupported feature turned off is harmless
            ("profanity_filter", "false"),  # (pipecat's DeepgramSTTService sends it)
            ("no_delay", "true"),  # no formatting delay to skip here
        ]
    )
    config = streaming_config(options)
    assert config.format.encoding == asr_pb2.AudioFormat.MULAW
    assert config.format.channels == 2 and config.interim_results
    assert config.endpointing.silence_ms == 300
    assert config.language == "en"
    assert list(config.hotwords) == ["streamasr", "Kubernetes", "gRPC stream"]
    assert options.punctuate and options.vad_events and options.utterance_end_ms == 1000


@pytest.mark.parametrize(
    ("value", "silence_ms"), [("10", 100), ("false", 10_000), ("true", 0), ("99999", 10_000)]
)
def test_endpointing_is_clamped_to_what_the_server_takes(value: str, silence_ms: int) -> None:
    assert streaming_config(query(endpointing=value)).endpointing.silence_ms == silence_ms


def test_language_multi_means_detect() -> None:
    assert streaming_config(query(language="multi")).language == ""


@pytest.mark.parametrize(
    ("params", "phrase"),
    [
        ([("encoding", "speex"), ("sample_rate", "16000")], "encoding 'speex' is not supported"),
        ([("sample_rate", "4000")], "sample_rate must be an integer"),  # (with a container too)
        ([("encoding", "linear16")], "sample_rate is required"),
        (BASE + [("channels", "9")], "channels must be an integer from 1 to 8"),
        (BASE + [("sample_rate", "8000")], "sample_rate is given twice"),
        (BASE + [("vad_events", "1")], "vad_events must be true or false"),
        (BASE + [("endpointing", "-5")], "endpointing must be milliseconds or false"),
        (BASE + [("utterance_end_ms", "0")], "utterance_end_ms must be an integer"),
        (BASE + [("language", "en US; drop")], "language must be a BCP-47 tag"),
        (BASE + [("redact", "pci")], "redact is not supported"),
        (BASE + [("profanity_filter", "true")], "profanity_filter is not supported"),
        (BASE + [("no_delay", "soon")], "no_delay must be true or false"),
        (BASE + [("x" * 100, "1")], "unknown query parameter 'xxxx"),
    ],
)
def test_refused_queries_say_why(params: list[tuple[str, str]], phrase: str) -> None:
    with pytest.raises(ListenQueryError, match=phrase.replace("(", r"\(")):
        parse_listen_query(params)


def test_handshake_refusals_have_deepgrams_shape() -> None:
    refusal = handshake_refusal("INVALID_ARGUMENT", "encoding 'flac' is not supported", "r-1")
    assert refusal.status == 400
    assert refusal.body == {
        "err_code": "Bad Request",
        "err_msg": "encoding 'flac' is not supported",
        "request_id": "r-1",
    }
    assert refusal.headers == {"dg-request-id": "r-1", "dg-error": refusal.body["err_msg"]}
    assert handshake_refusal("UNAUTHENTICATED", "missing or wrong token").status == 401
    assert handshake_refusal("RESOURCE_EXHAUSTED", "at the limit").status == 429


def test_text_messages() -> None:
    assert parse_text('{"type": "KeepAlive"}') == KeepAlive()
    assert parse_text('{"type": "Finalize"}') == Finalize()
    assert parse_text('{"type": "CloseStream"}') == CloseStream()
    assert parse_text('{"type": "Configure", "keyterms": []}') == Configure()
    for bad in ("{", "[]", '{"type": 3}', '{"type": "closestream"}'):
        with pytest.raises(SchemaError):
            parse_text(bad)


def test_framer_holds_back_a_cut_frame() -> None:
    framer = AudioFramer(query(channels="2", multichannel="true"))
    assert framer.feed(b"\x01\x02\x03") == b""
    assert framer.feed(b"\x04\x05") == b"\x01\x02\x03\x04"
    assert framer.feed(b"\x06\x07\x08") == b"\x05\x06\x07\x08"


def test_framer_mixes_channels_down_when_not_multichannel() -> None:
    stereo = np.array([[1000, 3000], [-2000, 0]], dtype="<i2")
    framer = AudioFramer(query(channels="2"))
    assert np.frombuffer(framer.feed(stereo.tobytes()), "<i2").tolist() == [2000, -1000]
    assert streaming_config(framer.options).format.channels == 1
    # G.711 is decoded to linear16 to be mixed, and the server is told so
    options = parse_listen_query([("encoding", "alaw"), ("sample_rate", "8000"), ("channels", "2")])
    assert streaming_config(options).format.encoding == asr_pb2.AudioFormat.LINEAR16
    mu = AudioFramer(
        parse_listen_query([("encoding", "mulaw"), ("sample_rate", "8000"), ("channels", "2")])
    )
    pair = mulaw_encode(np.array([8000, 8000], dtype=np.int16))
    mixed = np.frombuffer(mu.feed(pair), "<i2")
    assert mixed.tolist() == [int(mulaw_decode(pair)[0])]


def test_linear32_is_float_pcm_sent_as_is_or_mixed_to_linear16() -> None:
    """Deepgram's linear32 (32-bit float PCM, what Web Audio hands out) is the server's
    FLOAT32; mixed down, it becomes 16-bit PCM like the other encodings."""
    mono = parse_listen_query([("encoding", "linear32"), ("sample_rate", "48000")])
    assert streaming_config(mono).format.encoding == asr_pb2.AudioFormat.FLOAT32
    floats = np.array([0.5, -0.25, 0.1], dtype="<f4").tobytes()
    framer = AudioFramer(mono)
    assert framer.feed(floats[:5]) == floats[:4]  # whole samples only
    assert framer.feed(floats[5:]) == floats[4:]
    stereo = parse_listen_query(
        [("encoding", "linear32"), ("sample_rate", "48000"), ("channels", "2")]
    )
    assert streaming_config(stereo).format.encoding == asr_pb2.AudioFormat.LINEAR16
    pair = np.array([[0.5, 0.25], [2.0, 1.0]], dtype="<f4")  # the second frame clips to 1
    mixed = np.frombuffer(AudioFramer(stereo).feed(pair.tobytes()), "<i2")
    assert mixed.tolist() == [round(0.375 * 32767), 32767]
    with pytest.raises(ValueError, match="NaN"):
        AudioFramer(stereo).feed(np.array([np.nan, 0.0], dtype="<f4").tobytes())


def speech(kind: int, channel: int = 0, utterance: int = 0, offset: float = 0.5):  # type: ignore[no-untyped-def]
    event = asr_pb2.SpeechEvent(type=kind, offset_s=offset, channel=channel, utterance_id=utterance)  # type: ignore[arg-type]
    return asr_pb2.StreamingRecognizeResponse(speech_event=event)


def result(
    is_final: bool,
    text: str,
    words=(),
    channel: int = 0,
    utterance: int = 0,
    from_finalize: bool = False,
    confidence: float = 0.0,
):  # type: ignore[no-untyped-def]
    r = asr_pb2.Result(
        is_final=is_final,
        from_finalize=from_finalize,
        confidence=confidence,
        text=text,
        start_s=1.0,
        end_s=2.5,
        utterance_id=utterance,
        channel=channel,
        words=[asr_pb2.Word(word=w, start_s=s, end_s=e, probability=p) for w, s, e, p in words],
    )
    return asr_pb2.StreamingRecognizeResponse(result=r)


WORDS = [(" Hello,", 1.0, 1.4, 0.5), (" world.", 1.5, 2.0, 1.0)]


def test_a_final_after_speech_ended_is_speech_final_with_words() -> None:
    messages = DeepgramMessages(query(utterance_end_ms="1000"), request_id="r-1")
    assert messages.response(speech(asr_pb2.SpeechEvent.SPEECH_STARTED)) == []  # no vad_events
    assert messages.response(speech(asr_pb2.SpeechEvent.SPEECH_ENDED)) == []
    final, end = messages.response(result(True, " Hello, world.", WORDS))
    assert final == {
        "type": "Results",
        "channel_index": [0, 1],
        "duration": 1.5,
        "start": 1.0,
        "is_final": True,
        "speech_final": True,
        "channel": {
            "alternatives": [
                {
                    "transcript": "hello world",  # punctuate not asked for
                    "confidence": 0.75,
                    "words": [
                        {
                            "word": "hello",
                            "start": 1.0,
                            "end": 1.4,
                            "confidence": 0.5,
                            "punctuated_word": "Hello,",
                        },
                        {
                            "word": "world",
                            "start": 1.5,
                            "end": 2.0,
                            "confidence": 1.0,
                            "punctuated_word": "world.",
                        },
                    ],
                }
            ]
        },
        "metadata": final["metadata"],
        "from_finalize": False,
    }
    assert final["metadata"]["request_id"] == "r-1"
    assert end == {"type": "UtteranceEnd", "channel": [0, 1], "last_word_end": 2.0}


def test_a_finals_confidence_is_the_servers_where_it_sends_one() -> None:
    """The transcript's confidence is the server's (its tokens' geometric mean
    probability), with words or without; a server that predates it: the words' mean."""
    messages = DeepgramMessages(query())
    for words in ((), WORDS):
        (final,) = messages.response(result(True, " Hello, world.", words, confidence=0.83))
        assert final["channel"]["alternatives"][0]["confidence"] == pytest.approx(0.83)
    (older,) = messages.response(result(True, " Hello, world."))
    assert older["channel"]["alternatives"][0]["confidence"] == 0.0  # nothing to go on


def test_split_utterances_and_partials_are_not_speech_final() -> None:
    messages = DeepgramMessages(query(punctuate="true", utterance_end_ms="1000"))
    (partial,) = messages.response(result(False, " Hello,"))
    assert not partial["is_final"] and not partial["speech_final"]
    assert partial["channel"]["alternatives"][0]["transcript"] == "Hello,"
    (final,) = messages.response(result(True, " Hello, world.", WORDS))  # a split: no ended
    assert final["is_final"] and not final["speech_final"]


def test_vad_events_and_channels() -> None:
    messages = DeepgramMessages(query(channels="2", multichannel="true", vad_events="true"))
    (started,) = messages.response(speech(asr_pb2.SpeechEvent.SPEECH_STARTED, channel=1))
    assert started == {"type": "SpeechStarted", "channel": [1, 2], "timestamp": 0.5}
    (r,) = messages.response(result(True, " Hi.", channel=1))
    assert r["channel_index"] == [1, 2]
    # only a start of speech is a SpeechStarted
    assert messages.response(speech(asr_pb2.SpeechEvent.SPEECH_RESUMED, channel=1)) == []
    (empty,) = messages.response(speech(asr_pb2.SpeechEvent.NO_WORDS, channel=1))
    assert empty["type"] == "Results"


def test_a_repeated_speech_started_is_not_passed_on() -> None:
    """A resumed gRPC call sends the replayed audio's SPEECH_STARTED again: the client
    was told already (the speech is open, or began no later than the one it was told)."""
    messages = DeepgramMessages(query(vad_events="true"))
    started = asr_pb2.SpeechEvent.SPEECH_STARTED
    (first,) = messages.response(speech(started, offset=0.48))
    assert first["timestamp"] == 0.48
    assert messages.response(speech(started, offset=0.48)) == []  # the resume's repeat
    assert messages.response(speech(started, offset=0.6)) == []  # still open
    messages.response(speech(asr_pb2.SpeechEvent.SPEECH_ENDED, offset=1.5))
    for replayed in (0.48, 0.5):  # after its end (the voice detector may place it anew)
        assert messages.response(speech(started, offset=replayed)) == []
    (second,) = messages.response(speech(started, utterance=1, offset=3.0))
    assert second["timestamp"] == 3.0
    (other,) = messages.response(speech(started, channel=1, offset=0.48))  # per channel
    assert other["channel"] == [1, 1]


def test_speech_started_where_a_finalize_cut_the_speech_is_passed_on() -> None:
    """A Finalize mid-speech ends the utterance at the cut and the next one starts at the
    same offset: a new start, not a replay (a reviewer's push-to-talk presses: the second
    press had no SpeechStarted, and a client's barge-in logic thought the user silent)."""
    messages = DeepgramMessages(query(vad_events="true"))
    started = asr_pb2.SpeechEvent.SPEECH_STARTED
    messages.response(speech(started, offset=0.42))
    messages.response(speech(asr_pb2.SpeechEvent.SPEECH_ENDED, offset=1.7))
    (second,) = messages.response(speech(started, utterance=1, offset=1.7))
    assert second["timestamp"] == 1.7
    assert messages.response(speech(started, utterance=1, offset=1.7)) == []  # a resume's repeat


def test_an_utterance_without_words_ends_with_an_empty_final() -> None:
    """The server's NO_WORDS (its final heard no words, where an interim read some):
    Deepgram supersedes every interim with a final, and a detected end of speech is
    ``speech_final``, so an empty final says both."""
    messages = DeepgramMessages(query(interim_results="true", utterance_end_ms="1000"))
    messages.response(speech(asr_pb2.SpeechEvent.SPEECH_STARTED, offset=0.5))
    (interim,) = messages.response(result(False, " Hm"))
    messages.response(speech(asr_pb2.SpeechEvent.SPEECH_ENDED, offset=1.6))
    (empty,) = messages.response(speech(asr_pb2.SpeechEvent.NO_WORDS, offset=1.8))
    assert empty["is_final"] and empty["speech_final"] and not empty["from_finalize"]
    assert empty["channel"]["alternatives"][0] == {"transcript": "", "confidence": 0.0, "words": []}
    assert empty["start"] == interim["start"] == 1.0 and empty["duration"] == 0.8
    # nothing was said: no UtteranceEnd; the next utterance is no longer speech_final
    (later,) = messages.response(result(True, " Two.", WORDS, utterance=1))
    assert not later["speech_final"]


def test_a_split_speech_whose_last_part_has_no_words_ends_with_utterance_end() -> None:
    """A long utterance split at a pause (a final that is not speech_final), whose rest
    held no words: the end of that speech is an empty ``speech_final`` final, then the
    UtteranceEnd the first part's words are owed."""
    messages = DeepgramMessages(query(utterance_end_ms="1000"))
    (part,) = messages.response(result(True, " Hello, world.", WORDS))  # a split: no ended
    assert not part["speech_final"]
    messages.response(speech(asr_pb2.SpeechEvent.SPEECH_ENDED, utterance=1, offset=3.0))
    empty, end = messages.response(speech(asr_pb2.SpeechEvent.NO_WORDS, utterance=1, offset=3.2))
    assert empty["is_final"] and empty["speech_final"]
    assert empty["start"] == 3.2 and empty["duration"] == 0.0  # (no interim said where)
    assert end == {"type": "UtteranceEnd", "channel": [0, 1], "last_word_end": 2.0}
    # owed once: a later noise on its own ends without one
    messages.response(speech(asr_pb2.SpeechEvent.SPEECH_ENDED, utterance=2, offset=5.0))
    (noise,) = messages.response(speech(asr_pb2.SpeechEvent.NO_WORDS, utterance=2, offset=5.2))
    assert noise["speech_final"]


def test_a_finalize_that_ended_a_noise_is_answered_once() -> None:
    """A Finalize ended an utterance without words: its empty final is the answer
    (``from_finalize``, ``speech_final``), and the acknowledgement adds none."""
    messages = DeepgramMessages(query())
    ended = asr_pb2.SpeechEvent(
        type=asr_pb2.SpeechEvent.SPEECH_ENDED, offset_s=1.5, from_finalize=True
    )
    messages.response(asr_pb2.StreamingRecognizeResponse(speech_event=ended))
    (empty,) = messages.response(speech(asr_pb2.SpeechEvent.NO_WORDS, offset=1.5))
    assert empty["is_final"] and empty["from_finalize"] and empty["speech_final"]
    assert messages.response(speech(FINALIZED, offset=1.5)) == []
    (again,) = messages.response(speech(FINALIZED, offset=2.0))  # a second Finalize
    assert again["from_finalize"] and not again["speech_final"]


FINALIZED = asr_pb2.SpeechEvent.FINALIZED


def test_the_final_a_finalize_ended_answers_it() -> None:
    """The server marks the final its FINALIZE ended and then acknowledges the FINALIZE:
    the final is ``from_finalize``, and the acknowledgement adds nothing."""
    messages = DeepgramMessages(query())
    messages.response(speech(asr_pb2.SpeechEvent.SPEECH_STARTED, offset=1.0))
    (answer,) = messages.response(result(True, " One.", WORDS, from_finalize=True))
    assert answer["from_finalize"] and answer["is_final"]
    assert messages.response(speech(FINALIZED, offset=2.6)) == []
    (later,) = messages.response(result(True, " Two.", WORDS, utterance=1))
    assert not later["from_finalize"]


def test_a_finalize_no_final_answered_gets_an_empty_final() -> None:
    """pipecat sends Finalize at every stop of its VAD: after the server's endpointing
    already sent the final, in a noise that held no words, or in silence. Deepgram then
    answers with an empty ``from_finalize`` final (pipecat stops waiting for it), once
    per Finalize."""
    messages = DeepgramMessages(query(utterance_end_ms="1000"))
    messages.response(speech(asr_pb2.SpeechEvent.SPEECH_STARTED, offset=1.0))
    messages.response(speech(asr_pb2.SpeechEvent.SPEECH_ENDED, offset=1.6))
    (final, _) = messages.response(result(True, " Done.", WORDS))
    assert final["speech_final"] and not final["from_finalize"]
    for _ in range(2):  # two Finalize requests, each acknowledged
        (empty,) = messages.response(speech(FINALIZED, offset=2.0))
        assert empty["type"] == "Results" and empty["is_final"] and empty["from_finalize"]
        assert empty["channel"]["alternatives"][0]["transcript"] == ""
        assert empty["start"] == 2.0 and empty["duration"] == 0.0
        assert not empty["speech_final"]  # no UtteranceEnd either: nothing was said


def test_a_finalize_is_answered_per_channel() -> None:
    messages = DeepgramMessages(query(channels="2", multichannel="true"))
    (answer,) = messages.response(result(True, " Agent.", WORDS, channel=1, from_finalize=True))
    assert answer["from_finalize"] and answer["channel_index"] == [1, 2]
    (empty,) = messages.response(speech(FINALIZED, channel=0))
    assert empty["from_finalize"] and empty["channel_index"] == [0, 2]
    assert messages.response(speech(FINALIZED, channel=1)) == []


def test_finalize_may_name_a_channel() -> None:
    assert parse_text('{"type": "Finalize", "channel": 1}') == Finalize(channel=1)
    assert parse_text('{"type": "Finalize", "channel": null}') == Finalize()
    for bad in ('"1"', "-1", "true", "1.5"):
        with pytest.raises(SchemaError, match="channel must be a channel index"):
            parse_text(f'{{"type": "Finalize", "channel": {bad}}}')


def test_metadata_summarises_the_stream() -> None:
    messages = DeepgramMessages(query(), request_id="r-1", created="2025-01-01T00:00:00.000+00:00")
    metadata = messages.metadata(duration_s=1.5, sha256="ab")
    assert metadata["type"] == "Metadata" and metadata["transaction_key"] == "deprecated"
    assert metadata["duration"] == 1.5 and metadata["channels"] == 1
    assert metadata["created"] == "2025-01-01T00:00:00.000Z"
    assert metadata["request_id"] == "r-1" and metadata["sha256"] == "ab"


@pytest.mark.parametrize(
    "params",
    [
        [],  # Deepgram's browser examples: MediaRecorder's WebM, no query at all
        [("sample_rate", "48000"), ("channels", "2")],  # a container's own are used
        [("encoding", "opus")],  # Deepgram's names for Opus in Ogg, and FLAC
        [("encoding", "ogg-opus")],
        [("encoding", "flac"), ("sample_rate", "44100")],
    ],
)
def test_audio_without_a_raw_encoding_is_a_container_the_bridge_decodes(
    params: list[tuple[str, str]],
) -> None:
    options = parse_listen_query([*params, ("interim_results", "true")])
    assert options.containerized and options.interim_results
    with pytest.raises(ValueError, match="decoded"):
        streaming_config(options)  # the stream waits for the container's rate and channels
    decoded = options.decoded(sample_rate=48_000, channels=2)
    config = streaming_config(decoded)
    assert config.format.encoding == asr_pb2.AudioFormat.LINEAR16
    assert config.format.sample_rate_hz == 48_000
    assert config.format.channels == 1  # mixed down, as without multichannel on raw audio
    assert config.interim_results
    multichannel = parse_listen_query([("multichannel", "true")]).decoded(48_000, 2)
    assert streaming_config(multichannel).format.channels == 2


def test_pipecat_deepgram_service_default_query_is_accepted() -> None:
    """pipecat-ai 1.14's DeepgramSTTService sends every setting it has a value for (read
    from its source; pipecat cannot be installed beside grpcio here, docs/compat.md)."""
    options = parse_listen_query(
        [
            ("detect_entities", "false"),
            ("diarize", "false"),
            ("dictation", "false"),
            ("interim_results", "true"),
            ("numerals", "false"),
            ("punctuate", "true"),
            ("smart_format", "false"),
            ("model", "nova-3-general"),
            ("language", "en"),
            ("encoding", "linear16"),
            ("channels", "1"),
            ("multichannel", "false"),
            ("sample_rate", "16000"),
        ]
    )
    assert options.interim_results and options.punctuate and options.language == "en"
    assert options.sample_rate == 16_000 and options.channels == 1


def test_livekit_deepgram_plugin_default_query_is_accepted() -> None:
    """livekit-plugins-deepgram's STT() builds this query with its defaults (the compat
    reviewer's, from its source): filler_words=true was refused with a 400, so the
    plugin could not connect at all."""
    query = (
        "model=nova-3&punctuate=true&smart_format=true&no_delay=true&interim_results=true"
        "&encoding=linear16&vad_events=true&sample_rate=16000&channels=1&endpointing=25"
        "&filler_words=true&profanity_filter=false&numerals=false&mip_opt_out=false"
        "&language=en-US"
    )
    options = parse_listen_query(parse_qsl(query))
    assert options.interim_results and options.vad_events and options.punctuate
    assert options.sample_rate == 16_000 and options.language == "en"
    with pytest.raises(ListenQueryError, match="filler_words must be true or false"):
        parse_listen_query([*BASE, ("filler_words", "yes please")])


@pytest.mark.parametrize(
    ("params", "second_in"),
    [
        ({"encoding": "linear16", "sample_rate": "16000"}, 32_000),
        ({"encoding": "mulaw", "sample_rate": "8000", "channels": "2"}, 16_000),
        (
            {"encoding": "mulaw", "sample_rate": "8000", "channels": "2", "multichannel": "true"},
            16_000,
        ),
        ({"encoding": "linear32", "sample_rate": "48000", "channels": "2"}, 384_000),
    ],
)
def test_framer_knows_how_long_its_output_lasts(params: dict[str, str], second_in: int) -> None:
    """What the upstream's pace is measured against (asr_bridge.session.UpstreamPace): one
    second in, whatever the framer turns it into (mixed down or not), is one second out."""
    options = parse_listen_query(list(params.items()))
    framer = AudioFramer(options)
    assert framer.seconds(framer.feed(bytes(second_in))) == pytest.approx(1.0)
