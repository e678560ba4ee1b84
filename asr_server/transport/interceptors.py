"""Who is calling: authentication and client identity, once per call, before any handler.

The interceptor wraps every method handler except gRPC health's ``Check`` (probes must stay
open; its ``Watch``, a stream that never ends, is for authenticated clients only), so
the check runs in the call's own task with its ``ServicerContext`` at hand: the token from
``authorization: Bearer`` metadata, or the verified client certificate under mTLS. A call
that fails is aborted with UNAUTHENTICATED (or PERMISSION_DENIED) before the servicer runs,
so no session state exists and nothing is read from the stream. The identity then sits in
a contextvar for the servicer's quotas, every log line of the call, and a bounded metrics
label.

No call outside admission's counts can be held open at will: a method with one request
message (health's) is served as a streaming one, so that credentials are checked before the
request is waited for and the request must come within REQUEST_TIMEOUT_S; ``Check`` calls
in flight are capped per address, and calls that last (``Watch``, reflection) per client.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import threading
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import grpc

from asr_server.errors import AsrError, Status
from asr_server.log import client_var
from asr_server.metrics import Metrics
from asr_server.transport.auth import Credential, TokenRegistry
from asr_server.transport.reads import read_within
from asr_server.transport.status import ENDED_BY_SERVER, GRPC_CODES, end_by_server

logger = logging.getLogger(__name__)

#: the one method anyone may call: load balancers and kubelets probe without credentials.
#: Not Watch: each open Watch is a call that never ends, and thousands of them from callers
#: without a token would hold the server's memory (no probe uses it)
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
OPEN_METHODS = frozenset({HEALTH_CHECK})
#: calls that stay open as long as the client likes, outside admission's stream counts
LASTING_METHODS = frozenset(
    {
        "/grpc.health.v1.Health/Watch",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    }
)
#: how long a call of a one-request method may take to send it (clients send it with the
#: headers); until then the call is held open, and Check is open to anyone
REQUEST_TIMEOUT_S = 1.0
#: Check calls in flight from one address, and in all, on each port: a probe's is
#: answered in a millisecond, so only calls held without their request come near these
OPEN_CALLS_PER_PEER = 100
OPEN_CALLS = 1000
#: Watch and reflection calls one client identity may hold open at once
LASTING_CALLS_PER_CLIENT = 8
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
    #: the token the call presented, as the token file holds it (None without tokens)
    credential: Credential | None = None


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
            credential = self.tokens.credential_of(token)
            if credential is None:
                raise AsrError(Status.UNAUTHENTICATED, "invalid token")
            return Identity(credential[0], self._labels(credential[0]), True, credential)
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
        self._open = InFlight()
        #: per client identity, the tasks of its lasting calls (their number is its count)
        self._lasting: dict[str, set[asyncio.Task[Any]]] = {}
        #: per token (name and hash), the tasks of all its calls (revoking it ends them)
        self._by_token: dict[Credential, set[asyncio.Task[Any]]] = {}
        if authenticator.tokens is not None:
            loop = asyncio.get_running_loop()
            authenticator.tokens.on_revoked(
                lambda revoked: loop.call_soon_threadsafe(self.end_calls_of, revoked)
            )

    def end_lasting_calls(self) -> int:
        """End every Watch and reflection call with UNAVAILABLE (a drain whose streams have
        left: these would otherwise hold the server's graceful stop for its whole grace
        period). Their handlers are cancelled, and each call's task then ends it with a
        status (``_admit``): a cancelled handler alone left the call open."""
        tasks = {task for calls in self._lasting.values() for task in calls}
        return end_by_server(tasks, grpc.StatusCode.UNAVAILABLE, "the server is shutting down")

    def end_calls_of(self, revoked: frozenset[Credential]) -> int:
        """End every open call (streams, Recognize, Watch, reflection) made with a
        ``revoked`` token with UNAUTHENTICATED: the token file no longer holds it. By token,
        not by name: the calls a client makes with its name's new token go on."""
        tasks = {task for token in revoked for task in self._by_token.get(token, ())}
        ended = end_by_server(tasks, grpc.StatusCode.UNAUTHENTICATED, "token revoked")
        if ended:
            names = sorted({name for name, _ in revoked})
            logger.warning("ended %d open call(s) of revoked token(s) of %s", ended, names)
        return ended

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None:
            return handler
        if method in OPEN_METHODS:
            return _wrap(handler, lambda context: self._open.hold(context, self.metrics))
        return _wrap(handler, lambda context: self._admit(context, method in LASTING_METHODS))

    @asynccontextmanager
    async def _admit(self, context: grpc.aio.ServicerContext, lasting: bool) -> AsyncIterator[None]:
        """Set the call's identity, and hold its place among the client's lasting calls;
        aborts the call if it is refused."""
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
        identity_var.set(identity)
        client_var.set(identity.name)
        name = identity.name
        if lasting and len(self._lasting.get(name, ())) >= LASTING_CALLS_PER_CLIENT:
            self.metrics.refused_streams.labels("lasting_call_limit").inc()
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"client {name} has {LASTING_CALLS_PER_CLIENT} health Watch or reflection "
                "calls open, the limit: close one first",
            )
        task = asyncio.current_task()
        assert task is not None  # (a handler runs in its call's task)
        # its places: among the client's lasting calls, and (to be ended if its token is
        # revoked) among its token's calls; a certificate cannot be revoked here
        held: list[tuple[dict[Any, set[asyncio.Task[Any]]], Any]] = []
        if lasting:
            held.append((self._lasting, name))
        if identity.credential is not None:
            held.append((self._by_token, identity.credential))
        for calls, key in held:
            calls.setdefault(key, set()).add(task)
        try:
            yield
        except asyncio.CancelledError:
            if task not in ENDED_BY_SERVER:
                raise
            task.uncancel()
            await context.abort(*ENDED_BY_SERVER[task])
        finally:
            for calls, key in held:
                calls[key].discard(task)
                if not calls[key]:  # a client with none left is forgotten (bounded memory)
                    del calls[key]
            ENDED_BY_SERVER.pop(task, None)


