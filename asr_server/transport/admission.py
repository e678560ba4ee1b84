"""Admission: how many calls may be open, in total, per client, and before their config.

A call is *pending* from its first byte until its config arrives, then holds a *seat*
(one of ``max_streams``); a config that finds every seat taken is refused. Seats
are only taken by configured streams, so calls that open and never send a config cannot
keep a legitimate stream out: they hold pending slots (bounded separately, and ended by
the config timeout) instead. One client identity may
hold at most half the pending pool (``max_pending_streams_per_client``), so calls that
never send a config cannot lock other clients out either, and at most
``max_streams_per_client`` calls, pending or seated, and at most
UNANSWERED_CALLS_PER_CLIENT calls that have ended but whose answer it has not read.

Every refusal here happens before anything is written back, so gRPC may retry the call
transparently: grpc core clients do so when their service config has a ``retryPolicy``
for the code (asr_client/retry.py), waiting ``grpc-retry-pushback-ms`` from the trailing
metadata instead of their own backoff. Through a proxy the retry lands on another replica.
"""

from __future__ import annotations

import collections
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import grpc

from asr_server.errors import AsrError, Status
from asr_server.metrics import Metrics
from asr_server.settings import Settings
from asr_server.transport.interceptors import Identity

#: calls of one client that have ended while their answer could not be sent (a client
#: that does not read: an HTTP/2 window of 0); each keeps its tasks and buffers until the
#: client's connection goes, outside every other limit, since it holds no seat
UNANSWERED_CALLS_PER_CLIENT = 100

PUSHBACK_KEY = "grpc-retry-pushback-ms"
#: A short wait: another replica likely has room now. Jittered so that streams refused
#: together do not come back together.
PUSHBACK_MS = (50, 250)


class AdmissionRefused(AsrError):
    """A call turned away before any work: the client may retry it, here or elsewhere."""


def retry_pushback() -> tuple[tuple[str, str], ...]:
    """Trailing metadata for a refused call: retry after a jittered short wait."""
    return ((PUSHBACK_KEY, str(random.randint(*PUSHBACK_MS))),)


class Ticket:
    """One admitted call; ``seat()`` once its config has arrived."""

    def __init__(self, admission: Admission, identity: Identity) -> None:
        self._admission = admission
        self.identity = identity
        self.seated = False

    def seat(self) -> None:
        self._admission._seat(self)


class Admission:
    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.pending = 0
        self.seated = 0
        self._per_client: collections.Counter[str] = collections.Counter()
        self._pending_per_client: collections.Counter[str] = collections.Counter()
        self._unanswered: collections.Counter[str] = collections.Counter()

    @property
    def open_calls(self) -> int:
        return self.pending + self.seated

    @contextmanager
    def call(self, identity: Identity) -> Iterator[Ticket]:
        """Admit a new call as pending for the ``with`` block; raises RESOURCE_EXHAUSTED."""
        s = self.settings
        # (not refused here when full: the refusal waits for the config, which a client
        # has usually sent with the call; refused before that, its write of the config
        # failed instead of its read, and the client's retry on another replica, which
        # reads the refusal from the response stream, missed about one in three)
        per_client = s.max_streams_per_client
        if per_client and self._per_client[identity.name] >= per_client:
            self._refuse(
                "client_limit",
                f"client {identity.name} is at its limit of {per_client} concurrent streams; "
                "close one or retry later",
            )
        if self.pending >= s.pending_stream_limit:
            self._refuse(
                "pending_limit",
                f"too many streams ({self.pending}) are waiting to send their config; retry later",
            )
        if self._unanswered[identity.name] >= UNANSWERED_CALLS_PER_CLIENT:
            self._refuse(
                "client_unanswered_limit",
                f"client {identity.name} has {UNANSWERED_CALLS_PER_CLIENT} ended calls whose "
                "answers it has not read; read them, or close their connection",
            )
        pending_per_client = s.pending_limit_per_client
        if self._pending_per_client[identity.name] >= pending_per_client:
            self._refuse(
                "client_pending_limit",
                f"client {identity.name} has {pending_per_client} streams waiting to send their "
                "config; send a config on those first",
            )
        ticket = Ticket(self, identity)
        self._per_client[identity.name] += 1
        self._pending_per_client[identity.name] += 1
        self.pending += 1
        self._publish(identity, +1)
        try:
            yield ticket
        finally:
            if ticket.seated:
                self.seated -= 1
            else:
                self.pending -= 1
                _release(self._pending_per_client, identity.name)
            _release(self._per_client, identity.name)
            self._publish(identity, -1)

    def until_answered(
        self, identity: Identity, context: grpc.aio.ServicerContext
    ) -> Callable[[], None]:
        """For a call whose handler is running: the function to call when the handler has
        ended. From then until gRPC has sent the call's status (at once, unless the client
        does not read) the call counts among the client's unanswered ones."""
        name = identity.name
        state = {"ended": False, "answered": False}

        def answered(_: object) -> None:
            state["answered"] = True
            if state["ended"]:
                _release(self._unanswered, name)

        def ended() -> None:
            state["ended"] = True
            if not state["answered"]:
                self._unanswered[name] += 1

        context.add_done_callback(answered)
        return ended

    def _seat(self, ticket: Ticket) -> None:
        if ticket.seated:
            return
        limit = self.settings.max_streams
        if self.seated >= limit:
            self._refuse(
                "capacity",
                f"server is at its limit of {limit} concurrent streams; retry later",
            )
        ticket.seated = True
        self.metrics.client_streams.labels(ticket.identity.label).inc()  # admitted
        self.pending -= 1
        _release(self._pending_per_client, ticket.identity.name)
        self.seated += 1
        self.metrics.pending_streams.set(self.pending)
        self.metrics.active_streams.set(self.seated)

    def _refuse(self, reason: str, message: str) -> None:
        self.metrics.refused_streams.labels(reason).inc()
        raise AdmissionRefused(Status.RESOURCE_EXHAUSTED, message)

    def _publish(self, identity: Identity, delta: int) -> None:
        self.metrics.pending_streams.set(self.pending)
        self.metrics.active_streams.set(self.seated)
        self.metrics.client_active_streams.labels(identity.label).inc(delta)


def _release(counts: collections.Counter[str], name: str) -> None:
    """One fewer call for ``name``; a name with none left is forgotten (bounded memory)."""
    counts[name] -= 1
    if not counts[name]:
        del counts[name]
