"""Admission: pending calls (no config yet) are bounded per client identity too."""

from __future__ import annotations

from contextlib import ExitStack

import pytest

from asr_server.errors import Status
from asr_server.metrics import Metrics
from asr_server.transport.admission import Admission, AdmissionRefused
from asr_server.transport.interceptors import Identity
from tests.helpers import settings


def who(name: str) -> Identity:
    return Identity(name=name, label=name, authenticated=True)


def test_one_client_cannot_fill_the_pending_pool_and_lock_others_out() -> None:
    """Calls that never send a config: one identity takes at most half the pending pool
    (by default), so another client's call is still admitted."""
    metrics = Metrics()
    admission = Admission(settings(max_pending_streams=8), metrics)
    with ExitStack() as held:
        for _ in range(4):
            held.enter_context(admission.call(who("mallory")))
        with pytest.raises(AdmissionRefused) as refused:
            held.enter_context(admission.call(who("mallory")))
        assert refused.value.status is Status.RESOURCE_EXHAUSTED
        assert "mallory has 4 streams waiting to send their config" in str(refused.value)
        # alice is admitted and seated while mallory's four calls still wait
        with admission.call(who("alice")) as ticket:
            ticket.seat()
            assert (admission.pending, admission.seated) == (4, 1)
    assert (admission.pending, admission.seated) == (0, 0)
    labels = {"reason": "client_pending_limit"}
    assert metrics.registry.get_sample_value("asr_refused_streams_total", labels) == 1


def test_seated_calls_free_their_pending_share() -> None:
    """A client whose calls send their config may open many more: only calls still
    waiting count against its pending share."""
    admission = Admission(settings(max_pending_streams=4, max_streams=64), Metrics())
    with ExitStack() as held:
        for _ in range(10):
            held.enter_context(admission.call(who("gateway"))).seat()
        assert (admission.pending, admission.seated) == (0, 10)
    assert admission._pending_per_client == {}


def test_the_per_client_pending_share_can_be_set() -> None:
    admission = Admission(
        settings(max_pending_streams=8, max_pending_streams_per_client=1), Metrics()
    )
    with admission.call(who("a")), pytest.raises(AdmissionRefused):
        with admission.call(who("a")):
            pass  # pragma: no cover


def test_a_full_server_refuses_a_call_before_its_config() -> None:
    """With every seat taken a new call is refused as it comes, not left pending until
    its config arrives to be refused then; a call pending when the seats filled is
    refused at its config."""
    metrics = Metrics()
    admission = Admission(settings(max_streams=1), metrics)
    with admission.call(who("a")) as early, admission.call(who("b")) as seated:
        seated.seat()
        with pytest.raises(AdmissionRefused, match="at its limit of 1 concurrent streams"):
            with admission.call(who("c")):
                pass  # pragma: no cover
        assert (admission.pending, admission.seated) == (1, 1)  # c was never pending
        with pytest.raises(AdmissionRefused, match="at its limit of 1"):
            early.seat()
    labels = {"reason": "capacity"}
    assert metrics.registry.get_sample_value("asr_refused_streams_total", labels) == 2
    with admission.call(who("c")) as ticket:  # the seat is free again
        ticket.seat()
