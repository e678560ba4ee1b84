"""A plain energy threshold detector: deterministic, for tests and synthetic signals.

Real speech needs webrtc or Silero (noise is loud too); this one exists so logic
tests can drive the endpointer with tones and silence exactly.
"""

from __future__ import annotations

import numpy as np


class EnergyVoiceDetector:
    frame_samples = 480
    blocking = False

    def __init__(self, threshold_rms: float = 0.01) -> None:
        self.threshold_rms = threshold_rms

    def speech_probability(self, frame: np.ndarray) -> float:
        return 1.0 if float(np.sqrt(np.mean(frame * frame))) >= self.threshold_rms else 0.0

    def reset(self) -> None:
        """Stateless."""
