"""Silero VAD v6, run frame by frame with its recurrent state carried across calls.

The ONNX model ships inside faster-whisper's wheel, so no download is needed.
"""

from __future__ import annotations

import os

import numpy as np

FRAME_SAMPLES = 512  # 32 ms at 16 kHz, what the model was trained on
CONTEXT_SAMPLES = 64  # the model also sees the tail of the previous frame


def silero_model_path() -> str:
    from faster_whisper.utils import get_assets_path

    return os.path.join(get_assets_path(), "silero_vad_v6.onnx")


class SileroVoiceDetector:
    frame_samples = FRAME_SAMPLES
    blocking = True

    def __init__(self) -> None:
        import onnxruntime

        opts = onnxruntime.SessionOptions()
        opts.inter_op_num_threads = 1
        opts.intra_op_num_threads = 1
        opts.log_severity_level = 4
        self._session = onnxruntime.InferenceSession(
            silero_model_path(), providers=["CPUExecutionProvider"], sess_options=opts
        )
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
