"""One Deepgram live session: a ``/v1/listen`` WebSocket on one side, its gRPC stream on
the other.

The same two-task shape as ``session.py``: *upstream* reads one WebSocket message and
awaits its gRPC write before reading the next (the server's backpressure reaches the
client's TCP window) — while the server keeps pace with the audio (``session.ClientWrites``:
past ``session.UPSTREAM_WRITE_DEADLINE_S`` behind, the session ends with close 1013) and
the client is there (one that leaves meanwhile frees the stream at once) — and
*downstream* turns responses into Deepgram's messages. The stream
resumes on a new gRPC call when its call breaks (``client.stream``); Deepgram has no message
for that, so the client simply sees the transcript go on.

The socket is accepted here, after the query string has been checked: a refused query is
an HTTP 400 on the handshake, as Deepgram's API answers it.

``DeepgramRelay`` is that relay, shared with Flux (``flux_session.py``); ``DeepgramSession``
fills in the live API's messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

import grpc
from starlette.responses import JSONResponse
from starlette.websockets import WebSocket, WebSocketDisconnect

from asr_api.v1 import asr_pb2
from asr_bridge.auth import key_subprotocol
from asr_bridge.container import ContainerDecoder, ContainerError, DecodedFormat, Marker
from asr_bridge.deepgram import (
    MAX_FRAME_BYTES,
    AudioFramer,
    CloseStream,
    Configure,
    DeepgramMessages,
    Event,
    Finalize,
    HandshakeRefusal,
    KeepAlive,
    ListenOptions,
    ListenQueryError,
    SchemaError,
    error_message,
    handshake_refusal,
    parse_listen_query,
    parse_text,
    streaming_config,
)
from asr_bridge.metrics import BridgeMetrics
from asr_bridge.protocol import CLOSE_TRY_AGAIN_LATER, close_reason
from asr_bridge.public_errors import for_browser
from asr_bridge.session import ClientWrites, ServerFellBehind, UpstreamPace
from asr_bridge.wire import ClientGone, close_quietly, send_events
from asr_client import AsrClient, AudioStream, StreamClosedError
from asr_client.resume import ResumeInfo, resume_notice

if TYPE_CHECKING:
    from asr_bridge.app import BridgeConfig

logger = logging.getLogger(__name__)

Options = TypeVar("Options")

CLOSE_NORMAL = 1000
#: Deepgram closes with 1008 and "DATA-0000" for data it cannot use; 1011 for its own faults
CLOSE_POLICY = 1008
CLOSE_SERVER_ERROR = 1011
_CLIENT_FAULTS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE}


class AudioSink(Protocol):
    """Where the relay's upstream sends what the client sent, in order: the gRPC stream
    itself, or (for a container) the decoder in front of it."""

    async def send_audio(self, data: bytes) -> None: ...

    async def finalize(self, channel: int | None = None) -> object: ...

    async def update(self, update: asr_pb2.StreamingUpdate) -> None: ...

    async def keep_alive(self) -> None: ...

    async def end(self) -> None: ...


#: commands (Finalize, Configure) a container session holds before its first audio: a
#: client that sends only commands would otherwise grow that list without end
MAX_EARLY_COMMANDS = 64


class BadData(Exception):
    """Audio the bridge cannot pass on; the session ends with 1008, as Deepgram's does."""

    def __init__(self, description: str) -> None:
        super().__init__(description)
        self.description = description


class NoAudio(Exception):
    """The client sent nothing the bridge could start a stream with, for too long: the
    session ends with 1011 "NET-0001", as Deepgram's does after its 10 s without audio."""

    def __init__(self, description: str) -> None:
        super().__init__(description)
        self.description = description


def refusal_response(refusal: HandshakeRefusal) -> JSONResponse:
    return JSONResponse(refusal.body, refusal.status, headers=refusal.headers)


def deny(code: str, message: str) -> JSONResponse:
    """The gate's refusals (token, capacity) as Deepgram answers them: on the handshake."""
    return refusal_response(handshake_refusal(code, message))


