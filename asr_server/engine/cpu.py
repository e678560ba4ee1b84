"""What the CPU means for int8 decoding speed, so that an operator hears it at start-up.

CTranslate2's int8 kernels are fast on x86 CPUs with VNNI (AVX-512 VNNI, or AVX-VNNI on
newer desktop parts). Without it (AVX2 only: AMD EPYC before Zen 4, older Intel) the same
decodes took three to four times as long (2026-12-02, 2 cores: a 10 s encoder window 136
against 41 ms on the Intel machines the README's figures come from), and a 2-core server
held no call-center level under a 2 s final p95 where those held 16-40 calls
(docs/benchmarks.md, docs/call-center.md).
"""

from __future__ import annotations

import math
import os
import platform
from pathlib import Path

#: /proc/cpuinfo flags of x86 int8 dot-product instructions
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's flags (Linux x86); empty where there is no such file."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def is_x86(machine: str | None = None) -> bool:
    """``machine`` (this one's when not given) is 64-bit x86, as ``platform.machine()``
    names it on Linux, macOS or Windows."""
    return (machine or platform.machine()).lower() in ("x86_64", "amd64")


def slow_int8_warning(flags: frozenset[str], machine: str | None = None) -> str | None:
    """A line for the log if int8 decoding will be slow on this x86 CPU, else None (also
    where the CPU is not x86 or its flags are unknown: nothing is claimed then)."""
    if not is_x86(machine) or not flags:
        return None
    if flags & VNNI_FLAGS:
        return None
    return (
        "this CPU has no VNNI (AVX-512 VNNI or AVX-VNNI): int8 decodes take about three to "
        "four times as long as on one that has it, so expect that much higher latency and "
        "fewer streams per core (docs/benchmarks.md); a GPU or a CPU with VNNI avoids it"
    )


def int8_sums_may_saturate(flags: frozenset[str], machine: str | None = None) -> bool:
    """Whether onnxruntime's default int8 matrix kernels (unsigned activations times signed
    weights) may saturate on this CPU. On x86 without VNNI they add pairs of products in
    16 bits (AVX2's vpmaddubsw), which overflows; VNNI's dot products sum in 32 bits. On an
    x86 CPU whose flags are unknown: True, the safe side. Not x86: False (other kernels)."""
    return is_x86(machine) and not flags & VNNI_FLAGS


CGROUP = Path("/sys/fs/cgroup")


def usable_cores(cgroup: Path = CGROUP, membership: Path = Path("/proc/self/cgroup")) -> int:
    """The cores this process may use: those it may run on, capped by a container's CPU
    limit (a cgroup quota, v2 or v1: Docker's ``cpus``, Kubernetes' ``limits.cpu``, a
    systemd ``CPUQuota``), rounded up. ``os.cpu_count()`` is the machine's: one engine
    worker per *host* core under a 4-CPU limit would leave most of them throttled."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    cores = cores or os.cpu_count() or 1
    quota = _cgroup_cpu_limit(cgroup, _cgroup_paths(membership))
    return max(1, min(cores, math.ceil(quota))) if quota else cores


def _cgroup_paths(membership: Path) -> dict[str, str]:
    """This process's cgroup per hierarchy ("" for v2, "cpu" for v1's cpu controller), from
    /proc/self/cgroup lines such as ``0::/system.slice/x`` or ``4:cpu,cpuacct:/docker/y``."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        return {}
    paths = {}
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path.lstrip("/")
    return paths


def _cgroup_cpu_limit(cgroup: Path, paths: dict[str, str]) -> float | None:
    """CPUs allowed by the process's cgroup quota; None where there is none. The cgroup is
    looked for where /proc/self/cgroup places it, then at the mount's root (a container
    sees its own cgroup there)."""
    for base in dict.fromkeys([cgroup / paths.get("", ""), cgroup]):
        try:  # cgroup v2: "max 100000" or "400000 100000"
            quota, period = (base / "cpu.max").read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        except (OSError, ValueError):
            pass
    v1 = cgroup / "cpu"
    for base in dict.fromkeys([v1 / paths.get("cpu", ""), v1]):
        try:  # cgroup v1: -1 = no quota
            quota_us = int((base / "cpu.cfs_quota_us").read_text())
            period_us = int((base / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    return None
