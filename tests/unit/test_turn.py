"""The Smart Turn v3.2 model (asr_server/vad/turn.py) on recorded speech.

The model is installed by ``asr-server turn-model`` (scripts/test.sh runs it once; it
needs the package index, the tests do not).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from asr_server.settings import Settings
from asr_server.vad.turn import (
    MODEL_SHA256,
    TurnModel,
    TurnModelError,
    default_model_path,
    install_model,
)
from tests.helpers import corpus, first_channel

INSTALLED = default_model_path(Settings().engine.cache_dir)


@pytest.fixture(scope="module")
def model() -> TurnModel:
    return TurnModel(INSTALLED)


def speech(rid: str) -> np.ndarray:
    return first_channel(corpus()[rid].path)


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


def test_the_answers_do_not_depend_on_the_cpus_int8_instructions(model: TurnModel) -> None:
    """The server's session against the model's reference semantics (its quantize /
    dequantize steps run as written, in float, CPU-independent). With onnxruntime's
    default u8s8 kernels on a CPU without VNNI (AVX2), 16-bit sums overflow: on these
    clips the answers were 0.10 off on average (up to 0.66) instead of 0.04, and the
    three sentences above failed. Exact int8 arithmetic still rounds differently from
    the float reference at requantization, so the two are close, not equal."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC  # no fusion
    reference = TurnModel(INSTALLED)
    reference._session = ort.InferenceSession(
        str(INSTALLED), sess_options=options, providers=["CPUExecutionProvider"]
    )
    pause = np.zeros(3200, np.float32)
    differences = []
    for n in (1, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14):  # the first LJ Speech clips
        audio = speech(f"ljspeech_LJ001-{n:04d}")
        for heard in (audio, audio[: len(audio) * 55 // 100]):  # whole, and cut mid-speech
            x = np.concatenate([heard, pause])
            differences.append(abs(model.predict(x).probability - reference.predict(x).probability))
    assert float(np.mean(differences)) < 0.07, differences


@pytest.mark.parametrize(
    ("flags", "exact"),
    [("sse4_2 avx2 fma", True), ("avx2 avx512f avx512_vnni", False), ("", True)],
)
def test_the_exact_int8_kernels_are_chosen_where_the_default_ones_overflow(
    monkeypatch: pytest.MonkeyPatch, flags: str, exact: bool
) -> None:
    """u8u8 kernels where the CPU lacks VNNI (or is not known to have it); the default
    ones where it has VNNI, which answer the same there in about half the time."""
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    model = TurnModel(INSTALLED, frozenset(flags.split()))
    assert model.exact_int8_kernels is exact
    options = model._session.get_session_options()
    if exact:
        assert options.get_session_config_entry("session.x64quantprecision") == "1"
    else:
        with pytest.raises(Exception, match="does not have configuration"):
            options.get_session_config_entry("session.x64quantprecision")


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


def test_the_start_up_log_says_which_int8_kernels_the_model_runs_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from asr_server.app import _load_turn_detection
    from asr_server.engine.cpu import cpu_flags, int8_sums_may_saturate

    with caplog.at_level("INFO", logger="asr_server.app"):
        turn, why_not = _load_turn_detection(Settings())
    assert turn is not None and why_not == ""
    lines = [r.getMessage() for r in caplog.records]
    (line,) = [m for m in lines if "SEMANTIC endpointing is on" in m]
    exact = int8_sums_may_saturate(cpu_flags())
    assert ("exact u8u8" in line) is exact and ("default int8 kernels" in line) is not exact


def test_the_server_reads_its_narrowband_threshold_from_the_settings() -> None:
    from asr_server.vad.turn import load_turn_detection

    assert load_turn_detection(Settings()).narrowband_threshold == 0.99
    turn = load_turn_detection(Settings(turn={"narrowband_threshold": 0.98}))  # type: ignore[arg-type]
    assert turn.narrowband_threshold == 0.98
    # set to the full-band threshold, a phone line is asked as any other stream is
    assert turn.for_stream(narrowband=True) is turn


def test_a_streams_first_ask_starts_from_the_servers_bar_for_its_line() -> None:
    from asr_server.vad.turn import first_ask_threshold

    # the server's bar, its phone-line one on a phone line
    assert first_ask_threshold(0.98, 0.99, None, narrowband=False) == 0.98
    assert first_ask_threshold(0.98, 0.99, None, narrowband=True) == 0.99
    # a stream may raise it, never lower it
    assert first_ask_threshold(0.98, 0.99, 0.5, narrowband=True) == 0.99
    assert first_ask_threshold(0.98, 0.99, 0.985, narrowband=False) == 0.985
    assert first_ask_threshold(0.98, 0.99, 0.995, narrowband=True) == 0.995
