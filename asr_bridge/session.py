"""One browser session: a WebSocket on one side, its own gRPC stream on the other.

Two tasks under one TaskGroup. *Upstream* reads a WebSocket message, and only once the
gRPC write of its audio has completed does it read the next: when the server pushes
back, this task stops reading, the WebSocket's TCP window fills, and the browser's
``bufferedAmount`` grows — nothing is queued here. *Downstream* turns gRPC responses
into JSON events; its sends wait for the socket too, so a browser that stops reading
pushes back on the server in turn. The browser leaving cancels the gRPC call, also while
a write waits on the server (``PeerWatch`` sees the socket close without reading it).

A server whose writes have fallen ``UPSTREAM_WRITE_DEADLINE_S`` behind the audio's own
time (one write that long, or many slower than the audio they carry: ``UpstreamPace``)
has fallen behind: the session ends with a ``RESOURCE_EXHAUSTED`` error and close 1013
(try again later). Without that bound the socket's keepalive would end it, with 1011 and
no reason: a client's pong waits unread behind the audio the bridge is not reading.
Every route's upstream (Deepgram's, Flux's and OpenAI Realtime's too) writes through
``ClientWrites``, which holds both rules.

Errors from the server reach the browser as an ``error`` event and a close code; those that
are the operator's to fix (the server refusing the bridge's credentials, the server
unreachable) are also logged as warnings.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field

import grpc
from starlette.websockets import WebSocket

from asr_api.v1 import asr_pb2
from asr_bridge.keepalive import StreamKeeper
from asr_bridge.metrics import BridgeMetrics
from asr_bridge.protocol import (
    CLOSE_NORMAL,
    CLOSE_SERVER_ERROR,
    CLOSE_TRY_AGAIN_LATER,
    Audio,
    Event,
    EventShape,
    EventWriter,
    Finalize,
    ProtocolError,
    Start,
    Stop,
    close_code_for,
    close_reason,
    event_writer,
    parse_binary,
    parse_text,
    streaming_config,
)
from asr_bridge.public_errors import for_browser
from asr_bridge.wire import ClientGone, PeerWatch, close_quietly, send_events
from asr_client import AsrClient, AudioStream, StreamClosedError
from asr_client.resume import OutageInfo, ResumeInfo, resume_notice

logger = logging.getLogger(__name__)

#: the longest one write to the server may wait on its backpressure before the session
#: ends, and how far all writes together may fall behind the audio's own time;
#: well under the socket's ping timeout (app.WS_PING_TIMEOUT_S), which would end it
#: first, without a reason, as the client's pong is not read while the writes wait
UPSTREAM_WRITE_DEADLINE_S = 20.0
FELL_BEHIND = "the server fell behind: it took no audio for {:g} s; try again later"
FELL_BEHIND_PACE = (
    "the server fell behind: it took audio slower than it came, until {:g} s behind; "
    "try again later"
)
#: how often a write waiting on the server looks whether the browser has left, and how
#: many looks apart it probes the socket (a probe is a ping, see wire.PeerWatch)
GONE_POLL_S = 0.1
PROBE_EVERY = 10


class ServerFellBehind(Exception):
    """A write to the server waited past ``UPSTREAM_WRITE_DEADLINE_S``, or the writes fell
    that far behind the audio."""

    def __init__(self, deadline_s: float, message: str = FELL_BEHIND) -> None:
        super().__init__(message.format(deadline_s))


async def unless_gone(peer: PeerWatch, write: Awaitable[None]) -> None:
    """Await ``write``, or raise ``ClientGone`` (the write cancelled) once the browser has
    left: while a write waits on the server nothing reads the socket, so its closing went
    unseen until the write ended, 20 s on if the server was stuck."""
    writing = asyncio.ensure_future(write)
    try:
        for tick in itertools.count():
            done, _ = await asyncio.wait((writing,), timeout=GONE_POLL_S)
            if done:
                return writing.result()
            if peer.gone():
                raise ClientGone
            if tick % PROBE_EVERY == 0:
                peer.probe()
    finally:
        writing.cancel()  # (a no-op once it is done)


async def within_write_deadline(write: Awaitable[object]) -> None:
    """Await ``write`` (to the server, or to what feeds it), for at most
    ``UPSTREAM_WRITE_DEADLINE_S``: one write's pace, for a write whose audio's length is
    not known (a container's bytes, before they are decoded)."""
    await UpstreamPace().write(write)


class UpstreamPace:
    """How far a session's writes to the server have fallen behind the audio's own time.

    A page sends in real time, so while a write waits, the page's next audio, and its
    pongs behind it, wait unread in TCP. Each write adds its wait less the audio it
    carried (never below 0: the server keeps up); past ``UPSTREAM_WRITE_DEADLINE_S``,
    whether in one write or over many slow ones, the server has fallen behind. (A page
    sending faster than real time is ahead by as much, which the sum does not count:
    it is never more behind than it says.)"""

    def __init__(self) -> None:
        self.bound_s = UPSTREAM_WRITE_DEADLINE_S  # read now, so that a test can shorten it
        self.behind_s = 0.0

    async def write(self, write: Awaitable[object], audio_s: float = 0.0) -> None:
        began = time.monotonic()
        try:
            async with asyncio.timeout(self.bound_s - self.behind_s):
                await write
        except TimeoutError:
            message = FELL_BEHIND_PACE if self.behind_s > 0 else FELL_BEHIND
            raise ServerFellBehind(self.bound_s, message) from None
        self.behind_s = max(0.0, self.behind_s + time.monotonic() - began - audio_s)


class ClientWrites:
    """The writes to the server of the task that reads a client's socket: bounded by the
    server's pace (``UpstreamPace``), and cancelled once the client has left (``ClientGone``:
    while a write waits, nothing reads the socket, so its closing is seen only by
    ``PeerWatch``). Every route's upstream writes through one of these."""

    def __init__(self, websocket: WebSocket) -> None:
        self.pace = UpstreamPace()
        self.peer = PeerWatch(websocket)

    async def write(self, write: Awaitable[object], audio_s: float = 0.0) -> None:
        """``write``, which carries ``audio_s`` of audio (0 for a command)."""
        await unless_gone(self.peer, self.pace.write(write, audio_s))

    async def write_unpaced(self, write: Awaitable[object]) -> None:
        """``write`` of data whose audio's length is not known: bounded on its own."""
        await unless_gone(self.peer, within_write_deadline(write))


@dataclass
class BridgeSession:
    websocket: WebSocket
    client: AsrClient
    session_id: str
    metrics: BridgeMetrics
    shape: EventShape | None = None  # from the query string; the start message may override
    start_timeout_s: float = 10.0
    _heard_from_server: bool = field(default=False, init=False)
    # resumes, and the causes of breaks being resumed from, to tell the client in order
    _resumes: list[ResumeInfo | str] = field(default_factory=list, init=False)
    _resume_noticed: asyncio.Event = field(default_factory=asyncio.Event, init=False)

    async def run(self) -> None:
        """Serve the session to its end; never raises for anything the peers do."""
        try:
            async with asyncio.timeout(self.start_timeout_s):
                start = await self._receive_start()
        except ClientGone:
            return
        except TimeoutError:
            await self._fail(
                event_writer(self.shape or "streamasr"),
                "INVALID_ARGUMENT",
                f"no start message within {self.start_timeout_s:g} s",
            )
            return
        except ProtocolError as exc:
            await self._fail(event_writer(self.shape or "streamasr"), "INVALID_ARGUMENT", str(exc))
            return
        events = event_writer(start.events or self.shape or "streamasr")
        logger.info(
            "session %s: started (%d Hz, %s events)",
            self.session_id,
            start.sample_rate,
            type(events).__name__,
        )
        stream = self.client.stream(
            streaming_config(start), on_resume=self._resumed, on_outage=self._outage
        )

        try:
            await self._relay(stream, events, start)
        finally:
            stream.cancel()  # a no-op once the call has ended; frees the server's stream if not

    async def _relay(self, stream: AudioStream, events: EventWriter, start: Start) -> None:
        try:
            await stream.open()
            await self._send(events.ready(self.session_id, start.sample_rate))
            # a push-to-talk page sends nothing between presses: the stream stays open while
            # the socket does (keepalive.py)
            keeper = StreamKeeper(stream)
            async with asyncio.TaskGroup() as tg:
                upstream = tg.create_task(
                    self._upstream(keeper, start.sample_rate), name=f"up-{self.session_id}"
                )
                keeping = tg.create_task(keeper.run(), name=f"alive-{self.session_id}")
                await self._downstream(stream, events)
                upstream.cancel()  # the server has ended the stream: nothing more to read
                keeping.cancel()
            await self._send(events.closed())
            await self._close(CLOSE_NORMAL, "done")
            logger.info("session %s: done", self.session_id)
        except* ClientGone:
            logger.info("session %s: browser went away", self.session_id)
        except* StreamClosedError as group:
            error = group.exceptions[0]
            assert isinstance(error, StreamClosedError)
            await self._server_failed(events, error)
        except* ProtocolError as group:
            await self._fail(events, "INVALID_ARGUMENT", str(group.exceptions[0]))
        except* ServerFellBehind as group:
            await self._fail(
                events,
                "RESOURCE_EXHAUSTED",
                str(group.exceptions[0]),
                close_code=CLOSE_TRY_AGAIN_LATER,
                level=logging.WARNING,
            )

    async def _receive_start(self) -> Start:
        message = await self._receive()
        if not isinstance(message, Start):
            raise ProtocolError('the first message must be {"type": "start", "sample_rate": …}')
        return message

    async def _upstream(self, keeper: StreamKeeper, sample_rate: int) -> None:
        stream = keeper.stream
        writes = ClientWrites(self.websocket)
        stopped = False
        while True:
            message = await self._receive()
            if stopped:
                raise ProtocolError(f"{type(message).__name__.lower()} after stop")
            if isinstance(message, Audio):
                # waits while the server pushes back (for a while)
                audio_s = len(message.pcm) / 2 / sample_rate
                await writes.write(keeper.write(stream.send_audio(message.pcm)), audio_s)
                self.metrics.audio_received.inc(len(message.pcm))
            elif isinstance(message, Finalize):
                await writes.write(keeper.write(stream.finalize()))
            elif isinstance(message, Stop):
                await writes.write(keeper.end())
                stopped = True  # keep reading: only to notice the browser leaving
            else:
                raise ProtocolError("start was already sent")

    def _outage(self, info: OutageInfo) -> None:
        # the same way as a resume: the page says it is reconnecting while results pause
        # (a stream no server has taken yet is still "connecting" on the page: not told)
        if not info.started:
            return
        logger.info(
            "session %s: connection to the server lost (%s); resuming", self.session_id, info.cause
        )
        self._resumes.append(for_browser(info.cause, self.client.connection))
        self._resume_noticed.set()

    def _resumed(self, info: ResumeInfo) -> None:
        # called inside the stream's iteration, which the downstream awaits: woken, it
        # sends the notice before the next event (it is the one task that writes events)
        self._resumes.append(info)
        self._resume_noticed.set()
        self.metrics.resumes.inc()
        logger.info("session %s: %s", self.session_id, resume_notice(info))

    async def _downstream(self, stream: AudioStream, events: EventWriter) -> None:
        responses = aiter(stream)
        while (response := await self._next_or_resumes(responses, events)) is not None:
            await self._send_resumes(events)
            self._heard_from_server = True
            if response.HasField("progress"):
                self.metrics.server_lag.observe(response.progress.lag_s)
            await self._send(events.response(response))

    async def _next_or_resumes(
        self, responses: AsyncIterator[asr_pb2.StreamingRecognizeResponse], events: EventWriter
    ) -> asr_pb2.StreamingRecognizeResponse | None:
        """The next response (None at the end); resume notices go out while it is awaited:
        a resume in a pause of the audio may come long before the server's next response."""
        receiving = asyncio.ensure_future(anext(responses, None))
        try:
            while not receiving.done():
                self._resume_noticed.clear()
                await self._send_resumes(events)
                noticed = asyncio.ensure_future(self._resume_noticed.wait())
                try:
                    await asyncio.wait((receiving, noticed), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    noticed.cancel()
        except BaseException:
            receiving.cancel()
            if receiving.done() and not receiving.cancelled():
                receiving.exception()  # (retrieved: the error being raised is the session's)
            raise
        return receiving.result()

    async def _send_resumes(self, events: EventWriter) -> None:
        while self._resumes:
            notice = self._resumes.pop(0)
            if isinstance(notice, ResumeInfo):
                await self._send(events.resumed(notice))
            else:
                await self._send(events.reconnecting(notice))

    async def _receive(self) -> Start | Audio | Finalize | Stop:
        message = await self.websocket.receive()
        if message["type"] == "websocket.disconnect":
            raise ClientGone
        if message.get("bytes") is not None:
            return parse_binary(message["bytes"])
        return parse_text(message.get("text") or "")

    async def _send(self, events: list[Event]) -> None:
        await send_events(self.websocket, events)

    async def _server_failed(self, events: EventWriter, error: StreamClosedError) -> None:
        code = error.code
        self.metrics.stream_failed(code, answered=self._heard_from_server)
        logger.info("session %s: stream failed: %s", self.session_id, error)
        details = for_browser(error.details, self.client.connection)
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            # The bridge's own credentials were refused, not the browser's token: 1011, not
            # 4401, so that a page does not ask its user for a token they got right.
            await self._fail(
                events,
                code.name,
                f"the recognition server refused the bridge's credentials: {details}",
                close_code=CLOSE_SERVER_ERROR,
                level=logging.WARNING,
            )
            return
        # UNAVAILABLE is the server down or unreachable, or TLS to it failing: the operator's
        level = logging.WARNING if code == grpc.StatusCode.UNAVAILABLE else logging.INFO
        await self._fail(events, code.name, details, level=level)

    async def _fail(
        self,
        events: EventWriter,
        code: str,
        message: str,
        *,
        close_code: int | None = None,
        level: int = logging.INFO,
    ) -> None:
        """Tell the browser what went wrong, readably, then close with a matching code."""
        logger.log(level, "session %s: error %s: %s", self.session_id, code, message)
        self.metrics.session_errors.labels(code).inc()
        try:
            await self._send(events.error(code, message))
        except ClientGone:
            return
        if close_code is None:
            close_code = close_code_for(code)
        await self._close(close_code, close_reason(f"{code}: {message}"))

    async def _close(self, code: int, reason: str) -> None:
        await close_quietly(self.websocket, code, reason)
