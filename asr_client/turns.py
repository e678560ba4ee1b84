"""Whole turns from a SEMANTIC stream: each EndOfTurn with the finals it closes.

An ``EndOfTurn`` names the utterance that ended the turn, and that utterance's final may
come after it (this server sends the ``EndOfTurn`` as soon as the turn model has answered,
so an agent can start its reply while the final decode finishes) or before it; the
utterance may also end with ``NO_WORDS`` instead (a cough the voice detector took for
speech). A turn is complete when both its ``EndOfTurn`` and that utterance's result are
in; ``TurnAssembler`` gathers each channel's finals until then.

With ``eager_finals`` it also says when a turn may be over (``EagerTurn``: an agent can
start its reply) and when that was wrong (``TurnResumed``: the caller went on).

SILENCE streams send no ``EndOfTurn``: there an utterance's end (``SPEECH_ENDED``) ends
the turn, with the finals of its splits (a long utterance's parts come with no
``SPEECH_ENDED`` between them). ``TurnAssembler(silence_endpointing=True)`` reads them so;
without it, a SILENCE stream's finals would wait for an ``EndOfTurn`` that never comes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from asr_api.v1 import asr_pb2

_NO_WORDS = asr_pb2.SpeechEvent.NO_WORDS
_RESUMED = asr_pb2.SpeechEvent.SPEECH_RESUMED
_ENDED = asr_pb2.SpeechEvent.SPEECH_ENDED


@dataclass(frozen=True)
class Turn:
    """One caller turn: its finals, in order, and the ``EndOfTurn`` that closed it."""

    end_of_turn: asr_pb2.EndOfTurn
    finals: tuple[asr_pb2.Result, ...]

    @property
    def channel(self) -> int:
        return self.end_of_turn.channel

    @property
    def text(self) -> str:
        """The turn's words ("" when it held only sounds without words)."""
        return " ".join(r.text for r in self.finals if r.text)

    @property
    def confidence(self) -> float:
        """The least sure of its finals' ``confidence`` (0: no final, or none known)."""
        return min((r.confidence for r in self.finals), default=0.0)

    @property
    def reason(self) -> asr_pb2.EndOfTurn.Reason:
        """What ended it: ``asr_pb2.EndOfTurn.MODEL``, ``MAX_SILENCE``, ``FINALIZE``… (on
        a SILENCE stream: ``MAX_SILENCE``, its ``silence_ms``, or ``FINALIZE``)"""
        return self.end_of_turn.reason


@dataclass(frozen=True)
class EagerTurn:
    """The turn as it will be if the caller stays silent (an eager result): start the
    reply now, and keep it only once the ``Turn`` comes; a ``TurnResumed`` withdraws it."""

    channel: int
    utterance_id: int
    text: str  # the turn's finals so far, then the eager text
    confidence: float  # the least sure of those
    turn_probability: float  # the turn model's answer at this pause (SEMANTIC)


@dataclass(frozen=True)
class TurnResumed:
    """The caller went on after an ``EagerTurn``: drop what was started on it."""

    channel: int
    utterance_id: int


@dataclass
class _Channel:
    finals: list[asr_pb2.Result] = field(default_factory=list)
    settled: int = -1  # the newest utterance whose final (or NO_WORDS) is in
    ending: asr_pb2.EndOfTurn | None = None
    eager: int | None = None  # the utterance of an EagerTurn not yet confirmed or withdrawn
    #: the utterance of an EagerTurn whose final came (the eager text) while its turn has
    #: not ended: a split at that pause, the caller may still go on in the next utterance
    split_eager: int | None = None
    ended: int = -1  # the utterance that ended the last turn returned


