"""asr-bridge's flags and environment variables → BridgeConfig, without starting anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from asr_bridge.cli import bridge_config, parse_args, run


def test_defaults_are_plaintext_same_origin_and_100_sessions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("TOKEN", "SERVER_TOKEN", "ALLOWED_ORIGINS", "MAX_SESSIONS", "SERVER_TLS"):
        monkeypatch.delenv(f"ASR_BRIDGE_{name}", raising=False)
    for name in ("MAX_SESSIONS_PER_CLIENT", "FORWARDED_ALLOW_IPS"):
        monkeypatch.delenv(f"ASR_BRIDGE_{name}", raising=False)
    config = bridge_config(parse_args([]))
    assert config.server.target == "localhost:50051"
    assert not config.server.uses_tls and config.server.token is None
    assert config.token is None and config.allowed_origins == () and config.max_sessions == 100
    assert config.max_sessions_per_client == 0 and config.forwarded_allow_ips is None


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
                "--max-sessions-per-client=2",
                "--forwarded-allow-ips=10.0.0.0/8",
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
    assert config.max_sessions_per_client == 2 and config.forwarded_allow_ips == "10.0.0.0/8"


def test_a_tls_name_alone_means_tls(monkeypatch: pytest.MonkeyPatch) -> None:
    """It was dropped without --server-tls, and the server token went in plaintext."""
    for name in ("SERVER_TLS", "SERVER_CA", "SERVER_CERT", "SERVER_KEY"):
        monkeypatch.delenv(f"ASR_BRIDGE_{name}", raising=False)
    s = bridge_config(
        parse_args(["--server=10.0.0.5:443", "--server-tls-name=asr.internal"])
    ).server
    assert s.uses_tls and s.credentials() is not None
    assert s.describe() == "tls://10.0.0.5:443"


def test_environment_variables_and_flags_winning_over_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ASR_BRIDGE_SERVER", "asr:50051")
    monkeypatch.setenv("ASR_BRIDGE_SERVER_TLS", "true")
    monkeypatch.setenv("ASR_BRIDGE_SERVER_TOKEN", "from-a-secret-file\n")
    monkeypatch.setenv("ASR_BRIDGE_TOKEN", "browsers")
    monkeypatch.setenv("ASR_BRIDGE_ALLOWED_ORIGINS", "https://a.example, https://b.example")
    monkeypatch.setenv("ASR_BRIDGE_MAX_SESSIONS", "3")
    monkeypatch.setenv("ASR_BRIDGE_MAX_SESSIONS_PER_CLIENT", "1")
    monkeypatch.setenv("ASR_BRIDGE_FORWARDED_ALLOW_IPS", "192.0.2.1")
    config = bridge_config(parse_args([]))
    assert config.max_sessions_per_client == 1 and config.forwarded_allow_ips == "192.0.2.1"
    assert config.server.target == "asr:50051" and config.server.tls
    assert config.server.token == "from-a-secret-file"
    assert config.token == "browsers"
    assert config.allowed_origins == ("https://a.example", "https://b.example")
    assert config.max_sessions == 3
    config = bridge_config(parse_args(["--allowed-origin=*", "--max-sessions=5"]))
    assert config.allowed_origins == ("*",) and config.max_sessions == 5


@pytest.mark.parametrize(
    "argv",
    [
        ["--server-cert=c.pem"],
        ["--server-key=k.pem"],
        ["--max-sessions=0"],
        ["--max-sessions-per-client=-1"],
        ["--max-sessions-per-client=two"],
        ["--log-level=FOO"],
        ["--port=70000"],
        ["--port=-1"],
        ["--port=http"],
    ],
)
def test_impossible_flags_are_usage_errors(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    assert exit_.value.code == 2
    assert "asr-bridge: error: " in capsys.readouterr().err


def test_log_levels_in_any_case_and_any_port(monkeypatch: pytest.MonkeyPatch) -> None:
    a = parse_args(["--log-level=debug", "--port=0"])
    assert (a.log_level, a.port) == ("DEBUG", 0)
    assert parse_args(["--port=65535"]).port == 65535


@pytest.fixture
def pem_files(tmp_path: Path) -> tuple[str, str]:
    cert, key = tmp_path / "bridge.crt", tmp_path / "bridge.key"
    cert.write_text("not a certificate\n")
    key.write_text("not a key\n")
    return str(cert), str(key)


def test_the_bridges_certificate_and_key_go_together_and_must_be_readable(
    pem_files: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cert, key = pem_files
    missing = str(tmp_path / "missing.key")
    for argv, phrase in (
        ([f"--ssl-certfile={cert}"], "--ssl-certfile and --ssl-keyfile go together"),
        ([f"--ssl-keyfile={key}"], "--ssl-certfile and --ssl-keyfile go together"),
        ([f"--ssl-certfile={cert}", f"--ssl-keyfile={missing}"], f"--ssl-keyfile {missing}: "),
    ):
        with pytest.raises(SystemExit) as exit_:
            parse_args(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert f"asr-bridge: error: {phrase}" in err, err
        assert "Traceback" not in err
    a = parse_args([f"--ssl-certfile={cert}", f"--ssl-keyfile={key}"])
    assert (a.ssl_certfile, a.ssl_keyfile) == (Path(cert), Path(key))


async def test_a_certificate_that_does_not_load_is_one_line_naming_it(
    pem_files: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    # readable, but not PEM: ssl.SSLError as uvicorn loads it, before anything is bound
    cert, key = pem_files
    with pytest.raises(SystemExit) as exit_:
        await run(parse_args(["--port=0", f"--ssl-certfile={cert}", f"--ssl-keyfile={key}"]))
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("asr-bridge: error: ") and cert in line and key in line, line


def test_the_browser_token_is_stripped_and_never_empty(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # a token from a secret file ends in a newline that no browser sends
    monkeypatch.setenv("ASR_BRIDGE_TOKEN", "for-browsers\n")
    assert bridge_config(parse_args([])).token == "for-browsers"
    assert bridge_config(parse_args(["--token= spaced \n"])).token == "spaced"
    for argv in ([], ["--token=  "]):
        monkeypatch.setenv("ASR_BRIDGE_TOKEN", "\n")
        with pytest.raises(SystemExit) as exit_:
            parse_args(argv)
        assert exit_.value.code == 2
        assert "--token ($ASR_BRIDGE_TOKEN) is empty" in capsys.readouterr().err


def test_paths_may_start_at_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither a systemd ``Environment=`` nor a Kubernetes ``args:`` list expands ``~``,
    and a shell does not after ``--flag=``: the bridge looked in a folder named ``~``."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("ASR_BRIDGE_SERVER_CA", "~/ca.pem")
    a = parse_args(["--server-cert=~/c.pem", "--server-key=~/k.pem"])
    assert (a.server_ca, a.server_cert, a.server_key) == (
        tmp_path / "ca.pem",
        tmp_path / "c.pem",
        tmp_path / "k.pem",
    )
    cert, key = tmp_path / "bridge.pem", tmp_path / "bridge.key"
    cert.write_text("x")
    key.write_text("x")
    a = parse_args(["--ssl-certfile=~/bridge.pem", "--ssl-keyfile=~/bridge.key"])
    assert (a.ssl_certfile, a.ssl_keyfile) == (cert, key)
