"""The gRPC contract with a fake engine: statuses for bad input, limits, health, reflection,
disconnect cleanup and backpressure through real HTTP/2 flow control."""

from __future__ import annotations

import asyncio
import threading

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from asr_api.v1 import asr_pb2, asr_pb2_grpc
from asr_client import AsrClient, StreamClosedError, audio_config
from asr_client.api import delivered_status
from asr_server.engine.fake import FakeEngine
from tests.helpers import (
    entered,
    eventually,
    final_text,
    sample,
    serve_fake,
    silence,
    speech_pcm,
    stream_audio,
    tone,
)

pytestmark = pytest.mark.timeout(60)


async def raw_call(port: int, requests: list[asr_pb2.StreamingRecognizeRequest]) -> grpc.StatusCode:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = asr_pb2_grpc.RecognizerStub(channel).StreamingRecognize()
        # the server's status, as the client keeps it: a write in flight as the server
        # ends the call overwrites it with "Internal error from Core" (grpc/grpc#36066)
        delivered: list[tuple[grpc.StatusCode, str] | None] = []
        call.add_done_callback(lambda c: delivered.append(delivered_status(c)))
        for r in requests:
            try:
                await call.write(r)
            except (grpc.aio.AioRpcError, grpc.aio.UsageError):
                break
        try:
            await call.done_writing()
        except (grpc.aio.AioRpcError, grpc.aio.UsageError):
            pass
        try:
            async for _ in call:
                pass
        except grpc.aio.AioRpcError:
            pass
        code, details = await call.code(), await call.details()
        await asyncio.sleep(0)  # (the done callback's turn)
        if delivered and delivered[0] is not None:
            return delivered[0]  # type: ignore[return-value]
        return code, details  # type: ignore[return-value]


CONFIG = asr_pb2.StreamingRecognizeRequest(config=audio_config())
AUDIO = asr_pb2.StreamingRecognizeRequest(audio=bytes(3200))


@pytest.mark.parametrize(
    ("requests", "code", "phrase"),
    [
        ([], grpc.StatusCode.INVALID_ARGUMENT, "before a config"),
        ([AUDIO], grpc.StatusCode.FAILED_PRECONDITION, "first message must be a config"),
        ([CONFIG, AUDIO, CONFIG], grpc.StatusCode.FAILED_PRECONDITION, "already sent"),
        ([asr_pb2.StreamingRecognizeRequest()], grpc.StatusCode.FAILED_PRECONDITION, "config"),
        (
            [asr_pb2.StreamingRecognizeRequest(config=asr_pb2.StreamingConfig())],
            grpc.StatusCode.INVALID_ARGUMENT,
            "format",
        ),
        (
            [
                asr_pb2.StreamingRecognizeRequest(
                    config=asr_pb2.StreamingConfig(format=asr_pb2.AudioFormat(sample_rate_hz=16000))
                )
            ],
            grpc.StatusCode.INVALID_ARGUMENT,
            "encoding",
        ),
        (
            [asr_pb2.StreamingRecognizeRequest(config=audio_config(sample_rate_hz=4000))],
            grpc.StatusCode.INVALID_ARGUMENT,
            "sample_rate_hz",
        ),
        (
            [asr_pb2.StreamingRecognizeRequest(config=audio_config(channels=12))],
            grpc.StatusCode.INVALID_ARGUMENT,
            "channels",
        ),
        (
            [CONFIG, asr_pb2.StreamingRecognizeRequest(audio=bytes(3201))],
            grpc.StatusCode.INVALID_ARGUMENT,
            "whole number",
        ),
        (
            [asr_pb2.StreamingRecognizeRequest(config=audio_config(model="large-v3"))],
            grpc.StatusCode.INVALID_ARGUMENT,
            "not served",
        ),
        (
            [asr_pb2.StreamingRecognizeRequest(config=audio_config(language="de"))],
            grpc.StatusCode.INVALID_ARGUMENT,
            "language",
        ),
        (
            [asr_pb2.StreamingRecognizeRequest(config=audio_config(silence_ms=20))],
            grpc.StatusCode.INVALID_ARGUMENT,
            "silence_ms",
        ),
        (
            [CONFIG, asr_pb2.StreamingRecognizeRequest(control=asr_pb2.Control())],
            grpc.StatusCode.INVALID_ARGUMENT,
            "FINALIZE",
        ),
        (
            [CONFIG, asr_pb2.StreamingRecognizeRequest(audio=bytes(2 << 20))],
            grpc.StatusCode.INVALID_ARGUMENT,
            "exceeds the limit",
        ),
    ],
)
async def test_bad_input_gets_a_clear_status(make_server, requests, code, phrase) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server)
    got, details = await raw_call(server.port, requests)
    assert got == code, details
    assert phrase in details
    # the server is unharmed: a good stream still works
    received = await stream_audio(server.port, speech_pcm(), 16_000, speed=None)
    assert final_text(received) == "w0 w1 w2 w3"
    assert server.servicer.active == 0


