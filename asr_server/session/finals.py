"""A channel's finals: each decoded after the previous final when that helps, checked,
and decoded again alone when the carried decode went wrong.

The channel decides *when* an utterance's final is decoded (early in a pause, at the
endpoint, at a finalize); this module decides *what* is decoded: the utterance's audio,
after the previous final's audio and text (session/carry.py) unless that would cost more
than it can mend, with the client's prompt and the channel's recent text as context.
It keeps what the next final needs: the carry and that recent text.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from difflib import SequenceMatcher

import numpy as np

from asr_server.engine.base import DecodeKind, DecodeRequest, Hypothesis, WordTiming
from asr_server.engine.scheduler import EngineScheduler
from asr_server.engine.text import echoes_prompt, spoken_words, without_unheard_loops
from asr_server.metrics import Metrics
from asr_server.session.carry import Carry
from asr_server.session.inbox import now
from asr_server.session.language import LanguageTracker
from asr_server.session.types import StreamConfig
from asr_server.session.utterance import SAMPLE_RATE
from asr_server.session.utterance_state import EarlyFinal, UtteranceState
from asr_server.vad.base import SpeechCheck

logger = logging.getLogger(__name__)

#: a final's looped tail is cut only where the partial heard all but this much
#: of its audio (the final's 0.2 s of pause included): a phrase the speaker said again
#: at the very end would be missing from a partial that stopped earlier
LOOP_CHECK_UNHEARD_S = 0.8
#: a final that stopped at a held pause is read on from this much before speech resumed
#: (the voice detector hears a word's onset late), if at least HELD_REST_MIN_S is left
REST_LEAD_IN = int(0.3 * SAMPLE_RATE)
HELD_REST_MIN_S = 0.3
#: Whisper's languages written without spaces between words (a rest read on is joined
#: to its final without one)
WRITTEN_WITHOUT_SPACES = frozenset({"zh", "yue", "ja", "th", "lo", "km", "my", "bo"})
#: the context a held pause's rest is decoded after (Whisper's prompt holds ~224 tokens)
PROMPT_CHARS = 600


def joined(text: str, more: str, language: str) -> str:
    """``more`` read on after ``text``: with a space, but in a language written without
    them (a stray space after "。" is no decode's)."""
    return f"{text}{'' if language in WRITTEN_WITHOUT_SPACES else ' '}{more}"


def heard_with(heard_text: str, spoken_phrases: tuple[str, ...]) -> list[str]:
    """What a final's loop checks compare it with: its partial's reading (``spoken_words``)
    and, as if heard twice in a row, each phrase the engine found the audio saying twice
    (``Hypothesis.spoken_phrases``). The partial, decoded on less audio, may have looped
    there and been cut to one copy, or read the phrase once; the checks let stand a
    repeat that what they compare with has ("A repeat heard has is the speaker's"),
    and still cut any other loop in the same final. (Before the partial's words: after
    them, they matched the final's start and hid a re-read tail from the check that
    finds it after the last word the two share.)"""
    heard: list[str] = []
    for phrase in spoken_phrases:
        heard += spoken_words(phrase) * 2
    return heard + spoken_words(heard_text)


def within(words: list[WordTiming], duration_s: float) -> list[WordTiming]:
    """``words`` with their times cut at ``duration_s``."""
    return [
        dataclasses.replace(w, start_s=min(w.start_s, duration_s), end_s=min(w.end_s, duration_s))
        for w in words
    ]


class FinalDecoder:
    """Decodes one channel's finals (see the module docstring)."""

    def __init__(
        self,
        *,
        config: StreamConfig,
        scheduler: EngineScheduler,
        metrics: Metrics,
        language: LanguageTracker,
        carry_max_s: float = 0.0,
        carry_gap_s: float = 0.0,
        context_chars: int = 0,
        previous_text: str = "",
        speech_check: SpeechCheck | None = None,
    ) -> None:
        self._config = config
        self._scheduler = scheduler
        self._metrics = metrics
        self._language = language
        caps = scheduler.engine.capabilities
        # carrying the previous final into the next needs prefix forcing
        can_carry = caps.prefix_forcing and caps.context_carry
        self._carry_max = int(carry_max_s * SAMPLE_RATE) if can_carry else 0
        self._carry_gap = int(carry_gap_s * SAMPLE_RATE)
        self._detects_language = caps.language_detection
        self._max_request = int(caps.max_audio_s * SAMPLE_RATE)
        self._carry: Carry | None = None
        # Silero, the second opinion on whether a stretch of audio holds speech (None:
        # not loaded); asked about an utterance whose carried final has no new words
        self._speech_check = speech_check
        self._context_chars = context_chars
        # the end of this channel's previous finals (a resumed stream brings the last one)
        self._context = ""
        if previous_text:
            self._remember(previous_text)

    def final_emitted(
        self, audio: np.ndarray, end_sample: int, hyp: Hypothesis, cut_in_speech: bool = False
    ) -> None:
        """A final went out: the next one may be decoded after it (``audio``: its audio,
        ending at ``end_sample`` on the channel's clock; ``cut_in_speech``: a finalize
        ended it mid-speech)."""
        self._remember(hyp.text)
        self._carry_after(audio, end_sample, hyp.text, hyp.language, cut_in_speech)

    def carry_replayed(
        self, audio: np.ndarray, end_sample: int, text: str, language: str | None
    ) -> None:
        """A resumed stream's previous final (its text already remembered), replayed by
        the client: carried into the next final as ``final_emitted`` would have."""
        self._carry_after(audio, end_sample, text, language or "")

    def replayed_final_cut_in_speech(self, sample: int) -> None:
        """A replayed finalize cut speech at ``sample``: the resumed channel's last final
        (``carry_replayed``), if it ends there, was cut mid-speech, as ``final_emitted``
        would have said on the old server (the rest of a word cut there is then not read
        again as a final of its own)."""
        if self._carry is not None and self._carry.end_sample == sample:
            self._carry = dataclasses.replace(self._carry, cut_in_speech=True)

    def _carry_after(
        self,
        audio: np.ndarray,
        end_sample: int,
        text: str,
        language: str,
        cut_in_speech: bool = False,
    ) -> None:
        if text and 0 < audio.size <= self._carry_max:
            self._carry = Carry(audio, end_sample, text, language, cut_in_speech)
        else:  # (a longer one would need word timing to carry only its end)
            self._carry = None

    def request(
        self, utt: UtteranceState, end_sample: int | None = None, language: str | None = None
    ) -> tuple[DecodeRequest, Carry | None]:
        """The final's decode, and what it carries from the previous final; ``language``:
        again in that language, without the partials' committed text (it was decoded in
        another one). An utterance a finalize cut short of its trailing pause is decoded
        with the rest of that pause as silence (``missing_pause``)."""
        decode_language = language or self._language.decode_language()
        detect = language is None and self._language.detecting
        audio = utt.audio.snapshot(end_sample)
        if utt.missing_pause and (end_sample is None or end_sample >= utt.audio.end_sample):
            audio = np.concatenate([audio, np.zeros(utt.missing_pause, np.float32)])
        prefix = "" if language else utt.agreement.committed_text
        carry = self._carry
        if (
            carry is None
            or language
            # detection must hear this utterance alone, or a change of language is missed
            or (detect and self._detects_language)
            or utt.audio.start_sample - carry.end_sample > self._carry_gap
            or (decode_language or carry.language) != carry.language
            or carry.audio.size + audio.size > self._max_request
        ):
            carry = None
        elif self._scheduler.finals_waiting:
            # the engine is behind on finals: carried, this one would cost about twice as
            # much (twice the audio, the text forced a token at a time, now and then a
            # second decode) and every final queued behind it would wait for that.
            # Context backs off under load as partials do (docs/call-center.md).
            self._metrics.carry_skipped_under_load.inc()
            carry = None
        if carry is not None:
            audio = np.concatenate([carry.audio, audio])
            prefix = f"{carry.forced} {prefix}".strip()
        request = DecodeRequest(
            audio,
            DecodeKind.FINAL,
            language=decode_language,
            languages=self._config.languages,
            detect=detect,
            prompt=self.prompt(),
            prefix=prefix,
            # where a pause was held open, the final's words tell whether it read on
            # after it (_read_past_held_pauses)
            word_timestamps=self._config.word_timestamps or bool(utt.held_resumptions),
        )
        return request, carry

    async def decode(
        self,
        utt: UtteranceState,
        request: DecodeRequest,
        carry: Carry | None,
        early: EarlyFinal | None = None,
    ) -> Hypothesis | None:
        """The final's hypothesis; ``early``: decoded ahead of the endpoint, and then None
        if it was set aside before it was done (it would need another engine call, which
        the finalize makes itself if it comes to that)."""
        hyp = await self._decode(utt, request, carry, early)
        if hyp is None or hyp.rejected:
            return hyp
        if self.echoes_prompt(hyp.text, request.prefix):
            return dataclasses.replace(hyp, text="", words=[], rejected=True)
        own_audio = self._own_audio(utt, request, carry)
        hyp = self._without_unheard_loops(utt, hyp, own_audio)
        if utt.held_resumptions:
            carried = carry.audio.size if carry is not None else 0
            own = request.audio[carried : carried + own_audio]
            hyp = await self._read_past_held_pauses(utt, hyp, own)
        if utt.missing_pause and hyp.words:  # no word ends in the silence added
            hyp = dataclasses.replace(hyp, words=within(hyp.words, len(utt.audio) / SAMPLE_RATE))
        return hyp

    @staticmethod
    def _own_audio(utt: UtteranceState, request: DecodeRequest, carry: Carry | None) -> int:
        """The samples of the utterance's own audio ``request`` holds: not the carry's, nor
        the silence added after a finalize's cut (``missing_pause``), which no partial
        heard and no word is in."""
        own = request.audio.size - (carry.audio.size if carry is not None else 0)
        return max(1, min(own, len(utt.audio)) if utt.missing_pause else own)

    async def _read_past_held_pauses(
        self, utt: UtteranceState, hyp: Hypothesis, audio: np.ndarray
    ) -> Hypothesis:
        """``hyp``, read on past a held pause where it stopped. A SEMANTIC stream keeps a
        pause the turn model holds open inside one utterance (a speaker thinking
        mid-sentence), and Whisper, decoding two sentences with a pause between, now
        and then ends after the first: "It was the first great sorrow of his life. ...
        built around it." for that and "Stuff it into you, his belly counselled him."
        0.5 s later (a reviewer's fuzzing; LibriSpeech pairs). Where its last word ends
        before speech resumed after such a pause, the rest is decoded on its own, after
        this text, and joined to it: the turn's final stays one final, and whole."""
        asked_words = self._config.word_timestamps
        start = utt.audio.start_sample
        text, words, read_on = hyp.text, list(hyp.words), False
        done = start  # each rest decoded may stop at the next held pause in turn
        while not hyp.rejected and words:
            last_word_end = start + int(words[-1].end_s * SAMPLE_RATE)
            resumed = [at for at in utt.held_resumptions if max(done, last_word_end) < at]
            if not resumed:
                break
            done = at = resumed[0]
            # read before (in this language), stopping at a later pause
            rest_read = utt.read_on.get((at, hyp.language))
            if rest_read is None:
                rest_read = await self._read_rest(utt, at, audio, text, hyp.language)
            if rest_read is None:
                break
            text = joined(text, rest_read[0], hyp.language)
            words += rest_read[1]
            read_on = True
        if read_on:
            self._metrics.held_pauses_read_on.inc()
        return dataclasses.replace(
            hyp, text=text, words=words if asked_words and not hyp.rejected else []
        )

    async def _read_rest(
        self, utt: UtteranceState, at: int, audio: np.ndarray, text: str, language: str
    ) -> tuple[str, list[WordTiming]] | None:
        """The utterance's audio ``audio`` from just before speech resumed at ``at``,
        decoded on its own after ``text``: its text and its words on the utterance's
        clock; None where it holds no speech. One that stops at a later held pause is kept
        for the utterance's next final decodes (in a SEMANTIC turn an early final is
        decoded at every pause: each read all the rests again, the square of the pauses)."""
        start = utt.audio.start_sample
        cut = max(start, at - REST_LEAD_IN)
        rest = audio[cut - start :]
        if rest.size < HELD_REST_MIN_S * SAMPLE_RATE or await self.no_speech_in(rest):
            return None
        request = DecodeRequest(
            rest,
            DecodeKind.FINAL,
            language=language,
            languages=self._config.languages,
            prompt=f"{self.prompt()} {text}".strip()[-PROMPT_CHARS:],
            word_timestamps=True,
        )
        more = await self._timed_decode(request, "held pause's rest", None)
        if more is None or more.rejected or not more.text or not more.words:
            return None
        logger.debug("final %r stopped at a held pause; read on: %r", text, more.text)
        shift = (cut - start) / SAMPLE_RATE
        words = [
            WordTiming(w.word, w.start_s + shift, w.end_s + shift, w.probability)
            for w in more.words
        ]
        # (a pause held after this decode's audio ended, while it waited for the engine,
        # is no pause it stopped at)
        last_word_end = start + int(words[-1].end_s * SAMPLE_RATE)
        heard_until = cut + rest.size - int(HELD_REST_MIN_S * SAMPLE_RATE)
        if any(
            at < later and last_word_end < later <= heard_until for later in utt.held_resumptions
        ):
            utt.read_on[at, language] = (more.text, words)
        return more.text, words

    def _without_unheard_loops(
        self, utt: UtteranceState, hyp: Hypothesis, own_audio: int
    ) -> Hypothesis:
        """``hyp`` without what it reads twice where the utterance's partial
        (``heard_text``: the latest, unless it stopped short), which heard (nearly) all
        its speech, read it once (engine/text.py, ``without_unheard_loops``). Whisper,
        its audio run out mid-sentence (an utterance split at a pause), now and then
        jumps back a few words and reads on:
        "...has never been surpassed. Printing, then, for our purpose, has never been
        surpassed." (LJ Speech, 231 s; finals decoded alone, which the carry's checks do
        not see), says a phrase twice ("actually dated, actually dated, and"), or,
        retried without repeated 3-grams, re-reads a passage with a word altered
        ("...brought calligraphy to perfection—the middle ages brought calligraphee to
        perfection."). The decode's own loop checks (engine/text.py) do not cut so short
        a repeat: on its own it could be the speaker's. Here the partial tells."""
        unheard = own_audio - utt.heard_samples
        if unheard > LOOP_CHECK_UNHEARD_S * SAMPLE_RATE:
            return hyp  # the partial may not have heard the speaker say it again
        text = without_unheard_loops(hyp.text, heard_with(utt.heard_text, hyp.spoken_phrases))
        if text == hyp.text:
            return hyp
        logger.debug(
            "final %r read words twice (partial %r): kept %r",
            hyp.text,
            utt.heard_text,
            text,
        )
        self._metrics.looped_tails_trimmed.inc()
        return dataclasses.replace(hyp, text=text, words=timings_kept(hyp.words, text))

    async def _decode(
        self,
        utt: UtteranceState,
        request: DecodeRequest,
        carry: Carry | None,
        early: EarlyFinal | None,
    ) -> Hypothesis | None:
        hyp = await self._timed_decode(
            request,
            "early final" if early else "final",
            carry,
            on_start=early.mark_started if early else None,
        )
        if hyp is None or carry is None:
            return hyp
        carried = carry.strip(hyp)
        if carried.rejected and await self.no_speech_in(request.audio[carry.audio.size :]):
            # Whisper, having heard the previous final, heard nothing new, and Silero hears
            # no speech: a noise the voice detector took for speech. (Decoded alone, as a
            # carried final without words otherwise is, Whisper now and then makes words
            # up for it, which its no-speech rule lets through: "Thank you." for the
            # applause after a speech.)
            self._metrics.finals_without_speech.inc()
            return carried
        heard = spoken_words(utt.heard_text)
        if carry.cut_in_speech and utt.audio.start_sample == carry.end_sample:
            heard = carry.heard_past_the_cut(carried, heard)
        own_audio = self._own_audio(utt, request, carry)
        heard_share = min(1.0, utt.heard_samples / own_audio)
        wrong = carry.misread(carried, heard, heard_share)
        if not wrong and not carry.doubtful(carried, heard, heard_share):
            return carried
        if early is not None and early.set_aside:
            return None
        # then this utterance is decoded again, alone
        alone = await self._timed_decode(
            dataclasses.replace(
                request,
                audio=request.audio[carry.audio.size :],
                prefix=request.prefix[len(carry.forced) :].strip(),
            ),
            "final again alone (went wrong)" if wrong else "final again alone (doubtful)",
            None,
        )
        keep_carried = carry.keeps_carried(carried, alone, heard, heard_share, wrong) or (
            carried.rejected
            and carry.cut_in_speech
            and utt.audio.start_sample == carry.end_sample  # it begins at the cut
            and carry.alone_reads_the_carried_end(alone)
        )
        logger.debug(
            "carried final %r, partial %r (of %.2f s of %.2f s), alone %r: kept %s",
            carried.text,
            utt.heard_text,
            utt.heard_samples / SAMPLE_RATE,
            own_audio / SAMPLE_RATE,
            alone.text if alone else None,
            "carried" if keep_carried else "alone",
        )
        if keep_carried:
            # doubtful, but alone it reads differently from the partials too: the carried
            # context may be what mends it (a name the partials misheard); or it had more
            # words than a partial that stopped short
            return carried
        self._metrics.carry_fallbacks.inc()
        return alone

    async def _timed_decode(
        self,
        request: DecodeRequest,
        what: str,
        carry: Carry | None,
        on_start: Callable[[], None] | None = None,
    ) -> Hypothesis | None:
        """``scheduler.decode``, logged at DEBUG with what it cost (queue wait included):
        where a slow final's time went."""
        started = now()
        hyp = await self._scheduler.decode(request, on_start=on_start)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "%s decode: %.2f s of audio (%.2f s and %d words carried), %.0f ms",
                what,
                request.audio.size / SAMPLE_RATE,
                carry.duration_s if carry else 0.0,
                len(carry.text.split()) if carry else 0,
                (now() - started) * 1000,
            )
        return hyp

    async def no_speech_in(self, audio: np.ndarray, lead_in: np.ndarray | None = None) -> bool:
        """Silero hears no speech anywhere in ``audio``, having first heard ``lead_in``
        (about 0.2 ms a 32 ms frame; it stops at the first speech frame). False without
        Silero."""
        if self._speech_check is None:
            return False
        lead_in = audio[:0] if lead_in is None else lead_in
        return not await asyncio.to_thread(self._speech_check, audio, lead_in)

    def reconfigure(self, config: StreamConfig) -> None:
        """The stream's settings changed (its hotwords, for the prompt)."""
        self._config = config

    def echoes_prompt(self, text: str, prefix: str = "") -> bool:
        """Whether ``text`` (after the ``prefix`` it was decoded on) only reads back the
        client's prompt or hotwords, on a stream whose language is detected: Whisper's
        text for a sound without speech there (engine/text.py, ``echoes_prompt``). Where
        the language is set it does not happen, and a speaker may say the words."""
        if self._config.language is not None or not self._config.prompt:
            return False
        new = text[len(prefix) :] if prefix and text.startswith(prefix) else text
        return echoes_prompt(new, self._config.prompt)

    def prompt(self) -> str:
        """The client's prompt and hotwords, then what was just said on this channel.

        Whisper is trained with the preceding text as context; without it a short
        utterance loses what the sentence was about ("ask not" heard as "as not").
        """
        return " ".join(p for p in (self._config.prompt, self._context) if p)

    def _remember(self, text: str) -> None:
        if self._context_chars:
            context = f"{self._context} {text}".strip()
            if len(context) > self._context_chars:  # keep whole words
                context = context[-self._context_chars :].partition(" ")[2]
            self._context = context


def timings_kept(words: Sequence[WordTiming], text: str) -> list[WordTiming]:
    """The timings of ``words`` (one per word of the text they were read from) that
    ``text``, that text with words taken out, keeps; a word cut short ("perfection—the"
    to "perfection") keeps its timing under its new spelling."""
    tokens = text.split()
    matcher = SequenceMatcher(None, [w.word for w in words], tokens, autojunk=False)
    kept: list[WordTiming] = []
    for tag, a1, a2, b1, b2 in matcher.get_opcodes():
        if tag in ("equal", "replace"):  # replaced: a word cut short, and those after it
            kept += [
                dataclasses.replace(w, word=t)
                for w, t in zip(words[a1:a2], tokens[b1:b2], strict=False)
            ]
    return kept
