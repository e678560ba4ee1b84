"""The client library at the edges of a stream's life: after its end, leaving ``async
with`` on an error, a closed client, and options that cannot work. Each case once hung
for ever, ended tasks as cancelled, or raised a raw grpc or Python error."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import grpc
import pytest

from asr_api.v1 import asr_pb2
from asr_client import (
    AsrClient,
    ConnectionOptions,
    ResumePolicy,
    StreamClosedError,
    audio_config,
    stream_update,
)
from asr_client.api import ENDED
from asr_client.connection import ConnectionConfigError
from asr_server.engine.fake import FakeEngine
from tests.faultproxy import FaultProxy
from tests.helpers import serve_fake, speech_pcm
from tests.integration.test_security import token_file

pytestmark = pytest.mark.timeout(60)

RESUMES: list[Any] = ["default", None]
CANCELLED_CODE = grpc.StatusCode.CANCELLED


@pytest.mark.parametrize("resume", RESUMES)
async def test_writes_after_the_streams_end_raise(make_server, resume: Any) -> None:  # type: ignore[no-untyped-def]
    """A finalize after the end returned an acknowledgement that never came (the default,
    resuming stream), and its audio went nowhere without a word; until the stream's
    reading had ended, every write after the end did (the audio kept for a resume)."""
    server = await serve_fake(make_server)
    ended = (grpc.StatusCode.FAILED_PRECONDITION, ENDED)
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        async with client.stream(audio_config(), resume=resume) as stream:
            await stream.send_audio(speech_pcm(0.5).tobytes())
            await stream.end()
            # at once, while the last final is still to come
            for write in (
                lambda: stream.send_audio(speech_pcm(0.1).tobytes()),
                stream.keep_alive,
                stream.finalize,
                lambda: stream.update(stream_update(eager_finals=True)),
            ):
                with pytest.raises(StreamClosedError) as err:
                    await asyncio.wait_for(write(), 5)  # type: ignore[no-untyped-call]
                assert (err.value.code, err.value.details) == ended
            finals = [r.result.text async for r in stream if r.result.is_final]
            assert finals == ["w0 w1"]  # the audio before the end, and nothing after it
            await stream.end()  # again (a cleanup path): nothing to do, on either kind
            with pytest.raises(StreamClosedError) as err:
                await asyncio.wait_for(stream.finalize(), 5)
            assert (err.value.code, err.value.details) == ended
            with pytest.raises(StreamClosedError):
                await stream.send_audio(speech_pcm(0.1).tobytes())


@pytest.mark.parametrize("resume", RESUMES)
async def test_leaving_async_with_on_an_error_ends_the_streams_tasks_readably(  # type: ignore[no-untyped-def]
    make_server, resume: Any
) -> None:
    """Without resume, a sender waiting on backpressure and a reader ended with a bare
    CancelledError (as if they had been cancelled themselves), and a finalize's
    acknowledgement never resolved."""
    gate = threading.Event()  # a stalled engine: the server pushes back
    server = await serve_fake(
        make_server, FakeEngine(gate=gate), streaming={"max_buffered_audio_s": 0.5}
    )
    audio = speech_pcm(30.0).tobytes()
    try:
        async with AsrClient(f"127.0.0.1:{server.port}") as client:
            with pytest.raises(KeyError):
                async with client.stream(audio_config(), resume=resume) as stream:
                    await stream.send_audio(speech_pcm(1.0).tobytes())
                    ack = await stream.finalize()  # (its final waits on the stalled engine)

                    async def send() -> None:
                        for i in range(0, len(audio), 3_200):
                            await stream.send_audio(audio[i : i + 3_200])

                    async def read_all() -> None:
                        async for _ in stream:
                            pass

                    sender = asyncio.create_task(send())
                    reader = asyncio.create_task(read_all())
                    await asyncio.sleep(1.0)
                    assert not sender.done()  # waiting on the server
                    raise KeyError("the caller's own code failed")
            for task in (sender, reader, ack):
                with pytest.raises(StreamClosedError) as err:
                    await asyncio.wait_for(asyncio.shield(task), 5)
                assert err.value.code == grpc.StatusCode.CANCELLED
                assert not task.cancelled()
    finally:
        gate.set()


async def test_a_closed_client_says_so(make_server) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server)
    client = AsrClient(f"127.0.0.1:{server.port}")
    await client.close()
    for use in (
        lambda: client.stream(audio_config()),
        lambda: client.stream(audio_config(), resume=None),
    ):
        with pytest.raises(StreamClosedError, match="this AsrClient is closed"):
            use()
    with pytest.raises(StreamClosedError, match="this AsrClient is closed"):
        await client.recognize(speech_pcm(0.5).tobytes(), audio_config())


async def test_a_token_read_from_a_file_works_and_one_a_header_cannot_carry_is_refused(  # type: ignore[no-untyped-def]
    make_server, tmp_path
) -> None:
    """A token read from a file ends in a newline: grpc refused every call with
    "Invalid metadata" (a stream) or an unreadable ExecuteBatchError (Recognize)."""
    path, tokens = token_file(tmp_path, "app")
    server = await serve_fake(make_server, auth_tokens=path)
    options = ConnectionOptions(f"127.0.0.1:{server.port}", token=tokens["app"] + "\n")
    async with AsrClient(options) as client:
        response = await client.recognize(speech_pcm().tobytes(), audio_config())
    assert [r.text for r in response.results] == ["w0 w1 w2 w3"]
    with pytest.raises(ConnectionConfigError, match="a character a header cannot carry"):
        AsrClient(ConnectionOptions(f"127.0.0.1:{server.port}", token="s3c\nret"))


async def test_a_stream_with_no_sample_rate_gets_the_servers_answer(make_server) -> None:  # type: ignore[no-untyped-def]
    """``audio_config(sample_rate_hz=0)``: the resuming stream's bookkeeping divided by
    it (ZeroDivisionError at the first finalize); the server's refusal is the answer."""
    server = await serve_fake(make_server)
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        async with client.stream(audio_config(sample_rate_hz=0)) as stream:
            await stream.send_audio(speech_pcm(0.2).tobytes())
            await stream.finalize()
            with pytest.raises(StreamClosedError) as err:
                _ = [r async for r in stream]
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "sample_rate_hz 0" in err.value.details


