"""The OpenAI Realtime transcription mapping (asr_bridge/realtime.py), without sockets."""

from __future__ import annotations

import pytest

from asr_api.v1 import asr_pb2
from asr_bridge.realtime import RealtimeError, ServerEvents, TranscriptionSession


def test_the_ga_session_maps_onto_the_stream_config() -> None:
    s = TranscriptionSession()
    s.update_ga(
        {
            "type": "transcription",
            "audio": {
                "input": {
                    "format": {"type": "audio/pcmu"},
                    "transcription": {
                        "model": "gpt-4o-transcribe",
                        "language": "de",
                        "languages": ["de", "fr"],
                        "prompt": "Kubernetes",
                        "keywords": ["kubectl"],
                    },
                    "turn_detection": {"type": "server_vad", "silence_duration_ms": 800},
                }
            },
        }
    )
    c = s.streaming_config()
    assert (c.format.encoding, c.format.sample_rate_hz, c.format.channels) == (
        asr_pb2.AudioFormat.MULAW,
        8000,
        1,
    )
    assert c.language == "de" and list(c.languages) == ["de", "fr"]
    assert c.initial_prompt == "Kubernetes" and list(c.hotwords) == ["kubectl"]
    assert c.endpointing.silence_ms == 800 and c.interim_results
    echoed = s.to_ga("sess_1")["audio"]["input"]
    assert echoed["format"] == {"type": "audio/pcmu"}
    assert echoed["turn_detection"]["silence_duration_ms"] == 800
    assert echoed["turn_detection"]["threshold"] == 0.5  # defaults kept where not given


def test_the_beta_session_and_manual_turns() -> None:
    s = TranscriptionSession()
    s.update_beta({"input_audio_format": "g711_alaw", "turn_detection": None})
    assert s.format == "audio/pcma" and not s.server_vad
    assert s.streaming_config().endpointing.silence_ms == 10_000  # the client commits
    beta = s.to_beta("sess_1")
    assert beta["input_audio_format"] == "g711_alaw" and beta["turn_detection"] is None