async def serve(
    ws: WebSocket, client: AsrClient, session_id: str, metrics: BridgeMetrics, config: BridgeConfig
) -> None:
    """``app.ServeSession`` for ``/v1/listen``: check the query, accept, relay."""
    options = await query_or_refusal(ws, session_id, metrics, parse_listen_query)
    if options is None:
        return
    messages = DeepgramMessages(options)
    await accept(ws, messages.request_id, ws.scope.get("subprotocols", []))
    session = ContainerSession if options.containerized else DeepgramSession
    await session(ws, client, session_id, metrics, options, messages).run()


async def query_or_refusal(
    ws: WebSocket,
    session_id: str,
    metrics: BridgeMetrics,
    parse: Callable[[Iterable[tuple[str, str]]], Options],
) -> Options | None:
    """The handshake's query as ``parse`` reads it, or None once it was refused: an HTTP
    400 on the handshake, as Deepgram's API answers it."""
    try:
        return parse(ws.query_params.multi_items())
    except ListenQueryError as exc:
        metrics.session_errors.labels("INVALID_ARGUMENT").inc()
        logger.info("session %s: refused: %s", session_id, exc)
        await _send_refusal(ws, handshake_refusal("INVALID_ARGUMENT", str(exc)))
        return None


async def accept(ws: WebSocket, request_id: str, offered: Sequence[str] = ()) -> None:
    """Accept the socket, with the request id in a header as Deepgram sends it, and the
    scheme of a key a browser offered as subprotocols (``["token", key]``) as the one
    chosen: a browser drops a socket whose server chooses none of those it offered."""
    await ws.accept(
        subprotocol=key_subprotocol(offered),
        headers=[(b"dg-request-id", request_id.encode())],
    )


async def _send_refusal(ws: WebSocket, refusal: HandshakeRefusal) -> None:
    with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):
        if "websocket.http.response" in ws.scope.get("extensions", {}):
            await ws.send_denial_response(refusal_response(refusal))
        else:  # a server without denial responses: a bare 403
            await ws.close()


