"""The audio of the utterance being spoken, kept in one growable array.

Appending is amortised O(1) (capacity doubles), unlike ``np.append`` per chunk,
and the array never exceeds the longest utterance plus one chunk because the
channel splits or finalizes before that.
"""

from __future__ import annotations

import numpy as np

from asr_server.audio.decode import SAMPLE_RATE


class UtteranceAudio:
    def __init__(self, start_sample: int, capacity: int = SAMPLE_RATE * 4) -> None:
        self.start_sample = start_sample
        self._buf = np.empty(capacity, dtype=np.float32)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    @property
    def end_sample(self) -> int:
        return self.start_sample + self._n

    @property
    def duration_s(self) -> float:
        return self._n / SAMPLE_RATE

    def append(self, samples: np.ndarray) -> None:
        need = self._n + samples.size
        if need > self._buf.size:
            grown = np.empty(max(need, 2 * self._buf.size), dtype=np.float32)
            grown[: self._n] = self._buf[: self._n]
            self._buf = grown
        self._buf[self._n : need] = samples
        self._n = need

    def snapshot(self, end_sample: int | None = None) -> np.ndarray:
        """A copy of the audio up to ``end_sample`` (stream position), for the engine."""
        n = self._n if end_sample is None else max(0, min(self._n, end_sample - self.start_sample))
        return self._buf[:n].copy()

    def since(self, offset: int) -> np.ndarray:
        """A copy of the audio from ``offset`` samples into the utterance on (what a
        reader that has had the first ``offset`` has not)."""
        return self._buf[min(max(offset, 0), self._n) : self._n].copy()

    def split_off(self, at_sample: int) -> UtteranceAudio:
        """Keep audio before ``at_sample``; return the rest as a new utterance's audio."""
        cut = max(0, min(self._n, at_sample - self.start_sample))
        rest = UtteranceAudio(self.start_sample + cut, max(SAMPLE_RATE, self._n - cut))
        rest.append(self._buf[cut : self._n])
        self._n = cut
        return rest

    def quietest_sample(self, search_from_s: float, window_s: float = 0.1) -> int:
        """Stream position of the quietest ``window_s`` after ``search_from_s`` into the utterance.

        Used to split an over-long utterance where a word is least likely to be cut.
        """
        win = int(window_s * SAMPLE_RATE)
        lo = int(search_from_s * SAMPLE_RATE)
        audio = self._buf[lo : self._n]
        if audio.size < 2 * win:
            return self.end_sample
        frames = audio[: (audio.size // win) * win].reshape(-1, win)
        energy = (frames * frames).mean(axis=1)
        best = int(np.argmin(energy))
        return self.start_sample + lo + best * win + win // 2
