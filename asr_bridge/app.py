"""The bridge's ASGI app (the web page, ``/ws``, ``/healthz``) and running it with uvicorn.

One gRPC channel to the server serves every browser session; each session is its own
``StreamingRecognize`` call. The token is checked before the session touches gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket, WebSocketDisconnect

from asr_bridge.auth import presented_token, token_ok
from asr_bridge.protocol import (
    CLOSE_UNAUTHORIZED,
    EVENT_SHAPES,
    MAX_FRAME_BYTES,
    SUBPROTOCOL,
    EventShape,
    close_reason,
    event_writer,
)
from asr_bridge.session import BridgeSession
from asr_client import AsrClient

logger = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"


@dataclass(frozen=True)
class BridgeConfig:
    server: str = "localhost:50051"  # the gRPC server, host:port
    token: str | None = None  # None or empty: no token needed
    start_timeout_s: float = 10.0  # how long a new socket may wait before its start message


@dataclass
class _State:
    config: BridgeConfig
    client: AsrClient | None = None
    sessions: set[str] = field(default_factory=set)


def create_app(config: BridgeConfig) -> Starlette:
    state = _State(config)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        state.client = AsrClient(config.server)
        try:
            yield
        finally:
            await state.client.close()

    async def index(_request: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    async def healthz(_request: Request) -> Response:
        return JSONResponse({"status": "ok", "sessions": len(state.sessions)})

    async def websocket(ws: WebSocket) -> None:
        offered = ws.scope.get("subprotocols", [])
        await ws.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
        shape = ws.query_params.get("events")
        query_shape: EventShape | None = shape if shape in EVENT_SHAPES else None  # type: ignore[assignment]
        if not token_ok(config.token, presented_token(ws.query_params, offered)):
            # Accepted first so the browser can read why: a refused handshake is only
            # "1006" to page scripts. No gRPC stream has been opened.
            message = "missing or wrong token"
            logger.info("refused a session from %s: %s", _peer(ws), message)
            with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):  # gone already
                for event in event_writer(query_shape or "streamasr").error(
                    "UNAUTHENTICATED", message
                ):
                    await ws.send_json(event)
                await ws.close(CLOSE_UNAUTHORIZED, close_reason(f"UNAUTHENTICATED: {message}"))
            return
        assert state.client is not None
        session_id = secrets.token_hex(6)
        state.sessions.add(session_id)
        logger.info("session %s: opened from %s", session_id, _peer(ws))
        try:
            await BridgeSession(
                ws, state.client, session_id, query_shape, config.start_timeout_s
            ).run()
        finally:
            state.sessions.discard(session_id)

    return Starlette(
        routes=[
            Route("/", index),
            Route("/healthz", healthz),
            WebSocketRoute("/ws", websocket),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        lifespan=lifespan,
    )


def _peer(ws: WebSocket) -> str:
    return f"{ws.client.host}:{ws.client.port}" if ws.client else "?"


@dataclass
class RunningBridge:
    server: uvicorn.Server
    port: int
    _loop_task: asyncio.Task[None]

    async def close(self) -> None:
        self.server.should_exit = True
        await self._loop_task
        await self.server.shutdown()


async def start_bridge(
    config: BridgeConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
) -> RunningBridge:
    """Bind and serve on this event loop (port 0 = a free port); ``close()`` stops it."""
    uv_config = uvicorn.Config(
        create_app(config),
        host=host,
        port=port,
        ws="websockets-sansio",  # reads one message at a time: see session.py on backpressure
        ws_max_size=MAX_FRAME_BYTES + 1024,
        # No permessage-deflate: PCM barely compresses, and a compressed read could expand
        # into many messages at once, which would defeat reading one message at a time.
        ws_per_message_deflate=False,
        log_config=None,  # the command configures logging; tests keep pytest's
        access_log=False,  # query strings may carry the token
        ssl_certfile=ssl_certfile,
        ssl_keyfile=ssl_keyfile,
    )
    uv_config.load()
    server = uvicorn.Server(uv_config)
    server.lifespan = uv_config.lifespan_class(uv_config)
    await server.startup()
    bound = server.servers[0].sockets[0].getsockname()[1]
    return RunningBridge(server, bound, asyncio.create_task(server.main_loop(), name="bridge"))
