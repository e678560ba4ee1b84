"""A stream's lifetime: ``max_stream_duration_s`` holds in wall time too, so a stream that
sends KEEPALIVEs (or nothing) instead of audio cannot hold its seat past it, while a stream
sending audio at real time is still ended by the audio limit, or not at all."""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
import pytest

from asr_client import AsrClient, StreamClosedError, audio_config
from tests.helpers import eventually, sample, serve_fake, speech_pcm, status_of

pytestmark = pytest.mark.timeout(60)

LIMIT_S = 1.0
#: the wall-time limit's slack: config_timeout_s + streaming.max_buffered_audio_s
SLACK_S = 0.3 + 0.5


async def lifetime_server(make_server, **settings):  # type: ignore[no-untyped-def]
    settings.setdefault("config_timeout_s", 0.3)
    return await serve_fake(
        make_server,
        streaming={"max_stream_duration_s": LIMIT_S, "max_buffered_audio_s": 0.5},
        **settings,
    )


async def _keep_alive(stream) -> None:  # type: ignore[no-untyped-def]
    """KEEPALIVEs every 0.1 s, until the stream is closed."""
    with contextlib.suppress(StreamClosedError):
        while True:
            await stream.keep_alive()
            await asyncio.sleep(0.1)


async def test_keepalives_hold_a_stream_no_longer_than_the_limit(make_server) -> None:  # type: ignore[no-untyped-def]
    server = await lifetime_server(make_server, idle_timeout_s=0.5)
    async with AsrClient(f"127.0.0.1:{server.port}", retry=False, resume=None) as client:
        stream = await client.stream(audio_config()).open()
        await stream.send_audio(speech_pcm(0.2).tobytes())
        await eventually(lambda: server.servicer.admission.seated == 1)
        began = time.monotonic()
        pinger = asyncio.create_task(_keep_alive(stream))
        try:
            code, details = await asyncio.wait_for(status_of(stream), 10)
        finally:
            pinger.cancel()
            await asyncio.gather(pinger, return_exceptions=True)
        took = time.monotonic() - began
    assert code == grpc.StatusCode.OUT_OF_RANGE, details
    assert details == "stream exceeded the maximum duration of 1 s in wall time"
    assert LIMIT_S + SLACK_S - 0.3 < took < LIMIT_S + SLACK_S + 1.0
    await eventually(lambda: server.servicer.active == 0 and server.servicer.admission.seated == 0)


async def test_a_silent_stream_is_ended_by_a_timer(make_server) -> None:  # type: ignore[no-untyped-def]
    # nothing arrives after the config, and the idle timeout is far off
    server = await lifetime_server(make_server, idle_timeout_s=60)
    async with AsrClient(f"127.0.0.1:{server.port}", retry=False, resume=None) as client:
        stream = await client.stream(audio_config()).open()
        began = time.monotonic()
        code, details = await asyncio.wait_for(status_of(stream), 10)
        took = time.monotonic() - began
    assert code == grpc.StatusCode.OUT_OF_RANGE, details
    assert "in wall time" in details
    assert took < LIMIT_S + SLACK_S + 1.0
    await eventually(lambda: server.servicer.active == 0 and server.servicer.admission.seated == 0)


async def test_a_resumed_streams_earlier_part_counts(make_server) -> None:  # type: ignore[no-untyped-def]
    """A stream resumed 0.8 s in has 0.8 s less left: opened beside a new stream, it is
    ended that much sooner (compared in one run, so a loaded machine delays both)."""
    server = await lifetime_server(make_server, idle_timeout_s=60)
    resumed = audio_config()
    resumed.resume.stream_offset_s = 0.8
    resumed.resume.channels.add(next_utterance_id=3)

    async def ended_after(config) -> float:  # type: ignore[no-untyped-def]
        stream = await client.stream(config).open()
        began = time.monotonic()
        code, details = await asyncio.wait_for(status_of(stream), 10)
        assert code == grpc.StatusCode.OUT_OF_RANGE, details
        assert "in wall time" in details
        return time.monotonic() - began

    async with AsrClient(f"127.0.0.1:{server.port}", retry=False, resume=None) as client:
        fresh_took, resumed_took = await asyncio.gather(
            ended_after(audio_config()), ended_after(resumed)
        )
    assert fresh_took - resumed_took == pytest.approx(0.8, abs=0.3), (fresh_took, resumed_took)
    await eventually(lambda: server.servicer.active == 0)


async def test_a_real_time_stream_is_ended_by_its_audio_or_not_at_all(make_server) -> None:  # type: ignore[no-untyped-def]
    # the wall-time limit 2 s past the audio's (a longer config timeout): a loaded machine
    # that sends 0.9 s of audio in more than the usual 1.8 s must not be cut by it here
    server = await lifetime_server(make_server, config_timeout_s=2.0)
    chunk = bytes(3200)  # 0.1 s
    async with AsrClient(f"127.0.0.1:{server.port}", retry=False, resume=None) as client:
        # just under the limit, then half-closed: it ends as a stream does
        async with client.stream(audio_config()) as short:
            for _ in range(9):
                await short.send_audio(chunk)
                await asyncio.sleep(0.1)
            await short.end()
            assert await status_of(short) == (grpc.StatusCode.OK, "")

        # past it: the audio limit ends it, not the wall time
        long = await client.stream(audio_config()).open()
        with contextlib.suppress(StreamClosedError):
            for _ in range(30):
                await long.send_audio(chunk)
                await asyncio.sleep(0.1)
        code, details = await asyncio.wait_for(status_of(long), 10)
    assert code == grpc.StatusCode.OUT_OF_RANGE, details
    assert details == "stream exceeded the maximum duration of 1 s"
    await eventually(lambda: server.servicer.active == 0)


async def test_a_stream_still_open_at_the_drains_deadline_is_ended_with_a_reason(  # type: ignore[no-untyped-def]
    make_server, caplog
) -> None:
    """gRPC's stop cancelled it: counted as a stream its client had left (CANCELLED), not
    as an error, and its client was told only "Cancelling all calls"."""
    server = await serve_fake(make_server)
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        stream = client.stream(audio_config(), resume=None)  # (it does not move: it is cut)
        await stream.open()
        speech = speech_pcm(1.0)

        async def speak() -> None:  # on and on, never at an utterance boundary
            with contextlib.suppress(StreamClosedError):
                while True:
                    for start in range(0, speech.size, 1600):
                        await stream.send_audio(speech[start : start + 1600].tobytes())
                        await asyncio.sleep(0.05)

        speaker = asyncio.create_task(speak())
        await eventually(lambda: server.servicer.active == 1)
        drain = asyncio.create_task(server.drain_and_stop(1.5))
        told: list[tuple[float, float]] = []  # (GoingAway's deadline_s, when it came)
        with pytest.raises(StreamClosedError) as err:
            async for response in stream:
                if response.HasField("going_away"):
                    told.append((response.going_away.deadline_s, time.monotonic()))
        cut_at = time.monotonic()
        await speaker
        await drain
    # GoingAway said when the stream would be ended: then, not half a second later
    ((deadline_s, came),) = told
    assert deadline_s == pytest.approx(1.0, abs=0.05)
    assert cut_at - came == pytest.approx(deadline_s, abs=0.25)
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert "its drain of 1.5 s is over; resume the stream" in err.value.details
    assert sample(server, "asr_streams_total", code="UNAVAILABLE") == 1
    assert sample(server, "asr_streams_total", code="CANCELLED") == 0
    assert sample(server, "asr_stream_errors_total", code="UNAVAILABLE") == 1
    assert "drain deadline: ended 1 call(s) still open" in caplog.text
