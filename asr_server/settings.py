"""The server's one settings tree: environment variables (prefix ``ASR_``) and CLI flags.

Built once at start-up and passed down explicitly; nothing reads the environment later.
Nested fields use ``__``: ``ASR_ENGINE__BEAM_SIZE=5``; the common ones also have flat
aliases handled by the CLI (``--model`` sets ``engine.model``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_PORT = 50051
DEFAULT_METRICS_PORT = 9464


class EngineSettings(BaseModel):
    model: str = Field(
        "tiny.en",
        description="Model name (tiny.en, base, small), a local CTranslate2 model directory, "
        "or a Hugging Face hub id (needs the internet).",
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"
    compute_type: str = Field(
        "auto", description="CTranslate2 compute type; auto = float16 on CUDA, int8 on CPU."
    )
    cpu_threads: int = Field(
        0, ge=0, description="Threads per inference call; 0 = cores / workers (CPU)."
    )
    workers: int = Field(
        0,
        ge=0,
        le=64,
        description="Concurrent inference calls; 0 = one per core on CPU (a single-threaded "
        "decoder is faster than a multi-threaded one for Whisper's small steps), 1 on CUDA.",
    )
    max_batch_size: int = Field(
        0, ge=0, le=64, description="Requests batched into one call; 0 = 8 on CUDA, 4 on CPU."
    )
    batch_wait_ms: int = Field(5, ge=0, le=200, description="How long to wait for a batch.")
    partial_workers: int = Field(
        0,
        ge=0,
        le=64,
        description="Workers that may run partials at once; 0 = all. Fewer keeps workers free "
        "for finals: lower final latency at moderate load, slower partials at high load.",
    )
    final_beam_size: int = Field(
        5, ge=1, le=10, description="Beam for finals (partials are greedy); 5 measured best."
    )
    cache_dir: Path = Field(
        Path.home() / ".cache" / "streamasr",
        description="Where models shipped in split packages are assembled.",
    )
    min_window_s: float = Field(
        10.0,
        ge=1.0,
        le=30.0,
        description="Shortest encoder window; shorter audio is padded to it, not to 30 s.",
    )


class VadSettings(BaseModel):
    backend: Literal["webrtc", "silero"] = "webrtc"
    webrtc_mode: int = Field(3, ge=0, le=3, description="webrtcvad aggressiveness.")
    silero_threshold: float = Field(0.5, gt=0.0, lt=1.0)
    start_ms: int = Field(120, ge=30, description="Voiced audio needed to start an utterance.")
    pre_roll_ms: int = Field(300, ge=0, le=2000, description="Audio kept before speech starts.")
    silence_ms: int = Field(500, ge=100, le=10_000, description="Default silence ending speech.")
    max_utterance_ms: int = Field(
        15_000, ge=2_000, le=28_000, description="Default longest utterance before a split."
    )


class StreamingSettings(BaseModel):
    partial_interval_ms: int = Field(
        500, ge=100, description="New speech between two partial results."
    )
    max_buffered_audio_s: float = Field(
        4.0, gt=0.0, le=120.0, description="Audio a stream may hold unprocessed (backpressure)."
    )
    max_audio_message_bytes: int = Field(
        1 << 20, ge=1024, description="Largest audio message on a stream."
    )
    max_stream_duration_s: float = Field(
        4 * 3600, gt=0, description="Longest stream; past it the stream ends with OUT_OF_RANGE."
    )
    agreement: int = Field(
        2, ge=2, le=5, description="Consecutive partials that must agree to commit a word."
    )
    result_queue_size: int = Field(256, ge=8)
    context_chars: int = Field(
        0,
        ge=0,
        le=800,
        description="Previous final text (characters) given to the model as context; off by "
        "default: on our corpus it fixed some short utterances and hurt others.",
    )
    # Bounds on the text a config hands the model. Whisper reads only the last 223 prompt
    # tokens (about 900 English characters), yet the whole text is tokenized again for every
    # partial and final: unbounded, a 1 MB prompt costs each decode far more than the audio.
    max_prompt_chars: int = Field(
        2000,
        ge=0,
        description="Longest config.initial_prompt in characters; longer is INVALID_ARGUMENT.",
    )
    max_hotwords: int = Field(
        500, ge=0, description="Most config.hotwords entries; more is INVALID_ARGUMENT."
    )
    max_hotword_chars: int = Field(
        100, ge=1, description="Longest single config.hotwords entry in characters."
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ASR_", env_nested_delimiter="__", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(DEFAULT_PORT, ge=0, le=65535)
    metrics_port: int = Field(
        DEFAULT_METRICS_PORT, ge=0, le=65535, description="0 = no metrics endpoint."
    )
    max_streams: int = Field(64, ge=1)
    max_message_bytes: int = Field(
        64 << 20, description="Largest gRPC message (a whole file for Recognize)."
    )
    drain_timeout_s: float = Field(30.0, ge=0)
    log_level: str = "INFO"

    engine: EngineSettings = EngineSettings()
    vad: VadSettings = VadSettings()
    streaming: StreamingSettings = StreamingSettings()

    # Flat shortcuts for the settings operators reach for most (ASR_MODEL rather than
    # ASR_ENGINE__MODEL); when set they override the nested value.
    model: str | None = None
    device: Literal["auto", "cpu", "cuda"] | None = None
    compute_type: str | None = None
    cache_dir: Path | None = None

    @model_validator(mode="after")
    def _apply_shortcuts(self) -> Settings:
        shortcuts = {
            k: v
            for k, v in {
                "model": self.model,
                "device": self.device,
                "compute_type": self.compute_type,
                "cache_dir": self.cache_dir,
            }.items()
            if v is not None
        }
        if shortcuts:
            self.engine = self.engine.model_copy(update=shortcuts)
            self.model = self.device = self.compute_type = self.cache_dir = None
        return self
