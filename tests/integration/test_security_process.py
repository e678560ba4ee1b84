"""The secured server as an operator runs it: real ``asr-server`` and ``asr-client``
processes, TLS and a token file, the real tiny.en model, SIGHUP, and the start-up refusal
of plaintext on a public address."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from asr_server.transport.auth import hash_token, parse_token_file
from tests.helpers import ROOT
from tests.pki import Pki

SAMPLE = ROOT / "audio_samples" / "libri_1089-134691-0001.flac"
#: a line of gRPC core's own log, below ERROR ("I1207 17:06:11.935718   12206 file.cc:2563] ...")
GRPC_CORE_LOG_LINE = re.compile(r"^[DIW]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\]")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_plaintext_on_a_public_address_is_refused_with_one_clear_line() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASR_")}
    done = subprocess.run(
        [sys.executable, "-m", "asr_server", "--host", "0.0.0.0", "--port", "0"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("asr-server: error: refusing to serve plaintext on 0.0.0.0")
    assert "--tls-cert" in lines[0] and "--insecure" in lines[0]


def test_a_bad_certificate_stops_the_start_naming_the_file(tmp_path: Path) -> None:
    cert, key = Pki(tmp_path).server()
    key.write_text("-----BEGIN PRIVATE KEY-----\nbroken\n-----END PRIVATE KEY-----\n")
    done = subprocess.run(
        [sys.executable, "-m", "asr_server", "--port", "0", "--metrics-port", "0",
         "--tls-cert", str(cert), "--tls-key", str(key)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"asr-server: error: TLS certificate {cert} and key {key}" in done.stderr


def test_a_missing_certificate_file_stops_the_start_naming_it(tmp_path: Path) -> None:
    _, key = Pki(tmp_path).server()
    missing = tmp_path / "nope.crt"
    done = subprocess.run(
        [sys.executable, "-m", "asr_server", "--port", "0", "--metrics-port", "0",
         "--tls-cert", str(missing), "--tls-key", str(key)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert (
        f"asr-server: error: cannot read the TLS certificate {missing}: No such file or directory"
        in done.stderr
    )


def test_token_command_prints_a_token_and_the_line_for_the_file(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "asr_server", "token", "call-gateway-1"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    token, line = (ln.strip() for ln in done.stdout.splitlines()[1::2])
    tokens = tmp_path / "tokens"
    tokens.write_text(line + "\n")
    [entry] = parse_token_file(tokens)
    assert entry.name == "call-gateway-1"
    assert entry.digest.hex() == hash_token(token)
    assert token not in tokens.read_text()  # the file holds only the hash
    bad = subprocess.run(
        [sys.executable, "-m", "asr_server", "token", "no spaces"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "client name" in bad.stderr


@pytest.mark.model
@pytest.mark.timeout(240)
async def test_tls_and_tokens_end_to_end_with_the_real_model(tmp_path: Path) -> None:
    pki = Pki(tmp_path / "pki")
    cert, key = pki.server()
    tokens = tmp_path / "tokens"
    tokens.write_text("# no clients yet\n")
    health_port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "asr_server", "--port", "0", "--metrics-port", "0",
        "--tls-cert", str(cert), "--tls-key", str(key), "--auth-tokens", str(tokens),
        "--health-port", str(health_port),
        cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    log: list[str] = []
    port_found: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    reloaded = asyncio.Event()

    async def read_log() -> None:  # keep draining stderr so the server never blocks on it
        assert proc.stderr is not None
        async for raw in proc.stderr:
            line = raw.decode(errors="replace")
            log.append(line)
            match = re.search(r"gRPC on 127\.0\.0\.1:(\d+) \(TLS, tokens\)", line)
            if match and not port_found.done():
                port_found.set_result(int(match.group(1)))
            if "reloaded: 1 client(s)" in line:
                reloaded.set()

    async def client(*extra: str, token: str | None) -> tuple[int, str, str]:
        env = {k: v for k, v in os.environ.items() if k != "ASR_TOKEN"}
        if token:
            env["ASR_TOKEN"] = token  # the documented way to keep it off the command line
        run = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "asr_client", "file", str(SAMPLE), "--fast",
            "--server", f"localhost:{port}", "--ca", str(pki.ca_file), *extra,
            cwd=ROOT, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(run.communicate(), 120)
        assert run.returncode is not None
        return run.returncode, out.decode(), err.decode()

    reader = asyncio.create_task(read_log())
    try:
        port = await asyncio.wait_for(port_found, 120)
        # probes use the plaintext health-only port
        async with grpc.aio.insecure_channel(f"127.0.0.1:{health_port}") as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="asr.v1.Recognizer"), timeout=10
            )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING

        code, _, err = await client(token=None)
        assert code == 2 and "error: UNAUTHENTICATED" in err, err
        # a client that does not trust the server's certificate: its handshakes fail, and
        # it says so in one line; gRPC's own INFO lines about each failed handshake (absl's
        # default since gRPC 1.65) came first, on both sides
        other_ca = Pki(tmp_path / "other").ca_file
        code, _, err = await client("--ca", str(other_ca), "--connect-timeout", "3", token=None)
        assert code == 1 and err.startswith("error: cannot connect to localhost:"), err
        assert len(err.strip().splitlines()) == 1, err
        assert not [line for line in log if GRPC_CORE_LOG_LINE.match(line)], "".join(log)

        # a new client is added to the file; SIGHUP makes the server read it now
        token = "s3cret-" + os.urandom(12).hex()
        tokens.write_text(f"gateway:{hash_token(token)}\n")
        proc.send_signal(signal.SIGHUP)
        await asyncio.wait_for(reloaded.wait(), 30)
        code, out, err = await client(token=token)
        assert code == 0, err
        assert "paced up and down" in out.lower() and "wait no longer" in out.lower(), out
        # the identity is in the call's log lines
        assert any(re.search(r"\[s\d+ gateway\]", line) for line in log), "".join(log)

        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0, "".join(log)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await reader
