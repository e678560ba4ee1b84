"""The async client API: open a stream with a config, send audio, iterate events, finalize."""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Protocol, overload

import grpc

from asr_api.v1 import asr_pb2, asr_pb2_grpc
from asr_client.acks import FinalizeAck, PendingFinalizes
from asr_client.connection import ConnectionOptions

if TYPE_CHECKING:
    from asr_client.resume import OutageInfo, ResumableStream, ResumeInfo, ResumePolicy
from asr_client.retry import PUSHBACK, retry_delay

Encoding = str  # "LINEAR16" | "FLOAT32" | "MULAW" | "ALAW"
CANCELLED = "the stream was cancelled"
#: a write after the caller's own end(): refused at once, with or without resume
ENDED = "the stream was ended (end()): nothing can be sent after it"
NOT_READ = "the stream's events are no longer read"
READ_CANCELLED = (
    "the stream's call was cancelled with a task reading or writing it (grpc cancels a call "
    "whose read or write is cancelled; leave a reading loop with break or return to read on "
    "later)"
)


#: the header a server sends when it admits a stream (asr_server.transport.servicer)
ADMITTED_HEADER = "asr-stream-id"
#: the server's idle timeout for the stream, sent with the admission header
IDLE_TIMEOUT_HEADER = "asr-idle-timeout-s"
#: HTTP/2 pings on a connection with calls open, and how long one may go unanswered
KEEPALIVE_TIME_MS = 30_000
KEEPALIVE_TIMEOUT_MS = 10_000

#: the names clients give speech events (JSON output, the bridge's events)
SPEECH_EVENT_TYPES = {
    asr_pb2.SpeechEvent.SPEECH_STARTED: "speech_started",
    asr_pb2.SpeechEvent.SPEECH_ENDED: "speech_ended",
    asr_pb2.SpeechEvent.SPEECH_RESUMED: "speech_resumed",
    asr_pb2.SpeechEvent.NO_WORDS: "no_words",
    asr_pb2.SpeechEvent.FINALIZED: "finalized",
}
#: EndOfTurn.reason as JSON and logs name it ("" from servers that predate it)
TURN_END_REASONS = {
    asr_pb2.EndOfTurn.MODEL: "model",
    asr_pb2.EndOfTurn.MAX_SILENCE: "max_silence",
    asr_pb2.EndOfTurn.FINALIZE: "finalize",
    asr_pb2.EndOfTurn.END_OF_AUDIO: "end_of_audio",
}


def speech_event_utterance(event: asr_pb2.SpeechEvent) -> int | None:
    """The utterance a speech event names; None for a FINALIZED on a channel that has
    had none yet (its utterance_id unset). Other events name one even when a server that
    predates the field's presence left 0 unset."""
    if event.type == asr_pb2.SpeechEvent.FINALIZED and not event.HasField("utterance_id"):
        return None
    return event.utterance_id


class StreamClosedError(RuntimeError):
    """The server ended the stream with an error; ``code`` and ``details`` say why."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


def recognize_request_size(config: asr_pb2.StreamingConfig, audio_bytes: int) -> int:
    """The size of ``RecognizeRequest(config=config, audio=...)`` on the wire, for audio of
    ``audio_bytes``, without building it: that would copy the audio (up to 64 MiB) once
    more only to measure it. ``audio`` is field 2, a one-byte tag and a varint length."""
    size = asr_pb2.RecognizeRequest(config=config).ByteSize()
    if audio_bytes:  # (proto3 leaves empty bytes out)
        size += 1 + max(1, (audio_bytes.bit_length() + 6) // 7) + audio_bytes
    return size


def audio_config(
    *,
    sample_rate_hz: int = 16_000,
    encoding: Encoding = "LINEAR16",
    channels: int = 1,
    language: str = "",
    languages: Sequence[str] = (),
    interim_results: bool = True,
    silence_ms: int = 0,
    endpointing: Literal["silence", "semantic"] = "silence",
    max_silence_ms: int = 0,
    eager_finals: bool = False,
    turn_threshold: float = 0.0,
    eager_threshold: float = 0.0,
    max_utterance_ms: int = 0,
    hotwords: Sequence[str] = (),
    initial_prompt: str = "",
    word_timestamps: bool = False,
    model: str = "",
) -> asr_pb2.StreamingConfig:
    """Build a ``StreamingConfig``; zero values mean the server's defaults."""
    return asr_pb2.StreamingConfig(
        format=asr_pb2.AudioFormat(
            encoding=encoding,  # the enum's name; protobuf maps it to the value
            sample_rate_hz=sample_rate_hz,
            channels=channels,
        ),
        language=language,
        languages=list(languages),
        interim_results=interim_results,
        endpointing=asr_pb2.EndpointingConfig(
            silence_ms=silence_ms,
            max_utterance_ms=max_utterance_ms,
            mode=endpointing.upper(),  # the enum's name; protobuf maps it to the value
            max_silence_ms=max_silence_ms,
            eager_finals=eager_finals,
            turn_threshold=turn_threshold,
            eager_threshold=eager_threshold,
        ),
        hotwords=list(hotwords),
        initial_prompt=initial_prompt,
        word_timestamps=word_timestamps,
        model=model,
    )


