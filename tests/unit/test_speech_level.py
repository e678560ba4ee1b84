"""The speech level the tests and benchmarks scale recordings to."""

import numpy as np
import pytest

from asr_client.speech_level import active_rms, at_speech_level
from tests.helpers import corpus, first_channel


def test_a_recording_scaled_to_a_level_has_its_speech_at_that_level() -> None:
    talk = first_channel(corpus()["libri_1089-134691-0001"].path)
    quiet = at_speech_level(talk, -45)
    assert quiet.dtype == np.float32
    assert 20 * np.log10(active_rms(quiet)) == pytest.approx(-45, abs=0.01)


def test_pauses_do_not_make_a_recording_quieter() -> None:
    talk = first_channel(corpus()["libri_1089-134691-0001"].path)
    padded = np.concatenate([np.zeros(5 * 16_000, np.float32), talk, np.zeros(5 * 16_000)])
    assert active_rms(padded) == pytest.approx(active_rms(talk), rel=0.01)
    # the plain RMS over the whole of it is several dB lower
    assert np.sqrt(np.mean(padded.astype(np.float64) ** 2)) < 0.7 * active_rms(talk)


def test_the_frame_follows_the_sample_rate() -> None:
    tone = 0.1 * np.sin(2 * np.pi * 300 * np.arange(8_000) / 8_000)
    assert active_rms(tone, 8_000) == pytest.approx(0.1 / np.sqrt(2), rel=0.01)
    with pytest.raises(ValueError, match="less than one 20 ms frame"):
        active_rms(np.zeros(100))
