"""Touch tones (DTMF): frames that are never speech.

A caller keying digits into an IVR on a quiet line: the detector hears the channel raised
(vad/level.py), takes the tones for speech, and Whisper writes them as "ha", "ah" or "Oh,
oh, oh, oh" (48 digits at -30 to -45 dBFS on a line whose noise is at -58 dBFS: seven
finals, none of them words said). A digit is two sines, one from each group (ITU-T Q.23),
that hold nearly all of a frame's energy between them; the harmonics of speech never do:
over the shared corpus's 25,744 frames above the endpointer's energy floor (16 kHz and
phone band, eleven languages), the best pair of bands within the twist below held at most
79 % of a frame's energy, and every digit with noise 15 dB under it at least 90 %, at
its nominal frequencies or 1.5 % off them. A note sung, hummed or whistled whose energy
is in its fundamental and its octave can fill a band of each group; no digit's tones are
an octave apart. The endpointer asks only about the frames its detector took for speech
or that raised the channel's level (vad/endpointer.py: what it does with a digit).
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
#: the two tones' levels within this of each other (Q.24 allows 8 dB of twist; the
#: window and the fixed bands add up to 2 dB to what is measured)
MAX_TWIST_DB = 10.0
MAX_TWIST = 10 ** (-MAX_TWIST_DB / 10)  # the weaker tone's power over the stronger's
#: no digit's high tone is within 4 % of twice its low tone (1336 / 697 is 1.917, 1477 /
#: 697 2.119), 1.3 % with both tones 1.5 % off in opposite directions; a sung or hummed
#: note's octave is twice its fundamental (a soprano's 740 Hz and 1480 Hz sat in the
#: bands of 770 and 1477 Hz and held all of the energy)
OCTAVE_TOLERANCE = 0.01


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
    """Per row of ``frames`` (16 kHz): is it a touch-tone digit? (About 30 µs for one
    frame, most of it numpy's overhead per call: the endpointer asks only about frames
    its detector took for speech or that raised the level.)"""
    if not len(frames):
        return np.zeros(0, dtype=bool)
    window, n_fft, bands = _bands(frames.shape[1])
    spectrum = np.fft.rfft(frames * window, n_fft, axis=1)
    power = np.square(spectrum.real) + np.square(spectrum.imag)
    tones = power @ bands
    groups = len(LOW_GROUP_HZ)
    low_band, high_band = tones[:, :groups].argmax(axis=1), tones[:, groups:].argmax(axis=1)
    rows = np.arange(len(frames))
    low, high = tones[rows, low_band], tones[rows, groups + high_band]
    total = power.sum(axis=1)
    # (the twist as a ratio: no logarithm per frame; a frame the window leaves nothing of,
    # a click on its first sample, holds no tone)
    pair = (
        (total > 0)
        & (low + high >= MIN_SHARE * total)
        & (np.minimum(low, high) >= MAX_TWIST * np.maximum(low, high))
    )
    if not pair.any():
        return pair
    # a voice's fundamental and its octave, in a band of each group, is a note, not a digit
    # (asked of the pairs only: a frame with no power in a band has no peak in it)
    power, bands_low, bands_high = (
        power[pair],
        bands[:, low_band[pair]],
        bands[:, groups + high_band[pair]],
    )
    f_low = _peak_hz(power, power * bands_low.T, n_fft)
    f_high = _peak_hz(power, power * bands_high.T, n_fft)
    pair[pair] = np.abs(f_high / f_low - 2.0) > OCTAVE_TOLERANCE
    return pair


def _peak_hz(power: np.ndarray, in_band: np.ndarray, n_fft: int) -> np.ndarray:
    """Per row: the frequency of the strongest bin of ``in_band`` (``power`` masked to
    one band), between bins by a parabola through the log powers around it."""
    rows = np.arange(len(power))
    peak = in_band.argmax(axis=1)
    below, at, above = (np.log(power[rows, peak + k] + 1e-30) for k in (-1, 0, 1))
    curvature = below - 2 * at + above
    offset = np.where(
        curvature < 0, 0.5 * (below - above) / np.where(curvature < 0, curvature, -1), 0
    )
    return (peak + offset) * SAMPLE_RATE / n_fft
