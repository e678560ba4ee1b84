"""Turn a stream's audio messages into 16 kHz float32 arrays, one per channel.

One ``AudioDecoder`` per stream: it keeps the resampler state of each channel so
chunk boundaries leave no clicks, and it checks every message's byte count
against the declared encoding and channel count.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from asr_server.audio.g711 import ALAW_TO_FLOAT32, MULAW_TO_FLOAT32
from asr_server.audio.resample import SoxrStream, resampler_for

#: the pipeline's one rate: every stream is resampled to it, the voice detectors and the
#: engine work at it (an engine declares its rate; the server checks they agree)
SAMPLE_RATE = 16_000
MIN_RATE_HZ = 8_000
MAX_RATE_HZ = 48_000
#: the lowest rate a file or container may say its audio has, for the client and the bridge
#: to resample up into MIN_RATE_HZ..MAX_RATE_HZ: below it no recording holds speech (a
#: 2 kHz band), and a header saying 1 Hz turned each byte of audio into 8,000 samples
LOWEST_SOURCE_RATE_HZ = 4_000
MAX_CHANNELS = 8


def unusable_source_rate(rate_hz: int) -> str | None:
    """Why audio said to be at ``rate_hz`` is refused (below LOWEST_SOURCE_RATE_HZ), or
    None; the client's file command and the bridge's decoder say it alike."""
    if rate_hz >= LOWEST_SOURCE_RATE_HZ:
        return None
    return (
        f"its sample rate is {rate_hz} Hz; rates below {LOWEST_SOURCE_RATE_HZ} Hz are "
        "refused (a damaged or wrong header?)"
    )


class AudioFormatError(ValueError):
    """The declared format is unsupported, or a message does not fit it."""


class Encoding(enum.Enum):
    LINEAR16 = "LINEAR16"
    FLOAT32 = "FLOAT32"
    MULAW = "MULAW"
    ALAW = "ALAW"

    @property
    def bytes_per_sample(self) -> int:
        return _BYTES_PER_SAMPLE[self]


_BYTES_PER_SAMPLE = {Encoding.LINEAR16: 2, Encoding.FLOAT32: 4, Encoding.MULAW: 1, Encoding.ALAW: 1}


@dataclass(frozen=True)
class AudioFormat:
    encoding: Encoding
    sample_rate_hz: int
    channels: int = 1

    def validate(self) -> None:
        if not MIN_RATE_HZ <= self.sample_rate_hz <= MAX_RATE_HZ:
            raise AudioFormatError(
                f"sample_rate_hz {self.sample_rate_hz} is not supported "
                f"(use {MIN_RATE_HZ}-{MAX_RATE_HZ})"
            )
        if not 1 <= self.channels <= MAX_CHANNELS:
            raise AudioFormatError(f"channels {self.channels} is not supported (1-{MAX_CHANNELS})")

    @property
    def frame_bytes(self) -> int:
        """Bytes of one sample on every channel."""
        return self.encoding.bytes_per_sample * self.channels


def decode_samples(data: bytes, encoding: Encoding) -> np.ndarray:
    """Wire bytes → interleaved float32 samples in [-1, 1]."""
    if encoding is Encoding.LINEAR16:
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
    if encoding is Encoding.FLOAT32:
        samples = np.frombuffer(data, dtype="<f4").astype(np.float32)
        if not np.all(np.isfinite(samples)):
            raise AudioFormatError("FLOAT32 audio contains NaN or infinity")
        return np.clip(samples, -1.0, 1.0)
    table = MULAW_TO_FLOAT32 if encoding is Encoding.MULAW else ALAW_TO_FLOAT32
    return table[np.frombuffer(data, dtype=np.uint8)]


def partial_frame_error(size: int, fmt: AudioFormat, what: str) -> str | None:
    """Why ``size`` bytes of ``what`` cannot be audio of ``fmt`` (None: whole frames)."""
    if size % fmt.frame_bytes == 0:
        return None
    return (
        f"{what} of {size} bytes is not a whole number of {fmt.frame_bytes}-byte frames "
        f"({fmt.encoding.name}, {fmt.channels} channel(s))"
    )


class AudioDecoder:
    """Decodes one stream's messages into per-channel 16 kHz float32 arrays."""

    def __init__(self, fmt: AudioFormat) -> None:
        fmt.validate()
        self.format = fmt
        self._resamplers = (
            [resampler_for(fmt.sample_rate_hz, SAMPLE_RATE) for _ in range(fmt.channels)]
            if fmt.sample_rate_hz != SAMPLE_RATE
            else None
        )
        self.input_samples = 0  # per channel, at the input rate

    def decode(self, data: bytes) -> list[np.ndarray]:
        """One audio message → one 16 kHz array per channel."""
        partial = partial_frame_error(len(data), self.format, "audio message")
        if partial:
            raise AudioFormatError(partial)
        samples = decode_samples(data, self.format.encoding)
        frames = samples.reshape(-1, self.format.channels)
        self.input_samples += frames.shape[0]
        return self._resample([frames[:, c] for c in range(self.format.channels)], last=False)

    def catch_up(self) -> list[np.ndarray]:
        """What soxr still holds of the audio so far (40-115 ms), now: a FINALIZE covers
        all of it; the stream goes on after it.

        This module's own resampler holds back only half its filter (1.6 ms at 22.05 kHz,
        3.2 ms at 8 kHz, less than a voice-detector frame), and that stays where it is:
        emitting it changed 6 of 50 finals in the corpus run where the client finalizes at
        each pause (WER 8.06 -> 8.80 %, paired; docs/benchmarks.md), from a few
        milliseconds of silence at their ends; nothing said is in them."""
        if self._resamplers is None:
            return [np.zeros(0, dtype=np.float32) for _ in range(self.format.channels)]
        return [
            r.catch_up() if isinstance(r, SoxrStream) else np.zeros(0, np.float32)
            for r in self._resamplers
        ]

    def flush(self) -> list[np.ndarray]:
        """The resamplers' tail at end of stream."""
        empty = np.zeros(0, dtype=np.float32)
        return self._resample([empty] * self.format.channels, last=True)

    def _resample(self, channels: list[np.ndarray], *, last: bool) -> list[np.ndarray]:
        if self._resamplers is None:
            return [np.ascontiguousarray(c, dtype=np.float32) for c in channels]
        return [r.process(c, last=last) for r, c in zip(self._resamplers, channels, strict=True)]
