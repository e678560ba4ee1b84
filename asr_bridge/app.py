"""The bridge's ASGI app (the web page, ``/ws``, ``/healthz``, ``/metrics``) and running it.

One gRPC channel to the server serves every browser session; each session is its own
``StreamingRecognize`` call. A WebSocket passes three gates before it touches gRPC: its
Origin (refused on the handshake), the browser's token, and the session limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from asr_bridge import deepgram, deepgram_session, flux_session, realtime_session
from asr_bridge.auth import presented_token, token_ok
from asr_bridge.metrics import BridgeMetrics
from asr_bridge.origin import OriginPolicy
from asr_bridge.protocol import (
    EVENT_SHAPES,
    MAX_FRAME_BYTES,
    SUBPROTOCOL,
    Event,
    EventShape,
    close_code_for,
    close_reason,
    event_writer,
)
from asr_bridge.session import UPSTREAM_WRITE_DEADLINE_S, BridgeSession
from asr_bridge.socket_protocol import websocket_protocol
from asr_client import AsrClient, ConnectionOptions
from asr_client.resume import ResumePolicy

logger = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
DEFAULT_MAX_SESSIONS = 100
#: WebSocket pings end the sessions of clients that are gone. While a session waits on the
#: server it reads nothing, so a live client's pong waits unread: the ping timeout must
#: be well past the write deadline, which ends such a session first, with its reason.
#: (A pong behind audio still being read is waited for: socket_protocol.py.)
WS_PING_INTERVAL_S = 20.0
WS_PING_TIMEOUT_S = UPSTREAM_WRITE_DEADLINE_S + 15.0


@dataclass(frozen=True)
class BridgeConfig:
    #: the gRPC server: target, TLS, client certificate and the bridge's own bearer token
    server: ConnectionOptions = field(default_factory=ConnectionOptions)
    #: the token *browsers* must present to the bridge; None or empty: no token needed
    token: str | None = None
    #: how long a new socket may wait before its start message
    start_timeout_s: float = 10.0
    #: page origins allowed to open a WebSocket (``https://host[:port]``); empty: the bridge's
    #: own origin only; ``"*"``: any (see ``asr_bridge.origin``)
    allowed_origins: tuple[str, ...] = ()
    #: sessions open at once; past it a WebSocket gets RESOURCE_EXHAUSTED and close 1013
    max_sessions: int = DEFAULT_MAX_SESSIONS
    #: sessions open at once from one client address (behind a proxy, the address its
    #: X-Forwarded-For gives when the proxy is one of ``forwarded_allow_ips``); 0: no limit
    max_sessions_per_client: int = 0
    #: the proxies whose X-Forwarded-For is taken as the client's address (uvicorn's
    #: setting: comma-separated addresses or networks, "*" for any); None: 127.0.0.1, or
    #: $FORWARDED_ALLOW_IPS
    forwarded_allow_ips: str | None = None
    #: continue a session's gRPC stream on a new call when it breaks (the browser keeps
    #: its WebSocket); False: the session ends with the error
    resume: bool = True

    def __post_init__(self) -> None:
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1, got {self.max_sessions}")
        if self.max_sessions_per_client < 0:
            raise ValueError(
                f"max_sessions_per_client must be 0 (no limit) or more, got "
                f"{self.max_sessions_per_client}"
            )


#: serves one admitted session of a protocol: (socket, client, session id, metrics, config)
ServeSession = Callable[[WebSocket, AsrClient, str, BridgeMetrics, "BridgeConfig"], Awaitable[None]]
#: a refusal on the handshake, for protocols whose hosted original answers with an HTTP
#: status (Deepgram): (gRPC status name, message) → the response
HandshakeDenial = Callable[[str, str], Response]


@dataclass
class _State:
    config: BridgeConfig
    client: AsrClient | None = None
    #: the open sessions, each with its client's address
    sessions: dict[str, str] = field(default_factory=dict)


def create_app(config: BridgeConfig, metrics: BridgeMetrics | None = None) -> Starlette:
    """The app; ``metrics`` defaults to a private registry (tests pass their own)."""
    state = _State(config)
    origins = OriginPolicy.from_list(config.allowed_origins)  # raises on a malformed entry
    metrics = metrics if metrics is not None else BridgeMetrics()
    metrics.max_sessions.set(config.max_sessions)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        state.client = AsrClient(config.server, resume=ResumePolicy() if config.resume else None)
        try:
            yield
        finally:
            await state.client.close()

    async def index(_request: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    async def healthz(_request: Request) -> Response:
        return JSONResponse({"status": "ok", "sessions": len(state.sessions)})

    async def metrics_text(_request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def admit(
        ws: WebSocket,
        errors: Callable[[str, str], list[Event]],
        subprotocol: str | None,
        deny: HandshakeDenial | None = None,
    ) -> str | None:
        """The gates every WebSocket protocol shares: Origin (refused on the handshake),
        token and session limit (told after accepting, so the client can read why: a
        refused handshake is only "1006" to page scripts). A new session id, or None when
        refused; the caller must ``release`` it. No gRPC stream has been opened.

        With ``deny``, token and limit are refused on the handshake too, with its response,
        and the socket is left for the caller to accept (server-side SDKs read the HTTP
        status of a refused handshake; Deepgram's answers 401 and 429 so)."""
        origin = ws.headers.get("origin")
        if not origins.allows(origin, ws.headers.get("host"), ws.url.scheme):
            metrics.refused("origin")
            logger.info(
                "refused a WebSocket from %s: origin %r is not allowed",
                _peer(ws),
                (origin or "")[:200],
            )
            await _deny(ws)
            return None
        offered = ws.scope.get("subprotocols", [])
        if deny is None:
            await ws.accept(subprotocol=subprotocol if subprotocol in offered else None)

        async def refuse(code: str, message: str) -> None:
            if deny is None:
                await _refuse(ws, errors, code, message)
            else:
                logger.info("refused a session from %s: %s", _peer(ws), message)
                await _deny(ws, deny(code, message))

        if not token_ok(config.token, presented_token(ws.query_params, offered, ws.headers)):
            metrics.refused("token")
            await refuse("UNAUTHENTICATED", "missing or wrong token")
            return None
        # No await between the check and the add: two sockets cannot both take the last slot.
        if len(state.sessions) >= config.max_sessions:
            metrics.refused("capacity")
            await refuse(
                "RESOURCE_EXHAUSTED",
                f"the bridge is at its limit of {config.max_sessions} sessions; try again later",
            )
            return None
        # one browser (or one script with the shared token) cannot take every session
        address = ws.client.host if ws.client else "?"
        per_client = config.max_sessions_per_client
        if per_client and list(state.sessions.values()).count(address) >= per_client:
            metrics.refused("client_limit")
            logger.info("%s is at its limit of %d sessions", address, per_client)
            # (the address stays in the log: behind a proxy not listed in
            # forwarded_allow_ips it is the proxy's internal one)
            await refuse(
                "RESOURCE_EXHAUSTED",
                f"this address has {per_client} session{'s' if per_client > 1 else ''} "
                "open, the bridge's limit per client; close one or try again later",
            )
            return None
        session_id = secrets.token_hex(6)
        state.sessions[session_id] = address
        metrics.sessions.inc()
        metrics.active_sessions.inc()
        logger.info("session %s: opened from %s", session_id, _peer(ws))
        return session_id

    def release(session_id: str) -> None:
        state.sessions.pop(session_id, None)
        metrics.active_sessions.dec()

    async def websocket(ws: WebSocket) -> None:
        shape = ws.query_params.get("events")
        query_shape: EventShape | None = shape if shape in EVENT_SHAPES else None  # type: ignore[assignment]
        session_id = await admit(ws, event_writer(query_shape or "streamasr").error, SUBPROTOCOL)
        if session_id is None:
            return
        assert state.client is not None
        try:
            await BridgeSession(
                ws, state.client, session_id, metrics, query_shape, config.start_timeout_s
            ).run()
        except Exception:
            await _failed(ws, event_writer(query_shape or "streamasr").error, session_id)
        finally:
            release(session_id)

    def protocol(
        serve: ServeSession,
        errors: Callable[[str, str], list[Event]],
        subprotocol: str | None,
        deny: HandshakeDenial | None = None,
    ) -> Callable[[WebSocket], Awaitable[None]]:
        """A WebSocket endpoint for a protocol module: the shared gates, then ``serve``
        (which accepts the socket itself when ``deny`` is given: see ``admit``)."""

        async def endpoint(ws: WebSocket) -> None:
            session_id = await admit(ws, errors, subprotocol, deny)
            if session_id is None:
                return
            assert state.client is not None
            try:
                await serve(ws, state.client, session_id, metrics, config)
            except Exception:
                await _failed(ws, errors, session_id)
            finally:
                release(session_id)

        return endpoint

    return Starlette(
        routes=[
            Route("/", index),
            Route("/healthz", healthz),
            Route("/metrics", metrics_text),
            WebSocketRoute("/ws", websocket),
            # OpenAI Realtime transcription sessions (the official SDKs' base URL + /realtime)
            WebSocketRoute(
                "/v1/realtime",
                protocol(realtime_session.serve, realtime_session.errors, "realtime"),
            ),
            # Deepgram's live API: its SDKs work with only the base URL and key changed
            WebSocketRoute(
                "/v1/listen",
                protocol(deepgram_session.serve, deepgram.errors, None, deepgram_session.deny),
            ),
            # Deepgram Flux, the turn-based API for voice agents: SEMANTIC endpointing
            WebSocketRoute(
                "/v2/listen",
                protocol(flux_session.serve, deepgram.errors, None, deepgram_session.deny),
            ),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        lifespan=lifespan,
    )


async def _deny(ws: WebSocket, response: Response | None = None) -> None:
    """Refuse the handshake with ``response``, by default HTTP 403 for a disallowed origin
    (the page's scripts never get a socket)."""
    if "websocket.http.response" in ws.scope.get("extensions", {}):
        await ws.send_denial_response(response or PlainTextResponse("origin not allowed\n", 403))
    else:  # closing before accepting is a 403 too, without the body
        await ws.close()


async def _refuse(
    ws: WebSocket, errors: Callable[[str, str], list[Event]], code: str, message: str
) -> None:
    """An accepted socket that gets no session: an error event, then the matching close."""
    logger.info("refused a session from %s: %s", _peer(ws), message)
    await _tell_and_close(ws, errors, code, message)


async def _tell_and_close(
    ws: WebSocket, errors: Callable[[str, str], list[Event]], code: str, message: str
) -> None:
    """The client's error event(s) for gRPC status name ``code``, then the matching close."""
    with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):  # gone already
        for event in errors(code, message):
            await ws.send_json(event)
        await ws.close(close_code_for(code), close_reason(f"{code}: {message}"))


async def _failed(
    ws: WebSocket, errors: Callable[[str, str], list[Event]], session_id: str
) -> None:
    """A session ended by a fault of the bridge's own (a bug): logged with its traceback,
    and the client told so in its protocol, an error event and close 1011, not a dropped
    connection (1006) that looks like the network's fault and loses why."""
    logger.exception("session %s: failed", session_id)
    if ws.application_state is WebSocketState.CONNECTING:  # refused before accepting
        with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):
            await ws.close()
    elif ws.application_state is WebSocketState.CONNECTED:  # (INTERNAL: close 1011)
        message = f"the bridge failed on session {session_id}; its log says why"
        await _tell_and_close(ws, errors, "INTERNAL", message)


