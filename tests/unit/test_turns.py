"""TurnAssembler: each EndOfTurn with the finals it closes, whichever comes first."""

from __future__ import annotations

import pytest

from asr_api.v1 import asr_pb2
from asr_client import EagerTurn, Turn, TurnAssembler, TurnResumed

Response = asr_pb2.StreamingRecognizeResponse
MODEL, MAX_SILENCE = asr_pb2.EndOfTurn.MODEL, asr_pb2.EndOfTurn.MAX_SILENCE


def final(utterance: int, text: str, channel: int = 0, confidence: float = 0.9) -> Response:
    return Response(
        result=asr_pb2.Result(
            is_final=True,
            text=text,
            utterance_id=utterance,
            channel=channel,
            confidence=confidence,
        )
    )


def partial(utterance: int, text: str) -> Response:
    return Response(result=asr_pb2.Result(text=text, utterance_id=utterance))


def end_of_turn(utterance: int, reason=MODEL, channel: int = 0) -> Response:  # type: ignore[no-untyped-def]
    return Response(
        end_of_turn=asr_pb2.EndOfTurn(
            utterance_id=utterance, reason=reason, channel=channel, probability=0.9
        )
    )


def no_words(utterance: int) -> Response:
    return Response(
        speech_event=asr_pb2.SpeechEvent(type=asr_pb2.SpeechEvent.NO_WORDS, utterance_id=utterance)
    )


def test_a_turn_is_whole_when_its_end_and_its_last_final_are_both_in() -> None:
    turns = TurnAssembler()
    # a mid-turn pause: two utterances, one turn; the EndOfTurn before the last final
    assert turns.feed(partial(0, "I want")) is None
    assert turns.feed(final(0, "I want to fly", confidence=0.95)) is None
    assert turns.feed(end_of_turn(1)) is None  # its final is still being decoded
    turn = turns.feed(final(1, "to Paris.", confidence=0.7))
    assert turn is not None
    assert (turn.text, turn.reason, turn.channel) == ("I want to fly to Paris.", MODEL, 0)
    assert turn.confidence == pytest.approx(0.7)  # the least sure of its finals
    assert [r.utterance_id for r in turn.finals] == [0, 1]
    # the next turn: the final first, then its end
    assert turns.feed(final(2, "Tomorrow.")) is None
    later = turns.feed(end_of_turn(2, MAX_SILENCE))
    assert later is not None and later.text == "Tomorrow." and later.reason == MAX_SILENCE


def test_a_turn_ending_in_a_sound_without_words_ends_at_its_no_words() -> None:
    turns = TurnAssembler()
    assert turns.feed(final(0, "Yes.")) is None
    assert turns.feed(end_of_turn(1)) is None
    turn = turns.feed(no_words(1))  # utterance 1 was a cough: no final will come
    assert turn is not None and turn.text == "Yes."
    # a turn of only a cough is a turn without words
    assert turns.feed(end_of_turn(2)) is None
    empty = turns.feed(no_words(2))
    assert empty is not None and empty.text == "" and empty.confidence == 0.0


def test_finals_of_the_next_turn_are_kept_for_it() -> None:
    """The caller went on before the turn's own final came: the later utterance's final
    belongs to the next turn."""
    turns = TurnAssembler()
    assert turns.feed(end_of_turn(0)) is None
    assert turns.feed(final(0, "Hello.")) is not None
    assert turns.feed(final(1, "I need help")) is None
    assert turns.feed(end_of_turn(2)) is None
    assert turns.feed(final(2, "with my bill.")).text == "I need help with my bill."  # type: ignore[union-attr]


def test_each_channel_has_its_own_turns() -> None:
    turns = TurnAssembler()
    assert turns.feed(final(0, "Agent here.", channel=0)) is None
    assert turns.feed(final(0, "Hi, my card", channel=1)) is None
    assert turns.feed(end_of_turn(0, channel=1)) is not None  # the customer's turn
    agent = turns.feed(end_of_turn(0, channel=0))
    assert agent is not None and agent.text == "Agent here." and agent.channel == 0


def eager(utterance: int, text: str, p: float = 0.6) -> Response:
    return Response(
        result=asr_pb2.Result(
            text=text, utterance_id=utterance, eager=True, turn_probability=p, confidence=0.8
        )
    )


