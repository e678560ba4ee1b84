"""Settings from the environment and asr-server flags."""

from __future__ import annotations

import os
from pathlib import Path

import pydantic
import pytest

from asr_server.cli import parse_args
from asr_server.settings import (
    DEFAULT_METRICS_PORT,
    DEFAULT_PORT,
    ModelCacheSettings,
    Settings,
)


def test_defaults_are_the_documented_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("ASR_"):
            monkeypatch.delenv(key)
    s = parse_args([])
    assert (s.host, s.port, s.metrics_port) == ("127.0.0.1", DEFAULT_PORT, DEFAULT_METRICS_PORT)
    assert (s.engine.model, s.engine.device, s.vad.backend) == ("tiny.en", "auto", "webrtc")


def test_environment_then_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASR_PORT", "6000")
    monkeypatch.setenv("ASR_MODEL", "base")
    monkeypatch.setenv("ASR_DEVICE", "cpu")
    monkeypatch.setenv("ASR_STREAMING__MAX_BUFFERED_AUDIO_S", "2.5")
    monkeypatch.setenv("ASR_VAD__SILENCE_MS", "700")
    s = Settings()
    assert s.port == 6000 and s.engine.model == "base" and s.engine.device == "cpu"
    assert s.streaming.max_buffered_audio_s == 2.5
    flags = parse_args(
        ["--port", "7000", "--model", "small", "--vad", "silero", "--max-streams", "3"]
    )
    assert flags.port == 7000 and flags.engine.model == "small" and flags.vad.backend == "silero"
    assert flags.max_streams == 3
    assert flags.engine.device == "cpu"  # from the environment, untouched by flags
    assert flags.streaming.max_buffered_audio_s == 2.5
    assert flags.vad.silence_ms == 700  # --vad changes the backend, not the rest of vad


@pytest.mark.parametrize(
    ("env", "value"),
    [
        ("ASR_PORT", "70000"),
        ("ASR_DEVICE", "tpu"),
        ("ASR_VAD__SILENCE_MS", "5"),
        ("ASR_TURN__SPECULATE_MS", "200"),  # after the first ask (150 ms)
        ("ASR_TURN__EAGER_THRESHOLD", "1.5"),
        ("ASR_TURN__NARROWBAND_THRESHOLD", "0"),
    ],
)
def test_invalid_values_are_refused(monkeypatch: pytest.MonkeyPatch, env: str, value: str) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(pydantic.ValidationError):
        Settings()


def test_an_empty_variable_means_unset(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ASR_TLS_CLIENT_CA", "")
    monkeypatch.setenv("ASR_AUTH_TOKENS", "")
    settings = Settings()
    assert settings.tls_client_ca is None and settings.auth_tokens is None


def test_a_path_from_an_env_file_may_start_at_home(monkeypatch: pytest.MonkeyPatch) -> None:
    """No shell expands "~" in an env file or systemd's Environment=: ASR_CACHE_DIR=~/m
    made a folder named "~" in the working directory."""
    monkeypatch.setenv("HOME", "/home/operator")
    monkeypatch.setenv("ASR_CACHE_DIR", "~/models")
    monkeypatch.setenv("ASR_AUTH_TOKENS", "~/tokens")
    monkeypatch.setenv("ASR_TURN__MODEL_PATH", "~/turn.onnx")
    s = Settings()
    assert s.engine.cache_dir == Path("/home/operator/models")
    assert s.auth_tokens == Path("/home/operator/tokens")
    assert s.turn.model_path == Path("/home/operator/turn.onnx")
    assert ModelCacheSettings().path == Path("/home/operator/models")  # `turn-model`'s
    flags = parse_args(["--tls-cert", "~/c.pem", "--tls-key", "~/k.pem"])
    assert (flags.tls_cert, flags.tls_key) == (
        Path("/home/operator/c.pem"),
        Path("/home/operator/k.pem"),
    )


def test_a_home_that_cannot_be_found_is_a_settings_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pathlib's RuntimeError went through pydantic: a traceback instead of one line."""
    monkeypatch.setenv("ASR_CACHE_DIR", "~no-such-user-here/models")
    with pytest.raises(pydantic.ValidationError, match="cannot expand '~no-such-user-here/models'"):
        Settings()


def test_turn_model_expands_home_in_its_cache_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No shell expands "~" after "=": --cache-dir=~/m made a folder named "~"."""
    from asr_server import cli

    monkeypatch.setenv("HOME", "/home/operator")
    installed: list[Path] = []
    monkeypatch.setattr("asr_server.vad.turn.install_model", lambda p: installed.append(p) or p)
    cli.turn_model_command(["--cache-dir=~/m"])
    assert installed == [Path("/home/operator/m")]
    with pytest.raises(SystemExit):
        cli.turn_model_command(["--cache-dir=~no-such-user-here/m"])
    assert "cannot expand '~no-such-user-here/m'" in capsys.readouterr().err


def test_plaintext_is_refused_off_loopback_unless_insecure() -> None:
    from pydantic import ValidationError

    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert Settings(host=host).host == host
    for host in ("0.0.0.0", "::", "10.1.2.3", "asr.example.com"):
        with pytest.raises(ValidationError, match="refusing to serve plaintext"):
            Settings(host=host)
        assert Settings(host=host, insecure=True).insecure
    with pytest.raises(ValidationError, match="both tls_cert and tls_key"):
        Settings(tls_cert="a.pem")
    with pytest.raises(ValidationError, match="needs tls_cert"):
        Settings(tls_client_ca="ca.pem")
