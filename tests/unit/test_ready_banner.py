"""The line the server prints once it serves: its "try:" command must connect as it is,
with the flags the server's security asks for."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from asr_client.cli import build_parser
from asr_server.cli import ready_banner
from asr_server.settings import Settings


def hint(banner: str) -> list[str]:
    """The arguments of the banner's ``try:`` command, after the program's name."""
    (line,) = [x for x in banner.splitlines() if x.strip().startswith("try:")]
    return shlex.split(line.split("try:", 1)[1].replace("[--ca CA.pem]", "--ca CA.pem"))[1:]


@pytest.mark.parametrize(
    ("security", "flags"),
    [
        ({}, []),
        ({"tls_cert": "c.pem", "tls_key": "k.pem"}, ["--tls", "--ca"]),
        (
            {"tls_cert": "c.pem", "tls_key": "k.pem", "tls_client_ca": "ca.pem"},
            ["--tls", "--ca", "--cert", "--key"],
        ),
        ({"auth_tokens": "tokens.txt"}, ["--token"]),
    ],
)
def test_the_hint_carries_the_flags_the_servers_security_asks_for(
    security: dict[str, str], flags: list[str]
) -> None:
    settings = Settings(host="127.0.0.1", **{k: Path(v) for k, v in security.items()})
    args = hint(ready_banner(settings, "tiny.en", 50051, 9464))
    assert [a for a in args if a.startswith("--") and a != "--server"] == flags
    parsed = build_parser().parse_args(args)  # the client takes it as printed
    assert parsed.server == "localhost:50051"
    if "--cert" in flags:  # mTLS: without a client certificate the handshake fails
        assert parsed.cert and parsed.key


@pytest.mark.parametrize(
    ("host", "grpc", "metrics"),
    [
        ("127.0.0.1", "localhost:50051", "http://localhost:9464/metrics"),
        ("::", "localhost:50051", "http://localhost:9464/metrics"),
        # bound to ::1 only: an IPv4 localhost finds nothing there
        ("::1", "[::1]:50051", "http://[::1]:9464/metrics"),
    ],
)
def test_the_addresses_printed_reach_what_the_server_bound(
    host: str, grpc: str, metrics: str
) -> None:
    banner = ready_banner(Settings(host=host, insecure=True), "tiny.en", 50051, 9464)
    assert f"metrics on {metrics}" in banner
    assert build_parser().parse_args(hint(banner)).server == grpc
