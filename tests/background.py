"""Long, idle scenarios, started when the suite's collection ends so that their waiting
overlaps the tests that run before theirs; the test reads the result (``result``).

A scenario is ``python -m tests.scenarios.NAME``, which prints one JSON document as the
last line of its output. It starts only if the test that reads it was collected (a ``-k``
run of other tests starts nothing). Each runs in a process group of its own with what it
starts (replicas, proxies): one still running when the session ends (tests/conftest.py),
or past its time, is stopped with all of them; and a scenario stops itself if pytest dies
without stopping it (tests/scenarios/__init__.py). A minute spent waiting on the wall
clock (streams held silent through proxies) so costs the suite next to nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterable

import pytest

from tests.helpers import ROOT

#: the test that reads a scenario (its node id's end) → the scenario's module
SCENARIOS = {
    "test_proxies.py::test_a_stream_survives_minutes_of_silence_through_both_proxies": (
        "silence_through_proxies"
    ),
}
_running: dict[str, subprocess.Popen[str]] = {}


def start_for(items: Iterable[pytest.Item]) -> None:
    """Start the scenarios the collected ``items`` read."""
    for item in items:
        for test, name in SCENARIOS.items():
            if item.nodeid.endswith(test):
                _start(name)


def _start(name: str) -> subprocess.Popen[str]:
    if name not in _running:
        _running[name] = subprocess.Popen(
            [sys.executable, "-m", f"tests.scenarios.{name}"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its group: what it starts is stopped with it
        )
    return _running[name]


def result(name: str, timeout_s: float) -> object:
    """The scenario's JSON result (started now if it was not); skips the test if the
    scenario says it cannot run here, fails it with the scenario's output if it failed."""
    process = _start(name)
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        output = _stop(process)
        pytest.fail(f"scenario {name} ran past {timeout_s:.0f} s:\n{output}")
    lines = output.strip().splitlines()
    if process.returncode != 0 or not lines:
        pytest.fail(f"scenario {name} failed (exit {process.returncode}):\n{output}")
    found = json.loads(lines[-1])
    if isinstance(found, dict) and "skip" in found:
        pytest.skip(found["skip"])
    return found


def stop_all() -> None:
    for process in _running.values():
        if process.poll() is None:
            _stop(process)
    _running.clear()


def _stop(process: subprocess.Popen[str]) -> str:
    """SIGTERM to the scenario's group, so that it stops what it started (its cleanup
    runs), then SIGKILL to whatever is left of the group; the scenario's output."""
    group = process.pid  # (a session leader: its group's id is its pid)
    _signal_group(group, signal.SIGTERM)
    try:
        output, _ = process.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        _signal_group(group, signal.SIGKILL)
        output, _ = process.communicate()
    _signal_group(group, signal.SIGKILL)  # a child that outlived its parent's cleanup
    return output


def _signal_group(group: int, sig: signal.Signals) -> None:
    try:
        os.killpg(group, sig)
    except ProcessLookupError:  # the group is gone
        pass
