"""The engine scheduler: priorities, coalescing, batching, cancellation, failures."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator

import numpy as np
import pytest

from asr_server.engine.base import DecodeKind, DecodeRequest
from asr_server.engine.fake import FakeEngine
from asr_server.engine.scheduler import EngineError, EngineScheduler
from asr_server.metrics import Metrics
from tests.helpers import eventually


def req(kind: DecodeKind, seconds: float = 1.0, tag: str = "") -> DecodeRequest:
    return DecodeRequest(np.full(int(seconds * 16_000), 0.1, np.float32), kind, prompt=tag)


async def started(engine: FakeEngine, n: int) -> None:
    await eventually(lambda: len(engine.calls) >= n)  # the worker thread entered the engine


@pytest.fixture
def gate() -> threading.Event:
    return threading.Event()


async def test_finals_run_before_partials_and_partials_coalesce(gate: threading.Event) -> None:
    engine = FakeEngine(gate=gate)
    sched = EngineScheduler(engine, Metrics())
    await sched.start()
    try:
        blocker = asyncio.create_task(sched.decode(req(DecodeKind.FINAL, tag="blocker")))
        await started(engine, 1)
        old = asyncio.create_task(
            sched.decode(req(DecodeKind.PARTIAL, tag="old"), coalesce_key="s1")
        )
        other = asyncio.create_task(
            sched.decode(req(DecodeKind.PARTIAL, tag="other"), coalesce_key="s2")
        )
        await asyncio.sleep(0)
        new = asyncio.create_task(
            sched.decode(req(DecodeKind.PARTIAL, tag="new"), coalesce_key="s1")
        )
        final = asyncio.create_task(sched.decode(req(DecodeKind.FINAL, tag="final")))
        await asyncio.sleep(0)
        assert await old is None  # replaced by the newer partial of the same stream
        gate.set()
        results = await asyncio.gather(blocker, other, new, final)
        assert all(r is not None for r in results)
        order = [c[0].prompt for c in engine.calls]
        # the final jumps the queue; the replaced partial keeps s1's place before s2
        assert order == ["blocker", "final", "new", "other"]
    finally:
        gate.set()
        await sched.close()


async def test_an_utterances_first_partial_goes_before_other_partials(
    gate: threading.Event,
) -> None:
    engine = FakeEngine(gate=gate)
    sched = EngineScheduler(engine, Metrics())
    await sched.start()
    try:
        blocker = asyncio.create_task(sched.decode(req(DecodeKind.FINAL, tag="blocker")))
        await started(engine, 1)
        waiting = [
            asyncio.create_task(sched.decode(req(DecodeKind.PARTIAL, tag=k), coalesce_key=k))
            for k in ("s1", "s2")
        ]
        await asyncio.sleep(0)
        first = asyncio.create_task(
            sched.decode(req(DecodeKind.PARTIAL, tag="s3-first"), coalesce_key="s3", urgent=True)
        )
        final = asyncio.create_task(sched.decode(req(DecodeKind.FINAL, tag="final")))
        await asyncio.sleep(0)
        # a stream's next partial, no longer its first, replaces its urgent one in place
        old = asyncio.create_task(
            sched.decode(req(DecodeKind.PARTIAL, tag="s4-first"), coalesce_key="s4", urgent=True)
        )
        await asyncio.sleep(0)
        newer = asyncio.create_task(
            sched.decode(req(DecodeKind.PARTIAL, tag="s4-next"), coalesce_key="s4")
        )
        await asyncio.sleep(0)
        assert await old is None
        gate.set()
        await asyncio.gather(blocker, *waiting, first, final, newer)
        order = [c[0].prompt for c in engine.calls]
        assert order == ["blocker", "final", "s3-first", "s1", "s2", "s4-next"]
        assert sched.queued == 0
    finally:
        gate.set()
        await sched.close()


async def test_a_worker_held_back_from_partials_stays_free_for_finals(
    gate: threading.Event,
) -> None:
    engine = FakeEngine(gate=gate, workers=2)
    sched = EngineScheduler(engine, Metrics(), workers=2, partial_workers=1)
    await sched.start()
    try:
        partials = [
            asyncio.create_task(sched.decode(req(DecodeKind.PARTIAL, tag=k), coalesce_key=k))
            for k in ("s1", "s2")
        ]
        await started(engine, 1)
        await asyncio.sleep(0.05)
        assert len(engine.calls) == 1  # the second partial waits: one worker is held back
        final = asyncio.create_task(sched.decode(req(DecodeKind.FINAL, tag="final")))
        await started(engine, 2)  # ... and a final takes it at once
        assert [c[0].prompt for c in engine.calls] == ["s1", "final"]
        gate.set()
        await asyncio.gather(final, *partials)
        assert [c[0].prompt for c in engine.calls] == ["s1", "final", "s2"]
    finally:
        gate.set()
        await sched.close()


async def test_cancelled_caller_removes_its_queued_job(gate: threading.Event) -> None:
    engine = FakeEngine(gate=gate)
    sched = EngineScheduler(engine, Metrics())
    await sched.start()
    try:
        blocker = asyncio.create_task(sched.decode(req(DecodeKind.FINAL, tag="blocker")))
        await started(engine, 1)
        doomed = asyncio.create_task(sched.decode(req(DecodeKind.FINAL, tag="doomed")))
        await asyncio.sleep(0)
        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        gate.set()
        await blocker
        after = await sched.decode(req(DecodeKind.FINAL, tag="after"))
        assert after is not None
        assert [c[0].prompt for c in engine.calls] == ["blocker", "after"]
    finally:
        gate.set()
        await sched.close()


async def test_the_queue_depth_gauge_drops_a_cancelled_job(gate: threading.Event) -> None:
    """Before, the gauge kept counting a job whose caller went away until some later
    request came: an idle server reported a queue."""
    engine = FakeEngine(gate=gate)
    metrics = Metrics()
    sched = EngineScheduler(engine, metrics)

    def depth() -> float | None:
        return metrics.registry.get_sample_value("asr_engine_queue_depth")

    await sched.start()
    try:
        running = asyncio.create_task(sched.decode(req(DecodeKind.PARTIAL), coalesce_key="a"))
        await started(engine, 1)
        queued = asyncio.create_task(sched.decode(req(DecodeKind.PARTIAL), coalesce_key="b"))
        await eventually(lambda: depth() == 1)
        queued.cancel()
        running.cancel()
        await asyncio.gather(queued, running, return_exceptions=True)
        assert depth() == 0
        gate.set()
        await eventually(lambda: sched.running == 0)
        assert depth() == 0
    finally:
        gate.set()
        await sched.close()


async def test_finals_waiting_counts_only_finals_no_worker_has_taken(
    gate: threading.Event,
) -> None:
    """What the channel asks before it carries the previous final into the next: only a
    queued final means the engine is behind on finals (one running does not, nor a
    partial, nor a final whose caller went away)."""
    engine = FakeEngine(gate=gate)
    sched = EngineScheduler(engine, Metrics())
    await sched.start()
    try:
        assert not sched.finals_waiting
        running = asyncio.create_task(sched.decode(req(DecodeKind.FINAL, tag="running")))
        await started(engine, 1)
        assert not sched.finals_waiting
        partial = asyncio.create_task(sched.decode(req(DecodeKind.PARTIAL), coalesce_key="s1"))
        await asyncio.sleep(0)
        assert not sched.finals_waiting
        queued = asyncio.create_task(sched.decode(req(DecodeKind.FINAL, tag="queued")))
        await asyncio.sleep(0)
        assert sched.finals_waiting
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert not sched.finals_waiting
        gate.set()
        await asyncio.gather(running, partial)
        assert not sched.finals_waiting
    finally:
        gate.set()
        await sched.close()


async def test_a_caller_hears_when_the_engine_begins_its_job(gate: threading.Event) -> None:
    engine = FakeEngine(gate=gate)
    sched = EngineScheduler(engine, Metrics())
    await sched.start()
    began: list[str] = []
    try:
        blocker = asyncio.create_task(
            sched.decode(req(DecodeKind.FINAL), on_start=lambda: began.append("blocker"))
        )
        await started(engine, 1)
        queued = asyncio.create_task(
            sched.decode(req(DecodeKind.FINAL), on_start=lambda: began.append("queued"))
        )
        await asyncio.sleep(0.05)
        assert began == ["blocker"]  # the second waits for the only worker
        gate.set()
        await asyncio.gather(blocker, queued)
        assert began == ["blocker", "queued"]
    finally:
        gate.set()
        await sched.close()


async def test_batches_requests_from_different_streams(gate: threading.Event) -> None:
    engine = FakeEngine(gate=gate, max_batch_size=4)
    sched = EngineScheduler(engine, Metrics())
    await sched.start()
    try:
        first = asyncio.create_task(sched.decode(req(DecodeKind.FINAL, tag="first")))
        await started(engine, 1)
        rest = [
            asyncio.create_task(sched.decode(req(DecodeKind.PARTIAL, tag=f"p{i}"), coalesce_key=i))
            for i in range(6)
        ]
        await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(first, *rest)
        sizes = [len(c) for c in engine.calls]
        assert sizes == [1, 4, 2]
    finally:
        gate.set()
        await sched.close()


def long_or_short(request: DecodeRequest) -> tuple[DecodeKind, bool]:
    """A stand-in for the engine's windows: audio over 5 s has another."""
    return request.kind, request.audio.size > 5 * 16_000


