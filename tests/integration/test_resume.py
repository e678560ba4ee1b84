"""Stream resume: a stream whose connection is cut again and again, or whose server drains,
goes on with the same finals, on the same clock, with utterance ids that never repeat.

Fake engine and tones here (exact and fast); tests/integration/test_resume_real.py does the
same with real speech and tiny.en, and tests/integration/test_proxies.py through nginx.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import socket
import threading
from collections.abc import Callable

import grpc
import numpy as np
import pytest

from asr_api.v1 import asr_pb2, asr_pb2_grpc
from asr_client import AsrClient, StreamClosedError, audio_config, stream_update
from asr_client.api import ADMITTED_HEADER, RecognitionStream
from asr_client.resume import (
    LISTEN_LEAD_S,
    FinalizeRequest,
    KeptAudio,
    OutageInfo,
    ResumeError,
    ResumeInfo,
    ResumePolicy,
    replay_plan,
)
from asr_server.engine.base import DecodeKind
from asr_server.engine.fake import FakeEngine
from tests.faultproxy import FaultProxy
from tests.helpers import (
    eventually,
    sample,
    serve_fake,
    silence,
    speech_pcm,
    stream_audio,
    to_pcm16,
    tone,
)
from tests.processes import free_port

pytestmark = pytest.mark.timeout(120)

RATE = 16_000
CHUNK = 1600  # 100 ms
RESUMED, NO_WORDS = asr_pb2.SpeechEvent.SPEECH_RESUMED, asr_pb2.SpeechEvent.NO_WORDS


def utterances(n: int, *, seconds: float = 1.0, gap: float = 0.9) -> np.ndarray:
    parts = [silence(0.5)]
    for _ in range(n):
        parts += [tone(seconds), silence(gap)]
    return (np.concatenate(parts) * 32767).astype("<i2")


async def run_stream(
    port: int,
    pcm: np.ndarray,
    *,
    speed: float | None,
    resume: ResumePolicy | None,
    channels: int = 1,
    on_resume=None,  # type: ignore[no-untyped-def]
    on_outage=None,  # type: ignore[no-untyped-def]
    during=None,  # type: ignore[no-untyped-def]
) -> list[asr_pb2.StreamingRecognizeResponse]:
    """Stream ``pcm`` (interleaved int16) at ``speed``× real time, running ``during()``
    beside it; every response."""
    side = asyncio.create_task(during()) if during else None
    try:
        received = await stream_audio(
            port,
            pcm.reshape(-1, channels),
            RATE,
            speed=speed,
            config=audio_config(channels=channels),
            resume=resume,
            on_resume=on_resume,
            on_outage=on_outage,
        )
    finally:
        if side is not None:
            side.cancel()
            await asyncio.gather(side, return_exceptions=True)
    return [r.response for r in received]


def finals(responses) -> list[tuple[int, str, float, float]]:  # type: ignore[no-untyped-def]
    return [
        (r.result.channel, r.result.text, round(r.result.start_s, 2), round(r.result.end_s, 2))
        for r in responses
        if r.HasField("result") and r.result.is_final
    ]


def utterance_ids_never_repeat(responses) -> None:  # type: ignore[no-untyped-def]
    """Per channel: a final's id is new, and every id is at least the one before it."""
    last: dict[int, int] = {}
    finalized: set[tuple[int, int]] = set()
    for r in responses:
        kind = r.WhichOneof("event")
        if kind not in ("result", "speech_event"):
            continue
        ev = getattr(r, kind)
        assert ev.utterance_id >= last.get(ev.channel, 0), (ev, last)
        last[ev.channel] = ev.utterance_id
        if kind == "result" and ev.is_final:
            key = (ev.channel, ev.utterance_id)
            assert key not in finalized, f"utterance {key} finalized twice"
            finalized.add(key)


async def test_a_stream_cut_ten_times_gives_the_uncut_finals(make_server) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server)
    pcm = utterances(10)
    reference = await run_stream(server.port, pcm, speed=None, resume=None)
    assert len(finals(reference)) == 10

    proxy = await FaultProxy(server.port).start()
    infos: list[ResumeInfo] = []
    rng = random.Random(7)
    duration = len(pcm) / RATE / 4  # streamed at 4x

    async def cut_at_random() -> None:
        for at in sorted(rng.uniform(0.2, duration - 0.2) for _ in range(10)):
            await asyncio.sleep(max(0.0, at - (asyncio.get_running_loop().time() - t0)))
            proxy.cut()

    t0 = asyncio.get_running_loop().time()
    try:
        cut = await run_stream(
            proxy.port,
            pcm,
            speed=4.0,
            resume=ResumePolicy(),
            on_resume=infos.append,
            during=cut_at_random,
        )
    finally:
        await proxy.close()
    assert proxy.cuts == 10
    assert len(infos) >= 8, infos  # a cut between two calls' lives may find nothing open
    assert finals(cut) == finals(reference)
    utterance_ids_never_repeat(cut)
    # the clock goes on: the closing progress accounts for the whole stream
    assert cut[-1].progress.audio_received_s == pytest.approx(len(pcm) / RATE)
    await asyncio.sleep(0)
    assert server.servicer.active == 0


async def test_a_cut_after_minutes_of_silence_resumes_with_little_to_replay(make_server) -> None:  # type: ignore[no-untyped-def]
    """In a silence no event comes, yet the settled point moves on: progress-only
    responses say so, and the client lets go of that audio. A cut after 125 s of it
    (on hold, a quiet microphone) used to find 120 s kept and nothing settled: the
    resume was refused ("more than 120 s of audio had no final")."""
    server = await serve_fake(make_server)
    parts = [silence(0.5), tone(1.0), silence(125.0), tone(1.0), silence(0.9)]
    pcm = (np.concatenate(parts) * 32767).astype("<i2")
    reference = await run_stream(server.port, pcm, speed=None, resume=None)
    assert len(finals(reference)) == 2
    # mid-stream, progress alone: every 5 s or so of settled silence
    alone = [r for r in reference[:-1] if r.WhichOneof("event") is None]
    assert len(alone) >= 20
    settled = [r.progress.settled_s for r in alone]
    assert settled == sorted(settled) and settled[-1] > 120

    proxy = await FaultProxy(server.port).start()
    infos: list[ResumeInfo] = []
    speed = 40.0

    async def cut_late_in_the_silence() -> None:
        await asyncio.sleep(126.0 / speed)
        proxy.cut()

    try:
        cut = await run_stream(
            proxy.port,
            pcm,
            speed=speed,
            resume=ResumePolicy(),
            on_resume=infos.append,
            during=cut_late_in_the_silence,
        )
    finally:
        await proxy.close()
    assert len(infos) == 1, infos
    assert infos[0].replayed_s < 10.0 + LISTEN_LEAD_S
    assert finals(cut) == finals(reference)


