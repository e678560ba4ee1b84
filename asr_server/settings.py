"""The server's one settings tree: environment variables (prefix ``ASR_``) and CLI flags.

Built once at start-up and passed down explicitly; nothing reads the environment later.
Nested fields use ``__``: ``ASR_ENGINE__FINAL_BEAM_SIZE=5``; the common ones also have flat
aliases handled by the CLI (``--model`` sets ``engine.model``).
"""

from __future__ import annotations

import difflib
import ipaddress
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from asr_server.log import LOG_LEVELS


def expand_home(path: Path) -> Path:
    """``~`` and ``~user`` at the start of ``path``; ValueError (a settings error, one line)
    for a user or home that cannot be found."""
    try:
        return path.expanduser()
    except RuntimeError as exc:  # pathlib: "Could not determine home directory."
        raise ValueError(f"cannot expand {str(path)!r}: {exc}") from None


#: a path setting: "~" is the home directory in an env file or systemd's Environment= too,
#: where no shell expands it (ASR_CACHE_DIR=~/models made a folder named "~")
UserPath = Annotated[Path, AfterValidator(expand_home)]

DEFAULT_PORT = 50051
DEFAULT_METRICS_PORT = 9464


class EngineSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused, not ignored

    backend: Literal["faster-whisper", "fake"] = Field(
        "faster-whisper",
        description="The engine (asr_server/engine/factory.py); fake: a scripted engine for "
        "tests and load-balancer drills.",
    )
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
        0,
        ge=0,
        # (CTranslate2 takes any number: 100000 crashed the server, 20000 ran it for minutes)
        le=256,
        description="Threads per inference call; 0 = 1 on CPU (a second thread per call "
        "measured 2-3x slower on 2 cores), 4 on CUDA.",
    )
    workers: int = Field(
        0,
        ge=0,
        le=64,
        description="Concurrent inference calls; 0 = one per core on CPU (a single-threaded "
        "decoder is faster than a multi-threaded one for Whisper's small steps), 1 on CUDA.",
    )
    max_batch_size: int = Field(
        0, ge=0, le=64, description="Requests batched into one call; 0 = 8 on CUDA, 2 on CPU."
    )
    batch_wait_ms: int = Field(
        5, ge=0, le=200, description="How long a worker waits for a batch while others run."
    )
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
    call_timeout_s: float = Field(
        120.0,
        ge=0,
        description="An engine call still running after this long fails its streams "
        "(INTERNAL) and turns health NOT_SERVING, so that an orchestrator replaces the "
        "replica: a stuck engine (a wedged GPU); 0 = no limit. A decode takes seconds.",
    )
    cache_dir: UserPath = Field(
        Path.home() / ".cache" / "streamasr",
        description="Where models shipped in split packages are assembled.",
    )
    min_window_s: float = Field(
        5.0,
        ge=1.0,
        le=30.0,
        description="Shortest encoder window of partials; shorter audio is padded to it, "
        "not to 30 s, and longer audio to its length rounded up to a whole second. 5 s "
        "against 10 s (2026-12-02, 2 cores): partial decodes 40 % cheaper, first partials "
        "60-80 ms sooner, server CPU 11 % lower, finals unchanged.",
    )
    final_min_window_s: float | None = Field(
        None,
        ge=1.0,
        le=30.0,
        description="Shortest encoder window of finals; default 30 s on a GPU, where Whisper "
        "hears short audio padded to its trained 30 s best, and 10 s on a CPU, where 30 s "
        "triples the final's decode and 6-8 s lose words (bench/accuracy_breakdown.py).",
    )


class VadSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused, not ignored

    backend: Literal["webrtc", "silero"] = "webrtc"
    webrtc_mode: int = Field(3, ge=0, le=3, description="webrtcvad aggressiveness.")
    silero_threshold: float = Field(0.5, gt=0.0, lt=1.0)
    start_ms: int = Field(
        120, ge=30, le=2000, description="Voiced audio needed to start an utterance."
    )
    pre_roll_ms: int = Field(300, ge=0, le=2000, description="Audio kept before speech starts.")
    silence_ms: int = Field(500, ge=100, le=10_000, description="Default silence ending speech.")
    max_utterance_ms: int = Field(
        15_000, ge=2_000, le=28_000, description="Default longest utterance before a split."
    )


