"""Audio in: decode wire encodings, split channels, resample to the engine's 16 kHz."""

from asr_server.audio.decode import SAMPLE_RATE, AudioDecoder, AudioFormatError, Encoding

__all__ = ["SAMPLE_RATE", "AudioDecoder", "AudioFormatError", "Encoding"]