def resumed(utterance: int) -> Response:
    return Response(
        speech_event=asr_pb2.SpeechEvent(
            type=asr_pb2.SpeechEvent.SPEECH_RESUMED, utterance_id=utterance
        )
    )


def test_an_eager_turn_is_withdrawn_when_the_caller_goes_on_or_confirmed_by_the_turn() -> None:
    turns = TurnAssembler()
    assert turns.feed(final(0, "Hi.", confidence=0.95)) is None  # a split's first part
    first = turns.feed(eager(1, "I want to fly", p=0.62))
    assert isinstance(first, EagerTurn)
    # what the turn will be if the caller stops here: the finals so far and the eager text
    assert (first.text, first.utterance_id, first.turn_probability) == (
        "Hi. I want to fly",
        1,
        pytest.approx(0.62),
    )
    assert first.confidence == pytest.approx(0.8)
    assert turns.feed(resumed(1)) == TurnResumed(0, 1)  # the caller went on
    assert turns.feed(resumed(1)) is None  # nothing left to withdraw
    second = turns.feed(eager(1, "I want to fly to Paris."))
    assert isinstance(second, EagerTurn) and second.text == "Hi. I want to fly to Paris."
    assert turns.feed(end_of_turn(1)) is None
    turn = turns.feed(final(1, "I want to fly to Paris."))  # confirmed
    assert isinstance(turn, Turn) and turn.text == second.text
    assert turns.feed(resumed(1)) is None  # a confirmed eager turn is not withdrawn


def test_a_resumption_with_no_eager_turn_out_withdraws_nothing() -> None:
    """SPEECH_RESUMED follows eager results only; one for another utterance (or after a
    resume of the stream) has no eager turn of this assembler's to withdraw."""
    turns = TurnAssembler()
    assert turns.feed(partial(0, "I want")) is None
    assert turns.feed(resumed(0)) is None
    assert isinstance(turns.feed(eager(1, "Yes")), EagerTurn)
    assert turns.feed(resumed(0)) is None  # not the eager turn's utterance
    assert turns.feed(resumed(1)) == TurnResumed(0, 1)


def test_an_end_of_turn_sent_again_after_a_resume_is_not_a_second_turn() -> None:
    assembler = TurnAssembler()
    assert assembler.feed(final(0, "Hello there.")) is None
    turn = assembler.feed(end_of_turn(0))
    assert isinstance(turn, Turn) and turn.text == "Hello there."
    # the stream resumed on a new call and the server ended that turn again
    assert assembler.feed(end_of_turn(0)) is None
    assert assembler.feed(final(1, "Next.")) is None
    nxt = assembler.feed(end_of_turn(1))
    assert isinstance(nxt, Turn) and nxt.text == "Next."


def test_a_turn_end_withdrawn_by_a_resume_waits_for_the_turns_new_end() -> None:
    """A stream that resumed after a turn's end and before its final withdraws that end
    (SPEECH_RESUMED, asr_client/resume.py); the new call hears the utterance again under a
    new id, its final may come before its new end, and one whole turn is returned, once."""
    turns = TurnAssembler()
    assert turns.feed(end_of_turn(0)) is None  # the final of 0 never comes
    assert turns.feed(resumed(0)) is None
    assert turns.feed(final(1, "I want to fly.")) is None  # not a turn yet: no end for it
    turn = turns.feed(end_of_turn(1))
    assert isinstance(turn, Turn) and turn.text == "I want to fly."
    assert turns.feed(final(2, "Hello.")) is None


def speech_ended(utterance: int, from_finalize: bool = False) -> Response:
    return Response(
        speech_event=asr_pb2.SpeechEvent(
            type=asr_pb2.SpeechEvent.SPEECH_ENDED,
            utterance_id=utterance,
            offset_s=1.5,
            from_finalize=from_finalize,
        )
    )