class DeepgramRelay:
    """What Deepgram's WebSocket APIs share: audio cut anywhere in, the server's
    backpressure out to the socket, CloseStream, errors and closes. The protocols (live
    ``/v1/listen``, Flux ``/v2/listen``) fill in the hooks below."""

    def __init__(
        self,
        websocket: WebSocket,
        client: AsrClient,
        session_id: str,
        metrics: BridgeMetrics,
        audio: ListenOptions,
    ) -> None:
        self.websocket = websocket
        self.client = client
        self.session_id = session_id
        self.metrics = metrics
        self.framer = AudioFramer(audio) if not audio.containerized else None
        self.audio_bytes = 0  # received from the client
        self.stream: AudioStream | None = None  # once opened
        self.sha256 = hashlib.sha256()
        self.closing = False  # CloseStream received: the results then Metadata follow
        # the upstream's writes: bounded by the server's pace, and ended by the client leaving
        self.writes = ClientWrites(websocket)
        self._opened_told = False  # the opening message (Flux's Connected) has gone out
        self._heard_from_server = False  # a response came: a later failure was no refusal
        self.heard_at = asyncio.get_running_loop().time()  # the client's last message
        # both tasks write (upstream answers Configure and bad messages): one message at a time
        self._send_lock = asyncio.Lock()

    async def run(self) -> None:
        """Serve the session to its end; never raises for anything the peers do."""
        logger.info("session %s: %s", self.session_id, self._describe())
        try:
            await self._relay()
        finally:
            if self.stream is not None:
                # a no-op once the call has ended; frees the server's stream if not
                self.stream.cancel()

    # -- what the protocols do differently -------------------------------------------------

    def _describe(self) -> str:
        raise NotImplementedError

    def _config(self) -> asr_pb2.StreamingConfig:
        raise NotImplementedError

    def _messages(self, response: asr_pb2.StreamingRecognizeResponse) -> list[Event]:
        """The protocol's messages for one gRPC response."""
        raise NotImplementedError

    async def _command(self, stream: AudioSink, text: str) -> None:
        """A client text message."""
        raise NotImplementedError

    def _opening(self) -> list[Event]:
        """Sent once the gRPC stream is open."""
        return []

    def _closing(self) -> list[Event]:
        """Sent after the last result of a stream closed by CloseStream."""
        return []

    def _stamp(self, events: list[Event]) -> list[Event]:
        """Called under the send lock, in the order messages go out."""
        return events

    def _error(self, description: str, variant: str) -> Event:
        return error_message(description, variant=variant)

    # -- the relay ------------------------------------------------------------------------

    async def _open_stream(self) -> AudioStream:
        """Open the gRPC stream with ``_config()`` and tell the client it is open (unless
        a container session told it already)."""
        self.stream = self.client.stream(self._config(), on_resume=self._resumed)
        await self.stream.open()
        if not self._opened_told:
            await self._send(self._opening())
        return self.stream

    async def _transcribe(self) -> None:
        """Relay until the server ends the stream: raw audio goes to the stream as it comes."""
        stream = await self._open_stream()
        async with asyncio.TaskGroup() as tg:
            upstream = tg.create_task(self._upstream(stream), name=f"up-{self.session_id}")
            await self._downstream(stream)
            upstream.cancel()  # the server has ended the stream: nothing more to read

    async def _relay(self) -> None:
        try:
            await self._transcribe()
            if not self.closing:
                # the server ended the stream without being asked (it cannot today, but
                # the client must not wait for a Metadata that will never come)
                await self._fail("the recognition server ended the stream", CLOSE_SERVER_ERROR)
                return
            await self._send(self._closing())
            await self._close(CLOSE_NORMAL, "")
            logger.info("session %s: done", self.session_id)
        except* ClientGone:
            logger.info("session %s: client went away", self.session_id)
        except* BadData as group:
            bad = group.exceptions[0]
            assert isinstance(bad, BadData)
            self.metrics.session_errors.labels("INVALID_ARGUMENT").inc()
            await self._fail(bad.description, CLOSE_POLICY)
        except* StreamClosedError as group:
            error = group.exceptions[0]
            assert isinstance(error, StreamClosedError)
            self.metrics.session_errors.labels(error.code.name).inc()
            self.metrics.stream_failed(error.code, answered=self._heard_from_server)
            level = logging.WARNING if error.code == grpc.StatusCode.UNAVAILABLE else logging.INFO
            logger.log(level, "session %s: server error %s", self.session_id, error)
            close = CLOSE_POLICY if error.code in _CLIENT_FAULTS else CLOSE_SERVER_ERROR
            details = for_browser(error.details, self.client.connection)
            await self._fail(f"{error.code.name}: {details}", close)
        except* NoAudio as group:
            self.metrics.session_errors.labels("DEADLINE_EXCEEDED").inc()
            no_audio = group.exceptions[0]
            assert isinstance(no_audio, NoAudio)
            await self._fail(no_audio.description, CLOSE_SERVER_ERROR, "NET-0001")
        except* ServerFellBehind as group:
            self.metrics.session_errors.labels("RESOURCE_EXHAUSTED").inc()
            logger.warning("session %s: %s", self.session_id, group.exceptions[0])
            await self._fail(f"RESOURCE_EXHAUSTED: {group.exceptions[0]}", CLOSE_TRY_AGAIN_LATER)

    async def _upstream(self, stream: AudioSink) -> None:
        while True:
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                raise ClientGone
            self.heard_at = asyncio.get_running_loop().time()
            data = message.get("bytes")
            if self.closing:
                continue  # after CloseStream only the client leaving matters
            if data is not None:
                if not data:  # Deepgram's old way to close a stream, still honoured there
                    await self._close_stream(stream)
                elif len(data) > MAX_FRAME_BYTES:
                    raise BadData(f"audio frame of {len(data)} bytes is over {MAX_FRAME_BYTES}")
                else:
                    await self._audio(stream, data)
                continue
            await self._command(stream, message.get("text") or "")

    async def _audio(self, stream: AudioSink, data: bytes) -> None:
        self.audio_bytes += len(data)
        self.sha256.update(data)
        await self._send_pcm(stream, data)

    async def _send_pcm(self, stream: AudioSink, data: bytes) -> None:
        assert self.framer is not None
        try:
            pcm = self.framer.feed(data)
        except ValueError as exc:  # samples that are not audio
            raise BadData(str(exc)) from None
        if pcm:
            # waits while the server pushes back (for a while)
            await self._write_pcm(stream.send_audio(pcm), self.framer.seconds(pcm))
            self.metrics.audio_received.inc(len(pcm))

    async def _write_pcm(self, write: Awaitable[object], audio_s: float) -> None:
        await self.writes.write(write, audio_s)

    async def _write_command(self, write: Awaitable[object]) -> None:
        """A client's command (Finalize, KeepAlive, CloseStream…) to the stream: its wait
        counts against the pace of the audio around it."""
        await self.writes.write(write)

    async def _close_stream(self, stream: AudioSink) -> None:
        self.closing = True
        # the server finalizes what is pending, then ends the stream
        await self._write_command(stream.end())

    def _resumed(self, info: ResumeInfo) -> None:
        self.metrics.resumes.inc()
        logger.info("session %s: %s", self.session_id, resume_notice(info))

    async def _downstream(self, stream: AudioStream) -> None:
        async for response in stream:
            self._heard_from_server = True
            if response.HasField("progress"):
                self.metrics.server_lag.observe(response.progress.lag_s)
            await self._send(self._messages(response))

    async def _send(self, events: list[Event]) -> None:
        if not events:
            return
        async with self._send_lock:
            await send_events(self.websocket, self._stamp(events))

    async def _fail(self, description: str, close_code: int, variant: str = "") -> None:
        """Deepgram's Error message, then its close: 1008 "DATA-0000" for the client's data,
        1011 "NET-0000" for the server's side (or the ``variant`` given)."""
        logger.info("session %s: error: %s", self.session_id, description)
        variant = variant or ("DATA-0000" if close_code == CLOSE_POLICY else "NET-0000")
        try:
            await self._send([self._error(description, variant)])
        except ClientGone:
            return
        await self._close(close_code, close_reason(f"{variant}: {description}"))

    async def _close(self, code: int, reason: str) -> None:
        await close_quietly(self.websocket, code, reason)


