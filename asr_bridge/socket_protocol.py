"""uvicorn's WebSocket protocol, with a keepalive that waits for a pong queued behind audio,
and a quiet close for a text message that is not UTF-8.

The bridge reads one message at a time (session.py: the server's backpressure reaches the
client's TCP window), so a client's pong is read only after all the audio it sent before
it. A client sending faster than the server takes audio (a file streamed as fast as the
socket goes, to a server that keeps up but no faster) builds a backlog in TCP that takes
longer to read than uvicorn's ping timeout: the session ended with 1011 "keepalive ping
timeout", no reason given, mid-transcript, though the client was there all along.

Here a ping is answered in time if the pong arrives, as before, or if the client's bytes
are still being read: the pong is behind them. A client that has gone sends nothing more;
once what it sent has been read, the ping timeout ends its session as before. (A server
that falls behind the audio is ``session.UpstreamPace``'s to end, with its reason.)

This subclasses uvicorn internals (``websockets_sansio_impl``); a uvicorn without them gets
its own protocol unchanged, with the old behaviour.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

try:
    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
except ImportError:  # pragma: no cover - an older uvicorn
    WebSocketsSansIOProtocol = None  # type: ignore[assignment,misc]

#: the methods the subclass below extends or calls
_EXTENDS = (
    "data_received",
    "send_keepalive_ping",
    "keepalive_timeout",
    "send_receive_event_to_app",
    "handle_parser_exception",
)
#: the close a text message that is not UTF-8 gets (RFC 6455: 1007, inconsistent data)
NOT_UTF8 = (1007, "a text message must be UTF-8")


def websocket_protocol() -> type | str:
    """What to give uvicorn as ``ws``: the patient protocol, or uvicorn's own by name."""
    if WebSocketsSansIOProtocol is None or not all(
        hasattr(WebSocketsSansIOProtocol, name) for name in _EXTENDS
    ):
        logger.warning("this uvicorn's WebSocket keepalive cannot wait for pongs behind audio")
        return "websockets-sansio"
    return _PatientKeepalive


if WebSocketsSansIOProtocol is not None:

    class _PatientKeepalive(WebSocketsSansIOProtocol):  # type: ignore[misc,valid-type]
        #: when the client's bytes were last read, and since when the ping in flight has
        #: been waited for without any
        _read_at = 0.0
        _waiting_since = 0.0

        def data_received(self, data: bytes) -> None:
            self._read_at = self.loop.time()
            super().data_received(data)

        def send_keepalive_ping(self) -> None:
            self._waiting_since = self.loop.time()
            super().send_keepalive_ping()

        def keepalive_timeout(self) -> None:
            reading = self._read_at > self._waiting_since
            if (
                reading
                and self.ping_timeout
                and not (self.close_sent or self.transport.is_closing())
            ):
                # the pong is behind what is still being read: wait as long again
                self._waiting_since = self.loop.time()
                self.pong_timer = self.loop.call_later(self.ping_timeout, self.keepalive_timeout)
                return
            super().keepalive_timeout()

        def send_receive_event_to_app(self) -> None:
            # uvicorn logs a text message that is not UTF-8 as an ERROR with a traceback,
            # which any client could fill the log with, and closes with 1007 and no reason
            if self.curr_msg_data_type == "text" and not self.close_sent:
                try:
                    b"".join(self.frames).decode()
                except UnicodeDecodeError as exc:
                    self.frames = []
                    logger.info("closed a WebSocket whose text message is not UTF-8 (%s)", exc)
                    self.conn.send_close(*NOT_UTF8)
                    self.handle_parser_exception()
                    return
            super().send_receive_event_to_app()
