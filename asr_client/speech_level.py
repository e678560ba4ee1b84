"""The level a recording's speech is at, and the recording scaled to a level.

The tests and the benchmarks make quiet or loud talkers from the corpus with these. The
level is the RMS of the 20 ms frames within 30 dB of the loudest: the speech, not its
pauses, so a recording with long silences is not taken for a quiet one.
"""

from __future__ import annotations

import numpy as np

_WITHIN_DB = 30.0


def active_rms(audio: np.ndarray, sample_rate: int = 16_000) -> float:
    """The RMS (full scale 1.0) of ``audio``'s speech: its 20 ms frames within 30 dB of
    the loudest."""
    frame = sample_rate // 50
    n = audio.size // frame
    if n == 0:
        raise ValueError(f"{audio.size} samples is less than one 20 ms frame")
    frames = audio[: n * frame].reshape(n, frame).astype(np.float64)
    rms = np.sqrt((frames**2).mean(axis=1) + 1e-20)
    db = 20 * np.log10(rms)
    return float(np.sqrt((rms[db > db.max() - _WITHIN_DB] ** 2).mean()))


def at_speech_level(audio: np.ndarray, dbfs: float, sample_rate: int = 16_000) -> np.ndarray:
    """``audio`` scaled so that its speech (``active_rms``) is at ``dbfs``, as float32."""
    gain = 10 ** (dbfs / 20) / active_rms(audio, sample_rate)
    return (audio * gain).astype(np.float32)
