"""A benchmark's servers end with the benchmark, however it ends (bench/children.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.processes import ROOT

#: a stand-in benchmark: starts a long-lived child as the benchmarks start their server,
#: prints its pid, and waits to be killed
BENCHMARK = """
import subprocess, sys, time
sys.path.insert(0, "bench")
from children import die_with_parent
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                         preexec_fn=die_with_parent)
print(child.pid, flush=True)
time.sleep(60)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_a_benchmarks_server_ends_when_the_benchmark_is_killed(signum: signal.Signals) -> None:
    """`kill PID` skipped the benchmarks' finally: their server stayed up (~300 MB, its
    ports) and shared the cores with the next run."""
    bench = subprocess.Popen(
        [sys.executable, "-c", BENCHMARK], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert bench.stdout is not None
    child = int(bench.stdout.readline())
    try:
        assert alive(child)
        os.kill(bench.pid, signum)
        bench.wait(10)
        deadline = time.monotonic() + 10
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child)
    finally:
        bench.kill()
        bench.wait()
        bench.stdout.close()
        if alive(child):
            os.kill(child, signal.SIGKILL)