async def test_a_connection_that_goes_silent_without_a_reset_is_left_and_resumed(
    make_server, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """The far end vanishes without a reset (a host's power, a partition): nothing comes
    back and nothing fails, and a stream would wait forever. The client's HTTP/2 pings go
    unanswered, the call fails, and the stream resumes on a new connection (pinged every
    second here; every 30 s by default)."""
    import asr_client.api

    monkeypatch.setattr(asr_client.api, "KEEPALIVE_TIME_MS", 1_000)
    monkeypatch.setattr(asr_client.api, "KEEPALIVE_TIMEOUT_MS", 1_000)
    server = await serve_fake(make_server)
    pcm = utterances(6)
    reference = await run_stream(server.port, pcm, speed=None, resume=None)
    proxy = await FaultProxy(server.port).start()
    infos: list[ResumeInfo] = []

    async def vanish() -> None:
        await asyncio.sleep(1.0)
        assert proxy.black_hole() == 1

    try:
        moved = await asyncio.wait_for(
            run_stream(
                proxy.port,
                pcm,
                speed=4.0,
                resume=ResumePolicy(),
                on_resume=infos.append,
                during=vanish,
            ),
            20,
        )
    finally:
        await proxy.close()
    assert infos and "UNAVAILABLE" in infos[0].cause, infos
    assert proxy.connections >= 2
    assert finals(moved) == finals(reference)


async def test_stereo_channels_resume_each_from_its_own_last_final(make_server) -> None:  # type: ignore[no-untyped-def]
    """Channel 1 speaks while channel 0 has long been final: neither repeats a final."""
    server = await serve_fake(make_server)
    left = utterances(6, gap=1.1)
    right = np.concatenate([np.zeros(RATE * 3, "<i2"), utterances(4, gap=1.3)])
    right = np.pad(right, (0, max(0, len(left) - len(right))))[: len(left)]
    pcm = np.stack([left, right], axis=1).reshape(-1)
    reference = await run_stream(server.port, pcm, speed=None, resume=None, channels=2)
    proxy = await FaultProxy(server.port).start()

    async def cut_often() -> None:
        for _ in range(6):
            await asyncio.sleep(0.45)
            proxy.cut()

    try:
        cut = await run_stream(
            proxy.port,
            pcm,
            speed=4.0,
            resume=ResumePolicy(),
            channels=2,
            during=cut_often,
        )
    finally:
        await proxy.close()
    assert sorted(finals(cut)) == sorted(finals(reference))
    utterance_ids_never_repeat(cut)


async def test_draining_server_moves_the_stream_at_an_utterance_boundary(make_server) -> None:  # type: ignore[no-untyped-def]
    """GoingAway: the client moves to another replica between utterances; the old server
    sees its stream leave long before its drain deadline, and no final is lost."""
    first = await serve_fake(make_server)
    second = await serve_fake(make_server)
    pcm = utterances(8)
    reference = await run_stream(second.port, pcm, speed=None, resume=None)
    proxy = await FaultProxy(first.port).start()
    infos: list[ResumeInfo] = []
    outages: list[OutageInfo] = []

    async def drain_first() -> None:
        while first.servicer.active == 0:  # noqa: ASYNC110 - wait for the stream to start
            await asyncio.sleep(0.01)
        await asyncio.sleep(1.0)
        # in the middle of an utterance: the move must wait for its end
        await eventually(lambda: sample(first, "asr_speaking_channels") == 1, timeout_s=5)
        proxy.upstream_port = second.port  # the balancer sends new calls elsewhere
        await first.drain_and_stop(30.0)

    drained = asyncio.create_task(drain_first())
    try:
        moved = await run_stream(
            proxy.port,
            pcm,
            speed=4.0,
            resume=ResumePolicy(),
            on_resume=infos.append,
            on_outage=outages.append,
            during=None,
        )
        await asyncio.wait_for(drained, 10)  # the drain ended early: its stream left
    finally:
        await proxy.close()
    assert [i.cause for i in infos] == ["going away"]
    assert outages == []  # a planned move is no outage
    assert any(r.WhichOneof("event") == "going_away" for r in moved)
    assert finals(moved) == finals(reference)
    utterance_ids_never_repeat(moved)
    # every utterance begun ended with its own final, the one the drain came in too: a
    # move in the middle of it would have left its id without one, heard again anew
    started = {
        r.speech_event.utterance_id
        for r in moved
        if r.speech_event.type == asr_pb2.SpeechEvent.SPEECH_STARTED
    }
    assert started == {r.result.utterance_id for r in moved if r.result.is_final}, moved


async def test_a_stream_with_no_boundary_before_the_deadline_moves_a_second_before_it(
    make_server,
) -> None:  # type: ignore[no-untyped-def]
    """Interim results off and inside a long utterance, no response comes at which to
    move: the client moved only when the server cut it at its deadline, the drain
    waiting all that while. It now leaves a second before the deadline by itself."""
    first = await serve_fake(make_server)
    second = await serve_fake(make_server)
    pcm = utterances(2, seconds=6.0)
    config = audio_config(interim_results=False)
    reference = [
        r.response
        for r in await stream_audio(
            second.port, pcm.reshape(-1, 1), RATE, speed=None, config=config
        )
    ]
    proxy = await FaultProxy(first.port).start()
    infos: list[ResumeInfo] = []
    drain_s = 2.5
    took: list[float] = []

    async def drain_first() -> None:
        await eventually(lambda: sample(first, "asr_speaking_channels") == 1, timeout_s=10)
        proxy.upstream_port = second.port
        started = asyncio.get_running_loop().time()
        await first.drain_and_stop(drain_s)
        took.append(asyncio.get_running_loop().time() - started)

    drained = asyncio.create_task(drain_first())
    try:
        received = await stream_audio(
            proxy.port,
            pcm.reshape(-1, 1),
            RATE,
            speed=2.0,  # a 6 s utterance lasts 3 s: the move is due 1.5 s into it
            config=config,
            resume=ResumePolicy(),
            on_resume=infos.append,
        )
        moved = [r.response for r in received]
        await asyncio.wait_for(drained, 10)
    finally:
        await proxy.close()
    assert [i.cause for i in infos] == ["going away"]  # not the server's cut
    assert took[0] < drain_s - 0.5, took  # the stream left: the drain ended early
    assert finals(moved) == finals(reference)
    utterance_ids_never_repeat(moved)


async def test_a_stream_the_caller_has_ended_finishes_on_its_draining_server(make_server) -> None:  # type: ignore[no-untyped-def]
    """After end() nothing more is written: the call's last final comes from the draining
    server, within its deadline. The client moved such a stream at the final (its
    boundary) anyway, to a new call: from a last replica, to a server shutting down,
    and the caller, who had every final, waited give_up_after_s for an error."""
    gate = threading.Event()
    gate.set()
    engine = FakeEngine(gate=gate)
    server = await serve_fake(make_server, engine)
    pcm = utterances(1, seconds=3.0)
    reference = await run_stream(server.port, pcm, speed=None, resume=None)
    proxy = await FaultProxy(server.port).start()
    infos: list[ResumeInfo] = []
    received: list[asr_pb2.StreamingRecognizeResponse] = []
    drained: asyncio.Task[None] | None = None
    try:
        async with asyncio.timeout(30), AsrClient(f"127.0.0.1:{proxy.port}") as client:
            policy = ResumePolicy(give_up_after_s=2.0)
            async with client.stream(
                audio_config(), resume=policy, on_resume=infos.append
            ) as stream:

                async def read() -> None:
                    async for response in stream:
                        received.append(response)

                def drain_inside_the_utterance(sample: int) -> None:
                    nonlocal drained
                    if sample == 2 * RATE:  # 1.5 s into the 3 s utterance
                        gate.clear()  # its final waits
                        proxy.upstream_port = free_port()  # no replica to move to
                        drained = asyncio.create_task(server.drain_and_stop(30.0))

                reader = asyncio.create_task(read())
                await send_at_2x(stream, pcm, drain_inside_the_utterance)  # and end()
                await eventually(
                    lambda: any(r.WhichOneof("event") == "going_away" for r in received)
                )
                gate.set()
                await reader
            assert drained is not None
            await drained  # the drain ended early: its stream finished
    finally:
        gate.set()
        await proxy.close()
    assert infos == []
    assert len(finals(received)) == 1 and finals(received) == finals(reference)


async def test_a_stream_seated_after_the_drain_began_is_told_to_move_too(make_server) -> None:  # type: ignore[no-untyped-def]
    """A call admitted before the drain whose config arrives after it: GoingAway tells it
    how long is left, as the streams open at the drain were told."""
    server = await serve_fake(make_server)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = asr_pb2_grpc.RecognizerStub(channel).StreamingRecognize()
        first = asyncio.create_task(call.read())  # the call reaches the server: pending
        await eventually(lambda: server.servicer.admission.pending == 1)
        drained = asyncio.create_task(server.drain_and_stop(20.0))
        await eventually(lambda: server.servicer.draining)
        await asyncio.sleep(0.3)
        await call.write(asr_pb2.StreamingRecognizeRequest(config=audio_config()))
        await call.write(asr_pb2.StreamingRecognizeRequest(audio=bytes(3200)))
        response = await asyncio.wait_for(first, 10)
        assert response.WhichOneof("event") == "going_away"
        assert 0 < response.going_away.deadline_s < 20.0 - 0.2
        await call.done_writing()
        while await call.read() is not grpc.aio.EOF:  # the stream ends, and the drain
            pass
        assert await call.code() == grpc.StatusCode.OK
        await asyncio.wait_for(drained, 10)


def refused(server) -> float:  # type: ignore[no-untyped-def]
    return sample(server, "asr_refused_streams_total", reason="capacity") or 0.0


async def hold_the_only_seat(server) -> tuple[AsrClient, object]:  # type: ignore[no-untyped-def]
    """A stream opened directly on ``server`` (at --max-streams 1) that keeps its seat."""
    holder = AsrClient(f"127.0.0.1:{server.port}", retry=False, resume=None)
    stream = await holder.stream(audio_config()).open()
    await stream.send_audio(bytes(3200))
    await eventually(lambda: server.servicer.active == 1)
    return holder, stream


async def test_a_resume_refused_by_a_full_replica_waits_for_a_seat(make_server) -> None:  # type: ignore[no-untyped-def]
    """The stream's replica goes; the only other one is full for 1.5 s and refuses (trailers-
    only RESOURCE_EXHAUSTED) every new call; the stream goes on once a seat frees, as one
    resume, and nothing is lost."""
    first = await serve_fake(make_server)
    full = await serve_fake(make_server, max_streams=1)
    pcm = utterances(8)
    reference = await run_stream(first.port, pcm, speed=None, resume=None)
    proxy = await FaultProxy(first.port).start()
    holder, held = await hold_the_only_seat(full)
    infos: list[ResumeInfo] = []
    told: list[str] = []  # on_outage's causes, then "resumed"

    def outage(info: OutageInfo) -> None:
        assert info.started and info.give_up_after_s == 30.0
        told.append(info.cause)

    def resumed(info: ResumeInfo) -> None:
        infos.append(info)
        told.append("resumed")

    async def lose_the_replica() -> None:
        await eventually(lambda: first.servicer.active == 1)
        await asyncio.sleep(1.0)
        proxy.upstream_port = full.port
        proxy.cut()
        await eventually(lambda: refused(full) >= 2)
        await asyncio.sleep(1.0)
        held.cancel()  # a seat frees

    try:
        moved = await run_stream(
            proxy.port,
            pcm,
            speed=4.0,
            resume=ResumePolicy(),
            on_resume=resumed,
            on_outage=outage,
            during=lose_the_replica,
        )
    finally:
        await proxy.close()
        await holder.close()
    # told once as the call broke, not at each refused try, and before the resume
    assert len(told) == 2 and told[0].startswith("UNAVAILABLE"), told
    assert told[1] == "resumed"
    assert finals(moved) == finals(reference)
    utterance_ids_never_repeat(moved)
    assert len(infos) == 1, infos  # the refused tries are one outage, one resume
    assert infos[0].cause.startswith("UNAVAILABLE") and infos[0].outage_s > 1.0


async def test_a_first_call_refused_for_capacity_waits_for_a_seat_as_long_as_asked(
    make_server,
) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server, max_streams=1)
    pcm = utterances(2)
    reference = await run_stream(server.port, pcm, speed=None, resume=None)
    holder, held = await hold_the_only_seat(server)
    try:
        # seat_wait_s=0: the refusal at once, as the server said it
        with pytest.raises(StreamClosedError) as err:
            await run_stream(server.port, pcm, speed=None, resume=ResumePolicy(seat_wait_s=0))
        assert refused(server) == 1
        assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "limit of 1" in err.value.details
        assert not isinstance(err.value, ResumeError)
        # waiting up to 0.5 s for a seat that never frees: the same refusal, later
        started = asyncio.get_running_loop().time()
        with pytest.raises(StreamClosedError) as err:
            await run_stream(server.port, pcm, speed=None, resume=ResumePolicy(seat_wait_s=0.5))
        assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert asyncio.get_running_loop().time() - started > 0.5
        assert refused(server) > 2

        async def free_the_seat() -> None:
            await asyncio.sleep(1.0)
            held.cancel()

        infos: list[ResumeInfo] = []
        got = await run_stream(
            server.port,
            pcm,
            speed=None,
            resume=ResumePolicy(seat_wait_s=10),
            on_resume=infos.append,
            during=free_the_seat,
        )
    finally:
        await holder.close()
    assert finals(got) == finals(reference)
    assert infos == []  # getting a first seat is not a resume


