"""The servers and bridges a benchmark starts end with it, however it ends.

Each script stops its children in a ``finally``, which a ``kill PID`` (SIGTERM) or a
supervisor signalling only the script skips: the server stayed up, holding ~300 MB and
its ports, and the next run shared the two cores with it, which skews every latency
figure. Linux's parent-death signal covers that, and SIGKILL too.
"""

from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn``: the child gets SIGTERM (a server drains and exits) as soon as the
    benchmark's process ends. Elsewhere than on Linux, nothing: the ``finally`` stays."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