class DeepgramSession(DeepgramRelay):
    """A ``/v1/listen`` session: Deepgram's live results per utterance."""

    def __init__(
        self,
        websocket: WebSocket,
        client: AsrClient,
        session_id: str,
        metrics: BridgeMetrics,
        options: ListenOptions,
        messages: DeepgramMessages,
    ) -> None:
        super().__init__(websocket, client, session_id, metrics, options)
        self.options = options
        self.messages = messages

    def _describe(self) -> str:
        o = self.options
        return f"Deepgram listen ({o.encoding}, {o.sample_rate} Hz, {o.channels} channel(s))"

    def _config(self) -> asr_pb2.StreamingConfig:
        return streaming_config(self.options)

    def _messages(self, response: asr_pb2.StreamingRecognizeResponse) -> list[Event]:
        return self.messages.response(response)

    def _closing(self) -> list[Event]:
        return [self.messages.metadata(self._duration_s(), self.sha256.hexdigest())]

    def _duration_s(self) -> float:
        return self.audio_bytes / self.options.bytes_per_second

    def _missing(self, finalize: Finalize) -> str:
        """Why a Finalize's channel is refused: the audio has no such channel."""
        channels = self.options.reported_channels
        if finalize.channel is None or finalize.channel < channels:
            return ""
        return f"Finalize's channel {finalize.channel} does not exist ({channels} here)"

    async def _command(self, stream: AudioSink, text: str) -> None:
        try:
            command = parse_text(text)
        except SchemaError as exc:
            # Deepgram answers a message it cannot parse with an Error and goes on:
            # the audio already sent is still transcribed
            logger.info("session %s: refused a text message: %s", self.session_id, exc)
            await self._send([error_message(str(exc), message=text)])
            return
        if isinstance(command, Finalize):
            # (a container's channels are known once decoded: checked as it leaves the decoder)
            if not self.options.containerized and (error := self._missing(command)):
                await self._send([error_message(error, message=text)])
                return
            await self._write_command(stream.finalize(command.channel))
        elif isinstance(command, CloseStream):
            await self._close_stream(stream)
        elif isinstance(command, Configure):
            await self._send([self.messages.configure_failure()])
        else:
            assert isinstance(command, KeepAlive)
            # the socket is alive, and so must the gRPC stream stay through the pause (the
            # server ends a stream that sends nothing for its idle timeout)
            await self._write_command(stream.keep_alive())