@pytest.mark.parametrize(
    ("session", "param"),
    [
        ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}, "rate"),
        (
            {"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 2}}}},
            "threshold",
        ),
        # taken and echoed before: a bool threshold, a text padding, G.711 at 24 kHz
        (
            {"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": True}}}},
            "threshold",
        ),
        (
            {"audio": {"input": {"turn_detection": {"prefix_padding_ms": "abc"}}}},
            "prefix_padding_ms",
        ),
        ({"audio": {"input": {"format": {"type": "audio/pcmu", "rate": 24000}}}}, "rate"),
        ({"audio": {"input": {"noise_reduction": {"type": "studio"}}}}, "noise_reduction.type"),
        ({"audio": {"input": {"transcription": {"languages": "de"}}}}, "languages"),
        ({"audio": "pcm"}, "session.audio"),
    ],
)
def test_bad_settings_name_their_field(session: dict, param: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(RealtimeError) as err:
        TranscriptionSession().update_ga(session)
    assert err.value.param is not None and err.value.param.endswith(param), err.value.param


def _speech(
    kind: int, t: float, utterance: int, *, from_finalize: bool = False
) -> asr_pb2.StreamingRecognizeResponse:
    return asr_pb2.StreamingRecognizeResponse(
        speech_event=asr_pb2.SpeechEvent(
            type=kind, offset_s=t, utterance_id=utterance, from_finalize=from_finalize
        )
    )


def _final(
    text: str, start: float, end: float, utterance: int
) -> asr_pb2.StreamingRecognizeResponse:
    return asr_pb2.StreamingRecognizeResponse(
        result=asr_pb2.Result(
            is_final=True, text=text, start_s=start, end_s=end, utterance_id=utterance
        )
    )


def test_a_clear_drops_the_utterance_it_ends_and_nothing_else() -> None:
    """The server acknowledges each commit's and clear's FINALIZE in order, and marks the
    speech end a FINALIZE made: what a clear ended is dropped, what the VAD committed
    before it stays, however far the client's sending is ahead of the server."""
    ev = ServerEvents("s")
    SpeechEvent = asr_pb2.SpeechEvent
    started, ended, done = (
        SpeechEvent.SPEECH_STARTED,
        SpeechEvent.SPEECH_ENDED,
        SpeechEvent.FINALIZED,
    )
    kinds = lambda out: [e["type"] for e in out]  # noqa: E731
    respond = lambda r: ev.response(r, server_vad=False)  # noqa: E731
    assert respond(_speech(started, 0.2, 0)) == []
    ev.commit()  # the client committed utterance 0 …
    ev.clear()  # … and cleared what it said next, before either was answered
    assert kinds(respond(_speech(ended, 0.98, 0, from_finalize=True))) == [
        "input_audio_buffer.committed",
        "conversation.item.added",
    ]
    assert respond(_final("kept", 0.2, 0.98, 0))[-2]["transcript"] == "kept"
    assert respond(_speech(done, 1.0, 0)) == []  # the commit was answered by item 0
    # utterance 1 ended on the server's silence before the clear came: committed, kept
    respond(_speech(started, 1.2, 1))
    assert kinds(respond(_speech(ended, 1.8, 1))) == [
        "input_audio_buffer.committed",
        "conversation.item.added",
    ]
    assert respond(_final("said", 1.2, 1.8, 1))[-2]["transcript"] == "said"
    # utterance 2 is the one the clear's FINALIZE ended: nothing of it reaches the client
    for response in (
        _speech(started, 2.0, 2),
        _speech(ended, 2.97, 2, from_finalize=True),
        _final("gone", 2.0, 2.97, 2),
        _speech(done, 3.0, 2),
    ):
        assert respond(response) == []
    # no speech end before this final: a split, whose item goes on in the next utterance
    # (its text waits for the item's commit: the real API sends no delta before it)
    assert respond(_final("after", 2.9, 3.5, 3)) == []
    # the stream ends there: the item is committed and completed all the same
    out = ev.finish()
    assert kinds(out) == [
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.input_audio_transcription.delta",
        "conversation.item.input_audio_transcription.completed",
        "conversation.item.done",
    ]
    assert out[0]["previous_item_id"] == ev.item(1) and out[3]["transcript"] == "after"


def test_a_commit_of_audio_without_speech_still_commits_and_completes_an_item() -> None:
    """OpenAI commits whatever the buffer holds and transcribes it: a push-to-talk client
    that committed silence waits for ``committed`` and ``completed``. The server's
    acknowledgement says the commit ended no speech, so the bridge sends both, empty."""
    ev = ServerEvents("s")
    ev.commit()
    committed, _, completed, _ = ev.response(
        _speech(asr_pb2.SpeechEvent.FINALIZED, 1.0, 0), server_vad=False
    )
    assert committed["type"] == "input_audio_buffer.committed"
    assert completed["type"] == "conversation.item.input_audio_transcription.completed"
    assert completed["item_id"] == committed["item_id"] != ev.item(0)
    assert completed["transcript"] == ""
    # the next item follows it
    then, _ = ev.response(_speech(asr_pb2.SpeechEvent.SPEECH_ENDED, 2.0, 0), server_vad=False)
    assert then["previous_item_id"] == committed["item_id"]
    (after, _) = ev.response(_final("next", 1.5, 2.0, 0), server_vad=False)[-2:]
    assert after["transcript"] == "next"


def test_an_utterance_without_words_still_completes_its_item() -> None:
    # a noise: committed at its speech end, then the server's NO_WORDS instead of a final;
    # an OpenAI client waits for the item's completed, which comes with no transcript
    ev = ServerEvents("s")
    SpeechEvent = asr_pb2.SpeechEvent
    kinds = lambda out: [e["type"] for e in out]  # noqa: E731
    ev.response(_speech(SpeechEvent.SPEECH_STARTED, 0.2, 0), server_vad=True)
    assert kinds(ev.response(_speech(SpeechEvent.SPEECH_ENDED, 0.6, 0), server_vad=True)) == [
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
    ]
    (done, _) = ev.response(_speech(SpeechEvent.NO_WORDS, 0.8, 0), server_vad=True)
    assert done["type"] == "conversation.item.input_audio_transcription.completed"
    assert done["item_id"] == ev.item(0) and done["transcript"] == ""
    # a split part without words was never committed: nothing to complete; and a
    # resumed speech (eager finals, which this API does not ask for) says nothing
    assert ev.response(_speech(SpeechEvent.NO_WORDS, 9.0, 1), server_vad=True) == []
    assert ev.response(_speech(SpeechEvent.SPEECH_RESUMED, 9.5, 2), server_vad=True) == []
    # a commit's acknowledgement: the item's own events already answered it
    assert ev.response(_speech(SpeechEvent.FINALIZED, 9.6, 2), server_vad=True) == []


def test_events_that_are_not_text_or_not_base64_are_client_errors() -> None:
    from asr_bridge.realtime import decode_audio, parse_client_event

    with pytest.raises(RealtimeError) as err:
        parse_client_event(
            '{"type": "session.update", "session": {"audio": {"input": {"transcription":'
            ' {"prompt": "\\ud800"}}}}}'
        )
    assert err.value.code == "invalid_json" and "surrogate" in str(err.value)
    event = parse_client_event('{"type": "input_audio_buffer.append", "audio": "\u00e9"}')
    with pytest.raises(RealtimeError, match="not valid base64"):
        decode_audio(event, 2)


def _partial(stable: str, utterance: int) -> asr_pb2.StreamingRecognizeResponse:
    return asr_pb2.StreamingRecognizeResponse(
        result=asr_pb2.Result(text=stable, stable_text=stable, utterance_id=utterance)
    )


def _kinds(events: list[dict]) -> list[str]:  # type: ignore[type-arg]
    return [e["type"].removeprefix("conversation.item.input_audio_transcription.") for e in events]


def test_speech_the_server_split_is_one_item_from_speech_started_to_completed() -> None:
    """The server splits speech longer than 6 s at a short pause: a final with no speech
    end before it, and the rest of the speech goes on under the next utterance id, without
    a speech start. OpenAI's VAD makes one item of it: speech_started's item is the one
    speech_stopped names, committed once, completed with the whole text."""
    ev = ServerEvents("s")
    SpeechEvent = asr_pb2.SpeechEvent
    out = []
    for response in (
        _speech(SpeechEvent.SPEECH_STARTED, 0.5, 0),
        _partial("first part", 0),
        _final("first part of a long reading", 0.5, 6.7, 0),  # the split: no SPEECH_ENDED
        _partial("and", 1),
        _speech(SpeechEvent.SPEECH_ENDED, 8.0, 1),
        _final("and the rest of it", 6.7, 8.0, 1),
    ):
        out += ev.response(response, server_vad=True)
    # the split's text waits for the commit: the real API sends deltas of committed
    # items only (a client may have nothing to attach one to before)
    assert _kinds(out) == [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "delta",
        "delta",
        "delta",
        "delta",
        "completed",
        "conversation.item.done",
    ]
    assert {e.get("item_id", e.get("item", {}).get("id")) for e in out} == {ev.item(0)}
    completed = out[-2]
    transcript = "first part of a long reading and the rest of it"
    assert completed["transcript"] == transcript
    assert "".join(e["delta"] for e in out if "delta" in e) == transcript
    assert completed["usage"]["seconds"] == pytest.approx(7.5)
    # the next speech is the next item
    (started,) = ev.response(_speech(SpeechEvent.SPEECH_STARTED, 9.0, 2), server_vad=True)
    assert started["item_id"] == ev.item(2)


def test_a_push_to_talk_press_the_server_split_is_one_commit_and_one_item() -> None:
    """Turn detection off: a 7 s press with a breath in it is split by the server, yet the
    client committed once: one ``committed``, none before the commit, one item."""
    ev = ServerEvents("s")
    SpeechEvent = asr_pb2.SpeechEvent
    respond = lambda r: ev.response(r, server_vad=False)  # noqa: E731
    assert respond(_speech(SpeechEvent.SPEECH_STARTED, 0.1, 0)) == []
    assert respond(_final("one", 0.1, 6.6, 0)) == []  # its text waits for the commit
    ev.commit()
    out = [
        *respond(_speech(SpeechEvent.SPEECH_ENDED, 8.0, 1, from_finalize=True)),
        *respond(_final("two", 6.6, 8.0, 1)),
        *respond(_speech(SpeechEvent.FINALIZED, 8.0, 1)),
    ]
    assert _kinds(out) == [
        "input_audio_buffer.committed",
        "conversation.item.added",
        "delta",
        "delta",
        "completed",
        "conversation.item.done",
    ]
    assert out[0]["item_id"] == out[4]["item_id"] == ev.item(0)
    assert [out[2]["delta"], out[3]["delta"]] == ["one", " two"]
    assert out[4]["transcript"] == "one two"
    # a press whose speech the server had already ended in splits (the last part without
    # words, no speech end): the commit's acknowledgement commits what it said
    assert respond(_final("three", 9.0, 15.0, 2)) == []
    assert respond(_speech(SpeechEvent.NO_WORDS, 16.0, 3)) == []
    ev.commit()
    out = respond(_speech(SpeechEvent.FINALIZED, 16.5, 3))
    assert _kinds(out) == [
        "input_audio_buffer.committed",
        "conversation.item.added",
        "delta",
        "completed",
        "conversation.item.done",
    ]
    assert out[0]["item_id"] == ev.item(2) and out[3]["transcript"] == "three"
    assert out[0]["previous_item_id"] == ev.item(0)


def test_a_split_item_whose_last_part_has_no_words_completes_with_the_others() -> None:
    ev = ServerEvents("s")
    SpeechEvent = asr_pb2.SpeechEvent
    ev.response(_speech(SpeechEvent.SPEECH_STARTED, 0.0, 0), server_vad=True)
    ev.response(_final("spoken", 0.0, 6.5, 0), server_vad=True)
    stopped, committed, _, delta = ev.response(
        _speech(SpeechEvent.SPEECH_ENDED, 7.0, 1), server_vad=True
    )
    assert stopped["item_id"] == committed["item_id"] == delta["item_id"] == ev.item(0)
    assert delta["delta"] == "spoken"
    completed, _ = ev.response(_speech(SpeechEvent.NO_WORDS, 7.2, 1), server_vad=True)
    assert completed["item_id"] == ev.item(0) and completed["transcript"] == "spoken"


@pytest.mark.parametrize("ga", [True, False])
def test_each_committed_item_is_added_to_the_conversation_in_the_clients_shape(ga: bool) -> None:
    """After ``committed`` OpenAI says the user message item it created: GA sessions
    (``session.update``) get ``conversation.item.added``, then ``.done`` with the transcript;
    beta ones (``transcription_session.update``) ``conversation.item.created``. As the
    official SDK's types read them."""
    from openai.types.beta.realtime import ConversationItemCreatedEvent
    from openai.types.realtime import (
        ConversationItemAdded,
        ConversationItemDone,
        RealtimeConversationItemUserMessage,
    )

    ev = ServerEvents("s", ga=ga)
    SpeechEvent = asr_pb2.SpeechEvent
    respond = lambda r: ev.response(r, server_vad=True)  # noqa: E731
    out = []
    for utterance, text in enumerate(("hello", "again")):
        out += respond(_speech(SpeechEvent.SPEECH_STARTED, utterance, utterance))
        out += respond(_speech(SpeechEvent.SPEECH_ENDED, utterance + 0.5, utterance))
        out += respond(_final(text, utterance, utterance + 0.5, utterance))
    items = [e for e in out if "item" in e]
    if not ga:
        first, second = (ConversationItemCreatedEvent.model_validate(e) for e in items)
        assert first.type == second.type == "conversation.item.created"
        for event, utterance in ((first, 0), (second, 1)):
            assert event.item.id == ev.item(utterance)
            assert (event.item.type, event.item.role) == ("message", "user")
            assert event.item.content is not None
            assert event.item.content[0].type == "input_audio"
            assert event.item.content[0].transcript is None
        assert first.previous_item_id is None and second.previous_item_id == ev.item(0)
        return
    assert [e["type"].rsplit(".", 1)[-1] for e in items] == ["added", "done"] * 2
    added = [ConversationItemAdded.model_validate(e) for e in items[::2]]
    done = [ConversationItemDone.model_validate(e) for e in items[1::2]]
    for utterance, text in enumerate(("hello", "again")):
        for event, transcript in ((added[utterance], None), (done[utterance], text)):
            assert isinstance(event.item, RealtimeConversationItemUserMessage)
            assert event.item.id == ev.item(utterance) and event.item.role == "user"
            assert event.item.content[0].type == "input_audio"
            assert event.item.content[0].transcript == transcript
    assert added[0].previous_item_id is None and done[0].previous_item_id is None
    assert added[1].previous_item_id == done[1].previous_item_id == ev.item(0)


@pytest.mark.parametrize("server_vad", [True, False])
@pytest.mark.parametrize("clear_ends_speech", [True, False])
def test_a_clear_drops_every_part_of_speech_the_server_split(
    server_vad: bool, clear_ends_speech: bool
) -> None:
    """The server split a long stretch (a final, no speech end) and the part after the
    split has no speech start of its own; a clear drops the whole uncommitted buffer, the
    first part's text included, whether its FINALIZE ended that second part or found the
    server in the pause after the split. The next speech is another item."""
    ev = ServerEvents("s")
    SpeechEvent = asr_pb2.SpeechEvent
    respond = lambda r: ev.response(r, server_vad=server_vad)  # noqa: E731
    respond(_speech(SpeechEvent.SPEECH_STARTED, 0.0, 0))
    assert respond(_final("cleared", 0.0, 7.0, 0)) == []  # the split
    ev.clear()
    cleared = [_speech(SpeechEvent.FINALIZED, 7.3, 1)]
    if clear_ends_speech:
        cleared[:0] = [
            _speech(SpeechEvent.SPEECH_ENDED, 8.4, 1, from_finalize=True),
            _final("also cleared", 7.4, 8.4, 1),
        ]
    for response in cleared:
        assert respond(response) == []
    out = respond(_speech(SpeechEvent.SPEECH_STARTED, 9.0, 2))
    if not server_vad:
        ev.commit()
    out += respond(_speech(SpeechEvent.SPEECH_ENDED, 9.5, 2, from_finalize=not server_vad))
    out += respond(_final("kept", 9.0, 9.5, 2))
    out += respond(_speech(SpeechEvent.FINALIZED, 9.5, 2))
    assert {e["item_id"] for e in out if "item_id" in e} == {ev.item(2)}
    assert [e["delta"] for e in out if "delta" in e] == ["kept"]
    completed = [e for e in out if e["type"].endswith("transcription.completed")]
    assert [e["transcript"] for e in completed] == ["kept"]


def test_a_resumed_stream_continues_the_items_the_client_has() -> None:
    """The bridge's gRPC stream broke and went on on a new call: the server hears again
    what had no final, under new utterance ids. The client sees no seam: an item whose
    speech ended before the break is completed by the replayed final (not started and
    committed again as another item), and speech cut in its middle has one speech_started
    and deltas that still add up to its transcript."""
    ev = ServerEvents("s")
    SpeechEvent = asr_pb2.SpeechEvent
    respond = lambda r: ev.response(r, server_vad=True)  # noqa: E731
    out = respond(_speech(SpeechEvent.SPEECH_STARTED, 0.0, 0))
    out += respond(_speech(SpeechEvent.SPEECH_ENDED, 1.0, 0))  # committed; its final is cut
    ev.resumed()
    for response in (
        _speech(SpeechEvent.SPEECH_STARTED, 0.0, 1),
        _speech(SpeechEvent.SPEECH_ENDED, 1.0, 1),
        _final("first", 0.0, 1.0, 1),
    ):
        out += respond(response)
    assert _kinds(out) == [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "delta",
        "completed",
        "conversation.item.done",
    ]
    assert {e.get("item_id", e.get("item", {}).get("id")) for e in out} == {ev.item(0)}
    assert out[-2]["transcript"] == "first"
    # cut in the middle of speech, with a delta held for the commit
    out = respond(_speech(SpeechEvent.SPEECH_STARTED, 2.0, 2))
    out += respond(_partial("w0", 2))
    ev.resumed()
    for response in (
        _speech(SpeechEvent.SPEECH_STARTED, 2.0, 3),
        _partial("w0 w1", 3),
        _speech(SpeechEvent.SPEECH_ENDED, 3.0, 3),
        _final("w0 w1 w2", 2.0, 3.0, 3),
    ):
        out += respond(response)
    assert _kinds(out) == [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "delta",
        "delta",
        "delta",
        "completed",
        "conversation.item.done",
    ]
    assert {e.get("item_id", e.get("item", {}).get("id")) for e in out} == {ev.item(2)}
    assert out[2]["previous_item_id"] == ev.item(0)
    assert "".join(e["delta"] for e in out if "delta" in e) == out[-2]["transcript"] == "w0 w1 w2"
    assert not ev._items  # nothing waits for a final of a call that is gone
    (started,) = respond(_speech(SpeechEvent.SPEECH_STARTED, 4.0, 4))
    assert started["item_id"] == ev.item(4)


def test_a_resume_under_a_push_to_talk_commit_completes_the_committed_item() -> None:
    """Turn detection off: the commit's FINALIZE ended the speech, then the call broke
    before its final; the new call hears the FINALIZE again (the client replays it) and
    answers it with the same speech: the committed item is completed, once."""
    ev = ServerEvents("s")
    SpeechEvent = asr_pb2.SpeechEvent
    respond = lambda r: ev.response(r, server_vad=False)  # noqa: E731
    respond(_speech(SpeechEvent.SPEECH_STARTED, 0.0, 0))
    ev.commit()
    out = respond(_speech(SpeechEvent.SPEECH_ENDED, 1.0, 0, from_finalize=True))
    ev.resumed()
    for response in (
        _speech(SpeechEvent.SPEECH_STARTED, 0.0, 1),
        _speech(SpeechEvent.SPEECH_ENDED, 1.0, 1, from_finalize=True),
        _final("pressed", 0.0, 1.0, 1),
        _speech(SpeechEvent.FINALIZED, 1.0, 1),
    ):
        out += respond(response)
    assert _kinds(out) == [
        "input_audio_buffer.committed",
        "conversation.item.added",
        "delta",
        "completed",
        "conversation.item.done",
    ]
    assert out[3]["item_id"] == ev.item(0) and out[3]["transcript"] == "pressed"


@pytest.mark.parametrize(("fmt", "second"), [("audio/pcm", 48_000), ("audio/pcmu", 8_000)])
def test_a_sessions_audio_length_follows_its_format(fmt: str, second: int) -> None:
    """What the upstream's pace is measured against (asr_bridge.session.UpstreamPace)."""
    s = TranscriptionSession()
    s.update_ga({"type": "transcription", "audio": {"input": {"format": {"type": fmt}}}})
    assert s.seconds(bytes(second)) == pytest.approx(1.0)


def test_speech_times_include_server_vads_padding_and_silence_as_openais_do() -> None:
    """OpenAI: audio_start_ms "includes the prefix_padding_ms", audio_end_ms "includes the
    min_silence_duration_ms". A client that cuts its recording by them got a clip 300 ms
    short at the start and a silence short at the end."""
    from asr_bridge.realtime import TranscriptionSession

    session = TranscriptionSession()
    assert session.speech_margins_ms == (300, 500)
    ev = ServerEvents("s")
    SpeechEvent = asr_pb2.SpeechEvent
    margins = session.speech_margins_ms
    (started,) = ev.response(
        _speech(SpeechEvent.SPEECH_STARTED, 0.87, 0), server_vad=True, margins_ms=margins
    )
    assert started["audio_start_ms"] == 570
    stopped = ev.response(
        _speech(SpeechEvent.SPEECH_ENDED, 3.42, 0), server_vad=True, margins_ms=margins
    )[0]
    assert stopped["audio_end_ms"] == 3920
    early = ServerEvents("t").response(
        _speech(SpeechEvent.SPEECH_STARTED, 0.1, 0), server_vad=True, margins_ms=margins
    )
    assert early[0]["audio_start_ms"] == 0  # never before the session's audio
    session.turn_detection = {"type": "semantic_vad", "eagerness": "auto"}
    assert session.speech_margins_ms == (0, 0)


def test_a_commit_during_server_vad_speech_ends_its_item_where_it_was_made() -> None:
    """The VAD's silence margin was added to a speech end the client's commit made: the
    item ended 500 ms into the next item's audio, and the next began (its padding taken
    off) 800 ms before the first ended."""
    from asr_bridge.realtime import TranscriptionSession

    margins = TranscriptionSession().speech_margins_ms
    ev = ServerEvents("s")
    SpeechEvent = asr_pb2.SpeechEvent

    def respond(e: asr_pb2.StreamingRecognizeResponse) -> list[dict]:  # type: ignore[type-arg]
        return ev.response(e, server_vad=True, margins_ms=margins)

    respond(_speech(SpeechEvent.SPEECH_STARTED, 0.5, 0))
    ev.commit()
    out = respond(_speech(SpeechEvent.SPEECH_ENDED, 2.8, 0, from_finalize=True))
    (stopped,) = [e for e in out if e["type"] == "input_audio_buffer.speech_stopped"]
    assert stopped["audio_end_ms"] == 2800
    (started,) = respond(_speech(SpeechEvent.SPEECH_STARTED, 2.8, 1))
    assert started["audio_start_ms"] == 2800  # not 2500: the buffer began at the commit
    # the VAD's own end keeps its silence, and the next item begins after it
    out = respond(_speech(SpeechEvent.SPEECH_ENDED, 4.0, 1))
    (stopped,) = [e for e in out if e["type"] == "input_audio_buffer.speech_stopped"]
    assert stopped["audio_end_ms"] == 4500
    (started,) = respond(_speech(SpeechEvent.SPEECH_STARTED, 4.6, 2))
    assert started["audio_start_ms"] == 4500
