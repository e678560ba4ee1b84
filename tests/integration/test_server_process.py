"""``asr-server`` as a user runs it: a real process with the embedded model, health,
metrics, a stream, and a graceful drain on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import sys
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.helpers import ROOT, corpus, final_text, read_pcm16, stream_audio

pytestmark = [pytest.mark.model, pytest.mark.timeout(180)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_server_process_serves_reports_and_drains() -> None:
    metrics_port = free_port()
    env = {**os.environ, "ASR_STREAMING__MAX_BUFFERED_AUDIO_S": "3", "PYTHONUNBUFFERED": "1"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "asr_server",
        "--port",
        "0",
        "--metrics-port",
        str(metrics_port),
        cwd=ROOT,
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    log: list[str] = []
    port_found: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def read_log() -> None:  # keep draining stderr so the server never blocks on it
        assert proc.stderr is not None
        async for raw in proc.stderr:
            line = raw.decode(errors="replace")
            log.append(line)
            match = re.search(r"gRPC on 127\.0\.0\.1:(\d+)", line)
            if match and not port_found.done():
                port_found.set_result(int(match.group(1)))

    reader = asyncio.create_task(read_log())
    try:
        # the ready banner tells the user where to connect
        port = await asyncio.wait_for(port_found, 60)
        # and a command that works pasted as it is, from where the server was started
        (hint,) = [line.split("try:", 1)[1].split() for line in log if "try:" in line]
        client, _, sample = hint[:3]
        assert shutil.which(client, path=os.environ["PATH"]) or (ROOT / client).is_file(), hint
        assert (ROOT / sample).is_file(), hint
        assert hint[3:5] == ["--server", f"localhost:{port}"], hint
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest(service="asr.v1.Recognizer"))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        rec = corpus()["libri_1089-134691-0000"]
        pcm, sr = read_pcm16(rec.path)
        received = await stream_audio(port, pcm, sr, speed=None)
        assert "could wait no longer" in final_text(received).lower()
        metrics = await asyncio.to_thread(scrape, f"http://127.0.0.1:{metrics_port}/metrics")
        for name in (
            "asr_active_streams",
            "asr_audio_received_seconds_total",
            'asr_results_total{kind="final"}',
            "asr_engine_queue_wait_seconds_bucket",
            "asr_engine_inference_seconds_bucket",
            "asr_time_to_first_partial_seconds_bucket",
            "asr_final_latency_seconds_bucket",
            "asr_buffered_audio_seconds",
            "asr_stream_errors_total",
            "process_resident_memory_bytes",
        ):
            assert name in metrics, name
        # the error and refusal series are there at 0 before their first event (rate()
        # would miss that increment, and the error alert's panel said "no data")
        for series in (
            'asr_stream_errors_total{code="INTERNAL"} 0.0',
            'asr_refused_streams_total{reason="capacity"} 0.0',
            'asr_stream_timeouts_total{kind="idle"} 0.0',
            'asr_auth_failures_total{reason="wrong_token"} 0.0',
        ):
            assert series in metrics, series
        received_s = re.search(r"^asr_audio_received_seconds_total (\S+)$", metrics, re.M)
        assert received_s and float(received_s.group(1)) == pytest.approx(rec.duration_s, 0.01)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0, "".join(log)
        assert any("draining" in line for line in log)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await reader


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


async def server_that_stops(*args: str, **env: str) -> tuple[int | None, str]:
    """``python -m asr_server ARGS`` that is expected to stop at start-up: its exit code
    and what it wrote to stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "asr_server",
        *args,
        cwd=ROOT,
        env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, err.decode()


@pytest.mark.parametrize("which", ["--port", "--metrics-port", "--health-port"])
async def test_a_port_in_use_is_one_clear_line_not_a_traceback(which: str) -> None:
    # a socket another program listens on; by grpc's default on Linux a second server
    # could have bound it too and shared its calls
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        ports = {"--port": "0", "--metrics-port": "0", "--health-port": "0"}
        ports[which] = str(port)
        code, text = await server_that_stops(
            *(x for flag, value in ports.items() for x in (flag, value)),
            ASR_ENGINE__MODEL="fake",
        )
    assert code == 1, text
    assert "asr-server: error: cannot " in text and str(port) in text, text
    assert "Traceback" not in text


async def test_a_model_that_fails_to_load_says_why_without_a_traceback(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # a directory without a model in it
    # metrics and health on free ports too: a busy default port (9464) would fail the
    # start for another reason
    code, text = await server_that_stops(
        "--port", "0", "--metrics-port", "0", "--health-port", "0", "--model", str(tmp_path)
    )  # fmt: skip
    assert code != 0, text
    assert "missing model.bin" in text and str(tmp_path) in text, text
    assert "Traceback" not in text


async def test_turn_model_runs_in_the_servers_environment() -> None:
    # the image sets ASR_HOST=0.0.0.0 without TLS (a proxy in front); the model is
    # installed already (scripts/test.sh), so this only checks it
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "asr_server", "turn-model",
        cwd=ROOT, env={**os.environ, "ASR_HOST": "0.0.0.0"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert "semantic end-of-turn model ready" in out.decode()
