"""Long, idle scenarios that run in the background of the suite (tests/background.py)."""

from __future__ import annotations

import os
import signal
import threading
import time
from types import FrameType


def stop_with_the_suite() -> None:
    """SIGTERM ends the scenario as Ctrl-C does (its ``with`` blocks stop what they
    started), and so does the death of the pytest that started it: a suite killed without
    its end hook (a CI job cancelled) left replicas and proxies running."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True, name="watch-the-suite").start()
