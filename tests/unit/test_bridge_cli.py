"""asr-bridge's flags and environment variables → BridgeConfig, without starting anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from asr_bridge.cli import bridge_config, parse_args


def test_defaults_are_plaintext_same_origin_and_100_sessions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("TOKEN", "SERVER_TOKEN", "ALLOWED_ORIGINS", "MAX_SESSIONS", "SERVER_TLS"):
        monkeypatch.delenv(f"ASR_BRIDGE_{name}", raising=False)
    config = bridge_config(parse_args([]))
    assert config.server.target == "localhost:50051"
    assert not config.server.uses_tls and config.server.token is None
    assert config.token is None and config.allowed_origins == () and config.max_sessions == 100


def test_flags_reach_the_server_options_and_browser_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ASR_BRIDGE_ALLOWED_ORIGINS", raising=False)
    config = bridge_config(
        parse_args(
            [
                "--server=asr:443",
                "--server-ca=ca.pem",
                "--server-cert=c.pem",
                "--server-key=k.pem",
                "--server-token=for-the-server",
                "--server-tls-name=asr.internal",
                "--token=for-browsers",
                "--allowed-origin=https://a.example",
                "--allowed-origin=https://b.example",
                "--max-sessions=7",
            ]
        )
    )
    s = config.server
    assert (s.target, s.ca_file, s.cert_file, s.key_file) == (
        "asr:443",
        Path("ca.pem"),
        Path("c.pem"),
        Path("k.pem"),
    )
    assert s.uses_tls and s.token == "for-the-server" and s.server_name == "asr.internal"
    assert config.token == "for-browsers"  # the two tokens never mix
    assert config.allowed_origins == ("https://a.example", "https://b.example")
    assert config.max_sessions == 7


def test_environment_variables_and_flags_winning_over_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ASR_BRIDGE_SERVER", "asr:50051")
    monkeypatch.setenv("ASR_BRIDGE_SERVER_TLS", "true")
    monkeypatch.setenv("ASR_BRIDGE_SERVER_TOKEN", "from-a-secret-file\n")
    monkeypatch.setenv("ASR_BRIDGE_TOKEN", "browsers")
    monkeypatch.setenv("ASR_BRIDGE_ALLOWED_ORIGINS", "https://a.example, https://b.example")
    monkeypatch.setenv("ASR_BRIDGE_MAX_SESSIONS", "3")
    config = bridge_config(parse_args([]))
    assert config.server.target == "asr:50051" and config.server.tls
    assert config.server.token == "from-a-secret-file"
    assert config.token == "browsers"
    assert config.allowed_origins == ("https://a.example", "https://b.example")
    assert config.max_sessions == 3
    config = bridge_config(parse_args(["--allowed-origin=*", "--max-sessions=5"]))
    assert config.allowed_origins == ("*",) and config.max_sessions == 5


@pytest.mark.parametrize(
    "argv", [["--server-cert=c.pem"], ["--server-key=k.pem"], ["--max-sessions=0"]]
)
def test_impossible_flags_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    assert exit_.value.code == 2
