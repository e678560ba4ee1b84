"""What callers without credentials may do with gRPC health: Check, and nothing that holds
a call open; on the plaintext health port, Check only, with small messages."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from asr_server.transport import interceptors
from tests.helpers import sample, serve_fake
from tests.integration.test_security import token_file
from tests.processes import free_port

SERVICE = "asr.v1.Recognizer"
CHECK = "/grpc.health.v1.Health/Check"
WATCH = "/grpc.health.v1.Health/Watch"


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


async def _never() -> AsyncIterator[health_pb2.HealthCheckRequest]:
    """A request stream that sends nothing: the call's headers go out, its message never."""
    await asyncio.Event().wait()
    yield health_pb2.HealthCheckRequest()  # pragma: no cover


def _half_open(channel: grpc.aio.Channel, method: str, **kwargs: object) -> Any:
    """A call to ``method`` (a unary-request method) that never sends its request."""
    call = channel.stream_unary(
        method,
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )
    return call(_never(), timeout=10, **kwargs)


async def _ended(call: Any) -> tuple[grpc.StatusCode, str, float]:
    start = time.monotonic()
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or "", time.monotonic() - start
    raise AssertionError("a call without its request was answered")


async def test_a_check_that_never_sends_its_request_is_ended(make_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Check is open to anyone: held without its request, thousands of them took the
    server's memory, on both ports. Now it ends after REQUEST_TIMEOUT_S."""
    tokens_path, _ = token_file(tmp_path, "ops")
    server = await serve_fake(make_server, auth_tokens=tokens_path, health_port=free_port())
    for port in (server.port, server.health_port):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            code, details, took = await _ended(_half_open(channel, CHECK))
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED
            assert details == "no HealthCheckRequest within 1 s"
            assert took < 5
            assert await _check(channel) == grpc.StatusCode.OK
    # a tokenless Watch is refused before its request is waited for
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        code, _, took = await _ended(_half_open(channel, WATCH))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        assert took < 5


async def test_checks_held_open_are_capped_per_address(make_server, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(interceptors, "REQUEST_TIMEOUT_S", 30.0)
    monkeypatch.setattr(interceptors, "OPEN_CALLS_PER_PEER", 2)
    server = await serve_fake(make_server, health_port=free_port())
    for port in (server.port, server.health_port):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            held, refusal = await _hold(channel, 2)
            assert refusal.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert refusal.details() == (
                "127.0.0.1 has 2 health checks open, the limit: "
                "send each one's request, or retry later"
            )
            for call in held:
                call.cancel()
            for _ in range(100):  # the cancelled calls leave
                if await _check(channel) == grpc.StatusCode.OK:
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("Check was still refused")
    assert (sample(server, "asr_refused_streams_total", reason="open_call_limit") or 0) >= 1


async def test_checks_whose_answer_cannot_be_sent_stay_capped(make_server, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A client that never reads (HTTP/2 receive window 0) sends Check calls with their
    request: each answer waits for window forever, and the call stays open with its
    tasks. They counted only while their handler ran, so they piled up by the thousand
    with no credentials; now each counts until it has ended."""
    from tests.rapid_reset import unread_health_checks

    monkeypatch.setattr(interceptors, "OPEN_CALLS_PER_PEER", 5)
    server = await serve_fake(make_server)
    answered, open_calls = await asyncio.to_thread(
        unread_health_checks, server.port, 20, listen_s=2.0
    )
    assert (answered, open_calls) == (15, 5)  # the rest refused: a status has no body
    assert (sample(server, "asr_refused_streams_total", reason="open_call_limit") or 0) == 15
    # its connection gone, its calls have ended: the address may check again
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        for _ in range(100):
            if await _check(channel) == grpc.StatusCode.OK:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("Check was still refused")


async def _hold(channel: grpc.aio.Channel, n: int) -> tuple[list[Any], grpc.aio.AioRpcError]:
    """``n`` Checks held without their request, once all are in: a further Check is then
    refused, with this refusal."""
    held = [_half_open(channel, CHECK) for _ in range(n)]
    for _ in range(100):
        # a held call refused because a probe came in first is opened again
        held = [_half_open(channel, CHECK) if call.done() else call for call in held]
        try:
            await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=SERVICE), timeout=5
            )
        except grpc.aio.AioRpcError as exc:
            return held, exc
        await asyncio.sleep(0.05)
    raise AssertionError(f"{n} held Checks did not fill this address's share")


async def test_watch_and_reflection_calls_are_capped_per_client(make_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Watch and reflection streams last as long as the client likes: one token opened
    thousands of them, outside every limit."""
    tokens_path, tokens = token_file(tmp_path, "alice", "bob")
    server = await serve_fake(make_server, auth_tokens=tokens_path, max_streams_per_client=2)
    alice = (("authorization", f"Bearer {tokens['alice']}"),)
    bob = (("authorization", f"Bearer {tokens['bob']}"),)
    limit = interceptors.LASTING_CALLS_PER_CLIENT
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        watches = []
        for _ in range(limit - 1):
            watch = stub.Watch(health_pb2.HealthCheckRequest(service=SERVICE), metadata=alice)
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            watches.append(watch)
        listing = reflection_pb2.ServerReflectionRequest(list_services="")
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            metadata=alice
        )
        await reflection.write(listing)
        assert (await reflection.read()).list_services_response.service
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Watch(health_pb2.HealthCheckRequest(), metadata=alice).read()
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert err.value.details() == (
            f"client alice has {limit} health Watch or reflection calls open, the limit: "
            "close one first"
        )
        # another client is not affected, and a closed call frees its place
        assert await _watch(channel, metadata=bob) == grpc.StatusCode.OK
        await reflection.done_writing()
        while await reflection.read() != grpc.aio.EOF:
            pass
        assert await _watch(channel, metadata=alice) == grpc.StatusCode.OK
        for watch in watches:
            watch.cancel()
    assert sample(server, "asr_refused_streams_total", reason="lasting_call_limit") == 1


async def test_a_drain_ends_once_its_streams_have_left_though_watches_are_open(make_server) -> None:  # type: ignore[no-untyped-def]
    """gRPC's graceful stop waits for every call: a health Watch (any client with
    client-side health checking keeps one) or a reflection call held the drain for its
    whole time though no stream was left. They now see NOT_SERVING, and end once the
    streams have."""
    from asr_client import AsrClient, audio_config
    from tests.helpers import eventually, speech_pcm

    server = await serve_fake(make_server)
    async with (
        grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
        AsrClient(f"127.0.0.1:{server.port}", resume=None) as client,
    ):
        watch = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=SERVICE)
        )
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo()
        await reflection.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        assert (await reflection.read()).list_services_response.service
        stream = await client.stream(audio_config()).open()
        await stream.send_audio(speech_pcm(0.5).tobytes())
        # the call's start reaches the server's handler in its own time: a drain begun
        # before that refuses the stream instead of waiting for it
        await eventually(lambda: server.servicer.active == 1)
        drained = asyncio.create_task(server.drain_and_stop(60.0))
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert not drained.done()  # the stream is still there
        await stream.end()
        _ = [r async for r in stream]
        await asyncio.wait_for(drained, 10)  # not the drain's 60 s
        for call in (watch, reflection):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call.read()
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert err.value.details() == "the server is shutting down"