async def test_without_retry_a_refusal_of_any_kind_fails_at_once(make_server) -> None:  # type: ignore[no-untyped-def]
    """retry=False (the load tool): a full replica's RESOURCE_EXHAUSTED and a draining one's
    UNAVAILABLE both reach the caller at once, as the server said them; with retry on, a
    draining replica's refusal is made again (elsewhere, through a proxy)."""
    full = await serve_fake(make_server, max_streams=1)
    draining = await serve_fake(make_server)
    holder, _held = await hold_the_only_seat(full)

    async def play(port: int, *, retry: bool) -> None:
        # refusals reach the caller at once; a stream that tries again waits for the
        # drain's end, which a loaded machine may take seconds to see
        async with AsrClient(f"127.0.0.1:{port}", retry=retry) as client:
            async with asyncio.timeout(20 if retry else 5), client.stream(audio_config()) as stream:
                await stream.send_audio(bytes(3200))
                await stream.end()
                async for _ in stream:
                    pass

    draining.servicer.draining = True
    try:
        with pytest.raises(StreamClosedError) as err:
            await play(full.port, retry=False)
        assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert not isinstance(err.value, ResumeError)
        with pytest.raises(StreamClosedError) as err:
            await play(draining.port, retry=False)
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
        assert "shutting down" in err.value.details
        assert not isinstance(err.value, ResumeError)
        assert sample(draining, "asr_refused_streams_total", reason="draining") == 1

        async def drain_ends() -> None:
            await eventually(
                lambda: (sample(draining, "asr_refused_streams_total", reason="draining") or 0) > 1
            )
            draining.servicer.draining = False

        ends = asyncio.create_task(drain_ends())
        await play(draining.port, retry=True)
        await ends
    finally:
        draining.servicer.draining = False
        await holder.close()


async def test_a_refusal_that_comes_before_the_config_is_written_is_retried(
    make_server, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """A draining or loading replica refuses a call as it arrives, before reading its
    config. A client slower than that (a busy loop) sees its write of the config fail,
    not its first read; the stream must still read the refusal and try again."""
    server = await serve_fake(make_server)
    pcm = utterances(2)
    reference = await run_stream(server.port, pcm, speed=None, resume=None)
    open_config = RecognitionStream.open
    opened: list[grpc.StatusCode] = []

    async def open_after_the_refusal(stream: RecognitionStream) -> RecognitionStream:
        if not opened:  # the first call: its write comes once the refusal has arrived
            opened.append(await stream._call.code())
            server.servicer.draining = False  # the next call finds a replica with room
        return await open_config(stream)

    monkeypatch.setattr(RecognitionStream, "open", open_after_the_refusal)
    server.servicer.draining = True
    try:
        got = await run_stream(server.port, pcm, speed=None, resume=ResumePolicy())
    finally:
        server.servicer.draining = False
    assert opened == [grpc.StatusCode.UNAVAILABLE]
    assert sample(server, "asr_refused_streams_total", reason="draining") == 1
    assert finals(got) == finals(reference)


async def test_a_resume_to_a_host_that_never_answers_gives_up_in_time(make_server) -> None:  # type: ignore[no-untyped-def]
    """A balancer that takes the connection and never answers: each new call waited out
    grpc's 20 s connect timeout before give_up_after_s was looked at (5 s gave up at 20)."""
    server = await serve_fake(make_server)
    proxy = await FaultProxy(server.port).start()
    silent = socket.socket()  # listens, never accepts: the kernel completes the handshake
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    pcm = utterances(6)
    try:
        async with AsrClient(f"127.0.0.1:{proxy.port}") as client:
            stream = await client.stream(
                audio_config(), resume=ResumePolicy(give_up_after_s=3, max_backoff_s=0.5)
            ).open()

            async def send() -> None:
                for i in range(0, len(pcm), CHUNK):
                    await stream.send_audio(pcm[i : i + CHUNK].tobytes())
                    await asyncio.sleep(0.05)
                await stream.end()

            sender = asyncio.create_task(send())
            loop = asyncio.get_running_loop()
            broke_at = None
            with pytest.raises(ResumeError) as err:
                async for response in stream:
                    if broke_at is None and response.HasField("result"):
                        proxy.upstream_port = silent.getsockname()[1]
                        proxy.cut()
                        broke_at = loop.time()
            gave_up_after = loop.time() - broke_at
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
    finally:
        silent.close()
        await proxy.close()
    assert "could not resume the stream within 3 s" in err.value.details
    assert gave_up_after < 3 + 0.5 + 1.5, gave_up_after  # its limit, one backoff; not 20 s


async def test_a_stream_to_a_server_that_is_not_there_fails_at_once() -> None:
    """No server answered, so there is no refusal to wait out: the first call fails in
    open(), not after give_up_after_s of tries (a bridge's caller waited 30 s)."""
    async with AsrClient(f"127.0.0.1:{free_port()}") as client:  # nothing listens there
        stream = client.stream(audio_config(), resume=ResumePolicy(give_up_after_s=30))
        async with asyncio.timeout(10):
            with pytest.raises(StreamClosedError) as err:
                await stream.open()
    assert err.value.code == grpc.StatusCode.UNAVAILABLE


async def test_a_recognize_refused_for_capacity_is_retried_whatever_its_length(make_server) -> None:  # type: ignore[no-untyped-def]
    """grpc core retries a call only while its request fits the per-RPC retry buffer (256 KiB
    by default: 8 s of 16 kHz audio); the client's holds any request it may send."""
    server = await serve_fake(make_server, max_streams=1)
    holder, held = await hold_the_only_seat(server)

    async def free_the_seat() -> None:
        await eventually(lambda: refused(server) >= 1)
        held.cancel()  # type: ignore[attr-defined]

    freeing = asyncio.create_task(free_the_seat())
    try:
        async with AsrClient(f"127.0.0.1:{server.port}") as client:
            reply = await client.recognize(bytes(30 * RATE * 2), audio_config())
        await freeing
    finally:
        freeing.cancel()
        await holder.close()
    assert reply.duration_s == pytest.approx(30.0)
    assert refused(server) >= 1


async def test_without_retry_a_refused_recognize_fails_at_once(make_server) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server, max_streams=1)
    holder, _held = await hold_the_only_seat(server)
    try:
        async with AsrClient(f"127.0.0.1:{server.port}", retry=False) as client:
            with pytest.raises(StreamClosedError) as err:
                await client.recognize(bytes(RATE * 2), audio_config())
    finally:
        await holder.close()
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refused(server) == 1


async def test_a_recognize_over_the_servers_message_limit_is_sent_once(make_server, caplog) -> None:  # type: ignore[no-untyped-def]
    """grpc answers a request over the server's limit with RESOURCE_EXHAUSTED, as a full
    server refuses, but with no pushback: grpc's retry policy sent it five times before
    the error came (every attempt a whole upload, each a call the server saw)."""
    import logging
    import re

    limit = 2 << 20
    server = await serve_fake(
        make_server, max_message_bytes=limit, streaming={"max_audio_message_bytes": 1 << 20}
    )
    with caplog.at_level(logging.INFO, logger="asr_server"):
        async with AsrClient(f"127.0.0.1:{server.port}") as client:
            with pytest.raises(StreamClosedError) as err:
                await client.recognize(bytes(2 * limit), audio_config())
        await eventually(lambda: server.servicer.active == 0)
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in err.value.details
    calls = [r for r in caplog.records if re.fullmatch(r"call \S+ finished", r.getMessage())]
    assert len(calls) == 1, [r.getMessage() for r in caplog.records]


async def test_refusals_without_end_give_up_in_bounded_time(make_server) -> None:  # type: ignore[no-untyped-def]
    """Every replica left refuses: the stream fails within give_up_after_s (plus one backoff),
    not after endless tries."""
    first = await serve_fake(make_server)
    full = await serve_fake(make_server, max_streams=1)
    proxy = await FaultProxy(first.port).start()
    holder, _held = await hold_the_only_seat(full)
    try:
        async with AsrClient(f"127.0.0.1:{proxy.port}") as client:
            stream = client.stream(
                audio_config(), resume=ResumePolicy(give_up_after_s=1.0, max_backoff_s=0.2)
            )
            async with stream:
                await stream.send_audio((tone(1.0) * 32767).astype("<i2").tobytes())
                events = stream.__aiter__()
                await anext(events)  # carried by the first replica
                proxy.upstream_port = full.port
                proxy.cut()
                broke = asyncio.get_running_loop().time()
                with pytest.raises(ResumeError) as err:
                    async for _ in events:
                        pass
                took = asyncio.get_running_loop().time() - broke
    finally:
        await proxy.close()
        await holder.close()
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "could not resume the stream within 1 s" in err.value.details
    assert 1.0 < took < 5.0, took
    assert refused(full) >= 3


async def test_errors_about_the_stream_itself_are_not_resumed(make_server) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server, idle_timeout_s=0.3)
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        stream = client.stream(audio_config(), resume=ResumePolicy())
        async with stream:
            with pytest.raises(StreamClosedError) as err:
                async for _ in stream:
                    pass
    assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert stream.resumes == 0  # type: ignore[attr-defined]


async def test_giving_up_is_a_clear_error(make_server) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server)
    proxy = await FaultProxy(server.port).start()
    async with AsrClient(f"127.0.0.1:{proxy.port}") as client:
        stream = client.stream(
            audio_config(), resume=ResumePolicy(give_up_after_s=0.5, max_backoff_s=0.1)
        )
        async with stream:
            await stream.send_audio((tone(1.0) * 32767).astype("<i2").tobytes())
            events = stream.__aiter__()
            await anext(events)  # a server took the stream (else it "could not start")
            await proxy.close()  # the only way there is gone for good
            with pytest.raises(ResumeError) as err:
                async for _ in events:
                    pass
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert "could not resume the stream within 0.5 s" in err.value.details


