"""The one table from our error statuses to gRPC status codes."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

import grpc

from asr_server.errors import Status

GRPC_CODES: dict[Status, grpc.StatusCode] = {
    Status.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    Status.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    Status.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Status.OUT_OF_RANGE: grpc.StatusCode.OUT_OF_RANGE,
    Status.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Status.INTERNAL: grpc.StatusCode.INTERNAL,
    Status.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Status.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    Status.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
}


#: calls the server itself ends by cancelling their task (a drain's lasting calls, a
#: revoked token's calls, the calls open at a drain's deadline), with the status and
#: message they end with (``end_by_server``): the interceptor
#: aborts each with them, and the outcome metrics count it so, where a cancelled call is
#: otherwise one its client left
ENDED_BY_SERVER: weakref.WeakKeyDictionary[asyncio.Task[Any], tuple[grpc.StatusCode, str]] = (
    weakref.WeakKeyDictionary()
)


def end_by_server(tasks: set[asyncio.Task[Any]], code: grpc.StatusCode, message: str) -> int:
    """End the calls of ``tasks`` with ``code`` and ``message``; how many there were."""
    for task in tasks:
        ENDED_BY_SERVER.setdefault(task, (code, message))
        task.cancel()
    return len(tasks)