class TurnAssembler:
    """Feed it every response of a stream, in order; it returns each turn once whole.

    ``silence_endpointing``: the stream's endpointing mode is SILENCE, whose turns end
    where its utterances do (there is no ``EndOfTurn``)."""

    def __init__(self, *, silence_endpointing: bool = False) -> None:
        self._channels: dict[int, _Channel] = {}
        self._silence = silence_endpointing

    def feed(
        self, response: asr_pb2.StreamingRecognizeResponse
    ) -> Turn | EagerTurn | TurnResumed | None:
        kind = response.WhichOneof("event")
        if kind == "result" and response.result.is_final:
            r = response.result
            ch = self._channels.setdefault(r.channel, _Channel())
            ch.finals.append(r)
            ch.settled = max(ch.settled, r.utterance_id)
            if ch.eager == r.utterance_id:
                ch.eager = None  # confirmed: its final is the eager text
                ch.split_eager = r.utterance_id  # and the turn's end, unless one follows
            turn = self._complete(ch)
            if turn is None and self._went_on(ch, r.utterance_id):
                return self._withdraw_split(ch, r.channel)
            return turn
        if kind == "result" and response.result.eager:
            r = response.result
            ch = self._channels.setdefault(r.channel, _Channel())
            ch.eager = r.utterance_id
            ch.split_eager = None  # (this EagerTurn, the turn so far, replaces that one)
            so_far = [f for f in ch.finals if f.utterance_id < r.utterance_id]
            return EagerTurn(
                r.channel,
                r.utterance_id,
                " ".join(t for t in (*(f.text for f in so_far), r.text) if t),
                min((f.confidence for f in (*so_far, r)), default=0.0),
                r.turn_probability,
            )
        if kind == "speech_event" and response.speech_event.type == _RESUMED:
            e = response.speech_event
            ch = self._channels.setdefault(e.channel, _Channel())
            if ch.ending is not None and ch.ending.utterance_id == e.utterance_id:
                # the turn it ended goes on: a resumed stream heard it again, under a new
                # id, and its end comes again with that id (asr_client/resume.py)
                ch.ending = None
            if ch.eager != e.utterance_id:
                return None
            ch.eager = None
            return TurnResumed(e.channel, e.utterance_id)
        if kind == "speech_event" and response.speech_event.type == _NO_WORDS:
            e = response.speech_event
            ch = self._channels.setdefault(e.channel, _Channel())
            ch.settled = max(ch.settled, e.utterance_id)
            return self._complete(ch)
        if kind == "speech_event" and response.speech_event.type == _ENDED and self._silence:
            # a SILENCE stream's turn ends where its utterance does
            e = response.speech_event
            reason = (
                asr_pb2.EndOfTurn.FINALIZE if e.from_finalize else asr_pb2.EndOfTurn.MAX_SILENCE
            )
            return self._turn_ended(
                asr_pb2.EndOfTurn(
                    offset_s=e.offset_s,
                    channel=e.channel,
                    utterance_id=e.utterance_id,
                    reason=reason,
                )
            )
        if kind == "end_of_turn":
            return self._turn_ended(response.end_of_turn)
        if kind == "result":  # a partial
            r = response.result
            ch = self._channels.setdefault(r.channel, _Channel())
            if self._went_on(ch, r.utterance_id):
                return self._withdraw_split(ch, r.channel)
        return None

    @staticmethod
    def _went_on(ch: _Channel, utterance_id: int) -> bool:
        """Whether the caller went on past an EagerTurn whose final a split made: a later
        utterance of its turn has been heard (a split sends no SPEECH_RESUMED: the eager
        text is that part's final, the proto says, but the turn is not over)."""
        return ch.split_eager is not None and utterance_id > ch.split_eager

    @staticmethod
    def _withdraw_split(ch: _Channel, channel: int) -> TurnResumed:
        assert ch.split_eager is not None
        resumed = TurnResumed(channel, ch.split_eager)
        ch.split_eager = None
        return resumed

    def _turn_ended(self, t: asr_pb2.EndOfTurn) -> Turn | None:
        ch = self._channels.setdefault(t.channel, _Channel())
        if t.utterance_id <= ch.ended:
            # a turn already returned: a resumed stream sends the end of the turn it
            # was in again when the server had not seen it acknowledged
            return None
        ch.ending = t
        # (an end of a later utterance is no sign the caller went on: the rest of the
        # split's pause is an utterance of its own, which ends in NO_WORDS; words are)
        return self._complete(ch)

    @staticmethod
    def _complete(ch: _Channel) -> Turn | None:
        if ch.ending is None or ch.settled < ch.ending.utterance_id:
            return None
        # finals of later utterances (the caller went on before this turn's final came)
        # belong to the next turn
        ended = ch.ending.utterance_id
        turn = Turn(ch.ending, tuple(r for r in ch.finals if r.utterance_id <= ended))
        ch.finals = [r for r in ch.finals if r.utterance_id > ended]
        ch.ending = None
        ch.ended = ended
        if ch.split_eager is not None and ch.split_eager <= ended:
            ch.split_eager = None  # its turn is over: the reply started on it stands
        return turn