async def test_a_batch_holds_only_requests_of_one_batch_key(gate: threading.Event) -> None:
    """The engine pads a batch to its longest window: a 2 s partial batched with a 12 s
    one costs a 12 s encoder and reads other words than alone. So requests batch only
    with their own key; the oldest picks it, and the others keep their places."""
    engine = FakeEngine(gate=gate, max_batch_size=4, batch_key=long_or_short)
    sched = EngineScheduler(engine, Metrics())
    await sched.start()
    try:
        first = asyncio.create_task(sched.decode(req(DecodeKind.FINAL, tag="first")))
        await started(engine, 1)
        seconds = [2, 12, 3, 13, 4, 1, 2]
        rest = [
            asyncio.create_task(
                sched.decode(req(DecodeKind.PARTIAL, s, tag=f"p{i}"), coalesce_key=i)
            )
            for i, s in enumerate(seconds)
        ]
        finals = [
            asyncio.create_task(sched.decode(req(DecodeKind.FINAL, s, tag=f"f{i}")))
            for i, s in enumerate([9, 3])
        ]
        await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(first, *rest, *finals)
        assert [[r.prompt for r in c] for c in engine.calls] == [
            ["first"],
            ["f0"],
            ["f1"],
            ["p0", "p2", "p4", "p5"],
            ["p1", "p3"],
            ["p6"],
        ]
    finally:
        gate.set()
        await sched.close()


