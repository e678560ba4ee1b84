"""Signal handlers for the commands, which may run inside another program.

``calling_on`` sets them with ``signal.signal`` and puts back exactly what was there,
instead of the loop's ``add_signal_handler``: removing one of those leaves the signal at its
default, and an asyncio program's own handler (in its loop's table, behind a no-op Python
handler) was lost. A program that ran a command in-process was then killed by SIGTERM, or,
once the no-op was put back, could no longer be stopped by it at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterable, Iterator
from types import FrameType


@contextlib.contextmanager
def calling_on(signums: Iterable[signal.Signals], callback: Callable[[], None]) -> Iterator[bool]:
    """Run ``callback`` on the running loop when one of ``signums`` comes, until the block
    ends; the handlers from before are then back as they were. Yields False where no
    handler can be set (not the main thread): the signals keep their meaning."""
    loop = asyncio.get_running_loop()

    def handler(signum: int, frame: FrameType | None) -> None:
        loop.call_soon_threadsafe(callback)  # (a handler runs between two bytecodes)

    previous: dict[signal.Signals, object] = {}
    try:
        for signum in signums:
            previous[signum] = signal.signal(signum, handler)
    except ValueError:  # not the main thread
        _restore(previous)
        yield False
        return
    try:
        yield True
    finally:
        _restore(previous)


def _restore(previous: dict[signal.Signals, object]) -> None:
    for signum, handler in previous.items():
        # (None: a handler not set from Python; its default is the nearest there is)
        signal.signal(signum, signal.SIG_DFL if handler is None else handler)  # type: ignore[arg-type]