class HealthCheckOnly(grpc.aio.ServerInterceptor):
    """For the plaintext health port: ``Check`` and nothing else (UNIMPLEMENTED), so the
    port that needs no credentials holds no call open: a Check's request must come within
    REQUEST_TIMEOUT_S, and those in flight are capped (see InFlight)."""

    def __init__(self) -> None:
        self._open = InFlight()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        if handler_call_details.method != HEALTH_CHECK:
            return None
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        return _wrap(handler, lambda context: self._open.hold(context, None))


class InFlight:
    """Calls that anyone may make, in flight by peer address: at most OPEN_CALLS_PER_PEER
    from one address and OPEN_CALLS in all, so that no caller can hold them by the
    thousand, and one address cannot take them all. A call counts until it has ended,
    not until its handler has returned: a client that never reads (an HTTP/2 receive
    window of 0) keeps a call whose answer cannot be sent open, with its tasks, for as
    long as its connection lives, and such calls piled up by the thousand uncounted."""

    def __init__(self) -> None:
        self.per_peer = OPEN_CALLS_PER_PEER
        self.total = OPEN_CALLS
        self.calls = 0
        self._by_peer: collections.Counter[str] = collections.Counter()

    @asynccontextmanager
    async def hold(
        self, context: grpc.aio.ServicerContext, metrics: Metrics | None
    ) -> AsyncIterator[None]:
        peer = _peer_host(context.peer())
        refusal = ""
        if self._by_peer[peer] >= self.per_peer:
            refusal = f"{peer} has {self.per_peer} health checks open"
        elif self.calls >= self.total:
            refusal = f"the server has {self.total} health checks open"
        if refusal:
            if metrics is not None:
                metrics.refused_streams.labels("open_call_limit").inc()
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{refusal}, the limit: send each one's request, or retry later",
            )
        self._by_peer[peer] += 1
        self.calls += 1

        def release(_: object) -> None:  # once, when gRPC has ended the call
            self.calls -= 1
            _release(self._by_peer, peer)

        context.add_done_callback(release)
        yield


