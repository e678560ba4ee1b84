"""Waiting for a FINALIZE's acknowledgement: the future ``finalize()`` returns.

A voice agent that ends the turn itself (its own VAD heard the speaker stop) sends a
FINALIZE and must then know when the turn's transcript is complete: the server answers each
FINALIZE, on every channel it applies to, with a FINALIZED speech event once every result
for the audio sent before it is out. Those events arrive in order per channel, so the
oldest FINALIZE still waiting on a channel is the one its next FINALIZED answers.

The futures resolve as the caller's own loop reads the stream's events (``async for``),
never on their own: events are not read twice, and nothing is read ahead of the caller.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from asr_api.v1 import asr_pb2

FinalizeAck = asyncio.Future[list[asr_pb2.SpeechEvent]]
"""Done with the FINALIZED events (one per channel, in channel order) of one FINALIZE;
fails with the stream's error when it ends first."""


@dataclass
class _Waiting:
    ack: FinalizeAck
    channels: int  # how many FINALIZED events answer it
    came_at: float  # stream seconds at which it was sent
    events: list[asr_pb2.SpeechEvent] = field(default_factory=list)


class PendingFinalizes:
    """Per channel, the FINALIZEs sent whose FINALIZED the caller has not yet read."""

    def __init__(self, channels: int) -> None:
        self._waiting: list[deque[_Waiting]] = [deque() for _ in range(max(channels, 1))]
        self._unanswerable: list[FinalizeAck] = []  # of a channel the stream does not have
        self._failed: BaseException | None = None  # the stream's end, once it has come

    def sent(self, channel: int | None, came_at: float = 0.0) -> FinalizeAck:
        """A FINALIZE of ``channel`` (None: every channel) is being sent, ``came_at``
        stream seconds into the audio: its future."""
        ack: FinalizeAck = asyncio.get_running_loop().create_future()
        # Most callers never await the acknowledgement; one whose stream failed must not
        # be reported as "exception never retrieved" when it is collected.
        ack.add_done_callback(_retrieve)
        if self._failed is not None:  # nothing reads the stream's events any more
            ack.set_exception(self._failed)
            return ack
        if channel is None:
            targets = range(len(self._waiting))
        elif 0 <= channel < len(self._waiting):
            targets = range(channel, channel + 1)
        else:  # the server ends the stream (INVALID_ARGUMENT); the future fails with it
            self._unanswerable.append(ack)
            return ack
        waiting = _Waiting(ack, len(targets), came_at)
        for ch in targets:
            self._waiting[ch].append(waiting)
        return waiting.ack

    def withdraw(self, ack: FinalizeAck) -> None:
        """The FINALIZE was not sent after all (its write failed)."""
        for queue in self._waiting:
            for waiting in [w for w in queue if w.ack is ack]:
                queue.remove(waiting)
        if ack in self._unanswerable:
            self._unanswerable.remove(ack)
        ack.cancel()

    def unacknowledged(self, channel: int) -> int:
        """How many FINALIZEs of ``channel`` still wait for their FINALIZED."""
        return len(self._waiting[channel])

    def oldest_came_at(self, channel: int) -> float | None:
        """Where the FINALIZE the channel's next FINALIZED answers was sent (None: none
        waits)."""
        queue = self._waiting[channel]
        return queue[0].came_at if queue else None

    def acknowledged(self, event: asr_pb2.SpeechEvent) -> None:
        """The caller is being handed ``event``, a FINALIZED."""
        if not 0 <= event.channel < len(self._waiting) or not self._waiting[event.channel]:
            return  # not one of ours (a server bug, or a FINALIZE sent by other means)
        waiting = self._waiting[event.channel].popleft()
        waiting.events.append(event)
        if len(waiting.events) == waiting.channels and not waiting.ack.done():
            waiting.ack.set_result(sorted(waiting.events, key=lambda e: e.channel))

    def fail(self, error: BaseException, *, for_good: bool = True) -> None:
        """The stream ended (``for_good``: whatever is sent after fails at once too; one
        sent after its end got a future that never resolved), or stopped being read for
        now: whatever waits fails, what a later loop will read is answered then."""
        acks = [w.ack for queue in self._waiting for w in queue] + self._unanswerable
        if for_good:
            self._failed = self._failed or error
            for queue in self._waiting:
                queue.clear()
        # else their FINALIZEDs are still to come, in order: each stays in its queue, its
        # future failed, for its own FINALIZED to take it off (cleared, the next one's
        # future took the older FINALIZED, before its own turn's final had been read)
        self._unanswerable.clear()
        for ack in acks:
            if not ack.done():
                ack.set_exception(error)


def _retrieve(ack: FinalizeAck) -> None:
    if not ack.cancelled():
        ack.exception()
