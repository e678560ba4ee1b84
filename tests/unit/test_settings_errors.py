"""Settings the server cannot work with stop the start with one line naming the setting
(``asr-server: error: ...``, exit status 2), never a traceback or a server that only
seems to work."""

from __future__ import annotations

import os
from pathlib import Path

import pydantic
import pytest

from asr_api.v1 import asr_pb2
from asr_server.cli import main
from asr_server.settings import Settings, StreamingSettings, largest_stream_request_bytes


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


@pytest.mark.parametrize("limit", ["0", "1000", "-5", "1048576"])
def test_a_message_limit_below_the_largest_request_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, limit: str
) -> None:
    # the server started, and then every stream failed RESOURCE_EXHAUSTED (-5: no limit)
    monkeypatch.setenv("ASR_MAX_MESSAGE_BYTES", limit)
    message = start_error(capsys)
    assert message.startswith(
        f"asr-server: error: max_message_bytes ({limit}) must be at least 1048592: "
    )
    assert "streaming.max_audio_message_bytes" in message


def test_the_largest_requests_fit_the_least_limit_allowed() -> None:
    streaming = StreamingSettings(
        max_audio_message_bytes=4096, max_prompt_chars=300, max_hotwords=40
    )
    least = largest_stream_request_bytes(streaming)
    Settings(max_message_bytes=least, streaming=streaming)
    with pytest.raises(pydantic.ValidationError, match="max_message_bytes"):
        Settings(max_message_bytes=least - 1, streaming=streaming)
    audio = asr_pb2.StreamingRecognizeRequest(audio=bytes(streaming.max_audio_message_bytes))
    wide = "\U0001f600"  # 4 bytes in UTF-8
    config = asr_pb2.StreamingRecognizeRequest(
        config=asr_pb2.StreamingConfig(
            format=asr_pb2.AudioFormat(sample_rate_hz=48_000, channels=2),
            language="en",
            interim_results=True,
            initial_prompt=wide * streaming.max_prompt_chars,
            hotwords=[wide * streaming.max_hotword_chars] * streaming.max_hotwords,
            resume=asr_pb2.ResumeFrom(
                stream_offset_s=3600.0,
                session_id="s" * 64,
                channels=[asr_pb2.ChannelResume(previous_text=wide * 1000)] * 2,
            ),
        )
    )
    assert audio.ByteSize() <= least and config.ByteSize() <= least


def test_turn_model_reads_only_the_cache_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the server's environment in the image (a public address; TLS is the operator's to
    # add) is no valid server, but this command only needs the cache directory
    monkeypatch.setenv("ASR_HOST", "0.0.0.0")
    monkeypatch.setenv("ASR_LOG_LEVEL", "FOO")
    monkeypatch.setenv("ASR_ENGINE__CACHE_DIR", str(tmp_path / "engine"))
    installed: list[Path] = []

    def install(cache_dir: Path) -> Path:
        installed.append(cache_dir)
        return cache_dir / "model.onnx"

    monkeypatch.setattr("asr_server.vad.turn.install_model", install)
    main(["turn-model"])
    monkeypatch.setenv("ASR_CACHE_DIR", str(tmp_path / "flat"))  # the shortcut wins
    main(["turn-model"])
    main(["turn-model", "--cache-dir", str(tmp_path / "flag")])
    assert installed == [tmp_path / "engine", tmp_path / "flat", tmp_path / "flag"]
    assert "semantic end-of-turn model ready" in capsys.readouterr().out


def test_a_variable_that_cannot_be_parsed_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, pydantic-settings' SettingsError escaped as a traceback."""
    monkeypatch.setenv("ASR_ENGINE", "notjson")
    line = start_error(capsys)
    assert line.startswith('asr-server: error: error parsing value for field "engine"')


@pytest.mark.parametrize("seconds", ["inf", "nan", "-1"])
def test_a_drain_without_end_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, seconds: str
) -> None:
    """An infinite drain never ended (and told clients an infinite GoingAway deadline)."""
    monkeypatch.setenv("ASR_DRAIN_TIMEOUT_S", seconds)
    assert start_error(capsys).startswith("asr-server: error: drain_timeout_s: ")


