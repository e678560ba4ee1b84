"""Stream resume: one logical stream that survives dropped connections and replicas that go.

``ResumableStream`` has the surface of ``RecognitionStream``. It keeps the audio it sent
since the point up to which every channel is settled (its last final received, or, for a
channel nobody is speaking on, a margin behind the audio the server has processed). When
the call breaks in a way another attempt can fix (UNAVAILABLE, a proxy's "Stream removed")
it opens a new call, on any replica the channel reaches, whose config carries
``ResumeFrom`` (where the new audio starts on the stream clock, the next utterance id and
how far each channel is final), and sends the kept audio again. The server does not
recognize again what the client already has finals for, reports times on the original
clock and continues utterance ids, so the caller sees one stream: no final is lost or
delivered twice; the partials of an utterance that was cut start over under a new id.

When the server says it is going away (a drain), the stream moves at its next utterance
boundary, before the server's deadline, the same way. The protocol is part of the API,
for clients in other languages: docs/scale-out.md, "Stream resume".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

import grpc

from asr_api.v1 import asr_pb2

if TYPE_CHECKING:
    from asr_client.api import AsrClient, RecognitionStream

from asr_client.api import StreamClosedError

logger = logging.getLogger(__name__)

#: Replays start on this grid of stream time, a multiple of every voice detector's frame
#: (30 ms webrtc, 32 ms Silero): the server then cuts the replayed audio into the same
#: frames as the first time and hears the same speech.
ALIGN_S = 0.48
#: How far behind the server's processed audio a silent channel counts as settled: an
#: utterance's audio starts before its detection by the pre-roll (up to 2 s) plus the
#: voiced frames detection needs.
IDLE_MARGIN_S = 2.5
#: Move this long before a draining server's deadline even without an utterance boundary.
MIGRATE_LEAD_S = 1.0

_BYTES_PER_SAMPLE = {
    asr_pb2.AudioFormat.LINEAR16: 2,
    asr_pb2.AudioFormat.FLOAT32: 4,
    asr_pb2.AudioFormat.MULAW: 1,
    asr_pb2.AudioFormat.ALAW: 1,
}


@dataclass(frozen=True)
class ResumePolicy:
    """How a stream resumes. The defaults suit a microphone or a phone call."""

    #: audio kept for a replay, from the settled point on; past it the oldest is dropped
    #: and a resume that would need it fails with ResumeError
    max_kept_s: float = 120.0
    #: give up when no new call could be started within this long of a break
    give_up_after_s: float = 30.0
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 2.0


@dataclass(frozen=True)
class ResumeInfo:
    """What ``on_resume`` is told each time a stream continued on a new call."""

    count: int  # resumes of this stream so far, this one included
    cause: str  # "UNAVAILABLE: Socket closed", "going away", ...
    stream_offset_s: float  # where the new call's audio starts, on the stream clock
    replayed_s: float  # audio sent again
    outage_s: float  # from the break to the new call carrying the stream


def resume_notice(info: ResumeInfo) -> str:
    """One line for a person: what happened and what it cost."""
    return (
        f"stream resumed ({info.cause}): {info.outage_s:.2f} s to a new call, "
        f"{info.replayed_s:.1f} s of audio sent again (resume {info.count})"
    )


def resume_record(info: ResumeInfo, **extra: object) -> dict[str, object]:
    """A JSON-lines record of a resume, next to the events of ``--json-out``."""
    return {
        "type": "resumed",
        "count": info.count,
        "cause": info.cause,
        "stream_offset_s": round(info.stream_offset_s, 3),
        "replayed_s": round(info.replayed_s, 3),
        "outage_s": round(info.outage_s, 3),
        **extra,
    }


class ResumeError(StreamClosedError):
    """The stream broke and could not be continued; ``details`` says why."""


def is_resumable(error: StreamClosedError) -> bool:
    """Breaks another call can fix: the server or the path to it went away.

    Through a proxy a killed replica shows up as INTERNAL or UNKNOWN "Stream removed
    (RST_STREAM ...)"; a cut connection, a draining server and a refusal at admission as
    UNAVAILABLE; a transport that failed under a write as INTERNAL "Internal error from
    Core" (grpc/grpc#36066 hides the real status; our server never says that). Errors
    about the stream itself (a bad config, a timeout, an engine failure) are final.
    """
    if error.code == grpc.StatusCode.UNAVAILABLE:
        return True
    if error.code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
        return any(
            marker in error.details
            for marker in ("RST_STREAM", "Stream removed", "Internal error from Core")
        )
    return False


class KeptAudio:
    """The audio sent since the settled point, and FINALIZE requests among it."""

    def __init__(self, frame_bytes: int, sample_rate: int, max_frames: int) -> None:
        self.frame_bytes = frame_bytes
        self.sample_rate = sample_rate
        self.max_frames = max_frames
        self.start = 0  # first frame kept
        self.end = 0  # frames sent so far
        self.lost_until = 0  # audio before this frame was dropped for the bound, unsettled
        self._items: deque[tuple[int, bytes | None]] = deque()  # (first frame, audio | FINALIZE)

    def append(self, data: bytes) -> None:
        if len(data) % self.frame_bytes:
            # the server refuses it too; keep whole frames so replays stay on the grid
            raise ValueError(
                f"audio of {len(data)} bytes is not whole {self.frame_bytes}-byte frames"
            )
        if data:
            self._items.append((self.end, data))
            self.end += len(data) // self.frame_bytes
        if self.end - self.start > self.max_frames:
            self.lost_until = self.end - self.max_frames
            self.trim(self.lost_until)

    def append_finalize(self) -> None:
        self._items.append((self.end, None))

    def trim(self, frame: int) -> None:
        """Forget everything before ``frame``."""
        frame = min(frame, self.end)
        while self._items:
            first, data = self._items[0]
            last = first + (len(data) // self.frame_bytes if data else 0)
            if last > frame and data is not None:
                if first < frame:
                    self._items[0] = (frame, data[(frame - first) * self.frame_bytes :])
                break
            if data is None and first >= frame:
                break
            self._items.popleft()
        self.start = max(self.start, frame)

    def replay(self) -> list[bytes | None]:
        return [data for _, data in self._items]


class ResumableStream:
    """A ``RecognitionStream`` that continues on a new call when the old one breaks."""

    def __init__(
        self,
        client: AsrClient,
        config: asr_pb2.StreamingConfig,
        policy: ResumePolicy,
        *,
        timeout_s: float | None = None,
        on_resume: Callable[[ResumeInfo], None] | None = None,
    ) -> None:
        self._client = client
        self._config = config
        self.policy = policy
        self._timeout_s = timeout_s
        self._on_resume = on_resume
        self.session_id = uuid.uuid4().hex[:16]
        fmt = config.format
        channels = fmt.channels or 1
        frame_bytes = _BYTES_PER_SAMPLE.get(fmt.encoding, 2) * channels
        self._rate = fmt.sample_rate_hz
        self._kept = KeptAudio(frame_bytes, self._rate, int(policy.max_kept_s * self._rate))
        self._final_until = [0.0] * channels
        self._next_utterance = [0] * channels
        self._last_final = [""] * channels
        self._speaking = [False] * channels
        self._processed_s = 0.0
        self._going_away_at: float | None = None
        self._ended = False
        self._failed: StreamClosedError | None = None  # the error that ended the stream
        self._write_lock = asyncio.Lock()
        self._replay_task: asyncio.Task[None] | None = None
        self._call: RecognitionStream = client._raw_stream(config, timeout_s)
        self.resumes = 0

    # -- the RecognitionStream surface ----------------------------------------------------

    async def open(self) -> ResumableStream:
        await self._call.open()
        return self

    async def send_audio(self, data: bytes) -> None:
        """Send audio; waits while the server pushes back, and through a resume."""
        async with self._write_lock:
            self._kept.append(data)
            await self._write(lambda call: call.send_audio(data))

    async def finalize(self) -> None:
        async with self._write_lock:
            self._kept.append_finalize()
            await self._write(lambda call: call.finalize())

    async def end(self) -> None:
        async with self._write_lock:
            self._ended = True
            await self._write(lambda call: call.end())

    def cancel(self) -> None:
        if self._replay_task is not None:
            self._replay_task.cancel()
        self._call.cancel()

    async def __aiter__(self) -> AsyncIterator[asr_pb2.StreamingRecognizeResponse]:
        while True:
            call = self._call
            migrate = False
            try:
                async for response in call:
                    self._observe(response)
                    yield response
                    if self._should_migrate():
                        migrate = True
                        break
                else:
                    return  # the stream ended normally
            except StreamClosedError as exc:
                if not is_resumable(exc):
                    self._failed = exc
                    raise
                try:
                    await self._resume(f"{exc.code.name}: {exc.details}")
                except StreamClosedError as error:
                    self._failed = error
                    raise
                continue
            if migrate:
                await self._resume("going away")

    async def __aenter__(self) -> ResumableStream:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cancel()

    # -- bookkeeping ----------------------------------------------------------------------

    def _observe(self, response: asr_pb2.StreamingRecognizeResponse) -> None:
        self._processed_s = max(self._processed_s, response.progress.audio_processed_s)
        kind = response.WhichOneof("event")
        if kind == "speech_event":
            ev = response.speech_event
            ch = min(ev.channel, len(self._speaking) - 1)
            self._seen_utterance(ch, ev.utterance_id)
            if ev.type == asr_pb2.SpeechEvent.SPEECH_STARTED:
                self._speaking[ch] = True
        elif kind == "result":
            r = response.result
            ch = min(r.channel, len(self._speaking) - 1)
            self._seen_utterance(ch, r.utterance_id)
            if r.is_final:
                self._final_until[ch] = max(self._final_until[ch], r.end_s)
                self._last_final[ch] = r.text
                self._speaking[ch] = False
        elif kind == "going_away":
            deadline = response.going_away.deadline_s
            self._going_away_at = time.monotonic() + deadline
            logger.info("server is going away in %.1f s; moving at the next boundary", deadline)
        self._kept.trim(self._replay_frame())

    def _seen_utterance(self, channel: int, utterance_id: int) -> None:
        self._next_utterance[channel] = max(self._next_utterance[channel], utterance_id + 1)

    def _settled_s(self) -> float:
        """Stream time up to which no channel can produce another result."""
        return min(
            until if speaking else max(until, self._processed_s - IDLE_MARGIN_S)
            for until, speaking in zip(self._final_until, self._speaking, strict=True)
        )

    def _replay_frame(self) -> int:
        align = round(ALIGN_S * self._rate)
        return int(self._settled_s() * self._rate) // align * align

    def _should_migrate(self) -> bool:
        if self._going_away_at is None:
            return False
        at_boundary = not any(self._speaking)
        return at_boundary or time.monotonic() >= self._going_away_at - MIGRATE_LEAD_S

    # -- resuming -------------------------------------------------------------------------

    async def _write(self, write: Callable[[RecognitionStream], object]) -> None:
        """A write on the current call (with the lock held). If the call broke, return: the
        receiver reads the call's real status and resumes (the kept audio includes this
        write) or ends the stream with it, after which writes raise that error. (A failed
        write itself often says only "Internal error from Core", grpc/grpc#36066.)"""
        if self._failed is not None:
            raise self._failed
        try:
            await write(self._call)  # type: ignore[misc]
        except StreamClosedError:
            if self._failed is not None:
                raise self._failed from None

    async def _resume(self, cause: str) -> None:
        broke = time.monotonic()
        self._call.cancel()
        if self._replay_task is not None:
            self._replay_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._replay_task
        backoff = self.policy.initial_backoff_s
        await self._write_lock.acquire()
        released = False
        try:
            frame = self._replay_frame()
            if frame < self._kept.lost_until:
                raise ResumeError(
                    grpc.StatusCode.UNAVAILABLE,
                    f"cannot resume the stream ({cause}): more than "
                    f"{self.policy.max_kept_s:g} s of audio had no final, and the oldest of "
                    "it is gone",
                )
            # an utterance detected after its channel counted as settled starts within the
            # idle margin, so the kept audio (trimmed to that earlier point) still holds it
            frame = max(frame, self._kept.start)
            self._kept.trim(frame)
            offset_s = frame / self._rate
            config = self._resume_config(offset_s)
            while True:
                call = self._client._raw_stream(config, self._timeout_s)
                try:
                    await call.open()
                    break
                except StreamClosedError as exc:
                    call.cancel()
                    if not is_resumable(exc):
                        raise
                    if time.monotonic() - broke > self.policy.give_up_after_s:
                        raise ResumeError(
                            exc.code,
                            f"could not resume the stream within "
                            f"{self.policy.give_up_after_s:g} s ({cause}; last: {exc.details})",
                        ) from None
                    await asyncio.sleep(random.uniform(0, backoff))  # full jitter
                    backoff = min(self.policy.max_backoff_s, backoff * 2)
            self._call = call
            self._going_away_at = None
            self.resumes += 1
            items = self._kept.replay()
            replayed_s = (self._kept.end - self._kept.start) / self._rate
            # the replay runs beside the receiver, which reads the new call's results;
            # the write lock keeps new audio behind the replayed audio
            self._replay_task = asyncio.create_task(self._replay(call, items))
            released = True
        finally:
            if not released:
                self._write_lock.release()
        info = ResumeInfo(self.resumes, cause, offset_s, replayed_s, time.monotonic() - broke)
        logger.info(
            "stream %s resumed (%s) at %.2f s, replaying %.2f s",
            self.session_id,
            cause,
            offset_s,
            replayed_s,
        )
        if self._on_resume is not None:
            self._on_resume(info)

    async def _replay(self, call: RecognitionStream, items: list[bytes | None]) -> None:
        try:
            for data in items:
                if data is None:
                    await call.finalize()
                else:
                    await call.send_audio(data)
            if self._ended:
                await call.end()
        except StreamClosedError:
            pass  # the receiver sees the break and resumes again
        finally:
            self._write_lock.release()

    def _resume_config(self, offset_s: float) -> asr_pb2.StreamingConfig:
        config = asr_pb2.StreamingConfig()
        config.CopyFrom(self._config)
        config.resume.CopyFrom(
            asr_pb2.ResumeFrom(
                stream_offset_s=offset_s,
                session_id=self.session_id,
                channels=[
                    asr_pb2.ChannelResume(
                        next_utterance_id=self._next_utterance[c],
                        final_until_s=self._final_until[c],
                        previous_text=self._last_final[c][-1000:],
                    )
                    for c in range(len(self._final_until))
                ],
            )
        )
        return config
