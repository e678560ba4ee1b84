"""Where the server listens: IPv6 addresses with or without brackets, as deploy/ suggests."""

from __future__ import annotations

import asyncio
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from asr_server.settings import listen_address
from tests.helpers import serve_fake, settings
from tests.processes import free_port


def test_listen_address_brackets_ipv6_only() -> None:
    assert listen_address("::", 50051) == "[::]:50051"
    assert listen_address("::1", 1) == "[::1]:1"
    assert listen_address("127.0.0.1", 2) == "127.0.0.1:2"
    assert listen_address("asr.internal", 3) == "asr.internal:3"
    assert settings(host="[::1]").host == settings(host=" ::1 ").host == "::1"


@pytest.mark.parametrize("host", ["::1", "[::1]"])
async def test_an_ipv6_host_serves_grpc_and_metrics(make_server, host: str) -> None:  # type: ignore[no-untyped-def]
    """Before, "::" and "::1" were joined to their port unbracketed, which gRPC cannot
    parse, and "[::]" reached the metrics server, which cannot resolve it: no IPv6 host
    could start."""
    server = await serve_fake(make_server, host=host, metrics_port=free_port())
    async with grpc.aio.insecure_channel(f"[::1]:{server.port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="asr.v1.Recognizer"), timeout=10
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    assert b"asr_active_streams" in await asyncio.to_thread(_get, server.metrics_port)


def _get(port: int) -> bytes:
    with urllib.request.urlopen(f"http://[::1]:{port}/metrics", timeout=10) as reply:
        return bytes(reply.read())


async def test_a_start_that_fails_on_the_health_port_frees_the_metrics_port() -> None:
    """The metrics HTTP server started first and stayed up, its port bound, in a process
    that embeds the server (the command exits anyway)."""
    import socket

    from asr_server.app import StartupError, start_server
    from asr_server.engine.fake import FakeEngine

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        metrics_port = free_port()
        wanted = settings(metrics_port=metrics_port, health_port=busy.getsockname()[1])
        with pytest.raises(StartupError, match="cannot listen"):
            await start_server(wanted, engine_factory=lambda _: FakeEngine())
    with socket.socket() as again:  # the port is free to bind
        again.bind(("127.0.0.1", metrics_port))


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("no.such.host.invalid", "cannot listen on no.such.host.invalid:{port}: no such address"),
        # TEST-NET-1 (RFC 5737): an address no machine here has
        ("192.0.2.7", "cannot listen on 192.0.2.7:{port}: 192.0.2.7 is not an address of this"),
        ("127.0.0.1", "cannot listen on 127.0.0.1:{port}: the port is in use"),
    ],
)
async def test_a_port_that_cannot_be_bound_says_why(host: str, why: str) -> None:
    """gRPC's error says only "Failed to bind"; every cause read "is the port in use?"."""
    import socket

    from asr_server.app import StartupError, start_server
    from asr_server.engine.fake import FakeEngine

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        wanted = settings(host=host, port=port, insecure=True)
        with pytest.raises(StartupError) as err:
            await start_server(wanted, engine_factory=lambda _: FakeEngine())
    assert str(err.value).startswith(why.format(port=port)), err.value


async def test_a_key_grpc_cannot_use_is_said_to_be_the_cause(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A secp256k1 (or Brainpool) key passes the OpenSSL check of the pair, but gRPC's
    BoringSSL refuses it and the bind fails: the server said "is the port in use?"."""
    from asr_server.app import start_server
    from asr_server.engine.fake import FakeEngine
    from asr_server.transport.tls import CertificateError
    from tests.pki import secp256k1_pair

    cert_path, key_path = secp256k1_pair(tmp_path)
    wanted = settings(host="127.0.0.1", port=0, tls_cert=cert_path, tls_key=key_path)
    with pytest.raises(CertificateError) as err:
        await start_server(wanted, engine_factory=lambda _: FakeEngine())
    assert f"gRPC cannot use the TLS certificate {cert_path} and key {key_path}" in str(
        err.value
    ), err.value
    assert "gRPC's TLS works with RSA, ECDSA P-256 and P-384 keys" in str(err.value)
