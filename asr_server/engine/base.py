"""The engine boundary: a batch of 16 kHz float32 utterances in, hypotheses out."""

from __future__ import annotations

import enum
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


class DecodeKind(enum.IntEnum):
    """Lower value = higher priority in the scheduler."""

    FINAL = 0
    PARTIAL = 1


@dataclass(frozen=True)
class DecodeRequest:
    audio: np.ndarray  # float32, 16 kHz, mono
    kind: DecodeKind
    language: str | None = None  # None = detect
    #: detection chooses among these (empty: any language the model knows)
    languages: tuple[str, ...] = ()
    #: report detection scores (Hypothesis.language_scores) even when ``language`` is set
    detect: bool = False
    #: preceding context (initial prompt, hotwords); conditions but is not output
    prompt: str = ""
    #: text already committed for this audio; decoding continues after it and it is kept verbatim
    prefix: str = ""
    word_timestamps: bool = False


@dataclass(frozen=True)
class WordTiming:
    word: str
    start_s: float  # relative to the start of the request's audio
    end_s: float
    probability: float


@dataclass(frozen=True)
class Hypothesis:
    text: str  # prefix + newly decoded text, stripped
    language: str
    words: list[WordTiming] = field(default_factory=list)
    no_speech_prob: float = 0.0
    #: the decoded tokens' average log-probability; None: the engine gives none
    avg_logprob: float | None = None
    #: the decoder judged this to be non-speech or a hallucination; text is empty then
    rejected: bool = False
    #: (language, probability), most likely first, over the request's allowed languages;
    #: empty when nothing was detected
    language_scores: tuple[tuple[str, float], ...] = ()
    #: phrases the text says twice in a row that the audio shows spoken twice (engine/
    #: text.py, repeat_was_spoken): the speaker's, which no partial's reading (that may
    #: have looped and been cut, or read the phrase once) is to take out again
    spoken_phrases: tuple[str, ...] = ()

    @property
    def confidence(self) -> float:
        """The tokens' geometric mean probability (0: not known); Result.confidence."""
        return 0.0 if self.avg_logprob is None else min(1.0, math.exp(self.avg_logprob))


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine can do; the server and the sessions adapt to it instead of assuming.

    A second model family plugs in by declaring these honestly (engine/factory.py)."""

    #: the rate of ``DecodeRequest.audio``; the server refuses to start with an engine
    #: whose rate is not the pipeline's (asr_server.audio.decode.SAMPLE_RATE)
    sample_rate: int = 16_000
    #: language codes a stream may ask for; None = any (a multilingual model's own list is
    #: better, for clear errors)
    languages: frozenset[str] | None = frozenset({"en"})
    #: it reports detection scores (Hypothesis.language_scores) when asked
    language_detection: bool = False
    #: it continues after ``DecodeRequest.prefix`` and keeps it verbatim. Without it a
    #: session commits nothing from partials (every partial is unstable until the final),
    #: because a final could not be made to start with the committed words
    prefix_forcing: bool = True
    #: it fills ``Hypothesis.words`` when ``DecodeRequest.word_timestamps`` is set
    word_timestamps: bool = True
    #: an utterance decoded after earlier audio whose text is forced as the prefix comes
    #: out as it would alone, only better informed: then sessions carry the previous final
    #: into the next (streaming.carry_max_s). Needs prefix_forcing
    context_carry: bool = True
    #: the longest audio one request may hold (Whisper hears 30 s); the session never
    #: asks for more, so context it adds must fit beside the utterance
    max_audio_s: float = 30.0


class Engine(Protocol):
    """A speech recognizer. ``transcribe`` blocks and must be safe to call from several threads."""

    name: str
    is_multilingual: bool
    capabilities: EngineCapabilities
    #: how many requests one call may take; the scheduler never sends more
    max_batch_size: int
    #: how many calls may run at once (the scheduler's worker count)
    workers: int

    def transcribe(self, requests: Sequence[DecodeRequest]) -> list[Hypothesis]: ...

    def batch_key(self, request: DecodeRequest) -> Hashable:
        """Requests with equal keys are decoded in one batch from the same input as each
        alone (the same kind, the same padding); the scheduler batches only those."""
        ...