async def test_message_over_the_grpc_limit_is_resource_exhausted(make_server) -> None:  # type: ignore[no-untyped-def]
    # (audio messages up to half the limit: the limit must hold the largest one allowed)
    server = await serve_fake(
        make_server, max_message_bytes=1 << 20, streaming={"max_audio_message_bytes": 512 << 10}
    )
    got, details = await raw_call(
        server.port, [CONFIG, asr_pb2.StreamingRecognizeRequest(audio=bytes(3 << 20))]
    )
    assert got == grpc.StatusCode.RESOURCE_EXHAUSTED, details


async def test_stream_limit_rejects_at_once_and_spares_open_streams(make_server) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server, max_streams=1)
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        async with client.stream(audio_config()) as first:
            await first.send_audio(speech_pcm().tobytes())
            await eventually(lambda: server.servicer.active >= 1)
            with pytest.raises(StreamClosedError) as err:
                async with client.stream(audio_config()) as second:
                    async for _ in second:
                        pass
            assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "limit of 1" in err.value.details
            await first.end()
            texts = [
                e.result.text async for e in first if e.HasField("result") and e.result.is_final
            ]
    assert texts == ["w0 w1 w2 w3"]
    # refused calls (the client tried again a few times) were not admitted: per-client
    # admissions count the one seated
    assert (sample(server, "asr_refused_streams_total", reason="capacity") or 0) >= 1
    assert sample(server, "asr_client_streams_total", client="anonymous") == 1


async def test_health_and_reflection(make_server) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "asr.v1.Recognizer"):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(channel)
        call = refl.ServerReflectionInfo()
        await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        reply = await call.read()
        await call.done_writing()
        names = {s.name for s in reply.list_services_response.service}
        assert "asr.v1.Recognizer" in names and "grpc.health.v1.Health" in names


async def test_health_is_not_serving_while_the_model_loads(make_server) -> None:  # type: ignore[no-untyped-def]
    from asr_server.app import start_server
    from tests.helpers import settings

    release = threading.Event()

    def slow_factory(_settings):  # type: ignore[no-untyped-def]
        release.wait(10)
        return FakeEngine()

    server = await start_server(settings(), engine_factory=slow_factory)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
            code, details = await raw_call(server.port, [CONFIG])
            assert code == grpc.StatusCode.UNAVAILABLE and "loading" in details
            release.set()
            await server.ready.wait()
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        release.set()
        await server.close()


async def test_engine_failure_is_internal_with_an_error_id(make_server) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server, FakeEngine(fail_with=RuntimeError("GPU fell off")))
    with pytest.raises(StreamClosedError) as err:
        await stream_audio(server.port, speech_pcm(), 16_000, speed=None)
    assert err.value.code == grpc.StatusCode.INTERNAL
    assert "error id" in err.value.details


async def test_recognize_unary_transcribes_everything(make_server) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server)
    # ten minutes of "speech" in 5 s turns with pauses: nothing may be truncated
    turn = np.concatenate([tone(5.0), silence(1.0)])
    audio = np.tile(turn, 100)
    pcm = (audio * 32767).astype("<i2").tobytes()
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        reply = await client.recognize(pcm, audio_config(interim_results=True))
    assert reply.duration_s == pytest.approx(600.0)
    assert len(reply.results) == 100
    assert all(r.is_final and r.text == " ".join(f"w{i}" for i in range(20)) for r in reply.results)
    assert reply.results[-1].end_s == pytest.approx(599.2, abs=0.3)


async def test_recognize_reports_times_on_a_resumes_stream_clock(make_server) -> None:  # type: ignore[no-untyped-def]
    # ResumeFrom: "every time the server reports has it added", in Recognize too
    server = await serve_fake(make_server)
    pcm = (np.concatenate([silence(0.5), tone(1.0), silence(1.0)]) * 32767).astype("<i2")
    config = audio_config()
    config.resume.stream_offset_s = 100.0
    config.resume.channels.add(next_utterance_id=7)
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        (result,) = (await client.recognize(pcm.tobytes(), config)).results
    assert result.utterance_id == 7
    assert result.start_s == pytest.approx(100.5, abs=0.35)


async def test_recognize_of_a_partial_frame_says_the_files_size(make_server) -> None:  # type: ignore[no-untyped-def]
    # 4 s of LINEAR16 and one byte more: the error names what was sent, not the size of
    # the server's last 1 s chunk of it
    server = await serve_fake(make_server)
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        with pytest.raises(StreamClosedError) as err:
            await client.recognize(bytes(128_001), audio_config())
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "audio of 128001 bytes is not a whole number of 2-byte frames" in err.value.details


