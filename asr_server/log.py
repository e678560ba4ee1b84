"""Logging set-up: every record carries the id of the stream it concerns (or "-")."""

from __future__ import annotations

import contextvars
import logging

stream_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("stream_id", default="-")

FORMAT = "%(asctime)s %(levelname)s %(name)s [%(stream_id)s] %(message)s"


class StreamIdFilter(logging.Filter):
    """Copies the current stream id (set per RPC task) onto the record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.stream_id = stream_id_var.get()
        return True


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler()
    handler.addFilter(StreamIdFilter())
    handler.setFormatter(logging.Formatter(FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
