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

import grpc

from asr_api.v1 import asr_pb2, asr_pb2_grpc
from asr_server.engine.scheduler import EngineError
from asr_server.errors import AsrError, Status
from asr_server.log import stream_id_var
from asr_server.session import (
    Finalize,
    OutEvent,
    Progress,
    RecognitionResult,
    SessionServices,
    StreamSession,
)
from asr_server.transport.admission import retry_pushback
from asr_server.transport.convert import event_to_proto, result_to_proto, stream_config_from_proto
from asr_server.transport.status import GRPC_CODES

logger = logging.getLogger(__name__)

#: audio bytes per chunk when Recognize feeds a whole file through the streaming pipeline
RECOGNIZE_CHUNK_S = 1.0


class RecognizerServicer(asr_pb2_grpc.RecognizerServicer):
    def __init__(
        self,
        services: SessionServices | None,
        *,
        model_name: str,
        languages: frozenset[str] | None,
    ) -> None:
        self.services = services  # None until the model is loaded
        self.model_name = model_name
        self.languages = languages
        self.draining = False
        self.active = 0
        self._ids = itertools.count(1)

    # -- RPCs -----------------------------------------------------------------------------

    async def StreamingRecognize(self, request_iterator, context):  # type: ignore[no-untyped-def] # noqa: N802
        stream_id = f"s{next(self._ids)}"

        async def stream(services: SessionServices) -> None:
            config = self._config_of(await context.read(), services)
            session = StreamSession(config, services, stream_id)
            logger.info("stream %s opened: %s", stream_id, config.format)

            async def send(event: OutEvent, progress: Progress) -> None:
                await context.write(event_to_proto(event, progress))

            await session.run(self._requests(context), send)

        await self._serve_call(stream_id, context, stream)

    async def Recognize(self, request, context):  # type: ignore[no-untyped-def] # noqa: N802
        call_id = f"r{next(self._ids)}"
        response = asr_pb2.RecognizeResponse()

        async def recognize(services: SessionServices) -> None:
            config = stream_config_from_proto(
                request.config,
                services.settings,
                model_name=self.model_name,
                languages=self.languages,
            )
            # finals only: the whole file is known, partials would be wasted work
            config = dataclasses.replace(config, interim_results=False)
            session = StreamSession(config, services, call_id)
            fmt = config.format
            chunk = int(fmt.sample_rate_hz * RECOGNIZE_CHUNK_S) * fmt.frame_bytes
            audio = request.audio
            results: list[RecognitionResult] = []

            async def chunks() -> AsyncIterator[bytes]:
                for i in range(0, len(audio), chunk):
                    yield audio[i : i + chunk]

            async def collect(event: OutEvent, progress: Progress) -> None:
                if isinstance(event, RecognitionResult) and event.is_final:
                    results.append(event)

            await session.run(chunks(), collect)
            results.sort(key=lambda r: (r.start_s, r.channel))
            response.results.extend(result_to_proto(r) for r in results)
            response.duration_s = len(audio) / fmt.frame_bytes / fmt.sample_rate_hz

        await self._serve_call(call_id, context, recognize)
        return response

    # -- helpers --------------------------------------------------------------------------

    async def _serve_call(
        self,
        call_id: str,
        context: grpc.aio.ServicerContext,
        body: Callable[[SessionServices], Awaitable[None]],
    ) -> None:
        """Admit the call, run ``body``, and turn any failure into one clear status."""
        stream_id_var.set(call_id)
        error: AsrError | None = None
        admitted = False
        try:
            services = self._admit()
            admitted = True
            self._enter(services)
            try:
                await body(services)
            finally:
                self._leave(services)
                logger.info("call %s finished", call_id)
        except AsrError as exc:
            error = exc
        except EngineError:
            error = self._internal("recognition engine failed")
        except Exception:
            error = self._internal("unexpected server error")
        if error is not None:
            # Refused before reading or writing anything: safe to retry on another replica.
            await self._abort(context, error, () if admitted else retry_pushback())

    def _admit(self) -> SessionServices:
        if self.draining:
            raise AsrError(Status.UNAVAILABLE, "server is shutting down; reconnect elsewhere")
        if self.services is None:
            raise AsrError(Status.UNAVAILABLE, "model is still loading; retry shortly")
        limit = self.services.settings.max_streams
        if self.active >= limit:
            raise AsrError(
                Status.RESOURCE_EXHAUSTED,
                f"server is at its limit of {limit} concurrent streams; retry later",
            )
        return self.services

    def _enter(self, services: SessionServices) -> None:
        self.active += 1
        services.metrics.active_streams.set(self.active)

    def _leave(self, services: SessionServices) -> None:
        self.active -= 1
        services.metrics.active_streams.set(self.active)

    def _config_of(self, first: object, services: SessionServices):  # type: ignore[no-untyped-def]
        if first is grpc.aio.EOF:
            raise AsrError.invalid("stream closed before a config was sent")
        kind = first.WhichOneof("request")  # type: ignore[attr-defined]
        if kind != "config":
            raise AsrError.precondition(
                f"the first message must be a config, got {kind or 'an empty request'}"
            )
        return stream_config_from_proto(
            first.config,  # type: ignore[attr-defined]
            services.settings,
            model_name=self.model_name,
            languages=self.languages,
        )

    @staticmethod
    async def _requests(context) -> AsyncIterator[bytes | Finalize]:  # type: ignore[no-untyped-def]
        while True:
            # Shielded: cancelling a read that grpc has in flight can break the call, and
            # the client would see "Internal error from Core" instead of our status.
            request = await asyncio.shield(context.read())
            if request is grpc.aio.EOF:
                return
            kind = request.WhichOneof("request")
            if kind == "audio":
                yield request.audio
            elif kind == "control":
                if request.control.action != asr_pb2.Control.FINALIZE:
                    raise AsrError.invalid("control.action must be FINALIZE")
                yield Finalize()
            elif kind == "config":
                raise AsrError.precondition("config was already sent; send it once, first")
            else:
                raise AsrError.invalid("empty request: set config, audio or control")

    def _internal(self, what: str) -> AsrError:
        error_id = uuid.uuid4().hex[:12]
        logger.exception("%s (error id %s)", what, error_id)
        return AsrError(Status.INTERNAL, f"{what}; error id {error_id}")

    async def _abort(  # type: ignore[no-untyped-def]
        self, context, error: AsrError, trailing: tuple[tuple[str, str], ...] = ()
    ) -> None:
        if self.services is not None:
            self.services.metrics.stream_errors.labels(error.status.value).inc()
        logger.info("call %s ended with %s: %s", stream_id_var.get(), error.status.value, error)
        await context.abort(GRPC_CODES[error.status], error.message, trailing)
