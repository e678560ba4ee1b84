"""The language a channel keeps (session/language.py) and detection over an allowed list."""

from __future__ import annotations

import pytest

from asr_server.engine.whisper import allowed_scores
from asr_server.session.language import LanguageTracker


def test_a_set_language_is_used_as_it_is() -> None:
    t = LanguageTracker("de")
    assert not t.detecting
    assert t.decode_language() == "de"
    assert t.final_language([("fr", 0.99)], 5.0) == "de"


def test_nothing_detected_leaves_the_final_as_decoded() -> None:
    assert LanguageTracker().final_language([], 3.0) is None  # an English-only model


def test_the_language_is_kept_once_there_is_enough_speech() -> None:
    t = LanguageTracker()
    assert t.decode_language() is None  # the first partials detect
    # a short, unsure first utterance: the best guess so far, not kept yet
    assert t.final_language([("es", 0.55), ("pt", 0.40)], 1.0) == "es"
    assert t.kept is None and t.decode_language() == "es"
    assert t.final_language([("es", 0.9), ("pt", 0.1)], 2.0) == "es"
    assert t.kept == "es"
    # a later short utterance that sounds Portuguese stays Spanish (the flip of issue 12)
    assert t.final_language([("pt", 0.7), ("es", 0.3)], 1.2) == "es"
    assert t.final_language([("es", 0.6), ("pt", 0.4)], 2.0) == "es"
    # and the Portuguese evidence was reset by the Spanish utterance in between
    assert t.final_language([("pt", 0.85), ("es", 0.15)], 1.5) == "es"


def test_evidence_before_keeping_adds_up_over_utterances() -> None:
    t = LanguageTracker()
    assert t.final_language([("pt", 0.6), ("es", 0.4)], 1.0) == "pt"
    assert t.final_language([("es", 0.9), ("pt", 0.1)], 1.0) == "es"  # 1.3 vs 0.7
    assert t.kept is None


@pytest.mark.parametrize(
    ("finals", "switched_at"),
    [
        # one long, confident utterance of German: it switches right there
        ([("de", 0.95, 3.0)], 0),
        # short ones in a row: at the one that completes the evidence
        ([("de", 0.9, 1.0), ("de", 0.9, 1.0), ("de", 0.9, 1.0)], 2),
        # enough evidence but an unsure last utterance: not yet
        ([("de", 0.9, 2.0), ("de", 0.6, 2.0), ("de", 0.85, 1.0)], 2),
    ],
)
def test_a_real_change_of_language_is_followed_once(
    finals: list[tuple[str, float, float]], switched_at: int
) -> None:
    t = LanguageTracker(kept="en")
    got = [t.final_language([(lang, p), ("en", 1 - p)], s) for lang, p, s in finals]
    assert got == ["en"] * switched_at + ["de"] * (len(finals) - switched_at)
    assert t.kept == "de"
    # and it does not flip back on one English-sounding moment
    assert t.final_language([("en", 0.7), ("de", 0.3)], 1.0) == "de"


def test_detection_is_restricted_to_the_allowed_languages_and_renormalized() -> None:
    detected = [("<|pt|>", 0.5), ("<|es|>", 0.3), ("<|it|>", 0.1), ("<|en|>", 0.1)]
    assert allowed_scores(detected, ()) == (("pt", 0.5), ("es", 0.3), ("it", 0.1), ("en", 0.1))
    got = allowed_scores(detected, ("es", "it"))
    assert [lang for lang, _ in got] == ["es", "it"]
    assert got[0][1] == pytest.approx(0.75) and got[1][1] == pytest.approx(0.25)
    # none of the allowed ones scored at all: the first allowed, not a forbidden one
    assert allowed_scores(detected, ("ko",)) == (("ko", 1.0),)


def test_the_language_a_stream_keeps_is_scored_wherever_it_ranks() -> None:
    """A stream keeping Korean through Russian speech: Korean ranked below the first five,
    and its probability came out 0, which the proto says means "set, not detected"."""
    ranked = [("ru", 0.6), ("uk", 0.2), ("bg", 0.1), ("be", 0.05), ("sr", 0.03), ("ko", 0.02)]
    detected = [(f"<|{lang}|>", p) for lang, p in ranked]
    scores = allowed_scores(detected, (), keep="ko")
    assert [lang for lang, _ in scores] == ["ru", "uk", "bg", "be", "sr", "ko"]
    assert LanguageTracker.probability(scores, "ko") == pytest.approx(0.02)
    assert len(allowed_scores(detected, ())) == 5  # the first five, as before
