"""What the CPU's int8 instructions mean (asr_server/engine/cpu.py): the start-up warning
about slow decoding, and which int8 kernels the turn model may use."""

from __future__ import annotations

from pathlib import Path

from asr_server.engine.cpu import cpu_flags, int8_sums_may_saturate, slow_int8_warning

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
