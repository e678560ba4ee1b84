"""The ``asr.v1.Recognizer`` servicer: admission, config, and errors at the boundary.

StreamingRecognize uses the explicit ``context.read()`` / ``context.write()`` API so
that reading (and so HTTP/2 flow control) is driven by the session's reader task,
independently of inference and writing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from asr_api.v1 import asr_pb2, asr_pb2_grpc
from asr_server.audio.decode import partial_frame_error
from asr_server.engine.scheduler import EngineError
from asr_server.errors import AsrError, Status
from asr_server.log import client_var, stream_id_var
from asr_server.session import (
    ConfigUpdate,
    Finalize,
    OutEvent,
    Progress,
    RecognitionResult,
    SessionServices,
    StreamConfig,
    StreamSession,
)
from asr_server.transport.admission import (
    Admission,
    AdmissionRefused,
    Ticket,
    retry_pushback,
)
from asr_server.transport.convert import (
    event_to_proto,
    result_to_proto,
    stream_config_from_proto,
    stream_update_from_proto,
)
from asr_server.transport.decoding import Undecodable
from asr_server.transport.interceptors import ANONYMOUS, Identity, identity_var
from asr_server.transport.reads import read_within
from asr_server.transport.status import ENDED_BY_SERVER, GRPC_CODES, end_by_server

logger = logging.getLogger(__name__)

#: audio bytes per chunk when Recognize feeds a whole file through the streaming pipeline
RECOGNIZE_CHUNK_S = 1.0
#: response header sent the moment a stream is admitted (its value: the server's stream id,
#: as in its logs). A stream ended without it was refused and can be made again as it was;
#: it also commits the call: no retry (grpc's, or a proxy's) ever replays an admitted stream.
ADMITTED_HEADER = "asr-stream-id"
#: sent with it: the seconds without a message after which the server ends the stream
#: (idle_timeout_s), so that a client keeping a quiet stream open (the bridge, between a
#: push-to-talk page's presses) sends its KEEPALIVEs often enough for this server
IDLE_TIMEOUT_HEADER = "asr-idle-timeout-s"
#: how long before a drain's deadline the calls still open are ended with a status, so that
#: it is sent before gRPC's own stop cancels them (half the drain, for one under a second)
DRAIN_CUT_LEAD_S = 0.5
#: how long a read that ended before the config waits to learn whether the call was
#: cancelled (cancelled_soon); a client that half-closed without one waits that much longer
CANCEL_SETTLE_S = 0.1


class ClientLeft(Exception):
    """The client cancelled its call while a response to it was being written, or before
    it sent its config: counted as the client's leaving (CANCELLED), as any other, not as a
    server error (INTERNAL) or the client's (INVALID_ARGUMENT)."""


def response_writer(
    context: grpc.aio.ServicerContext, offset_s: float
) -> Callable[[OutEvent, Progress], Awaitable[None]]:
    """A stream's ``send``: each event written to the call. A write that fails because the
    client cancelled the call meanwhile raises ClientLeft (grpc says only that an
    "execute_batch" failed, which was logged and counted as a server error)."""

    async def send(event: OutEvent, progress: Progress) -> None:
        try:
            await context.write(event_to_proto(event, progress, offset_s))
        except Exception:
            if context.cancelled() or context.done():
                raise ClientLeft from None
            raise

    return send


async def cancelled_soon(context: grpc.aio.ServicerContext) -> bool:
    """Whether a call whose read has just ended is cancelled, not half-closed: a read ends
    alike either way, and the call is now and then marked cancelled only a moment after
    (11 of 24 clients cancelling before their config were counted INVALID_ARGUMENT, as if
    they had half-closed without one). Waits up to CANCEL_SETTLE_S for the mark."""
    deadline = asyncio.get_running_loop().time() + CANCEL_SETTLE_S
    while not (context.cancelled() or context.done()):
        if asyncio.get_running_loop().time() >= deadline:
            return False
        await asyncio.sleep(CANCEL_SETTLE_S / 10)
    return True


def drain_cut_after(timeout_s: float) -> float:
    """When a drain of ``timeout_s`` ends the calls still open: what GoingAway tells them."""
    return timeout_s - min(DRAIN_CUT_LEAD_S, timeout_s / 2)


