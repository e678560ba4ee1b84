"""Where a turn may end in a pause: the turn model's questions (SEMANTIC streams) and
the eager results sent ahead of the final (streams with eager finals).

In a SEMANTIC stream the turn model is asked at each probe of a pause (vad/turn.py:
150 ms, and again at 600 ms, by default) whether the speaker is done. A yes goes to the
channel's inbox as a ``TurnComplete``, behind the audio not yet handled, and ends the
utterance there if the pause still lasts. The model hears the utterance, after the one
before it when the speaker went on within the longest pause a turn holds.

With eager finals, the final decoded early in a pause is sent as an eager result once
decoded (a SEMANTIC stream's only when the model's first answer says the turn may be
over); if speech resumes, the channel withdraws it (SpeechResumed).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Coroutine

import numpy as np

from asr_server.audio.bandwidth import HIGH_BAND_HZ, BandwidthMeter
from asr_server.engine.base import Hypothesis
from asr_server.engine.text import closed_up
from asr_server.metrics import Metrics
from asr_server.session.types import OutEvent, RecognitionResult, StreamConfig
from asr_server.session.utterance import SAMPLE_RATE
from asr_server.session.utterance_state import TurnComplete, UtteranceState
from asr_server.vad.turn import WINDOW_S as TURN_WINDOW_S
from asr_server.vad.turn import TurnDetection, is_narrowband

logger = logging.getLogger(__name__)

#: SEMANTIC: the turn model hears the previous utterance too when this one began within
#: the longest pause a turn holds (it was cut where the model judged the turn over, and
#: the speaker went on): judged alone, a continuation such as JFK's "ask not" sounds like
#: a whole turn. At most this much of the pause between them is put back, as silence.
TURN_CONTEXT_PAUSE_S = 1.0


class TurnTaking:
    """One channel's turn questions and eager results.

    ``hearing`` tells which utterance the channel is hearing now (an answer about any
    other changes nothing), ``client_ends_turns_first`` whether the stream's client ends
    its turns itself before the model's answer would come, and ``turn_complete`` hands
    a yes to the channel's inbox."""

    def __init__(
        self,
        *,
        channel: int,
        config: StreamConfig,
        server_turn: TurnDetection | None,
        metrics: Metrics,
        emit: Callable[[OutEvent], Awaitable[None]],
        spawn: Callable[[Coroutine[None, None, None]], object],
        hearing: Callable[[], UtteranceState | None],
        client_ends_turns_first: Callable[[], bool],
        turn_complete: Callable[[TurnComplete], None],
        final_as_decoded: Callable[[UtteranceState, Hypothesis], bool] = lambda u, h: True,
    ) -> None:
        self.channel = channel
        self.metrics = metrics
        self._emit = emit
        self._spawn = spawn
        self._hearing = hearing
        self._client_ends_turns_first = client_ends_turns_first
        self._turn_complete = turn_complete
        self._final_as_decoded = final_as_decoded
        self._server_turn = server_turn  # SEMANTIC streams only: the server's thresholds
        #: the previous utterance's audio (the model's window of it) and end
        self._before: tuple[np.ndarray, int] | None = None
        self._window = TURN_WINDOW_S * SAMPLE_RATE
        #: is the speech a phone line's, whatever its rate? (heard up to each first ask:
        #: the utterance id and how much of its audio the meter has had)
        self._bandwidth = BandwidthMeter()
        self._metered = (-1, 0)
        self.narrowband = False
        #: asks whose answer is not in yet (see answers_for): the end of the frame each
        #: was asked at (samples) and when (loop time); set at each answer
        self._open_asks: dict[int, tuple[int, float]] = {}
        self._ask_ids = itertools.count()
        self._answer_came = asyncio.Event()
        self.reconfigure(config)

    def reconfigure(self, config: StreamConfig) -> None:
        """The stream's turn settings (at the start, and at each update of them)."""
        self.config = config
        self._set_thresholds(
            is_narrowband(config.format.sample_rate_hz) or self._bandwidth.narrowband
        )

    def _set_thresholds(self, narrowband: bool) -> None:
        self.narrowband = narrowband
        turn = self._server_turn
        #: the stream's thresholds; None: not a SEMANTIC stream
        self.turn = (
            turn.for_stream(
                self.config.turn_threshold, self.config.eager_threshold, narrowband=narrowband
            )
            if turn
            else None
        )
        # (pause in samples, threshold) of each question to the turn model
        self._probes = [
            (int(ms * SAMPLE_RATE / 1000), threshold)
            for ms, threshold in (self.turn.probes() if self.turn else [])
        ]

    def _meter(self, utt: UtteranceState) -> None:
        """Before a pause's first question: the meter hears the utterance's audio it has
        not had yet; speech with nothing above a phone line's band (an 8 kHz call sent at
        16 kHz) is asked as a phone line is, from this question on."""
        if is_narrowband(self.config.format.sample_rate_hz):
            return  # sent as a phone line: nothing to measure
        utterance_id, had = self._metered
        self._bandwidth.add(utt.audio.since(had if utterance_id == utt.utterance_id else 0))
        self._metered = (utt.utterance_id, len(utt.audio))
        narrowband = self._bandwidth.narrowband
        if narrowband != self.narrowband:
            logger.info(
                "channel %d: speech above %d Hz at %.0f dB against the voice band: turns "
                "are judged as on %s",
                self.channel,
                HIGH_BAND_HZ[0],
                self._bandwidth.high_band_db,
                "a phone line" if narrowband else "full-band audio",
            )
            self._set_thresholds(narrowband)
            if narrowband:
                self.metrics.turn_phone_band.inc()

    @property
    def semantic(self) -> bool:
        return self.turn is not None

    @property
    def judges_pauses(self) -> bool:
        """The turn model is asked at each pause: SEMANTIC, with a threshold an answer can
        meet (at 1 it is not asked, and pauses are held until the client or the longest
        pause ends the turn)."""
        return bool(self._probes)

    # -- the turn model -------------------------------------------------------------------

    def at_pause(self, utt: UtteranceState, silence: int, speech_end: int) -> None:
        """``silence`` samples into a pause that began at ``speech_end``: the model is
        asked once the pause reaches each probe (the answer comes later, see ask)."""
        if utt.probes_asked >= len(self._probes) or silence < self._probes[utt.probes_asked][0]:
            return
        if utt.probes_asked == 0:
            self._meter(utt)
        threshold = self._probes[utt.probes_asked][1]
        first = utt.probes_asked == 0
        utt.probes_asked += 1
        release = self._hold_the_audio(speech_end + silence)
        self._spawn(self._ask(utt, utt.pause, speech_end, threshold, first, release))

    def may_ask_within(self, samples: int) -> bool:
        """Could audio this long, heard from an idle channel, hold a pause the model is
        asked about? (It needs one at least as long as the first ask's.)"""
        return bool(self._probes) and samples >= self._probes[0][0]

    async def answers_for(self, frame_end: int) -> None:
        """Until the audio ending at ``frame_end`` may be heard: once every open ask has
        its answer (a yes handed to turn_complete), or once that audio would have come
        live, as long after the ask as it is after the asked frame. A live client's
        audio so never waits; audio sent ahead of time (in 0.5 s messages, faster than
        real time, a whole file to Recognize) waits for the answer, and the turn ends
        where it would have live. (Speech that resumed in an ask's own message was heard
        before the answer, the answer was dropped, and two sentences were decoded as one
        utterance.)"""
        loop = asyncio.get_running_loop()
        while self._open_asks:
            live_at = max(
                asked_at + (frame_end - asked_end) / SAMPLE_RATE
                for asked_end, asked_at in self._open_asks.values()
            )
            if live_at <= loop.time():
                return
            self._answer_came.clear()
            try:
                async with asyncio.timeout_at(live_at):
                    await self._answer_came.wait()
            except TimeoutError:
                return

    def _hold_the_audio(self, asked_end: int) -> Callable[[], None]:
        """An open ask, at the frame ending at ``asked_end``; the function given back
        closes it (once)."""
        ask = next(self._ask_ids)
        self._open_asks[ask] = (asked_end, asyncio.get_running_loop().time())

        def release() -> None:
            if self._open_asks.pop(ask, None) is not None:
                self._answer_came.set()

        return release

    async def _ask(
        self,
        utt: UtteranceState,
        pause: int,
        speech_end: int,
        threshold: float,
        first: bool,
        release: Callable[[], None],
    ) -> None:
        """Is the turn complete? If so, the channel ends the utterance when it comes to
        this answer, if the pause still lasts."""
        assert self.turn is not None
        try:
            early = utt.speculation
            if early is not None and self._client_ends_turns_first():
                # Beside the final's decode on the same cores, the model slowed it by about
                # 40 ms (a 5.5 s final: 224 -> 262 ms, medians of 9, the Zen 4 machine), and
                # this client's finalize ends the turn before the answer would come anyway:
                # its audio does not wait for this answer either
                release()
                await asyncio.wait([early.task])
            if utt.finalizing or utt.pause != pause or self._hearing() is not utt:
                # the turn ended (the client's finalize) or speech resumed before the
                # question came to be asked: its answer could change nothing
                self.metrics.turn_model_skipped.inc()
                return
            answer = utt.first_answer if first else None
            heard = self._heard(utt)
            try:
                with self.metrics.turn_model.time():
                    verdict = await asyncio.to_thread(self.turn.model.predict, heard)
            except BaseException:
                if answer is not None:
                    answer.cancel()  # no eager result; the error surfaces as before
                raise
            if answer is not None and not answer.done():  # (done: cancelled, speech resumed)
                answer.set_result(verdict.probability)
            utt.turn_probability = verdict.probability
            if verdict.complete(threshold):
                self._turn_complete(
                    TurnComplete(utt.utterance_id, pause, speech_end, verdict.probability)
                )
        finally:
            release()

    def _heard(self, utt: UtteranceState) -> np.ndarray:
        """What the turn model hears: the utterance, after the previous one if the speaker
        went on within the longest pause a turn holds (the model reads the last 8 s)."""
        audio = utt.audio.snapshot()
        before = self._before
        if before is None:
            return audio
        previous, previous_end = before
        gap = utt.audio.start_sample - previous_end
        if not 0 <= gap <= self.config.max_silence_ms * SAMPLE_RATE // 1000:
            return audio
        pause = np.zeros(min(gap, int(TURN_CONTEXT_PAUSE_S * SAMPLE_RATE)), np.float32)
        return np.concatenate([previous, pause, audio])[-self._window :]

    def final_emitted(self, audio: np.ndarray, end_sample: int) -> None:
        """An utterance's final went out: the next utterance's questions hear its end."""
        if self.turn is not None:
            self._before = (audio[-self._window :].copy(), end_sample)

    # -- eager results --------------------------------------------------------------------

    def speculated(self, utt: UtteranceState) -> None:
        """The final of this pause is being decoded early (utt.speculation): with eager
        finals it goes out as an eager result once decoded."""
        if not self.config.eager_finals:
            return
        if self.turn is not None and not self._probes:
            # SEMANTIC with a threshold no answer could meet (1): the model is not asked,
            # and an eager result needs its first answer to reach the eager threshold
            return
        assert utt.speculation is not None
        if self._probes:
            utt.first_answer = asyncio.get_running_loop().create_future()
        self._spawn(self._send_eager(utt, utt.speculation.task, utt.first_answer))

    async def _send_eager(
        self,
        utt: UtteranceState,
        task: asyncio.Task[Hypothesis | None],
        first_answer: asyncio.Future[float] | None,
    ) -> None:
        """The speculative final, once decoded, as an eager result, unless speech resumed
        (the speculation was dropped) or the final is already on its way. SEMANTIC: only
        if the turn model's first answer in this pause reached the eager threshold (else
        eager results would come at every pause, mostly to be withdrawn)."""
        await asyncio.wait([task])
        turn_probability = 0.0
        if first_answer is not None and self.turn is not None:
            await asyncio.wait([first_answer])
            if first_answer.cancelled():
                return
            turn_probability = first_answer.result()
            # sure enough to end the turn: the final itself follows at once
            if not self.turn.eager_threshold <= turn_probability < self.turn.threshold:
                return
        if (
            task.cancelled()
            or task.exception() is not None
            or utt.speculation is None
            or utt.speculation.task is not task
            or utt.finalizing
        ):
            return
        hyp = task.result()
        committed = utt.agreement.committed_text
        if hyp is None or hyp.rejected or not hyp.text or not hyp.text.startswith(committed):
            return
        if not self._final_as_decoded(utt, hyp):
            return  # its final will be decoded again (in the language the stream turns to)
        utt.sent_eager()
        await self._emit(
            RecognitionResult(
                is_final=False,
                # the eager text may be withdrawn: only what was committed is stable
                stable_text=committed,
                # (as its final will be written: see ChannelRecognizer._emit_final)
                unstable_text=closed_up(hyp.text, hyp.language)
                if not committed
                else hyp.text[len(committed) :].strip(),
                start_s=utt.audio.start_sample / SAMPLE_RATE,
                end_s=utt.speculation.end / SAMPLE_RATE,
                utterance_id=utt.utterance_id,
                channel=self.channel,
                language=hyp.language,
                eager=True,
                turn_probability=turn_probability,
                confidence=hyp.confidence,
            )
        )
        self.metrics.results.labels("eager").inc()
