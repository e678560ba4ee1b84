"""The pure Deepgram Flux mapping: query → config, text → commands, responses → turns."""

from __future__ import annotations

from typing import Any

import pytest

from asr_api.v1 import asr_pb2
from asr_bridge.deepgram import ListenQueryError, SchemaError
from asr_bridge.flux import (
    CloseStream,
    Configure,
    ConfigureError,
    FluxOptions,
    FluxTurns,
    ForceEndTurn,
    parse_flux_query,
    parse_text,
    streaming_config,
)

BASE = [("model", "flux-general-en"), ("encoding", "linear16"), ("sample_rate", "16000")]
Response = asr_pb2.StreamingRecognizeResponse
SpeechEvent = asr_pb2.SpeechEvent


def query(*params: tuple[str, str]) -> FluxOptions:
    return parse_flux_query(BASE + list(params))


def test_defaults_are_semantic_turns_with_partials() -> None:
    options = query()
    assert options == FluxOptions()
    config = streaming_config(options)
    assert config.endpointing.mode == asr_pb2.EndpointingConfig.SEMANTIC
    assert config.endpointing.turn_threshold == pytest.approx(0.7)  # Flux's default
    assert config.endpointing.max_silence_ms == 0  # the server's longest pause
    assert not config.endpointing.eager_finals
    assert config.interim_results and config.word_timestamps
    assert config.language == "en" and config.format.channels == 1


def test_every_supported_parameter_maps() -> None:
    options = parse_flux_query(
        [
            ("model", "flux-general-multi"),
            ("encoding", "mulaw"),
            ("sample_rate", "8000"),
            ("eot_threshold", "0.8"),
            ("eager_eot_threshold", "0.4"),
            ("eot_timeout_ms", "3000"),
            ("keyterm", "streamasr"),
            ("keyterm", "gRPC stream"),
            ("language_hint", "de"),
            ("language_hint", "en-US"),
            ("mip_opt_out", "true"),
            ("tag", "agent-7"),
            ("tag", "prod"),  # repeated, as the SDK sends a list
            ("extra", "customer:acme"),
            ("extra", "call:42"),
            ("numerals", "false"),
        ]
    )
    config = streaming_config(options)
    assert config.format.encoding == asr_pb2.AudioFormat.MULAW
    assert config.format.sample_rate_hz == 8000
    e = config.endpointing
    assert e.mode == asr_pb2.EndpointingConfig.SEMANTIC
    assert e.turn_threshold == pytest.approx(0.8)
    assert e.eager_finals and e.eager_threshold == pytest.approx(0.4)
    assert e.max_silence_ms == 3000
    assert list(config.hotwords) == ["streamasr", "gRPC stream"]
    assert config.language == "" and list(config.languages) == ["de", "en"]  # detect among


def test_eot_threshold_one_leaves_turns_to_the_client() -> None:
    # Flux's "bring your own turn detection": only ForceEndTurn (or the timeout) ends one;
    # the server's turn threshold 1 (the model is not asked; see test_session.py)
    config = streaming_config(query(("eot_threshold", "1.0"), ("eot_timeout_ms", "60000")))
    assert config.endpointing.mode == asr_pb2.EndpointingConfig.SEMANTIC
    assert config.endpointing.turn_threshold == 1.0
    assert config.endpointing.max_silence_ms == 10_000  # the server's longest, for Flux's 60 s


def test_an_eager_threshold_with_eot_threshold_one_gets_a_warning() -> None:
    # the turn model is not asked, and an eager end needs its answer: none would come
    turns = FluxTurns(query(("eot_threshold", "1"), ("eager_eot_threshold", "0.5")))
    connected, warning = turns.connected()
    assert connected["type"] == "Connected"
    assert warning["type"] == "Warning" and warning["code"] == "EAGER_EOT_THRESHOLD_IGNORED"
    assert "no effect" in warning["description"]
    # a Configure that lowers eot_threshold ends it; one that raises it to 1 begins it
    turns.configure(Configure(eot_threshold=0.9))
    assert turns.eager_ignored() == []
    turns.configure(Configure(eot_threshold=1))
    assert [w["code"] for w in turns.eager_ignored()] == ["EAGER_EOT_THRESHOLD_IGNORED"]
    for options in (query(("eot_threshold", "1")), query(("eager_eot_threshold", "0.5"))):
        assert [m["type"] for m in FluxTurns(options).connected()] == ["Connected"]