def stream_update(
    *,
    turn_threshold: float | None = None,
    eager_threshold: float | None = None,
    max_silence_ms: int | None = None,
    silence_ms: int | None = None,
    hotwords: Sequence[str] | None = None,
    eager_finals: bool | None = None,
) -> asr_pb2.StreamingUpdate:
    """A ``StreamingUpdate``: None leaves a setting as it is, 0 restores the server's
    default; ``hotwords`` replaces the stream's (an empty list clears them);
    ``eager_finals`` turns eager results on or off."""
    update = asr_pb2.StreamingUpdate(
        replace_hotwords=hotwords is not None, hotwords=list(hotwords or ())
    )
    for name, value in (
        ("turn_threshold", turn_threshold),
        ("eager_threshold", eager_threshold),
        ("max_silence_ms", max_silence_ms),
        ("silence_ms", silence_ms),
        ("eager_finals", eager_finals),
    ):
        if value is not None:
            setattr(update, name, value)
    return update


def updated_config(
    config: asr_pb2.StreamingConfig, update: asr_pb2.StreamingUpdate
) -> asr_pb2.StreamingConfig:
    """``config`` with ``update`` applied: what a new call of the stream starts with."""
    merged = asr_pb2.StreamingConfig()
    merged.CopyFrom(config)
    for name in (
        "turn_threshold",
        "eager_threshold",
        "max_silence_ms",
        "silence_ms",
        "eager_finals",
    ):
        if update.HasField(name):
            setattr(merged.endpointing, name, getattr(update, name))
    if update.replace_hotwords:
        del merged.hotwords[:]
        merged.hotwords.extend(update.hotwords)
    return merged


def delivered_status(call: grpc.aio.Call) -> tuple[grpc.StatusCode, str] | None:
    """The status the server ended ``call`` with, read in the call's done callback.

    grpc-python bug (grpc/grpc#36066): when a write is in flight as the server ends the
    call, the failed write overwrites the server's status with "Internal error from Core"
    (a server still loading its model: 3 calls in 300 on a busy machine). The status first
    delivered is the real one."""
    status = getattr(getattr(call, "_cython_call", None), "_status", None)
    if status is None:
        return None
    from grpc._common import CYGRPC_STATUS_CODE_TO_STATUS_CODE

    code = CYGRPC_STATUS_CODE_TO_STATUS_CODE.get(status.code())
    return None if code is None else (code, status.details() or "")


def check_audio(data: object) -> None:
    """Audio is ``bytes``: a numpy array, a str or a bytearray is a TypeError that says
    what to send instead (protobuf's own was "expected bytes, bytearray found", and a
    numpy array's "truth value … is ambiguous")."""
    if not isinstance(data, bytes):
        raise TypeError(
            f"send_audio takes bytes in the stream's encoding, not {type(data).__name__} "
            "(a numpy array: array.astype('<i2').tobytes() for LINEAR16; a bytearray: "
            "bytes(it))"
        )