class ContainerRelay(DeepgramRelay):
    """A relay whose audio is a container (no raw ``encoding`` in the query, as a
    browser's ``MediaRecorder`` sends WebM/Opus): decoded here by FFmpeg
    (``container.py``), and the gRPC stream opened once the container has said what its
    audio is (its rate and channels: ``_use_format``). What the client sends goes to the
    decoder in order and comes out of it in order: audio, then a ``Finalize`` (or a
    ``Configure``'s update) it sent after that audio. Mixed in before a protocol's session."""

    decoded_bytes = 0  # PCM out of the decoder
    #: until FFmpeg has said what the audio is there is no gRPC stream, and so no server
    #: idle timeout: a client silent this long before that is ended (Deepgram's window)
    identify_idle_s = 10.0
    #: the pace of the decoded audio's writes to the server (the pump's, not the socket
    #: reader's: that one feeds the decoder, whose audio's length is not known)
    _decoded_pace: UpstreamPace

    async def _write_pcm(self, write: Awaitable[object], audio_s: float) -> None:
        await self._decoded_pace.write(write, audio_s)

    async def _write_command(self, write: Awaitable[object]) -> None:
        # to the decoder, as the container's bytes are: bounded on its own (no audio
        # length here pays back the wait; the decoded audio's pace is the pump's)
        await self.writes.write_unpaced(write)

    def _use_format(self, decoded: DecodedFormat) -> None:
        """The protocol's options for the decoded audio; sets ``framer`` for it."""
        raise NotImplementedError

    async def _transcribe(self) -> None:
        decoder = ContainerDecoder(self.session_id)
        self._decoded_pace = UpstreamPace()
        # the opening message (Flux's Connected) now, not once FFmpeg has heard audio: a
        # client that waits for it before sending audio would wait forever
        await self._send(self._opening())
        self._opened_told = True
        try:
            async with asyncio.TaskGroup() as tg:
                sink = _Decoding(decoder)
                upstream = tg.create_task(self._upstream(sink), name=f"up-{self.session_id}")
                first = await self._decoded_while_heard(decoder)
                early: list[Marker] = []  # commands before any audio: applied once open
                while isinstance(first, Marker):
                    if not isinstance(first.value, KeepAlive):  # (no stream to keep yet)
                        early.append(first)
                    if len(early) > MAX_EARLY_COMMANDS:
                        raise BadData(f"more than {MAX_EARLY_COMMANDS} commands before any audio")
                    first = await self._decoded_while_heard(decoder)
                if isinstance(first, DecodedFormat):
                    self._use_format(first)
                    stream = await self._open_stream()
                    for marker in early:  # (a Finalize is answered, as on a raw stream)
                        await self._command_out(stream, marker)
                    pump = tg.create_task(
                        self._pump(decoder, stream), name=f"pcm-{self.session_id}"
                    )
                    await self._downstream(stream)
                    pump.cancel()
                # else: closed before any audio; nothing to transcribe
                upstream.cancel()
        finally:
            decoder.close()

    async def _decoded_while_heard(self, decoder: ContainerDecoder) -> object:
        """The decoder's next output before the stream is open, while the client keeps
        sending (audio, KeepAlive, any message): NoAudio once it has been silent for
        ``identify_idle_s``. A client that pauses before its container has said what it
        is held its session, and a place under the bridge's limit, for ever."""
        loop = asyncio.get_running_loop()
        out = asyncio.ensure_future(self._decoded(decoder))
        try:
            while not out.done():  # (each message the client sends moves heard_at on)
                quiet_left = self.heard_at + self.identify_idle_s - loop.time()
                if quiet_left <= 0:
                    raise NoAudio(
                        f"no audio the bridge could start a stream with in "
                        f"{self.identify_idle_s:g} s: send audio, or KeepAlive while paused"
                    )
                await asyncio.wait({out}, timeout=quiet_left)
            return out.result()
        finally:
            out.cancel()

    async def _decoded(self, decoder: ContainerDecoder) -> object:
        try:
            return await decoder.get()
        except ContainerError as exc:
            raise BadData(str(exc)) from None

    async def _pump(self, decoder: ContainerDecoder, stream: AudioStream) -> None:
        """The decoded audio and the client's commands among it, to the gRPC stream."""
        while (item := await self._decoded_to_end(decoder)) is not None:
            if isinstance(item, bytes):
                self.decoded_bytes += len(item)
                await self._send_pcm(stream, item)
            elif isinstance(item, Marker):
                await self._command_out(stream, item)
        # the client's CloseStream: everything it sent is decoded
        await self._decoded_pace.write(stream.end())

    async def _decoded_to_end(self, decoder: ContainerDecoder) -> object:
        """What comes out of the decoder; None at the end. After the client's CloseStream
        an error in the data's last packet is the end too: a client that stopped inside a
        piece (a fragmented MP4's last fragment cut short, which FFmpeg refuses) gets what
        was decoded transcribed. Damaged data before that is refused, however soon the
        CloseStream came after it."""
        try:
            return await decoder.get()
        except ContainerError as exc:
            if not (self.closing and exc.cut_short):
                raise BadData(str(exc)) from None
            logger.info("session %s: the audio ends in data not decoded: %s", self.session_id, exc)
            return None

    def _refusal(self, marker: Marker) -> Event | None:
        """An Error for a command the decoded audio cannot take, or None."""
        return None

    async def _command_out(self, stream: AudioStream, marker: Marker) -> None:
        """A command that came out of the decoder: refused, or applied."""
        if (refusal := self._refusal(marker)) is not None:
            await self._send([refusal])
        else:
            await self._decoded_pace.write(self._apply(stream, marker))

    @staticmethod
    async def _apply(stream: AudioStream, marker: Marker) -> None:
        """A command that came out of the decoder, after the audio sent before it."""
        if isinstance(marker.value, Finalize):
            await stream.finalize(marker.value.channel)
        elif isinstance(marker.value, asr_pb2.StreamingUpdate):
            await stream.update(marker.value)
        elif isinstance(marker.value, KeepAlive):
            await stream.keep_alive()

    async def _audio(self, stream: AudioSink, data: bytes) -> None:
        self.audio_bytes += len(data)
        self.sha256.update(data)
        # to the decoder; waits while it is behind (the server, for a while)
        await self.writes.write_unpaced(stream.send_audio(data))