def test_a_thread_count_ctranslate2_cannot_run_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """CTranslate2 takes any number: 100000 crashed the server (SIGSEGV, no message)."""
    monkeypatch.setenv("ASR_ENGINE__CPU_THREADS", "100000")
    line = start_error(capsys)
    assert line.startswith("asr-server: error: engine.cpu_threads: "), line


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("ASR_ENGINE__BEAM_SIZE", "(did you mean ASR_ENGINE__FINAL_BEAM_SIZE?)"),
        ("ASR_ENGINE__WORKER", "(did you mean ASR_ENGINE__WORKERS?)"),
        ("ASR_VAD__SILENCE", "(did you mean ASR_VAD__SILENCE_MS?)"),
        ("asr_turn__probe", "(did you mean ASR_TURN__PROBE_MS?)"),
        ("ASR_NOTHING__AT_ALL", ""),
    ],
)
def test_a_misspelt_setting_in_a_group_stops_the_start(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, name: str, error: str
) -> None:
    """pydantic-settings skips names no field has: ASR_VAD__SILENCE=200 started a server
    that ended utterances after the default 500 ms, without a word."""
    monkeypatch.setenv(name, "1")
    assert start_error(capsys) == f"asr-server: error: {name} is not a setting {error}".strip()


def test_a_misspelt_top_level_setting_is_warned_of(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ASR_ prefix is shared with the client, the bridge and maybe other programs: a
    name that is none of these settings is told, and the server starts."""
    monkeypatch.setenv("ASR_MAX_STREAM", "2")
    monkeypatch.setenv("ASR_ENGINE_WORKERS", "1")
    monkeypatch.setenv("ASR_TOKEN", "the client's")  # the client's, the bridge's: not told
    monkeypatch.setenv("ASR_BRIDGE_SERVER", "localhost:50051")
    with pytest.raises(Started):
        main([])
    assert capsys.readouterr().err.splitlines() == [
        "asr-server: warning: ASR_ENGINE_WORKERS is not a setting "
        "(did you mean ASR_ENGINE__WORKERS?): ignored",
        "asr-server: warning: ASR_MAX_STREAM is not a setting "
        "(did you mean ASR_MAX_STREAMS?): ignored",
    ]


def test_a_misspelt_field_in_a_json_group_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="silence\n  Extra inputs"):
        Settings(vad={"silence": 200})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("variables", "error"),
    [
        # the second ask was dropped: probes at 800 ms only
        ({"PROBE_MS": "800"}, "turn.second_probe_ms (600) must come after turn.probe_ms (800)"),
        # the turn ended at its longest pause before the model was ever asked
        (
            {"PROBE_MS": "1000", "MAX_SILENCE_MS": "500", "SECOND_PROBE_MS": "0"},
            "turn.max_silence_ms (500) must exceed turn.probe_ms (1000)",
        ),
        (
            {"SECOND_PROBE_MS": "2500"},
            "turn.second_probe_ms (2500) must come after turn.probe_ms (150) and before "
            "turn.max_silence_ms (2000)",
        ),
        # an eager bar at or above a first ask's refused every stream (SILENCE and
        # Recognize too) behind a "ready" server, blaming a field no client had sent
        ({"THRESHOLD": "0.5"}, "turn.eager_threshold (0.5) must be below turn.threshold (0.5)"),
        (
            {"EAGER_THRESHOLD": "0.99"},
            "turn.eager_threshold (0.99) must be below turn.threshold (0.98)",
        ),
        (
            {"NARROWBAND_THRESHOLD": "0.4", "EAGER_THRESHOLD": "0.4", "THRESHOLD": "0.9"},
            "turn.eager_threshold (0.4) must be below turn.narrowband_threshold (0.4)",
        ),
    ],
)
def test_turn_settings_that_cannot_work_are_refused(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    variables: dict[str, str],
    error: str,
) -> None:
    """Out of order, an ask of the turn model was dropped or never came: SEMANTIC streams
    quietly became silence endpointing. A first ask's bar lowered to the eager one (the
    README lists ASR_TURN__THRESHOLD) refused every stream."""
    for name, value in variables.items():
        monkeypatch.setenv(f"ASR_TURN__{name}", value)
    assert start_error(capsys).startswith(f"asr-server: error: turn: {error}")


def test_a_lower_first_ask_above_the_eager_bar_serves_silence_streams() -> None:
    """The per-stream check still passes what the settings allow."""
    from asr_server.transport.convert import _Endpointing

    settings = Settings(turn={"threshold": 0.6})  # type: ignore[arg-type]
    _Endpointing(500, 2000, None, None).check(settings, 16_000, "config.endpointing")


def test_a_turn_model_asked_once_is_taken() -> None:
    assert Settings(turn={"second_probe_ms": 0}).turn.second_probe_ms == 0  # type: ignore[arg-type]


def test_a_start_that_needs_minutes_of_voice_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASR_VAD__START_MS", "600000")  # no utterance would ever start
    assert start_error(capsys).startswith("asr-server: error: vad.start_ms: ")
