"""The voice-detector boundary: fixed-size 16 kHz frames in, speech probability out."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class VoiceDetector(Protocol):
    """Scores one frame of 16 kHz float32 audio; keeps whatever state it needs.

    One instance per audio channel: detectors may be stateful (Silero is recurrent).
    """

    #: samples per frame at 16 kHz
    frame_samples: int
    #: True when scoring is heavy enough that it must run off the event loop
    blocking: bool

    def speech_probability(self, frame: np.ndarray) -> float: ...

    def reset(self) -> None: ...


class SpeechCheck(Protocol):
    """A second opinion on a stretch of 16 kHz audio: is anyone speaking in it?
    ``lead_in`` is the audio just before, for context (not judged). Blocking."""

    def __call__(self, audio: np.ndarray, lead_in: np.ndarray) -> bool: ...