async def test_a_sender_faster_than_real_time_waits_out_an_outage(make_server) -> None:  # type: ignore[no-untyped-def]
    """A real-time source's audio is kept through an outage; one that sends faster waits,
    once it has sent what a real-time one could before the stream gives up, as it would
    for a server pushing back (before, the kept audio filled at its speed: 120 s and the
    stream failed, however short the outage)."""
    server = await serve_fake(make_server)
    proxy = await FaultProxy(server.port).start()
    policy = ResumePolicy(give_up_after_s=5.0, max_backoff_s=0.1)
    half_second = bytes(RATE)
    async with AsrClient(f"127.0.0.1:{proxy.port}") as client:
        async with client.stream(audio_config(), resume=policy) as stream:

            async def read_all() -> None:
                async for _ in stream:
                    pass

            reader = asyncio.create_task(read_all())
            await stream.send_audio(speech_pcm(0.5).tobytes())
            await eventually(lambda: stream._admitted)  # type: ignore[attr-defined]
            proxy.upstream_port = free_port()  # nobody there: the outage lasts
            proxy.cut()
            await eventually(lambda: stream._outage_since is not None)  # type: ignore[attr-defined]
            for _ in range(10):  # up to give_up_after_s of audio is taken at once
                await asyncio.wait_for(stream.send_audio(half_second), 1.0)
            held = asyncio.create_task(stream.send_audio(half_second))
            await asyncio.sleep(0.3)
            assert not held.done()
            proxy.upstream_port = server.port  # back: the new call takes the stream
            await asyncio.wait_for(held, 5.0)
            await stream.end()
            await asyncio.wait_for(reader, 10.0)
    await proxy.close()
    assert stream.resumes == 1


def test_kept_audio_is_trimmed_and_bounded() -> None:
    kept = KeptAudio(frame_bytes=2, sample_rate=10, max_frames=30)
    for _ in range(5):
        kept.append(bytes(20))  # 10 frames each
    kept.append_finalize(FinalizeRequest(channel=1))
    assert (kept.start, kept.end, kept.lost_until) == (20, 50, 20)  # bounded at 30 frames
    kept.trim(35)
    assert kept.start == 35
    finalize = FinalizeRequest(channel=1)
    assert [x if isinstance(x, FinalizeRequest) else len(x) for x in kept.replay()] == [
        10,
        20,
        finalize,
    ]
    kept.trim(50)
    assert kept.replay() == [finalize]  # a FINALIZE at the end stays for the replay
    with pytest.raises(ValueError, match="whole 2-byte frames"):
        kept.append(b"\0")


def test_a_replay_accounts_for_every_finalize_acknowledgement() -> None:
    every, left = FinalizeRequest(), FinalizeRequest(channel=0)
    audio = bytes(20)
    # all acknowledged, none kept: the replay is the audio, nothing skipped
    assert replay_plan([audio], [0, 0]) == ([audio], [0, 0], [0, 0])
    # the kept FINALIZE (both channels) was acknowledged on channel 0 only: channel 0's
    # second acknowledgement is not delivered; channel 1's first one is still to come
    assert replay_plan([every, audio], [0, 1]) == ([every, audio], [1, 0], [0, 0])
    # two FINALIZEs of channel 0 were trimmed (settled) before their acknowledgements
    # came: both are sent again first, where nothing is open, and their acknowledgements
    # are the new call's first two on channel 0
    plan = replay_plan([audio, left], [3, 0])
    assert plan == ([left, left, audio, left], [0, 0], [2, 0])


async def test_the_bridge_keeps_the_browser_through_a_broken_grpc_stream(  # type: ignore[no-untyped-def]
    make_server, make_bridge
) -> None:
    """The browser's WebSocket stays open while the bridge resumes its gRPC stream."""
    import json

    from websockets.asyncio.client import connect

    from tests.integration.test_bridge import events_until_close, ws_url

    server = await serve_fake(make_server)
    proxy = await FaultProxy(server.port).start()
    bridge = await make_bridge(proxy.port)
    pcm = utterances(4).tobytes()
    frame = 1600  # 50 ms
    try:
        async with connect(ws_url(bridge)) as ws:
            await ws.send(json.dumps({"type": "start", "sample_rate": RATE}))
            assert json.loads(await ws.recv())["type"] == "ready"
            for i in range(0, len(pcm), frame):
                await ws.send(pcm[i : i + frame])
                if i == frame * 60:  # 3 s in: in the second utterance
                    proxy.cut()
                await asyncio.sleep(0.0125)  # 4x real time
            await ws.send(json.dumps({"type": "stop"}))
            events = await events_until_close(ws)
            close_code = ws.close_code
    finally:
        await proxy.close()
    assert close_code == 1000
    kinds = [e["type"] for e in events if e["type"] in ("reconnecting", "resumed", "error")]
    assert kinds == ["reconnecting", "resumed"]
    assert next(e for e in events if e["type"] == "reconnecting")["cause"].startswith("UNAVAIL")
    assert [e["text"] for e in events if e["type"] == "final"] == ["w0 w1 w2 w3"] * 4