class ContainerSession(ContainerRelay, DeepgramSession):
    """A ``/v1/listen`` session sending a container."""

    def _describe(self) -> str:
        return "Deepgram listen (a container, decoded by the bridge)"

    def _use_format(self, decoded: DecodedFormat) -> None:
        self.options = self.options.decoded(decoded.sample_rate, decoded.channels)
        self.messages.options = self.options
        self.framer = AudioFramer(self.options)

    def _refusal(self, marker: Marker) -> Event | None:
        if isinstance(marker.value, Finalize) and (error := self._missing(marker.value)):
            return error_message(error)
        return None

    def _duration_s(self) -> float:
        if self.options.containerized:  # nothing was decoded
            return 0.0
        return self.decoded_bytes / self.options.bytes_per_second


class _Decoding:
    """A container session's ``AudioSink``: everything goes to the decoder, in order."""

    def __init__(self, decoder: ContainerDecoder) -> None:
        self._decoder = decoder

    async def send_audio(self, data: bytes) -> None:
        await self._decoder.feed(data)

    async def finalize(self, channel: int | None = None) -> None:
        await self._decoder.mark(Finalize(channel))

    async def update(self, update: asr_pb2.StreamingUpdate) -> None:
        await self._decoder.mark(update)

    async def keep_alive(self) -> None:
        await self._decoder.mark(KeepAlive())

    async def end(self) -> None:
        await self._decoder.end()