async def test_a_ten_minute_stream_is_transcribed_whole(make_server) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server)
    turn = np.concatenate([tone(5.0), silence(1.0)])
    pcm = (np.tile(turn, 100) * 32767).astype(np.int16).reshape(-1, 1)
    received = await stream_audio(server.port, pcm, 16_000, speed=None, chunk_ms=250)
    results = [r.response.result for r in received if r.response.HasField("result")]
    finals = [r for r in results if r.is_final]
    assert len(finals) == 100
    assert [f.utterance_id for f in finals] == list(range(100))
    assert all(f.text == " ".join(f"w{i}" for i in range(20)) for f in finals)
    assert received[-1].response.progress.audio_received_s == pytest.approx(600.0)


async def test_disconnect_mid_stream_frees_everything(make_server) -> None:  # type: ignore[no-untyped-def]
    gate = threading.Event()
    engine = FakeEngine(gate=gate)
    stuck = entered(engine)
    server = await serve_fake(make_server, engine)
    tasks_before = {t.get_name() for t in asyncio.all_tasks()}
    try:
        async with AsrClient(f"127.0.0.1:{server.port}") as client:
            stream = await client.stream(audio_config()).open()
            await stream.send_audio(speech_pcm(2.0).tobytes())
            await stuck.wait()  # a decode is stuck inside the engine
            stream.cancel()
        await eventually(lambda: server.servicer.active == 0)
        assert server.metrics.active_streams._value.get() == 0
        leftover = {t.get_name() for t in asyncio.all_tasks()} - tasks_before
        assert not [n for n in leftover if n.startswith("s")], leftover
        assert server.metrics.buffered_audio._value.get() == 0.0
        # counted by its outcome (before, a cancelled stream was counted nowhere)
        assert sample(server, "asr_streams_total", code="CANCELLED") == 1
    finally:
        gate.set()
    # the engine slot is free again: the next stream completes
    received = await stream_audio(server.port, speech_pcm(), 16_000, speed=None)
    assert final_text(received) == "w0 w1 w2 w3"


async def test_backpressure_blocks_the_client_and_loses_nothing(make_server) -> None:  # type: ignore[no-untyped-def]
    gate = threading.Event()
    engine = FakeEngine(gate=gate)
    stalled = entered(engine)
    cap_s = 2.0
    server = await serve_fake(make_server, engine, streaming={"max_buffered_audio_s": cap_s})
    chunk = int(0.1 * 16_000) * 2  # 100 ms of 16 kHz PCM16
    audio = np.concatenate([tone(1.0), silence(1.0), tone(60.0), silence(1.0)])
    data = (audio * 32767).astype("<i2").tobytes()
    sent = 0
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        async with client.stream(audio_config(interim_results=False)) as stream:

            async def send() -> None:
                nonlocal sent
                for i in range(0, len(data), chunk):
                    await stream.send_audio(data[i : i + chunk])
                    sent += len(data[i : i + chunk])
                await stream.end()

            sender = asyncio.create_task(send())
            await stalled.wait()
            # the client's writes stop completing: no progress over a generous interval
            last = -1
            while sent != last:  # noqa: ASYNC110 - measuring that nothing happens
                last = sent
                await asyncio.sleep(0.5)
            blocked_at_s = sent / 32_000
            buffered = server.metrics.buffered_audio._value.get()
            assert not sender.done()
            # the engine stalled at ~2 s; the server holds at most the cap, and the client
            # got only as far as the cap plus what HTTP/2 and gRPC buffers hold in transit
            assert buffered <= cap_s + 0.1
            assert blocked_at_s < 2.0 + cap_s + 6.0, blocked_at_s
            gate.set()
            results = [e async for e in stream if e.HasField("result")]
            await sender
    assert sent == len(data)
    words = sum(len(r.result.text.split()) for r in results)
    assert words == pytest.approx(4 + 240, abs=len(results))
    assert results[-1].result.end_s == pytest.approx(62.2, abs=0.05)  # the speech end + pad
    print(f"client blocked after {blocked_at_s:.1f} s of audio (cap {cap_s} s)")


