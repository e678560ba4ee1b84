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


def can_score() -> bool:
    """Whether word error rates can be computed here (the ``eval`` extra: jiwer and
    Whisper's normaliser)."""
    try:
        import jiwer  # noqa: F401
        import whisper_normalizer  # noqa: F401
    except ImportError:
        return False
    return True


def normalize(text: str) -> str:
    return " ".join(_normalizer()(_TAGS.sub(" ", text)).split())


def wer(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """Corpus WER (total edits / total reference words) after English normalisation."""
    return error_rate(references, hypotheses, "en")


#: languages written without spaces between words: scored by characters (CER)
CHARACTER_SCORED = frozenset({"zh", "ja", "ko", "th", "lo", "my", "km", "yue"})


@lru_cache(maxsize=1)
def _basic_normalizer():  # type: ignore[no-untyped-def]
    from whisper_normalizer.basic import BasicTextNormalizer

    return BasicTextNormalizer()


def normalize_for(text: str, language: str) -> str:
    """English: Whisper's English normaliser; other languages: its basic one (lower case,
    no punctuation or symbols)."""
    if language == "en":
        return normalize(text)
    return " ".join(_basic_normalizer()(_TAGS.sub(" ", text)).split())


def error_rate(references: Sequence[str], hypotheses: Sequence[str], language: str) -> float:
    """Corpus WER, or CER for languages written without spaces (Korean spaces phrases,
    not words, so it is scored by characters too, as is usual)."""
    import jiwer

    refs = [normalize_for(r, language) for r in references]
    hyps = [normalize_for(h, language) for h in hypotheses]
    keep = [i for i, r in enumerate(refs) if r]
    if not keep:
        return 0.0
    refs, hyps = [refs[i] for i in keep], [hyps[i] for i in keep]
    if language in CHARACTER_SCORED:
        return float(
            jiwer.cer([r.replace(" ", "") for r in refs], [h.replace(" ", "") for h in hyps])
        )
    return float(jiwer.wer(refs, hyps))