class TurnSettings(BaseModel):
    """Semantic end of turn (EndpointingConfig.mode SEMANTIC; asr_server/vad/turn.py)."""

    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused, not ignored

    model_path: UserPath | None = Field(
        None,
        description="The Smart Turn ONNX file; default: where `asr-server turn-model` puts it "
        "under the cache directory.",
    )
    # Defaults from bench/turn_bench.py (threshold sweeps on the corpus's multi-sentence
    # recordings): the model is near certain at real turn ends and less so at the pauses
    # inside sentences, so a high first threshold halves the false cut-offs of silence
    # endpointing at the same latency; asking again later with a low one bounds the wait.
    threshold: float = Field(
        0.98, gt=0.0, lt=1.0, description="Turn-complete probability that ends an utterance."
    )
    # On a phone line's band (300-3400 Hz) the model is surer inside turns than on
    # full-band audio and a little less sure at turn ends, so the first ask's 0.98 ended
    # turns at pauses inside them and a turn end seldom reached it anyway; from 0.99 the
    # first ask ends few turns and the second decides, as it did for most of them
    # (bench/turn_bench.py --telephone [band] [--held-out]; docs/end-of-turn.md).
    narrowband_threshold: float = Field(
        0.99,
        gt=0.0,
        le=1.0,
        description="The first ask's threshold on a phone line's speech: audio sent at 8 kHz "
        "or less, or with nothing above 4 kHz at any rate (audio/bandwidth.py); set it to "
        "`threshold` to treat phone lines as full-band audio.",
    )
    probe_ms: int = Field(
        150, ge=60, le=2000, description="Pause after which the turn model is asked."
    )
    speculate_ms: int = Field(
        60,
        ge=30,
        le=2000,
        description="Pause after which the final is decoded ahead, where a turn can end early "
        "in a pause: SEMANTIC streams (before the model's first ask) and streams whose client "
        "has sent a finalize (a voice agent's own VAD). A pause inside the turn wastes that "
        "decode (bench/streaming_bench.py: 60 ms against 90 ms, 25 ms sooner finals for 7 % "
        "more CPU).",
    )
    second_probe_ms: int = Field(
        600,
        ge=0,
        le=10_000,
        description="Pause after which the model is asked again, with second_threshold; "
        "0 = once only.",
    )
    second_threshold: float = Field(
        0.7, gt=0.0, lt=1.0, description="Turn-complete probability at the second probe."
    )
    max_silence_ms: int = Field(
        2000, ge=300, le=10_000, description="Default longest pause a SEMANTIC stream holds."
    )
    eager_threshold: float = Field(
        0.5,
        gt=0.0,
        lt=1.0,
        description="Streams with eager finals: the model's first answer in a pause from which "
        "the early final is sent as an eager result (below threshold, which ends the turn).",
    )

    @model_validator(mode="after")
    def _decode_before_the_first_ask(self) -> TurnSettings:
        # the eager result of a pause waits for the first answer after its decode started
        if self.speculate_ms > self.probe_ms:
            raise ValueError(
                f"turn.speculate_ms ({self.speculate_ms}) must not exceed turn.probe_ms "
                f"({self.probe_ms}): the final's decode starts before the model is asked"
            )
        return self

    @model_validator(mode="after")
    def _eager_below_the_first_asks(self) -> TurnSettings:
        # every stream's eager threshold must be below its first ask's (a stream's config
        # is refused otherwise): a default at or above one refused every stream, SILENCE
        # and Recognize too, behind a "ready" server, blaming a field no client had sent
        for name, first in (
            ("threshold", self.threshold),
            ("narrowband_threshold", self.narrowband_threshold),
        ):
            if self.eager_threshold >= first:
                raise ValueError(
                    f"turn.eager_threshold ({self.eager_threshold:g}) must be below "
                    f"turn.{name} ({first:g}): an eager result is sent below the first "
                    "ask's threshold, which ends the turn"
                )
        return self

    @model_validator(mode="after")
    def _asks_in_order_within_the_longest_pause(self) -> TurnSettings:
        # out of order, an ask was dropped or never came, and SEMANTIC streams became
        # silence endpointing without a word
        if self.max_silence_ms <= self.probe_ms:
            raise ValueError(
                f"turn.max_silence_ms ({self.max_silence_ms}) must exceed turn.probe_ms "
                f"({self.probe_ms}): the pause would end the turn before the model is asked"
            )
        if self.second_probe_ms and not (
            self.probe_ms < self.second_probe_ms < self.max_silence_ms
        ):
            raise ValueError(
                f"turn.second_probe_ms ({self.second_probe_ms}) must come after turn.probe_ms "
                f"({self.probe_ms}) and before turn.max_silence_ms ({self.max_silence_ms}), "
                "or be 0 to ask once"
            )
        return self


class StreamingSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused, not ignored

    partial_interval_ms: int = Field(
        500, ge=100, description="New speech between two partial results."
    )
    max_buffered_audio_s: float = Field(
        4.0,
        gt=0.0,
        le=120.0,
        description="Audio each channel of a stream may hold unprocessed (backpressure).",
    )
    max_audio_message_bytes: int = Field(
        1 << 20, ge=1024, description="Largest audio message on a stream."
    )
    max_stream_duration_s: float = Field(
        4 * 3600,
        gt=0,
        description="Longest stream, in audio received and in wall time (with "
        "config_timeout_s + max_buffered_audio_s of slack); past it the stream ends with "
        "OUT_OF_RANGE.",
    )
    commit_partials: bool = Field(
        False,
        description="Commit the words consecutive partials agree on (Result.stable_text); "
        "the final then continues after them. Off by default: greedy partials forced into "
        "the finals cost 3 WER points on our corpus (bench/accuracy_breakdown.py).",
    )
    agreement: int = Field(
        2, ge=2, le=5, description="Consecutive partials that must agree to commit a word."
    )
    result_queue_size: int = Field(256, ge=8)
    progress_every_s: float = Field(
        5.0,
        ge=0.0,
        le=3600.0,
        description="A progress-only response once this much audio has settled with no "
        "other response to say so (a long silence), so that a resuming client can let go of "
        "it; 0 = only events carry progress.",
    )
    carry_max_s: float = Field(
        10.0,
        ge=0.0,
        le=20.0,
        description="An utterance's final is decoded after the previous final's audio (up to "
        "this long) and text, so a phrase cut at a pause keeps its context; 0 = off.",
    )
    carry_gap_s: float = Field(
        2.0, ge=0.0, le=30.0, description="Longest pause across which a final is carried."
    )
    split_at_pause_after_s: float = Field(
        6.0,
        ge=0.0,
        le=28.0,
        description="An utterance this long (or longer) is split 200 ms into its next pause "
        "of 300 ms or more when speech resumes after it, its final decoded early in that "
        "pause, instead of running on to the length limit (continuous speech got its finals "
        "up to 15 s late; SEMANTIC streams too, where the turn model is unsure at a reader's "
        "pauses, at pauses shorter than silence_ms). In a SILENCE stream whose silence_ms "
        "is over 500, or a SEMANTIC one whose turn_threshold is 1, a pause of 500 ms splits "
        "an utterance of any length (decoded whole, two sentences a second apart often lost "
        "one). 0 = off.",
    )
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
    # an empty variable (ASR_TLS_CLIENT_CA= in a compose file) means unset, not Path(".")
    model_config = SettingsConfigDict(
        env_prefix="ASR_", env_nested_delimiter="__", extra="ignore", env_ignore_empty=True
    )

    host: str = Field(
        "127.0.0.1",
        description="Address to listen on: a name, an IPv4 or an IPv6 address (:: for all, "
        "with or without brackets).",
    )
    port: int = Field(DEFAULT_PORT, ge=0, le=65535)
    metrics_port: int = Field(
        DEFAULT_METRICS_PORT, ge=0, le=65535, description="0 = no metrics endpoint."
    )
    max_streams: int = Field(64, ge=1)
    max_message_bytes: int = Field(
        64 << 20,
        le=(1 << 31) - 1,  # grpc's channel arguments are C ints
        description="Largest gRPC message (a whole file for Recognize); at least a stream's "
        "largest request (largest_stream_request_bytes).",
    )
    drain_timeout_s: float = Field(
        30.0,
        ge=0,
        le=86_400,
        description="On SIGTERM: how long open streams get to finish (a finite number).",
    )
    #: DEBUG logs each final decode and carry decision with the text: transcripts go to
    #: the log, which a deployment may guard less than the transcripts themselves
    log_level: str = "INFO"

    # -- exposure: TLS, authentication, limits (docs/security.md) --------------------------
    tls_cert: UserPath | None = Field(None, description="PEM certificate chain: serve TLS.")
    tls_key: UserPath | None = Field(None, description="PEM private key of tls_cert.")
    tls_client_ca: UserPath | None = Field(
        None, description="PEM CA bundle: require client certificates signed by it (mTLS)."
    )
    insecure: bool = Field(
        False, description="Allow plaintext on a non-loopback address (behind a TLS proxy)."
    )
    auth_tokens: UserPath | None = Field(
        None, description="Token file, one client a line: NAME:SHA256_HEX_OF_TOKEN."
    )
    reflection: bool = Field(True, description="Serve gRPC server reflection.")
    health_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="A second, plaintext port that serves only gRPC health, for probes that "
        "cannot speak TLS (Kubernetes gRPC probes, Docker HEALTHCHECK); 0 = off.",
    )
    max_streams_per_client: int = Field(
        0, ge=0, description="Open calls one client identity may hold; 0 = only max_streams."
    )
    max_pending_streams: int = Field(
        0,
        ge=0,
        description="Calls still waiting for their config; 0 = 2 x max_streams (at least 64).",
    )
    max_pending_streams_per_client: int = Field(
        0,
        ge=0,
        description="Calls one client identity may hold while they wait for their config; "
        "0 = half the pending limit, so no one client can fill it and lock others out.",
    )
    config_timeout_s: float = Field(
        10.0, gt=0, le=3600, description="A stream must send its config within this time."
    )
    idle_timeout_s: float = Field(
        60.0,
        gt=0,
        le=86_400,
        description="A stream that sends no message for this long is ended (silence audio "
        "counts as a message).",
    )
    max_concurrent_streams_per_connection: int = Field(
        1000,
        ge=1,
        le=100_000,
        description="HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS. Call-center gateways multiplex "
        "hundreds of calls on one connection, so it is generous; the pending-call limit and "
        "the config timeout bound what idle streams can hold.",
    )

    engine: EngineSettings = EngineSettings()
    vad: VadSettings = VadSettings()
    turn: TurnSettings = TurnSettings()
    streaming: StreamingSettings = StreamingSettings()

    # Flat shortcuts for the settings operators reach for most (ASR_MODEL rather than
    # ASR_ENGINE__MODEL); when set they override the nested value.
    model: str | None = None
    device: Literal["auto", "cpu", "cuda"] | None = None
    compute_type: str | None = None
    cache_dir: UserPath | None = None

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def pending_stream_limit(self) -> int:
        return self.max_pending_streams or max(64, 2 * self.max_streams)

    @property
    def pending_limit_per_client(self) -> int:
        return self.max_pending_streams_per_client or max(1, self.pending_stream_limit // 2)

    @field_validator("log_level")
    @classmethod
    def _known_log_level(cls, level: str) -> str:
        # logging itself refuses an unknown level only once the settings are taken, with a
        # traceback
        if level.strip().upper() not in LOG_LEVELS:
            raise ValueError(
                f"unknown log level {level!r}: use {', '.join(LOG_LEVELS[:-1])} or {LOG_LEVELS[-1]}"
            )
        return level.strip().upper()

    @field_validator("host")
    @classmethod
    def _bare_host(cls, host: str) -> str:
        # "[::]" and "::" alike: the brackets belong to an address with a port (listen_address)
        host = host.strip()
        return host[1:-1] if host.startswith("[") and host.endswith("]") else host

    @model_validator(mode="after")
    def _streams_fit_in_a_message(self) -> Settings:
        # below it the server starts, and every stream fails RESOURCE_EXHAUSTED
        least = largest_stream_request_bytes(self.streaming)
        if self.max_message_bytes < least:
            raise ValueError(
                f"max_message_bytes ({self.max_message_bytes}) must be at least {least}: "
                "the largest request a stream may send, an audio message of "
                f"streaming.max_audio_message_bytes ({self.streaming.max_audio_message_bytes})"
                " or a config with a prompt and hotwords at their limits, with the bytes "
                "around it"
            )
        return self

    @model_validator(mode="after")
    def _check_exposure(self) -> Settings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("TLS needs both tls_cert and tls_key (--tls-cert and --tls-key)")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("tls_client_ca (mTLS) needs tls_cert and tls_key too")
        if not self.tls and not self.insecure and not is_loopback(self.host):
            raise ValueError(
                f"refusing to serve plaintext on {self.host}: give --tls-cert and --tls-key "
                "(ASR_TLS_CERT, ASR_TLS_KEY), or --insecure (ASR_INSECURE=1) when a proxy in "
                "front terminates TLS"
            )
        return self

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


#: ASR_ variables that the project's other programs read (asr-client's token, the bridge's
#: settings, the tests' corpus folder): not the server's, and not misspelt settings
OTHER_PROGRAMS = ("ASR_TOKEN", "ASR_BRIDGE_", "ASR_SHARED_AUDIO")


def unknown_variables(environ: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """ASR_ variables that no setting reads, as (errors, warnings): pydantic-settings
    skips them, so a misspelt setting (ASR_MAX_STREAM=2) silently kept its default.

    A name inside a settings group (ASR_VAD__SILENCE) can only be meant for this server:
    an error. A name at the top level may belong to another program sharing the ASR_
    prefix: a warning. Each says which setting was probably meant."""
    groups = {
        name: field.annotation
        for name, field in Settings.model_fields.items()
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
    }
    known = [f"ASR_{name.upper()}" for name in Settings.model_fields] + [
        f"ASR_{group.upper()}__{name.upper()}"
        for group, model in groups.items()
        for name in model.model_fields
    ]
    errors, warnings = [], []
    for key in sorted(environ):
        name = key.upper()  # as pydantic-settings reads them: in any case
        if not name.startswith("ASR_") or name.startswith(OTHER_PROGRAMS) or name in known:
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
        hint = f" (did you mean {close[0]}?)" if close else ""
        if "__" in name:
            errors.append(f"{key} is not a setting{hint}")
        else:
            warnings.append(f"{key} is not a setting{hint}: ignored")
    return errors, warnings


class _EngineCacheDir(BaseModel):
    cache_dir: UserPath = EngineSettings.model_fields["cache_dir"].default


class ModelCacheSettings(BaseSettings):
    """Only the model cache directory, read from the environment as Settings reads it, for
    commands that need nothing else (``asr-server turn-model``): the server's other
    settings, such as the image's ASR_HOST=0.0.0.0 without TLS, need not make a valid
    server there."""

    model_config = Settings.model_config

    engine: _EngineCacheDir = _EngineCacheDir()
    cache_dir: UserPath | None = None  # the flat shortcut, which wins, as in Settings

    @property
    def path(self) -> Path:
        return self.cache_dir or self.engine.cache_dir


#: protobuf's framing of one field: its tag and length (a varint of up to 5 bytes), with
#: room for the message that holds it
REQUEST_FRAMING_BYTES = 16
#: a config's fields besides its prompt and hotwords: format, languages, model,
#: endpointing, and a resume's texts (asr-client sends 1000 characters a channel)
CONFIG_OTHER_FIELDS_BYTES = 64 << 10


def largest_stream_request_bytes(streaming: StreamingSettings) -> int:
    """The largest StreamingRecognizeRequest that the stream limits let through, serialized:
    an audio message, or a config (or update) whose prompt and hotwords are at their limits
    in 4-byte UTF-8 characters. ``max_message_bytes`` below it fails every stream."""
    audio = streaming.max_audio_message_bytes + REQUEST_FRAMING_BYTES
    text_chars = streaming.max_prompt_chars + streaming.max_hotwords * streaming.max_hotword_chars
    config = (
        4 * text_chars
        + REQUEST_FRAMING_BYTES * (streaming.max_hotwords + 1)
        + CONFIG_OTHER_FIELDS_BYTES
    )
    return max(audio, config)


def listen_address(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets (``[::]:50051``), as gRPC parses it."""
    try:
        is_ipv6 = ipaddress.ip_address(host).version == 6
    except ValueError:
        is_ipv6 = False
    return f"[{host}]:{port}" if is_ipv6 else f"{host}:{port}"


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach ``host`` (a name other than localhost is not)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
