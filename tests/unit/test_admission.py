"""Admission: pending calls (no config yet) are bounded per client identity too."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack

import pytest

from asr_server.errors import Status
from asr_server.metrics import Metrics
from asr_server.transport.admission import Admission, AdmissionRefused
from asr_server.transport.interceptors import Identity, _certificate_subject
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


class CallContext:
    """What Admission.until_answered uses of a gRPC call's context."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[object], None]] = []

    def add_done_callback(self, callback: Callable[[object], None]) -> None:
        self.callbacks.append(callback)

    def answered(self) -> None:  # gRPC has sent the call's status
        for callback in self.callbacks:
            callback(self)


def test_calls_ended_but_unanswered_are_capped_per_client(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A client that does not read keeps each call the server ended open until its status
    can be sent, with its tasks, though it holds no seat: past its cap it is refused; a
    call answered at once (the usual case) never counts; others are not affected."""
    from asr_server.transport import admission as module

    monkeypatch.setattr(module, "UNANSWERED_CALLS_PER_CLIENT", 2)
    metrics = Metrics()
    admission = Admission(settings(), metrics)
    quick = CallContext()
    admission.until_answered(who("mallory"), quick)()  # its handler ended ...
    quick.answered()  # ... and its status went out
    stuck = [CallContext(), CallContext()]
    for context in stuck:
        admission.until_answered(who("mallory"), context)()
    with pytest.raises(AdmissionRefused, match="mallory has 2 ended calls whose answers"):
        with admission.call(who("mallory")):
            pass  # pragma: no cover
    with admission.call(who("alice")):
        pass
    stuck[0].answered()  # (or its connection went)
    with admission.call(who("mallory")):
        pass
    labels = {"reason": "client_unanswered_limit"}
    assert metrics.registry.get_sample_value("asr_refused_streams_total", labels) == 1
    # a call cancelled by its client is done before its handler ends: never counted
    cancelled = CallContext()
    ended = admission.until_answered(who("bob"), cancelled)
    cancelled.answered()
    ended()
    assert admission._unanswered["bob"] == 0


def test_two_certificate_names_stay_two_identities() -> None:
    """A certificate's name is the client's identity (its stream and pending limits), with
    unprintable characters escaped for the log: a line break and a backslash-n became one
    identity, and so did names alike for 128 characters once escaped (an escape is up to
    four characters)."""

    def identity(name: str) -> str | None:
        return _certificate_subject({"x509_common_name": [name.encode()]})

    assert identity("a\nb") == "a\\nb" and identity("a\\nb") == "a\\\\nb"
    long_a, long_b = "x" * 8 + "\x1b" * 30 + "A", "x" * 8 + "\x1b" * 30 + "B"
    assert identity(long_a) != identity(long_b)
    assert identity("y" * 200) == "y" * 128  # (cut as before)
    assert identity("José Müller 张伟") == "José Müller 张伟"  # readable as it is
    assert identity("  ") is None
