"""The timed read of a call's next message (``transport.reads.read_within``)."""

from __future__ import annotations

import asyncio
import gc

import pytest

from asr_server.errors import AsrError, Status
from asr_server.transport.reads import read_within


class OneRead:
    """A servicer context whose ``read()`` is a future the test completes."""

    def __init__(self) -> None:
        self.message: asyncio.Future[object] = asyncio.get_running_loop().create_future()

    def read(self) -> asyncio.Future[object]:
        return self.message


def idle() -> AsrError:
    return AsrError(Status.DEADLINE_EXCEEDED, "idle")


async def test_a_message_in_time_is_returned() -> None:
    context = OneRead()
    read = asyncio.create_task(read_within(context, 5, idle))
    await asyncio.sleep(0)
    context.message.set_result("config")
    assert await read == "config"


async def test_no_message_in_time_raises_the_timeout_error() -> None:
    context = OneRead()
    with pytest.raises(AsrError) as raised:
        await read_within(context, 0.01, idle)
    assert raised.value.status is Status.DEADLINE_EXCEEDED


async def test_an_abandoned_read_failing_later_is_not_reported(caplog) -> None:  # type: ignore[no-untyped-def]
    # the call ends after the timeout: its read fails, and nobody awaits it any more
    context = OneRead()
    with pytest.raises(AsrError):
        await read_within(context, 0.01, idle)
    context.message.set_exception(RuntimeError("call ended"))
    await asyncio.sleep(0)
    del context
    gc.collect()
    assert "never retrieved" not in caplog.text


async def test_a_cancel_that_arrives_with_the_message_still_cancels() -> None:
    # A client reset arriving with its last message: the read completes and the call's
    # task is cancelled in the same turn of the loop. The handler must stop (on Python
    # 3.11, asyncio.wait_for returned the message instead and the handler went on
    # serving a call that no longer existed).
    context = OneRead()
    read = asyncio.create_task(read_within(context, 5, idle))
    await asyncio.sleep(0)
    context.message.set_result("audio")
    read.cancel()
    with pytest.raises(asyncio.CancelledError):
        await read
