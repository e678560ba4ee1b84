"""Wire decoding, G.711 tables, channel split and resampling."""

from __future__ import annotations

import numpy as np
import pytest

from asr_server.audio.decode import AudioDecoder, AudioFormat, AudioFormatError, Encoding
from asr_server.audio.g711 import (
    ALAW_TO_PCM16,
    MULAW_TO_PCM16,
    alaw_decode,
    alaw_encode,
    mulaw_decode,
    mulaw_encode,
)

# Reference G.711 encoders, written from the ITU-T G.711 segment tables (the classic
# Sun g711.c), independent of the decoder tables under test.
_SEG_END = [0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF, 0x3FFF, 0x7FFF]


def _linear_to_ulaw(pcm: int) -> int:
    bias, clip = 0x84, 32635
    mask = 0x7F if pcm < 0 else 0xFF
    pcm = min(abs(pcm), clip) + bias
    seg = next((i for i, end in enumerate(_SEG_END) if pcm <= end), 8)
    if seg >= 8:
        return 0x7F ^ mask
    return ((seg << 4) | ((pcm >> (seg + 3)) & 0xF)) ^ mask


def _linear_to_alaw(pcm: int) -> int:
    pcm >>= 3  # 13-bit magnitude
    if pcm >= 0:
        mask = 0xD5
    else:
        mask = 0x55
        pcm = -pcm - 1
    seg = next(
        (
            i
            for i, end in enumerate([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])
            if pcm <= end
        ),
        8,
    )
    if seg >= 8:
        return 0x7F ^ mask
    aval = seg << 4
    aval |= (pcm >> 1) & 0xF if seg < 2 else (pcm >> seg) & 0xF
    return aval ^ mask


def test_mulaw_known_vectors() -> None:
    # 0xFF and 0x7F are the two zeros; 0x00/0x80 the extremes (ITU-T G.711 table 2)
    assert MULAW_TO_PCM16[0xFF] == 0 and MULAW_TO_PCM16[0x7F] == 0
    assert MULAW_TO_PCM16[0x00] == -32124 and MULAW_TO_PCM16[0x80] == 32124
    assert MULAW_TO_PCM16[0xF0] == 120  # smallest segment, step 8 around 0


def test_alaw_known_vectors() -> None:
    assert ALAW_TO_PCM16[0xD5] == 8 and ALAW_TO_PCM16[0x55] == -8
    assert ALAW_TO_PCM16[0xAA] == 32256 and ALAW_TO_PCM16[0x2A] == -32256


@pytest.mark.parametrize(
    ("encode", "table"), [(_linear_to_ulaw, MULAW_TO_PCM16), (_linear_to_alaw, ALAW_TO_PCM16)]
)
def test_g711_tables_invert_the_reference_encoder(encode, table) -> None:  # type: ignore[no-untyped-def]
    for code in range(256):
        value = int(table[code])
        # every code decodes to a value that the reference encoder maps back to an
        # equivalent code (μ-law's two zeros aside)
        assert table[encode(value)] == value
    # and quantising a ramp stays within the segment's step of the input
    for pcm in range(-32000, 32000, 97):
        decoded = int(table[encode(pcm)])
        assert abs(decoded - pcm) <= max(16, abs(pcm) // 16)


def test_g711_decode_bytes() -> None:
    assert mulaw_decode(bytes([0xFF, 0x80])).tolist() == [0, 32124]
    assert alaw_decode(bytes([0xD5])).tolist() == [8]


def test_linear16_and_float32_decode_to_the_same_samples() -> None:
    x = np.array([0, 16384, -16384, 32767], dtype="<i2")
    pcm = AudioDecoder(AudioFormat(Encoding.LINEAR16, 16_000)).decode(x.tobytes())[0]
    flt = AudioDecoder(AudioFormat(Encoding.FLOAT32, 16_000)).decode(
        (x / 32768.0).astype("<f4").tobytes()
    )[0]
    np.testing.assert_allclose(pcm, [0, 0.5, -0.5, 32767 / 32768], atol=1e-6)
    np.testing.assert_allclose(flt, pcm, atol=1e-6)


def test_stereo_is_split_into_channels() -> None:
    frames = np.array([[100, -100], [200, -200], [300, -300]], dtype="<i2")
    left, right = AudioDecoder(AudioFormat(Encoding.LINEAR16, 16_000, 2)).decode(frames.tobytes())
    np.testing.assert_allclose(left * 32768, [100, 200, 300])
    np.testing.assert_allclose(right * 32768, [-100, -200, -300])


@pytest.mark.parametrize(
    ("encoding", "channels", "nbytes"),
    [
        (Encoding.LINEAR16, 1, 3),
        (Encoding.FLOAT32, 1, 6),
        (Encoding.LINEAR16, 2, 6),
        (Encoding.MULAW, 2, 3),
    ],
)
def test_partial_frames_are_rejected(encoding: Encoding, channels: int, nbytes: int) -> None:
    decoder = AudioDecoder(AudioFormat(encoding, 16_000, channels))
    with pytest.raises(AudioFormatError, match="not a whole number"):
        decoder.decode(bytes(nbytes))


def test_nan_float_audio_is_rejected() -> None:
    with pytest.raises(AudioFormatError, match="NaN"):
        AudioDecoder(AudioFormat(Encoding.FLOAT32, 16_000)).decode(
            np.array([0.0, np.nan], dtype="<f4").tobytes()
        )


@pytest.mark.parametrize(("rate", "channels"), [(4_000, 1), (96_000, 1), (16_000, 0), (16_000, 9)])
def test_unsupported_formats(rate: int, channels: int) -> None:
    with pytest.raises(AudioFormatError):
        AudioDecoder(AudioFormat(Encoding.LINEAR16, rate, channels))


@pytest.mark.parametrize("rate", [8_000, 22_050, 44_100, 48_000])
def test_resampling_keeps_duration_and_pitch(rate: int) -> None:
    seconds, freq = 2.0, 300.0
    t = np.arange(int(seconds * rate)) / rate
    pcm = (0.5 * np.sin(2 * np.pi * freq * t) * 32767).astype("<i2")
    decoder = AudioDecoder(AudioFormat(Encoding.LINEAR16, rate))
    chunk = rate // 50  # 20 ms frames, as telephony gateways send
    out = [decoder.decode(pcm[i : i + chunk].tobytes())[0] for i in range(0, pcm.size, chunk)]
    y = np.concatenate([*out, decoder.flush()[0]])
    assert abs(y.size - seconds * 16_000) <= 2
    spectrum = np.abs(np.fft.rfft(y[4000:-4000]))
    peak_hz = np.argmax(spectrum) * 16_000 / (y.size - 8000)
    assert abs(peak_hz - freq) < 2.0


def test_vectorised_encoders_match_the_reference() -> None:
    pcm = np.arange(-32768, 32768, 7, dtype=np.int16)
    assert mulaw_encode(pcm) == bytes(_linear_to_ulaw(int(v)) for v in pcm)
    assert alaw_encode(pcm) == bytes(_linear_to_alaw(int(v)) for v in pcm)
