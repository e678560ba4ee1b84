"""Text hygiene after decoding: Whisper's known failure modes, caught cheaply.

Whisper sometimes loops — re-emitting the sentence it just produced, or one
short phrase many times — especially on short windows and near trailing
silence. Two checks catch that without re-decoding: the compression ratio of
the new text (Whisper's own test) and trailing tandem repeats of words.
"""

from __future__ import annotations

import re
import zlib

_NON_WORD = re.compile(r"[^\w']+")

#: a phrase of this many words or more repeated back to back is a loop
LONG_REPEAT_WORDS = 3
#: a shorter phrase is a loop only when repeated this many times ("no, no" is speech)
SHORT_REPEAT_COUNT = 4


def compression_ratio(text: str) -> float:
    raw = text.encode("utf-8")
    return len(raw) / max(1, len(zlib.compress(raw)))


def normalize_word(word: str) -> str:
    return _NON_WORD.sub("", word.lower())


def trim_trailing_repeats(words: list[str], protected: int = 0) -> list[str]:
    """Drop trailing back-to-back copies of a phrase, never touching the first ``protected``."""
    words = list(words)
    norm = [normalize_word(w) for w in words]
    changed = True
    while changed:
        changed = False
        n = len(norm)
        for k in range(1, n // 2 + 1):
            tail = norm[n - k :]
            copies = 1
            while n - (copies + 1) * k >= 0 and norm[n - (copies + 1) * k : n - copies * k] == tail:
                copies += 1
            needed = 2 if k >= LONG_REPEAT_WORDS else SHORT_REPEAT_COUNT
            if copies >= needed and any(tail):
                # remove whole copies only, and none that reaches into the protected words
                removable = min(copies - 1, (n - protected) // k)
                keep = n - removable * k
                if keep < n:
                    del words[keep:]
                    del norm[keep:]
                    changed = True
                    break
    return words
