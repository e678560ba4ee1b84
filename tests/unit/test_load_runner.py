"""The load generator's runner against an in-process server on the fake engine."""

from __future__ import annotations

from collections.abc import Sequence

import psutil

from asr_client.load.command import default_options, make_calls
from asr_client.load.runner import StreamOutcome, run_load


def _connections_to(port: int) -> int:
    """This process's established TCP connections to ``port`` (the client ends)."""
    return sum(
        c.status == psutil.CONN_ESTABLISHED and bool(c.raddr) and c.raddr.port == port
        for c in psutil.Process().net_connections(kind="tcp")
    )


async def test_each_connection_asked_for_is_its_own_tcp_connection(server: str) -> None:
    """Equal channel arguments share grpc's global subchannel pool: ``--connections 3``
    ran every stream over one TCP connection, so a balancer saw one client."""
    port = int(server.rpartition(":")[2])
    calls = make_calls(streams=0, silent=3, duration_s=1.0)
    seen: list[int] = []

    def count(outcomes: Sequence[StreamOutcome], elapsed: float) -> None:
        seen.append(_connections_to(port))

    options = default_options(len(calls), chunk_ms=100, speed=10, ramp_s=0, connections=3)
    outcomes = await run_load(server, calls, options, on_tick=count, tick_s=0.02)
    assert [o.status for o in outcomes] == ["OK"] * 3
    assert max(seen) == 3, seen
