"""One OpenAI Realtime transcription session: a WebSocket on one side, a gRPC stream on the other.

The protocol is realtime.py's. The session starts with ``session.created``; updates are
taken until the first audio arrives, which opens the gRPC stream with the session's
settings (a later change of format, language or turn detection is refused: it would need
another stream). From then on, as in session.py, this task awaits each gRPC write before
reading the next WebSocket message (the server's backpressure reaches the client's socket),
and a second task turns the stream's responses into server events. Client mistakes are
``error`` events and the session goes on, as OpenAI's do; a failure of the stream ends it.
A broken stream resumes on a new call (asr_client), unseen by the client: the speech the
new call hears again continues the items the client has (``ServerEvents.resumed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc
from starlette.websockets import WebSocket

from asr_bridge.keepalive import StreamKeeper
from asr_bridge.metrics import BridgeMetrics
from asr_bridge.protocol import (
    CLIENT_FAULTS,
    CLOSE_NORMAL,
    CLOSE_SERVER_ERROR,
    CLOSE_TRY_AGAIN_LATER,
    close_code_for,
    close_reason,
)
from asr_bridge.public_errors import for_browser
from asr_bridge.realtime import (
    ClientEvent,
    Event,
    RealtimeError,
    ServerEvents,
    TranscriptionSession,
    decode_audio,
    parse_client_event,
)
from asr_bridge.session import ClientWrites, ServerFellBehind
from asr_bridge.wire import ClientGone, close_quietly, send_events
from asr_client import AsrClient, AudioStream, StreamClosedError
from asr_client.resume import ResumeInfo, resume_notice

if TYPE_CHECKING:
    from asr_bridge.app import BridgeConfig

logger = logging.getLogger(__name__)

#: the one client message that is not an event: at most this much JSON (base64 audio of
#: 1 s of pcm16 at 24 kHz is 64 kB)
MAX_EVENT_CHARS = 1 << 20


def errors(code: str, message: str) -> list[Event]:
    """The gate's refusals (token, session limit) as a Realtime ``error`` event."""
    kind = "invalid_request_error" if code == "UNAUTHENTICATED" else "server_error"
    return [ServerEvents("refused").error(message, kind=kind, code=code.lower())]


async def serve(
    ws: WebSocket,
    client: AsrClient,
    session_id: str,
    metrics: BridgeMetrics,
    config: BridgeConfig,
) -> None:
    await RealtimeSession(ws, client, f"sess_{session_id}", metrics).run()


