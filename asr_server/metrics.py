"""Every Prometheus collector of the server, in one place, on an injectable registry.

Labels stay bounded: kinds, status codes and channels counts, never stream ids.
"""

from __future__ import annotations

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)

from asr_server.errors import Status

LATENCY_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)

# The label values the counters below can take, each series made at 0 when the server
# starts: one that first appears at 1 hides that increment from rate() and increase(),
# and an alert or a dashboard panel over it shows "no data" on a healthy replica.
ERROR_CODES = tuple(status.value for status in Status) + ("CANCELLED",)
STREAM_OUTCOMES = ("OK", *ERROR_CODES)
REFUSAL_REASONS = (
    "draining",
    "loading",
    "capacity",
    "client_limit",
    "client_pending_limit",
    "pending_limit",
    "client_unanswered_limit",
    "open_call_limit",
    "lasting_call_limit",
)
TIMEOUT_KINDS = ("config", "idle", "request")
AUTH_FAILURE_REASONS = ("missing_token", "wrong_token", "permission")


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        if registry is None:  # a private registry still reports CPU, memory, GC of the process
            for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
                r.register(collector)
        self.active_streams = Gauge("asr_active_streams", "Open recognition streams.", registry=r)
        self.max_streams = Gauge("asr_max_streams", "Configured stream limit.", registry=r)
        self.speaking_channels = Gauge(
            "asr_speaking_channels",
            "Channels inside an utterance now (the rest are silent and cost no engine time).",
            registry=r,
        )
        self.streams = Counter(
            "asr_streams_total", "Streams by outcome (status code name).", ["code"], registry=r
        )
        self.stream_errors = Counter(
            "asr_stream_errors_total",
            "Calls that ended with an error, by status.",
            ["code"],
            registry=r,
        )
        self.audio_received = Counter(
            "asr_audio_received_seconds_total",
            "Audio received (seconds, all channels).",
            registry=r,
        )
        self.audio_processed = Counter(
            "asr_audio_processed_seconds_total",
            "Audio through VAD (seconds, all channels).",
            registry=r,
        )
        self.buffered_audio = Gauge(
            "asr_buffered_audio_seconds",
            "Audio received but not yet processed, all streams.",
            registry=r,
        )
        self._buffered_samples = 0  # what buffered_audio shows, counted exactly
        self.results = Counter("asr_results_total", "Results sent, by kind.", ["kind"], registry=r)
        self.early_finals_kept = Counter(
            "asr_early_finals_kept_total",
            "Finals decoded early in a pause that a short sound then broke, used after all "
            "at the end of the turn because Silero heard no speech in that sound.",
            registry=r,
        )
        self.turn_model = Histogram(
            "asr_turn_model_seconds",
            "Questions to the turn model (SEMANTIC streams), by how long each took; it runs "
            "beside the engine on the same cores.",
            buckets=(0.02, 0.05, 0.1, 0.2, 0.5, 1.0),
            registry=r,
        )
        self.turn_model_skipped = Counter(
            "asr_turn_model_skipped_total",
            "Questions to the turn model left unasked: the turn ended (the client's finalize) "
            "or speech resumed before they came to be asked. On a stream whose client ends its "
            "turns itself within 0.3 s of pause, a question waits for the pause's early final.",
            registry=r,
        )
        self.turn_phone_band = Counter(
            "asr_turn_phone_band_channels_total",
            "SEMANTIC channels sent at more than 8 kHz whose speech has nothing above a phone "
            "line's band (a call resampled on its way): the turn model is asked as on a phone "
            "line (ASR_TURN__NARROWBAND_THRESHOLD), as for audio sent at 8 kHz.",
            registry=r,
        )
        self.finals_without_speech = Counter(
            "asr_finals_without_speech_total",
            "Utterances that got no final because Whisper, decoding them after the previous "
            "final, heard no new words, and Silero heard no speech in them (a noise the voice "
            "detector took for speech; decoded alone, Whisper now and then made words up).",
            registry=r,
        )
        self.carry_fallbacks = Counter(
            "asr_carry_fallbacks_total",
            "Finals decoded after the previous one that were decoded alone instead: they lost "
            "words, or read the utterance unlike its partials, which the decode alone matched.",
            registry=r,
        )
        self.looped_tails_trimmed = Counter(
            "asr_looped_tails_trimmed_total",
            "Finals whose end re-read a phrase or passage of three or more words (word for "
            "word, or with a word in five altered) that the utterance's latest partial, which "
            "heard nearly all of it, read fewer times: Whisper looping at the end of its "
            "audio. The repeat was cut.",
            registry=r,
        )
        self.held_pauses_read_on = Counter(
            "asr_held_pauses_read_on_total",
            "SEMANTIC finals that stopped before a pause the turn model held open, though "
            "speech went on after it: the rest was decoded on its own and joined to them.",
            registry=r,
        )
        self.carry_skipped_under_load = Counter(
            "asr_carry_skipped_under_load_total",
            "Final decodes made without the previous final's audio and text because other "
            "finals were queued: under load, carried context backs off.",
            registry=r,
        )
        self.pause_splits = Counter(
            "asr_pause_splits_total",
            "Utterances split at a pause shorter than the silence that ends one (long ones, "
            "or at a 500 ms pause where silence_ms is longer or turn_threshold is 1: "
            "streaming.split_at_pause_after_s), "
            "with the final decoded 200 ms into it.",
            registry=r,
        )
        self.speech_events = Counter(
            "asr_speech_events_total",
            "Speech events sent: started, ended, resumed (after an eager result), finalized "
            "(a client's finalize done).",
            ["type"],
            registry=r,
        )
        self.engine_queue_wait = Histogram(
            "asr_engine_queue_wait_seconds",
            "Time a request waited for the engine.",
            ["kind"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.engine_inference = Histogram(
            "asr_engine_inference_seconds",
            "Engine call duration.",
            ["kind"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.engine_batch_size = Histogram(
            "asr_engine_batch_size",
            "Requests per engine call.",
            buckets=(1, 2, 4, 8, 16, 32),
            registry=r,
        )
        self.engine_workers = Gauge(
            "asr_engine_workers", "Engine calls that can run at once (capacity).", registry=r
        )
        self.engine_busy_workers = Gauge(
            "asr_engine_busy_workers", "Engine calls running now (load).", registry=r
        )
        self.engine_busy_seconds = Counter(
            "asr_engine_busy_seconds_total",
            "Worker-seconds spent in engine calls; its rate over asr_engine_workers is the "
            "engine utilisation.",
            registry=r,
        )
        self.engine_timeouts = Counter(
            "asr_engine_timeouts_total",
            "Engine calls that had not returned within engine.call_timeout_s (a stuck "
            "engine: the replica reports NOT_SERVING from the first).",
            registry=r,
        )
        self.engine_queue_depth = Gauge(
            "asr_engine_queue_depth", "Requests waiting for the engine.", registry=r
        )
        self.partials_superseded = Counter(
            "asr_partials_superseded_total", "Queued partials replaced by a newer one.", registry=r
        )
        self.time_to_first_partial = Histogram(
            "asr_time_to_first_partial_seconds",
            "From speech start (audio arrival) to the utterance's first partial.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.final_latency = Histogram(
            "asr_final_latency_seconds",
            "From the arrival of the audio that ended an utterance to its final result.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.final_confidence = Histogram(
            "asr_final_confidence",
            "Result.confidence of each final (the decoded tokens' geometric mean "
            "probability): a shift down says the audio got worse (a noisy line, a codec).",
            buckets=(0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0),
            registry=r,
        )
        self.finalize_answer = Histogram(
            "asr_finalize_answer_seconds",
            "From a client's FINALIZE arriving to its FINALIZED (the final it ended sent "
            "first): how long a voice agent that finalizes at its own VAD's stop waits.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.model_loaded = Gauge("asr_model_loaded", "1 once the model is loaded.", registry=r)
        # -- exposure: authentication, per-client use, refusals (docs/security.md)
        self.auth_failures = Counter(
            "asr_auth_failures_total",
            "Calls refused before any handler ran, by reason (missing_token, wrong_token, "
            "permission).",
            ["reason"],
            registry=r,
        )
        self.client_active_streams = Gauge(
            "asr_client_active_streams",
            "Open calls per client identity (anonymous: unauthenticated; other: past the "
            "label limit).",
            ["client"],
            registry=r,
        )
        self.client_streams = Counter(
            "asr_client_streams_total",
            "Calls admitted per client identity: given a seat, past every limit.",
            ["client"],
            registry=r,
        )
        self.refused_streams = Counter(
            "asr_refused_streams_total",
            "Calls refused at admission, by reason (draining, loading, capacity, client_limit, "
            "client_pending_limit, pending_limit, client_unanswered_limit; open_call_limit "
            "and lasting_call_limit: health checks and Watch or reflection calls past their "
            "caps).",
            ["reason"],
            registry=r,
        )
        self.stream_timeouts = Counter(
            "asr_stream_timeouts_total",
            "Calls ended for sending nothing in time, by kind (config, idle, request: a "
            "Recognize call's one message).",
            ["kind"],
            registry=r,
        )
        self.pending_streams = Gauge(
            "asr_pending_streams", "Calls open but still waiting for their config.", registry=r
        )
        self.credential_reloads = Counter(
            "asr_credential_reloads_total",
            "Reloads of the TLS files (tls) or the token file (tokens), by outcome (ok, failed).",
            ["file", "outcome"],
            registry=r,
        )

        for labels, values in (
            (self.streams, STREAM_OUTCOMES),
            (self.stream_errors, ERROR_CODES),
            (self.refused_streams, REFUSAL_REASONS),
            (self.stream_timeouts, TIMEOUT_KINDS),
            (self.auth_failures, AUTH_FAILURE_REASONS),
        ):
            for value in values:
                labels.labels(value)

    def watch_reloads(self, file: str) -> None:
        """``file`` (tls, tokens) is reloaded on change: its outcomes counted from 0."""
        for outcome in ("ok", "failed"):
            self.credential_reloads.labels(file, outcome)

    def add_buffered_samples(self, count: int, sample_rate: int) -> None:
        """``count`` samples (at ``sample_rate``) more, or fewer, wait to be processed. The
        gauge is set from an exact count: float increments and decrements of every chunk
        left it at -5e-16 on an idle server."""
        self._buffered_samples += count
        self.buffered_audio.set(self._buffered_samples / sample_rate)