@pytest.mark.parametrize(
    ("params", "phrase"),
    [
        ([("encoding", "linear16"), ("sample_rate", "16000")], "model is required"),
        ([("model", "nova-3"), *BASE[1:]], "'nova-3' is not a Flux model"),
        ([BASE[0], ("sample_rate", "4000")], "sample_rate must be an integer"),
        ([BASE[0], ("encoding", "opus"), BASE[2]], "encoding 'opus' is not supported"),
        ([*BASE[:2]], "sample_rate is required"),
        ([*BASE, ("eot_threshold", "0.3")], "eot_threshold must be a number from 0.5"),
        ([*BASE, ("eot_threshold", "nan")], "eot_threshold must be a number"),
        ([*BASE, ("eager_eot_threshold", "0.95")], "eager_eot_threshold must be a number"),
        (
            [*BASE, ("eot_threshold", "0.6"), ("eager_eot_threshold", "0.8")],
            "must not be above eot_threshold",
        ),
        ([*BASE, ("eot_timeout_ms", "100")], "eot_timeout_ms must be an integer from 500"),
        ([*BASE, ("language_hint", "de")], "only for flux-general-multi"),
        ([*BASE, ("redact", "pci")], "redact is not supported"),
        ([*BASE, ("channels", "2")], "unknown query parameter 'channels'"),
    ],
)
def test_refusals_say_what_is_wrong(params: list[tuple[str, str]], phrase: str) -> None:
    with pytest.raises(ListenQueryError, match=phrase):
        parse_flux_query(params)


def test_text_messages() -> None:
    assert parse_text('{"type": "CloseStream"}') == CloseStream()
    assert parse_text('{"type": "ForceEndTurn"}') == ForceEndTurn()
    assert parse_text('{"type": "Configure", "thresholds": {"eot_threshold": 0.8}}') == Configure(
        eot_threshold=0.8
    )
    with pytest.raises(SchemaError, match="unknown message type 'Finalize'"):
        parse_text('{"type": "Finalize"}')  # v1's; Flux has ForceEndTurn
    with pytest.raises(SchemaError, match="must be JSON"):
        parse_text("{")


# -- turns -------------------------------------------------------------------------------


def speech(kind: int, utterance: int) -> Response:
    return Response(speech_event=SpeechEvent(type=kind, utterance_id=utterance))  # type: ignore[arg-type]


def partial(text: str, utterance: int = 0, *, eager: bool = False, p: float = 0.0) -> Response:
    return Response(
        result=asr_pb2.Result(
            text=text,
            start_s=1.0,
            end_s=2.0,
            utterance_id=utterance,
            eager=eager,
            turn_probability=p,
        )
    )


def final(text: str, utterance: int = 0) -> Response:
    words = [
        asr_pb2.Word(word=f" {w}", start_s=1.0 + i / 4, end_s=1.2 + i / 4, probability=0.9)
        for i, w in enumerate(text.split())
    ]
    return Response(
        result=asr_pb2.Result(
            is_final=True, text=text, start_s=1.0, end_s=2.5, utterance_id=utterance, words=words
        )
    )


def end_of_turn(utterance: int, probability: float, reason: int) -> Response:
    return Response(
        end_of_turn=asr_pb2.EndOfTurn(
            utterance_id=utterance,
            probability=probability,
            reason=reason,  # type: ignore[arg-type]
        )
    )


def feed(turns: FluxTurns, *responses: Response) -> list[dict[str, Any]]:
    return [m for r in responses for m in turns.response(r)]


def events(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["event"], m["transcript"]) for m in messages]


