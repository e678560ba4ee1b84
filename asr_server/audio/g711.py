"""G.711 μ-law and A-law expansion (ITU-T G.711) through 256-entry lookup tables."""

from __future__ import annotations

import numpy as np


def _mulaw_table() -> np.ndarray:
    codes = ~np.arange(256, dtype=np.int32) & 0xFF
    sign = codes & 0x80
    exponent = (codes >> 4) & 0x07
    mantissa = codes & 0x0F
    magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
    return np.where(sign != 0, -magnitude, magnitude).astype(np.int16)


def _alaw_table() -> np.ndarray:
    codes = np.arange(256, dtype=np.int32) ^ 0x55
    sign = codes & 0x80
    exponent = (codes >> 4) & 0x07
    mantissa = codes & 0x0F
    magnitude = np.where(
        exponent == 0,
        (mantissa << 4) + 8,
        ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0),
    )
    return np.where(sign != 0, magnitude, -magnitude).astype(np.int16)


MULAW_TO_PCM16 = _mulaw_table()
ALAW_TO_PCM16 = _alaw_table()


def mulaw_decode(data: bytes) -> np.ndarray:
    """μ-law bytes → int16 samples."""
    return MULAW_TO_PCM16[np.frombuffer(data, dtype=np.uint8)]


def alaw_decode(data: bytes) -> np.ndarray:
    """A-law bytes → int16 samples."""
    return ALAW_TO_PCM16[np.frombuffer(data, dtype=np.uint8)]
