"""WebRTC VAD (webrtcvad-wheels): cheap, deterministic, the default detector. Its
decisions depend on the level: the endpointer raises a quiet channel for it (vad/level.py)."""

from __future__ import annotations

import numpy as np

FRAME_SAMPLES = 480  # 30 ms at 16 kHz, the longest frame webrtcvad accepts


class WebRtcVoiceDetector:
    frame_samples = FRAME_SAMPLES
    blocking = False
    level_sensitive = True

    def __init__(self, mode: int = 3) -> None:
        import webrtcvad

        self._vad = webrtcvad.Vad(mode)

    def speech_probability(self, frame: np.ndarray) -> float:
        pcm = (np.clip(frame, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
        return 1.0 if self._vad.is_speech(pcm, 16_000) else 0.0

    def reset(self) -> None:
        """webrtcvad keeps only a short internal history; nothing to reset."""
