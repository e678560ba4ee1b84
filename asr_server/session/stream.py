"""A stream session: named reader, per-channel processor and writer tasks in one TaskGroup.

The session is transport-agnostic: it pulls requests (``bytes`` of audio or
``Finalize``) from an async iterator and hands events to an async ``send``. The
reader decodes audio onto each channel's bounded inbox and stops pulling when
an inbox is full; processors turn audio into events; the writer sends them from
a bounded queue, attaching the current progress (how far behind the server is).
A client disconnect cancels the TaskGroup; ``finally`` blocks release the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass

from asr_server.audio.decode import (
    SAMPLE_RATE,
    AudioDecoder,
    AudioFormatError,
    partial_frame_error,
)
from asr_server.engine.scheduler import EngineScheduler
from asr_server.errors import AsrError, Status
from asr_server.metrics import Metrics
from asr_server.session.carry import ReplayedFinal
from asr_server.session.channel import TRAILING_PAD_S, ChannelRecognizer
from asr_server.session.inbox import AudioChunk, AudioInbox, EndOfAudio, now
from asr_server.session.types import (
    ConfigUpdate,
    Finalize,
    GoingAway,
    OutEvent,
    Progress,
    ProgressReport,
    StreamConfig,
    StreamDone,
)
from asr_server.settings import Settings
from asr_server.vad.base import SpeechCheck, VoiceDetector
from asr_server.vad.endpointer import Endpointer, EndpointerConfig
from asr_server.vad.factory import make_voice_detector
from asr_server.vad.turn import TurnDetection

logger = logging.getLogger(__name__)

Send = Callable[[OutEvent, Progress], Awaitable[None]]

#: how long a stream being torn down waits for an in-flight write to complete
WRITE_GRACE_S = 5.0


@dataclass(frozen=True)
class SessionServices:
    """What every session shares: built once by the app, passed down explicitly."""

    settings: Settings
    scheduler: EngineScheduler
    metrics: Metrics
    #: builds one channel's voice detector; None = the configured webrtc/silero detector
    vad_factory: Callable[[], VoiceDetector] | None = None
    #: the semantic end-of-turn model; None: SEMANTIC streams are refused, with this reason
    turn: TurnDetection | None = None
    turn_unavailable: str = "semantic end of turn is not set up on this server"
    #: a second opinion on whether a short sound in a pause was speech (Silero, in the
    #: server); None: an early final that such a sound broke is always decoded again
    speech_check: SpeechCheck | None = None


class _Closed:
    """Writer sentinel: every processor has finished."""


class StreamSession:
    def __init__(self, config: StreamConfig, services: SessionServices, stream_id: str) -> None:
        self.config = config
        self.services = services
        self.stream_id = stream_id
        s = services.settings
        self._decoder = AudioDecoder(config.format)
        # events with the progress as of their making: a writer that runs later would see
        # the channel caught up and hide how far behind the server was
        self._out: asyncio.Queue[tuple[OutEvent, Progress] | _Closed] = asyncio.Queue(
            s.streaming.result_queue_size
        )
        max_samples = int(s.streaming.max_buffered_audio_s * SAMPLE_RATE)
        fmt = config.format
        self._piece_bytes = max(1, fmt.sample_rate_hz * max_samples // SAMPLE_RATE // 2) * (
            fmt.frame_bytes
        )
        self._inboxes = [
            AudioInbox(max_samples, on_change=self._buffered_changed)
            for _ in range(config.format.channels)
        ]
        self._buffered_samples = 0
        resume = config.resume
        # per channel, its last final as the client replays it, to carry into the next
        self._replayed_finals = [
            ReplayedFinal(*previous)
            if resume and (previous := resume.channel(c).previous_samples)
            else None
            for c in range(config.format.channels)
        ]
        self._delivered = 0  # samples per channel handed to the channels so far
        #: the settled point the client was last told (with any response)
        self._told_settled_s = 0.0
        self._channels: list[ChannelRecognizer] = []
        self._partial_tasks: set[asyncio.Task[None]] = set()

    def _buffered_changed(self, n: int) -> None:
        self._buffered_samples += n
        self.services.metrics.add_buffered_samples(n, SAMPLE_RATE)

    @property
    def progress(self) -> Progress:
        received = self._decoder.input_samples / self.config.format.sample_rate_hz
        processed = min((c.position for c in self._channels), default=0) / SAMPLE_RATE
        settled = min((c.settled_sample for c in self._channels), default=0) / SAMPLE_RATE
        return Progress(received, min(processed, received), min(settled, processed, received))

    async def run(
        self,
        requests: AsyncIterator[bytes | Finalize | ConfigUpdate],
        send: Send,
        *,
        admitted_at: float | None = None,
    ) -> None:
        """Process the whole stream; raises ``AsrError`` for anything the client must be told.

        ``admitted_at``: the loop time the stream was admitted, from which its wall time
        counts toward ``max_stream_duration_s`` as its audio does (None: audio only, for
        Recognize, whose one message bounds its work)."""
        try:
            async with asyncio.TaskGroup() as tg:
                timer: asyncio.Task[None] | None = None
                if admitted_at is not None:
                    timer = tg.create_task(
                        self._limit_wall_time(admitted_at), name=f"{self.stream_id}-timer"
                    )
                self._channels = [
                    self._make_channel(c, tg) for c in range(self.config.format.channels)
                ]
                tg.create_task(self._read(requests), name=f"{self.stream_id}-reader")
                workers = [
                    tg.create_task(ch.run(inbox), name=f"{self.stream_id}-channel-{ch.channel}")
                    for ch, inbox in zip(self._channels, self._inboxes, strict=True)
                ]
                writer = tg.create_task(self._write(send), name=f"{self.stream_id}-writer")
                await asyncio.wait(workers)
                # partials still queued or running are moot once every utterance is final
                for task in self._partial_tasks:
                    task.cancel()
                await self._emit(StreamDone())
                await self._out.put(_Closed())
                await writer
                if timer is not None:
                    timer.cancel()
        except BaseExceptionGroup as group:
            raise _most_telling(group) from None
        finally:
            # whatever is still buffered leaves the gauge with the stream
            self.services.metrics.add_buffered_samples(-self._buffered_samples, SAMPLE_RATE)
            self._buffered_samples = 0

    async def _limit_wall_time(self, admitted_at: float) -> None:
        """End the stream once its wall time passes ``max_stream_duration_s``: the audio
        limit alone lets a stream that sends KEEPALIVEs, or nothing, hold its seat forever.

        With slack, so that the audio limit, not this one, ends a real-time stream: its
        audio trails its wall time by the time its client takes to start sending (allowed
        config_timeout_s, as for its config) and, after its last audio, by what is still
        buffered for the channels to decode (at most max_buffered_audio_s)."""
        s = self.services.settings
        limit_s = s.streaming.max_stream_duration_s
        slack_s = s.config_timeout_s + s.streaming.max_buffered_audio_s
        # a resumed stream's earlier part counts, as it does for the audio limit
        deadline = admitted_at + limit_s - self.config.time_offset_s + slack_s
        await asyncio.sleep(deadline - asyncio.get_running_loop().time())
        raise AsrError(
            Status.OUT_OF_RANGE,
            f"stream exceeded the maximum duration of {limit_s:g} s in wall time",
        )

    async def _emit(self, event: OutEvent) -> None:
        await self._out.put((event, self.progress))

    def going_away(self, deadline_s: float, reason: str) -> None:
        """Tell the client the server is draining (called from outside the session)."""
        try:
            self._out.put_nowait((GoingAway(deadline_s, reason), self.progress))
        except asyncio.QueueFull:  # a client that reads nothing will be cut at the deadline
            logger.warning("stream %s: no room to send going-away", self.stream_id)

    def _make_channel(self, channel: int, tg: asyncio.TaskGroup) -> ChannelRecognizer:
        s = self.services.settings
        detector = (
            self.services.vad_factory() if self.services.vad_factory else make_voice_detector(s.vad)
        )
        endpointer = Endpointer(
            detector,
            EndpointerConfig(
                threshold=s.vad.silero_threshold if s.vad.backend == "silero" else 0.5,
                start_ms=s.vad.start_ms,
                pre_roll_ms=s.vad.pre_roll_ms,
                # SEMANTIC: the turn model ends utterances at pauses; silence only at the
                # longest pause held open
                silence_ms=self.config.max_silence_ms
                if self.config.semantic
                else self.config.silence_ms,
                decoded_pad_ms=round(TRAILING_PAD_S * 1000),
            ),
        )
        return ChannelRecognizer(
            channel=channel,
            config=self.config,
            endpointer=endpointer,
            scheduler=self.services.scheduler,
            metrics=self.services.metrics,
            emit=self._emit,
            spawn=lambda coro: self._spawn_partial(tg, coro),
            partial_interval_s=s.streaming.partial_interval_ms / 1000,
            coalesce_key=(self.stream_id, channel),
            context_chars=s.streaming.context_chars,
            agreement=s.streaming.agreement,
            commit_partials=s.streaming.commit_partials,
            carry_max_s=s.streaming.carry_max_s,
            carry_gap_s=s.streaming.carry_gap_s,
            split_at_pause_after_s=s.streaming.split_at_pause_after_s,
            start=self.config.resume.channel(channel) if self.config.resume else None,
            turn=self.services.turn if self.config.semantic else None,
            early_speculation_s=s.turn.speculate_ms / 1000,
            speech_check=self.services.speech_check,
        )

    def _spawn_partial(self, tg: asyncio.TaskGroup, coro: Coroutine[None, None, None]) -> None:
        task = tg.create_task(coro, name=f"{self.stream_id}-partial")
        self._partial_tasks.add(task)
        task.add_done_callback(self._partial_tasks.discard)

    def _inboxes_for(self, request: Finalize | ConfigUpdate) -> list[AudioInbox]:
        if not isinstance(request, Finalize) or request.channel is None:
            return self._inboxes
        if request.channel >= len(self._inboxes):
            raise AsrError.invalid(
                f"control.channel {request.channel} does not exist: the stream has "
                f"{len(self._inboxes)} channel(s), numbered from 0"
            )
        return [self._inboxes[request.channel]]

    async def _read(self, requests: AsyncIterator[bytes | Finalize | ConfigUpdate]) -> None:
        limits = self.services.settings.streaming
        async for request in requests:
            if isinstance(request, Finalize | ConfigUpdate):
                if isinstance(request, Finalize):  # it covers audio a resampler holds back
                    await self._deliver(self._decoder.catch_up())
                for inbox in self._inboxes_for(request):  # in order with the audio around it
                    await inbox.put(request)
                continue
            if len(request) > limits.max_audio_message_bytes:
                raise AsrError.invalid(
                    f"audio message of {len(request)} bytes exceeds the limit of "
                    f"{limits.max_audio_message_bytes}; send smaller chunks (20-250 ms is typical)"
                )
            partial = partial_frame_error(len(request), self.config.format, "audio message")
            if partial:
                raise AsrError.invalid(partial)
            # in pieces of at most half the buffered-audio cap: a message may hold far more
            # audio than the cap (1 MiB of 8 kHz μ-law is 131 s), and decoded whole it would
            # sit in the inbox beside the cap, not within it
            for at in range(0, len(request), self._piece_bytes):
                await self._take(request[at : at + self._piece_bytes])
            self._report_progress()
        await self._deliver(self._decoder.flush())
        for inbox in self._inboxes:
            await inbox.put(EndOfAudio())

    async def _take(self, data: bytes) -> None:
        """Decode whole frames of one message and hand them to the channels."""
        limits, fmt = self.services.settings.streaming, self.config.format
        try:
            per_channel = self._decoder.decode(data)
        except AudioFormatError as exc:
            raise AsrError.invalid(str(exc)) from None
        received_s = self.config.time_offset_s + self._decoder.input_samples / fmt.sample_rate_hz
        self.services.metrics.audio_received.inc(
            len(data) / fmt.frame_bytes / fmt.sample_rate_hz * fmt.channels
        )
        if received_s > limits.max_stream_duration_s:
            raise AsrError(
                Status.OUT_OF_RANGE,
                f"stream exceeded the maximum duration of {limits.max_stream_duration_s:.0f} s",
            )
        await self._deliver(per_channel)

    def _report_progress(self) -> None:
        """A progress-only response once the settled point has moved
        ``streaming.progress_every_s`` past what the client was last told, and nothing
        else is on its way: in a long silence no event says it, and a client that resumes
        after a cut would replay (or keep, up to its limit) all of that silence."""
        every_s = self.services.settings.streaming.progress_every_s
        if not every_s:
            return
        progress = self.progress
        if progress.settled_s - self._told_settled_s >= every_s and self._out.empty():
            self._out.put_nowait((ProgressReport(), progress))
            self._told_settled_s = progress.settled_s

    async def _deliver(self, per_channel: list) -> None:  # type: ignore[type-arg]
        arrived = now()
        start = self._delivered
        self._delivered += per_channel[0].size if per_channel else 0
        for c, replayed in enumerate(self._replayed_finals):
            if replayed is not None and per_channel:
                audio = replayed.collect(start, per_channel[c])
                if audio is not None:  # (before its first sample after, in the inbox)
                    self._channels[c].carry_replayed_final(audio, replayed.end_sample)
                    self._replayed_finals[c] = None
        for channel, inbox, samples in zip(self._channels, self._inboxes, per_channel, strict=True):
            if samples.size:
                chunk = AudioChunk(samples, arrived)
                if not channel.take_inline(inbox, chunk):
                    await inbox.put(chunk)

    async def _write(self, send: Send) -> None:
        while True:
            item = await self._out.get()
            if isinstance(item, _Closed):
                return
            event, progress = item
            self._told_settled_s = max(self._told_settled_s, progress.settled_s)
            # A write cancelled half-way leaves the gRPC call broken ("Internal error from
            # Core") and the client never sees the real status: let it finish first.
            write = asyncio.ensure_future(send(event, progress))
            try:
                await asyncio.shield(write)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(write, WRITE_GRACE_S)
                raise


def _most_telling(group: BaseExceptionGroup) -> BaseException:  # type: ignore[type-arg]
    """The exception to surface from a failed TaskGroup: an AsrError first, else the first one."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    for exc in leaves:
        if isinstance(exc, AsrError):
            return exc
    return next((e for e in leaves if not isinstance(e, asyncio.CancelledError)), leaves[0])