async def test_a_cancelled_request_does_not_pick_the_batch_key(gate: threading.Event) -> None:
    """The oldest live request picks the key: a caller that went away is skipped, so
    the requests behind it of another key are not held back for nobody."""
    engine = FakeEngine(gate=gate, max_batch_size=4, batch_key=long_or_short)
    sched = EngineScheduler(engine, Metrics())
    await sched.start()
    try:
        blocker = asyncio.create_task(sched.decode(req(DecodeKind.FINAL, tag="blocker")))
        await started(engine, 1)
        doomed = asyncio.create_task(sched.decode(req(DecodeKind.FINAL, 12, tag="doomed")))
        rest = [
            asyncio.create_task(sched.decode(req(DecodeKind.FINAL, s, tag=f"f{i}")))
            for i, s in enumerate([2, 13, 3])
        ]
        await asyncio.sleep(0)
        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        gate.set()
        await asyncio.gather(blocker, *rest)
        assert [[r.prompt for r in c] for c in engine.calls] == [
            ["blocker"],
            ["f0", "f2"],
            ["f1"],
        ]
    finally:
        gate.set()
        await sched.close()


async def test_a_batch_waiting_for_company_takes_only_its_own_key(
    gate: threading.Event,
) -> None:
    engine = FakeEngine(gate=gate, max_batch_size=4, batch_key=long_or_short)
    sched = EngineScheduler(engine, Metrics(), workers=2, batch_wait_s=0.5)
    await sched.start()
    try:
        busy = asyncio.create_task(sched.decode(req(DecodeKind.FINAL, tag="busy")))
        await started(engine, 1)
        a = asyncio.create_task(sched.decode(req(DecodeKind.FINAL, 2, tag="a")))
        await asyncio.sleep(0.05)  # the second worker took "a" and waits for company
        b = asyncio.create_task(sched.decode(req(DecodeKind.FINAL, 12, tag="b")))
        c = asyncio.create_task(sched.decode(req(DecodeKind.FINAL, 3, tag="c")))
        await started(engine, 2)
        gate.set()
        await asyncio.gather(busy, a, b, c)
        assert [[r.prompt for r in call] for call in engine.calls] == [
            ["busy"],
            ["a", "c"],
            ["b"],
        ]
    finally:
        gate.set()
        await sched.close()


