"""LocalAgreement-n (as in whisper_streaming): commit what consecutive hypotheses agree on.

Each partial hypothesis of the growing utterance is compared with the previous
one; the words both agree on after the committed prefix become committed and
are never changed again (later decodes are forced to continue after them).
Words compare case- and punctuation-insensitively.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from asr_server.engine.base import WordTiming
from asr_server.engine.text import normalize_word

#: committed words' start times may step back this much and still count as in order
#: (the aligner's 20 ms steps, punctuation merged into a word)
ORDER_SLACK_S = 0.02


@dataclass
class LocalAgreement:
    #: how many consecutive hypotheses must agree on a word to commit it
    n: int = 2
    committed: list[str] = field(default_factory=list)
    #: timing of committed words where a hypothesis carried it (utterance-relative)
    committed_timing: list[WordTiming | None] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)  # the latest uncommitted words
    #: the uncommitted words of the previous n-1 hypotheses, oldest first
    _previous: deque[list[str]] = field(init=False)

    def __post_init__(self) -> None:
        self._previous = deque(maxlen=max(1, self.n - 1))

    def update(
        self, words: list[str], timings: list[WordTiming] | None = None, *, commit: bool = True
    ) -> bool:
        """Apply a hypothesis (committed prefix included); False if it is stale and ignored.

        With ``commit=False`` the hypothesis only becomes the one the next is compared with.
        """
        n = len(self.committed)
        if [normalize_word(w) for w in words[:n]] != [normalize_word(w) for w in self.committed]:
            return False  # decoded with an older prefix that no longer matches
        tail = words[n:]
        if timings is not None and len(timings) == len(words):
            # refresh timings of committed words the hypothesis carries
            for i in range(n):
                if self.committed_timing[i] is None:
                    self.committed_timing[i] = timings[i]
        agreed = 0
        if commit and len(self._previous) == self._previous.maxlen:
            current = [normalize_word(w) for w in tail]
            for i, word in enumerate(current):
                if not word or any(
                    i >= len(p) or normalize_word(p[i]) != word for p in self._previous
                ):
                    break
                agreed += 1
        self.committed.extend(tail[:agreed])
        if timings is not None and len(timings) == len(words):
            self.committed_timing.extend(timings[n : n + agreed])
        else:
            self.committed_timing.extend([None] * agreed)
        self.tail = tail[agreed:]
        # what the earlier hypotheses hold past the newly committed words (they agreed on them)
        kept = [p[agreed:] for p in self._previous]
        self._previous.clear()
        self._previous.extend(kept)
        self._previous.append(self.tail)
        return True

    @property
    def committed_text(self) -> str:
        return " ".join(self.committed)

    @property
    def committed_end_s(self) -> float | None:
        """Where the committed words end (utterance-relative), when their timings can say
        so: every word timed, in order, the last one of some length. None otherwise: the
        aligner now and then puts words at 0.0 s (tiny.en, speech after a long stretch of
        music the voice detector took for speech), and a cut there would leave the words'
        audio to the next utterance, where they were said again."""
        timings = self.committed_timing
        if not timings or any(t is None for t in timings):
            return None
        starts = [t.start_s for t in timings if t is not None]
        last = timings[-1]
        assert last is not None
        in_order = all(b >= a - ORDER_SLACK_S for a, b in zip(starts, starts[1:], strict=False))
        return last.end_s if in_order and last.end_s > last.start_s else None

    @property
    def tail_text(self) -> str:
        return " ".join(self.tail)
