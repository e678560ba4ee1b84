"""bench/synth_corpus.py and bench/turn_pauses.py: the audio they compare is laid out right."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import synth_corpus  # noqa: E402
from turn_bench import SR, as_phone_line  # noqa: E402
from turn_pauses import phone_through_soxr  # noqa: E402


def test_soxrs_phone_line_is_on_the_same_clock_as_the_servers() -> None:
    # turn_pauses asks the turn model at the same pauses of both versions: a lag
    # between them would compare different audio
    t = np.arange(SR) / SR
    burst = np.zeros(SR, np.float32)
    burst[8_000:] = (0.2 * np.sin(2 * np.pi * 1000 * t[:8_000])).astype(np.float32)
    server, soxrs = as_phone_line(burst), phone_through_soxr(burst)
    assert server.size == soxrs.size == burst.size
    onsets = [int(np.argmax(np.abs(x) > 0.05)) for x in (server, soxrs)]
    assert abs(onsets[0] - onsets[1]) < 10, onsets
    assert np.corrcoef(server[9_000:15_000], soxrs[9_000:15_000])[0, 1] > 0.99


def test_a_passage_is_its_phrases_with_pauses_inside_and_between_sentences(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    phrase_s = 0.5
    said: list[str] = []

    def tone(text: str, voice: str, wpm: int, work: Path) -> np.ndarray:
        said.append(text)
        return np.full(int(phrase_s * SR), 0.3, np.float32)  # loud throughout

    monkeypatch.setattr(synth_corpus, "synthesize", tone)
    rng = np.random.default_rng(1)
    audio = synth_corpus.passage_audio("One two | three. Four five.", "en-us", 160, rng, tmp_path)
    assert said == ["One two", "three.", "Four five."]
    loud = np.abs(audio) > 0.1
    edges = np.flatnonzero(np.diff(loud.astype(np.int8)))  # starts and ends of the phrases
    pauses_s = (edges[2::2] - edges[1:-1:2]) / SR
    assert pauses_s.size == 2
    assert 0.25 <= pauses_s[0] <= 0.9  # inside the sentence
    assert 0.5 <= pauses_s[1] <= 1.3  # between sentences
    assert synth_corpus.reference("One two | three. Four five.") == "ONE TWO THREE FOUR FIVE"


def test_the_corpus_is_laid_out_as_the_benchmarks_read_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(synth_corpus, "synthesize", lambda *a: np.full(SR // 4, 0.2, np.float32))
    monkeypatch.setattr(synth_corpus.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(sys, "argv", ["synth_corpus.py", str(tmp_path / "corpus")])
    synth_corpus.main()
    with open(tmp_path / "corpus" / "MANIFEST.tsv", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    with open(tmp_path / "corpus" / "NOTES.tsv", newline="") as f:
        notes = {r["id"]: r["category"] for r in csv.DictReader(f, delimiter="\t")}
    assert len(rows) == len(synth_corpus.PASSAGES)
    from streaming_bench import WER_CATEGORIES

    for row in rows:
        assert (tmp_path / "corpus" / row["file"]).is_file()
        assert row["language"] == "en" and int(row["sample_rate"]) == SR
        assert notes[row["id"]] in WER_CATEGORIES  # scored, not skipped


def test_synth_corpus_replaces_only_a_corpus_it_made(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`synth_corpus.py OUT` deleted OUT whatever it held, before a word was synthesized
    (`synth_corpus.py .` from the checkout deleted the checkout)."""
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "important.txt").write_text("keep me")
    monkeypatch.setattr(sys, "argv", ["synth_corpus.py", str(victim)])
    with pytest.raises(SystemExit, match="not a corpus this script made"):
        synth_corpus.main()
    assert (victim / "important.txt").read_text() == "keep me" and (victim / "sub").is_dir()
    made = tmp_path / "made"
    (made / "audio").mkdir(parents=True)
    (made / "audio" / "synth_00.wav").write_bytes(b"")
    (made / "MANIFEST.tsv").write_text("id\tsource_path\nsynth_00\tbench/synth_corpus.py\n")
    assert synth_corpus.is_synthetic_corpus(made)
    (tmp_path / "empty").mkdir()
    assert synth_corpus.is_synthetic_corpus(tmp_path / "empty")
    (made / "notes.md").write_text("mine")  # anything else in it: not replaced
    assert not synth_corpus.is_synthetic_corpus(made)