async def test_one_large_message_is_held_within_the_cap_too(make_server) -> None:  # type: ignore[no-untyped-def]
    """A message may hold far more audio than the cap (1 MiB of 8 kHz μ-law is 131 s): it
    is taken in pieces, so the server holds the cap's worth of it, not the whole."""
    gate = threading.Event()
    engine = FakeEngine(gate=gate)
    stalled = entered(engine)
    cap_s = 2.0
    server = await serve_fake(make_server, engine, streaming={"max_buffered_audio_s": cap_s})
    audio = np.concatenate([tone(1.0), silence(1.0), tone(20.0), silence(1.0)])
    data = (audio * 32767).astype("<i2").tobytes()  # 736 KB a message
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        async with client.stream(audio_config(interim_results=False)) as stream:

            async def send_twice() -> None:
                await stream.send_audio(data)
                await stream.send_audio(data)

            sender = asyncio.create_task(send_twice())
            try:
                await stalled.wait()
                await asyncio.sleep(0.5)  # the reader goes on as far as the cap lets it
                buffered = server.metrics.buffered_audio._value.get()
            finally:
                gate.set()
            assert buffered <= cap_s + 0.1
            await sender
            await stream.end()
            results = [e async for e in stream if e.HasField("result")]
    words = sum(len(r.result.text.split()) for r in results)
    assert words == pytest.approx(2 * (4 + 80), abs=len(results))


async def test_what_the_engine_cannot_do_is_refused_clearly(make_server) -> None:  # type: ignore[no-untyped-def]
    from asr_server.engine.base import EngineCapabilities

    engine = FakeEngine(capabilities=EngineCapabilities(word_timestamps=False))
    server = await serve_fake(make_server, engine)
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        for call in (
            lambda: client.recognize(bytes(3200), audio_config(word_timestamps=True)),
            lambda: stream_audio(
                server.port, speech_pcm(), 16_000, config=audio_config(word_timestamps=True)
            ),
        ):
            with pytest.raises(StreamClosedError) as err:
                await call()
            assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert "gives no word timestamps" in err.value.details


async def test_an_engine_the_pipeline_cannot_feed_keeps_the_server_not_serving() -> None:
    from asr_server.app import start_server
    from asr_server.engine.base import EngineCapabilities
    from asr_server.engine.factory import EngineConfigError
    from asr_server.metrics import Metrics
    from tests.helpers import settings

    engine = FakeEngine(capabilities=EngineCapabilities(sample_rate=8_000))
    server = await start_server(settings(), metrics=Metrics(), engine_factory=lambda s: engine)
    try:
        with pytest.raises(EngineConfigError, match="8000 Hz"):
            await server._loader  # type: ignore[misc]
        assert not server.ready.is_set()
        assert server.metrics.registry.get_sample_value("asr_model_loaded") == 0
    finally:
        await server.close()


async def test_a_stuck_engine_fails_its_streams_and_turns_health_not_serving(make_server) -> None:  # type: ignore[no-untyped-def]
    """An engine call that never returns (a wedged GPU) left its streams waiting with no
    error, and health said SERVING. Past engine.call_timeout_s the streams end INTERNAL,
    and health says NOT_SERVING, so that an orchestrator replaces the replica."""
    import dataclasses

    from asr_server.vad.energy import EnergyVoiceDetector
    from tests.helpers import fake_factory

    gate = threading.Event()  # never set until the end: the engine is stuck
    server = await make_server(fake_factory(FakeEngine(gate=gate)), engine={"call_timeout_s": 0.5})
    server.servicer.services = dataclasses.replace(
        server.servicer.services, vad_factory=EnergyVoiceDetector
    )
    try:
        async with AsrClient(f"127.0.0.1:{server.port}", resume=None) as client:
            with pytest.raises(StreamClosedError) as ended:
                async with client.stream(audio_config()) as stream:
                    await stream.send_audio(speech_pcm(1.0).tobytes())
                    await stream.end()
                    async for _ in stream:
                        pass
        assert ended.value.code == grpc.StatusCode.INTERNAL
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", "asr.v1.Recognizer"):
                reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
                assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert (sample(server, "asr_engine_timeouts_total") or 0) >= 1
    finally:
        gate.set()


async def test_a_client_that_cancels_before_its_config_is_counted_as_leaving(make_server) -> None:  # type: ignore[no-untyped-def]
    """The server's read ends alike when a client half-closes and when it cancels, and
    the call is sometimes marked cancelled only a moment later: 11 of 24 clients
    cancelling before their config (a gateway hanging up before the first audio) were
    counted and logged as INVALID_ARGUMENT, "stream closed before a config was sent"."""
    server = await serve_fake(make_server, FakeEngine())
    delays = (0.0, 0.02, 0.1, 0.3) * 4
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = asr_pb2_grpc.RecognizerStub(channel)
        for delay in delays:
            call = stub.StreamingRecognize()
            await eventually(lambda: server.servicer.active == 1)
            await asyncio.sleep(delay)
            call.cancel()
            await eventually(lambda: server.servicer.active == 0)
    assert sample(server, "asr_streams_total", code="CANCELLED") == len(delays)
    assert sample(server, "asr_streams_total", code="INVALID_ARGUMENT") == 0
    # a stream half-closed without a config is still the client's mistake
    code, details = await raw_call(server.port, [])
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "before a config" in details
    assert sample(server, "asr_streams_total", code="INVALID_ARGUMENT") == 1
