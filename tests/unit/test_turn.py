"""The Smart Turn v3.2 model (asr_server/vad/turn.py) on recorded speech.

The model is installed by ``asr-server turn-model`` (scripts/test.sh runs it once; it
needs the package index, the tests do not).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import soxr

from asr_server.settings import Settings
from asr_server.vad.turn import (
    MODEL_SHA256,
    TurnModel,
    TurnModelError,
    default_model_path,
    install_model,
)
from tests.helpers import corpus, read_pcm16

INSTALLED = default_model_path(Settings().engine.cache_dir)


@pytest.fixture(scope="module")
def model() -> TurnModel:
    return TurnModel(INSTALLED)


def speech(rid: str) -> np.ndarray:
    pcm, sr = read_pcm16(corpus()[rid].path)
    return soxr.resample(pcm[:, 0].astype(np.float32) / 32768, sr, 16_000)


@pytest.mark.parametrize(
    "rid", ["libri_2412-153948-0000", "ljspeech_LJ001-0001", "libri_1089-134686-0000"]
)
def test_a_finished_sentence_is_a_complete_turn_and_one_cut_mid_speech_is_not(
    model: TurnModel, rid: str
) -> None:
    audio = speech(rid)
    pause = np.zeros(3200, np.float32)  # the 200 ms of pause after which it is asked
    whole = model.predict(np.concatenate([audio, pause])).probability
    # the speaker stops in the middle of the sentence (and of a word)
    half = model.predict(np.concatenate([audio[: len(audio) * 55 // 100], pause])).probability
    assert whole > 0.7, whole
    assert half < 0.5, half


def test_a_missing_or_foreign_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TurnModelError, match="asr-server turn-model"):
        TurnModel(tmp_path / "nothing.onnx")
    fake = tmp_path / "smart-turn-v3.2-cpu.onnx"
    fake.write_bytes(b"not a model")
    with pytest.raises(TurnModelError, match="not the pinned"):
        TurnModel(fake)


def test_installing_again_is_a_no_op_offline(tmp_path: Path) -> None:
    target = default_model_path(tmp_path)
    target.parent.mkdir(parents=True)
    shutil.copy(INSTALLED, target)
    # the pinned file is there: no download (the tests have no network) and no rewrite
    assert install_model(tmp_path) == target
    from asr_server.vad.turn import sha256_of

    assert sha256_of(target) == MODEL_SHA256
