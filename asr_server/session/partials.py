"""Partials of the utterance a channel is hearing: when to ask the engine for one, and
what of its answer to send.

While someone speaks, a partial is asked every ``partial_interval`` of new speech,
without waiting for it (a newer request replaces a queued one in the scheduler). With
``commit_partials`` the words two consecutive partials agree on are committed
(session/agreement.py): they are the stable text, and the final is decoded after them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine

from asr_server.engine.base import DecodeKind, DecodeRequest
from asr_server.engine.scheduler import EngineScheduler
from asr_server.engine.text import closed_up
from asr_server.metrics import Metrics
from asr_server.session.finals import FinalDecoder
from asr_server.session.inbox import now
from asr_server.session.language import LanguageTracker
from asr_server.session.types import OutEvent, RecognitionResult, StreamConfig
from asr_server.session.utterance import SAMPLE_RATE
from asr_server.session.utterance_state import UtteranceState

#: how close to the utterance limit partials start asking for word timing (for a clean split)
TIMING_LEAD_S = 4.0
#: until an utterance's first partial has words, the next ask goes out as soon as the
#: previous one is back (one at a time) and this much new audio has arrived. The first
#: word becomes readable a quarter second or so into speech; a fixed 200 ms grid of asks
#: (start + 120 ms, + 320 ms, ...) showed it up to 200 ms late. Under load decodes take
#: longer and the asks thin out by themselves.
FIRST_PARTIAL_STEP_S = 0.05
#: hypotheses of less audio than this are shown but never committed: Whisper guesses on
#: a syllable or two (JFK's "ask not" after a pause came out as a committed "S")
MIN_COMMIT_AUDIO_S = 1.5


class Partials:
    """One channel's partials. ``hearing`` tells which utterance the channel is hearing
    now: an answer for any other (it ended, or was split) is dropped."""

    def __init__(
        self,
        *,
        channel: int,
        scheduler: EngineScheduler,
        metrics: Metrics,
        emit: Callable[[OutEvent], Awaitable[None]],
        spawn: Callable[[Coroutine[None, None, None]], object],
        finals: FinalDecoder,
        language: LanguageTracker,
        coalesce_key: object,
        partial_interval_s: float,
        max_utterance: int,
        commits: bool,
        hearing: Callable[[], UtteranceState | None],
    ) -> None:
        self.channel = channel
        self.scheduler = scheduler
        self.metrics = metrics
        self._emit = emit
        self._spawn = spawn
        self._finals = finals
        self._language = language
        self._key = coalesce_key
        self._interval = int(partial_interval_s * SAMPLE_RATE)
        self._first_step = int(FIRST_PARTIAL_STEP_S * SAMPLE_RATE)
        self._timing_from = max_utterance - int(TIMING_LEAD_S * SAMPLE_RATE)
        self._commits = commits
        self._hearing = hearing
        #: partials decoded and waiting for room on the stream's way out
        self._waiting_to_send = 0

    def due(self, utt: UtteranceState) -> bool:
        if self._waiting_to_send:
            # the client does not take the results as they come: a partial now would only
            # wait too, with its copy of the utterance's audio (a stream whose client
            # stopped reading piled up hundreds: 220 MB for one of 8 channels)
            return False
        if utt.speculation is not None:
            # the final is being decoded early in this pause: a partial now would be
            # thrown away unless speech resumed, and it would slow that decode down
            return False
        if utt.partials_sent:
            return utt.samples_since_partial >= self._interval
        return not utt.first_ask_in_flight and utt.samples_since_partial >= self._first_step

    def ask(self, utt: UtteranceState, config: StreamConfig) -> None:
        """A partial of all the utterance's audio so far; it is sent when it comes back."""
        utt.samples_since_partial = 0
        request = DecodeRequest(
            utt.audio.snapshot(),
            DecodeKind.PARTIAL,
            language=self._language.decode_language(),
            languages=config.languages,
            prompt=self._finals.prompt(),
            prefix=utt.agreement.committed_text,
            word_timestamps=len(utt.audio) >= self._timing_from,
        )
        first = utt.partials_sent == 0
        utt.first_ask_in_flight = first
        self._spawn(self._partial(utt, request, first))

    async def _partial(self, utt: UtteranceState, request: DecodeRequest, first: bool) -> None:
        try:
            hyp = await self.scheduler.decode(request, coalesce_key=self._key, urgent=first)
        finally:
            if first:
                utt.first_ask_in_flight = False
        if hyp is None or hyp.rejected or utt.finalizing or utt is not self._hearing():
            return
        if self._finals.echoes_prompt(hyp.text, request.prefix):
            return  # the client's prompt read back over a sound without speech
        if request.audio.size <= utt.partial_samples:
            return  # two workers ran this stream's partials and the newer one won
        utt.partial_samples = request.audio.size
        if utt.speculation is not None:
            # a final is being decoded with the current committed prefix: committing more
            # now could contradict it; the partial resumes if speech does
            return
        words = hyp.text.split()
        timings = hyp.words if len(hyp.words) == len(words) else None
        commit = self._commits and request.audio.size >= MIN_COMMIT_AUDIO_S * SAMPLE_RATE
        if not utt.agreement.update(words, timings, commit=commit):
            return
        utt.partial_language = hyp.language
        stable, unstable = utt.agreement.committed_text, utt.agreement.tail_text
        text = f"{stable} {unstable}".strip()
        if not text or text == utt.last_partial_text:
            return
        utt.last_partial_text = text
        utt.hear(text, request.audio.size)
        if utt.partials_sent == 0:
            self.metrics.time_to_first_partial.observe(max(0.0, now() - utt.speech_arrived))
        utt.partials_sent += 1
        result = RecognitionResult(
            is_final=False,
            stable_text=stable,
            unstable_text=closed_up(unstable, hyp.language),
            start_s=utt.audio.start_sample / SAMPLE_RATE,
            end_s=(utt.audio.start_sample + request.audio.size) / SAMPLE_RATE,
            utterance_id=utt.utterance_id,
            channel=self.channel,
            language=hyp.language,
        )
        del request  # (its audio is not held while the result waits)
        self._waiting_to_send += 1
        try:
            await self._emit(result)
        finally:
            self._waiting_to_send -= 1
        self.metrics.results.labels("partial").inc()
