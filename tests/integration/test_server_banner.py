"""The line ``asr-server`` prints when it is ready names what it actually serves."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys

import pytest

from tests.helpers import ROOT


@pytest.mark.timeout(120)
async def test_the_ready_line_names_the_engine_loaded_not_the_configured_model() -> None:
    # the fake backend ignores ASR_ENGINE__MODEL (tiny.en by default)
    env = {**os.environ, "ASR_ENGINE__BACKEND": "fake", "PYTHONUNBUFFERED": "1"}
    env.pop("ASR_ENGINE__MODEL", None)
    env.pop("ASR_MODEL", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "asr_server",
        "--port", "0", "--metrics-port", "0", "--health-port", "0",
        cwd=ROOT, env=env, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    log: list[str] = []
    try:
        while not any("is ready" in line for line in log):
            raw = await asyncio.wait_for(proc.stderr.readline(), 60)
            assert raw, "".join(log)
            log.append(raw.decode(errors="replace"))
        (ready,) = [line for line in log if "streamasr is ready" in line]
        assert re.search(r"streamasr is ready: model fake, gRPC on 127\.0\.0\.1:\d+", ready), ready
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
