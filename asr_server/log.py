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


#: the logger grpc's metadata decoding writes to
GRPC_CORE_LOGGER = "grpc._cython.cygrpc"


def drop_undecodable_metadata_records() -> None:
    """Install UndecodableMetadataFilter on grpc's logger (once)."""
    grpc_logger = logging.getLogger(GRPC_CORE_LOGGER)
    if not any(isinstance(f, UndecodableMetadataFilter) for f in grpc_logger.filters):
        grpc_logger.addFilter(UndecodableMetadataFilter())


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler()
    handler.addFilter(StreamIdFilter())
    handler.setFormatter(logging.Formatter(FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    drop_undecodable_metadata_records()
