"""The client's helpers for voice agents, end to end against the server.

``await stream.finalize()`` returns a future that is done when the turn's transcript is
complete (every channel the FINALIZE applies to has answered FINALIZED), and fails, never
hangs, when the stream ends first. ``TurnAssembler`` turns eager results and their
withdrawal into ``EagerTurn`` and ``TurnResumed`` (its turn logic: tests/unit/test_turns.py).
"""

from __future__ import annotations

import asyncio
import gc
import logging

import grpc
import numpy as np
import pytest

from asr_api.v1 import asr_pb2
from asr_client import (
    AsrClient,
    EagerTurn,
    StreamClosedError,
    TurnAssembler,
    TurnResumed,
    audio_config,
)
from tests.helpers import serve_fake, silence, tone

FINALIZED = asr_pb2.SpeechEvent.FINALIZED


@pytest.fixture(params=["resumable", "plain"])
def resume(request):  # type: ignore[no-untyped-def]
    """Each test runs on both kinds of stream: the default, which resumes after a break,
    and a plain call (``resume=None``); each tracks acknowledgements itself."""
    return "default" if request.param == "resumable" else None


def pcm(*channels: np.ndarray) -> bytes:
    """Interleaved 16-bit PCM of equally long float channels."""
    return (np.stack(channels, axis=1) * 32767).astype("<i2").tobytes()


async def read_into(stream, received: list) -> None:  # type: ignore[no-untyped-def]
    async for response in stream:
        received.append(response)


def finals(received: list[asr_pb2.StreamingRecognizeResponse]) -> list[tuple[int, str, bool]]:
    return [
        (r.result.channel, r.result.text, r.result.from_finalize)
        for r in received
        if r.result.is_final
    ]


async def test_awaiting_a_finalize_returns_once_the_turns_final_is_in(make_server, resume) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server)
    received: list[asr_pb2.StreamingRecognizeResponse] = []
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        async with client.stream(audio_config(interim_results=False), resume=resume) as stream:
            reader = asyncio.create_task(read_into(stream, received))
            await stream.send_audio(pcm(tone(1.0)))  # still speaking: nothing ended it
            ack = await stream.finalize()
            (event,) = await asyncio.wait_for(ack, 10)
            # done when the caller has been handed the acknowledgement, and with it the
            # final the FINALIZE made: nothing of the turn is still to come
            assert finals(received) == [(0, "w0 w1 w2 w3", True)]
            assert received[-1].speech_event == event
            assert event.type == FINALIZED and event.offset_s == pytest.approx(1.0)
            # a second turn: its own acknowledgement, not the first one's
            await stream.send_audio(pcm(tone(0.8)))
            (second,) = await asyncio.wait_for(await stream.finalize(), 10)
            assert second.offset_s == pytest.approx(1.8)
            assert len(finals(received)) == 2
            await stream.end()
            await asyncio.wait_for(reader, 10)


async def test_a_stereo_finalize_waits_for_every_channel_it_applies_to(make_server, resume) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server)
    received: list[asr_pb2.StreamingRecognizeResponse] = []
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        config = audio_config(channels=2, interim_results=False)
        async with client.stream(config, resume=resume) as stream:
            reader = asyncio.create_task(read_into(stream, received))
            # the agent (channel 0) listens while the customer (1) talks
            await stream.send_audio(pcm(silence(1.0), tone(1.0)))
            customer_only = await stream.finalize(channel=1)
            (event,) = await asyncio.wait_for(customer_only, 10)
            assert event.channel == 1
            assert finals(received) == [(1, "w0 w1 w2 w3", True)]

            await stream.send_audio(pcm(tone(1.0), tone(1.0)))
            both = await stream.finalize()
            events = await asyncio.wait_for(both, 10)
            assert [(e.type, e.channel) for e in events] == [(FINALIZED, 0), (FINALIZED, 1)]
            assert sorted(finals(received)[1:]) == [
                (0, "w0 w1 w2 w3", True),
                (1, "w0 w1 w2 w3", True),
            ]
            await stream.end()
            await asyncio.wait_for(reader, 10)