Gate = Callable[[grpc.aio.ServicerContext], AbstractAsyncContextManager[None]]


def _wrap(handler: grpc.RpcMethodHandler, gate: Gate) -> grpc.RpcMethodHandler:
    """The same handler, run inside ``gate(context)`` (which aborts a refused call).

    A method with one request message becomes a streaming-request one: gRPC reads a unary
    request before the handler runs, with no time limit, so a call that never sends it
    would stay open, unchecked, for good. Read here, it comes after the gate, within
    REQUEST_TIMEOUT_S.
    """
    kind = next(
        k
        for k in ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
        if getattr(handler, k) is not None
    )
    inner = getattr(handler, kind)
    unary_request = not handler.request_streaming  # type: ignore[attr-defined]
    name = getattr(handler.request_deserializer, "__qualname__", "").partition(".")[0]  # type: ignore[attr-defined]

    async def request_of(arg: Any, context: grpc.aio.ServicerContext) -> Any:
        return await _one_request(context, name or "request") if unary_request else arg

    if inspect.isasyncgenfunction(inner):

        async def streamed(arg: Any, context: grpc.aio.ServicerContext) -> Any:
            async with gate(context):
                request = await request_of(arg, context)
                async for response in inner(request, context):
                    yield response

        behaviour: Any = streamed
    else:

        async def called(arg: Any, context: grpc.aio.ServicerContext) -> Any:
            async with gate(context):
                request = await request_of(arg, context)
                return await inner(request, context)

        behaviour = called
    if not unary_request:
        return handler._replace(**{kind: behaviour})  # type: ignore[attr-defined]
    streaming = "stream_" + kind.partition("_")[2]
    return handler._replace(  # type: ignore[attr-defined]
        request_streaming=True, **{kind: None, streaming: behaviour}
    )


async def _one_request(context: grpc.aio.ServicerContext, name: str) -> Any:
    """The call's one request message, or the call aborted: none within REQUEST_TIMEOUT_S
    (DEADLINE_EXCEEDED), or none at all (INVALID_ARGUMENT)."""
    try:
        request = await read_within(
            context,
            REQUEST_TIMEOUT_S,
            lambda: AsrError(Status.DEADLINE_EXCEEDED, f"no {name} within {REQUEST_TIMEOUT_S:g} s"),
        )
    except AsrError as exc:
        await context.abort(GRPC_CODES[exc.status], exc.message)
    if request is grpc.aio.EOF:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"no {name} was sent")
    return request


def _release(counts: collections.Counter[str], name: str) -> None:
    """One fewer call for ``name``; a name with none left is forgotten (bounded memory)."""
    counts[name] -= 1
    if not counts[name]:
        del counts[name]


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
    """The client certificate's CN (or first SAN) as the client's identity, its unprintable
    characters written as escapes: the identity goes into every log line of the call, and a
    CN holding a line break wrote lines of its own there ("…\\n2030-01-01 ERROR …")."""
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        for value in auth_context.get(key, ()):
            name = value.decode("utf-8", "replace").strip()
            if name:
                return _printable(name[:128])
    return None


def _printable(text: str) -> str:
    """``text`` with each unprintable character (line breaks, controls) and each backslash
    as its escape: two names stay two identities (a line break and a backslash-n), cut
    to length before (escapes are up to four times as long)."""
    return "".join(
        c if c.isprintable() and c != "\\" else c.encode("unicode_escape").decode("ascii")
        for c in text
    )


def _peer_host(peer: str | None) -> str:
    """``ipv4:1.2.3.4:5678`` → ``1.2.3.4``; ``ipv6:%5B::1%5D:5678`` (grpc percent-encodes
    IPv6 peers) → ``::1``."""
    if not peer:
        return "unknown"
    _, _, address = urllib.parse.unquote(peer).partition(":")
    host, _, _port = address.rpartition(":")
    return host.strip("[]") or address
