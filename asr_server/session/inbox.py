"""A channel's bounded inbox of decoded audio: the cap that makes backpressure real.

``put`` waits while the inbox holds ``max_samples`` or more; the reader then stops
calling ``context.read()``, gRPC stops granting HTTP/2 window, and the client's
sends wait. A single item larger than the cap is still accepted into an empty
inbox, so an oversized message cannot deadlock the stream. Requests without audio
(FINALIZE, UPDATE) are capped by count (``MAX_QUEUED_REQUESTS``): each FINALIZE makes
a response, so a client that sends them without reading its responses would otherwise
pile them up here without bound while the channel waits to send.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from asr_server.session.types import ConfigUpdate, Finalize


@dataclass(frozen=True)
class AudioChunk:
    samples: np.ndarray  # 16 kHz float32
    arrived: float  # time.monotonic() when its message was read


class EndOfAudio:
    """The client half-closed the stream."""


@dataclass(frozen=True)
class DetectedEvents:
    """Endpointer events already computed on the reader's turn (see ``take_inline``)."""

    events: list  # type: ignore[type-arg]


InboxItem = AudioChunk | Finalize | ConfigUpdate | EndOfAudio | DetectedEvents

#: requests without audio an inbox holds at most before ``put`` waits
MAX_QUEUED_REQUESTS = 32


class AudioInbox:
    """One producer (the stream's reader) and one consumer (the channel's processor).

    Plain futures rather than an ``asyncio.Condition``: a server holding hundreds of
    open calls passes every message through here, and the condition's lock showed in
    profiles.
    """

    def __init__(self, max_samples: int, on_change: Callable[[int], None] | None = None) -> None:
        self.max_samples = max_samples
        self.samples = 0
        self.requests = 0  # queued items without audio, DetectedEvents aside
        self._items: deque[InboxItem] = deque()
        self._on_change = on_change
        self._item_ready: asyncio.Future[None] | None = None  # the consumer waits on it
        self._room: asyncio.Future[None] | None = None  # the producer waits on it

    async def put(self, item: InboxItem) -> None:
        audio = isinstance(item, AudioChunk)
        n = item.samples.size if isinstance(item, AudioChunk) else 0
        while (self.samples and self.samples + n > self.max_samples) or (
            not audio and self.requests >= MAX_QUEUED_REQUESTS
        ):
            self._room = asyncio.get_running_loop().create_future()
            try:
                await self._room
            finally:
                self._room = None
        self._items.append(item)
        if audio:
            self._adjust(n)
        else:
            self.requests += 1
        _wake(self._item_ready)

    @property
    def consumer_waiting(self) -> bool:
        """The consumer is blocked on an empty inbox: it has handled everything put so far."""
        return self._item_ready is not None and not self._item_ready.done()

    def put_event(self, item: DetectedEvents) -> None:
        """Queue an item that holds no audio (no room needed)."""
        self._items.append(item)
        _wake(self._item_ready)

    async def get(self) -> InboxItem:
        while not self._items:
            self._item_ready = asyncio.get_running_loop().create_future()
            try:
                await self._item_ready
            finally:
                self._item_ready = None
        item = self._items.popleft()
        if isinstance(item, AudioChunk):
            self._adjust(-item.samples.size)
        elif not isinstance(item, DetectedEvents):
            self.requests -= 1
        _wake(self._room)
        return item

    def _adjust(self, n: int) -> None:
        self.samples += n
        if self._on_change is not None and n:
            self._on_change(n)


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


def now() -> float:
    return time.monotonic()