# -- misuse a developer meets (the library reviewer's) ------------------------------------


async def read_all(stream: Any) -> list[str]:
    return [r.result.text async for r in stream if r.result.is_final]


@pytest.mark.parametrize("resume", RESUMES)
async def test_a_stream_whose_reading_task_was_cancelled_says_so_to_its_writers(  # type: ignore[no-untyped-def]
    make_server, resume: Any
) -> None:
    """grpc cancels a call whose read is cancelled. The default, resuming stream went on
    taking writes as if sent, 20 s of audio kept and dropped without a word (a broken call
    is resumed by its reader, and there was none), a finalize's acknowledgement never
    came."""
    server = await serve_fake(make_server)
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        async with client.stream(audio_config(), resume=resume) as stream:
            reading = asyncio.create_task(read_all(stream))
            await stream.send_audio(speech_pcm(0.5).tobytes())
            await asyncio.sleep(0.2)
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
            for write in (stream.finalize, lambda: stream.send_audio(bytes(3200))):
                with pytest.raises(StreamClosedError) as err:
                    await asyncio.wait_for(write(), 5)  # type: ignore[no-untyped-call]
                assert err.value.code == CANCELLED_CODE


@pytest.mark.parametrize("resume", RESUMES)
async def test_a_loop_after_a_reading_timeout_says_the_stream_ended(
    make_server, resume: Any
) -> None:  # type: ignore[no-untyped-def]
    """A read under a timeout that runs out cancels the stream's call (grpc's doing): the
    next loop got a bare CancelledError, in a task nobody had cancelled, on both kinds.
    It gets the stream's end, readably."""
    server = await serve_fake(make_server)
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        async with client.stream(audio_config(), resume=resume) as stream:
            await stream.send_audio(bytes(3200))
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):
                    await read_all(stream)
            with pytest.raises(StreamClosedError) as err:
                await asyncio.wait_for(read_all(stream), 5)
    assert err.value.code == CANCELLED_CODE
    assert "cancelled with a task reading or writing it" in err.value.details


