"""What a channel knows about the utterance it is hearing, beyond its audio: the
partials asked and heard, the finals decoded early in its pauses, and the turn model's
questions about those pauses (SEMANTIC streams)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from asr_server.engine.base import Hypothesis, WordTiming
from asr_server.engine.text import spoken_words
from asr_server.session.agreement import LocalAgreement
from asr_server.session.utterance import UtteranceAudio


@dataclass(frozen=True)
class TurnComplete:
    """The turn model's yes for a pause, queued behind the audio the channel has not yet
    handled (speech may have resumed in it)."""

    utterance_id: int
    pause: int
    speech_end: int  # the sample where the pause began
    probability: float


@dataclass
class EarlyFinal:
    """A final decoded ahead of the endpoint, of the audio up to ``end``."""

    speech_end: int  # the end of the last voiced frame before it
    end: int
    prefix: str  # the committed text it was decoded after
    task: asyncio.Task[Hypothesis | None] = field(init=False)
    started: bool = False  # the engine is decoding it: it costs nothing more to keep
    set_aside: bool = False  # see UtteranceState.set_aside
    offered: bool = False  # offered as an eager result (TurnTaking.speculated)

    def mark_started(self) -> None:
        self.started = True


@dataclass
class UtteranceState:
    utterance_id: int
    audio: UtteranceAudio
    speech_arrived: float  # wall time when the audio where speech starts arrived
    agreement: LocalAgreement = field(default_factory=LocalAgreement)
    samples_since_partial: int = 0
    partials_sent: int = 0
    first_ask_in_flight: bool = False  # until a partial is sent, one ask at a time
    last_partial_text: str = ""
    #: audio covered by the newest partial decoded; an older one finishing later is stale
    partial_samples: int = 0
    #: the partial the final's checks compare it with (``heard``), and the audio it covered
    heard_text: str = ""
    heard_samples: int = 0
    finalizing: bool = False
    #: the client's finalize ended it (its final says so: Result.from_finalize)
    ended_by_finalize: bool = False
    #: samples of the final's trailing pause its audio lacks (a finalize mid-word, or
    #: early in a pause): decoded as silence after it (FinalDecoder.request)
    missing_pause: int = 0
    partial_language: str = ""
    #: where the endpointer heard speech end (for the latency metric); None = end of audio
    speech_end: int | None = None
    #: the final decoded ahead of the endpoint in the current pause
    speculation: EarlyFinal | None = None
    #: where the speculation heard less than the whole trailing pad (SEMANTIC streams and
    #: streams whose client finalizes), in an utterance long enough to be split at this
    #: pause: its final with the whole pad, the first part's final if the pause splits it
    split_final: EarlyFinal | None = None
    #: an early final whose pause ended when the voice detector heard a sound: if that
    #: was a breath or a click (the second opinion hears no speech after this final's
    #: end), a finalize soon after can take it instead of decoding everything again
    set_aside: EarlyFinal | None = None
    #: SEMANTIC: pauses are numbered (a new one each time speech resumes); the turn model
    #: is asked at each probe of a pause, and its answer counts only while that pause lasts
    pause: int = 0
    pause_heard: int = 0  # samples of silence heard so far in this pause (0: speaking)
    #: SEMANTIC: where speech resumed after each pause of 0.5 s or longer held open
    #: inside the utterance (see FinalDecoder, _read_past_held_pauses)
    held_resumptions: list[int] = field(default_factory=list)
    #: rests read on from such a resumption that stopped at a later one: (text, words on
    #: the utterance's clock), by the resumption and language (each final decoded again
    #: reuses them)
    read_on: dict[tuple[int, str], tuple[str, list[WordTiming]]] = field(default_factory=dict)
    probes_asked: int = 0  # in this pause
    turn_probability: float = 0.0  # the model's latest answer
    #: an eager result of the current speculation was sent (withdrawn if speech resumes)
    eager_sent: bool = False
    #: SEMANTIC with eager finals: the turn model's first answer in the speculation's
    #: pause; the eager result waits for it and goes out only if the turn may be over
    first_answer: asyncio.Future[float] | None = None

    def hear(self, text: str, samples: int) -> None:
        """A partial of the first ``samples`` of the utterance read ``text``. It becomes
        what the final is checked against (the newest partial heard the most), unless it
        has fewer than half the words of the one before: then Whisper's greedy decode
        stopped short ("The" for 2 s of "the aforementioned Gutenberg Bible", after a
        partial of 1.5 s had it), and the fuller one is the better witness."""
        if len(spoken_words(text)) * 2 < len(spoken_words(self.heard_text)):
            return
        self.heard_text, self.heard_samples = text, samples

    def drop_speculation(self) -> None:
        """Every early final is moot (and cancelled, if its decode has not started)."""
        for early in (self.speculation, self.set_aside, self.split_final):
            if early is not None:
                early.task.cancel()
        self.speculation = self.set_aside = self.split_final = None
        self.drop_first_answer()

    def sent_eager(self) -> None:
        """The early final went out as an eager result: the final is that text or it is
        withdrawn (SPEECH_RESUMED). One set aside at a sound earlier in the turn can no
        longer be the final, whatever the sound was."""
        self.eager_sent = True
        if self.set_aside is not None:
            self.set_aside.task.cancel()
            self.set_aside = None

    def set_speculation_aside(self) -> None:
        """Speech seems to resume: the early final is no longer the final, unless what
        was heard turns out to be no speech. It is kept only if the engine already began
        it (a queued one is dropped, as it would have been), and replaces an older one."""
        early, self.speculation = self.speculation, None
        if self.split_final is not None:  # (only a split takes it, and there was none)
            self.split_final.task.cancel()
            self.split_final = None
        if early is not None and early.started:
            if self.set_aside is not None:
                self.set_aside.task.cancel()
            early.set_aside = True
            self.set_aside = early
        elif early is not None:
            early.task.cancel()
        self.drop_first_answer()

    def take_early_final(self, end: int) -> asyncio.Task[Hypothesis | None] | None:
        """The early final of exactly the audio up to ``end``, if there is one; the
        others are dropped."""
        taken = None
        for early in (self.speculation, self.set_aside, self.split_final):
            if early is not None and early.end == end and taken is None:
                taken = early.task
            elif early is not None:
                early.task.cancel()
        self.speculation = self.set_aside = self.split_final = None
        return taken

    def drop_first_answer(self) -> None:
        """No eager result waits for this pause's first answer any more."""
        if self.first_answer is not None:
            self.first_answer.cancel()
            self.first_answer = None