class RecognitionStream:
    """One StreamingRecognize call. Send from any task (writes take turns), iterate events
    in another."""

    def __init__(self, call: grpc.aio.StreamStreamCall, config: asr_pb2.StreamingConfig) -> None:
        self._call = call
        self._config = config
        self._ended = False
        self._cancelled = False
        self._first_status: tuple[grpc.StatusCode, str] | None = None
        self._finalizes = PendingFinalizes(config.format.channels or 1)
        # grpc takes one write at a time: audio from one task and a keep_alive or finalize
        # from another broke the call ("Internal error from Core"), its reader left hanging
        self._write_lock = asyncio.Lock()
        call.add_done_callback(self._remember_status)

    def _remember_status(self, call: grpc.aio.Call) -> None:
        self._first_status = delivered_status(call)

    async def open(self) -> RecognitionStream:
        """Send the config (``async with`` does this for you)."""
        await self._write(asr_pb2.StreamingRecognizeRequest(config=self._config))
        return self

    async def send_audio(self, data: bytes) -> None:
        """Send audio bytes in the configured encoding; waits while the server pushes back."""
        check_audio(data)
        await self._write(asr_pb2.StreamingRecognizeRequest(audio=data))

    async def finalize(self, channel: int | None = None) -> FinalizeAck:
        """Ask the server to finalize the current utterance now (of ``channel`` only, or of
        every channel); the stream stays open. Each channel answers with a ``FINALIZED``
        speech event once the results for the audio sent before it are out.

        Returns a future of those events: ``await ack`` (or ``asyncio.wait_for``) until
        the turn's transcript is complete. It resolves as your loop reads the stream's
        events, when it is handed the last of them, and fails with the stream's error
        if the stream ends first (a server that predates FINALIZED sends none)."""
        control = asr_pb2.Control(action=asr_pb2.Control.FINALIZE)
        if channel is not None:
            control.channel = channel
        ack = self._finalizes.sent(channel)
        try:
            await self._write(asr_pb2.StreamingRecognizeRequest(control=control))
        except BaseException:
            self._finalizes.withdraw(ack)
            raise
        return ack

    async def update(self, update: asr_pb2.StreamingUpdate) -> None:
        """Change the stream's settings from this point of its audio on (``stream_update``
        builds one)."""
        await self._write(asr_pb2.StreamingRecognizeRequest(update=update))

    async def keep_alive(self) -> None:
        """Keep the stream open through a pause in the audio (a muted microphone) longer
        than the server's idle timeout (60 s by default); adds no audio."""
        control = asr_pb2.Control(action=asr_pb2.Control.KEEPALIVE)
        await self._write(asr_pb2.StreamingRecognizeRequest(control=control))

    async def end(self) -> None:
        """No more audio: the server finalizes what is pending, then ends the event stream."""
        if not self._ended:
            self._ended = True
            try:
                async with self._write_lock:
                    await self._call.done_writing()
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                raise await self._closed_error() from None
            except asyncio.CancelledError:
                if self._cancelled_by_us():
                    raise StreamClosedError(grpc.StatusCode.CANCELLED, CANCELLED) from None
                raise

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()
        self._finalizes.fail(StreamClosedError(grpc.StatusCode.CANCELLED, CANCELLED))

    async def admitted(self) -> bool:
        """Did the server admit this call (send its admission header)? False for a call it
        refused, or one that failed before reaching it: those can be made again as they were."""
        metadata = await _metadata_of(self._call.initial_metadata())
        return any(key == ADMITTED_HEADER for key, _ in metadata)

    async def idle_timeout_s(self) -> float | None:
        """How long the server lets this stream go without a message before it ends it
        (its idle timeout), once the server has admitted it; None if it did not say (a
        server that predates the header, a call that was refused or failed)."""
        for key, value in await _metadata_of(self._call.initial_metadata()):
            if key == IDLE_TIMEOUT_HEADER:
                with contextlib.suppress(ValueError):
                    seconds = float(value)
                    return seconds if seconds > 0 else None
        return None

    async def refused_with_pushback(self) -> bool:
        """Did a server end this call with a retry pushback (an admission refusal: a full,
        draining or loading replica), as opposed to a failure on the way to one?"""
        trailing = await _metadata_of(self._call.trailing_metadata())
        return any(key == PUSHBACK for key, _ in trailing)

    async def _write(self, request: asr_pb2.StreamingRecognizeRequest) -> None:
        if self._ended:
            raise StreamClosedError(grpc.StatusCode.FAILED_PRECONDITION, ENDED)
        try:
            async with self._write_lock:
                await self._call.write(request)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
            # The call has ended. A failed write only says "Internal error from Core";
            # the call's final status carries the server's real code and message.
            raise await self._closed_error() from None
        except asyncio.CancelledError:
            if self._cancelled_by_us():
                raise StreamClosedError(grpc.StatusCode.CANCELLED, CANCELLED) from None
            raise

    def _cancelled_by_us(self) -> bool:
        """grpc.aio raises CancelledError from a write on a call we cancelled (from another
        task, as a resume does): that is the call's end, not this task's cancellation."""
        task = asyncio.current_task()
        return self._cancelled and (task is None or not task.cancelling())

    async def _closed_error(self) -> StreamClosedError:
        code, details = self._first_status or (await self._call.code(), await self._call.details())
        if code == grpc.StatusCode.OK:
            return StreamClosedError(code, "the server closed the stream")
        return StreamClosedError(code, details or "")

    async def __aiter__(self) -> AsyncIterator[asr_pb2.StreamingRecognizeResponse]:
        ended = StreamClosedError(grpc.StatusCode.CANCELLED, NOT_READ)  # unless it ends
        try:
            while True:
                # a call grpc cancelled before this read began (a task reading or writing it
                # was cancelled, as a timeout around an earlier loop does): the stream's
                # end, said so, not a bare CancelledError in a task nobody cancelled, which
                # ended asyncio.run as if interrupted
                cancelled_before = self._call.cancelled() and not self._cancelled
                try:
                    response = await self._call.read()
                except grpc.aio.AioRpcError:
                    ended = await self._closed_error()
                    raise ended from None
                except asyncio.CancelledError:
                    if not (self._cancelled_by_us() or cancelled_before):
                        raise
                    # cancel() from another task ends the stream for its reader too: as
                    # the stream's end (its status), not as this task's cancellation
                    why = CANCELLED if self._cancelled else READ_CANCELLED
                    ended = StreamClosedError(grpc.StatusCode.CANCELLED, why)
                    raise ended from None
                if response is grpc.aio.EOF:
                    ended = await self._closed_error()
                    if ended.code != grpc.StatusCode.OK:
                        raise ended
                    return
                if _is_finalized(response):
                    self._finalizes.acknowledged(response.speech_event)
                yield response
        finally:  # what waits is not acknowledged; after the stream's end, nothing will be
            self._finalizes.fail(ended, for_good=ended.details != NOT_READ)

    async def __aenter__(self) -> RecognitionStream:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None or not self._call.done():
            # (cancel(), not the call's: writers and readers then get StreamClosedError
            # CANCELLED, and a pending finalize's acknowledgement fails, rather than a
            # bare CancelledError and a future that never resolves)
            self.cancel()