def test_a_turn_from_its_first_words_to_its_end() -> None:
    turns = FluxTurns(FluxOptions())
    out = feed(
        turns,
        speech(SpeechEvent.SPEECH_STARTED, 0),
        partial(""),  # nothing heard yet: no turn
        partial("Hello"),
        partial("Hello there"),
        speech(SpeechEvent.SPEECH_ENDED, 0),
        end_of_turn(0, 0.99, asr_pb2.EndOfTurn.MODEL),
        final("Hello there."),
    )
    assert events(out) == [
        ("StartOfTurn", "Hello"),
        ("Update", "Hello there"),
        ("EndOfTurn", "Hello there."),
    ]
    end = out[-1]
    assert end["trigger"] == "model" and end["end_of_turn_confidence"] == pytest.approx(0.99)
    assert end["turn_index"] == 0
    assert [w["word"] for w in end["words"]] == ["Hello", "there."]
    assert end["words"][0] == {"word": "Hello", "confidence": 0.9, "start": 1.0, "end": 1.2}
    assert end["audio_window_start"] == 1.0 and end["audio_window_end"] == 2.5
    assert "trigger" not in out[0]
    # the next turn counts on
    nxt = feed(turns, speech(SpeechEvent.SPEECH_STARTED, 1), partial("Bye", 1))
    assert events(nxt) == [("StartOfTurn", "Bye")] and nxt[0]["turn_index"] == 1
    # every message is numbered when it is sent
    assert [m["sequence_id"] for m in turns.stamp(turns.connected() + out)] == [0, 1, 2, 3]


def test_an_eager_end_withdrawn_then_confirmed() -> None:
    turns = FluxTurns(FluxOptions(eager_eot_threshold=0.5))
    out = feed(
        turns,
        partial("I want"),
        partial("I want to", eager=True, p=0.6),
        speech(SpeechEvent.SPEECH_RESUMED, 0),
        partial("I want to fly"),
        partial("I want to fly home.", eager=True, p=0.8),
        speech(SpeechEvent.SPEECH_ENDED, 0),
        end_of_turn(0, 0.85, asr_pb2.EndOfTurn.MODEL),
        final("I want to fly home."),
    )
    assert events(out) == [
        ("StartOfTurn", "I want"),
        ("EagerEndOfTurn", "I want to"),
        ("TurnResumed", "I want to"),
        ("Update", "I want to fly"),
        ("EagerEndOfTurn", "I want to fly home."),
        ("EndOfTurn", "I want to fly home."),  # the eager transcript, as Flux promises
    ]
    assert out[1]["end_of_turn_confidence"] == pytest.approx(0.6)
    assert out[4]["end_of_turn_confidence"] == pytest.approx(0.8)


def test_a_final_that_differs_from_the_eager_text_is_resumed_first() -> None:
    turns = FluxTurns(FluxOptions(eager_eot_threshold=0.5))
    out = feed(
        turns,
        partial("Call me", eager=True, p=0.7),
        speech(SpeechEvent.SPEECH_ENDED, 0),
        end_of_turn(0, 0.7, asr_pb2.EndOfTurn.FINALIZE),
        final("Call me, Ishmael."),
    )
    assert events(out) == [
        ("StartOfTurn", "Call me"),
        ("EagerEndOfTurn", "Call me"),
        ("TurnResumed", "Call me, Ishmael."),
        ("EndOfTurn", "Call me, Ishmael."),
    ]
    assert out[-1]["trigger"] == "manual"


def test_a_turn_the_server_split_is_one_turn() -> None:
    turns = FluxTurns(FluxOptions())
    out = feed(
        turns,
        partial("The first part"),
        final("The first part,"),  # split: no SPEECH_ENDED
        partial("and the", 1),
        speech(SpeechEvent.SPEECH_ENDED, 1),
        end_of_turn(1, 0.2, asr_pb2.EndOfTurn.MAX_SILENCE),
        final("and the second.", 1),
    )
    assert events(out) == [
        ("StartOfTurn", "The first part"),
        ("Update", "The first part,"),
        ("Update", "The first part, and the"),
        ("EndOfTurn", "The first part, and the second."),
    ]
    assert out[-1]["trigger"] == "timeout"
    assert len(out[-1]["words"]) == 6


def test_an_utterance_without_words_ends_its_turn_with_the_next_speech() -> None:
    # a noise whose partial read words, and whose final the server dropped (no speech)
    turns = FluxTurns(FluxOptions())
    out = feed(
        turns,
        speech(SpeechEvent.SPEECH_STARTED, 0),
        partial("Thank you."),
        speech(SpeechEvent.SPEECH_ENDED, 0),
        end_of_turn(0, 0.9, asr_pb2.EndOfTurn.MODEL),
        speech(SpeechEvent.SPEECH_STARTED, 1),
        partial("Yes", 1),
    )
    assert events(out) == [("StartOfTurn", "Thank you."), ("EndOfTurn", ""), ("StartOfTurn", "Yes")]
    assert [m["turn_index"] for m in out] == [0, 0, 1]


