"""The filters on grpc's logger: what the server's stop makes grpc log is not an error."""

from __future__ import annotations

import asyncio
import logging

import pytest

from asr_server.log import GRPC_CORE_LOGGER, quiet_grpc_records

NOT_HANDLED = "Exception not handled by _handle_exceptions in servicer method [%s]"
METHOD = "/asr.v1.Recognizer/StreamingRecognize"


def log_as_grpc_does(error: BaseException) -> None:
    """What grpc's server logs when an RPC's scheduling task ends in ``error`` (its
    format and logger, from a real except block, as grpc's done callback logs it)."""
    try:
        raise error
    except BaseException:
        logging.getLogger(GRPC_CORE_LOGGER).exception(NOT_HANDLED, METHOD)


@pytest.fixture
def grpc_logger_quieted():  # type: ignore[no-untyped-def]
    logger = logging.getLogger(GRPC_CORE_LOGGER)
    before = list(logger.filters)
    quiet_grpc_records()
    yield
    logger.filters[:] = before


def test_the_stops_cancelled_close_watch_is_not_an_error(
    grpc_logger_quieted, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        log_as_grpc_does(asyncio.CancelledError())
    assert caplog.records == []
    with caplog.at_level(logging.DEBUG):
        log_as_grpc_does(asyncio.CancelledError())
    (record,) = caplog.records
    assert record.levelno == logging.DEBUG and record.exc_info is None
    assert record.getMessage() == (
        f"Exception not handled by _handle_exceptions in servicer method [{METHOD}]"
        " (the call's close-watch, cancelled by the server's stop)"
    )


def test_any_other_exception_stays_an_error_with_its_traceback(
    grpc_logger_quieted, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        log_as_grpc_does(RuntimeError("a real failure"))
        logging.getLogger(GRPC_CORE_LOGGER).error("Unexpected [%s] raised", "CancelledError")
    first, second = caplog.records
    assert first.levelno == logging.ERROR and first.exc_info is not None
    assert "a real failure" in caplog.text
    assert second.levelno == logging.ERROR