@pytest.mark.parametrize("resume", RESUMES)
async def test_a_loop_left_and_a_later_one_read_on(make_server, resume: Any) -> None:  # type: ignore[no-untyped-def]
    """A helper that reads a stream up to its first final and returns, a reader task that
    reads on: leaving the first loop must not end the stream (a version of the fix above
    cancelled the resuming stream's call there, and failed every later FINALIZE's
    acknowledgement on both kinds, though the next loop read its answer)."""
    server = await serve_fake(make_server)
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        async with client.stream(audio_config(), resume=resume) as stream:
            await stream.send_audio(speech_pcm(0.5).tobytes() + bytes(32_000))

            async def first_final() -> str:
                async for response in stream:
                    if response.result.is_final:
                        return response.result.text
                raise AssertionError("no final")

            assert await asyncio.wait_for(first_final(), 10) == "w0 w1"
            await stream.send_audio(speech_pcm(0.5).tobytes())
            ack = await stream.finalize()
            reading = asyncio.create_task(read_all(stream))
            (event,) = await asyncio.wait_for(ack, 10)
            assert event.type == asr_pb2.SpeechEvent.FINALIZED
            await stream.end()
            assert await asyncio.wait_for(reading, 10) == ["w0 w1"]


@pytest.mark.parametrize("resume", RESUMES)
async def test_closing_the_client_ends_its_streams_readably(make_server, resume: Any) -> None:  # type: ignore[no-untyped-def]
    """The reader of a stream whose client was closed got a bare CancelledError (in a task
    nobody cancelled: asyncio.run then ended as if interrupted), and a resuming stream's
    writes went on returning."""
    server = await serve_fake(make_server)
    client = AsrClient(f"127.0.0.1:{server.port}")
    stream = await client.stream(audio_config(), resume=resume).open()
    reading = asyncio.create_task(read_all(stream))
    await stream.send_audio(speech_pcm(0.5).tobytes())
    await asyncio.sleep(0.2)
    await client.close()
    with pytest.raises(StreamClosedError) as err:
        await asyncio.wait_for(reading, 5)
    assert err.value.code == grpc.StatusCode.CANCELLED
    with pytest.raises(StreamClosedError):
        await stream.send_audio(speech_pcm(0.1).tobytes())


async def test_audio_and_keepalives_from_two_tasks_take_turns(make_server) -> None:  # type: ignore[no-untyped-def]
    """grpc takes one write at a time: audio from one task and keepalives from another
    broke the call ("Internal error from Core"), and its reader waited for ever."""
    server = await serve_fake(make_server)
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        async with client.stream(audio_config(), resume=None) as stream:
            reading = asyncio.create_task(read_all(stream))
            audio = speech_pcm(2.0).tobytes()

            async def send_audio() -> None:
                for start in range(0, len(audio), 640):  # 20 ms messages, unpaced
                    await stream.send_audio(audio[start : start + 640])

            async def keep_alive() -> None:
                for _ in range(200):
                    await stream.keep_alive()

            await asyncio.gather(send_audio(), keep_alive())
            await stream.end()
            assert await asyncio.wait_for(reading, 10) == ["w0 w1 w2 w3 w4 w5 w6 w7"]


@pytest.mark.parametrize("resume", RESUMES)
async def test_audio_that_is_not_bytes_is_a_type_error_that_says_what_to_send(  # type: ignore[no-untyped-def]
    make_server, resume: Any
) -> None:
    """A bytearray was refused by protobuf ("expected bytes, bytearray found") after a
    resuming stream had kept it for a replay, which then failed and stopped: audio lost
    after the next break. A numpy array said "truth value … is ambiguous"."""
    server = await serve_fake(make_server)
    proxy = await FaultProxy(server.port).start()
    pcm = speech_pcm(1.0)
    try:
        async with AsrClient(f"127.0.0.1:{proxy.port}") as client:
            async with client.stream(audio_config(), resume=resume) as stream:
                reading = asyncio.create_task(read_all(stream))
                for wrong in (bytearray(pcm.tobytes()), pcm, "audio"):
                    with pytest.raises(TypeError, match="send_audio takes bytes in the stream"):
                        await stream.send_audio(wrong)  # type: ignore[arg-type]
                await stream.send_audio(pcm.tobytes())
                if resume is not None:
                    proxy.cut()  # the replay holds the audio, and only it
                await stream.send_audio(pcm.tobytes())
                await stream.end()
                assert await asyncio.wait_for(reading, 10) == ["w0 w1 w2 w3"] * 2
    finally:
        await proxy.close()


