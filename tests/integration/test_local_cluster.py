"""deploy/local/cluster.sh, the local cluster of docs/scale-out.md, started and stopped as
a developer does: a replica behind a real proxy, a stream through it, and Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from asr_client import AsrClient, audio_config
from tests.helpers import ROOT, eventually, tone
from tests.processes import connectable

pytestmark = pytest.mark.timeout(180)


def listeners() -> str:
    """Who listens on which port, for a failure's message."""
    return subprocess.run(["ss", "-ltnp"], capture_output=True, text=True, check=False).stdout


def free_block() -> int:
    """A base port whose cluster ports (PORT, PORT+1, PORT+100, PORT+101) are all free."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base > 65_000:
            continue
        if not any(connectable(base + d) for d in (0, 1, 100, 101)):
            return int(base)
    raise AssertionError("no free block of ports")


async def stop_cluster(script: asyncio.subprocess.Process) -> None:
    """After a failure: Ctrl-C twice, so its trap stops the replicas and the proxy (they
    run in their own sessions: killing the script alone left them running), then kill."""
    if script.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        script.send_signal(signal.SIGINT)
        await asyncio.sleep(0.5)
        script.send_signal(signal.SIGINT)  # (hurry: no 30 s drains)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(script.wait(), 30)
    if script.returncode is None:
        script.kill()
        await script.wait()


@pytest.mark.parametrize("proxy", ["envoy", "nginx"])
async def test_a_second_ctrl_c_while_replicas_drain_still_stops_the_proxy(
    proxy: str, tmp_path: Path
) -> None:
    """The second Ctrl-C used to end the script's stop handler half-way: the replicas
    were left to drain alone, and the proxy ran on, orphaned, holding the cluster's port
    and the work folder."""
    port = free_block()
    log = (tmp_path / "cluster.log").open("w")
    script = await asyncio.create_subprocess_exec(
        "bash", str(ROOT / "deploy/local/cluster.sh"), "--replicas", "1", "--port", str(port),
        "--proxy", proxy, "--fake",
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    try:
        text = ""
        for _ in range(600):
            text = (tmp_path / "cluster.log").read_text()
            if "Ctrl-C stops everything" in text or script.returncode is not None:
                break
            await asyncio.sleep(0.2)
        assert "Ctrl-C stops everything" in text, text
        (work,) = [Path(p) for p in re.findall(r"logs\s+(\S+)/", text)]
        assert work.is_dir()
        async with AsrClient(f"127.0.0.1:{port}", resume=None) as client:
            stream = await client.stream(audio_config()).open()
            await stream.send_audio((tone(1.0) * 32767).astype("<i2").tobytes())
            first = await anext(aiter(stream))  # the stream is open, through the proxy
            assert first is not None
            script.send_signal(signal.SIGINT)  # Ctrl-C: the replica drains (its stream is open)
            # once it does (a second SIGTERM before that is its first one's again, and it
            # drained its whole 30 s: now and then in a full run, after a fixed 1 s sleep)
            replica_log = work / "replica-1.log"
            await eventually(lambda: "draining:" in replica_log.read_text(), timeout_s=20)
            script.send_signal(signal.SIGINT)  # again, while it drains
            await asyncio.sleep(0.1)
            # and again, as an impatient operator does (unless the hurried stop is over)
            with contextlib.suppress(ProcessLookupError):
                script.send_signal(signal.SIGINT)
            async with asyncio.timeout(60):
                code = await script.wait()
            stream.cancel()
        assert code == 130
        text = (tmp_path / "cluster.log").read_text()
        assert text.count("hurrying") == 1, text  # said once, however many Ctrl-Cs
        held = [port + d for d in (0, 1, 100, 101) if connectable(port + d)]
        assert not held, f"still listening on {held}:\n{listeners()}"
        assert not work.exists()
    finally:
        await stop_cluster(script)
        log.close()


def listening_pid(port: int) -> int:
    """The process listening on ``port``."""
    out = subprocess.run(
        ["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout
    (pid,) = {int(p) for p in re.findall(r"pid=(\d+)", out)}
    return pid


@contextlib.asynccontextmanager
async def nginx_cluster(
    tmp_path: Path,
) -> AsyncIterator[tuple[int, asyncio.subprocess.Process, Path, Path]]:
    """cluster.sh with one fake replica behind nginx, ready: its port, the script, its log
    and its work folder; stopped (stop_cluster) on leaving."""
    port = free_block()
    log = (tmp_path / "cluster.log").open("w")
    script = await asyncio.create_subprocess_exec(
        "bash", str(ROOT / "deploy/local/cluster.sh"), "--replicas", "1", "--port", str(port),
        "--proxy", "nginx", "--fake",
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    cluster_log = tmp_path / "cluster.log"
    try:
        await eventually(lambda: "Ctrl-C stops everything" in cluster_log.read_text(), 120)
        (work,) = [Path(p) for p in re.findall(r"logs\s+(\S+)/", cluster_log.read_text())]
        yield port, script, cluster_log, work
    finally:
        await stop_cluster(script)
        log.close()


async def test_a_killed_replica_is_started_again_and_its_stream_resumes(tmp_path: Path) -> None:
    """The docs' failover drill on the local cluster: killing a replica stopped the whole
    cluster (its proxy too), and the stream it had could not resume anywhere."""
    async with nginx_cluster(tmp_path) as (port, script, cluster_log, work):
        audio = (tone(1.0) * 32767).astype("<i2").tobytes()
        async with AsrClient(f"127.0.0.1:{port}") as client:
            stream = await client.stream(audio_config()).open()
            responses: list[object] = []

            async def read() -> None:  # (a resume is the reader's: it reads throughout)
                async for response in stream:
                    responses.append(response)

            reader = asyncio.create_task(read())
            await stream.send_audio(audio)
            await eventually(lambda: bool(responses))  # open, through the proxy
            os.kill(listening_pid(port + 1), signal.SIGKILL)
            restarting = f"replica 1 (127.0.0.1:{port + 1}) exited with status 137"
            await eventually(lambda: restarting in cluster_log.read_text(), 10)
            replica_log = work / "replica-1.log"
            await eventually(lambda: replica_log.read_text().count("gRPC on") == 2, 60)
            assert script.returncode is None  # the cluster, its proxy included, runs on
            await stream.send_audio(audio)
            await stream.end()
            await asyncio.wait_for(reader, 60)  # to the end: the stream resumed, no error
            assert stream.resumes == 1  # type: ignore[attr-defined]
        script.send_signal(signal.SIGINT)
        async with asyncio.timeout(60):
            assert await script.wait() == 130
        held = [port + d for d in (0, 1, 100, 101) if connectable(port + d)]
        assert not held, f"still listening on {held}:\n{listeners()}"


async def test_a_signal_during_a_restart_pause_stops_the_cluster_at_once(tmp_path: Path) -> None:
    """A replica that keeps exiting is started again after a pause that doubles; a SIGTERM
    to the script during that pause (a supervisor's, `kill`) waited it out first."""
    async with nginx_cluster(tmp_path) as (port, script, cluster_log, work):
        replica_log = work / "replica-1.log"
        for starts, pause in ((1, 1), (2, 2), (3, 4)):  # it keeps dying: the pause doubles
            await eventually(lambda: replica_log.read_text().count("gRPC on") == starts, 60)  # noqa: B023
            os.kill(listening_pid(port + 1), signal.SIGKILL)
            await eventually(lambda: f"again in {pause} s" in cluster_log.read_text(), 10)  # noqa: B023
        script.send_signal(signal.SIGTERM)  # in the 4 s pause
        async with asyncio.timeout(2):
            assert await script.wait() == 130
        held = [port + d for d in (0, 1, 100, 101) if connectable(port + d)]
        assert not held, f"still listening on {held}:\n{listeners()}"
