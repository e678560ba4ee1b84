"""bench/turn_bench.py's phone line: what the turn model hears of a call."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from turn_bench import SR, as_phone_line  # noqa: E402


def band_energy(x: np.ndarray, low: float, high: float) -> float:
    spectrum = np.abs(np.fft.rfft(x)) ** 2
    freqs = np.fft.rfftfreq(x.size, 1 / SR)
    return float(spectrum[(freqs >= low) & (freqs < high)].sum())


def test_the_phone_line_keeps_the_voice_band_and_the_timing() -> None:
    t = np.arange(2 * SR) / SR
    tones = {hz: 0.2 * np.sin(2 * np.pi * hz * t) for hz in (150, 1000, 5000)}
    heard = as_phone_line(sum(tones.values()).astype(np.float32))
    assert heard.dtype == np.float32 and heard.size == t.size  # same clock as the original
    voice = band_energy(heard, 900, 1100)
    assert voice > 0.5 * band_energy(tones[1000], 900, 1100)  # 1 kHz passes (mu-law noise aside)
    assert band_energy(heard, 4900, 5100) < 1e-4 * voice  # above 3.4 kHz: gone
    assert band_energy(heard, 100, 200) < 1e-3 * voice  # below 300 Hz: gone
    # and a 1 kHz tone starts where it started: no delay from the resamplers
    burst = np.zeros(SR, np.float32)
    burst[8_000:] = tones[1000][:8_000]
    onset = int(np.argmax(np.abs(as_phone_line(burst)) > 0.05))
    assert abs(onset - 8_000) < 40, onset