class AudioStream(Protocol):
    """What ``AsrClient.stream`` returns, with or without resume: a ``RecognitionStream``
    (``resume=None``) or a ``ResumableStream`` (resume.py), which is not one (it carries
    the stream over its calls). It was annotated as a RecognitionStream: a type checker
    then passed ``admitted()``, which a resuming stream lacks, and refused ``resumes``."""

    async def open(self) -> AudioStream: ...
    async def send_audio(self, data: bytes) -> None: ...
    async def finalize(self, channel: int | None = None) -> FinalizeAck: ...
    async def update(self, update: asr_pb2.StreamingUpdate) -> None: ...
    async def keep_alive(self) -> None: ...
    async def idle_timeout_s(self) -> float | None: ...
    async def end(self) -> None: ...
    def cancel(self) -> None: ...
    def __aiter__(self) -> AsyncIterator[asr_pb2.StreamingRecognizeResponse]: ...
    async def __aenter__(self) -> AudioStream: ...
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


async def _metadata_of(read: Awaitable[Any]) -> Sequence[tuple[str, str | bytes]]:
    """A call's initial or trailing metadata; none for a call that failed or was cancelled
    before it came. A cancellation of the caller's own task goes on: swallowed, a bridge
    session's keepalive task read "no idle timeout" and slept on for 20 s at its end."""
    try:
        return tuple(await read or ())
    except grpc.aio.AioRpcError:
        return ()
    except asyncio.CancelledError:  # the call's (cancelled before that metadata) …
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # … or the caller's own
        return ()


