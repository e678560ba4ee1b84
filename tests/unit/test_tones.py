"""Touch-tone digits are found in a frame, and speech never is (vad/tones.py)."""

from __future__ import annotations

import numpy as np
import pytest

from asr_server.vad.tones import HIGH_GROUP_HZ, LOW_GROUP_HZ, dtmf_frames
from tests.helpers import corpus, first_channel

FRAME = 480


def digit_frame(low: float, high: float, off: float, snr_db: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(FRAME) / 16_000
    x = np.sin(2 * np.pi * low * (1 + off) * t + rng.uniform(0, 6))
    x += 0.7 * np.sin(2 * np.pi * high * (1 + off) * t + rng.uniform(0, 6))  # 3 dB twist
    x /= np.sqrt(np.mean(x**2))
    return (0.02 * (x + rng.standard_normal(FRAME) * 10 ** (-snr_db / 20))).astype(np.float32)


@pytest.mark.parametrize("off", [-0.015, 0.0, 0.015])  # ITU-T Q.24's tolerance
def test_every_digit_is_a_tone_with_noise_15_db_under_it(off: float) -> None:
    frames = np.stack(
        [
            digit_frame(low, high, off, 15, seed)
            for seed, (low, high) in enumerate(
                (low, high) for low in LOW_GROUP_HZ for high in HIGH_GROUP_HZ
            )
        ]
    )
    assert dtmf_frames(frames).all()


def test_one_tone_or_two_of_the_same_group_or_noise_is_no_digit() -> None:
    t = np.arange(FRAME) / 16_000
    rng = np.random.default_rng(1)
    frames = np.stack(
        [
            np.sin(2 * np.pi * 1000 * t),  # a beep
            np.sin(2 * np.pi * 697 * t) + np.sin(2 * np.pi * 852 * t),  # both low
            np.sin(2 * np.pi * 350 * t) + np.sin(2 * np.pi * 440 * t),  # dial tone
            np.sin(2 * np.pi * 697 * t) + 0.2 * np.sin(2 * np.pi * 1209 * t),  # 14 dB twist
            rng.standard_normal(FRAME),
        ]
    ).astype(np.float32)
    assert not dtmf_frames(frames).any()


def test_no_frame_of_speech_is_a_digit() -> None:
    """Every frame of the corpus's recordings above the energy floor (16 kHz and phone
    band, eleven languages, men, women, a child)."""
    checked = 0
    for rec in corpus().values():
        audio = first_channel(rec.path)
        frames = audio[: audio.size // FRAME * FRAME].reshape(-1, FRAME)
        frames = frames[np.mean(frames**2, axis=1) > 1e-6]
        found = dtmf_frames(frames)
        assert not found.any(), (rec.id, np.flatnonzero(found) * 0.03)
        checked += len(frames)
    assert checked > 5_000
