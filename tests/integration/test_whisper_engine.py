"""The real faster-whisper engine on its own: batching, prefixes, words, rejection."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from asr_client.scoring import normalize
from asr_server.engine.base import DecodeKind, DecodeRequest
from asr_server.engine.models import resolve_model
from asr_server.engine.whisper import WhisperEngine
from tests.helpers import corpus, read_pcm16

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def engine() -> WhisperEngine:
    return WhisperEngine(
        resolve_model("tiny.en", Path("/nonexistent")), max_batch_size=4, cpu_threads=2
    )


def audio(rid: str) -> np.ndarray:
    pcm, sr = read_pcm16(corpus()[rid].path)
    assert sr == 16_000
    return pcm[:, 0].astype(np.float32) / 32768


def test_a_batch_decodes_like_single_requests(engine: WhisperEngine) -> None:
    requests = [
        DecodeRequest(audio("libri_1089-134691-0000"), DecodeKind.FINAL),
        DecodeRequest(
            audio("libri_2412-153948-0000"),
            DecodeKind.FINAL,
            prefix="If the reader will excuse me,",
        ),
        DecodeRequest(np.zeros(16_000, np.float32), DecodeKind.FINAL),
        DecodeRequest(audio("libri_1089-134686-0001"), DecodeKind.FINAL, word_timestamps=True),
    ]
    batched = engine.transcribe(requests)
    single = [engine.transcribe([r])[0] for r in requests]
    assert [normalize(h.text) for h in batched] == [normalize(h.text) for h in single]
    assert batched[1].text.startswith("If the reader will excuse me,")  # prefix kept verbatim
    assert batched[2].rejected and batched[2].text == ""  # silence
    assert not batched[0].words and batched[3].words  # timings only where asked
    assert " ".join(w.word for w in batched[3].words) == batched[3].text


def test_batch_limit_is_enforced(engine: WhisperEngine) -> None:
    with pytest.raises(ValueError, match="exceeds"):
        engine.transcribe([DecodeRequest(np.zeros(1600, np.float32), DecodeKind.PARTIAL)] * 5)


class _Result:
    """What CTranslate2's generate returns, as far as the engine reads it."""

    def __init__(self, ids: list[int]) -> None:
        self.sequences_ids = [ids]
        self.scores = [-0.2]
        self.no_speech_prob = 0.01


@pytest.mark.parametrize("kind", [DecodeKind.FINAL, DecodeKind.PARTIAL])
@pytest.mark.parametrize(
    ("looped", "expected", "retried"),
    [
        # the audio ran out mid-sentence: the loop is cut off its end, no second decode
        (
            " imitates a much freer hand, and therefore far pleasanter,"
            + " therefore far pleasanter," * 8,
            "imitates a much freer hand, and therefore far pleasanter,",
            False,
        ),
        (
            " printed in letters which are an exact imitation,"
            + " which are an exact imitation," * 6
            + " which are an",
            "printed in letters which are an exact imitation,",
            False,
        ),
        # a loop inside the text: decoded again, repeats forbidden
        (
            " or cost incurred, or cost incurred, or cost incurred, consist principally"
            + " of types, it is of the first importance" * 6,
            "or cost incurred in casting.",
            True,
        ),
    ],
)
def test_a_final_that_loops_at_its_end_is_cut_and_one_that_loops_inside_decoded_again(
    engine: WhisperEngine,
    monkeypatch: pytest.MonkeyPatch,
    looped: str,
    expected: str,
    retried: bool,
    kind: DecodeKind,
) -> None:
    """The real tokenizer and checks around a stand-in for generate (whether tiny.en
    loops on a given cut depends on the CPU's int8 kernels). A partial is cut the same
    way; one that loops inside is dropped, not decoded again."""
    tok = engine._tokenizer("en")
    calls: list[bool] = []

    def generate(requests, encoded, prompts, frames, *, repetition_retry, batch_index=None):  # type: ignore[no-untyped-def]
        calls.append(repetition_retry)
        text = " or cost incurred in casting." if repetition_retry else looped
        return [_Result([*p, *tok.encode(text), tok.eot]) for p in prompts]

    monkeypatch.setattr(engine, "_generate", generate)
    hyp = engine.transcribe([DecodeRequest(audio("libri_1089-134691-0000"), kind)])[0]
    if kind is DecodeKind.PARTIAL and retried:
        assert hyp.rejected and hyp.text == ""
        assert calls == [False]
        return
    assert hyp.text == expected
    assert calls == ([False, True] if retried else [False])
