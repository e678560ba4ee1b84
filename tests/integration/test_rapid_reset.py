"""A rapid-reset burst (thousands of streams opened and cancelled on one connection) leaves
the server responsive, with no session left behind and memory that stops growing."""

from __future__ import annotations

import asyncio
import ctypes
import gc

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.helpers import eventually, final_text, serve_fake, speech_pcm, stream_audio
from tests.rapid_reset import rapid_reset

pytestmark = pytest.mark.timeout(240)

BURST = 4000
ROUNDS = 12
LIBC = ctypes.CDLL(None)  # the C library of this process (glibc: malloc_trim)


def session_tasks() -> list[str]:
    """Tasks of stream sessions (named s<N>-reader, s<N>-writer, ...) still alive."""
    return [t.get_name() for t in asyncio.all_tasks() if t.get_name().split("-")[0][1:].isdigit()]


async def test_rapid_reset_burst_leaves_the_server_responsive_and_clean(
    make_server, caplog
) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server)
    process = psutil.Process()
    tasks_before = len(asyncio.all_tasks())

    rss, objects = [], []
    for _ in range(ROUNDS):
        report = await asyncio.to_thread(rapid_reset, server.port, BURST)
        assert report.streams == BURST, report
        await eventually(lambda: server.servicer.active == 0, 30)
        # while and after it, the server answers probes and transcribes
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=5
            )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        received = await stream_audio(server.port, speech_pcm(), 16_000, speed=None)
        assert final_text(received) == "w0 w1 w2 w3"
        gc.collect()
        objects.append(len(gc.get_objects()))
        rss.append(memory_in_use(process))

    assert server.servicer.active == 0
    assert server.servicer.admission.pending == 0
    # a reset call's handler stops: it never goes on to fail on a call that is gone (on
    # Python 3.11 asyncio.wait_for once let a reset that came with a message through)
    assert "unexpected server error" not in caplog.text
    assert session_tasks() == []
    assert len(asyncio.all_tasks()) <= tasks_before + 2
    # Nothing is kept per stream: after the first round warmed caches up, 44,000 more
    # streams leave the count of Python objects as it was. The handler starts for about a
    # quarter of them (the rest are reset first), so one object kept per handled stream
    # would add over 10,000 (checked by leaking one list per call: 80,393 → 85,837 in
    # five rounds).
    assert objects[-1] - objects[0] < 2_000, objects
    # Native memory (gRPC core's) levels off too: the allocator's and gRPC's pools grow
    # over the first rounds, then stop; the last rounds stay near the earlier peak, where
    # a kilobyte kept per stream would climb 16 MB in them.
    settled, last = rss[:-4], rss[-4:]
    assert max(last) - max(settled) < 12 << 20, [r >> 20 for r in rss]


def memory_in_use(process: psutil.Process) -> int:
    """RSS once the C allocator has handed its free pages back: without the trim, glibc
    keeps freed memory, and how much it keeps after each round is noise, not a leak."""
    if hasattr(LIBC, "malloc_trim"):
        LIBC.malloc_trim(0)
    return int(process.memory_info().rss)
