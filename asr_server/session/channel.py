"""Recognition of one audio channel: VAD → utterance audio → engine → events.

The processor pulls 16 kHz audio from the channel's bounded inbox and runs the
endpointer. While someone speaks it asks for partials (session/partials.py). In a
pause the final is decoded early, ahead of the endpoint (and, in SEMANTIC streams,
the turn model is asked whether the turn is over: session/turn_taking.py, which also
sends eager results). When the endpointer hears the end of speech — or the turn
model, or the client, ends it, or the audio ends — the processor *waits* for the
final: if the engine is behind, the inbox fills and the reader stops reading, which
is the backpressure. Each final is decoded after the previous one when that helps
(session/carry.py); what is known about the utterance being heard lives in
session/utterance_state.py.

An utterance longer than ``max_utterance`` is split after the last committed word
when their timing is known, else at the quietest 100 ms of its last third: in
speech without a pause there, that can be a stop consonant's closure inside a word
("coun|try" read as "country. / tree.", max_utterance_ms 2000 on LibriSpeech,
2026-12-06), which only a split at a word's edge avoids. The audio after the cut
begins the next utterance; nothing is dropped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine

import numpy as np

from asr_server.engine.base import Hypothesis, WordTiming
from asr_server.engine.scheduler import EngineScheduler
from asr_server.engine.text import closed_up
from asr_server.metrics import Metrics
from asr_server.session.agreement import LocalAgreement
from asr_server.session.finals import FinalDecoder
from asr_server.session.inbox import AudioChunk, AudioInbox, DetectedEvents, EndOfAudio, now
from asr_server.session.language import LanguageTracker
from asr_server.session.partials import Partials
from asr_server.session.turn_taking import TurnTaking
from asr_server.session.types import (
    ChannelStart,
    ConfigUpdate,
    EndOfTurn,
    Finalize,
    Finalized,
    NoWords,
    OutEvent,
    RecognitionResult,
    SpeechBoundary,
    SpeechResumed,
    StreamConfig,
    TurnEndReason,
)
from asr_server.session.utterance import SAMPLE_RATE, UtteranceAudio
from asr_server.session.utterance_state import EarlyFinal, TurnComplete, UtteranceState
from asr_server.vad.base import SpeechCheck
from asr_server.vad.endpointer import Endpointer, SpeechAudio, SpeechEnded, SpeechStarted
from asr_server.vad.turn import TurnDetection

logger = logging.getLogger(__name__)

#: trailing silence kept after the last voiced frame: the end of a word fades slowly
TRAILING_PAD_S = 0.2
#: trailing silence after which the final is decoded speculatively, before the endpoint
#: confirms it; if speech resumes the result is dropped (or set aside, below). Hides
#: decode time from latency.
SPECULATE_AFTER_S = 0.2
#: an early final whose pause a short sound broke is kept this long past its end, in
#: case that sound was no speech (see UtteranceState.set_aside); a longer one is speech
SET_ASIDE_MAX_S = 1.0
#: audio before a set-aside final's end that the second opinion hears first, unjudged:
#: Silero judges a frame by what it heard before, and with only a quarter second of the
#: word before it, it took a word's fading end (0.7–0.9 in context) for silence
SECOND_OPINION_LEAD_IN_S = 1.0
#: a length-limit split after the committed words cuts where they end only if that is at
#: least this far into the utterance (_split); earlier, the whole utterance is decoded
MIN_SPLIT_S = 1.0
#: a long utterance is split at a pause (see _splits_at_pause) only if the pause lasted
#: this much longer than the final's trailing pad: the voice detector hears a word's
#: unvoiced onset ("th", "s") late, and a cut just before the voiced part left that onset
#: in the first part's audio, where Whisper read its last phrase again ("on the lower
#: case, on the lower case")
SPLIT_PAUSE_MARGIN_S = 0.1
#: in a SILENCE stream whose silence_ms is longer (or a SEMANTIC one whose turn model is
#: not asked), a pause this long (the silence that ends an utterance by default) splits an
#: utterance of any length (see _splits_at_pause)
LONG_PAUSE_SPLIT_S = 0.5
#: no partials once this much trailing silence is heard: silence adds no words (where the
#: final is decoded early in a pause, none once a pause has begun: _partial_silence_cutoff)
PARTIAL_SILENCE_CUTOFF_S = 0.15


#: a client whose finalize came this far into a pause ends its turns before the turn
#: model's answer could (a voice agent's VAD stops at about 200 ms; the model is asked at
#: 150 ms and takes 35-90 ms on one core). In its streams the model waits for the pause's
#: early final instead of running beside its decode (see turn_taking.TurnTaking._ask)
CLIENT_ENDS_TURNS_WITHIN_S = 0.3


class ChannelRecognizer:
    def __init__(
        self,
        *,
        channel: int,
        config: StreamConfig,
        endpointer: Endpointer,
        scheduler: EngineScheduler,
        metrics: Metrics,
        emit: Callable[[OutEvent], Awaitable[None]],
        spawn: Callable[[Coroutine[None, None, None]], object],
        partial_interval_s: float,
        coalesce_key: object,
        context_chars: int = 0,
        agreement: int = 2,
        commit_partials: bool = False,
        carry_max_s: float = 0.0,
        carry_gap_s: float = 0.0,
        split_at_pause_after_s: float = 0.0,
        start: ChannelStart | None = None,
        turn: TurnDetection | None = None,
        early_speculation_s: float = SPECULATE_AFTER_S,
        speech_check: SpeechCheck | None = None,
    ) -> None:
        self.channel = channel
        self.config = config
        self.endpointer = endpointer
        self.scheduler = scheduler
        self.metrics = metrics
        self._emit = emit
        self._max_utterance = int(config.max_utterance_ms * SAMPLE_RATE / 1000)
        self._split_at_pause_after = int(split_at_pause_after_s * SAMPLE_RATE)
        self._split_margin = int(SPLIT_PAUSE_MARGIN_S * SAMPLE_RATE)
        self._agreement = agreement
        self._turns = TurnTaking(
            channel=channel,
            config=config,
            server_turn=turn,
            metrics=metrics,
            emit=emit,
            spawn=spawn,
            hearing=lambda: self._utt,
            client_ends_turns_first=lambda: self._client_ends_turns_first,
            turn_complete=self._queue_turn_complete,
            final_as_decoded=self._final_as_decoded,
        )
        # see _speculate_after
        self._late_speculation = int(SPECULATE_AFTER_S * SAMPLE_RATE)
        self._early_speculation = int(early_speculation_s * SAMPLE_RATE)
        #: the client has sent a finalize: it ends its turns itself (a voice agent, at its
        #: own VAD's stop, 200 ms or so into a pause); on a resumed stream, also one it
        #: sent the last server
        self._client_finalizes = start is not None and start.client_finalizes
        #: the pause (samples of silence heard) in which the client's latest finalize came
        self._client_finalize_pause: int | None = None
        self._client_ends_turns_within = int(CLIENT_ENDS_TURNS_WITHIN_S * SAMPLE_RATE)
        # Where the turn can end early in a pause, a breath or a click that the voice
        # detector takes for speech just after the early final began would otherwise cost
        # a whole decode at the end of the turn: such a final is set aside, and used if a
        # second opinion (Silero, the VAD voice agents use) hears no speech after its end.
        self._speech_check = speech_check
        self._set_aside_max = int(SET_ASIDE_MAX_S * SAMPLE_RATE)
        self._inbox: AudioInbox | None = None
        #: the turn model's yeses, to take before more audio is heard (_answers_first)
        self._answers: deque[TurnComplete] = deque()
        caps = scheduler.engine.capabilities
        # an engine that cannot continue after a forced prefix could not make a final start
        # with words committed from partials: then nothing is committed (all unstable)
        self._commits = commit_partials and caps.prefix_forcing
        start = start or ChannelStart()
        self._trailing_pad = int(TRAILING_PAD_S * SAMPLE_RATE)
        self._next_id = start.next_utterance_id  # ids continue across a resume
        self._resumed_from = start
        # (the audio before it has finals on the client: no utterance takes it)
        endpointer.listen_only_until(start.final_until_sample)
        kept = start.language if start.language in (config.languages or (start.language,)) else ""
        self.language = LanguageTracker(config.language, kept=kept or None)
        self._finals = FinalDecoder(
            config=config,
            scheduler=scheduler,
            metrics=metrics,
            language=self.language,
            carry_max_s=carry_max_s,
            carry_gap_s=carry_gap_s,
            context_chars=context_chars,
            previous_text=start.previous_text,
            speech_check=speech_check,
        )
        self._utt: UtteranceState | None = None
        self._partials = Partials(
            channel=channel,
            scheduler=scheduler,
            metrics=metrics,
            emit=emit,
            spawn=spawn,
            finals=self._finals,
            language=self.language,
            coalesce_key=coalesce_key,
            partial_interval_s=partial_interval_s,
            max_utterance=self._max_utterance,
            commits=self._commits,
            hearing=lambda: self._utt,
        )
        # see settled_sample: the start of an utterance whose final is being decoded, and
        # the endpointer's bound as of the last events this channel finished handling
        self._finalizing_from: int | None = None
        self._idle_bound = 0
        #: the end of the audio the last final decoded (or will): no utterance after it
        #: takes audio from before it (the endpointer holds a raised channel's pause for
        #: the next utterance from its last voiced frame + the trailing pad, and a split at
        #: the length limit may cut further into that pause). On a resumed stream, the
        #: audio the client already has finals for (no utterance starts in it, and none
        #: takes pre-roll from it)
        self._decoded_until = start.final_until_sample
        self._arrivals: deque[tuple[int, float]] = deque(maxlen=4096)  # (end sample, wall time)
        self.position = 0  # samples received into the endpointer

    def _reconfigure(self, config: StreamConfig) -> None:
        """The client's update (StreamingUpdate), from this point of the audio on."""
        self.config = config
        self._turns.reconfigure(config)
        self.endpointer.set_silence_ms(
            config.max_silence_ms if self._turns.semantic else config.silence_ms
        )
        self._finals.reconfigure(config)

    @property
    def _speculate_after(self) -> int:
        """The pause after which the final is decoded ahead of the endpoint; sooner where
        the turn can end early in a pause: in SEMANTIC streams, at the turn model's first
        ask, and in streams whose client finalizes, so that it is ready at the finalize."""
        if self._turns.semantic:
            return self._early_speculation
        if self._client_finalizes:
            return min(self._late_speculation, self._early_speculation)
        return self._late_speculation

    @property
    def _eager_after(self) -> int:
        """The pause at which the early final is offered as an eager result: in SEMANTIC
        streams at the turn model's first ask (it decides), else at the pause the proto
        promises (about 200 ms), also where a finalizing client has it decoded sooner:
        offered sooner, it would be withdrawn at far more of a sentence's short pauses."""
        if self._turns.semantic:
            return self._early_speculation
        return self._late_speculation

    @property
    def _held_pause(self) -> int:
        """SEMANTIC: a pause this long is held open on purpose, never split at (the
        silence that would have ended the utterance in a SILENCE stream)."""
        return self.config.silence_ms * SAMPLE_RATE // 1000

    @property
    def _partial_silence_cutoff(self) -> int:
        """Trailing silence from which no partial is asked. Where the final is decoded
        early in a pause (SEMANTIC streams, streams whose client finalizes), a partial asked
        in the pause's first frames runs beside that decode on the same cores and slows it
        (in a voice-agent run 23 of 138 finals overlapped a partial, 6 of those asked
        39-42 ms into the pause; those finals came a median 70 ms later than the others),
        for a result the final replaces a moment later: there, none once a pause has
        begun. If speech resumes, the partial is asked then."""
        if self._speculate_after < self._late_speculation:
            return 1
        return int(PARTIAL_SILENCE_CUTOFF_S * SAMPLE_RATE)

    @property
    def _client_ends_turns_first(self) -> bool:
        """Whether this stream's client ends its turns itself, sooner into a pause than
        the turn model's answer would come (its latest finalize came within
        CLIENT_ENDS_TURNS_WITHIN_S of pause)."""
        pause = self._client_finalize_pause
        return pause is not None and pause <= self._client_ends_turns_within

    @property
    def _sets_aside(self) -> bool:
        """Whether an early final that a sound broke is set aside (see __init__)."""
        return self._speech_check is not None and (self._turns.semantic or self._client_finalizes)

    @property
    def settled_sample(self) -> int:
        """This channel's first sample (on this call's clock) that may still end up in a
        final: every final for audio before it has been emitted. Resuming clients replay
        from here (Progress.settled_s), so it must never run ahead of an utterance that
        was detected but not yet finalized, including one split at the length limit."""
        if self._finalizing_from is not None:
            return self._finalizing_from
        if self._utt is not None:
            return self._utt.audio.start_sample
        return self._idle_bound

    def _settle(self) -> None:
        """Every event the endpointer produced so far has been handled: between
        utterances, the bound moves up to what a later utterance could still claim."""
        if self._utt is None and not self.endpointer.speaking:
            self._idle_bound = max(self._idle_bound, self.endpointer.unclaimed_from)

    # -- main loop ------------------------------------------------------------------------

    async def run(self, inbox: AudioInbox) -> None:
        self._inbox = inbox
        try:
            await self._run(inbox)
        finally:
            if self._utt is not None:
                self._utt.drop_speculation()
                self.metrics.speaking_channels.dec()

    def carry_replayed_final(self, audio: np.ndarray, end_sample: int) -> None:
        """A resumed channel's last final, replayed by its client (``ChannelStart``): the
        next final is decoded after it, and the turn model's questions hear its end, as
        on the uncut stream."""
        start = self._resumed_from
        language = start.language or self.language.decode_language()
        self._finals.carry_replayed(audio, end_sample, start.previous_text, language)
        self._turns.final_emitted(audio, end_sample)

    def take_inline(self, inbox: AudioInbox, chunk: AudioChunk) -> bool:
        """Run voice detection on ``chunk`` now, on the reader's turn, if this channel is
        idle: nobody speaking, and the processor waiting on an empty inbox (so nothing
        is pending before this chunk). Any events go to the processor through the inbox.

        Most open calls are silent most of the time; this spares each of their messages
        the hand-over to the processor task. Returns False when the chunk must be queued.
        """
        if (
            self._utt is not None
            or self.endpointer.speaking
            or self.endpointer.detector.blocking
            or not inbox.consumer_waiting
            # an utterance could start, pause and be asked about within it: the channel
            # hears it a frame at a time (_feed), so that no later audio comes first
            or self._turns.may_ask_within(chunk.samples.size)
        ):
            return False
        self._account(chunk)
        events = self.endpointer.feed(chunk.samples)
        if events:
            inbox.put_event(DetectedEvents(events))
        else:
            self._settle()
        return True

    def _account(self, chunk: AudioChunk) -> None:
        self.position += chunk.samples.size
        self._arrivals.append((self.position, chunk.arrived))
        self.metrics.audio_processed.inc(chunk.samples.size / SAMPLE_RATE)

    async def _run(self, inbox: AudioInbox) -> None:
        while True:
            item = await inbox.get()
            if isinstance(item, AudioChunk):
                self._account(item)
                await self._feed(item.samples)
            elif isinstance(item, DetectedEvents):
                await self._handle(item.events)
            elif isinstance(item, EndOfAudio):
                await self._answers_first(self.position)
                await self._handle(
                    await self._vad(self.endpointer.flush), TurnEndReason.END_OF_AUDIO
                )
                if self._utt is not None:  # ended inside speech
                    await self._finalize(self.endpointer.position)
                self._idle_bound = self.position  # nothing more can come
                return
            elif isinstance(item, ConfigUpdate):
                self._reconfigure(item.config)
            else:
                await self._client_finalize(item)
            self._settle()

    async def _feed(self, samples: np.ndarray) -> None:
        """Voice detection over ``samples``, and what it finds. A SEMANTIC stream's audio
        is heard a detector frame at a time, each frame no sooner than it would have come
        live while the turn model has not answered an ask made before it
        (_answers_first): the turn ends where it would have live whether the audio came
        in 20 ms messages or 0.5 s ones, faster than real time or to Recognize."""
        if not self._turns.semantic:
            await self._handle(await self._vad(self.endpointer.feed, samples))
            return
        if self._utt is None and self.endpointer.feed_if_quiet(samples):
            return  # a quiet line's audio, in one piece as before: no ask can come of it
        frame = self.endpointer.detector.frame_samples
        first = self.position - samples.size  # (the chunk is accounted for already)
        for start in range(0, samples.size, frame):
            piece = samples[start : start + frame]
            await self._answers_first(first + start + piece.size)
            await self._handle(await self._vad(self.endpointer.feed, piece))

    async def _answers_first(self, frame_end: int) -> None:
        """The turn model's answers to asks already made, before audio that would have
        come after them live (TurnTaking.answers_for): a yes ends the turn here (its copy
        in the inbox then finds it ended, and does nothing)."""
        await self._turns.answers_for(frame_end)
        while self._answers:
            await self._turn_complete(self._answers.popleft())

    async def _client_finalize(self, request: Finalize) -> None:
        """The client's finalize: the utterance open now ends here, its final is sent,
        and then the acknowledgement, so that a client (a bridge answering Deepgram's
        ``from_finalize``, a push-to-talk app) need not guess which final answered it."""
        # from now on the final's decode starts early in each pause
        self._client_finalizes = True
        if self._utt is not None and self._utt.pause_heard:
            self._client_finalize_pause = self._utt.pause_heard
        # speech the endpointer follows unreported: a resumed channel's last final,
        # replayed with the finalize that ended it (Endpointer.listen_only_until)
        unreported_cut_at = self.endpointer.speech_going_on_until if self._utt is None else None
        await self._handle(self.endpointer.force_end(), TurnEndReason.FINALIZE)
        if unreported_cut_at is not None:
            self._finals.replayed_final_cut_in_speech(unreported_cut_at)
        self._settle()  # the acknowledgement's progress: past the final it follows
        latest = self._next_id - 1 if self._next_id > 0 else None
        await self._emit(Finalized(self.position / SAMPLE_RATE, self.channel, latest))
        self.metrics.speech_events.labels("finalized").inc()
        self.metrics.finalize_answer.observe(now() - request.arrived)

    async def _vad(self, fn, *args):  # type: ignore[no-untyped-def]
        if self.endpointer.detector.blocking:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    async def _handle(
        self,
        events: list,  # type: ignore[type-arg]
        ended_by: TurnEndReason = TurnEndReason.MAX_SILENCE,
    ) -> None:
        """``ended_by``: what a speech end among ``events`` means for a SEMANTIC turn
        (the endpointer's own silence limit there is the longest pause held open)."""
        for ev in events:
            if isinstance(ev, SpeechStarted):
                await self._start(ev.start_sample, ev.onset_sample)
            elif isinstance(ev, SpeechAudio):
                await self._audio(ev)
            elif isinstance(ev, SpeechEnded):
                await self._end(ev.end_sample, ended_by)
            elif isinstance(ev, TurnComplete):
                await self._turn_complete(ev)

    # -- utterance life cycle -------------------------------------------------------------

    async def _start(self, start_sample: int, onset_sample: int) -> None:
        """A new utterance; the event reports the onset, the audio keeps the pre-roll too
        (none of what the last final decoded: _audio leaves that out)."""
        start_sample = max(start_sample, self._decoded_until)
        onset_sample = max(onset_sample, start_sample)
        utt = self._new_utterance(UtteranceAudio(start_sample), self._arrival(onset_sample))
        self._utt = utt
        self.metrics.speaking_channels.inc()
        await self._emit(
            SpeechBoundary(True, onset_sample / SAMPLE_RATE, self.channel, utt.utterance_id)
        )
        self.metrics.speech_events.labels("started").inc()

    async def _audio(self, ev: SpeechAudio) -> None:
        utt = self._utt
        if utt is None:
            return
        samples = ev.samples[max(0, utt.audio.end_sample - ev.start_sample) :]
        utt.audio.append(samples)
        utt.samples_since_partial += samples.size
        if (
            ev.trailing_silence == 0
            and self._turns.judges_pauses
            and utt.pause_heard >= LONG_PAUSE_SPLIT_S * SAMPLE_RATE
        ):
            # speech resumed after a pause held open that long: a final decode that
            # stops there is read on (FinalDecoder; recorded before a split at the length
            # limit, which hands it to the rest)
            utt.held_resumptions.append(ev.start_sample)
        if len(utt.audio) >= self._max_utterance:
            if ev.trailing_silence and utt.eager_sent and utt.speculation is not None:
                # the limit fell in the pause of an eager result: that result is the
                # final (the proto promises its text), cut where it was decoded to
                await self._split_at_pause(utt, utt.speculation)
                return
            if ev.trailing_silence and self._pause_final_within(utt) is not None:
                # the limit fell in a pause whose final heard the whole pad: cut there
                # and keep that final, as when speech resumes after such a pause
                await self._split_at_pause(utt)
                return
            utt.drop_speculation()
            await self._split()
            return
        aside = utt.set_aside
        if aside is not None and utt.audio.end_sample - aside.end > self._set_aside_max:
            aside.task.cancel()  # too long for a breath: speech did resume
            utt.set_aside = None
        silence = ev.trailing_silence
        if silence == 0 and self._splits_at_pause(utt):
            await self._split_at_pause(utt, utt.speculation if utt.eager_sent else None)
            return
        if silence == 0:
            # speech resumed: the early final is moot (unless that was no speech; but
            # not one sent as an eager result: the client is told below that the speaker
            # went on, and a final ending before that would contradict it)
            if self._sets_aside and not utt.eager_sent:
                utt.set_speculation_aside()
            else:
                utt.drop_speculation()
            if utt.eager_sent:
                utt.eager_sent = False
                await self._emit(
                    SpeechResumed(ev.last_voiced_end / SAMPLE_RATE, self.channel, utt.utterance_id)
                )
                self.metrics.speech_events.labels("resumed").inc()
            if utt.pause_heard:  # a pause ended
                utt.pause += 1
                utt.probes_asked = 0
                utt.pause_heard = 0
        elif ev.last_voiced_end <= utt.audio.start_sample:
            # the rest of a pause the utterance before was split in: no speech of this
            # utterance yet, nothing to decode or to ask the turn model about
            pass
        else:
            utt.pause_heard = silence
            if silence >= self._speculate_after and utt.speculation is None:
                utt.speculation = self._early_final(utt, ev.last_voiced_end, "speculative-final")
            elif self._needs_split_final(utt, silence):
                utt.split_final = self._early_final(utt, ev.last_voiced_end, "split-final")
            speculation = utt.speculation
            if speculation is not None and not speculation.offered and silence >= self._eager_after:
                speculation.offered = True
                self._turns.speculated(utt)
            self._turns.at_pause(utt, silence, ev.last_voiced_end)
        if (
            self.config.interim_results
            and silence < self._partial_silence_cutoff
            and self._partials.due(utt)
        ):
            self._partials.ask(utt, self.config)

    def _early_final(self, utt: UtteranceState, last_voiced_end: int, name: str) -> EarlyFinal:
        """The final of the audio up to the trailing pad (or as much of it as has been
        heard), decoded now, ahead of the endpoint."""
        end = min(utt.audio.end_sample, last_voiced_end + self._trailing_pad)
        early = EarlyFinal(last_voiced_end, end, utt.agreement.committed_text)
        early.task = asyncio.create_task(
            self._finals.decode(utt, *self._finals.request(utt, end), early), name=name
        )
        return early

    def _queue_turn_complete(self, ev: TurnComplete) -> None:
        """The turn model's yes: taken before the next audio heard (_answers_first), or
        from the inbox when the channel is waiting there for more."""
        assert self._inbox is not None
        self._answers.append(ev)
        self._inbox.put_event(DetectedEvents([ev]))

    async def _turn_complete(self, ev: TurnComplete) -> None:
        utt = self._utt
        if utt is None or utt.utterance_id != ev.utterance_id or utt.pause != ev.pause:
            return  # speech resumed (or the utterance ended) since the model was asked
        self.endpointer.force_end()  # it listens for the next utterance from here
        await self._end(ev.speech_end, TurnEndReason.MODEL)

    async def _end(self, end_sample: int, reason: TurnEndReason) -> None:
        utt = self._utt
        if utt is None:
            return
        utt.ended_by_finalize = reason is TurnEndReason.FINALIZE
        # it ends now: a partial coming back while this awaits (the second opinion below,
        # a full output queue) is neither sent after its SPEECH_ENDED nor commits words
        utt.finalizing = True
        # (an utterance split in a pause holds the rest of it: its speech "ended" before
        # it began, and it ends where it began)
        heard_speech = end_sample > utt.audio.start_sample
        end_sample = max(end_sample, utt.audio.start_sample)
        final_end = (
            min(utt.audio.end_sample, end_sample + self._trailing_pad)
            if heard_speech
            else end_sample  # no audio to decode
        )
        kept = utt.set_aside if await self._no_speech_after_set_aside(utt, final_end) else None
        if kept is not None:  # what was heard since was no speech: speech ended before it
            end_sample, final_end = kept.speech_end, kept.end
            self.metrics.early_finals_kept.inc()
        await self._emit(
            SpeechBoundary(
                False,
                end_sample / SAMPLE_RATE,
                self.channel,
                utt.utterance_id,
                from_finalize=utt.ended_by_finalize,
            )
        )
        self.metrics.speech_events.labels("ended").inc()
        if self._turns.semantic:  # SEMANTIC: every utterance that ends ends a turn
            await self._emit(
                EndOfTurn(
                    end_sample / SAMPLE_RATE,
                    self.channel,
                    utt.utterance_id,
                    utt.turn_probability,
                    reason,
                )
            )
        utt.speech_end = end_sample
        if utt.ended_by_finalize and heard_speech:
            # cut mid-word (a push-to-talk release), Whisper hears the fragment's abrupt
            # end as no speech more often than the same words followed by a pause
            utt.missing_pause = max(0, end_sample + self._trailing_pad - final_end)
        speculated = utt.speculation.end if utt.speculation else None
        if kept is None and speculated is not None and end_sample <= speculated < final_end:
            # decoded early in the pause (SEMANTIC, or a client that finalizes), before the
            # whole trailing pad was heard: it has all the speech. (The shorter pause
            # costs a few words in a thousand, for a final about 140 ms sooner:
            # bench/accuracy_breakdown.py, its EARLY variants.)
            final_end = speculated
        await self._finalize(final_end)

    async def _no_speech_after_set_aside(self, utt: UtteranceState, final_end: int) -> bool:
        """Whether the final set aside at a sound in the pause can be the final: the sound
        was no speech (the second opinion hears none between its end and ``final_end``),
        and no words were committed since it was decoded."""
        aside = utt.set_aside
        if (
            aside is None
            or self._speech_check is None
            or aside.prefix != utt.agreement.committed_text
            or not utt.audio.start_sample < aside.end < final_end
        ):
            return False
        audio = utt.audio.snapshot(final_end)
        cut = aside.end - utt.audio.start_sample
        lead_in = audio[max(0, cut - int(SECOND_OPINION_LEAD_IN_S * SAMPLE_RATE)) : cut]
        no_speech = await self._finals.no_speech_in(audio[cut:], lead_in)
        logger.debug(
            "early final to %.3f s (speech to %.3f s) set aside; the turn ended at %.3f s: "
            "Silero hears %s after it",
            aside.end / SAMPLE_RATE,
            aside.speech_end / SAMPLE_RATE,
            final_end / SAMPLE_RATE,
            "no speech" if no_speech else "speech",
        )
        return no_speech

    async def _split(self) -> None:
        """The utterance reached the limit: finalize up to a safe cut, carry the rest over."""
        utt = self._utt
        assert utt is not None
        committed = utt.agreement.committed
        committed_end_s = utt.agreement.committed_end_s
        if committed and committed_end_s is not None and committed_end_s >= MIN_SPLIT_S:
            # the committed words are the final, and the cut goes where they end
            cut = utt.audio.start_sample + int(committed_end_s * SAMPLE_RATE)
            rest = utt.audio.split_off(cut)
            self._decoded_until = max(self._decoded_until, cut)
            await self._emit_final(
                utt, Hypothesis(utt.agreement.committed_text, utt.partial_language)
            )
        elif committed:
            # Committed words without timing (no partial near the limit came back in time)
            # or with timing that cannot be right: any earlier cut could leave committed
            # words' audio to the next utterance too. Or words that end within the first
            # second (partials that kept revising the rest): the cut was pushed to that
            # second, and the speech between was in no final; the whole is decoded.
            rest = utt.audio.split_off(utt.audio.end_sample)
            await self._decode_final(utt)
        else:
            cut = utt.audio.quietest_sample(search_from_s=utt.audio.duration_s * 2 / 3)
            rest = utt.audio.split_off(cut)
            await self._decode_final(utt)
        self._utt = self._new_utterance(rest, self._arrival(rest.start_sample), utt)

    def _long_enough_to_split(self, utt: UtteranceState, speech_end: int) -> bool:
        return (
            self._split_at_pause_after > 0
            and speech_end - utt.audio.start_sample >= self._split_at_pause_after
        )

    def _needs_split_final(self, utt: UtteranceState, silence: int) -> bool:
        """SEMANTIC streams and streams whose client finalizes decode the final early,
        60 ms into a pause, for the turn's end: too short a pad for a cut inside speech
        (it cost words, bench/accuracy_breakdown.py's EARLY variants). In an utterance
        long enough to be split, the final is decoded again once the pause has lasted
        the whole pad, for a split at this pause; the early one stays the turn's final.
        Not where the client finalizes: its own VAD ends the utterance at such a pause
        (a voice agent's, at 200 ms), and that decode would only take a worker; but a
        pause that splits an utterance of any length (_long_pause_splits: a client
        that finalizes on a stream whose silence is long, a bridge's push-to-talk) gets
        it once it is that long."""
        early = utt.speculation
        return (
            early is not None
            and utt.split_final is None
            and not utt.eager_sent
            and silence >= self._trailing_pad
            and early.end - early.speech_end < self._trailing_pad
            and (
                (not self._client_finalizes and self._long_enough_to_split(utt, early.speech_end))
                or self._long_pause_splits(utt)
            )
        )

    def _pause_final(self, utt: UtteranceState) -> EarlyFinal | None:
        """The final of this pause that heard the whole trailing pad, if any."""
        for early in (utt.split_final, utt.speculation):
            if early is not None and early.end - early.speech_end >= self._trailing_pad:
                return early
        return None

    def _pause_final_within(self, utt: UtteranceState) -> EarlyFinal | None:
        """This pause's final, if it heard the whole pad, ends inside the utterance's audio
        and was not sent as an eager result: one to split at."""
        early = self._pause_final(utt)
        if early is None or utt.eager_sent or not self._ends_inside(utt, early):
            return None
        return early

    @staticmethod
    def _ends_inside(utt: UtteranceState, early: EarlyFinal) -> bool:
        """``early`` was decoded to a point inside the utterance's audio: one to cut at."""
        return utt.audio.start_sample < early.end < utt.audio.end_sample

    def _splits_at_pause(self, utt: UtteranceState) -> bool:
        """Speech resumed after a pause in which the final was decoded ahead, with the
        whole trailing pad, and the pause lasted a margin longer: an utterance that long
        is split there.
        Continuous speech (a lecture, a dictation, a fast talker) pauses for 0.2-0.4 s
        between sentences, under the silence that ends an utterance (and SEMANTIC's turn
        model, asked at such a pause, is often unsure of a sentence end): without this
        its utterances ran to the length limit and each final came up to 15 s after its
        first words, and 1-5 s after its last (bench: 231 s of LJ Speech read aloud).
        That final is the first part's final (in SILENCE streams a decode otherwise
        wasted); the next part is decoded after it (the carry), so the phrase keeps its
        context. Not after an eager result of the pause: that is withdrawn instead.
        Nor, in SEMANTIC streams, at a pause as long as the silence that would have ended
        the utterance in a SILENCE stream: that is a pause the turn model held open on
        purpose (a speaker thinking mid-sentence), where the sentence stays whole.
        In a SILENCE stream whose silence_ms is long (a dictation, a bridge whose client
        ends turns itself), or a SEMANTIC one whose turn model is not asked (threshold 1:
        Flux's own turn detection), a pause of LONG_PAUSE_SPLIT_S splits an utterance of
        any length: decoded whole, two sentences a second apart often came out as one, the
        other left out entirely (tiny.en on LibriSpeech pairs, in 7 of 15; faster-whisper
        alone reads them so too). There, a pause whose eager result went out is split too:
        that result is the first part's final, as at the length limit (the proto promises
        its text), where it was withdrawn and the sentences decoded whole."""
        if utt.eager_sent:
            early = utt.speculation
            return (
                early is not None and self._long_pause_splits(utt) and self._ends_inside(utt, early)
            )
        early = self._pause_final_within(utt)
        return (
            early is not None
            and (not self._turns.judges_pauses or utt.pause_heard < self._held_pause)
            and utt.pause_heard >= self._trailing_pad + self._split_margin
            and (self._long_enough_to_split(utt, early.speech_end) or self._long_pause_splits(utt))
        )

    def _long_pause_splits(self, utt: UtteranceState) -> bool:
        return (
            self._split_at_pause_after > 0
            and not self._turns.judges_pauses
            and utt.pause_heard >= LONG_PAUSE_SPLIT_S * SAMPLE_RATE
        )

    async def _split_at_pause(self, utt: UtteranceState, early: EarlyFinal | None = None) -> None:
        """See _splits_at_pause: the final of the audio up to the pause's final's end
        (the speech before it and 200 ms of the pause; ``early``: that final, when it is
        not the pause's own), then the rest is a new utterance, as at the length limit (no
        SPEECH_ENDED: the speaker did not stop for long)."""
        early = early or self._pause_final(utt)
        assert early is not None
        rest = utt.audio.split_off(early.end)
        utt.speech_end = early.speech_end  # (for the latency metric)
        self.metrics.pause_splits.inc()
        await self._decode_final(utt)
        self._utt = self._new_utterance(rest, self._arrival(rest.start_sample), utt)

    def _new_utterance(
        self, audio: UtteranceAudio, speech_arrived: float, split: UtteranceState | None = None
    ) -> UtteranceState:
        """``split``: the utterance ``audio`` was split off from (its pauses held open
        after the cut are this one's)."""
        utt = UtteranceState(
            self._next_id,
            audio,
            speech_arrived=speech_arrived,
            agreement=LocalAgreement(self._agreement),
        )
        if split is not None:
            utt.held_resumptions = [at for at in split.held_resumptions if at > audio.start_sample]
        self._next_id += 1
        return utt

    async def _finalize(self, end_sample: int) -> None:
        utt = self._utt
        if utt is None:
            return
        self._utt = None
        self.metrics.speaking_channels.dec()
        utt.audio.split_off(end_sample)  # drop trailing silence past the pad
        self._finalizing_from = utt.audio.start_sample
        try:
            await self._decode_final(utt)
        finally:
            # what was settled while it was decoded stays settled (settled_s never goes
            # back): the idle bound had not moved since before the utterance began
            self._idle_bound = max(self._idle_bound, self._finalizing_from)
            self._finalizing_from = None

    async def _decode_final(self, utt: UtteranceState) -> None:
        self._decoded_until = max(self._decoded_until, utt.audio.end_sample)
        utt.finalizing = True
        utt.drop_first_answer()  # the final is on its way: an eager result is moot now
        if len(utt.audio) == 0:
            utt.drop_speculation()
        elif await self._final_of(utt):
            return
        # no final comes for this utterance: say so, so that nobody waits for one (an
        # agent whose turn began with a partial's words, an OpenAI client's item)
        await self._emit(
            NoWords(utt.audio.end_sample / SAMPLE_RATE, self.channel, utt.utterance_id)
        )

    async def _final_of(self, utt: UtteranceState) -> bool:
        """Decode and send the utterance's final; False if it has no words."""
        early = utt.take_early_final(utt.audio.end_sample)
        # decoded while the endpoint was being confirmed (None: set aside before it was
        # done, and it needs another decode)
        hyp = await early if early is not None else None
        if hyp is None:
            hyp = await self._finals.decode(utt, *self._finals.request(utt))
        # a final without words (a noise Whisper rejected) is no speech to judge the
        # stream's language on, however sure detection was of it
        if hyp is not None and not hyp.rejected and hyp.text:
            hyp = await self._in_stream_language(utt, hyp)
        return hyp is not None and await self._emit_final(utt, hyp)

    def _final_as_decoded(self, utt: UtteranceState, hyp: Hypothesis) -> bool:
        """Whether the speculative final ``hyp`` would be the final as it is: not decoded
        again in a language the stream turns to on it (``_in_stream_language``). An eager
        result must be its final's text; one in the old language was followed by a final
        in the new."""
        early = utt.speculation
        if not hyp.language_scores or early is None:
            return True
        speech_s = (early.end - utt.audio.start_sample) / SAMPLE_RATE
        language = self.language.peek_final_language(hyp.language_scores, speech_s)
        return language is None or language == hyp.language

    async def _in_stream_language(self, utt: UtteranceState, hyp: Hypothesis) -> Hypothesis | None:
        """The final in the language the stream keeps: detection on this final updates
        it (language.py); a final decoded in another language is decoded again."""
        scores = hyp.language_scores
        language = self.language.final_language(scores, len(utt.audio) / SAMPLE_RATE)
        if language is not None and language != hyp.language:
            again = await self._finals.decode(utt, *self._finals.request(utt, language=language))
            if again is None:
                return None
            hyp = again
        if not scores:
            return hyp
        return dataclasses.replace(hyp, language_scores=scores)

    async def _emit_final(self, utt: UtteranceState, hyp: Hypothesis) -> bool:
        """Send ``hyp`` as the utterance's final; False if it has no words."""
        utt.finalizing = True
        if hyp.rejected or not hyp.text:
            return False
        offset = utt.audio.start_sample / SAMPLE_RATE
        end_s = utt.audio.end_sample / SAMPLE_RATE
        # (times within the utterance's audio, on the stream's clock: never past its end,
        # not even by the last bit of a float sum)
        words = [
            WordTiming(
                w.word, min(offset + w.start_s, end_s), min(offset + w.end_s, end_s), w.probability
            )
            for w in hyp.words
        ]
        if self.config.word_timestamps and not words:
            words = [
                WordTiming(w, offset + t.start_s, min(offset + t.end_s, end_s), t.probability)
                for w, t in zip(
                    utt.agreement.committed, utt.agreement.committed_timing, strict=True
                )
                if t is not None
            ]
        await self._emit(
            RecognitionResult(
                is_final=True,
                # (the committed text, sent as it was, is kept as it was)
                stable_text=closed_up(hyp.text, hyp.language)
                if not utt.agreement.committed
                else hyp.text,
                unstable_text="",
                start_s=offset,
                end_s=end_s,
                utterance_id=utt.utterance_id,
                channel=self.channel,
                language=hyp.language,
                language_probability=LanguageTracker.probability(hyp.language_scores, hyp.language),
                words=words,
                from_finalize=utt.ended_by_finalize,
                confidence=hyp.confidence,
            )
        )
        self.metrics.results.labels("final").inc()
        if hyp.avg_logprob is not None:
            self.metrics.final_confidence.observe(hyp.confidence)
        audio = utt.audio.snapshot()
        # (speech still going at a finalize's cut: none of the final's pause was heard)
        cut_in_speech = utt.missing_pause >= self._trailing_pad
        self._finals.final_emitted(audio, utt.audio.end_sample, hyp, cut_in_speech)
        self._turns.final_emitted(audio, utt.audio.end_sample)
        speech_end = utt.audio.end_sample if utt.speech_end is None else utt.speech_end
        latency = max(0.0, now() - self._arrival(speech_end))
        self.metrics.final_latency.observe(latency)
        logger.debug(
            "final of utterance %d (%.2f-%.2f s), %.0f ms after its speech ended: %s "
            "(latest partial, of %.2f s: %r)",
            utt.utterance_id,
            offset,
            utt.audio.end_sample / SAMPLE_RATE,
            latency * 1000,
            hyp.text,
            utt.partial_samples / SAMPLE_RATE,
            utt.last_partial_text,
        )
        return True

    # -- helpers --------------------------------------------------------------------------

    def _arrival(self, sample: int) -> float:
        """Wall time at which audio position ``sample`` arrived (for latency metrics)."""
        for end, arrived in self._arrivals:
            if end >= sample:
                return arrived
        return now()