def test_no_words_ends_the_turn_that_was_waiting_for_its_final() -> None:
    turns = FluxTurns(FluxOptions())
    out = feed(
        turns,
        partial("The first part"),
        final("The first part,"),  # a split: the turn goes on
        partial("Thank you.", 1),  # a noise's partial read words
        speech(SpeechEvent.SPEECH_ENDED, 1),
        end_of_turn(1, 0.9, asr_pb2.EndOfTurn.MODEL),
        speech(SpeechEvent.NO_WORDS, 1),  # its final had none
    )
    assert events(out)[-1] == ("EndOfTurn", "The first part,")
    assert out[-1]["trigger"] == "model" and turns.turn_index == 1
    # a split part without words leaves the turn as it is
    more = feed(turns, partial("Next", 2), speech(SpeechEvent.NO_WORDS, 2), partial("Next one", 3))
    assert events(more) == [("StartOfTurn", "Next"), ("Update", "Next one")]


def test_force_end_turn_in_manual_mode() -> None:
    """The speech end a ForceEndTurn's FINALIZE made is marked so (``from_finalize``):
    its turn ends "manual"; one the server's silence made, "timeout"."""
    options = parse_flux_query([*BASE, ("eot_threshold", "1")])
    turns = FluxTurns(options)
    timed_out = feed(
        turns,
        speech(SpeechEvent.SPEECH_STARTED, 0),
        partial("one"),
        speech(SpeechEvent.SPEECH_ENDED, 0),  # silence mode: no EndOfTurn from the server
        final("One."),
    )
    assert timed_out[-1]["event"] == "EndOfTurn" and timed_out[-1]["trigger"] == "timeout"
    out = feed(turns, speech(SpeechEvent.SPEECH_STARTED, 1), partial("two", 1))
    forced = speech(SpeechEvent.SPEECH_ENDED, 1)
    forced.speech_event.from_finalize = True
    out += feed(turns, forced, final("Two.", 1))
    # the server's acknowledgement of the finalize (naming the latest utterance, or a
    # later one) neither ends nor opens a turn
    out += feed(turns, speech(SpeechEvent.FINALIZED, 1), speech(SpeechEvent.FINALIZED, 5))
    assert events(out) == [("StartOfTurn", "two"), ("EndOfTurn", "Two.")]
    assert out[-1]["trigger"] == "manual" and out[-1]["turn_index"] == 1


def test_closing_leaves_an_open_turn_open() -> None:
    # as Flux: CloseStream gives the last words as an Update, not an EndOfTurn
    turns = FluxTurns(FluxOptions())
    out = feed(turns, partial("unfinished"), final("Unfinished"))
    assert events(out) == [("StartOfTurn", "unfinished"), ("Update", "Unfinished")]
    assert turns.closing() == []


def test_a_resume_between_a_speech_end_and_its_final_continues_the_turn() -> None:
    # the gRPC call broke after the speech end and before the final: the new call hears
    # the utterance again under a new id; the turn goes on and ends once, with all of it
    turns = FluxTurns(FluxOptions())
    before = feed(
        turns,
        speech(SpeechEvent.SPEECH_STARTED, 0),
        partial("w0"),
        partial("w0 w1 w2"),
        speech(SpeechEvent.SPEECH_ENDED, 0),
        end_of_turn(0, 0.1, asr_pb2.EndOfTurn.MAX_SILENCE),
    )
    turns.resumed()
    after = feed(
        turns,
        speech(SpeechEvent.SPEECH_STARTED, 1),
        partial("w0", 1),  # words the client was told: not again
        partial("w0 w1 w2", 1),
        speech(SpeechEvent.SPEECH_ENDED, 1),
        end_of_turn(1, 0.1, asr_pb2.EndOfTurn.MAX_SILENCE),
        final("w0 w1 w2 w3", 1),
    )
    assert events(before) == [("StartOfTurn", "w0"), ("Update", "w0 w1 w2")]
    assert events(after) == [("EndOfTurn", "w0 w1 w2 w3")]
    assert after[0]["turn_index"] == 0 and after[0]["trigger"] == "timeout"
    assert turns.turn_index == 1


