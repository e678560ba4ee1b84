"""Every Prometheus collector of the bridge, in one place, on an injectable registry.

Served at ``GET /metrics`` on the bridge's own port. Labels stay bounded: refusal
reasons from a fixed list and gRPC status names, never a session id, origin or address.
"""

from __future__ import annotations

from typing import Literal

import grpc
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)

RefusalReason = Literal[
    "origin",  # the page's Origin is not allowed (HTTP 403 on the handshake)
    "token",  # the browser's token is missing or wrong
    "capacity",  # the bridge is at --max-sessions
    "client_limit",  # the browser's address is at --max-sessions-per-client
    "server_unavailable",  # the gRPC server cannot be reached (down, TLS handshake failed)
    "server_auth",  # the gRPC server refused the bridge's own credentials
    "server_capacity",  # the gRPC server is at its stream limit
]
REFUSAL_REASONS: tuple[RefusalReason, ...] = (
    "origin",
    "token",
    "capacity",
    "client_limit",
    "server_unavailable",
    "server_auth",
    "server_capacity",
)

#: a stream the server ends with one of these before its first response was refused by it
SERVER_REFUSALS: dict[grpc.StatusCode, RefusalReason] = {
    grpc.StatusCode.UNAUTHENTICATED: "server_auth",
    grpc.StatusCode.PERMISSION_DENIED: "server_auth",
    grpc.StatusCode.UNAVAILABLE: "server_unavailable",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "server_capacity",
}

#: the server's lag stays well under a second when it keeps up; the tail shows overload
LAG_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)


class BridgeMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        if registry is None:  # a private registry still reports CPU, memory, GC of the process
            for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
                r.register(collector)
        self.active_sessions = Gauge(
            "asr_bridge_active_sessions", "Browser sessions holding a slot now.", registry=r
        )
        self.max_sessions = Gauge(
            "asr_bridge_max_sessions", "Configured session limit (--max-sessions).", registry=r
        )
        self.sessions = Counter(
            "asr_bridge_sessions_total",
            "Browser sessions admitted (past the origin, token and capacity checks).",
            registry=r,
        )
        self.refusals = Counter(
            "asr_bridge_refusals_total",
            "WebSockets refused, by reason.",
            ["reason"],
            registry=r,
        )
        for reason in REFUSAL_REASONS:  # present at 0, so rate() and alerts see them from start
            self.refusals.labels(reason)
        self.session_errors = Counter(
            "asr_bridge_session_errors_total",
            "Admitted sessions that ended with an error event, by gRPC status name.",
            ["code"],
            registry=r,
        )
        self.audio_received = Counter(
            "asr_bridge_audio_received_bytes_total",
            "int16 PCM received from browsers and handed to the server.",
            registry=r,
        )
        self.resumes = Counter(
            "asr_bridge_resumes_total",
            "gRPC streams continued on a new call after a break or a draining server; the "
            "browser's WebSocket stays open.",
            registry=r,
        )
        self.server_lag = Histogram(
            "asr_bridge_server_lag_seconds",
            "How far the server's recognition was behind the audio, per response (Progress.lag_s).",
            buckets=LAG_BUCKETS,
            registry=r,
        )

    def refused(self, reason: RefusalReason) -> None:
        self.refusals.labels(reason).inc()

    def stream_failed(self, code: grpc.StatusCode, *, answered: bool) -> None:
        """A session's gRPC stream ended with ``code``: a refusal of the session if the
        server never ``answered`` it (down, full, the bridge's credentials refused), on
        every protocol the bridge speaks. The caller counts the session's error event."""
        if code in SERVER_REFUSALS and not answered:
            self.refused(SERVER_REFUSALS[code])
