"""Whether a channel's speech carries anything above a phone line's band.

A phone call reaches the server at 8 kHz (μ-law, A-law) or, as often, already resampled
to 16 kHz or more by a gateway or an agent framework (pipecat, for one, resamples
Twilio's 8 kHz μ-law to 16 kHz PCM). Either way no speech is left above 4 kHz, and the
turn model answers such audio differently from full-band speech (docs/end-of-turn.md,
"On phone lines"). The declared rate tells the first case; this meter tells the second,
from the speech's energy at 4.5-7.5 kHz against its voice band (300-3400 Hz), or from
that band being a mirror image of the voice band.

The mirror: a gateway that upsamples crudely (linear interpolation, as the classic
``audioop.ratecv`` recipe for Twilio does, or each sample repeated) leaves an image of
the 0-4 kHz band mirrored about 4 kHz, at -17 to -36 dB on the shared corpus: loud
enough to pass for full band by energy. The image repeats the voice band's fine
structure (its harmonics, bin by bin, mirrored), which real speech above 4 kHz does not:
the correlation of each frame's log spectrum (differenced across bins) at f with that at
8 kHz - f averages 0.99-1.00 for images and -0.05 to 0.05 for every full-band recording
of the corpus (tests/unit/test_bandwidth.py).

Measured on the shared corpus (tests/unit/test_bandwidth.py: the first 2 s of each
recording's speech, at 16 kHz): recordings made at 16 kHz or more, -5 to -45 dB, and
JFK's 1961 broadcast -47.5 dB; recordings made at 8 kHz and resampled to 16 kHz by their
publishers, -65 to -78 dB; the same speech through the server's own phone line, -96 dB
and less. The bar lies between.
"""

from __future__ import annotations

import numpy as np

from asr_server.audio.decode import SAMPLE_RATE

FRAME = 512  # 32 ms at 16 kHz: 31 Hz bins
VOICE_BAND_HZ = (300, 3400)
HIGH_BAND_HZ = (4500, 7500)
#: speech with less above the phone band than this (against its voice band) is narrowband
NARROWBAND_BELOW_DB = -55.0
#: audio to hear before saying anything
MIN_HEARD_S = 1.0
#: a high band whose frames mirror the voice band this closely on average is an image
MIRRORED_ABOVE = 0.5

_WINDOW = np.hanning(FRAME).astype(np.float32)
_FREQS = np.fft.rfftfreq(FRAME, 1 / SAMPLE_RATE)
_VOICE = (_FREQS >= VOICE_BAND_HZ[0]) & (_FREQS < VOICE_BAND_HZ[1])
_HIGH = (_FREQS >= HIGH_BAND_HZ[0]) & (_FREQS < HIGH_BAND_HZ[1])
#: the bins of the high band, and of their mirror images about 4 kHz (8 kHz - f)
_HIGH_BINS = np.flatnonzero(_HIGH)
_MIRROR_BINS = round(8000 / (SAMPLE_RATE / FRAME)) - _HIGH_BINS


class BandwidthMeter:
    """Sums the energy of the audio it is given (16 kHz, a channel's speech) in the two
    bands; ``narrowband`` once it has heard enough."""

    def __init__(self) -> None:
        self._voice = 0.0
        self._high = 0.0
        self._frames = 0
        self._mirroring = 0.0  # the sum of frames' mirror correlations
        self._mirror_frames = 0
        self._rest = np.zeros(0, np.float32)  # less than a frame, for the next call

    def add(self, audio: np.ndarray) -> None:
        audio = np.concatenate([self._rest, audio.astype(np.float32, copy=False)])
        whole = audio.size // FRAME * FRAME
        self._rest = audio[whole:].copy()
        if not whole:
            return
        frames = audio[:whole].reshape(-1, FRAME) * _WINDOW
        power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
        self._voice += float(power[:, _VOICE].sum())
        self._high += float(power[:, _HIGH].sum())
        self._frames += frames.shape[0]
        self._add_mirroring(power)

    def _add_mirroring(self, power: np.ndarray) -> None:
        """Per frame, how closely the high band's spectral detail mirrors the voice band's
        (Pearson's r of the differenced log spectra at f and at 8 kHz - f)."""
        high = np.diff(np.log(power[:, _HIGH_BINS] + 1e-12), axis=1)
        mirror = np.diff(np.log(power[:, _MIRROR_BINS] + 1e-12), axis=1)
        high -= high.mean(axis=1, keepdims=True)
        mirror -= mirror.mean(axis=1, keepdims=True)
        scale = np.sqrt((high**2).sum(axis=1) * (mirror**2).sum(axis=1))
        measured = scale > 0  # digital silence has no detail to compare
        r = (high * mirror).sum(axis=1)[measured] / scale[measured]
        self._mirroring += float(r.sum())
        self._mirror_frames += int(measured.sum())

    @property
    def heard_s(self) -> float:
        return self._frames * FRAME / SAMPLE_RATE

    @property
    def high_band_db(self) -> float | None:
        """Energy above the phone band against the voice band; None: not heard enough
        (or only silence)."""
        if self.heard_s < MIN_HEARD_S or self._voice <= 0.0:
            return None
        return 10 * float(np.log10(self._high / self._voice + 1e-15))

    @property
    def mirroring(self) -> float | None:
        """The frames' average mirror correlation (about 1: the high band is an image of
        the voice band); None: not heard enough."""
        if self.heard_s < MIN_HEARD_S or not self._mirror_frames:
            return None
        return self._mirroring / self._mirror_frames

    @property
    def narrowband(self) -> bool:
        db = self.high_band_db
        if db is None:
            return False
        mirroring = self.mirroring
        return db < NARROWBAND_BELOW_DB or (mirroring is not None and mirroring > MIRRORED_ABOVE)