async def test_closing_the_client_mid_outage_does_not_wait_out_the_backoff(  # type: ignore[no-untyped-def]
    make_server, monkeypatch
) -> None:
    """A resuming stream whose server is unreachable waits between attempts (full jitter
    up to ``max_backoff_s``); closing the client then left its reader asleep until the
    next attempt before it ended."""
    monkeypatch.setattr("asr_client.resume.random.uniform", lambda low, high: high)
    server = await serve_fake(make_server)
    proxy = await FaultProxy(server.port).start()
    policy = ResumePolicy(initial_backoff_s=30.0, max_backoff_s=30.0, give_up_after_s=120.0)
    client = AsrClient(f"127.0.0.1:{proxy.port}")
    stream = await client.stream(audio_config(), resume=policy).open()
    reading = asyncio.create_task(read_all(stream))
    await stream.send_audio(speech_pcm(0.5).tobytes())
    await asyncio.sleep(0.3)
    await proxy.close()  # the call breaks, and every new one is refused
    await asyncio.sleep(2.0)  # the first attempt failed: the reader waits out its backoff
    assert not reading.done()
    await client.close()
    with pytest.raises(StreamClosedError) as err:
        await asyncio.wait_for(reading, 5)
    assert err.value.code == grpc.StatusCode.CANCELLED


async def test_cancelling_while_a_new_call_waits_on_a_host_that_never_answers(  # type: ignore[no-untyped-def]
    make_server,
) -> None:
    """A resume opening its new call through a balancer that takes the connection and never
    answers: cancel() there left the reader waiting out grpc's connect timeout (18 s)."""
    server = await serve_fake(make_server)
    held: list[asyncio.StreamWriter] = []

    async def never_answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    silent = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    proxy = await FaultProxy(server.port).start()
    try:
        async with AsrClient(f"127.0.0.1:{proxy.port}") as client:
            policy = ResumePolicy(give_up_after_s=30.0, max_backoff_s=0.1)
            stream = await client.stream(audio_config(), resume=policy).open()
            got: list[Any] = []

            async def read() -> None:
                async for response in stream:
                    got.append(response)

            reading = asyncio.create_task(read())
            await stream.send_audio(speech_pcm(1.0).tobytes())
            while not got:  # noqa: ASYNC110 - the server took the stream
                await asyncio.sleep(0.05)
            proxy.upstream_port = silent.sockets[0].getsockname()[1]
            proxy.cut()
            await asyncio.sleep(2.0)  # the resume waits on its new call
            assert not reading.done()
            stream.cancel()
            with pytest.raises(StreamClosedError) as err:
                await asyncio.wait_for(reading, 5)
            assert err.value.code == CANCELLED_CODE
    finally:
        silent.close()
        for writer in held:
            writer.close()
        await proxy.close()


async def test_a_failing_notification_callback_does_not_end_the_stream(  # type: ignore[no-untyped-def]
    make_server, caplog
) -> None:
    """An exception from on_outage (or on_resume) ended the stream in the middle of its
    resume: a bug in a notification lost the call."""
    server = await serve_fake(make_server)
    proxy = await FaultProxy(server.port).start()

    def broken(_: object) -> None:
        raise RuntimeError("a bug in the caller's callback")

    try:
        async with AsrClient(f"127.0.0.1:{proxy.port}") as client:
            stream = client.stream(audio_config(), on_outage=broken, on_resume=broken)
            async with stream:
                reading = asyncio.create_task(read_all(stream))
                await stream.send_audio(speech_pcm(0.5).tobytes())
                await asyncio.sleep(0.5)
                proxy.cut()
                await stream.send_audio(speech_pcm(0.5).tobytes())
                await stream.end()
                assert await asyncio.wait_for(reading, 20) == ["w0 w1", "w0 w1"]
    finally:
        await proxy.close()
    failed = [r.getMessage() for r in caplog.records if "callback failed" in r.getMessage()]
    assert [m.split(": ")[1] for m in failed] == [
        "its on_outage callback failed",
        "its on_resume callback failed",
    ]