@pytest.mark.parametrize(("queued", "calls"), [(2, [1, 1]), (6, [3, 3]), (9, [4, 4])])
async def test_queued_requests_are_shared_out_among_idle_workers(
    gate: threading.Event, queued: int, calls: list[int]
) -> None:
    """A batch runs on one worker's threads: two finals batched on one core while the
    other idles both come later than each on a core of its own. So a worker takes its
    share of the queue, not all it may (at most max_batch_size)."""
    engine = FakeEngine(gate=gate, max_batch_size=4)
    sched = EngineScheduler(engine, Metrics(), workers=2, batch_wait_s=0.5)
    await sched.start()
    try:
        finals = [
            asyncio.create_task(sched.decode(req(DecodeKind.FINAL, tag=f"f{i}")))
            for i in range(queued)
        ]
        await started(engine, len(calls))
        assert sorted(len(c) for c in engine.calls) == calls
        gate.set()
        await asyncio.gather(*finals)
        assert sum(len(c) for c in engine.calls) == queued
    finally:
        gate.set()
        await sched.close()


async def test_an_idle_engine_starts_a_lone_request_without_waiting_for_a_batch() -> None:
    """A lone stream's final must not wait for other streams that are not there (the
    wait is set absurdly long here: waiting at all would time the test out)."""
    engine = FakeEngine(max_batch_size=4)
    sched = EngineScheduler(engine, Metrics(), workers=2, batch_wait_s=30.0)
    await sched.start()
    try:
        hyp = await asyncio.wait_for(sched.decode(req(DecodeKind.FINAL)), timeout=5)
        assert hyp is not None
        assert [len(c) for c in engine.calls] == [1]
    finally:
        await sched.close()


async def test_while_the_engine_is_busy_a_worker_waits_for_a_batch(
    gate: threading.Event,
) -> None:
    """One worker inside the engine: the other waits up to batch_wait_s before its call,
    and a request that arrives meanwhile rides along in the same call."""
    engine = FakeEngine(gate=gate, max_batch_size=4)
    sched = EngineScheduler(engine, Metrics(), workers=2, batch_wait_s=0.5)
    await sched.start()
    try:
        busy = asyncio.create_task(sched.decode(req(DecodeKind.FINAL, tag="busy")))
        await started(engine, 1)
        a = asyncio.create_task(sched.decode(req(DecodeKind.FINAL, tag="a")))
        await asyncio.sleep(0.05)  # the second worker took "a" and waits for company
        b = asyncio.create_task(sched.decode(req(DecodeKind.FINAL, tag="b")))
        await started(engine, 2)
        gate.set()
        await asyncio.gather(busy, a, b)
        assert [[r.prompt for r in c] for c in engine.calls] == [["busy"], ["a", "b"]]
    finally:
        gate.set()
        await sched.close()


async def test_engine_failure_reaches_the_caller_and_the_worker_survives() -> None:
    engine = FakeEngine(fail_with=RuntimeError("boom"))
    sched = EngineScheduler(engine, Metrics())
    await sched.start()
    try:
        with pytest.raises(EngineError, match="boom"):
            await sched.decode(req(DecodeKind.FINAL))
        engine.fail_with = None
        assert (await sched.decode(req(DecodeKind.FINAL))) is not None
    finally:
        await sched.close()


async def test_a_request_that_fails_its_batch_fails_alone(gate: threading.Event) -> None:
    """One stream's request that makes the engine raise (a batch fails whole) costs the
    other streams of its batch nothing: each is decoded again alone."""

    def refuse_poison(requests) -> None:  # type: ignore[no-untyped-def]
        if any(r.prompt == "poison" for r in requests):
            raise ValueError("no such language")

    engine = FakeEngine(gate=gate, max_batch_size=4, on_call=refuse_poison)
    sched = EngineScheduler(engine, Metrics())
    await sched.start()
    try:
        first = asyncio.create_task(sched.decode(req(DecodeKind.FINAL, tag="first")))
        await started(engine, 1)
        tags = ["a", "poison", "b"]
        batch = [
            asyncio.create_task(sched.decode(req(DecodeKind.PARTIAL, tag=t), coalesce_key=t))
            for t in tags
        ]
        await asyncio.sleep(0)
        gate.set()
        done = await asyncio.gather(first, *batch, return_exceptions=True)
        assert [len(c) for c in engine.calls] == [1, 3, 1, 1, 1]  # the batch, then each
        a, poison, b = done[1:]
        assert not isinstance(a, BaseException) and a is not None and a.text == "w0 w1 w2 w3"
        assert isinstance(poison, EngineError) and "no such language" in str(poison)
        assert not isinstance(b, BaseException) and b is not None and b.text == "w0 w1 w2 w3"
        assert (await sched.decode(req(DecodeKind.FINAL))) is not None  # and it goes on
    finally:
        gate.set()
        await sched.close()


