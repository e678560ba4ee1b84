"""Retry hints on admission refusals, so a client or a proxy retries on another replica.

A call refused at admission (replica full, draining, model still loading) has read and
written nothing, so gRPC may transparently retry it: grpc core clients do so when their
service config has a ``retryPolicy`` for the code, and wait ``grpc-retry-pushback-ms``
(trailing metadata) before the next attempt instead of their own backoff.
"""

from __future__ import annotations

import random

PUSHBACK_KEY = "grpc-retry-pushback-ms"
#: A short wait: another replica likely has room now. Jittered so that streams refused
#: together do not come back together (measured nothing; a fraction of a stream's life).
PUSHBACK_MS = (50, 250)


def retry_pushback() -> tuple[tuple[str, str], ...]:
    """Trailing metadata for a refused call: retry after a jittered short wait."""
    return ((PUSHBACK_KEY, str(random.randint(*PUSHBACK_MS))),)