def test_a_resume_mid_speech_tells_only_what_is_new() -> None:
    turns = FluxTurns(FluxOptions())
    before = feed(turns, partial("w0"), partial("w0 w1"))
    turns.resumed()
    after = feed(
        turns,
        partial("", 1),
        partial("w0", 1),
        partial("w0 w1", 1),
        partial("w0 w1 w2", 1),
        speech(SpeechEvent.SPEECH_ENDED, 1),
        final("w0 w1 w2", 1),
    )
    assert events(before + after) == [
        ("StartOfTurn", "w0"),
        ("Update", "w0 w1"),
        ("Update", "w0 w1 w2"),
        ("EndOfTurn", "w0 w1 w2"),
    ]
    # a resume with no turn open (nothing told) changes nothing
    turns.resumed()
    assert events(feed(turns, partial("w0", 2))) == [("StartOfTurn", "w0")]


def test_a_resume_after_eager_ends_withdraws_nothing_the_replay_repeats() -> None:
    # before the cut: an eager end withdrawn, then a second one; the replay hears both
    # pauses again: only the speaker going on past the second withdraws it
    turns = FluxTurns(FluxOptions(eager_eot_threshold=0.5))
    before = feed(
        turns,
        partial("a b"),
        partial("a b", eager=True, p=0.6),
        speech(SpeechEvent.SPEECH_RESUMED, 0),
        partial("a b c d"),
        partial("a b c d", eager=True, p=0.6),
    )
    turns.resumed()
    replay = (
        partial("a", 1),
        partial("a b", 1, eager=True, p=0.6),
        speech(SpeechEvent.SPEECH_RESUMED, 1),
        partial("a b c", 1),
        partial("a b c d", 1, eager=True, p=0.6),
    )
    assert feed(turns, *replay) == []
    after = feed(
        turns,
        speech(SpeechEvent.SPEECH_RESUMED, 1),
        partial("a b c d e", 1),
        speech(SpeechEvent.SPEECH_ENDED, 1),
        final("a b c d e", 1),
    )
    assert events(before + after) == [
        ("StartOfTurn", "a b"),
        ("EagerEndOfTurn", "a b"),
        ("TurnResumed", "a b"),
        ("Update", "a b c d"),
        ("EagerEndOfTurn", "a b c d"),
        ("TurnResumed", "a b c d"),
        ("Update", "a b c d e"),
        ("EndOfTurn", "a b c d e"),
    ]
    # cut again, at an eager end: the replay's final confirms it
    turns = FluxTurns(FluxOptions(eager_eot_threshold=0.5))
    before = feed(turns, partial("x y", eager=True, p=0.6))
    turns.resumed()
    after = feed(
        turns,
        partial("x", 1),
        partial("x y", 1, eager=True, p=0.6),
        speech(SpeechEvent.SPEECH_ENDED, 1),
        final("x y", 1),
    )
    assert events(before + after) == [
        ("StartOfTurn", "x y"),
        ("EagerEndOfTurn", "x y"),
        ("EndOfTurn", "x y"),
    ]


def test_a_resume_after_an_update_tells_the_replays_eager_end() -> None:
    # an eager end the client was not told before the cut is told when the replay has it
    turns = FluxTurns(FluxOptions(eager_eot_threshold=0.5))
    before = feed(turns, partial("x"), partial("x y"))
    turns.resumed()
    after = feed(turns, partial("x", 1), partial("x y", 1, eager=True, p=0.6))
    assert events(before + after) == [
        ("StartOfTurn", "x"),
        ("Update", "x y"),
        ("EagerEndOfTurn", "x y"),
    ]


def test_multilingual_turns_name_their_languages() -> None:
    options = parse_flux_query(
        [("model", "flux-general-multi"), *BASE[1:], ("language_hint", "de")]
    )
    turns = FluxTurns(options)
    r = partial("Guten Tag")
    r.result.language = "de"
    (start,) = feed(turns, r)
    assert start["languages"] == ["de"] and start["languages_hinted"] == ["de"]


