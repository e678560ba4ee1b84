"""Silero VAD v6: run frame by frame with its recurrent state carried across calls (a
stream's voice detector), or over a stretch of audio at once (a second opinion).

The ONNX model ships inside faster-whisper's wheel, so no download is needed. One
session serves the whole process: onnxruntime runs one session from many threads, and
the recurrent state lives with each caller, not in the session.
"""

from __future__ import annotations

import functools
import os

import numpy as np

FRAME_SAMPLES = 512  # 32 ms at 16 kHz, what the model was trained on
CONTEXT_SAMPLES = 64  # the model also sees the tail of the previous frame
#: a speech probability from this up is speech (Silero's own default)
SPEECH_THRESHOLD = 0.5


def silero_model_path() -> str:
    from faster_whisper.utils import get_assets_path

    return os.path.join(get_assets_path(), "silero_vad_v6.onnx")


def load_silero() -> None:
    """Load the model now (it loads on first use otherwise); raises if it cannot."""
    _session()


@functools.cache
def _session():  # type: ignore[no-untyped-def]
    import onnxruntime

    opts = onnxruntime.SessionOptions()
    opts.inter_op_num_threads = 1
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 4
    return onnxruntime.InferenceSession(
        silero_model_path(), providers=["CPUExecutionProvider"], sess_options=opts
    )


class SileroVoiceDetector:
    frame_samples = FRAME_SAMPLES
    blocking = True

    def __init__(self) -> None:
        self._session = _session()
        self.reset()

    def reset(self) -> None:
        self._h = np.zeros((1, 1, 128), dtype=np.float32)
        self._c = np.zeros((1, 1, 128), dtype=np.float32)
        self._context = np.zeros(CONTEXT_SAMPLES, dtype=np.float32)

    def speech_probability(self, frame: np.ndarray) -> float:
        window = np.concatenate([self._context, frame.astype(np.float32)])[None, :]
        out, self._h, self._c = self._session.run(
            None, {"input": window, "h": self._h, "c": self._c}
        )
        self._context = frame[-CONTEXT_SAMPLES:].astype(np.float32)
        return float(np.asarray(out).reshape(-1)[0])


def silero_hears_speech(audio: np.ndarray, lead_in: np.ndarray) -> bool:
    """Whether Silero hears speech anywhere in ``audio``. ``lead_in`` (the audio just
    before it) is run first and not judged: the model's recurrent state carries what it
    heard, and the fading end of a word is speech only to a model that heard the word
    (give it half a second or more).

    Blocking (a few ms per second of audio): call it from a worker thread.
    """
    detector = SileroVoiceDetector()
    lead = lead_in.size - lead_in.size % FRAME_SAMPLES  # whole frames, ending at audio
    for start in range(lead_in.size - lead, lead_in.size, FRAME_SAMPLES):
        detector.speech_probability(lead_in[start : start + FRAME_SAMPLES])
    for start in range(0, audio.size, FRAME_SAMPLES):
        frame = audio[start : start + FRAME_SAMPLES]
        if frame.size < FRAME_SAMPLES:  # the last, partial frame
            frame = np.pad(frame, (0, FRAME_SAMPLES - frame.size))
        if detector.speech_probability(frame) >= SPEECH_THRESHOLD:
            return True
    return False
