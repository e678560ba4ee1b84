"""What callers without credentials may do with gRPC health: Check, and nothing that holds
a call open; on the plaintext health port, Check only, with small messages."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.helpers import serve_fake
from tests.integration.test_security import token_file
from tests.processes import free_port

SERVICE = "asr.v1.Recognizer"


async def _check(channel: grpc.aio.Channel, **kwargs: object) -> grpc.StatusCode:
    try:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=SERVICE), timeout=10, **kwargs
        )
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    return grpc.StatusCode.OK


async def _watch(channel: grpc.aio.Channel, **kwargs: object) -> grpc.StatusCode:
    """The first answer of a Watch (OK), or the status it ended with."""
    call = health_pb2_grpc.HealthStub(channel).Watch(
        health_pb2.HealthCheckRequest(service=SERVICE), timeout=10, **kwargs
    )
    try:
        reply = await call.read()
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    finally:
        call.cancel()
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    return grpc.StatusCode.OK


async def test_watch_needs_a_token_where_check_does_not(make_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Each Watch is a call that never ends: without credentials thousands of them held the
    server's memory. Probes use Check, which stays open."""
    tokens_path, tokens = token_file(tmp_path, "ops")
    server = await serve_fake(make_server, auth_tokens=tokens_path)
    token = (("authorization", f"Bearer {tokens['ops']}"),)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        assert await _check(channel) == grpc.StatusCode.OK
        assert await _watch(channel) == grpc.StatusCode.UNAUTHENTICATED
        assert await _watch(channel, metadata=token) == grpc.StatusCode.OK


async def test_the_health_port_serves_check_only_with_small_messages(make_server) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server, health_port=free_port())
    assert server.health_port is not None
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.health_port}") as channel:
        assert await _check(channel) == grpc.StatusCode.OK
        assert await _watch(channel) == grpc.StatusCode.UNIMPLEMENTED
        # a request of 64 KiB (a service name is a few bytes) is refused before it is read
        big = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="x" * 65_536), timeout=10
        )
        try:
            await big
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        else:
            raise AssertionError("a 64 KiB health request was served")