@dataclass
class RealtimeSession:
    websocket: WebSocket
    client: AsrClient
    session_id: str
    metrics: BridgeMetrics
    settings: TranscriptionSession = field(default_factory=TranscriptionSession)
    _stream: AudioStream | None = field(default=None, init=False)
    _downstream: asyncio.Task[None] | None = field(default=None, init=False)
    _send_lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)
    _uncommitted: bool = field(default=False, init=False)  # audio since the last commit
    #: a response came: a later failure of the stream was no refusal
    _heard_from_server: bool = field(default=False, init=False)
    #: writes on the stream, and KEEPALIVEs between presses of push-to-talk clients
    _keeper: StreamKeeper | None = field(default=None, init=False)
    _keeping: asyncio.Task[None] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.events = ServerEvents(self.session_id)
        # the beta protocol's clients (the SDKs' ``beta.realtime``) say so in a header; they
        # may wait for ``transcription_session.created`` before their first update
        beta = self.websocket.headers.get("openai-beta", "")
        self._beta_client = "realtime=v1" in beta.replace(" ", "").lower()
        # bounded by the server's pace, and ended by the client leaving
        self._writes = ClientWrites(self.websocket)

    async def run(self) -> None:
        logger.info("session %s: OpenAI Realtime transcription", self.session_id)
        try:
            if self._beta_client:  # beta events from the start, as OpenAI's beta API does
                self.events.ga = False
                created = self.events.event(
                    "transcription_session.created", session=self.settings.to_beta(self.session_id)
                )
            else:
                created = self.events.event(
                    "session.created", session=self.settings.to_ga(self.session_id)
                )
            await self._send([created])
            while True:
                try:
                    await self._handle(parse_client_event(await self._receive()))
                except RealtimeError as exc:  # not an event at all
                    await self._client_error(exc, None)
        except ClientGone:
            logger.info("session %s: client went away", self.session_id)
        except ServerFellBehind as exc:  # (before the socket's ping timeout, with a reason)
            logger.warning("session %s: %s", self.session_id, exc)
            self.metrics.session_errors.labels("RESOURCE_EXHAUSTED").inc()
            with contextlib.suppress(ClientGone):
                await self._send(
                    [self.events.error(str(exc), kind="server_error", code="resource_exhausted")]
                )
            await self._close(CLOSE_TRY_AGAIN_LATER, close_reason(str(exc)))
        except StreamClosedError as exc:
            if self._downstream is not None:
                # a write met the end of a stream the server had just ended: the relay
                # tells the client why and closes the socket
                with contextlib.suppress(ClientGone):
                    await self._downstream
            else:  # the stream never opened (the server is down, or refused it)
                await self._stream_failed(exc)
        finally:
            if self._keeping is not None:
                self._keeping.cancel()
            if self._stream is not None:
                self._stream.cancel()  # frees the server's stream
            if self._downstream is not None:
                self._downstream.cancel()
                with contextlib.suppress(asyncio.CancelledError, ClientGone):
                    await self._downstream

    async def _handle(self, event: ClientEvent) -> None:
        try:
            if event.type == "input_audio_buffer.append":
                await self._append(decode_audio(event, self.settings.frame_bytes))
            elif event.type in ("session.update", "transcription_session.update"):
                await self._update(event)
            elif event.type == "input_audio_buffer.commit":
                await self._commit(event)
            elif event.type == "input_audio_buffer.clear":
                await self._clear()
            else:
                raise RealtimeError(
                    f"unsupported event type {event.type!r} in a transcription session",
                    code="invalid_event",
                    param="type",
                )
        except RealtimeError as exc:
            await self._client_error(exc, event.event_id)

    async def _update(self, event: ClientEvent) -> None:
        updated = TranscriptionSession(**vars(self.settings))
        session = event.body.get("session")
        if event.type == "session.update":
            updated.update_ga(session)
        else:
            updated.update_beta(session)
        if self._stream is not None and updated.streaming_config() != (
            self.settings.streaming_config()
        ):
            raise RealtimeError(
                "the audio format, transcription and turn detection settings can only change "
                "before the first input_audio_buffer.append (open a new session instead)",
                code="session_update_after_audio",
                param="session",
            )
        self.settings = updated
        # the client's items are then described in the shape of the update it sent
        self.events.ga = event.type == "session.update"
        if event.type == "session.update":
            reply = self.events.event("session.updated", session=updated.to_ga(self.session_id))
        else:
            reply = self.events.event(
                "transcription_session.updated", session=updated.to_beta(self.session_id)
            )
        await self._send(self.events.in_order([reply]))

    async def _append(self, audio: bytes) -> None:
        if not audio:
            return
        if self._stream is None:
            await self._open()
        assert self._stream is not None
        # waits while the server pushes back
        await self._write(self._stream.send_audio(audio), self.settings.seconds(audio))
        self._uncommitted = True
        self.metrics.audio_received.inc(len(audio))

    async def _open(self) -> None:
        config = self.settings.streaming_config()
        stream = self.client.stream(config, on_resume=self._resumed)
        await stream.open()
        self._stream = stream
        self._downstream = asyncio.create_task(
            self._relay(stream), name=f"realtime-down-{self.session_id}"
        )
        # OpenAI keeps a session whose client sends nothing for minutes (push-to-talk
        # between presses); so does the bridge (keepalive.py)
        self._keeper = StreamKeeper(stream)
        self._keeping = asyncio.create_task(
            self._keeper.run(), name=f"realtime-alive-{self.session_id}"
        )
        logger.info(
            "session %s: stream opened (%s, %s)",
            self.session_id,
            self.settings.format,
            "server_vad" if self.settings.server_vad else "manual turns",
        )

    def _resumed(self, info: ResumeInfo) -> None:
        # called inside the relay's iteration, between the old call's responses and the
        # new one's: the speech the new call hears again continues the client's items
        self.events.resumed()
        self.metrics.resumes.inc()
        logger.info("session %s: %s", self.session_id, resume_notice(info))

    async def _commit(self, event: ClientEvent) -> None:
        if self._stream is None or not self._uncommitted:
            raise RealtimeError(
                "the input audio buffer is empty: append audio before committing",
                code="input_audio_buffer_commit_empty",
            )
        self.events.commit()  # before the FINALIZE: its acknowledgement may come at once
        await self._write(self._stream.finalize())  # the server ends the utterance: committed
        self._uncommitted = False

    async def _clear(self) -> None:
        # (after the answers to the commits before it, not after its own FINALIZE's)
        cleared = self.events.in_order([self.events.event("input_audio_buffer.cleared")])
        if self._stream is not None:
            self.events.clear()
            await self._write(self._stream.finalize())  # what follows starts a new utterance
        self._uncommitted = False
        await self._send(cleared)

    async def _write(self, write: Awaitable[object], audio_s: float = 0.0) -> None:
        """A write to the server, waiting on its backpressure while it keeps pace with the
        audio (asr_bridge.session.ClientWrites) and the client is there."""
        assert self._keeper is not None
        await self._writes.write(self._keeper.write(write), audio_s)

    async def _relay(self, stream: AudioStream) -> None:
        """Responses → server events; the stream's end or failure ends the session."""
        try:
            async for response in stream:
                self._heard_from_server = True
                if response.HasField("progress"):
                    self.metrics.server_lag.observe(response.progress.lag_s)
                await self._send(
                    self.events.response(
                        response,
                        server_vad=self.settings.server_vad,
                        margins_ms=self.settings.speech_margins_ms,
                    )
                )
        except StreamClosedError as exc:
            if exc.code == grpc.StatusCode.CANCELLED:
                return
            await self._stream_failed(exc)
            return
        await self._send(self.events.finish())
        await self._close(CLOSE_NORMAL, "done")

    async def _stream_failed(self, exc: StreamClosedError) -> None:
        """The gRPC stream failed (or never opened): an ``error`` event, then the close."""
        kind = "invalid_request_error" if exc.code.name in CLIENT_FAULTS else "server_error"
        logger.info("session %s: stream failed: %s", self.session_id, exc)
        self.metrics.session_errors.labels(exc.code.name).inc()
        self.metrics.stream_failed(exc.code, answered=self._heard_from_server)
        details = for_browser(exc.details, self.client.connection)
        close_code = close_code_for(exc.code.name)
        if exc.code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            # the server refused the bridge's own credentials, not the client's key: 1011,
            # as on /ws (not 4401), so that nobody is asked for a key they got right
            kind, close_code = "server_error", CLOSE_SERVER_ERROR
            details = f"the recognition server refused the bridge's credentials: {details}"
        with contextlib.suppress(ClientGone):
            await self._send([self.events.error(details, kind=kind, code=exc.code.name.lower())])
        await self._close(close_code, close_reason(details))

    async def _client_error(self, exc: RealtimeError, event_id: str | None) -> None:
        # the session goes on: not a session that ended with an error
        logger.info("session %s: client error: %s", self.session_id, exc)
        error = self.events.error(str(exc), code=exc.code, param=exc.param, event_id=event_id)
        await self._send(self.events.in_order([error]))

    async def _receive(self) -> str:
        message = await self.websocket.receive()
        if message["type"] == "websocket.disconnect":
            raise ClientGone
        if message.get("bytes") is not None:
            raise RealtimeError(
                "binary messages are not part of this API: send input_audio_buffer.append "
                "events with base64 audio",
                code="invalid_event",
            )
        text = message.get("text") or ""
        if len(text) > MAX_EVENT_CHARS:
            raise RealtimeError(f"an event of over {MAX_EVENT_CHARS} characters", code="too_large")
        return text

    async def _send(self, events: list[Event]) -> None:
        if events:
            async with self._send_lock:
                await send_events(self.websocket, events)

    async def _close(self, code: int, reason: str) -> None:
        await close_quietly(self.websocket, code, reason)
