"""The benchmarks fail clearly on bad input, rather than with a perfect score or a wait."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import longform_bench  # noqa: E402
import streaming_bench  # noqa: E402


def test_ids_that_match_nothing_or_are_no_regex_are_errors() -> None:
    """accuracy_breakdown and paired_bench reported a WER of 0.0 over no recording."""
    assert streaming_bench.load_items(None, "libri_1089")
    with pytest.raises(SystemExit, match="no recording of the corpus's WER set matches"):
        streaming_bench.load_items(None, "nomatch_xyz")
    with pytest.raises(SystemExit, match=r"--ids '\[' is not a regular expression"):
        streaming_bench.load_items(None, "[")


def test_longform_ids_that_are_no_regex_are_a_usage_error() -> None:
    """longform_bench, with its own loader, ended in re.error's traceback."""
    assert [i.id for i in longform_bench.long_items(r"^jfk$")] == ["jfk"]
    with pytest.raises(SystemExit, match=r"--ids '\(' is not a regular expression"):
        longform_bench.long_items("(")


async def test_a_server_that_cannot_start_says_why_at_once() -> None:
    """A mistyped --model ended with "server exited before it was ready", its reason
    thrown away with the server's output."""
    with pytest.raises(SystemExit, match="unknown model 'tiny.enx'"):
        await streaming_bench.start_server("tiny.enx", [])