def test_a_turns_languages_are_its_finals_most_speech_first() -> None:
    """Every partial's language was counted: a German turn whose first partials were
    guessed from a second of audio ended with ['de', 'ko', 'sw'], and a Spanish turn
    whose partials were decoded in the German the stream had kept listed German first."""
    turns = FluxTurns(parse_flux_query([("model", "flux-general-multi"), *BASE[1:]]))

    def said(text: str, language: str, utterance: int = 0, *, is_final: bool = False,
             seconds: float = 1.0) -> Response:  # fmt: skip
        r = final(text, utterance) if is_final else partial(text, utterance)
        r.result.language, r.result.end_s = language, r.result.start_s + seconds
        return r

    out = feed(turns, said("띠", "ko"), said("today, diwere", "sw"))
    assert [m["languages"] for m in out] == [["ko"], ["sw"]]  # the partial's own guess
    out = feed(turns, said("Der hinter diesem Portal", "de", is_final=True, seconds=2.0))
    out += feed(turns, said("las", "de", 1), said("las arenas", "de", 1))
    out += feed(turns, said("las arenas son blancas", "es", 1, is_final=True, seconds=3.0))
    assert all(m["languages"][0] == "de" for m in out[:-1]), out  # one final: German
    assert out[-1]["languages"] == ["es", "de"]  # 3 s of Spanish, 2 s of German


def test_configure_becomes_an_update_of_the_stream() -> None:
    turns = FluxTurns(query(("eager_eot_threshold", "0.4"), ("keyterm", "old")))
    update, success = turns.configure(
        parse_text(
            '{"type": "Configure", "thresholds": {"eot_threshold": 0.85, "eot_timeout_ms": 3000},'
            ' "keyterms": ["Ishmael", " Queequeg "]}'
        )  # type: ignore[arg-type]
    )
    assert update.turn_threshold == pytest.approx(0.85)
    assert update.eager_threshold == pytest.approx(0.4)  # unchanged, and still in effect
    assert update.max_silence_ms == 3000
    assert update.replace_hotwords and list(update.hotwords) == ["Ishmael", "Queequeg"]
    assert success == {
        "type": "ConfigureSuccess",
        "request_id": turns.request_id,
        "thresholds": {"eot_threshold": 0.85, "eager_eot_threshold": 0.4, "eot_timeout_ms": 3000},
        "keyterms": ["Ishmael", "Queequeg"],
    }
    # thresholds alone leave the keyterms as they are
    update, success = turns.configure(Configure(eot_threshold=0.6))
    assert not update.replace_hotwords and success["keyterms"] == ["Ishmael", "Queequeg"]
    # and the options follow: a later check compares with the settings now in effect
    with pytest.raises(ConfigureError, match="must not be above eot_threshold"):
        turns.configure(Configure(eager_eot_threshold=0.7))
    assert not update.HasField("eager_finals")  # eager was on from the start


def test_a_configured_timeout_past_the_servers_cap_is_echoed_as_capped() -> None:
    """Deepgram's "bring your own turn detection" guide sets eot_timeout_ms=30000: the
    turn ends at the server's 10 s, and ConfigureSuccess said 30000 (a query's was capped)."""
    turns = FluxTurns(query())
    update, success = turns.configure(Configure(eot_timeout_ms=30_000))
    assert update.max_silence_ms == 10_000
    assert success["thresholds"]["eot_timeout_ms"] == 10_000


def test_a_configure_may_give_one_keyterm_as_a_string() -> None:
    # the SDK types Configure's keyterms Union[str, List[str]]: a string is one keyterm
    turns = FluxTurns(query(("keyterm", "old")))
    update, success = turns.configure(
        parse_text('{"type": "Configure", "keyterms": " streamasr "}')  # type: ignore[arg-type]
    )
    assert update.replace_hotwords and list(update.hotwords) == ["streamasr"]
    assert success["keyterms"] == ["streamasr"]


def test_a_configure_with_an_eager_threshold_turns_eager_ends_on() -> None:
    turns = FluxTurns(query())  # connected without eager_eot_threshold
    update, success = turns.configure(Configure(eager_eot_threshold=0.5))
    assert update.HasField("eager_finals") and update.eager_finals
    assert update.eager_threshold == pytest.approx(0.5)
    assert success["thresholds"] == {"eot_threshold": 0.7, "eager_eot_threshold": 0.5}
    # on from then on: a later Configure changes its value and leaves it on
    update, _ = turns.configure(Configure(eager_eot_threshold=0.4))
    assert not update.HasField("eager_finals") and update.eager_threshold == pytest.approx(0.4)


