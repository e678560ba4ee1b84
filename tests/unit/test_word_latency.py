"""The word emission measure of bench/streaming_bench.py (bench/word_latency.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from word_latency import ChannelWords, SpokenWord  # noqa: E402


def spoken(*pairs: tuple[str, float]) -> list[SpokenWord]:
    return [SpokenWord(w, end) for w, end in pairs]


def test_a_word_is_emitted_by_the_first_result_that_shows_it_right() -> None:
    words = ChannelWords(spoken(("ask", 1.0), ("not", 1.4), ("what", 2.0)))
    words.result("Ask", is_final=False, arrived=1.3, audio_now_s=1.3)
    words.result("Ask knot", is_final=False, arrived=1.8, audio_now_s=1.8)  # misheard
    words.result("Ask not,", is_final=True, arrived=2.1, audio_now_s=2.1)
    words.result("What?", is_final=False, arrived=2.6, audio_now_s=2.6)
    # wall clock = audio time here (t0 = 0, real time)
    assert words.latencies(lambda s: s) == pytest.approx([0.3, 2.1 - 1.4, 0.6])


def test_finals_stay_shown_and_unsaid_words_are_not_matched_early() -> None:
    words = ChannelWords(spoken(("the", 0.5), ("cat", 1.0), ("the", 3.0), ("end", 3.5)))
    words.result("The cat.", is_final=True, arrived=1.2, audio_now_s=1.2)
    # a partial of the next utterance: "the" must not be matched before it is said
    words.result("The", is_final=False, arrived=2.0, audio_now_s=2.0)
    assert sorted(words.emitted_at) == [0, 1]
    words.result("The end.", is_final=True, arrived=3.8, audio_now_s=3.8)
    assert words.emitted_at == {0: 1.2, 1: 1.2, 2: 3.8, 3: 3.8}