async def test_the_file_command_resumes_and_says_so(make_server, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    import json

    import soundfile

    from asr_client.cli import run

    server = await serve_fake(make_server)
    proxy = await FaultProxy(server.port).start()
    wav = tmp_path / "speech.wav"
    soundfile.write(wav, utterances(5), RATE, subtype="PCM_16")
    events = tmp_path / "events.jsonl"

    async def cut_twice() -> None:
        for _ in range(2):
            await asyncio.sleep(0.8)
            proxy.cut()

    cutter = asyncio.create_task(cut_twice())
    try:
        code = await run(
            ["file", str(wav), "--server", f"127.0.0.1:{proxy.port}", "--speed", "4"]
            + ["--json-out", str(events)]
        )
    finally:
        await cutter
        await proxy.close()
    out = capsys.readouterr()
    assert code == 0, out.err
    records = [json.loads(line) for line in events.read_text().splitlines()]
    assert [r["text"] for r in records if r["type"] == "final"] == ["w0 w1 w2 w3"] * 5
    assert [r["count"] for r in records if r["type"] == "resumed"] == [1, 2]
    told = [r["type"] for r in records if r["type"] in ("outage", "resumed")]
    assert told == ["outage", "resumed"] * 2  # as each break came, then as it was overcome
    assert out.err.count("connection lost (") == 2
    assert out.err.count("stream resumed (") == 2
    assert "the stream resumed 2 time(s)" in out.err

    # --no-resume: the break ends the command with the server's status
    proxy = await FaultProxy(server.port).start()
    cutter = asyncio.create_task(cut_twice())
    try:
        code = await run(
            ["file", str(wav), "--server", f"127.0.0.1:{proxy.port}", "--speed", "4", "--no-resume"]
        )
    finally:
        await cutter
        await proxy.close()
    assert code == 2
    assert "error: UNAVAILABLE" in capsys.readouterr().err


async def test_a_replay_cancelled_before_it_ran_frees_the_writer(make_server) -> None:  # type: ignore[no-untyped-def]
    """Two breaks in a row: the second resume cancels the first one's replay task before
    the loop ever ran it. The caller's next write must still go through."""
    server = await serve_fake(make_server)
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        stream = client.stream(audio_config(), resume=ResumePolicy())
        async with stream:
            await stream.send_audio(bytes(3200))
            resumable = stream  # type: ignore[assignment]
            cut = StreamClosedError(grpc.StatusCode.UNAVAILABLE, "Socket closed")
            await resumable._resume(cut)  # type: ignore[attr-defined]
            # as if the new call had been admitted and cut at once: no backoff, so the
            # first replay task has not run when the second resume cancels it
            resumable._outage_since = None  # type: ignore[attr-defined]
            await resumable._resume(cut)  # type: ignore[attr-defined]
            await asyncio.wait_for(stream.send_audio(bytes(3200)), 5)
            await stream.end()
            async for _ in stream:
                pass


async def test_an_acknowledgement_sent_again_says_where_its_finalize_first_came() -> None:
    """A FINALIZE whose acknowledgement a break cut off, after its results had settled, is
    sent again at the new call's start (replay_plan); the server acknowledges it there,
    but the caller is told where the FINALIZE first came. The calls are stood in for:
    such a break falls between two responses of one HTTP/2 stream."""
    async with AsrClient("127.0.0.1:1") as client:
        stream = client.stream(audio_config(), resume=ResumePolicy())
        # two FINALIZEs sent, at 1.25 and 2.5 s
        futures = [stream._finalizes.sent(None, came_at=t) for t in (1.25, 2.5)]  # type: ignore[attr-defined]
        plan = replay_plan([], [2])  # both trimmed, neither acknowledged
        stream._acks_resent = plan.acks_resent  # type: ignore[attr-defined]
        acks = [
            asr_pb2.StreamingRecognizeResponse(
                speech_event=asr_pb2.SpeechEvent(type=asr_pb2.SpeechEvent.FINALIZED, offset_s=9.0)
            )
            for _ in range(3)
        ]
        assert all(stream._observe(a) for a in acks)  # type: ignore[attr-defined]
        stream.cancel()
    # the third is none of the client's (a server bug): delivered as the server said
    assert [a.speech_event.offset_s for a in acks] == [1.25, 2.5, 9.0]
    # what finalize() returned says the same
    assert [f.result()[0].offset_s for f in futures] == [1.25, 2.5]


async def test_a_stream_keeps_its_last_final_while_a_server_would_carry_it() -> None:
    """The client keeps its last final's audio too, while the server could still carry it
    into the next final (short enough, and nothing settled past carry_gap_s after it),
    and a resume replays it and says where it lies."""
    async with AsrClient("127.0.0.1:1") as client:
        stream = client.stream(audio_config(), resume=ResumePolicy())
        kept = stream._kept  # type: ignore[attr-defined]
        kept.append(bytes(2 * RATE * 28))  # 28 s sent

        def observe(**fields: object) -> None:
            response = asr_pb2.StreamingRecognizeResponse(**fields)  # type: ignore[arg-type]
            stream._observe(response)  # type: ignore[attr-defined]

        final = asr_pb2.Result(is_final=True, text="one two", start_s=21.0, end_s=23.0)
        observe(result=final, progress=asr_pb2.Progress(settled_s=23.0))
        # the final's start, on the replay grid, and the listening lead before it
        assert kept.start == round((20.64 - LISTEN_LEAD_S) * RATE)
        config = stream._resume_config(20.64, 23.0, frozenset({0}))  # type: ignore[attr-defined]
        (channel,) = config.resume.channels
        assert (channel.previous_start_s, channel.previous_end_s) == (21.0, 23.0)
        assert (channel.final_until_s, channel.previous_text) == (23.0, "one two")
        # settled 2.5 s past its end: no next final would be carried after it
        observe(progress=asr_pb2.Progress(settled_s=25.5))
        assert kept.start == round((25.44 - LISTEN_LEAD_S) * RATE)
        stream.cancel()


async def test_a_resumed_stream_keeps_each_channels_language() -> None:
    """The client sends each channel's language (its last final's) in the resume; the
    server's channel starts with it kept, so detection does not start over."""
    from asr_server.audio.decode import AudioFormat, Encoding
    from asr_server.session.language import LanguageTracker
    from asr_server.settings import Settings
    from asr_server.transport.resume import resume_from_proto

    async with AsrClient("127.0.0.1:1") as client:
        stream = client.stream(audio_config(channels=2), resume=ResumePolicy())
        final = asr_pb2.Result(is_final=True, text="hola", language="es", channel=1, end_s=2.0)
        stream._observe(asr_pb2.StreamingRecognizeResponse(result=final))  # type: ignore[attr-defined]
        config = stream._resume_config(0.96)  # type: ignore[attr-defined]
        stream.cancel()
    assert [c.language for c in config.resume.channels] == ["", "es"]
    state = resume_from_proto(config, AudioFormat(Encoding.LINEAR16, RATE, 2), Settings())
    assert state is not None
    assert [c.language for c in state.channels] == ["", "es"]
    assert LanguageTracker(kept=state.channels[1].language).decode_language() == "es"


async def test_a_server_without_the_admission_header_still_resumes_and_says_so(  # type: ignore[no-untyped-def]
    make_server, monkeypatch
) -> None:
    """A rolling upgrade mixes versions: an older server sends no asr-stream-id header. The
    stream still resumes, counts it and tells on_resume, at the new call's first answer."""
    from asr_client.api import RecognitionStream

    async def never(self) -> bool:  # type: ignore[no-untyped-def]
        return False

    monkeypatch.setattr(RecognitionStream, "admitted", never)
    server = await serve_fake(make_server)
    pcm = utterances(4)
    reference = await run_stream(server.port, pcm, speed=None, resume=None)
    proxy = await FaultProxy(server.port).start()
    infos: list[ResumeInfo] = []

    async def cut_once() -> None:
        await eventually(lambda: server.servicer.active == 1)
        await asyncio.sleep(1.0)
        proxy.cut()

    try:
        got = await run_stream(
            proxy.port,
            pcm,
            speed=4.0,
            resume=ResumePolicy(),
            on_resume=infos.append,
            during=cut_once,
        )
    finally:
        await proxy.close()
    assert finals(got) == finals(reference)
    assert [i.count for i in infos] == [1] and infos[0].cause.startswith("UNAVAILABLE")


async def test_an_update_holds_across_a_resume(make_server) -> None:  # type: ignore[no-untyped-def]
    """Hotwords changed mid-stream are the stream's from then on, on the call it resumes
    on too: that call starts from the updated config."""
    engine = FakeEngine()
    server = await serve_fake(make_server, engine)
    proxy = await FaultProxy(server.port).start()
    one = speech_pcm(1.0).astype("<i2").tobytes()  # an utterance and its pause
    try:
        async with AsrClient(f"127.0.0.1:{proxy.port}") as client:
            stream = client.stream(audio_config(interim_results=False), resume=ResumePolicy())
            async with stream:
                await stream.send_audio(one)
                await stream.update(stream_update(hotwords=["Ishmael"], silence_ms=400))
                await stream.send_audio(one)
                await eventually(lambda: sum(len(c) for c in engine.calls) >= 2)
                proxy.cut()
                await stream.send_audio(one)
                await stream.end()
                received = [r async for r in stream]
    finally:
        await proxy.close()
    assert stream.resumes >= 1  # type: ignore[attr-defined]
    assert len(finals(received)) == 3
    prompts = [r.prompt for call in engine.calls for r in call if r.kind is DecodeKind.FINAL]
    assert "Ishmael" not in prompts[0]
    assert all("Ishmael" in p for p in prompts[1:]), prompts


async def test_each_finalize_is_acknowledged_once_across_a_resume(make_server) -> None:  # type: ignore[no-untyped-def]
    """A FINALIZE acknowledged just before a break is still among the kept audio (the
    settled point is before it), so the new call hears it again: the caller gets its
    FINALIZED once, and the next FINALIZE's on the new call."""
    server = await serve_fake(make_server)
    proxy = await FaultProxy(server.port).start()
    speech = (tone(1.0) * 32767).astype("<i2").tobytes()
    received: list[asr_pb2.StreamingRecognizeResponse] = []

    def acks() -> list[asr_pb2.SpeechEvent]:
        return [
            r.speech_event for r in received if r.speech_event.type == asr_pb2.SpeechEvent.FINALIZED
        ]

    try:
        async with AsrClient(f"127.0.0.1:{proxy.port}") as client:
            stream = client.stream(audio_config(interim_results=False), resume=ResumePolicy())
            async with stream:
                reader = asyncio.create_task(_collect(stream, received))
                await stream.send_audio(speech)
                (first,) = await asyncio.wait_for(await stream.finalize(), 10)
                proxy.cut()
                await stream.send_audio(speech)
                second = await stream.finalize()  # acknowledged on the new call
                await stream.end()
                await asyncio.wait_for(reader, 30)
    finally:
        await proxy.close()
    assert stream.resumes == 1  # type: ignore[attr-defined]
    assert [round(a.offset_s, 2) for a in acks()] == [1.0, 2.0]
    assert acks() == [first, *second.result()]  # each finalize()'s future has its own
    assert [(r.result.text, r.result.from_finalize) for r in received if r.result.is_final] == [
        ("w0 w1 w2 w3", True),
        ("w0 w1 w2 w3", True),
    ]


async def _collect(stream, into: list) -> None:  # type: ignore[no-untyped-def]
    async for response in stream:
        into.append(response)


async def _read_in_slices(stream, loops: list[int] | None = None) -> None:  # type: ignore[no-untyped-def]
    """Read under a 0.5 s timeout, loop after loop (a UI polling, an agent reading a turn
    at a time), until the stream ends or fails; each loop's number goes into ``loops``."""
    for loop in itertools.count(1):
        if loops is not None:
            loops.append(loop)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.5):
                async for _ in stream:
                    pass


