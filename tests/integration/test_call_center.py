"""Call-center scale with the fake engine over real gRPC: silent lines cost no engine time,
a burst of calls does not starve an earlier one, overload loses nothing and stays bounded."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from asr_api.v1 import asr_pb2
from asr_client import AsrClient, audio_config
from asr_server.audio.g711 import mulaw_encode
from asr_server.engine.fake import FakeEngine
from tests.helpers import entered, eventually, fake_factory, serve_fake, silence, tone

pytestmark = pytest.mark.timeout(120)


async def play(
    client: AsrClient,
    data: bytes,
    config: asr_pb2.StreamingConfig,
    *,
    chunk_bytes: int,
    pace_s: float = 0.0,
    sent: list[int] | None = None,
) -> list[tuple[float, asr_pb2.StreamingRecognizeResponse]]:
    """Send ``data`` in chunks (``pace_s`` apart) and return every response with its time."""
    out: list[tuple[float, asr_pb2.StreamingRecognizeResponse]] = []
    async with client.stream(config) as stream:

        async def send() -> None:
            for i in range(0, len(data), chunk_bytes):
                await stream.send_audio(data[i : i + chunk_bytes])
                if sent is not None:
                    sent.append(len(data[i : i + chunk_bytes]))
                if pace_s:
                    await asyncio.sleep(pace_s)
            await stream.end()

        sender = asyncio.create_task(send())
        async for response in stream:
            out.append((time.monotonic(), response))
        await sender
    return out


def results(responses, *, final: bool | None = None) -> list[asr_pb2.Result]:  # type: ignore[no-untyped-def]
    return [
        r.result
        for _, r in responses
        if r.HasField("result") and (final is None or r.result.is_final == final)
    ]


def pcm16(x: np.ndarray) -> bytes:
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


async def test_silent_lines_cost_no_engine_time(make_server) -> None:  # type: ignore[no-untyped-def]
    """Open 8 kHz mu-law calls with nobody talking: the real (webrtc) detector only, no
    engine call, no event but the closing progress, and everything accounted for."""
    engine = FakeEngine()
    server = await make_server(fake_factory(engine), max_streams=200)
    rng = np.random.default_rng(3)
    calls = 120
    seconds = 3.0
    # digital silence on half the lines, a faint line hiss (-50 dBFS) on the other half
    hiss = (rng.normal(0, 10 ** (-50 / 20), int(8000 * seconds)) * 32767).astype(np.int16)
    quiet = np.zeros(int(8000 * seconds), dtype=np.int16)
    config = audio_config(sample_rate_hz=8000, encoding="MULAW")
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        peak_speaking = 0

        async def watch() -> None:
            nonlocal peak_speaking
            while True:
                peak_speaking = max(peak_speaking, server.metrics.speaking_channels._value.get())
                await asyncio.sleep(0.01)

        watcher = asyncio.create_task(watch())
        everyone = await asyncio.gather(
            *(
                play(client, mulaw_encode(hiss if k % 2 else quiet), config, chunk_bytes=160)
                for k in range(calls)  # 20 ms frames, as telephony gateways send them
            )
        )
        watcher.cancel()
    assert engine.calls == []
    assert peak_speaking == 0
    for responses in everyone:
        assert [r.WhichOneof("event") for _, r in responses] == [None]  # the closing progress
        progress = responses[-1][1].progress
        assert progress.audio_received_s == pytest.approx(seconds)
        assert progress.audio_processed_s == pytest.approx(seconds)
    assert server.metrics.active_streams._value.get() == 0


async def test_a_burst_of_calls_does_not_starve_an_earlier_one(make_server) -> None:  # type: ignore[no-untyped-def]
    calls: list[float] = []  # when each engine call started

    def slow(requests) -> None:  # type: ignore[no-untyped-def]
        calls.append(time.monotonic())
        time.sleep(0.02)  # in the engine thread: 20 streams' partials take turns

    engine = FakeEngine(on_call=slow)
    server = await serve_fake(make_server, engine, max_streams=64)
    speech = pcm16(np.concatenate([tone(6.0), silence(1.0)]))
    chunk = 3200  # 100 ms
    config = audio_config()
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        first = asyncio.create_task(play(client, speech, config, chunk_bytes=chunk, pace_s=0.05))
        await eventually(lambda: server.metrics.speaking_channels._value.get() >= 1)
        burst_started = time.monotonic()
        burst = await asyncio.gather(
            *(play(client, speech, config, chunk_bytes=chunk, pace_s=0.05) for _ in range(20))
        )
        burst_ended = time.monotonic()
        early = await first
    during = [t for t, r in early if burst_started <= t <= burst_ended and r.HasField("result")]
    partial_times = [
        t
        for t, r in early
        if burst_started <= t <= burst_ended and r.HasField("result") and not r.result.is_final
    ]
    # the earlier call kept getting partials all through the burst, and its final
    assert len(partial_times) >= 3, partial_times
    # counted in engine calls, not seconds (a round's length is the machine's pace):
    # between two of its partials the engine served at most three rounds of the 21
    # streams (the first wait is about two: the burst's 20 first partials, then a round)
    edges = [burst_started, *partial_times]
    between = [sum(a <= c < b for c in calls) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    assert max(between) <= 3 * 21, between
    assert during and results(early, final=True)
    assert results(early, final=True)[0].text == " ".join(f"w{i}" for i in range(24))
    # and every call of the burst was served too
    for responses in burst:
        assert results(responses, final=False)
        assert [r.text for r in results(responses, final=True)] == [
            " ".join(f"w{i}" for i in range(24))
        ]


async def test_overload_loses_nothing_reports_lag_and_stays_bounded(make_server) -> None:  # type: ignore[no-untyped-def]
    """A stalled engine under 6 calls: the server holds at most the cap per call, the
    clients' sends wait, and once it resumes every second sent is transcribed, in order."""
    gate = threading.Event()

    def slow(requests) -> None:  # type: ignore[no-untyped-def]
        time.sleep(0.05)  # once it resumes, the engine is still slower than 6 fast senders

    engine = FakeEngine(gate=gate, on_call=slow)
    stalled = entered(engine)
    cap_s = 1.0
    server = await serve_fake(
        make_server, engine, streaming={"max_buffered_audio_s": cap_s}, max_streams=16
    )
    speech = pcm16(np.concatenate([np.tile(np.concatenate([tone(2.0), silence(1.0)]), 8)]))
    calls = 6
    sent: list[list[int]] = [[] for _ in range(calls)]
    config = audio_config(interim_results=False)
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        tasks = [
            asyncio.create_task(play(client, speech, config, chunk_bytes=3200, sent=sent[k]))
            for k in range(calls)
        ]
        await stalled.wait()
        last = -1
        while sum(map(sum, sent)) != last:  # noqa: ASYNC110 - waiting until nothing moves
            last = sum(map(sum, sent))
            await asyncio.sleep(0.5)
        buffered = server.metrics.buffered_audio._value.get()
        assert buffered <= calls * (cap_s + 0.1), buffered
        assert not any(t.done() for t in tasks)
        assert all(sum(s) < len(speech) for s in sent)  # every client is held back
        gate.set()
        everyone = await asyncio.gather(*tasks)
    for k, responses in enumerate(everyone):
        assert sum(sent[k]) == len(speech)
        finals = results(responses, final=True)
        assert [r.text for r in finals] == ["w0 w1 w2 w3 w4 w5 w6 w7"] * 8  # all, in order
        assert [r.start_s for r in finals] == sorted(r.start_s for r in finals)
        assert max(r.progress.lag_s for _, r in responses) > 0.3  # the lag was reported
        assert responses[-1][1].progress.audio_processed_s == pytest.approx(24.0)
    assert server.metrics.buffered_audio._value.get() == 0.0  # exactly: float steps left -5e-16