async def test_a_finalize_the_server_refuses_fails_with_its_status(make_server, resume) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server)
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        async with client.stream(audio_config(), resume=resume) as stream:
            reader = asyncio.create_task(read_into(stream, []))
            await stream.send_audio(pcm(tone(0.5)))
            ack = await stream.finalize(channel=3)  # a mono stream has no channel 3
            with pytest.raises(StreamClosedError) as failed:
                await asyncio.wait_for(ack, 10)
            assert failed.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert "channel" in failed.value.details
            with pytest.raises(StreamClosedError):
                await reader


async def test_an_unanswered_finalize_fails_when_the_stream_ends_or_is_left(  # type: ignore[no-untyped-def]
    make_server, resume, caplog
) -> None:
    server = await serve_fake(make_server)
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        # the caller stops reading before the acknowledgement: it can no longer come
        async with client.stream(audio_config(), resume=resume) as stream:
            await stream.send_audio(pcm(tone(0.5)))
            ack = await stream.finalize()
            async for _ in stream:
                break
            with pytest.raises(StreamClosedError, match="no longer read"):
                await asyncio.wait_for(ack, 10)

        # a cancelled stream: every acknowledgement still awaited fails, and one never
        # awaited is not reported as an unretrieved exception
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            async with client.stream(audio_config(), resume=resume) as stream:
                await stream.send_audio(pcm(tone(0.5)))
                awaited = await stream.finalize()
                await stream.finalize()  # its future dropped at once, as most callers do
                stream.cancel()
                with pytest.raises(StreamClosedError) as cancelled:
                    await awaited
                assert cancelled.value.code == grpc.StatusCode.CANCELLED
            del awaited
            gc.collect()
            await asyncio.sleep(0)
        assert "never retrieved" not in caplog.text


async def test_eager_turns_and_their_withdrawal_reach_the_assembler(make_server, resume) -> None:  # type: ignore[no-untyped-def]
    """End to end: the server's eager result at a pause is an EagerTurn, the caller going
    on withdraws it (TurnResumed), and the next pause's eager text is the final's."""
    server = await serve_fake(make_server)
    assembler = TurnAssembler(silence_endpointing=True)  # (the config's default endpointing)
    seen: list[object] = []
    received: list[asr_pb2.StreamingRecognizeResponse] = []
    # 2 s of speech, a 0.35 s pause (shorter than the 0.5 s endpoint), 1 s more, the end
    audio = np.concatenate([tone(2.0), silence(0.35), tone(1.0), silence(1.0)])
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        config = audio_config(eager_finals=True, interim_results=False)
        async with client.stream(config, resume=resume) as stream:
            reader = asyncio.create_task(read_into(stream, received))
            # 100 ms chunks in real time: the pause's early decode (at 0.2 s) is back
            # well before the speech resumes (at 0.35 s), as with a live caller
            for start in range(0, audio.size, 1600):
                await stream.send_audio(pcm(audio[start : start + 1600]))
                await asyncio.sleep(0.1)
            await stream.end()
            await asyncio.wait_for(reader, 20)
    for response in received:
        out = assembler.feed(response)
        if out is not None:
            seen.append(out)
    eager = [s for s in seen if isinstance(s, EagerTurn)]
    assert [type(s).__name__ for s in seen] == ["EagerTurn", "TurnResumed", "EagerTurn", "Turn"]
    # the turn, where the utterance ended: the eager text, confirmed
    assert seen[3].text == seen[2].text  # type: ignore[attr-defined]
    assert eager[0].text == " ".join(f"w{i}" for i in range(8))
    assert seen[1] == TurnResumed(0, eager[0].utterance_id)
    assert eager[1].text == finals(received)[0][1]  # the final is what it said it would be
    assert eager[1].confidence == pytest.approx(0.9)
