"""Reading a call's next message with a time limit, without breaking the call."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc


async def read_within(
    context: grpc.aio.ServicerContext, timeout_s: float, on_timeout: Callable[[], Exception]
) -> Any:
    """``context.read()``, or ``on_timeout()`` raised when the client sends nothing in time.

    Shielded: cancelling a read that grpc has in flight can break the call, and the client
    would see "Internal error from Core" instead of our status. A read abandoned (a
    timeout, or the call ended by another of its tasks) ends when the call does, with
    an abort nobody awaits: its outcome is retrieved here, or asyncio would log it as
    "Task exception was never retrieved".

    ``asyncio.timeout``, not ``wait_for``: on Python 3.11 ``wait_for`` returns the read's
    result when the call's task is cancelled just as the read completes (a client reset
    arriving with its last message), and the handler then went on serving a call that
    no longer exists, down to an "unexpected server error" on its first write.
    """
    read = asyncio.ensure_future(context.read())
    try:
        async with asyncio.timeout(timeout_s):
            return await asyncio.shield(read)
    except TimeoutError:
        raise on_timeout() from None
    finally:
        if not read.done():
            read.add_done_callback(_outcome_ignored)


def _outcome_ignored(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
