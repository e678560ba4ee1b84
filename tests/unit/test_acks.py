"""asr_client.acks: which FINALIZE a FINALIZED answers when the caller stopped reading in
between (a push-to-talk agent that reads each turn to its final and returns)."""

from __future__ import annotations

import pytest

from asr_api.v1 import asr_pb2
from asr_client.acks import PendingFinalizes


def finalized(channel: int, offset_s: float) -> asr_pb2.SpeechEvent:
    return asr_pb2.SpeechEvent(
        type=asr_pb2.SpeechEvent.FINALIZED, channel=channel, offset_s=offset_s
    )


async def test_a_finalize_is_answered_by_its_own_finalized_after_a_loop_was_left() -> None:
    """The first turn's reader returned at its final, its FINALIZED still unread (its
    future failed, as documented); the queue was cleared, so the second turn's future
    took the first FINALIZED and resolved before its own turn's final had been read."""
    pending = PendingFinalizes(channels=1)
    first = pending.sent(None, came_at=1.9)
    pending.fail(RuntimeError("no longer read"), for_good=False)  # the loop was left
    with pytest.raises(RuntimeError):
        await first
    second = pending.sent(None, came_at=6.0)
    pending.acknowledged(finalized(0, 1.9))  # the first FINALIZE's, read by the next loop
    assert not second.done()
    pending.acknowledged(finalized(0, 6.0))
    assert [e.offset_s for e in await second] == [6.0]


async def test_a_stream_that_ended_fails_what_waits_and_what_comes_after() -> None:
    pending = PendingFinalizes(channels=2)
    waiting = pending.sent(1)
    pending.fail(RuntimeError("ended"))
    with pytest.raises(RuntimeError):
        await waiting
    with pytest.raises(RuntimeError):
        await pending.sent(None)
    assert pending.unacknowledged(0) == pending.unacknowledged(1) == 0
