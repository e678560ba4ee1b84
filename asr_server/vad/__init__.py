"""Voice activity detection and endpointing (no asyncio, no grpc: arrays in, events out)."""

from asr_server.vad.base import SpeechCheck, VoiceDetector
from asr_server.vad.endpointer import (
    Endpointer,
    EndpointerConfig,
    SpeechAudio,
    SpeechEnded,
    SpeechStarted,
)
from asr_server.vad.energy import EnergyVoiceDetector
from asr_server.vad.factory import make_voice_detector

__all__ = [
    "Endpointer",
    "EnergyVoiceDetector",
    "EndpointerConfig",
    "SpeechAudio",
    "SpeechEnded",
    "SpeechCheck",
    "SpeechStarted",
    "VoiceDetector",
    "make_voice_detector",
]
