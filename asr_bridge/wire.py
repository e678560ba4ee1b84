"""Writing to a client's WebSocket, the same for every protocol the bridge speaks.

A socket that is gone shows up as one of several exceptions (starlette's
``WebSocketDisconnect``, an ``OSError`` from the transport, or ``RuntimeError``, starlette's
word for "the socket is already closed"); sessions see only ``ClientGone``.
"""

from __future__ import annotations

import contextlib
import json
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


async def close_quietly(ws: WebSocket, code: int, reason: str) -> None:
    """Close the socket; one that is already gone needs nothing more."""
    with contextlib.suppress(*_GONE):
        await ws.close(code, reason)