def _is_finalized(response: object) -> bool:
    """A FINALIZED speech event (a call made without deserializers yields raw bytes)."""
    return (
        isinstance(response, asr_pb2.StreamingRecognizeResponse)
        and response.HasField("speech_event")
        and response.speech_event.type == asr_pb2.SpeechEvent.FINALIZED
    )


class AsrClient:
    """A connection to a streamasr server (one gRPC channel, many streams).

    ``AsrClient("host:port")`` for a plaintext server on a trusted network, or
    ``AsrClient(ConnectionOptions(target, tls=True, token=...))`` for TLS, mTLS and tokens.
    Streams resume on a new call when theirs breaks (``resume=None``: they fail instead;
    see resume.py).
    A call refused at admission is made again (``retry=False``: fail at once; retry.py).
    """

    def __init__(
        self,
        target: str | ConnectionOptions = "localhost:50051",
        *,
        options: Sequence[tuple[str, object]] = (),
        max_message_bytes: int = 64 << 20,
        retry: bool = True,
        resume: ResumePolicy | None | Literal["default"] = "default",
    ) -> None:
        #: how this client's streams resume when their call breaks (default: the default
        #: ResumePolicy); None = they fail with the call's error
        from asr_client.resume import ResumePolicy

        if resume == "default":
            resume = ResumePolicy()
        self.resume = resume
        #: refused calls are made again: Recognize after the server's pushback (retry.py),
        #: streams by their resume policy (seat_wait_s for a full replica, give_up_after_s for a
        #: draining one); False = a call no server took fails at once, with its status
        self.retry = retry
        self.connection = (
            target if isinstance(target, ConnectionOptions) else ConnectionOptions(target)
        )
        self._metadata = self.connection.call_metadata()
        self._closed = False
        #: the streams made and not yet collected: close() cancels them first, or their
        #: readers got a bare CancelledError from the closed channel (a task nobody
        #: cancelled, which ended asyncio.run as if it had been) and resumed ones wrote on
        self._streams: weakref.WeakSet[RecognitionStream | ResumableStream] = weakref.WeakSet()
        # grpc's reconnect backoff grows to 120 s: a stream resuming after a longer outage
        # would find its channel still waiting after the server came back, and give up
        reconnect_ms = round(1000 * (resume or ResumePolicy()).max_backoff_s)
        self._channel = self.connection.channel(
            [
                ("grpc.max_send_message_length", max_message_bytes),
                ("grpc.max_receive_message_length", max_message_bytes),
                ("grpc.enable_retries", int(retry)),
                # the caller's (e.g. balancing_service_config())
                *options,
                ("grpc.initial_reconnect_backoff_ms", min(1000, reconnect_ms)),
                ("grpc.max_reconnect_backoff_ms", reconnect_ms),
                # a connection whose other end vanished without a reset (a host's power,
                # a partition) would leave a stream waiting forever: pinged, it fails
                # within 40 s and the stream resumes on a new one (the server allows a
                # ping every 10 s). grpc ends a connection on an unanswered ping only
                # after ping_timeout_ms (a minute), whatever keepalive_timeout_ms says
                ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
                ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
                ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
            ]
        )
        self._stub = asr_pb2_grpc.RecognizerStub(self._channel)

    async def wait_ready(self, timeout_s: float | None = None) -> None:
        """Wait until the channel is connected (default: the connect timeout)."""
        timeout_s = self.connection.connect_timeout_s if timeout_s is None else timeout_s
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for drops a cancellation
        # (a Ctrl-C) that arrives as the channel becomes ready
        async with asyncio.timeout(timeout_s):
            await self._channel.channel_ready()

    @overload
    def stream(
        self,
        config: asr_pb2.StreamingConfig,
        *,
        timeout_s: float | None = None,
        resume: None,
        on_resume: Callable[[ResumeInfo], None] | None = None,
        on_outage: Callable[[OutageInfo], None] | None = None,
    ) -> RecognitionStream: ...

    @overload
    def stream(
        self,
        config: asr_pb2.StreamingConfig,
        *,
        timeout_s: float | None = None,
        resume: ResumePolicy | Literal["default"] = "default",
        on_resume: Callable[[ResumeInfo], None] | None = None,
        on_outage: Callable[[OutageInfo], None] | None = None,
    ) -> AudioStream: ...

    def stream(
        self,
        config: asr_pb2.StreamingConfig,
        *,
        timeout_s: float | None = None,
        resume: ResumePolicy | None | Literal["default"] = "default",
        on_resume: Callable[[ResumeInfo], None] | None = None,
        on_outage: Callable[[OutageInfo], None] | None = None,
    ) -> AudioStream:
        """A new stream; use ``async with`` (or ``await stream.open()``) to send the config.

        The stream resumes on a new call when its connection breaks or its server goes
        away (``resume``: the client's policy by default, None = never; see resume.py);
        ``on_resume`` is told each time. ``on_outage`` is told as soon as a call breaks and
        the stream starts resuming (not for a planned move off a draining server), or a
        new stream's second try is refused too, once per outage; ``on_resume`` when it is
        over. ``timeout_s`` bounds each call.
        """
        policy = self.resume if resume == "default" else resume
        stream: RecognitionStream | ResumableStream
        if policy is None:
            stream = self._raw_stream(config, timeout_s)
        else:
            from asr_client.resume import ResumableStream

            stream = ResumableStream(
                self,
                config,
                policy,
                timeout_s=timeout_s,
                on_resume=on_resume,
                on_outage=on_outage,
                retry=self.retry,
            )
        self._streams.add(stream)
        return stream

    def _raw_stream(
        self, config: asr_pb2.StreamingConfig, timeout_s: float | None
    ) -> RecognitionStream:
        """One StreamingRecognize call, with no resume."""
        self._check_open()
        return RecognitionStream(
            self._stub.StreamingRecognize(timeout=timeout_s, metadata=self._metadata), config
        )

    async def recognize(
        self, audio: bytes, config: asr_pb2.StreamingConfig, *, timeout_s: float | None = None
    ) -> asr_pb2.RecognizeResponse:
        """Transcribe a whole recording in one call; a call refused at admission (a full,
        draining or loading replica) is made again after the server's pushback (retry.py)
        unless the client was made with ``retry=False``. ``timeout_s`` bounds them all."""
        self._check_open()
        request = asr_pb2.RecognizeRequest(config=config, audio=audio)
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        attempts = 0
        while True:
            left = None if deadline is None else max(0.0, deadline - loop.time())
            try:
                return await self._stub.Recognize(request, timeout=left, metadata=self._metadata)
            except grpc.aio.AioRpcError as exc:
                attempts += 1
                delay = (
                    retry_delay(exc.code(), exc.trailing_metadata(), attempts)
                    if self.retry
                    else None
                )
                if delay is None or (deadline is not None and loop.time() + delay >= deadline):
                    raise StreamClosedError(exc.code(), exc.details() or "") from None
            await asyncio.sleep(delay)

    async def close(self) -> None:
        """Close the channel; streams still open end with StreamClosedError (CANCELLED)."""
        self._closed = True
        for stream in list(self._streams):
            stream.cancel()
        await self._channel.close()

    def _has_a_connection(self) -> bool:
        """Whether the channel is connected to something (a server, or a proxy in front
        of servers): a call that failed then was answered, not lost on the way."""
        state = self._channel.get_state(try_to_connect=False)
        return bool(state == grpc.ChannelConnectivity.READY)

    def _check_open(self) -> None:
        if self._closed:  # (grpc's own word is a UsageError, "Channel is closed.")
            raise StreamClosedError(grpc.StatusCode.CANCELLED, "this AsrClient is closed")

    async def __aenter__(self) -> AsrClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
