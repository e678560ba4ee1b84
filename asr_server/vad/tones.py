"""Touch tones (DTMF): frames that are never speech.

A caller keying digits into an IVR on a quiet line: the detector hears the channel raised
(vad/level.py), takes the tones for speech, and Whisper writes them as "ha", "ah" or "Oh,
oh, oh, oh" (48 digits at -30 to -45 dBFS on a line whose noise is at -58 dBFS: seven
finals, none of them words said). A digit is two sines, one from each group (ITU-T Q.23),
that hold nearly all of a frame's energy between them; the harmonics of speech never do:
over the shared corpus's 25,554 frames above the endpointer's energy floor (16 kHz and
phone band, eleven languages), the best pair of bands within the twist below held at most
79 % of a frame's energy, and every digit with noise 15 dB under it at least 90 %, at
its nominal frequencies or 1.5 % off them. A frame that is a digit is not scored: it is
no speech, and it says nothing of the channel's level either.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from asr_server.audio.decode import SAMPLE_RATE

LOW_GROUP_HZ = (697.0, 770.0, 852.0, 941.0)
HIGH_GROUP_HZ = (1209.0, 1336.0, 1477.0, 1633.0)
#: a tone's band: ITU-T Q.24's frequency tolerance (1.5 %) either side of the nominal
#: frequency, plus two bins of the transform (the window's main lobe)
FREQUENCY_TOLERANCE = 0.015
BAND_BINS = 2
#: the share of the frame's energy the two tones' bands hold (see the module)
MIN_SHARE = 0.85
#: the two tones' levels within this of each other (Q.24 allows 8 dB of twist)
MAX_TWIST_DB = 8.0
MAX_TWIST = 10 ** (-MAX_TWIST_DB / 10)  # the weaker tone's power over the stronger's


@cache
def _bands(frame_samples: int) -> tuple[np.ndarray, int, np.ndarray]:
    """The window, the transform's size and a (bins × tones) mask of each tone's band,
    the low group's four first."""
    n_fft = 1 << (2 * frame_samples - 1).bit_length()
    freqs = np.fft.rfftfreq(n_fft, 1 / SAMPLE_RATE)
    bin_hz = SAMPLE_RATE / n_fft
    bands = np.stack(
        [
            np.abs(freqs - f) <= f * FREQUENCY_TOLERANCE + BAND_BINS * bin_hz
            for f in LOW_GROUP_HZ + HIGH_GROUP_HZ
        ],
        axis=1,
    )
    return np.hanning(frame_samples).astype(np.float32), n_fft, bands.astype(np.float32)


def dtmf_frames(frames: np.ndarray) -> np.ndarray:
    """Per row of ``frames`` (16 kHz): is it a touch-tone digit? (About 20 µs for one
    frame, most of it numpy's overhead per call: the endpointer asks once per ``feed``,
    for its loud frames.)"""
    if not len(frames):
        return np.zeros(0, dtype=bool)
    window, n_fft, bands = _bands(frames.shape[1])
    spectrum = np.fft.rfft(frames * window, n_fft, axis=1)
    power = np.square(spectrum.real) + np.square(spectrum.imag)
    tones = power @ bands
    groups = len(LOW_GROUP_HZ)
    low, high = tones[:, :groups].max(axis=1), tones[:, groups:].max(axis=1)
    # (the twist as a ratio: no logarithm per frame)
    return (low + high >= MIN_SHARE * power.sum(axis=1)) & (
        np.minimum(low, high) >= MAX_TWIST * np.maximum(low, high)
    )
