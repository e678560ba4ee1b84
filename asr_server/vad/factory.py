"""Builds the configured voice detector for one channel."""

from __future__ import annotations

from asr_server.settings import VadSettings
from asr_server.vad.base import VoiceDetector


def make_voice_detector(settings: VadSettings) -> VoiceDetector:
    if settings.backend == "silero":
        from asr_server.vad.silero import SileroVoiceDetector

        return SileroVoiceDetector()
    from asr_server.vad.webrtc import WebRtcVoiceDetector

    return WebRtcVoiceDetector(settings.webrtc_mode)