class SilentHost:
    """A host that takes connections, reads them and never answers (a half-open
    balancer, a dropped SYN's other end)."""

    async def start(self) -> SilentHost:
        self._taken: list[asyncio.StreamWriter] = []
        self._server = await asyncio.start_server(self._never_answer, "127.0.0.1", 0)
        return self

    @property
    def port(self) -> int:
        return int(self._server.sockets[0].getsockname()[1])

    async def _never_answer(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._taken.append(writer)
        while await reader.read(65_536):
            pass

    async def close(self) -> None:
        self._server.close()
        for writer in self._taken:
            writer.transport.abort()
        await self._server.wait_closed()


async def _end_and_read_finals(stream) -> list[str]:  # type: ignore[no-untyped-def]
    """End the stream and read it to its end: its finals' texts."""
    await stream.end()
    received: list[asr_pb2.StreamingRecognizeResponse] = []
    await asyncio.wait_for(_collect(stream, received), 20)
    return [r.result.text for r in received if r.result.is_final]


async def test_a_cancelled_stream_stays_ended_even_in_the_middle_of_a_resume(make_server) -> None:  # type: ignore[no-untyped-def]
    """cancel() ends a resumable stream as it ends a plain one: its reader (another task)
    hears CANCELLED, writes after it raise, and a resume waiting to open a new call does
    not open one."""
    from tests.processes import free_port

    server = await serve_fake(make_server)
    proxy = await FaultProxy(server.port).start()
    client = AsrClient(f"127.0.0.1:{proxy.port}")
    try:
        calls = 0
        raw_stream = client._raw_stream

        def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal calls
            calls += 1
            return raw_stream(*args, **kwargs)

        client._raw_stream = counted  # type: ignore[method-assign]
        stream = client.stream(audio_config(), resume=ResumePolicy(initial_backoff_s=0.5))
        await stream.open()
        await stream.send_audio((tone(0.5) * 32767).astype("<i2").tobytes())

        async def read() -> StreamClosedError:
            with pytest.raises(StreamClosedError) as err:
                async for _ in stream:
                    pass
            return err.value

        reader = asyncio.create_task(read())
        await eventually(lambda: proxy.connections == 1)
        proxy.upstream_port = free_port()  # nobody there: every new call fails
        proxy.cut()
        await eventually(lambda: calls >= 3)  # resuming, between tries
        stream.cancel()
        ended = await asyncio.wait_for(reader, 10)
        assert ended.code == grpc.StatusCode.CANCELLED
        tries = calls
        await asyncio.sleep(1.5)  # past the backoff: no new call comes
        assert calls == tries
        with pytest.raises(StreamClosedError) as err:
            await stream.send_audio(bytes(3200))
        assert err.value.code == grpc.StatusCode.CANCELLED
    finally:
        await client.close()
        await proxy.close()


@pytest.mark.parametrize("semantic", [False, True])
async def test_an_utterance_the_break_left_without_its_final_is_withdrawn(
    make_server, semantic: bool
) -> None:  # type: ignore[no-untyped-def]
    """SPEECH_ENDED (and in SEMANTIC mode EndOfTurn) promise the utterance's final or
    NO_WORDS. A break after them, while the final is decoded, makes the new call hear
    the utterance again under a new id: the old id got nothing, and an agent told the
    turn ended heard it end twice, its first final never coming. The client withdraws
    the old id (SPEECH_RESUMED) before the new call's events; the TurnAssembler makes
    one turn of it."""
    from asr_client.turns import Turn, TurnAssembler
    from tests.integration.test_flux import serve_fake_sure_of

    gate = threading.Event()
    gate.set()
    engine = FakeEngine(gate=gate)
    server = await (
        serve_fake_sure_of(make_server, 0.99, engine)
        if semantic
        else serve_fake(make_server, engine)
    )
    proxy = await FaultProxy(server.port).start()
    pcm = utterances(2, gap=1.5)
    responses: list[asr_pb2.StreamingRecognizeResponse] = []
    mode = "semantic" if semantic else "silence"
    try:
        async with AsrClient(f"127.0.0.1:{proxy.port}") as client:
            config = audio_config(interim_results=False, endpointing=mode)  # type: ignore[arg-type]
            async with client.stream(config, resume=ResumePolicy()) as stream:

                def hold_the_first_final(sample: int) -> None:
                    if sample == int(1.5 * RATE):  # the first utterance's speech is sent:
                        gate.clear()  # its final waits

                sender = asyncio.create_task(send_at_2x(stream, pcm, hold_the_first_final))
                async for response in stream:
                    responses.append(response)
                    ended = (
                        response.HasField("end_of_turn")
                        if semantic
                        else response.speech_event.type == asr_pb2.SpeechEvent.SPEECH_ENDED
                    )
                    if ended and not gate.is_set():
                        proxy.cut()  # after the end of speech, before its final
                        gate.set()
                await sender
                assert stream.resumes == 1  # type: ignore[attr-defined]
    finally:
        gate.set()
        await proxy.close()
    events = [
        (kind, getattr(r, kind))
        for r in responses
        if (kind := r.WhichOneof("event")) in ("result", "speech_event", "end_of_turn")
    ]
    first = next(e.utterance_id for kind, e in events if kind in ("speech_event", "end_of_turn"))

    def answers_for(utterance_id: int) -> list[int]:  # its final, NO_WORDS or withdrawal
        return [
            i
            for i, (kind, e) in enumerate(events)
            if e.utterance_id == utterance_id
            and (
                (kind == "result" and e.is_final)
                or (kind == "speech_event" and e.type in (RESUMED, NO_WORDS))
            )
        ]

    (withdrawal,) = answers_for(first)
    kind, event = events[withdrawal]
    assert kind == "speech_event" and event.type == RESUMED, events
    assert min(e.utterance_id for _, e in events[withdrawal + 1 :]) > first, events
    texts = [e.text for kind, e in events if kind == "result" and e.is_final]
    assert texts == ["w0 w1 w2 w3"] * 2
    for utterance_id in {e.utterance_id for _, e in events} - {first}:
        assert len(answers_for(utterance_id)) == 1, events  # every other one: its final
    utterance_ids_never_repeat(responses)
    if semantic:  # an agent's turns: two, one per spoken utterance, each whole
        assembler = TurnAssembler()
        turns = [t for r in responses if isinstance(t := assembler.feed(r), Turn)]
        assert [t.text for t in turns] == ["w0 w1 w2 w3"] * 2, turns


async def send_at_2x(
    stream,  # type: ignore[no-untyped-def]
    pcm: np.ndarray,
    before_chunk: Callable[[int], None] | None = None,
) -> None:
    """``pcm`` in 50 ms messages at twice real time, then the end; ``before_chunk(i)``
    is told the first sample of each message before it is sent."""
    for i in range(0, len(pcm), CHUNK // 2):
        if before_chunk is not None:
            before_chunk(i)
        await stream.send_audio(pcm[i : i + CHUNK // 2].tobytes())
        await asyncio.sleep(0.025)
    await stream.end()


class ScriptedRecognizer(asr_pb2_grpc.RecognizerServicer):
    """Call i sends ``scripts[i]``'s responses, then breaks (UNAVAILABLE) or, the last,
    reads to the client's end: an order of events this server never makes."""

    def __init__(self, scripts: list[list[asr_pb2.StreamingRecognizeResponse]]) -> None:
        self.scripts = scripts
        self.calls = 0

    async def StreamingRecognize(self, request_iterator, context):  # type: ignore[no-untyped-def] # noqa: N802
        script = self.scripts[self.calls]
        self.calls += 1
        await context.read()  # the config
        await context.send_initial_metadata(((ADMITTED_HEADER, "1"),))
        for response in script:
            await context.write(response)
        if self.calls < len(self.scripts):
            await asyncio.sleep(0.05)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "scripted break")
        while await context.read() is not grpc.aio.EOF:
            pass


async def test_an_utterance_whose_final_came_before_its_end_is_never_withdrawn() -> None:
    """A server may send an utterance's final before its EndOfTurn or SPEECH_ENDED (the
    voice-agent guide allows it), and a resumed stream may send an EndOfTurn again: such
    an end owes nothing, and a later break must not withdraw its utterance."""
    SE = asr_pb2.SpeechEvent

    def event(kind: int, utterance: int) -> asr_pb2.StreamingRecognizeResponse:
        return asr_pb2.StreamingRecognizeResponse(
            speech_event=SE(type=kind, utterance_id=utterance)
        )

    def final(utterance: int, text: str) -> asr_pb2.StreamingRecognizeResponse:
        result = asr_pb2.Result(is_final=True, text=text, utterance_id=utterance)
        return asr_pb2.StreamingRecognizeResponse(result=result)

    def end_of_turn(utterance: int) -> asr_pb2.StreamingRecognizeResponse:
        return asr_pb2.StreamingRecognizeResponse(
            end_of_turn=asr_pb2.EndOfTurn(utterance_id=utterance, offset_s=1.0)
        )

    servicer = ScriptedRecognizer(
        [
            [event(SE.SPEECH_STARTED, 0), final(0, "hello"), end_of_turn(0)],
            [
                final(0, "hello"),
                event(SE.SPEECH_ENDED, 0),
                event(SE.SPEECH_STARTED, 1),
                event(SE.SPEECH_ENDED, 1),  # its final owed when the call breaks
            ],
            [final(2, "again")],
        ]
    )
    server = grpc.aio.server()
    asr_pb2_grpc.add_RecognizerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    got: list[asr_pb2.StreamingRecognizeResponse] = []
    try:
        async with AsrClient(f"127.0.0.1:{port}") as client:
            policy = ResumePolicy(initial_backoff_s=0.01)
            async with client.stream(audio_config(), resume=policy) as stream:

                async def send() -> None:
                    for _ in range(20):
                        await stream.send_audio(bytes(3200))
                        await asyncio.sleep(0.05)
                    await stream.end()

                sender = asyncio.create_task(send())
                got = [response async for response in stream]
                await sender
                assert stream.resumes == 2  # type: ignore[attr-defined]
    finally:
        await server.stop(None)
    withdrawn = [
        r.speech_event.utterance_id for r in got if r.speech_event.type == SE.SPEECH_RESUMED
    ]
    assert withdrawn == [1], got  # the one left owing its final; never 0
    assert [r.result.text for r in got if r.result.is_final][-1] == "again"


async def test_an_eager_result_the_break_left_open_is_withdrawn(make_server) -> None:  # type: ignore[no-untyped-def]
    """The proto promises each eager result exactly one of: its final, or SPEECH_RESUMED.
    A break between the two makes the new call hear that speech again under a new id, so
    the server can send neither for the old id: the client withdraws it, before the new
    call's events, and the utterance's final comes under the new id."""
    server = await serve_fake(make_server)
    proxy = await FaultProxy(server.port).start()
    pcm = utterances(2, gap=1.5)
    responses: list[asr_pb2.StreamingRecognizeResponse] = []
    try:
        async with AsrClient(f"127.0.0.1:{proxy.port}") as client:
            config = audio_config(interim_results=False, eager_finals=True)
            async with client.stream(config, resume=ResumePolicy()) as stream:
                sender = asyncio.create_task(send_at_2x(stream, pcm))
                async for response in stream:
                    responses.append(response)
                    if response.HasField("result") and response.result.eager:
                        if sum(r.HasField("result") and r.result.eager for r in responses) == 1:
                            proxy.cut()  # before the first eager result's final
                await sender
                assert stream.resumes == 1  # type: ignore[attr-defined]
    finally:
        await proxy.close()
    events = [
        (kind, getattr(r, kind))
        for r in responses
        if (kind := r.WhichOneof("event")) in ("result", "speech_event")
    ]
    eagers = [e for kind, e in events if kind == "result" and e.eager]
    first = eagers[0].utterance_id

    def withdraws(kind: str, e) -> bool:  # type: ignore[no-untyped-def]
        return kind == "speech_event" and e.type == asr_pb2.SpeechEvent.SPEECH_RESUMED

    answers = [
        i
        for i, (kind, e) in enumerate(events)
        if e.utterance_id == first and (withdraws(kind, e) or (kind == "result" and e.is_final))
    ]
    assert len(answers) == 1 and withdraws(*events[answers[0]]), events
    # ... before anything of the new call, which hears the utterance again
    later = [e.utterance_id for _, e in events[answers[0] + 1 :]]
    assert later and min(later) > first, events
    texts = [e.text for kind, e in events if kind == "result" and e.is_final]
    assert texts == ["w0 w1 w2 w3"] * 2
    utterance_ids_never_repeat(responses)


async def test_a_new_server_knows_the_client_finalizes_though_its_replay_holds_none(
    make_server,  # type: ignore[no-untyped-def]
) -> None:
    """A client that finalizes (a voice agent, at its own VAD's stop) has each final
    decoded early in a pause, 60 ms in; the server learns it from the first FINALIZE it
    hears. After a break whose replay begins past the client's last FINALIZE (here 12 s
    of quiet after it), the new server is told (ChannelResume.client_finalizes): the
    next final ends where the uncut stream's does, not 0.14 s later (a reviewer's 8 kHz
    read: every final after such a resume ended as on a stream that never finalized)."""
    server = await serve_fake(make_server)
    before = np.concatenate([silence(0.5), tone(1.0), silence(0.3)])  # FINALIZE at 1.8 s
    after = np.concatenate([silence(12.0), tone(1.0), silence(1.5)])  # the break at 1.8 + 11
    cut_after = int(11.0 * RATE)

    async def run(port: int, proxy: FaultProxy | None) -> list[asr_pb2.Result]:
        got: list[asr_pb2.Result] = []
        async with AsrClient(f"127.0.0.1:{port}") as client:
            stream = client.stream(audio_config(), resume=ResumePolicy())
            async with stream:

                async def send() -> None:
                    await stream.send_audio(to_pcm16(before).tobytes())
                    await stream.finalize()
                    for start in range(0, after.size, CHUNK):
                        if proxy is not None and start == cut_after:
                            proxy.cut()
                        await stream.send_audio(to_pcm16(after[start : start + CHUNK]).tobytes())
                        await asyncio.sleep(0.1 / 8)  # 8x real time
                    await stream.end()

                sender = asyncio.create_task(send())
                async for response in stream:
                    if response.HasField("result") and response.result.is_final:
                        got.append(response.result)
                await sender
        return got

    uncut = await run(server.port, None)
    proxy = await FaultProxy(server.port).start()
    try:
        cut = await run(proxy.port, proxy)
    finally:
        await proxy.close()
    assert proxy.connections >= 2  # it was cut, and resumed
    ends = [round(r.end_s, 2) for r in cut]
    assert ends == [round(r.end_s, 2) for r in uncut]
    # the second turn's final was decoded early in its pause, as the first FINALIZE asked
    assert ends[1] == pytest.approx(1.8 + 12.0 + 1.0 + 0.06, abs=0.035)


async def test_a_break_while_nobody_reads_is_resumed_by_the_next_reading(make_server) -> None:  # type: ignore[no-untyped-def]
    """A push-to-talk agent reads each turn to its final and leaves the loop, then sends
    the next turn before it reads again: a break in between ended the stream at that send
    (UNAVAILABLE), though nothing was lost. The writes are kept, and the next loop
    resumes the stream and reads the turn's final."""
    server = await serve_fake(make_server)
    proxy = await FaultProxy(server.port).start()
    speech = (tone(1.0) * 32767).astype("<i2").tobytes()

    async def the_turns_final(stream) -> str:  # type: ignore[no-untyped-def]
        async for response in stream:
            if response.result.is_final:
                return response.result.text  # type: ignore[no-any-return]
        raise AssertionError("the stream ended without a final")

    try:
        async with AsrClient(f"127.0.0.1:{proxy.port}") as client:
            stream = client.stream(audio_config(interim_results=False), resume=ResumePolicy())
            async with stream:
                await stream.send_audio(speech)
                await stream.finalize()
                assert await asyncio.wait_for(the_turns_final(stream), 10) == "w0 w1 w2 w3"
                proxy.cut()  # nobody reads now
                await asyncio.sleep(0.2)
                await stream.send_audio(speech)  # raised UNAVAILABLE
                second = await stream.finalize()
                received: list[asr_pb2.StreamingRecognizeResponse] = []
                reading = asyncio.create_task(_collect(stream, received))
                (event,) = await asyncio.wait_for(second, 20)
                assert event.type == asr_pb2.SpeechEvent.FINALIZED
                await stream.end()
                await asyncio.wait_for(reading, 10)
    finally:
        await proxy.close()
    assert stream.resumes == 1  # type: ignore[attr-defined]
    assert [r.result.text for r in received if r.result.is_final] == ["w0 w1 w2 w3"]


async def test_a_writer_whose_reader_was_cancelled_in_a_resume_does_not_wait_for_good(  # type: ignore[no-untyped-def]
    make_server,
) -> None:
    """A reading task cancelled in the middle of a resume (a wait_for around a turn's
    reading) left the outage open: a writer that had sent give_up_after_s of audio since
    the break then waited for a resume that only a reader makes. Its writes are kept for
    the next reading loop, which resumes the stream."""
    server = await serve_fake(make_server)
    proxy = await FaultProxy(server.port).start()
    speech = (tone(1.0) * 32767).astype("<i2").tobytes()
    second = bytes(32_000)  # 1 s of silence
    policy = ResumePolicy(give_up_after_s=3, initial_backoff_s=2, max_backoff_s=2)
    try:
        async with AsrClient(f"127.0.0.1:{proxy.port}") as client:
            stream = client.stream(audio_config(interim_results=False), resume=policy)
            async with stream:
                reading = asyncio.create_task(_collect(stream, []))
                proxy.upstream_port = free_port()  # nothing there: the resume backs off
                proxy.cut()
                await asyncio.sleep(0.5)
                reading.cancel()
                await asyncio.gather(reading, return_exceptions=True)
                proxy.upstream_port = server.port
                for _ in range(5):  # more than give_up_after_s
                    await asyncio.wait_for(stream.send_audio(second), 5)
                await stream.send_audio(speech)
                finals = await _end_and_read_finals(stream)
    finally:
        await proxy.close()
    assert finals == ["w0 w1 w2 w3"]


async def test_writes_past_the_kept_audio_while_nobody_reads_fail_at_once(make_server) -> None:  # type: ignore[no-untyped-def]
    """A break while no loop reads keeps the writes for the next reading loop, up to
    max_kept_s: past it they were taken without a word (300 s of them, in a reviewer's
    run), and the stream failed only when a loop read again."""
    server = await serve_fake(make_server)
    proxy = await FaultProxy(server.port).start()
    speech = (tone(1.0) * 32767).astype("<i2").tobytes()
    second = bytes(32_000)
    try:
        async with AsrClient(f"127.0.0.1:{proxy.port}") as client:
            stream = client.stream(
                audio_config(interim_results=False), resume=ResumePolicy(max_kept_s=5)
            )
            async with stream:
                await stream.send_audio(speech)
                await stream.finalize()
                async for response in stream:  # read to the turn's final, and leave
                    if response.result.is_final:
                        break
                proxy.cut()
                await asyncio.sleep(0.2)
                with pytest.raises(ResumeError, match="more than 5 s of audio was sent") as err:
                    for _ in range(10):
                        await stream.send_audio(second)
                assert stream._kept.end - stream._kept.lost_until <= 5 * 16_000  # type: ignore[attr-defined]
                with pytest.raises(ResumeError):  # and it stays ended
                    await stream.send_audio(second)
    finally:
        await proxy.close()
    assert err.value.code == grpc.StatusCode.UNAVAILABLE


async def test_a_writer_held_back_when_its_reader_is_cancelled_goes_on(make_server) -> None:  # type: ignore[no-untyped-def]
    """A fast writer held back in an outage (it had sent give_up_after_s since the break)
    waited for good when the reading task was cancelled: only a reader resumes. It goes
    on now, its writes kept for the next reading loop."""
    server = await serve_fake(make_server)
    proxy = await FaultProxy(server.port).start()
    second = bytes(32_000)
    policy = ResumePolicy(give_up_after_s=3, initial_backoff_s=2, max_backoff_s=2)
    try:
        async with AsrClient(f"127.0.0.1:{proxy.port}") as client:
            stream = client.stream(audio_config(interim_results=False), resume=policy)
            async with stream:
                reading = asyncio.create_task(_collect(stream, []))
                await asyncio.sleep(0.2)
                proxy.upstream_port = free_port()  # nothing there: the resume backs off
                proxy.cut()
                await asyncio.sleep(0.3)

                async def write() -> None:
                    for _ in range(6):
                        await stream.send_audio(second)

                writing = asyncio.create_task(write())
                await asyncio.sleep(1.0)
                assert not writing.done()  # held back at 3 s
                reading.cancel()
                await asyncio.gather(reading, return_exceptions=True)
                await asyncio.wait_for(writing, 5)
                proxy.upstream_port = server.port
                await stream.send_audio((tone(1.0) * 32767).astype("<i2").tobytes())
                finals = await _end_and_read_finals(stream)
    finally:
        await proxy.close()
    assert finals == ["w0 w1 w2 w3"]


async def test_a_writer_faster_than_the_reader_is_held_back_from_the_break(make_server) -> None:  # type: ignore[no-untyped-def]
    """The outage (and holding a fast writer back) began when the reader saw the break:
    a writer that never waits sent 130 s before the reader ran, and the stream failed
    ("more than 120 s of audio had no final") though the server was back at once."""
    server = await serve_fake(make_server)
    proxy = await FaultProxy(server.port).start()
    speech = (tone(1.0) * 32767).astype("<i2").tobytes()
    try:
        async with AsrClient(f"127.0.0.1:{proxy.port}") as client:
            stream = client.stream(audio_config(interim_results=False), resume=ResumePolicy())
            async with stream:
                received: list[asr_pb2.StreamingRecognizeResponse] = []
                reading = asyncio.create_task(_collect(stream, received))
                await stream.send_audio(speech)
                await stream.finalize()
                await asyncio.sleep(0.5)
                proxy.cut()
                for _ in range(130):  # (no wait_for: its task would let the reader run)
                    await stream.send_audio(bytes(32_000))
                await stream.send_audio(speech)
                await stream.end()
                await asyncio.wait_for(reading, 30)
    finally:
        await proxy.close()
    assert [r.result.text for r in received if r.result.is_final] == ["w0 w1 w2 w3"] * 2
    assert stream.resumes == 1  # type: ignore[attr-defined]


async def test_a_break_before_any_loop_reads_holds_no_writer_back(make_server) -> None:  # type: ignore[no-untyped-def]
    """A writer meeting a break before the stream's first reading loop (a file sent whole,
    then read) was held back after give_up_after_s of audio, waiting for a reader that
    only its own task would start: it waited for good. Its writes are kept, and the
    reading loop resumes."""
    server = await serve_fake(make_server)
    proxy = await FaultProxy(server.port).start()
    speech = (tone(1.0) * 32767).astype("<i2").tobytes()
    try:
        async with AsrClient(f"127.0.0.1:{proxy.port}") as client:
            stream = client.stream(audio_config(interim_results=False), resume=ResumePolicy())
            async with stream:
                await stream.send_audio(speech)
                await asyncio.sleep(0.3)
                proxy.cut()
                await asyncio.sleep(0.2)
                for _ in range(40):  # past give_up_after_s (30 s)
                    await asyncio.wait_for(stream.send_audio(bytes(32_000)), 5)
                await stream.send_audio(speech)
                finals = await _end_and_read_finals(stream)
    finally:
        await proxy.close()
    assert finals == ["w0 w1 w2 w3"] * 2
    assert stream.resumes == 1  # type: ignore[attr-defined]


async def test_a_push_to_talk_turn_sent_after_the_streams_own_move_is_kept(make_server) -> None:  # type: ignore[no-untyped-def]
    """A draining server: the stream cuts its call itself a second before the deadline to
    move (no boundary came to move at while nobody read). A push-to-talk agent's next turn,
    sent before it read again, met that cut (CANCELLED) and ended the stream as if its
    reading task had been cancelled. The turn is kept and the next loop moves the stream."""
    first = await serve_fake(make_server)
    second = await serve_fake(make_server)
    proxy = await FaultProxy(first.port).start()
    speech = (tone(1.0) * 32767).astype("<i2").tobytes()
    draining: asyncio.Task[None] | None = None
    try:
        async with AsrClient(f"127.0.0.1:{proxy.port}") as client:
            stream = client.stream(audio_config(interim_results=False), resume=ResumePolicy())
            async with stream:
                await stream.send_audio(speech)
                async for response in stream:
                    if response.speech_event.type == asr_pb2.SpeechEvent.SPEECH_STARTED:
                        proxy.upstream_port = second.port
                        draining = asyncio.create_task(first.drain_and_stop(4.0))
                    if response.HasField("going_away"):
                        await stream.finalize()
                    if response.result.is_final:
                        break
                await asyncio.sleep(3.5)  # past the stream's own cut, nobody reading
                await stream.send_audio(speech)  # raised CANCELLED
                await stream.finalize()
                finals = await _end_and_read_finals(stream)
    finally:
        await proxy.close()
        if draining is not None:
            await asyncio.gather(draining, return_exceptions=True)
    assert finals == ["w0 w1 w2 w3"]
    assert stream.resumes == 1  # type: ignore[attr-defined]


async def test_a_loop_begun_as_the_last_one_is_left_keeps_its_writer_held_back(make_server) -> None:  # type: ignore[no-untyped-def]
    """A reader that returns from its loop at each turn's final and loops again at once:
    asyncio closed the left loop a moment later, and its cleanup said nobody read while
    the new loop did. A fast writer in an outage was then never held back, and failed the
    stream (ResumeError, "more than 15 s … sent while its events were not read")."""
    server = await serve_fake(make_server)
    proxy = await FaultProxy(server.port).start()
    # (an outage of 2.6 s, well inside give_up_after_s, even for a loaded machine)
    policy = ResumePolicy(give_up_after_s=8, max_kept_s=15, max_backoff_s=0.2)
    turn = (np.concatenate([tone(1.0), silence(1.5)]) * 32767).astype("<i2").tobytes()
    finals: list[str] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        async with AsrClient(f"127.0.0.1:{proxy.port}") as client:
            stream = client.stream(audio_config(interim_results=False), resume=policy)
            async with stream:
                second_loop = asyncio.Event()

                async def until_final() -> None:
                    async for response in stream:
                        if response.result.is_final:
                            finals.append(response.result.text)
                            return

                async def read() -> None:
                    await until_final()
                    second_loop.set()
                    await until_final()

                reading = asyncio.create_task(read())
                tasks.append(reading)
                await stream.send_audio(turn)
                await asyncio.wait_for(second_loop.wait(), 10)
                await asyncio.sleep(0.3)
                proxy.upstream_port = free_port()
                proxy.cut()
                await asyncio.sleep(0.3)
                sent = 0

                async def write() -> None:
                    nonlocal sent
                    for _ in range(30):
                        await stream.send_audio(bytes(32_000))
                        sent += 1

                writing = asyncio.create_task(write())
                tasks.append(writing)
                await asyncio.sleep(2.0)
                assert not writing.done() and sent <= 9, sent  # held back at 8 s, not 15
                proxy.upstream_port = server.port
                await asyncio.wait_for(writing, 15)
                await stream.send_audio(turn)
                await asyncio.wait_for(reading, 20)
    finally:
        await proxy.close()
        for task in tasks:  # (a failed run's tasks: no error left unread for a later test)
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert finals == ["w0 w1 w2 w3"] * 2 and stream.resumes == 1  # type: ignore[attr-defined]


async def test_a_loop_after_one_left_in_an_outage_tries_before_it_gives_up(make_server) -> None:  # type: ignore[no-untyped-def]
    """A push-to-talk agent reads each turn under a timeout: a turn's read timed out inside
    a resume (the server was down), and the next loop, begun after give_up_after_s with
    the server back, failed at once ("could not resume the stream within 3 s") without
    trying. The time nobody read does not count: it resumes."""
    server = await serve_fake(make_server)
    proxy = await FaultProxy(server.port).start()
    policy = ResumePolicy(give_up_after_s=3, max_backoff_s=0.2)
    turn = (np.concatenate([tone(1.0), silence(1.5)]) * 32767).astype("<i2").tobytes()
    finals: list[str] = []

    async def read_a_turn() -> None:
        async for response in stream:
            if response.result.is_final:
                finals.append(response.result.text)
                return

    try:
        async with AsrClient(f"127.0.0.1:{proxy.port}") as client:
            stream = client.stream(audio_config(interim_results=False), resume=policy)
            async with stream:
                await stream.send_audio(turn)
                await asyncio.wait_for(read_a_turn(), 5)
                proxy.upstream_port = free_port()
                proxy.cut()
                await asyncio.sleep(0.3)
                await stream.send_audio(turn)
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(read_a_turn(), 1.5)
                proxy.upstream_port = server.port
                await asyncio.sleep(4.0)  # past give_up_after_s, nobody reading
                await stream.send_audio(turn)
                await asyncio.wait_for(read_a_turn(), 10)
                await asyncio.wait_for(read_a_turn(), 10)
    finally:
        await proxy.close()
    assert finals == ["w0 w1 w2 w3"] * 3 and stream.resumes == 1  # type: ignore[attr-defined]


async def test_an_outage_read_in_slices_still_gives_up(make_server) -> None:  # type: ignore[no-untyped-def]
    """A caller reading under a timeout, loop after loop (a UI polling, an agent reading a
    turn at a time): the give-up clock started again with each loop, and a stream whose
    server never came back tried for good. The time between loops is all that is not
    counted: it gives up after give_up_after_s of tries."""
    server = await serve_fake(make_server)
    proxy = await FaultProxy(server.port).start()
    policy = ResumePolicy(give_up_after_s=2, max_backoff_s=0.2)
    loops: list[int] = []
    try:
        async with AsrClient(f"127.0.0.1:{proxy.port}") as client:
            stream = client.stream(audio_config(interim_results=False), resume=policy)
            async with stream:
                await stream.send_audio(bytes(32_000))
                proxy.upstream_port = free_port()  # for good
                proxy.cut()
                with pytest.raises(ResumeError, match=r"within 2 s \(UNAVAILABLE"):
                    await asyncio.wait_for(_read_in_slices(stream, loops), 15)
    finally:
        await proxy.close()
    assert len(loops) >= 3  # (the loops were many; the clock was not theirs)


async def test_slices_of_reading_while_new_calls_hang_still_give_up(make_server) -> None:  # type: ignore[no-untyped-def]
    """New calls to a host that takes the connection and never answers, a caller reading
    in slices: each slice's timeout left the loop while the new call opened, the broken
    call stayed current, and the next loop took its old admission for a resume: the
    outage began again each loop (on_outage each time) and never gave up."""
    silent = await SilentHost().start()
    server = await serve_fake(make_server)
    proxy = await FaultProxy(server.port).start()
    outages: list[object] = []
    policy = ResumePolicy(give_up_after_s=2, max_backoff_s=0.2)
    turn = (np.concatenate([tone(1.0), silence(1.5)]) * 32767).astype("<i2").tobytes()
    try:
        async with AsrClient(f"127.0.0.1:{proxy.port}") as client:
            stream = client.stream(
                audio_config(interim_results=False), resume=policy, on_outage=outages.append
            )
            async with stream:
                await stream.send_audio(turn)
                async for response in stream:
                    if response.result.is_final:
                        break
                proxy.upstream_port = silent.port
                proxy.cut()

                with pytest.raises(ResumeError, match="could not resume the stream within 2 s"):
                    await asyncio.wait_for(_read_in_slices(stream), 15)
    finally:
        await proxy.close()
        await silent.close()
    assert len(outages) == 1 and stream.resumes == 0  # type: ignore[attr-defined]


async def test_a_move_off_a_draining_server_read_in_slices_keeps_trying(make_server) -> None:  # type: ignore[no-untyped-def]
    """A draining server's stream moves at a boundary; its new call hangs (a host that
    never answers) and the caller reads in slices: the loop left while the new call opened
    found the old call current, took its old admission for a seat, and read its cut
    (CANCELLED) as the stream's end at once. It keeps trying, and gives up in time."""
    silent = await SilentHost().start()
    server = await serve_fake(make_server)
    proxy = await FaultProxy(server.port).start()
    policy = ResumePolicy(give_up_after_s=2, max_backoff_s=0.2)
    turn = (np.concatenate([tone(1.0), silence(1.5)]) * 32767).astype("<i2").tobytes()
    draining: asyncio.Task[None] | None = None
    try:
        async with AsrClient(f"127.0.0.1:{proxy.port}") as client:
            stream = client.stream(audio_config(interim_results=False), resume=policy)
            async with stream:
                await stream.send_audio(turn)
                async for response in stream:
                    if response.result.is_final:
                        break
                proxy.upstream_port = silent.port
                draining = asyncio.create_task(server.drain_and_stop(5.0))

                with pytest.raises(ResumeError, match=r"within 2 s \(going away"):
                    await asyncio.wait_for(_read_in_slices(stream), 15)
    finally:
        await proxy.close()
        await silent.close()
        if draining is not None:
            await asyncio.gather(draining, return_exceptions=True)
