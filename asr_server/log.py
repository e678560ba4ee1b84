"""Logging set-up: every record carries the stream it concerns and the client's identity."""

from __future__ import annotations

import asyncio
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


class UndecodableMetadataFilter(logging.Filter):
    """grpc logs a metadata value that is not UTF-8 at ERROR, raw and with a traceback,
    two or three times per call: a mistyped bearer token reached the log, and any client
    could fill it. The call itself goes on (a token that cannot be read is refused as
    wrong, and logged so without its value); the record is dropped, or kept at DEBUG
    without the value."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Invalid encoding on"):
            return True
        if not logging.getLogger().isEnabledFor(logging.DEBUG):
            return False
        record.msg, record.args = "a call's metadata value is not UTF-8 (not logged)", ()
        record.exc_info, record.exc_text = None, None
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


class StopCancelledCallFilter(logging.Filter):
    """grpc's stop cancels the task that waits for each call's close, and logs that task's
    CancelledError at ERROR with a traceback ("Exception not handled by _handle_exceptions
    in servicer method"), when the call's close had not yet reached the event loop: after
    a drain whose streams had all moved and been answered, about one drain in two behind
    nginx. Nothing else cancels that task (grpc's own), so the record says only that the
    server stopped: kept at DEBUG without the traceback. Any other exception stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Exception not handled by _handle_exceptions"):
            return True
        exc_type = record.exc_info[0] if record.exc_info else None
        if exc_type is None or not issubclass(exc_type, asyncio.CancelledError):
            return True
        if not logging.getLogger().isEnabledFor(logging.DEBUG):
            return False
        said = record.getMessage()
        record.msg = "%s (the call's close-watch, cancelled by the server's stop)"
        record.args = (said,)
        record.exc_info, record.exc_text = None, None
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


#: the logger grpc's metadata decoding and its server's task handling write to
GRPC_CORE_LOGGER = "grpc._cython.cygrpc"


def quiet_grpc_records() -> None:
    """Install UndecodableMetadataFilter and StopCancelledCallFilter on grpc's logger
    (once each)."""
    grpc_logger = logging.getLogger(GRPC_CORE_LOGGER)
    for kind in (UndecodableMetadataFilter, StopCancelledCallFilter):
        if not any(isinstance(f, kind) for f in grpc_logger.filters):
            grpc_logger.addFilter(kind())


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler()
    handler.addFilter(StreamIdFilter())
    handler.setFormatter(logging.Formatter(FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    quiet_grpc_records()