@contextlib.asynccontextmanager
async def a_stuck_engine_call(
    gate: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[EngineScheduler]:
    """A scheduler whose engine is inside a call that does not return until the end."""
    from asr_server.engine import scheduler

    monkeypatch.setattr(scheduler, "_left_running", set())
    engine = FakeEngine(gate=gate)
    sched = EngineScheduler(engine, Metrics())
    await sched.start()
    stuck = asyncio.create_task(sched.decode(req(DecodeKind.FINAL)))
    try:
        await started(engine, 1)
        yield sched
    finally:
        gate.set()
        stuck.cancel()
        await asyncio.gather(stuck, return_exceptions=True)


async def test_closing_with_a_stuck_engine_call_leaves_it_and_keeps_the_loop_free(
    gate: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine call that never returns (a wedged GPU) used to hold close() in a blocking
    executor shutdown: the event loop stopped, and with it the server's second SIGTERM.
    Now close() waits for it on the loop, up to its grace or abandon(), then says so."""
    from asr_server.engine import scheduler

    async with a_stuck_engine_call(gate, monkeypatch) as sched:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticking = asyncio.create_task(tick())
        began = asyncio.get_running_loop().time()
        await sched.close(grace_s=0.3)
        took = asyncio.get_running_loop().time() - began
        ticking.cancel()
        assert 0.3 <= took < 2.0
        assert ticks >= 5  # the loop ran meanwhile
        assert scheduler.engine_calls_left_running()


async def test_abandon_ends_the_wait_for_a_stuck_engine_call(
    gate: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    from asr_server.engine import scheduler

    async with a_stuck_engine_call(gate, monkeypatch) as sched:
        closing = asyncio.create_task(sched.close(grace_s=60))
        await asyncio.sleep(0.1)
        assert not closing.done()
        sched.abandon()  # the operator's second signal
        await asyncio.wait_for(closing, 2)
        assert scheduler.engine_calls_left_running()


async def test_closing_waits_for_an_engine_call_that_returns(gate: threading.Event) -> None:
    from asr_server.engine import scheduler

    engine = FakeEngine(gate=gate)
    sched = EngineScheduler(engine, Metrics())
    await sched.start()
    running = asyncio.create_task(sched.decode(req(DecodeKind.FINAL)))
    await started(engine, 1)
    closing = asyncio.create_task(sched.close(grace_s=10))
    await asyncio.sleep(0.1)
    gate.set()  # the call returns: close() ends, with nothing left behind
    await asyncio.wait_for(closing, 5)
    assert not scheduler.engine_calls_left_running()
    # its caller is told no result comes (it used to wait on it for good)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(running, 5)


async def test_an_engine_call_past_its_time_limit_fails_its_batch_and_says_so(
    gate: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stuck engine (a wedged GPU) held its streams with no error, for good. Past
    call_timeout_s the batch fails, on_stuck is told (the server turns NOT_SERVING), the
    engine is not asked for each request alone, and the other worker still serves."""
    from asr_server.engine import scheduler as module

    monkeypatch.setattr(module, "_left_running", set())
    stuck: list[bool] = []
    engine = FakeEngine(gate=gate)
    metrics = Metrics()
    sched = EngineScheduler(
        engine,
        metrics,
        workers=2,
        max_batch_size=2,
        call_timeout_s=0.3,
        on_stuck=lambda: stuck.append(True),
    )
    await sched.start()
    try:
        first = asyncio.create_task(sched.decode(req(DecodeKind.FINAL, tag="a")))
        second = asyncio.create_task(sched.decode(req(DecodeKind.FINAL, tag="b")))
        for job in (first, second):
            with pytest.raises(EngineError, match="did not answer within 0.3 s"):
                await asyncio.wait_for(job, 5)
        assert stuck and len(engine.calls) <= 2  # no one-at-a-time retry of a stuck batch
        assert metrics.registry.get_sample_value("asr_engine_timeouts_total") == len(stuck)
        gate.set()  # the engine comes back: later calls are served
        assert await asyncio.wait_for(sched.decode(req(DecodeKind.FINAL)), 5) is not None
    finally:
        gate.set()
        await sched.close()
