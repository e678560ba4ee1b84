"""Shares one engine between all streams: priorities, coalescing, batching, workers.

* Finals run before partials: a final is what the user waits for. Then the first
  partial of an utterance (``urgent``): it tells a caller they are heard, and under
  load it would otherwise wait a whole round of every other stream's partials.
* Partials are coalesced per key (a stream's channel): a newer partial replaces a
  queued older one, whose caller receives ``None``, and keeps its queue position
  so a busy stream cannot push others back. Under load each stream therefore gets
  a partial once per round of the queue: partials back off, finals keep flowing.
* Up to ``max_batch_size`` requests of the same kind and batch key (the engine's: for
  Whisper, the same encoder window) go to one engine call, so a batch pads none of its
  requests and each is decoded from the input it has alone; the oldest picks the key, and
  queued requests of other keys keep their places for the next call. While
  other calls are running, a worker waits at most ``batch_wait_s`` for a batch to
  fill (an idle engine starts at once). Queued requests are shared out among the idle
  workers first: a batch runs on one worker's threads, padded to its longest audio, so
  two finals batched on one core while the other core idles both come later than each
  on its own core. A full batch forms once more requests wait than workers are free.
* Engine calls run in a thread pool (CTranslate2 releases the GIL), never on the
  event loop. A caller that goes away while its job is queued removes it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from asr_server.engine.base import DecodeKind, DecodeRequest, Engine, Hypothesis
from asr_server.metrics import Metrics

logger = logging.getLogger(__name__)

#: how long closing waits for the engine calls under way (their streams are gone; a decode
#: is bounded by its length, seconds at most, unless the engine is stuck: a wedged GPU)
ENGINE_CLOSE_GRACE_S = 10.0

#: schedulers closed with an engine call still running: its thread never returned
_left_running: set[int] = set()


def engine_calls_left_running() -> bool:
    """Did a closed scheduler leave an engine call running? The process must then end
    without the interpreter's usual exit, which joins the engine's threads and would
    wait on that call for good."""
    return bool(_left_running)


class EngineError(RuntimeError):
    """The engine failed on a request."""


class EngineStuck(EngineError):
    """An engine call did not return within its time limit."""


@dataclass
class _Job:
    request: DecodeRequest
    future: asyncio.Future[Hypothesis | None]
    batch_key: Hashable
    on_start: Callable[[], None] | None = None
    enqueued: float = field(default_factory=time.perf_counter)


class EngineScheduler:
    def __init__(
        self,
        engine: Engine,
        metrics: Metrics,
        *,
        workers: int = 1,
        max_batch_size: int | None = None,
        batch_wait_s: float = 0.0,
        partial_workers: int = 0,
        call_timeout_s: float = 0.0,
        on_stuck: Callable[[], None] | None = None,
    ) -> None:
        self.engine = engine
        # an engine call past this fails its batch, and on_stuck is told (0: no limit)
        self.call_timeout_s = call_timeout_s
        self._on_stuck = on_stuck
        self.metrics = metrics
        self.workers = workers
        self.max_batch_size = max(
            1, min(max_batch_size or engine.max_batch_size, engine.max_batch_size)
        )
        self.batch_wait_s = batch_wait_s
        # partials may keep at most this many workers busy, the others staying free for
        # finals. Measured on 2 cores (docs/call-center.md): holding one back lowered the
        # final latency at 12 calls but slowed partials at 20 without helping finals there,
        # so by default partials may use every worker.
        self.partial_workers = min(partial_workers or workers, workers)
        self._partial_calls = 0  # workers running partials now
        self._busy_workers = 0  # workers holding a batch (waiting for company or running)
        self._finals: deque[_Job] = deque()
        self._partials: OrderedDict[Hashable, _Job] = OrderedDict()
        self._urgent: OrderedDict[Hashable, _Job] = OrderedDict()  # first partials
        self._anonymous = 0
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="asr-engine")
        self._in_engine: set[Future[list[Hypothesis]]] = set()  # engine calls under way
        self._abandon = asyncio.Event()  # close() waits for no engine call
        self._tasks: list[asyncio.Task[None]] = []
        self.calls = 0
        self.running = 0  # requests inside the engine right now

    async def start(self) -> None:
        self.metrics.engine_workers.set(self.workers)
        self._tasks = [
            asyncio.create_task(self._worker(), name=f"engine-worker-{i}")
            for i in range(self.workers)
        ]

    async def close(self, grace_s: float = ENGINE_CLOSE_GRACE_S) -> None:
        """Stop the workers and wait, up to ``grace_s`` or until ``abandon()``, for the
        engine calls under way; never blocking the event loop (the server's second
        SIGTERM must still be heard while an engine call will not return)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for job in [*self._finals, *self._urgent.values(), *self._partials.values()]:
            job.future.cancel()
        self._finals.clear()
        self._urgent.clear()
        self._partials.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)
        calls = [call for call in list(self._in_engine) if not call.done()]
        if not calls:
            return
        waiting: list[asyncio.Future[Any]] = [
            asyncio.gather(*map(asyncio.wrap_future, calls), return_exceptions=True),
            asyncio.create_task(self._abandon.wait()),
        ]
        await asyncio.wait(waiting, timeout=grace_s, return_when="FIRST_COMPLETED")
        for future in waiting:
            future.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        still = sum(not call.done() for call in calls)
        if still:
            logger.error(
                "%d engine call(s) still running at shutdown (a stuck engine?): leaving them",
                still,
            )
            _left_running.add(id(self))

    async def _call_engine(self, requests: list[DecodeRequest]) -> Sequence[Hypothesis | None]:
        """One engine call on a worker thread; kept in _in_engine while it runs, so that
        close() knows what it waits for."""
        call = self._executor.submit(self.engine.transcribe, requests)
        self._in_engine.add(call)
        call.add_done_callback(self._in_engine.discard)
        returned = asyncio.wrap_future(call)
        if not self.call_timeout_s:
            return await returned
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for drops a cancellation
            # that comes as the call returns, and close() then waited on a worker for good.
            # Shielded: the thread runs on anyway, and its result must not be cancelled.
            async with asyncio.timeout(self.call_timeout_s):
                return await asyncio.shield(returned)
        except TimeoutError:
            self.metrics.engine_timeouts.inc()
            logger.error(
                "an engine call of %d request(s) has not returned in %g s: the engine looks "
                "stuck; failing its streams and reporting NOT_SERVING",
                len(requests),
                self.call_timeout_s,
            )
            if self._on_stuck is not None:
                self._on_stuck()
            raise EngineStuck(
                f"the engine did not answer within {self.call_timeout_s:g} s"
            ) from None

    def abandon(self) -> None:
        """close() stops waiting for the engine calls under way (the operator asked to
        end now)."""
        self._abandon.set()

    @property
    def queued(self) -> int:
        return len(self._finals) + len(self._urgent) + len(self._partials)

    @property
    def finals_waiting(self) -> bool:
        """Whether a final is queued that no worker has taken yet: the engine is behind
        on finals, the requests callers wait for."""
        return any(not job.future.done() for job in self._finals)

    @property
    def idle(self) -> bool:
        return self.running == 0 and not any(
            not j.future.done()
            for j in (*self._finals, *self._urgent.values(), *self._partials.values())
        )

    async def decode(
        self,
        request: DecodeRequest,
        *,
        coalesce_key: Hashable | None = None,
        urgent: bool = False,
        on_start: Callable[[], None] | None = None,
    ) -> Hypothesis | None:
        """Queue ``request`` and wait for its hypothesis.

        Returns ``None`` when a newer partial with the same ``coalesce_key`` replaced it.
        ``urgent`` partials (an utterance's first) run before the other partials.
        ``on_start`` is called (on the event loop, by the worker: it must not raise) when
        the engine call begins: from then on, going away no longer saves the engine work.
        """
        job = _Job(
            request,
            asyncio.get_running_loop().create_future(),
            self.engine.batch_key(request),
            on_start,
        )
        if request.kind is DecodeKind.FINAL:
            self._finals.append(job)
        else:
            if coalesce_key is None:
                self._anonymous += 1
                coalesce_key = ("anonymous", self._anonymous)
            queue = self._urgent if urgent else self._partials
            for q in (self._urgent, self._partials):
                old = q.get(coalesce_key)
                if old is None:
                    continue
                if not old.future.done():
                    old.future.set_result(None)
                    self.metrics.partials_superseded.inc()
                if q is not queue:
                    del q[coalesce_key]
            queue[coalesce_key] = job  # a replaced job's key keeps its place
        self._publish_depth()
        self._wakeup.set()
        try:
            return await job.future
        finally:
            if not job.future.done():
                job.future.cancel()  # the caller went away: the worker skips this job
            self._publish_depth()  # (a cancelled caller's job no longer counts)

    def _pop(self, kind: DecodeKind, n: int, key: Hashable | None = None) -> list[_Job]:
        """Up to ``n`` live jobs of ``kind`` with one batch key (``key``, or the oldest
        job's), oldest first (urgent partials before the others). Jobs of other keys
        stay where they are; cancelled ones are dropped."""
        jobs: list[_Job] = []

        def joins(job: _Job) -> bool:
            nonlocal key
            if len(jobs) >= n or job.future.done():
                return False
            if key is None:
                key = job.batch_key
            return bool(job.batch_key == key)

        if kind is DecodeKind.FINAL:
            kept: deque[_Job] = deque()
            for job in self._finals:
                if joins(job):
                    jobs.append(job)
                elif not job.future.done():
                    kept.append(job)
            self._finals = kept
            return jobs
        for queue in (self._urgent, self._partials):
            for handle, job in list(queue.items()):
                if joins(job):
                    jobs.append(job)
                    del queue[handle]
                elif job.future.done():
                    del queue[handle]
        return jobs

    def _publish_depth(self) -> None:
        """The queue-depth gauge: requests a worker would take (not cancelled or
        superseded ones that wait to be dropped)."""
        self.metrics.engine_queue_depth.set(
            self._live(DecodeKind.FINAL) + self._live(DecodeKind.PARTIAL)
        )

    def _live(self, kind: DecodeKind) -> int:
        """Queued requests of ``kind`` that a worker would take."""
        jobs = (
            self._finals
            if kind is DecodeKind.FINAL
            else (*self._urgent.values(), *self._partials.values())
        )
        return sum(not job.future.done() for job in jobs)

    def _share(self, kind: DecodeKind, taken: int = 0) -> int:
        """How many requests of ``kind`` a worker holding ``taken`` of them should have:
        the queue shared out evenly among the workers free to run it (this one
        included), at most ``max_batch_size``."""
        free = self.workers - self._busy_workers
        if kind is DecodeKind.PARTIAL:
            free = min(free, self.partial_workers - self._partial_calls)
        if taken:  # this worker already counts as busy
            free += 1
        waiting = self._live(kind) + taken
        return min(self.max_batch_size, -(-waiting // max(1, free)))

    def _take_batch(self) -> list[_Job]:
        finals = self._pop(DecodeKind.FINAL, self._share(DecodeKind.FINAL))
        if finals or self._partial_calls >= self.partial_workers:
            return finals
        return self._pop(DecodeKind.PARTIAL, self._share(DecodeKind.PARTIAL))

    async def _worker(self) -> None:
        while True:
            batch = self._take_batch()
            if not batch:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            partial = batch[0].request.kind is DecodeKind.PARTIAL
            # before any await: counted as soon as taken
            self._partial_calls += partial
            self._busy_workers += 1
            try:
                await self._run(batch)
            except asyncio.CancelledError:
                for job in batch:  # closing: no result will come (_run may have added jobs)
                    job.future.cancel()
                raise
            finally:
                self._busy_workers -= 1
                if partial:
                    self._partial_calls -= 1
                    self._wakeup.set()  # a worker held back from partials may take one now

    async def _run(self, batch: list[_Job]) -> None:
        """One engine call for ``batch`` (topped up while others run); results to callers."""
        kind = batch[0].request.kind
        if len(batch) < self.max_batch_size and self.batch_wait_s > 0 and self.running:
            # the engine is busy with other calls: more requests are on their way, and
            # one call for several costs less than one each. An idle engine starts at
            # once: a lone stream's final would only wait for nobody.
            await asyncio.sleep(self.batch_wait_s)
            wanted = self._share(kind, len(batch)) - len(batch)
            batch += self._pop(kind, wanted, batch[0].batch_key)
        self._publish_depth()
        label = kind.name.lower()
        started = time.perf_counter()
        for job in batch:
            self.metrics.engine_queue_wait.labels(label).observe(started - job.enqueued)
            if job.on_start is not None:
                job.on_start()
        self.running += len(batch)
        self.metrics.engine_busy_workers.inc()
        hyps: Sequence[Hypothesis | None]
        try:
            hyps = await self._call_engine([j.request for j in batch])
        except EngineStuck as exc:
            for job in batch:  # not one request's fault: no request is tried alone
                self._fail(job, exc)
            return
        except Exception as exc:
            if len(batch) == 1:
                logger.exception("engine call failed")
                self._fail(batch[0], exc)
                return
            # one request can fail a whole call: each is decoded alone, so that only the
            # one at fault fails (another stream's partial or final is not lost with it)
            logger.warning(
                "engine call failed on a batch of %d (%s): decoding each alone", len(batch), exc
            )
            alone_hyps: list[Hypothesis | None] = []
            for job in batch:
                try:
                    (hyp,) = await self._call_engine([job.request])
                except Exception as alone:
                    logger.exception("engine call failed")
                    self._fail(job, alone)
                    hyp = None
                alone_hyps.append(hyp)
            hyps = alone_hyps
        finally:
            self.running -= len(batch)
            self.calls += 1
            elapsed = time.perf_counter() - started
            self.metrics.engine_busy_workers.dec()
            self.metrics.engine_busy_seconds.inc(elapsed)
            self.metrics.engine_inference.labels(label).observe(elapsed)
            self.metrics.engine_batch_size.observe(len(batch))
        for job, hyp in zip(batch, hyps, strict=True):
            if not job.future.done():
                job.future.set_result(hyp)

    @staticmethod
    def _fail(job: _Job, exc: Exception) -> None:
        if not job.future.done():
            job.future.set_exception(EngineError(str(exc)))
