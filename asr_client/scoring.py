"""Word error rate with Whisper-style English normalisation (jiwer + whisper-normalizer).

Used by the tests and the benchmark; both libraries come with the ``eval`` extra.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

_TAGS = re.compile(r"\[(?:spk\d+|left|right)\]", re.IGNORECASE)


@lru_cache(maxsize=1)
def _normalizer():  # type: ignore[no-untyped-def]
    try:
        from whisper_normalizer.english import EnglishTextNormalizer
    except ImportError as exc:  # pragma: no cover
        raise ImportError("scoring needs: pip install 'streamasr[eval]'") from exc
    return EnglishTextNormalizer()


def normalize(text: str) -> str:
    return " ".join(_normalizer()(_TAGS.sub(" ", text)).split())


def wer(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """Corpus WER (total edits / total reference words) after normalisation."""
    import jiwer

    refs = [normalize(r) for r in references]
    hyps = [normalize(h) for h in hypotheses]
    keep = [i for i, r in enumerate(refs) if r]
    if not keep:
        return 0.0
    return float(jiwer.wer([refs[i] for i in keep], [hyps[i] for i in keep]))
