"""Settings the server cannot work with stop the start with one line naming the setting
(``asr-server: error: ...``, exit status 2), never a traceback or a server that only
seems to work."""

from __future__ import annotations

import os

import pydantic
import pytest

from asr_server.cli import main
from asr_server.settings import Settings


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("ASR_"):
            monkeypatch.delenv(key)


class Started(Exception):
    """The settings were taken: the server would have started."""


@pytest.fixture(autouse=True)
def never_start(monkeypatch: pytest.MonkeyPatch) -> None:
    def started(level: str) -> None:
        raise Started

    monkeypatch.setattr("asr_server.cli.configure_logging", started)


def start_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """What ``asr-server ARGV`` says when it refuses to start."""
    with pytest.raises(SystemExit) as stopped:
        main(list(argv))
    assert stopped.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("level", ["debug", "Info", "WARNING", "error", "critical"])
def test_log_levels_are_taken_in_any_case(level: str) -> None:
    assert Settings(log_level=level).log_level == level.upper()


@pytest.mark.parametrize("level", ["FOO", "verbose"])
def test_an_unknown_log_level_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, level: str
) -> None:
    monkeypatch.setenv("ASR_LOG_LEVEL", level)
    assert start_error(capsys) == (
        f"asr-server: error: log_level: unknown log level {level!r}: use DEBUG, INFO, "
        "WARNING, ERROR or CRITICAL"
    )


def test_an_unknown_log_level_flag_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    message = start_error(capsys, "--log-level", "verbose")
    assert message.startswith("asr-server: error: log_level: unknown log level 'verbose'")
    with pytest.raises(pydantic.ValidationError, match="unknown log level"):
        Settings(log_level=" ")
