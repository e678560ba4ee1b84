"""G.711 μ-law and A-law (ITU-T G.711): expansion through 256-entry lookup tables, and
the matching compression (used by clients and tests to make telephone audio)."""

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
#: the same, scaled to float32 in [-1, 1]: one table lookup per message on the server
MULAW_TO_FLOAT32 = (MULAW_TO_PCM16 / 32768.0).astype(np.float32)
ALAW_TO_FLOAT32 = (ALAW_TO_PCM16 / 32768.0).astype(np.float32)


def mulaw_decode(data: bytes) -> np.ndarray:
    """μ-law bytes → int16 samples."""
    return MULAW_TO_PCM16[np.frombuffer(data, dtype=np.uint8)]


def alaw_decode(data: bytes) -> np.ndarray:
    """A-law bytes → int16 samples."""
    return ALAW_TO_PCM16[np.frombuffer(data, dtype=np.uint8)]


def mulaw_encode(pcm: np.ndarray) -> bytes:
    """int16 samples → μ-law bytes (the G.711 segment encoder, vectorised)."""
    x = pcm.astype(np.int32)
    mask = np.where(x < 0, 0x7F, 0xFF)
    mag = np.minimum(np.abs(x), 32635) + 0x84
    seg = np.searchsorted(_MULAW_SEG_END, mag)  # first segment whose end >= mag
    code = (seg << 4) | ((mag >> (seg + 3)) & 0x0F)
    return (code ^ mask).astype(np.uint8).tobytes()


def alaw_encode(pcm: np.ndarray) -> bytes:
    """int16 samples → A-law bytes (the G.711 segment encoder, vectorised)."""
    x = pcm.astype(np.int32) >> 3  # 13-bit
    mask = np.where(x >= 0, 0xD5, 0x55)
    mag = np.where(x >= 0, x, -x - 1)
    seg = np.searchsorted(_ALAW_SEG_END, mag)
    over = seg >= 8
    seg = np.minimum(seg, 7)
    mantissa = np.where(seg < 2, mag >> 1, mag >> seg) & 0x0F
    code = np.where(over, 0x7F, (seg << 4) | mantissa)
    return (code ^ mask).astype(np.uint8).tobytes()


_MULAW_SEG_END = np.array([0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF, 0x3FFF, 0x7FFF])
_ALAW_SEG_END = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])