def _peer(ws: WebSocket) -> str:
    return f"{ws.client.host}:{ws.client.port}" if ws.client else "?"


@dataclass
class RunningBridge:
    server: uvicorn.Server
    port: int
    metrics: BridgeMetrics
    _loop_task: asyncio.Task[None]

    async def close(self) -> None:
        self.server.should_exit = True
        await self._loop_task
        await self.server.shutdown()


class TLSConfigError(ValueError):
    """The bridge's own certificate or key cannot be loaded."""


async def start_bridge(
    config: BridgeConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    ssl_certfile: str | Path | None = None,
    ssl_keyfile: str | Path | None = None,
    metrics: BridgeMetrics | None = None,
) -> RunningBridge:
    """Bind and serve on this event loop (port 0 = a free port); ``close()`` stops it.

    Raises ``ConnectionConfigError`` for server credentials that cannot be read,
    ``OriginConfigError`` for a malformed allowed origin and ``TLSConfigError`` for a
    certificate or key that does not load, before binding anything.
    """
    config.server.credentials()  # reads the PEM files now: a typo fails here, not per session
    metrics = metrics if metrics is not None else BridgeMetrics()
    uv_config = uvicorn.Config(
        create_app(config, metrics),
        host=host,
        port=port,
        # websockets-sansio, which reads one message at a time (see session.py on
        # backpressure), with a keepalive that waits for a pong behind unread audio
        ws=websocket_protocol(),
        # the largest message a route takes, so a larger one gets that route's own error
        # (an audio frame over 256 KiB, a Realtime event over 1 MiB), not a 1009 close
        ws_max_size=max(MAX_FRAME_BYTES, realtime_session.MAX_EVENT_CHARS) + 1024,
        # No permessage-deflate: PCM barely compresses, and a compressed read could expand
        # into many messages at once, which would defeat reading one message at a time.
        ws_per_message_deflate=False,
        ws_ping_interval=WS_PING_INTERVAL_S,
        ws_ping_timeout=WS_PING_TIMEOUT_S,
        forwarded_allow_ips=config.forwarded_allow_ips,
        log_config=None,  # the command configures logging; tests keep pytest's
        access_log=False,  # query strings may carry the token
        ssl_certfile=ssl_certfile,
        ssl_keyfile=ssl_keyfile,
    )
    try:
        uv_config.load()  # (loads the certificate and key)
    except OSError as exc:  # ssl.SSLError too: not PEM, or a key of another certificate
        if ssl_certfile is None and ssl_keyfile is None:
            raise
        raise TLSConfigError(
            f"the certificate {ssl_certfile} and key {ssl_keyfile} cannot be used: {exc}"
        ) from None
    server = uvicorn.Server(uv_config)
    server.lifespan = uv_config.lifespan_class(uv_config)
    await server.startup()
    bound = server.servers[0].sockets[0].getsockname()[1]
    return RunningBridge(
        server, bound, metrics, asyncio.create_task(server.main_loop(), name="bridge")
    )
