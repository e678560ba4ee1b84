"""Who is calling: authentication and client identity, once per call, before any handler.

The interceptor wraps every method handler except gRPC health's ``Check`` (probes must stay
open; its ``Watch``, a stream that never ends, is for authenticated clients only), so
the check runs in the call's own task with its ``ServicerContext`` at hand: the token from
``authorization: Bearer`` metadata, or the verified client certificate under mTLS. A call
that fails is aborted with UNAUTHENTICATED (or PERMISSION_DENIED) before the servicer runs,
so no session state exists and nothing is read from the stream. The identity then sits in
a contextvar for the servicer's quotas, every log line of the call, and a bounded metrics
label.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import grpc

from asr_server.errors import AsrError, Status
from asr_server.log import client_var
from asr_server.metrics import Metrics
from asr_server.transport.auth import TokenRegistry
from asr_server.transport.status import GRPC_CODES

logger = logging.getLogger(__name__)

#: the one method anyone may call: load balancers and kubelets probe without credentials.
#: Not Watch: each open Watch is a call that never ends, and thousands of them from callers
#: without a token would hold the server's memory (no probe uses it)
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
OPEN_METHODS = frozenset({HEALTH_CHECK})
#: distinct client labels on metrics before the rest are counted as "other"
MAX_CLIENT_LABELS = 100
ANONYMOUS = "anonymous"


@dataclass(frozen=True)
class Identity:
    #: who the client is, for logs and per-client quotas: a token's name, a certificate's
    #: subject, or ``ip:ADDRESS`` for an unauthenticated caller
    name: str
    #: the bounded form of ``name`` for metrics labels
    label: str
    authenticated: bool


identity_var: ContextVar[Identity | None] = ContextVar("identity", default=None)


class ClientLabels:
    """Bounded metrics labels: the first MAX_CLIENT_LABELS identities keep their names."""

    def __init__(self, limit: int = MAX_CLIENT_LABELS) -> None:
        self._limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, name: str) -> str:
        with self._lock:
            if name in self._seen:
                return name
            if len(self._seen) < self._limit:
                self._seen.add(name)
                return name
        return "other"


class Authenticator:
    """Decides a call's identity from its metadata and TLS peer, or refuses it."""

    def __init__(self, tokens: TokenRegistry | None, *, mtls: bool) -> None:
        self.tokens = tokens
        self.mtls = mtls
        self._labels = ClientLabels()

    @property
    def required(self) -> bool:
        return self.tokens is not None or self.mtls

    def identify(self, context: grpc.aio.ServicerContext) -> Identity:
        if self.tokens is not None:
            token = _bearer_token(context.invocation_metadata() or ())
            if not token:
                raise AsrError(
                    Status.UNAUTHENTICATED,
                    "this server needs a token: send 'authorization: Bearer <token>' metadata "
                    "(asr-client --token or ASR_TOKEN)",
                )
            name = self.tokens.identify(token)
            if name is None:
                raise AsrError(Status.UNAUTHENTICATED, "invalid token")
            return Identity(name, self._labels(name), True)
        if self.mtls:
            name = _certificate_subject(context.auth_context())
            if name is None:
                raise AsrError(
                    Status.PERMISSION_DENIED,
                    "the client certificate has no subject name (CN or SAN) to identify it by",
                )
            return Identity(name, self._labels(name), True)
        return Identity(f"ip:{_peer_host(context.peer())}", ANONYMOUS, False)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, authenticator: Authenticator, metrics: Metrics) -> None:
        self.authenticator = authenticator
        self.metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method in OPEN_METHODS:
            return handler
        return _wrap(handler, self._admit)

    async def _admit(self, context: grpc.aio.ServicerContext) -> bool:
        """Set the call's identity; False (after aborting the call) if it is refused."""
        try:
            identity = self.authenticator.identify(context)
        except AsrError as exc:
            reason = "permission" if exc.status is Status.PERMISSION_DENIED else "token"
            if self.authenticator.tokens is not None:
                reason = _token_failure(context)
            self.metrics.auth_failures.labels(reason).inc()
            logger.warning(
                "refused a call from %s: %s (%s)", _peer_host(context.peer()), exc, reason
            )
            await context.abort(GRPC_CODES[exc.status], exc.message)
            return False
        identity_var.set(identity)
        client_var.set(identity.name)
        return True


class HealthCheckOnly(grpc.aio.ServerInterceptor):
    """For the plaintext health port: ``Check`` and nothing else (UNIMPLEMENTED), so the
    port that needs no credentials holds no call open (see OPEN_METHODS)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        if handler_call_details.method != HEALTH_CHECK:
            return None
        return await continuation(handler_call_details)


def _wrap(
    handler: grpc.RpcMethodHandler, admit: Callable[[Any], Awaitable[bool]]
) -> grpc.RpcMethodHandler:
    """The same handler, with ``admit(context)`` run before its behaviour."""
    kind = next(
        k
        for k in ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
        if getattr(handler, k) is not None
    )
    inner = getattr(handler, kind)
    if inspect.isasyncgenfunction(inner):

        async def streamed(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if await admit(context):
                async for response in inner(request, context):
                    yield response

        behaviour: Any = streamed
    else:

        async def called(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if await admit(context):
                return await inner(request, context)
            return None

        behaviour = called
    return handler._replace(**{kind: behaviour})  # type: ignore[attr-defined]


def _bearer_token(metadata: Any) -> str:
    values = [v for k, v in metadata if k == "authorization"]
    if len(values) != 1 or not isinstance(values[0], str):
        return ""
    scheme, _, token = values[0].partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _token_failure(context: grpc.aio.ServicerContext) -> str:
    """Why a token was refused, for the metrics label: missing or wrong."""
    metadata = context.invocation_metadata() or ()
    return "wrong_token" if _bearer_token(metadata) else "missing_token"


def _certificate_subject(auth_context: dict[str, list[bytes]]) -> str | None:
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        for value in auth_context.get(key, ()):
            name = value.decode("utf-8", "replace").strip()
            if name:
                return name[:128]
    return None


def _peer_host(peer: str | None) -> str:
    """``ipv4:1.2.3.4:5678`` → ``1.2.3.4``; ``ipv6:[::1]:5678`` → ``::1``."""
    if not peer:
        return "unknown"
    _, _, address = peer.partition(":")
    host, _, _port = address.rpartition(":")
    return host.strip("[]") or address
