"""A channel's bounded inbox of decoded audio: the cap that makes backpressure real.

``put`` waits while the inbox holds ``max_samples`` or more; the reader then stops
calling ``context.read()``, gRPC stops granting HTTP/2 window, and the client's
sends wait. A single item larger than the cap is still accepted into an empty
inbox, so an oversized message cannot deadlock the stream.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from asr_server.session.types import Finalize


@dataclass(frozen=True)
class AudioChunk:
    samples: np.ndarray  # 16 kHz float32
    arrived: float  # time.monotonic() when its message was read


class EndOfAudio:
    """The client half-closed the stream."""


InboxItem = AudioChunk | Finalize | EndOfAudio


class AudioInbox:
    def __init__(self, max_samples: int, on_change: callable | None = None) -> None:  # type: ignore[valid-type]
        self.max_samples = max_samples
        self.samples = 0
        self._items: deque[InboxItem] = deque()
        self._changed = asyncio.Condition()
        self._on_change = on_change

    async def put(self, item: InboxItem) -> None:
        n = item.samples.size if isinstance(item, AudioChunk) else 0
        async with self._changed:
            await self._changed.wait_for(
                lambda: self.samples == 0 or self.samples + n <= self.max_samples
            )
            self._items.append(item)
            self._adjust(n)
            self._changed.notify_all()

    async def get(self) -> InboxItem:
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._items))
            item = self._items.popleft()
            if isinstance(item, AudioChunk):
                self._adjust(-item.samples.size)
            self._changed.notify_all()
            return item

    def _adjust(self, n: int) -> None:
        self.samples += n
        if self._on_change is not None and n:
            self._on_change(n)


def now() -> float:
    return time.monotonic()