class RecognizerServicer(asr_pb2_grpc.RecognizerServicer):
    def __init__(
        self,
        services: SessionServices | None,
        *,
        admission: Admission,
        model_name: str,
        languages: frozenset[str] | None,
    ) -> None:
        self.services = services  # None until the model is loaded
        self.admission = admission
        self.model_name = model_name
        self.languages = languages
        self.draining = False
        #: (loop time the drain began, its timeout): streams seated later are told too
        self._drain: tuple[float, float] | None = None
        self._ids = itertools.count(1)
        self._sessions: set[StreamSession] = set()
        self._calls: set[asyncio.Task[Any]] = set()  # the tasks of the calls open now

    def going_away(self, deadline_s: float) -> int:
        """Draining: refuse new calls and tell every open stream when it will be cut.

        Clients move to another replica at their next utterance boundary (a resume);
        returns how many streams were told."""
        self.draining = True
        self._drain = (asyncio.get_running_loop().time(), drain_cut_after(deadline_s))
        for session in self._sessions:
            self._tell_going_away(session)
        return len(self._sessions)

    def _tell_going_away(self, session: StreamSession) -> None:
        assert self._drain is not None
        began, timeout_s = self._drain
        left_s = max(0.0, timeout_s - (asyncio.get_running_loop().time() - began))
        session.going_away(
            left_s, "server is shutting down; continue the stream on another replica"
        )

    def end_open_calls(self, message: str) -> int:
        """End every open call with UNAVAILABLE and ``message`` (a drain's deadline):
        grpc's own stop cancelled them, and they counted as streams their clients had left
        (CANCELLED), their clients told only "Cancelling all calls"."""
        return end_by_server(self._calls, grpc.StatusCode.UNAVAILABLE, message)

    def end_calls_left_behind(self) -> set[asyncio.Task[Any]]:
        """Cancel the handlers still running after gRPC's stop (calls its core no longer
        holds: their clients left, and nothing can be sent on them); their tasks."""
        left = set(self._calls)
        for task in left:
            task.cancel()
        return left

    @property
    def active(self) -> int:
        """Open calls, configured or still waiting for their config."""
        return self.admission.open_calls

    # -- RPCs -----------------------------------------------------------------------------

    async def StreamingRecognize(self, request_iterator, context):  # type: ignore[no-untyped-def] # noqa: N802
        stream_id = f"s{next(self._ids)}"

        async def stream(services: SessionServices, ticket: Ticket) -> None:
            timeout_s = services.settings.config_timeout_s
            first = await read_within(
                context,
                timeout_s,
                lambda: self._timed_out(
                    "config",
                    f"no config within {timeout_s:g} s: send the StreamingConfig as the "
                    "first message",
                ),
            )
            if first is grpc.aio.EOF and await cancelled_soon(context):
                raise ClientLeft  # a gateway hanging up before the first audio, say
            config = self._config_of(first, services)
            ticket.seat()
            admitted_at = asyncio.get_running_loop().time()
            await context.send_initial_metadata(
                (
                    (ADMITTED_HEADER, stream_id),
                    (IDLE_TIMEOUT_HEADER, f"{services.settings.idle_timeout_s:g}"),
                )
            )
            session = StreamSession(config, services, stream_id)
            if config.resume is None:
                logger.info("stream %s opened: %s", stream_id, config.format)
            else:
                logger.info(
                    "stream %s opened: %s, resuming session %r at %.2f s",
                    stream_id,
                    config.format,
                    config.resume.session_id,
                    config.resume.offset_s,
                )
            offset_s = config.time_offset_s

            send = response_writer(context, offset_s)
            self._sessions.add(session)
            if self._drain is not None:
                # admitted before the drain began, seated after it: told as the others were
                self._tell_going_away(session)
            try:
                requests = self._requests(context, services, config)
                await session.run(requests, send, admitted_at=admitted_at)
            finally:
                self._sessions.discard(session)

        await self._serve_call(stream_id, context, stream)

    async def Recognize(self, request_iterator, context):  # type: ignore[no-untyped-def] # noqa: N802
        """Registered stream-unary (transport/decoding.py): its one message is read here,
        once the call is admitted (a pending slot) and within ``idle_timeout_s``."""
        call_id = f"r{next(self._ids)}"
        response = asr_pb2.RecognizeResponse()

        async def recognize(services: SessionServices, ticket: Ticket) -> None:
            timeout_s = services.settings.idle_timeout_s
            request = await read_within(
                context,
                timeout_s,
                lambda: self._timed_out("request", f"no RecognizeRequest within {timeout_s:g} s"),
            )
            if request is grpc.aio.EOF:
                raise AsrError.invalid("Recognize needs one RecognizeRequest; none was sent")
            if isinstance(request, Undecodable):
                raise AsrError.invalid(request.reason)
            config = self._supported(
                stream_config_from_proto(
                    request.config,
                    services.settings,
                    model_name=self.model_name,
                    languages=self.languages,
                ),
                services,
            )
            ticket.seat()
            # finals only: the whole file is known, partials would be wasted work
            config = dataclasses.replace(config, interim_results=False)
            session = StreamSession(config, services, call_id)
            fmt = config.format
            # whole frames, and never more than a streaming client may send in one message
            # (48 kHz 8-channel FLOAT32 is 1.5 MB a second, over the default 1 MiB)
            frames = min(
                int(fmt.sample_rate_hz * RECOGNIZE_CHUNK_S),
                services.settings.streaming.max_audio_message_bytes // fmt.frame_bytes,
            )
            chunk = frames * fmt.frame_bytes
            audio = request.audio
            partial = partial_frame_error(len(audio), fmt, "audio")  # the file, not a chunk
            if partial:
                raise AsrError.invalid(partial)
            results: list[RecognitionResult] = []

            async def chunks() -> AsyncIterator[bytes]:
                for i in range(0, len(audio), chunk):
                    yield audio[i : i + chunk]

            async def collect(event: OutEvent, progress: Progress) -> None:
                if isinstance(event, RecognitionResult) and event.is_final:
                    results.append(event)

            await session.run(chunks(), collect)
            results.sort(key=lambda r: (r.start_s, r.channel))
            # on the stream clock of a ResumeFrom, as a stream's results are
            response.results.extend(result_to_proto(r, config.time_offset_s) for r in results)
            response.duration_s = len(audio) / fmt.frame_bytes / fmt.sample_rate_hz

        await self._serve_call(call_id, context, recognize)
        return response

    # -- helpers --------------------------------------------------------------------------

    async def _serve_call(
        self,
        call_id: str,
        context: grpc.aio.ServicerContext,
        body: Callable[[SessionServices, Ticket], Awaitable[None]],
    ) -> None:
        """Admit the call, run ``body``, and turn any failure into one clear status."""
        stream_id_var.set(call_id)
        # the interceptor has identified the caller; a servicer mounted without it (tests)
        # treats every caller as anonymous
        identity = identity_var.get() or Identity(f"ip:{context.peer()}", ANONYMOUS, False)
        client_var.set(identity.name)
        error: AsrError | None = None
        outcome = "OK"
        handler_ended = self.admission.until_answered(identity, context)
        task = asyncio.current_task()
        assert task is not None  # (a handler runs in its call's task)
        self._calls.add(task)
        try:
            services = self._ready_services()
            with self.admission.call(identity) as ticket:
                try:
                    await body(services, ticket)
                finally:
                    logger.info("call %s finished", call_id)
        except asyncio.CancelledError:  # the client went away, or the drain ended the call
            # (or the server did, as for a revoked token or at the drain's deadline: counted
            # with the status it gets)
            ended = ENDED_BY_SERVER.get(task)
            outcome = ended[0].name if ended else "CANCELLED"
            if ended:  # an error, as one this servicer aborts with (the interceptor does)
                self._count_error(outcome, ended[1])
            self.admission.metrics.streams.labels(outcome).inc()
            raise
        except ClientLeft:
            outcome = "CANCELLED"
        except AsrError as exc:
            error = exc
        except EngineError:
            error = self._internal("recognition engine failed")
        except Exception:
            error = self._internal("unexpected server error")
        finally:
            self._calls.discard(task)
        self.admission.metrics.streams.labels(error.status.value if error else outcome).inc()
        handler_ended()  # (the abort below only raises, to end the call with its status)
        if error is not None:
            # refused before anything was written back: the client may retry elsewhere
            trailing = retry_pushback() if isinstance(error, AdmissionRefused) else ()
            await self._abort(context, error, trailing)

    def _ready_services(self) -> SessionServices:
        if self.draining:
            self.admission.metrics.refused_streams.labels("draining").inc()
            raise AdmissionRefused(
                Status.UNAVAILABLE, "server is shutting down; reconnect elsewhere"
            )
        if self.services is None:
            self.admission.metrics.refused_streams.labels("loading").inc()
            raise AdmissionRefused(Status.UNAVAILABLE, "model is still loading; retry shortly")
        return self.services

    def _timed_out(self, kind: str, message: str) -> AsrError:
        self.admission.metrics.stream_timeouts.labels(kind).inc()
        return AsrError(Status.DEADLINE_EXCEEDED, message)

    def _config_of(self, first: object, services: SessionServices):  # type: ignore[no-untyped-def]
        if first is grpc.aio.EOF:
            raise AsrError.invalid("stream closed before a config was sent")
        if isinstance(first, Undecodable):
            raise AsrError.invalid(first.reason)
        kind = first.WhichOneof("request")  # type: ignore[attr-defined]
        if kind != "config":
            raise AsrError.precondition(
                f"the first message must be a config, got {kind or 'an empty request'}"
            )
        config = stream_config_from_proto(
            first.config,  # type: ignore[attr-defined]
            services.settings,
            model_name=self.model_name,
            languages=self.languages,
        )
        return self._supported(config, services)

    def _supported(self, config: StreamConfig, services: SessionServices) -> StreamConfig:
        """What the config asks of the engine, it can do (EngineCapabilities)."""
        if config.semantic and services.turn is None:
            raise AsrError.precondition(
                f"config.endpointing.mode SEMANTIC is not available: {services.turn_unavailable}"
            )
        if config.word_timestamps and not services.scheduler.engine.capabilities.word_timestamps:
            raise AsrError.invalid(
                f"model {self.model_name!r} gives no word timestamps: leave word_timestamps off"
            )
        return config

    async def _requests(  # type: ignore[no-untyped-def]
        self, context, services: SessionServices, config: StreamConfig
    ) -> AsyncIterator[bytes | Finalize | ConfigUpdate]:
        """The stream's requests after its config; ``config``: the stream's, which each
        update changes."""
        idle_s = services.settings.idle_timeout_s

        def idle() -> AsrError:
            return self._timed_out(
                "idle",
                f"no message for {idle_s:g} s: keep sending audio (silence included) or "
                "KEEPALIVE controls, or half-close the stream",
            )

        while True:
            request = await read_within(context, idle_s, idle)
            if request is grpc.aio.EOF:
                return
            if isinstance(request, Undecodable):
                raise AsrError.invalid(request.reason)
            kind = request.WhichOneof("request")
            if kind == "audio":
                yield request.audio
            elif kind == "control":
                control = request.control
                if control.action == asr_pb2.Control.KEEPALIVE:
                    continue  # its arrival has reset the idle timer: nothing else to do
                if control.action != asr_pb2.Control.FINALIZE:
                    raise AsrError.invalid("control.action must be FINALIZE or KEEPALIVE")
                yield Finalize(control.channel if control.HasField("channel") else None)
            elif kind == "update":
                config = stream_update_from_proto(request.update, config, services.settings)
                yield ConfigUpdate(config)
            elif kind == "config":
                raise AsrError.precondition("config was already sent; send it once, first")
            else:
                raise AsrError.invalid("empty request: set config, audio, control or update")

    def _internal(self, what: str) -> AsrError:
        error_id = uuid.uuid4().hex[:12]
        logger.exception("%s (error id %s)", what, error_id)
        return AsrError(Status.INTERNAL, f"{what}; error id {error_id}")

    async def _abort(  # type: ignore[no-untyped-def]
        self, context, error: AsrError, trailing: tuple[tuple[str, str], ...] = ()
    ) -> None:
        self._count_error(error.status.value, error)
        await context.abort(GRPC_CODES[error.status], error.message, trailing)

    def _count_error(self, code: str, message: object) -> None:
        """A call that ends with an error status: counted and logged, once."""
        self.admission.metrics.stream_errors.labels(code).inc()
        logger.info("call %s ended with %s: %s", stream_id_var.get(), code, message)
