"""What the CPU's int8 instructions mean (asr_server/engine/cpu.py): the start-up warning
about slow decoding, and which int8 kernels the turn model may use."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from asr_server.engine.cpu import (
    cpu_flags,
    int8_sums_may_saturate,
    slow_int8_warning,
    usable_cores,
)

AVX2_ONLY = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma f16c bmi2"  # an AMD EPYC (Zen 3)


def test_an_avx2_only_cpu_is_warned_about(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: {AVX2_ONLY}\n")
    warning = slow_int8_warning(cpu_flags(cpuinfo), "x86_64")
    assert warning is not None and "VNNI" in warning


def test_cpus_with_vnni_and_other_machines_are_not() -> None:
    for extra in ("avx512f avx512_vnni", "avx_vnni", "amx_int8"):
        flags = frozenset(f"{AVX2_ONLY} {extra}".split())
        assert slow_int8_warning(flags, "x86_64") is None
    # not x86, or nothing known about the CPU: nothing is claimed
    assert slow_int8_warning(frozenset(AVX2_ONLY.split()), "aarch64") is None
    assert slow_int8_warning(frozenset(), "x86_64") is None
    assert cpu_flags(Path("/nonexistent/cpuinfo")) == frozenset()


def test_int8_sums_may_saturate_on_x86_without_vnni_or_where_nothing_is_known() -> None:
    assert int8_sums_may_saturate(frozenset(AVX2_ONLY.split()), "x86_64")
    assert int8_sums_may_saturate(frozenset(), "x86_64")  # unknown: the safe side
    for extra in ("avx512f avx512_vnni", "avx_vnni", "amx_int8"):
        assert not int8_sums_may_saturate(frozenset(f"{AVX2_ONLY} {extra}".split()), "AMD64")
    assert not int8_sums_may_saturate(frozenset(), "aarch64")


def cgroup_v2(tmp_path: Path, cpu_max: str) -> Path:
    (tmp_path / "cpu.max").write_text(cpu_max + "\n")
    return tmp_path


def cgroup_v1(tmp_path: Path, quota_us: int, period_us: int = 100_000) -> Path:
    """A v1 mount at ``tmp_path``, its cpu controller's root with this quota."""
    quota_files(_mk(tmp_path / "cpu"), quota_us, period_us)
    return tmp_path


def quota_files(cpu_cgroup: Path, quota_us: int, period_us: int = 100_000) -> None:
    (cpu_cgroup / "cpu.cfs_quota_us").write_text(f"{quota_us}\n")
    (cpu_cgroup / "cpu.cfs_period_us").write_text(f"{period_us}\n")


@pytest.fixture
def host_cores(monkeypatch: pytest.MonkeyPatch) -> int:
    """The process may run on 32 cores (a big host), whatever this machine has."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(32)), raising=False)
    return 32


def test_a_containers_cpu_limit_caps_the_cores(tmp_path: Path, host_cores: int) -> None:
    # Docker's cpus: "4" and a Kubernetes limit of 2500m, as cgroup v2 writes them
    assert usable_cores(cgroup_v2(_mk(tmp_path / "a"), "400000 100000")) == 4
    assert usable_cores(cgroup_v2(_mk(tmp_path / "b"), "250000 100000")) == 3  # rounded up
    assert usable_cores(cgroup_v2(_mk(tmp_path / "c"), "50000 100000")) == 1
    assert usable_cores(cgroup_v1(_mk(tmp_path / "d"), 200_000)) == 2


def test_without_a_limit_every_core_the_process_may_run_on(tmp_path: Path, host_cores: int) -> None:
    assert usable_cores(cgroup_v2(_mk(tmp_path / "a"), "max 100000")) == host_cores
    assert usable_cores(cgroup_v1(_mk(tmp_path / "b"), -1)) == host_cores
    assert usable_cores(tmp_path / "no-cgroup") == host_cores
    # a limit above what the process may run on changes nothing
    assert usable_cores(cgroup_v2(_mk(tmp_path / "c"), "6400000 100000")) == host_cores


def test_the_limit_is_read_from_the_process_own_cgroup(tmp_path: Path, host_cores: int) -> None:
    # on a host, or a container that sees the whole tree: /proc/self/cgroup names the
    # process's cgroup below the mount (v1: the cpu controller's line; v2: the "0::" one)
    membership = tmp_path / "self-cgroup"
    v1 = _mk(tmp_path / "v1")
    cgroup_v1(v1, -1)  # the root: no limit
    quota_files(_mk(v1 / "cpu" / "asr.slice"), 150_000)
    membership.write_text("4:memory:/other\n2:cpuacct,cpu:/asr.slice\n0::/\nnot a line\n")
    assert usable_cores(v1, membership) == 2
    v2 = _mk(tmp_path / "v2")
    cgroup_v2(v2, "max 100000")
    cgroup_v2(_mk(v2 / "system.slice"), "300000 100000")
    membership.write_text("0::/system.slice\n")
    assert usable_cores(v2, membership) == 3


def test_this_machine_has_at_least_one_usable_core() -> None:
    assert 1 <= usable_cores() <= (os.cpu_count() or 1)


def _mk(path: Path) -> Path:
    path.mkdir()
    return path
