"""One Deepgram Flux session: a ``/v2/listen`` WebSocket on one side, its gRPC stream
(SEMANTIC endpointing) on the other.

The relay is the Deepgram route's (``deepgram_session.DeepgramRelay``: backpressure,
CloseStream, resume on a broken call, errors and closes); this module adds Flux's
messages: ``Connected`` first, ``TurnInfo`` from ``flux.FluxTurns``, ``sequence_id`` on
everything sent, ``ForceEndTurn`` as the server's FINALIZE, and Flux's ``Warning`` and
``Error`` shapes.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from starlette.websockets import WebSocket

from asr_api.v1 import asr_pb2
from asr_bridge.container import DecodedFormat
from asr_bridge.deepgram import AudioFramer, Event, ListenOptions, SchemaError
from asr_bridge.deepgram_session import (
    AudioSink,
    ContainerRelay,
    DeepgramRelay,
    accept,
    query_or_refusal,
)
from asr_bridge.flux import (
    CloseStream,
    Configure,
    ConfigureError,
    FluxOptions,
    FluxTurns,
    ForceEndTurn,
    KeepAlive,
    fatal_error,
    parse_flux_query,
    parse_text,
    streaming_config,
)
from asr_bridge.metrics import BridgeMetrics
from asr_client import AsrClient
from asr_client.resume import ResumeInfo

if TYPE_CHECKING:
    from asr_bridge.app import BridgeConfig

logger = logging.getLogger(__name__)


async def serve(
    ws: WebSocket, client: AsrClient, session_id: str, metrics: BridgeMetrics, config: BridgeConfig
) -> None:
    """``app.ServeSession`` for ``/v2/listen``: check the query, accept, relay."""
    options = await query_or_refusal(ws, session_id, metrics, parse_flux_query)
    if options is None:
        return
    turns = FluxTurns(options)
    await accept(ws, turns.request_id, ws.scope.get("subprotocols", []))
    session = FluxContainerSession if options.encoding is None else FluxSession
    await session(ws, client, session_id, metrics, options, turns).run()


class FluxSession(DeepgramRelay):
    def __init__(
        self,
        websocket: WebSocket,
        client: AsrClient,
        session_id: str,
        metrics: BridgeMetrics,
        options: FluxOptions,
        turns: FluxTurns,
    ) -> None:
        super().__init__(websocket, client, session_id, metrics, options.audio())
        self.options = options
        self.turns = turns

    def _describe(self) -> str:
        o = self.options
        return f"Deepgram Flux ({o.model}, {o.encoding}, {o.sample_rate} Hz)"

    def _config(self) -> asr_pb2.StreamingConfig:
        return streaming_config(self.options)

    def _opening(self) -> list[Event]:
        return self.turns.connected()

    def _messages(self, response: asr_pb2.StreamingRecognizeResponse) -> list[Event]:
        return self.turns.response(response)

    def _closing(self) -> list[Event]:
        return self.turns.closing()

    def _resumed(self, info: ResumeInfo) -> None:
        # told before the new call's first response: its replay continues the turn
        super()._resumed(info)
        self.turns.resumed()

    def _stamp(self, events: list[Event]) -> list[Event]:
        return self.turns.stamp(events)

    def _error(self, description: str, variant: str) -> Event:
        # Flux's Error has a code and a description; the close reason keeps Deepgram's
        # DATA-0000 / NET-0000 variant
        code = "INVALID_ARGUMENT" if variant == "DATA-0000" else "INTERNAL_SERVER_ERROR"
        return fatal_error(code, description)

    async def _command(self, stream: AudioSink, text: str) -> None:
        try:
            command = parse_text(text)
        except SchemaError as exc:
            # a warning, and the stream goes on: the audio already sent is still transcribed
            logger.info("session %s: refused a text message: %s", self.session_id, exc)
            await self._send([self.turns.warning("UNPARSABLE_CLIENT_MESSAGE", str(exc))])
            return
        if isinstance(command, ForceEndTurn):
            await self._write_command(stream.finalize())
        elif isinstance(command, CloseStream):
            await self._close_stream(stream)
        elif isinstance(command, Configure):
            ignored = self.turns.eager_ignored()
            try:
                update, success = self.turns.configure(command)
            except ConfigureError as exc:
                await self._send([self.turns.configure_failure(exc)])
                return
            await self._write_command(stream.update(update))  # in order with the audio around it
            # warned once: when the Configure made the eager threshold useless
            await self._send([success, *([] if ignored else self.turns.eager_ignored())])
        else:
            assert isinstance(command, KeepAlive)
            # the gRPC stream stays open through the pause
            await self._write_command(stream.keep_alive())


class FluxContainerSession(ContainerRelay, FluxSession):
    """A ``/v2/listen`` session sending a container (WAV, Ogg, WebM…), decoded by the
    bridge; Flux hears one channel, so a stereo container is mixed down."""

    def _describe(self) -> str:
        return f"Deepgram Flux ({self.options.model}, a container, decoded by the bridge)"

    def _use_format(self, decoded: DecodedFormat) -> None:
        self.options = self.options.decoded(decoded.sample_rate)
        self.framer = AudioFramer(
            ListenOptions(sample_rate=decoded.sample_rate, channels=decoded.channels)
        )