def test_on_a_silence_stream_each_utterance_is_a_turn() -> None:
    """A SILENCE stream sends no EndOfTurn: no Turn ever came, and each EagerTurn held every
    final since the stream began (and they were kept for the whole call)."""
    turns = TurnAssembler(silence_endpointing=True)
    assert turns.feed(final(0, "He could wait no longer.")) is None
    first = turns.feed(speech_ended(0))
    assert isinstance(first, Turn) and first.text == "He could wait no longer."
    assert first.reason == MAX_SILENCE and first.end_of_turn.offset_s == 1.5
    # the next one: its end before its final, and an eager result of its own words only
    early = turns.feed(eager(1, "Go forward."))
    assert isinstance(early, EagerTurn) and early.text == "Go forward."
    assert turns.feed(speech_ended(1, from_finalize=True)) is None
    second = turns.feed(final(1, "Go forward ten meters."))
    assert isinstance(second, Turn) and second.text == "Go forward ten meters."
    assert second.reason == asr_pb2.EndOfTurn.FINALIZE
    # a long utterance's split: its parts come with no SPEECH_ENDED between them, one turn
    assert turns.feed(final(2, "A first part,")) is None
    assert turns.feed(final(3, "and the rest.")) is None
    third = turns.feed(speech_ended(3))
    assert isinstance(third, Turn) and third.text == "A first part, and the rest."


def test_speech_ended_is_no_turn_end_on_a_semantic_stream() -> None:
    turns = TurnAssembler()
    assert turns.feed(final(0, "I want to fly")) is None
    assert turns.feed(speech_ended(0)) is None  # a mid-turn pause: the turn goes on
    turn = turns.feed(end_of_turn(0))
    assert turn is not None and turn.text == "I want to fly"


@pytest.mark.parametrize("silence", [False, True])
def test_an_eager_turn_a_split_made_final_is_withdrawn_when_the_caller_goes_on(
    silence: bool,
) -> None:
    """At the length limit (or a long stream's split) the pause's eager text becomes its
    part's final, with no SPEECH_RESUMED; the caller went on in the next part, and no
    TurnResumed came, so an agent kept the reply it had started on half the turn."""
    turns = TurnAssembler(silence_endpointing=silence)
    early = turns.feed(eager(1, "He could wait no longer."))
    assert isinstance(early, EagerTurn)
    assert turns.feed(final(1, "He could wait no longer.")) is None  # the split's final
    assert turns.feed(partial(2, "Stuff it")) == TurnResumed(0, 1)  # the caller went on
    assert turns.feed(partial(2, "Stuff it into you")) is None  # said once
    end = speech_ended(2) if silence else end_of_turn(2)
    if silence:
        assert turns.feed(final(2, "Stuff it into you.")) is None
        turn = turns.feed(end)
    else:
        assert turns.feed(end) is None
        turn = turns.feed(final(2, "Stuff it into you."))
    assert isinstance(turn, Turn)
    assert turn.text == "He could wait no longer. Stuff it into you."


def test_an_eager_turn_whose_turn_ends_at_the_split_stands() -> None:
    turns = TurnAssembler()
    assert isinstance(turns.feed(eager(1, "Go on.")), EagerTurn)
    assert turns.feed(final(1, "Go on.")) is None
    turn = turns.feed(end_of_turn(1))
    assert isinstance(turn, Turn) and turn.text == "Go on."
    assert turns.feed(partial(2, "Next")) is None  # the next turn: nothing to withdraw


def test_a_later_eager_turn_replaces_one_a_split_made_final() -> None:
    """Without partials the next thing heard may be the next part's own eager result: the
    EagerTurn with the whole turn so far, which replaces the first."""
    turns = TurnAssembler()
    turns.feed(eager(1, "He could wait no longer."))
    turns.feed(final(1, "He could wait no longer."))
    again = turns.feed(eager(2, "Stuff it into you."))
    assert isinstance(again, EagerTurn)
    assert again.text == "He could wait no longer. Stuff it into you."
    assert turns.feed(final(2, "Stuff it into you.")) is None
    turn = turns.feed(end_of_turn(2))
    assert isinstance(turn, Turn)


@pytest.mark.parametrize("silence", [False, True])
def test_the_rest_of_a_splits_pause_without_words_withdraws_nothing(silence: bool) -> None:
    """The split's pause goes on as an utterance of its own, which holds no words: its end
    and NO_WORDS came, and the first version of the withdrawal above took that end for the
    caller going on (a TurnResumed, then the Turn with the eager text itself)."""
    turns = TurnAssembler(silence_endpointing=silence)
    assert isinstance(turns.feed(eager(2, "Stuff it into you.")), EagerTurn)
    assert turns.feed(final(2, "Stuff it into you.")) is None
    assert turns.feed(speech_ended(3) if silence else end_of_turn(3)) is None
    turn = turns.feed(no_words(3))
    assert isinstance(turn, Turn) and turn.text == "Stuff it into you."
    assert turns.feed(partial(4, "Next")) is None  # a new turn: nothing left to withdraw
