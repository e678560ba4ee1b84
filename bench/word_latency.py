"""Word emission latency: from the end of a spoken word to the first result that shows it.

The spoken words and their ends come from offline faster-whisper's word timestamps on the
same audio the server gets (Whisper's word timing is good to about 0.1 s). Each result a
stream sends (partial, eager or final) shows the channel's finals so far followed by its
own text; that transcript is aligned (difflib, on lower-cased words) with the offline
words already spoken when the result arrived, and every offline word matched for the
first time is emitted then. A word the stream never gets right is not counted (that is
WER's business); the share of words matched is reported beside the latency.

Used by ``streaming_bench.py --word-latency``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


def words_of(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


@dataclass(frozen=True)
class SpokenWord:
    word: str
    end_s: float  # in the recording


def spoken_words(model, audio: np.ndarray) -> list[SpokenWord]:  # type: ignore[no-untyped-def]
    """The words of ``audio`` (16 kHz) and when each ends, from offline decoding."""
    segments, _ = model.transcribe(audio, language="en", word_timestamps=True)
    return [
        SpokenWord(w, word.end) for s in segments for word in s.words for w in words_of(word.word)
    ]


@dataclass
class ChannelWords:
    """One channel's results, in the order they arrived, and the words they emitted."""

    spoken: list[SpokenWord]
    finals: list[str] = field(default_factory=list)
    emitted_at: dict[int, float] = field(default_factory=dict)  # spoken index → arrival

    def result(self, text: str, is_final: bool, arrived: float, audio_now_s: float) -> None:
        """A result arrived at ``arrived`` (any clock), when the source had produced
        ``audio_now_s`` seconds of audio."""
        shown = self.finals + words_of(text)
        if is_final:
            self.finals = shown
        said = [w for w in self.spoken if w.end_s <= audio_now_s]
        matcher = difflib.SequenceMatcher(a=[w.word for w in said], b=shown, autojunk=False)
        for block in matcher.get_matching_blocks():
            for i in range(block.a, block.a + block.size):
                self.emitted_at.setdefault(i, arrived)

    def latencies(self, wall: Callable[[float], float]) -> list[float]:
        """For each emitted word: arrival minus when its end existed at the source."""
        return [at - wall(self.spoken[i].end_s) for i, at in sorted(self.emitted_at.items())]
