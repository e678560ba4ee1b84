"""asr_client.audio_files: a file's level, and --normalize raising a quiet one."""

from __future__ import annotations

import numpy as np
import pytest

from asr_client.audio_files import PcmAudio


def test_each_channel_is_raised_to_a_normal_level_without_clipping() -> None:
    """--normalize: the quiet channel up to -12 dBFS in its loudest 30 ms; the loud one
    left as it is (never lowered); a channel with one click near full scale only up to
    -1 dBFS at that click; silence untouched."""
    rate = 16_000
    t = np.arange(rate) / rate
    quiet = np.sin(2 * np.pi * 440 * t) * 100  # -53 dBFS RMS
    loud = np.sin(2 * np.pi * 440 * t) * 20_000
    clicked = quiet.copy()
    clicked[100] = 16_000
    frames = np.stack([quiet, loud, clicked, np.zeros(rate)], axis=1).round().astype(np.int16)
    audio = PcmAudio(frames, rate)
    before = audio.loudest_frame_db()
    assert before[0] == pytest.approx(20 * np.log10(100 / np.sqrt(2) / 32768), abs=0.1)
    assert before[3] == -np.inf
    raised, gains = audio.raised()
    after = raised.loudest_frame_db()
    assert after[0] == pytest.approx(-12.0, abs=0.1)
    assert gains[1] == 0 and np.array_equal(raised.frames[:, 1], frames[:, 1])
    assert np.abs(raised.frames[:, 2]).max() == pytest.approx(29_204, abs=2)
    assert gains[3] == 0 and not raised.frames[:, 3].any()
