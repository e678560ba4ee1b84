"""Writing to a client's WebSocket, the same for every protocol the bridge speaks.

A socket that is gone shows up as one of several exceptions (starlette's
``WebSocketDisconnect``, an ``OSError`` from the transport, or ``RuntimeError``, starlette's
word for "the socket is already closed"); sessions see only ``ClientGone``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import select
from collections.abc import Iterable
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

_GONE = (WebSocketDisconnect, OSError, RuntimeError)


def json_message(text: str) -> Any:
    """A client's text message parsed as JSON, which must hold text only: JSON's escapes
    can spell a lone UTF-16 surrogate ("\\ud800"), which Python decodes into a string that
    no UTF-8 (and no protobuf string field) can hold; and JSON nested deeper than the
    parser recurses ("[" * 1500 in 3 kB) raises ``RecursionError``. ``json.JSONDecodeError``
    for each, so each protocol answers it as it answers any message that is not JSON."""
    try:
        value = json.loads(text)
        json.dumps(value, ensure_ascii=False).encode()
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text, 0) from None
    except UnicodeEncodeError as exc:
        raise json.JSONDecodeError(
            "a string holds a lone surrogate escape (\\ud800-\\udfff), not text", text, 0
        ) from exc
    return value


class ClientGone(Exception):
    """The client closed the WebSocket or the connection dropped."""


async def send_events(ws: WebSocket, events: Iterable[dict[str, Any]]) -> None:
    """Each event as one compact JSON text message; ClientGone if the socket is gone."""
    try:
        for event in events:
            await ws.send_text(json.dumps(event, separators=(",", ":")))
    except _GONE:
        raise ClientGone from None


class PeerWatch:
    """Whether the client's end of a socket has gone, seen without reading it: a session
    whose write waits on the server reads nothing, and the client's close lies unread
    behind its audio (its FIN cannot even arrive: the bridge's receive window is shut).
    ``probe`` sends a ping, which a host whose socket has closed answers with a reset,
    and Linux's poll reports a reset (and a FIN, POLLRDHUP) past unread data. Only with
    uvicorn's websockets-sansio protocol; with another, or without poll, nothing is seen."""

    def __init__(self, ws: WebSocket) -> None:
        # the ASGI receive is the uvicorn protocol's bound method, which holds the transport
        self._protocol = getattr(getattr(ws, "_receive", None), "__self__", None)
        transport = getattr(self._protocol, "transport", None)
        self._transport = transport if isinstance(transport, asyncio.Transport) else None
        self._poll: select.poll | None = None
        sock = self._transport.get_extra_info("socket") if self._transport else None
        if sock is not None and sock.fileno() >= 0 and hasattr(select, "poll"):
            self._poll = select.poll()
            self._poll.register(
                sock.fileno(), getattr(select, "POLLRDHUP", 0) | select.POLLERR | select.POLLHUP
            )

    def probe(self) -> None:
        conn = getattr(self._protocol, "conn", None)
        if conn is None or self._transport is None or self.gone():
            return
        with contextlib.suppress(Exception):  # closing meanwhile: gone() says so next
            conn.send_ping(secrets.token_bytes(4))  # (its pong is ignored: not uvicorn's)
            self._transport.write(b"".join(conn.data_to_send()))

    def gone(self) -> bool:
        if self._transport is not None and self._transport.is_closing():
            return True
        return self._poll is not None and bool(self._poll.poll(0))


async def close_quietly(ws: WebSocket, code: int, reason: str) -> None:
    """Close the socket; one that is already gone needs nothing more."""
    with contextlib.suppress(*_GONE):
        await ws.close(code, reason)
