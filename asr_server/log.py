"""Logging set-up: every record carries the stream it concerns and the client's identity."""

from __future__ import annotations

import contextvars
import logging

stream_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("stream_id", default="-")
#: who made the call: a token's name, a client certificate's subject, or ``ip:ADDRESS``
client_var: contextvars.ContextVar[str] = contextvars.ContextVar("client", default="-")

#: the levels a log level setting may name (the server's and the bridge's)
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

FORMAT = "%(asctime)s %(levelname)s %(name)s [%(stream_id)s %(client)s] %(message)s"


class StreamIdFilter(logging.Filter):
    """Copies the current stream id and client (set per RPC task) onto the record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.stream_id = stream_id_var.get()
        record.client = client_var.get()
        return True


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler()
    handler.addFilter(StreamIdFilter())
    handler.setFormatter(logging.Formatter(FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
