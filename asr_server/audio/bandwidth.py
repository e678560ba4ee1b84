"""Whether a channel's speech carries anything above a phone line's band.

A phone call reaches the server at 8 kHz (μ-law, A-law) or, as often, already resampled
to 16 kHz or more by a gateway or an agent framework (pipecat, for one, resamples
Twilio's 8 kHz μ-law to 16 kHz PCM). Either way nothing is left above 4 kHz, and the
turn model answers such audio differently from full-band speech (docs/end-of-turn.md,
"On phone lines"). The declared rate tells the first case; this meter tells the second,
from the speech's energy at 4.5-7.5 kHz against its voice band (300-3400 Hz).

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

_WINDOW = np.hanning(FRAME).astype(np.float32)
_FREQS = np.fft.rfftfreq(FRAME, 1 / SAMPLE_RATE)
_VOICE = (_FREQS >= VOICE_BAND_HZ[0]) & (_FREQS < VOICE_BAND_HZ[1])
_HIGH = (_FREQS >= HIGH_BAND_HZ[0]) & (_FREQS < HIGH_BAND_HZ[1])


class BandwidthMeter:
    """Sums the energy of the audio it is given (16 kHz, a channel's speech) in the two
    bands; ``narrowband`` once it has heard enough."""

    def __init__(self) -> None:
        self._voice = 0.0
        self._high = 0.0
        self._frames = 0
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
    def narrowband(self) -> bool:
        db = self.high_band_db
        return db is not None and db < NARROWBAND_BELOW_DB