@pytest.mark.parametrize(
    ("configure", "code", "phrase"),
    [
        (Configure(eot_threshold=1.5), "CONFIGURE_INVALID", "eot_threshold must be a number"),
        (Configure(eot_threshold="0.8"), "CONFIGURE_INVALID", "eot_threshold must be a number"),
        (Configure(eot_timeout_ms=10), "CONFIGURE_INVALID", "eot_timeout_ms must be a number"),
        (Configure(keyterms=["x", 1]), "CONFIGURE_INVALID", "keyterms must be a string or"),
        (Configure(keyterms={"x": 1}), "CONFIGURE_INVALID", "keyterms must be a string or"),
        (Configure(language_hints=["de"]), "CONFIGURE_NOT_SUPPORTED", "language hints"),
        (Configure(numerals=True), "CONFIGURE_NOT_SUPPORTED", "numerals is not supported"),
        (Configure(profanity_filter="yes"), "CONFIGURE_INVALID", "must be true or false"),
    ],
)
def test_a_configure_this_server_cannot_apply_is_a_failure(
    configure: Configure, code: str, phrase: str
) -> None:
    turns = FluxTurns(query())
    with pytest.raises(ConfigureError, match=phrase) as refused:
        turns.configure(configure)
    assert refused.value.code == code
    failure = turns.configure_failure(refused.value)
    assert failure["type"] == "ConfigureFailure" and failure["code"] == code
    assert turns.options == query()  # nothing changed


def test_pipecat_flux_service_connects_and_configures() -> None:
    """pipecat-ai 1.14's DeepgramFluxSTTService (read from its source; pipecat cannot be
    installed beside grpcio here, docs/compat.md): its query names model, sample rate and
    encoding, and eager_eot_threshold 0.5 when eager ends are on; its Configure carries
    only the fields that changed, numerals and profanity_filter among them."""
    options = parse_flux_query([*BASE, ("eager_eot_threshold", "0.5"), ("mip_opt_out", "false")])
    assert options.eager_eot_threshold == 0.5 and options.eot_threshold == 0.7
    turns = FluxTurns(options)
    message = (
        '{"type": "Configure", "keyterms": ["streamasr"], "numerals": false,'
        ' "profanity_filter": false, "thresholds": {"eot_threshold": 0.8}}'
    )
    update, success = turns.configure(parse_text(message))  # type: ignore[arg-type]
    assert update.turn_threshold == pytest.approx(0.8) and list(update.hotwords) == ["streamasr"]
    assert success["type"] == "ConfigureSuccess"


@pytest.mark.parametrize("audio", [[], [("encoding", "ogg-opus")], [("sample_rate", "48000")]])
def test_containers_are_decoded_and_configured_once_read(audio: list[tuple[str, str]]) -> None:
    """Flux takes WAV, Ogg and WebM without ``encoding`` (and Opus in Ogg as ``ogg-opus``)."""
    options = parse_flux_query([BASE[0], *audio])
    assert options.encoding is None
    with pytest.raises(ValueError, match="decoded"):
        streaming_config(options)
    config = streaming_config(options.decoded(48_000))
    assert config.format.sample_rate_hz == 48_000 and config.format.channels == 1


def test_linear32_is_the_servers_float32() -> None:
    options = parse_flux_query([BASE[0], ("encoding", "linear32"), ("sample_rate", "24000")])
    config = streaming_config(options)
    assert config.format.encoding == asr_pb2.AudioFormat.FLOAT32
    assert config.format.sample_rate_hz == 24_000


def test_keyterms_must_be_text() -> None:
    with pytest.raises(SchemaError, match="must be JSON"):
        parse_text('{"type": "Configure", "keyterms": ["\\udc80"]}')


def test_the_token_query_parameter_is_the_bridges_not_an_unknown_option() -> None:
    # ?token= is how a browser authenticates (auth.py): Flux refused it as unknown (400)
    options = parse_flux_query([("model", "flux-general-en"), ("token", "t0ken")])
    assert options == parse_flux_query([("model", "flux-general-en")])
