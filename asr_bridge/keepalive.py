"""Keeping a session's gRPC stream open while its socket is, through pauses in the audio.

The server ends a stream that sends nothing for its idle timeout (60 s by default): it
cannot tell a client that has gone from one that pauses. A bridge session can: the
socket's pings (uvicorn's, every 20 s) end the session of a client that has gone, so a
pause in the audio of a client still there (push-to-talk between presses, a muted
microphone) is just a pause, and the stream gets a KEEPALIVE after ``KEEPALIVE_AFTER_S``
without a write, or after a third of the server's idle timeout where the server says it
is shorter (its admission headers; one set to 10 s ended such sessions between presses).
Writes go through ``write``: one at a time on the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable

from asr_client import AudioStream, StreamClosedError

#: a third of the server's default idle timeout, which leaves room for a slow write
KEEPALIVE_AFTER_S = 20.0
#: how often the keeper looks at the server's idle timeout again while it waits
LOOK_AGAIN_S = 1.0


class StreamKeeper:
    """Serializes a session's writes on ``stream`` and keeps it open between them;
    ``run`` until the session ends (cancel it then)."""

    def __init__(self, stream: AudioStream, after_s: float | None = None) -> None:
        self.stream = stream
        # (the module's constant read now, so that a test can shorten it)
        self.after_s = KEEPALIVE_AFTER_S if after_s is None else after_s
        self._lock = asyncio.Lock()
        self._last_write = time.monotonic()
        self._ended = False

    async def write(self, write: Awaitable[object]) -> None:
        async with self._lock:
            await write
            self._last_write = time.monotonic()

    async def end(self) -> None:
        """Half-close the stream (no more audio): nothing is written after it."""
        self._ended = True
        await self.write(self.stream.end())

    async def run(self) -> None:
        with contextlib.suppress(StreamClosedError):  # the stream's end is the session's
            while not self._ended:
                # (each time: a resumed stream may be on a server with another timeout)
                idle_s = await self.stream.idle_timeout_s()
                after_s = self.after_s if idle_s is None else min(self.after_s, idle_s / 3)
                due_in = self._last_write + after_s - time.monotonic()
                if due_in > 0:
                    # not longer than LOOK_AGAIN_S: a resume onto a server with a shorter
                    # timeout is seen in time (one slept on for the last server's 20 s)
                    await asyncio.sleep(min(due_in, LOOK_AGAIN_S))
                    continue
                async with self._lock:
                    if not self._ended and time.monotonic() - self._last_write >= after_s:
                        await self.stream.keep_alive()
                        self._last_write = time.monotonic()
