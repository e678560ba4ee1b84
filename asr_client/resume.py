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
import dataclasses
import logging
import random
import time
import uuid
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import grpc

from asr_api.v1 import asr_pb2

if TYPE_CHECKING:
    from asr_client.api import AsrClient, RecognitionStream

from asr_client.acks import FinalizeAck, PendingFinalizes
from asr_client.api import (
    CANCELLED,
    ENDED,
    NOT_READ,
    StreamClosedError,
    check_audio,
    speech_event_utterance,
    updated_config,
)

T = TypeVar("T")
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
#: A replay starts this much earlier than it needs to (on the grid, as far as the audio
#: is kept): the new server recognizes none of that audio again, but its voice detection learns
#: the channels from it as the old server had (how loud each is, webrtcvad's model of its
#: noise). Learnt again from nothing on each resume, a -45 dBFS talker went unheard for a
#: second or more after it, and the splits moved for the rest of the call. (An 8 kHz call
#: at -45 dBFS cut after every second final, 13 times: with no lead 3 words unlike the
#: uncut call's, 4.8 s 2, 9.6 s 1; each of those a word between two utterances.)
LISTEN_LEAD_S = 9.6

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
    #: give up when no new call carried the stream within this long of a break
    give_up_after_s: float = 30.0
    #: a stream whose first call was refused for capacity (RESOURCE_EXHAUSTED before
    #: the server admitted it) makes the call again, with backoff, for this long before
    #: failing with the refusal: through a proxy or client-side balancing the next try
    #: may land on a replica with room. 0 = fail at once. (The new calls of a resume, and
    #: a first call a draining or loading replica, or a proxy with no replica up, refused
    #: with UNAVAILABLE, are tried for give_up_after_s; with AsrClient(retry=False) a
    #: first call is made once.)
    seat_wait_s: float = 1.0
    initial_backoff_s: float = 0.05
    #: the longest wait between two tries; an AsrClient's policy also caps its channel's
    #: reconnect backoff (grpc's own grows to 120 s) at this
    max_backoff_s: float = 2.0
    #: a channel's last final up to this long is kept too while its next utterance may
    #: still come within ``carry_gap_s`` of its end, and replayed: the new server decodes
    #: that utterance after it, as the old one did (the server's carry, whose defaults
    #: these are: ASR_STREAMING__CARRY_MAX_S, CARRY_GAP_S). 0 = replay only what is needed
    carry_max_s: float = 10.0
    carry_gap_s: float = 2.0


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


@dataclass(frozen=True)
class OutageInfo:
    """What ``on_outage`` is told as a stream starts waiting for a server: its call broke
    (``started``), or no server has taken the new stream yet and it keeps trying."""

    cause: str  # "UNAVAILABLE: Socket closed", ...
    started: bool  # a server had taken the stream: this is a break, and a resume follows
    give_up_after_s: float  # how long it keeps trying


def outage_notice(info: OutageInfo) -> str:
    """One line for a person, as the wait begins (``on_outage``)."""
    if info.started:
        return (
            f"connection lost ({info.cause}): resuming within {info.give_up_after_s:g} s; "
            "the audio is kept"
        )
    return (
        f"no server has taken the stream yet ({info.cause}): trying again for up to "
        f"{info.give_up_after_s:g} s; the audio is kept"
    )


def outage_record(info: OutageInfo, **extra: object) -> dict[str, object]:
    """A JSON-lines record of the wait (a break the stream is resuming from, or a new
    stream no server has taken yet)."""
    return {"type": "outage", "cause": info.cause, "started": info.started, **extra}


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


#: how a server turns a call away at admission, before answering it
_REFUSALS = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE)


@dataclass(frozen=True)
class FinalizeRequest:
    """A FINALIZE among the kept audio (``channel``: of that channel only; None: all)."""

    channel: int | None = None

    def applies_to(self, channel: int) -> bool:
        return self.channel is None or self.channel == channel


class ReplayPlan(NamedTuple):
    items: list[bytes | FinalizeRequest]  # what the new call is sent, in order
    acks_to_skip: list[int]  # per channel: first acknowledgements the caller has had
    acks_resent: list[int]  # per channel: first acknowledgements for FINALIZEs sent again


def replay_plan(kept: list[bytes | FinalizeRequest], unacknowledged: list[int]) -> ReplayPlan:
    """What a new call replays, and per channel how many of its first acknowledgements
    (FINALIZED) the caller has had already, from the kept audio and, per channel, how many
    FINALIZEs sent have had no acknowledgement yet. Each channel acknowledges its
    FINALIZEs in order, so counting is enough: the unacknowledged ones are the last sent.
    Fewer than the kept ones: the first kept ones were acknowledged on the old call, and
    their second acknowledgements are not delivered. More: a FINALIZE was trimmed (its
    results settled) before its acknowledgement came; it is sent again at the start of
    the new call, where nothing is open to finalize, so that no caller waits for an
    acknowledgement that never comes (``acks_resent`` counts those per channel: the new
    call's first acknowledgements there are theirs)."""
    resent: list[bytes | FinalizeRequest] = []
    skip: list[int] = []
    resent_per_channel: list[int] = []
    for ch, waiting in enumerate(unacknowledged):
        kept_here = sum(isinstance(i, FinalizeRequest) and i.applies_to(ch) for i in kept)
        resent_per_channel.append(max(0, waiting - kept_here))
        resent += [FinalizeRequest(ch)] * resent_per_channel[-1]
        skip.append(max(0, kept_here - waiting))
    return ReplayPlan(resent + kept, skip, resent_per_channel)


class KeptAudio:
    """The audio sent since the settled point, and FINALIZE requests among it."""

    def __init__(self, frame_bytes: int, sample_rate: int, max_frames: int) -> None:
        self.frame_bytes = frame_bytes
        self.sample_rate = sample_rate
        self.max_frames = max_frames
        self.start = 0  # first frame kept
        self.end = 0  # frames sent so far
        self.lost_until = 0  # audio before this frame was dropped for the bound, unsettled
        self._items: deque[tuple[int, bytes | FinalizeRequest]] = deque()  # (first frame, what)

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

    def append_finalize(self, request: FinalizeRequest) -> None:
        self._items.append((self.end, request))

    def trim(self, frame: int) -> None:
        """Forget everything before ``frame``."""
        frame = min(frame, self.end)
        while self._items:
            first, data = self._items[0]
            if isinstance(data, FinalizeRequest):
                if first >= frame:
                    break
            else:
                if first + len(data) // self.frame_bytes > frame:
                    if first < frame:
                        self._items[0] = (frame, data[(frame - first) * self.frame_bytes :])
                    break
            self._items.popleft()
        self.start = max(self.start, frame)

    def replay(self) -> list[bytes | FinalizeRequest]:
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
        on_outage: Callable[[OutageInfo], None] | None = None,
        retry: bool = True,
    ) -> None:
        self._client = client
        # False: the stream's first call fails with its own status unless a server takes
        # it (AsrClient(retry=False), the load tool: a refusal is what it counts)
        self._retry = retry
        self._config = config
        self.policy = policy
        self._timeout_s = timeout_s
        self._on_resume = on_resume
        self._on_outage = on_outage
        self._outage_told = False  # on_outage was told of the wait now being overcome
        self.session_id = uuid.uuid4().hex[:16]
        fmt = config.format
        channels = fmt.channels or 1
        frame_bytes = _BYTES_PER_SAMPLE.get(fmt.encoding, 2) * channels
        # (0 is refused by the server, which says so; the bookkeeping must not divide by it)
        self._rate = fmt.sample_rate_hz or 16_000
        self._kept = KeptAudio(frame_bytes, self._rate, int(policy.max_kept_s * self._rate))
        self._final_until = [0.0] * channels
        self._final_start = [0.0] * channels  # of the last final: where its audio begins
        self._next_utterance = [0] * channels
        self._last_final = [""] * channels
        self._language = [""] * channels  # of the last final: the language the channel keeps
        self._speaking = [False] * channels
        self._open_utterance = [-1] * channels  # the newest utterance id known to be open
        # per channel, the utterance of an eager result not yet confirmed by its final nor
        # withdrawn by SPEECH_RESUMED: a new call hears that speech again under a new id,
        # so the resume withdraws it (_withdrawn_utterances), keeping the proto's promise
        self._open_eager: list[asr_pb2.Result | None] = [None] * channels
        #: per channel, the utterances whose SPEECH_ENDED or EndOfTurn came and whose
        #: final or NO_WORDS has not: id → where their speech ended
        self._ended_open: list[dict[int, float]] = [{} for _ in range(channels)]
        #: per channel, the newest utterance whose final or NO_WORDS came: an end that
        #: comes after it (a server may send the final first; a resumed stream may send
        #: an EndOfTurn again) leaves nothing open
        self._answered: list[int] = [-1] * channels
        self._last_progress = asr_pb2.Progress()
        self._notices: list[asr_pb2.StreamingRecognizeResponse] = []  # made here, to yield
        # per channel, the FINALIZEs sent and not yet acknowledged, with where each came
        # and the futures finalize() returned: a replay sends again those among the kept
        # audio, and those trimmed before their acknowledgement, whose acknowledgement then
        # says where they first came; the acknowledgements of the ones already
        # acknowledged are not delivered twice
        self._finalizes = PendingFinalizes(channels)
        #: per channel, whether a FINALIZE was ever sent for it: a new server is told
        #: (ChannelResume.client_finalizes), as the replay may hold none
        self._client_finalizes = [False] * channels
        self._acks_to_skip = [0] * channels
        self._acks_resent = [0] * channels
        self._processed_s = 0.0
        self._server_settled_s: float | None = None  # Progress.settled_s, servers that send it
        self._admitted = False  # some call of this stream was admitted by a server
        self._outage_since: float | None = None  # the first break not yet overcome
        #: since when new calls have been tried for it: the break, moved on by the time no
        #: loop read in the outage (that time does not count against give_up_after_s: the
        #: next loop failed at once, without a try), but not by a loop's restart itself (a
        #: caller reading in slices would have kept the stream trying for good)
        self._trying_since: float | None = None
        self._reading_stopped_at: float | None = None  # when the last loop was left
        #: the reading loops begun: a loop left early is closed later, by asyncio, and
        #: its cleanup must not undo the state of a loop begun meanwhile
        self._loops = 0
        #: the call whose break began the outage: no sign that a server took the stream
        self._broken: RecognitionStream | None = None
        # set while a call carries the stream (or it has ended): senders ahead of the
        # audio a real-time source makes during an outage wait on it (_hold_back)
        self._carried = asyncio.Event()
        self._carried.set()
        self._outage_from_frame = 0  # the audio sent when the outage began
        #: set while no loop reads (after one was left: its task cancelled, its loop left):
        #: a call that breaks then has nobody to resume it, and a writer held back wakes
        #: to see that (only a reader resumes)
        self._reading_stopped = asyncio.Event()
        #: a reading loop waits on the server now (not when it has been handed a response
        #: and its body runs, which may be the task that writes): only then can a writer
        #: wait for it to resume the stream
        self._reader_waiting = False
        self._resuming: ResumeInfo | None = None  # the resume whose new call is not yet admitted
        self._backoff_s = policy.initial_backoff_s
        self._going_away_at: float | None = None
        #: the call cut to move it before its server's drain deadline, when no response
        #: came to move it on (interim results off, in a long utterance)
        self._cut_to_move: RecognitionStream | None = None
        self._ended = False
        self._failed: StreamClosedError | None = None  # the error that ended the stream
        # set by cancel(): a resume waiting out its backoff (up to max_backoff_s) stops
        # at once, so closing a client mid-outage does not wait for the next attempt
        self._cancelled = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._replay_task: asyncio.Task[None] | None = None
        self._call: RecognitionStream = client._raw_stream(config, timeout_s)
        self.resumes = 0

    # -- the RecognitionStream surface ----------------------------------------------------

    async def open(self) -> ResumableStream:
        try:
            await self._call.open()
        except StreamClosedError as error:
            # A draining or loading replica refuses a call as it arrives: a client slower
            # than that sees this write fail rather than its first read. The receiver then
            # reads the refusal and tries again, as for a resumed call's first write
            # (_resume). So does a proxy with no replica to send it to: its refusal often
            # comes with a reset that hides it (nginx's: INTERNAL, no metadata). A call
            # that reached no server at all (nothing listens, a wrong CA: the channel has
            # no connection) has no refusal to read, and a server's answer about the
            # stream itself (a bad token, a bad config) is final: those fail here, at once.
            proxy_refusal = is_resumable(error) and self._client._has_a_connection()
            if not (await self._call.refused_with_pushback() or proxy_refusal):
                raise
        return self

    async def send_audio(self, data: bytes) -> None:
        """Send audio; waits while the server pushes back, and through a resume."""
        check_audio(data)  # (before it is kept: a replay of it would fail, and stop)
        await self._hold_back()
        async with self._write_lock:
            self._check_writable()
            self._kept.append(data)
            await self._write(lambda call: call.send_audio(data))

    async def finalize(self, channel: int | None = None) -> FinalizeAck:
        """As ``RecognitionStream.finalize``; the acknowledgement may come on a later call."""
        async with self._write_lock:
            self._check_writable()  # (an ended stream: no acknowledgement would ever come)
            self._kept.append_finalize(FinalizeRequest(channel))
            for ch in range(len(self._client_finalizes)):
                if channel is None or ch == channel:
                    self._client_finalizes[ch] = True
            ack = self._finalizes.sent(channel, came_at=self._kept.end / self._rate)
            # not withdrawn if the write fails: the FINALIZE is among the kept audio, so a
            # new call sends it again (its acknowledgement then comes), or the stream has
            # failed and the future fails with it
            await self._write(lambda call: call.finalize(channel))
            return ack

    async def update(self, update: asr_pb2.StreamingUpdate) -> None:
        async with self._write_lock:
            self._check_writable()
            # a new call after a break starts with the settings as they are now (the audio
            # it replays from before the update is heard with them too)
            self._config = updated_config(self._config, update)
            await self._write(lambda call: call.update(update))

    async def keep_alive(self) -> None:
        """As ``RecognitionStream.keep_alive``; not kept: a new call is alive already."""
        async with self._write_lock:
            self._check_writable()
            await self._write(lambda call: call.keep_alive())

    async def idle_timeout_s(self) -> float | None:
        """As ``RecognitionStream.idle_timeout_s``, of the server the stream is on now."""
        return await self._call.idle_timeout_s()

    async def end(self) -> None:
        async with self._write_lock:
            if self._ended:  # (a second end(), as in a cleanup path: nothing to do, as on
                return  # a stream without resume; it raised once the server had ended)
            self._ended = True
            await self._write(lambda call: call.end())

    def cancel(self) -> None:
        """End the stream for good: writes after it raise, and no resume (one waiting
        to open a new call included) carries it on."""
        if self._failed is None:
            self._failed = StreamClosedError(grpc.StatusCode.CANCELLED, CANCELLED)
        self._cancelled.set()
        self._carried.set()
        if self._replay_task is not None:
            self._replay_task.cancel()
        self._call.cancel()
        self._finalizes.fail(self._failed)

    async def _hold_back(self) -> None:
        """In an outage a real-time source's audio is kept (it cannot wait, and a new call
        takes it); a source that sends faster waits once it has sent, since the break, as
        much audio as a real-time one could before the stream gives up
        (``give_up_after_s``), as it would wait for a server pushing back. Without it, the
        kept audio filled at that source's speed and the stream failed at its bound
        however short the outage."""
        allowed = int(self.policy.give_up_after_s * self._rate)
        # (only while a reading loop waits on the server: only a reader resumes, and sets
        # it; a writer waiting for it when its reading task was cancelled in the middle of a
        # resume, or before any loop read, or in a loop's own body, waited for good)
        while (
            not self._carried.is_set()
            and self._reader_waiting
            and self._kept.end - self._outage_from_frame >= allowed
        ):
            # (the loop's end only while it is to come: a stale one would spin this)
            stopped = [] if self._reading_stopped.is_set() else [self._reading_stopped]
            events = [self._carried, *stopped]
            waits = [asyncio.ensure_future(event.wait()) for event in events]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()

    @property
    def _unread(self) -> bool:
        """Reading began and has stopped, and nobody reads now."""
        return self._reading_stopped.is_set()

    def _check_cancelled(self) -> None:
        """In a resume, after each wait: a stream cancelled meanwhile stays cancelled."""
        if self._failed is not None:
            raise self._failed

    def _check_writable(self) -> None:
        """A write after the caller's end() raises at once, as on a stream without resume:
        it was dropped without a word until the stream's reading had ended, and audio
        sent so was kept, for a resume to replay after the end."""
        if self._ended:
            raise StreamClosedError(grpc.StatusCode.FAILED_PRECONDITION, ENDED)
        self._check_cancelled()

    async def __aiter__(self) -> AsyncIterator[asr_pb2.StreamingRecognizeResponse]:
        ended = StreamClosedError(grpc.StatusCode.CANCELLED, NOT_READ)  # unless it ends
        self._reading_stopped.clear()  # (a later loop reads on where the last one stopped)
        self._loops += 1
        loop = self._loops
        stopped_at, self._reading_stopped_at = self._reading_stopped_at, None
        if self._trying_since is not None and stopped_at is not None:
            self._trying_since += time.monotonic() - stopped_at  # (nobody read meanwhile)
        try:
            async with contextlib.aclosing(self._responses()) as responses:
                self._reader_waiting = True
                async for response in responses:
                    self._reader_waiting = False
                    yield response
                    self._reader_waiting = True
            ended = StreamClosedError(grpc.StatusCode.OK, "the server closed the stream")
            # writes after it raise it, as on a stream without resume (they were dropped,
            # and a finalize's acknowledgement never came)
            self._failed = self._failed or ended
        finally:
            if self._failed is None and loop != self._loops:
                pass  # a later loop reads now (this one, left early, is closed only now)
            elif self._failed is None:  # reading stopped (for now), the stream goes on
                self._reader_waiting = False
                self._reading_stopped.set()
                self._reading_stopped_at = time.monotonic()
                self._finalizes.fail(ended, for_good=False)
            else:  # nothing more will be acknowledged, and no resume comes
                self._reader_waiting = False
                self._finalizes.fail(self._failed)
                self._carried.set()

    async def _responses(self) -> AsyncGenerator[asr_pb2.StreamingRecognizeResponse, None]:
        while True:
            call = self._call
            migrate = False
            if self._outage_since is not None:
                try:
                    # (not the call that broke: a loop left while the new call opened finds
                    # it still current, and its old admission ended the outage at once,
                    # every loop, so a stream read in slices never gave up)
                    admitted = call is not self._broken and await self._admitted_in_time(call)
                except ResumeError as error:
                    self._failed = error
                    raise
            try:
                if self._outage_since is not None and admitted:
                    self._resumed()  # a server has taken the stream (again)
                while self._notices:
                    yield self._notices.pop(0)
                async for response in call:
                    if self._outage_since is not None:
                        # a server that predates the admission header: its first answer
                        # is the sign that it took the stream
                        self._resumed()
                    while self._notices:
                        yield self._notices.pop(0)
                    self._admitted = True
                    if self._observe(response):
                        yield response
                    if self._should_migrate():
                        migrate = True
                        break
                else:
                    return  # the stream ended normally
            except StreamClosedError as exc:
                if self._cut_to_move is call:  # cut to move before the drain's deadline
                    self._cut_to_move = None
                    migrate = True
                else:
                    await self._after_a_break(call, exc)
                    continue
            if migrate:
                try:
                    await self._resume(None)
                except StreamClosedError as error:
                    self._failed = error
                    raise

    async def _after_a_break(self, call: RecognitionStream, exc: StreamClosedError) -> None:
        """``call`` broke, or was refused: resume the stream on a new one, or end the
        stream with the error (raised)."""
        # a call turned away at admission (a full or draining replica) can be made again
        # as it was; nothing of it reached the caller
        admitted = await call.admitted()
        self._admitted = self._admitted or admitted
        refused = not admitted and exc.code in _REFUSALS
        no_wait = self._no_seat(exc) and self.policy.seat_wait_s <= 0
        no_retry = not self._retry and not self._admitted
        if no_retry or no_wait or not (is_resumable(exc) or refused):
            self._failed = exc
            raise exc
        try:
            await self._resume(exc)
        except StreamClosedError as error:
            self._failed = error
            raise

    def _move_before_the_deadline(self, call: RecognitionStream) -> None:
        """The drain's deadline is near and ``call`` has not moved: no response came at
        which to (interim results off, inside a long utterance). Cut it: the receiver
        then moves the stream as at a boundary, rather than the server cutting it at
        the deadline, with a drain that waits that long."""
        if self._call is call and self._going_away_at is not None and self._failed is None:
            self._cut_to_move = call
            call.cancel()

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

    def _observe(self, response: asr_pb2.StreamingRecognizeResponse) -> bool:
        """Note what ``response`` says of the stream; False: it repeats what the caller
        has had (the acknowledgement of a FINALIZE replayed after a resume)."""
        progress = response.progress
        self._last_progress = progress
        self._processed_s = max(self._processed_s, progress.audio_processed_s)
        if progress.HasField("settled_s"):
            # each value is a lower bound that stays true, so the largest one holds
            self._server_settled_s = max(self._server_settled_s or 0.0, progress.settled_s)
        else:  # a server that predates it (a mixed rolling upgrade): estimate again
            self._server_settled_s = None
        kind = response.WhichOneof("event")
        if kind == "speech_event":
            ev = response.speech_event
            ch = min(ev.channel, len(self._speaking) - 1)
            utterance = speech_event_utterance(ev)
            if utterance is not None:  # None: a FINALIZED before any utterance
                self._seen_utterance(ch, utterance)
            if ev.type == asr_pb2.SpeechEvent.SPEECH_STARTED:
                self._utterance_open(ch, ev.utterance_id)
            elif ev.type == asr_pb2.SpeechEvent.SPEECH_RESUMED:
                eager = self._open_eager[ch]
                if eager is not None and ev.utterance_id == eager.utterance_id:
                    self._open_eager[ch] = None
            elif ev.type == asr_pb2.SpeechEvent.SPEECH_ENDED:
                self._end_heard(ch, ev.utterance_id, ev.offset_s)
            elif ev.type == asr_pb2.SpeechEvent.NO_WORDS:
                self._answer_heard(ch, ev.utterance_id)
                # over, with no final to say so: a boundary as a final is
                if ev.utterance_id >= self._open_utterance[ch]:
                    self._speaking[ch] = False
            elif ev.type == asr_pb2.SpeechEvent.FINALIZED:
                if self._acks_to_skip[ch]:
                    self._acks_to_skip[ch] -= 1
                    return False
                if self._acks_resent[ch]:  # the new call heard it at its start
                    self._acks_resent[ch] -= 1
                    came_at = self._finalizes.oldest_came_at(ch)  # None: not one of ours
                    if came_at is not None:
                        ev.offset_s = came_at
                self._finalizes.acknowledged(ev)
        elif kind == "result":
            r = response.result
            ch = min(r.channel, len(self._speaking) - 1)
            self._seen_utterance(ch, r.utterance_id)
            eager = self._open_eager[ch]
            if r.eager:
                self._open_eager[ch] = r
            elif r.is_final and eager is not None and r.utterance_id >= eager.utterance_id:
                self._open_eager[ch] = None
            if not r.is_final:
                # an utterance split at the length limit goes on under the next id with
                # no SPEECH_STARTED; its partials show it is open
                self._utterance_open(ch, r.utterance_id)
            else:
                self._answer_heard(ch, r.utterance_id)
                self._final_until[ch] = max(self._final_until[ch], r.end_s)
                self._final_start[ch] = r.start_s
                self._last_final[ch] = r.text
                self._language[ch] = r.language
                if r.utterance_id >= self._open_utterance[ch]:
                    self._speaking[ch] = False
        elif kind == "end_of_turn":
            turn = response.end_of_turn
            ch = min(turn.channel, len(self._speaking) - 1)
            self._end_heard(ch, turn.utterance_id, turn.offset_s)
        elif kind == "going_away":
            deadline = response.going_away.deadline_s
            self._going_away_at = time.monotonic() + deadline
            logger.info("server is going away in %.1f s; moving at the next boundary", deadline)
            asyncio.get_running_loop().call_later(
                max(0.0, deadline - MIGRATE_LEAD_S), self._move_before_the_deadline, self._call
            )
        self._kept.trim(self._replay_start())
        return True

    def _replay_start(self) -> int:
        """The first frame a replay would send now: the settled point, or the start of a
        last final the server would carry, if earlier; then LISTEN_LEAD_S before that."""
        return self._with_listen_lead(min([self._replay_frame(), *self._carried_frames().values()]))

    def _with_listen_lead(self, frame: int) -> int:
        """LISTEN_LEAD_S before ``frame``, on the grid (not before the stream's start)."""
        return max(0, frame - self._aligned(LISTEN_LEAD_S))

    def _end_heard(self, channel: int, utterance_id: int, offset_s: float) -> None:
        """A SPEECH_ENDED or EndOfTurn: its final or NO_WORDS is owed, unless it came."""
        if utterance_id > self._answered[channel]:
            self._ended_open[channel].setdefault(utterance_id, offset_s)

    def _answer_heard(self, channel: int, utterance_id: int) -> None:
        """A final or NO_WORDS: nothing is owed for this utterance, nor for any before."""
        self._answered[channel] = max(self._answered[channel], utterance_id)
        ended = self._ended_open[channel]
        for done in [u for u in ended if u <= utterance_id]:
            del ended[done]

    def _utterance_open(self, channel: int, utterance_id: int) -> None:
        if utterance_id >= self._open_utterance[channel]:
            self._open_utterance[channel] = utterance_id
            self._speaking[channel] = True

    def _seen_utterance(self, channel: int, utterance_id: int) -> None:
        self._next_utterance[channel] = max(self._next_utterance[channel], utterance_id + 1)

    def _settled_s(self) -> float:
        """Stream time up to which no channel can produce another result."""
        if self._server_settled_s is not None:
            return self._server_settled_s  # the server knows (Progress.settled_s)
        # an older server: estimate from the finals and speech events
        return min(
            until if speaking else max(until, self._processed_s - IDLE_MARGIN_S)
            for until, speaking in zip(self._final_until, self._speaking, strict=True)
        )

    def _replay_frame(self) -> int:
        return self._aligned(self._settled_s())

    def _aligned(self, t: float) -> int:
        align = round(ALIGN_S * self._rate)
        return int(t * self._rate) // align * align

    def _carried_frames(self) -> dict[int, int]:
        """Per channel whose last final the server would carry into its next, the frame
        a replay starts at to include that final: it may still be carried (short enough,
        and the settled point not yet past ``carry_gap_s`` after it)."""
        settled, policy = self._settled_s(), self.policy
        return {
            ch: self._aligned(start)
            for ch, (start, end) in enumerate(
                zip(self._final_start, self._final_until, strict=True)
            )
            if self._last_final[ch]
            and 0 < end - start <= policy.carry_max_s
            and settled - end <= policy.carry_gap_s
        }

    def _no_seat(self, error: StreamClosedError) -> bool:
        """The stream's first call was turned away for capacity (seat_wait_s applies)."""
        return not self._admitted and error.code == grpc.StatusCode.RESOURCE_EXHAUSTED

    def _should_migrate(self) -> bool:
        # once the caller has ended the stream nothing more is written: what is left is
        # the last finals, which the draining server sends within its deadline (or, if
        # not, the timer moves the stream a second before it). A move at the boundary
        # would send a finished stream to a new call: from a last replica, to a server
        # shutting down, and the caller would wait give_up_after_s for an error.
        if self._going_away_at is None or self._ended:
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
        except StreamClosedError as error:
            if self._failed is not None:
                raise self._failed from None
            # The break, as a writer meets it: a fast writer is held back from here on (a
            # reader that had not run yet started the outage only after a writer that does
            # not wait had sent everything: 130 s in no time, and the stream failed).
            if self._carried.is_set() and self._reader_waiting:
                self._carried.clear()
                self._outage_from_frame = self._kept.end
            # Nobody reads now. A break the next reading can resume (a push-to-talk agent
            # sends its next turn before it reads again) waits for it, with this write
            # kept. Anything else ends the stream here: a reading task cancelled cancels
            # its call (CANCELLED), and its audio was kept and dropped without a word.
            # (the stream's own cut to move before a drain's deadline is a break to resume)
            moving = self._cut_to_move is self._call
            if self._unread and not (is_resumable(error) or moving):
                self._failed = error
                raise
            if self._unread and self._kept.lost_until > self._replay_frame():
                # kept while nobody read, past what a resume can replay: say so now, not
                # minutes of writes later at the next reading loop
                self._failed = ResumeError(
                    error.code,
                    f"cannot resume the stream ({error.code.name}: {error.details}): more "
                    f"than {self.policy.max_kept_s:g} s of audio was sent while its events "
                    "were not read, and the oldest of it is gone",
                )
                raise self._failed from None

    async def _resume(self, error: StreamClosedError | None) -> None:
        """Carry the stream on a new call: after ``error`` broke or refused the current one,
        or (None) to leave a server that is going away."""
        now = time.monotonic()
        # the call left, broken or moved from: its old admission is no sign of a new seat
        self._broken = self._call
        if error is None:  # a loop left while the new call opens moves on, not fails
            self._cut_to_move = self._call
        first = not self._admitted  # no server has taken the stream yet: not a resume
        cause = "going away" if error is None else f"{error.code.name}: {error.details}"
        # told at once, not when the stream resumes: a person watching a live transcript
        # stall learns why (a planned move off a draining server is not told: it takes no
        # time a person would notice, and on_resume reports it). A new stream is told once
        # a second try is refused as well, unless it waits for a seat (seat_wait_s, short)
        waits = error is not None and (
            not first or (self._outage_since is not None and not self._no_seat(error))
        )
        if waits and not self._outage_told:
            self._outage_told = True
            info = OutageInfo(cause, not first, self.policy.give_up_after_s)
            self._tell("on_outage", self._on_outage, info)
        if self._outage_since is None:
            self._outage_since = self._trying_since = now
            self._backoff_s = self.policy.initial_backoff_s
            if self._carried.is_set():  # (unless a writer met the break first)
                self._carried.clear()
                self._outage_from_frame = self._kept.end
        else:
            # the last new call broke or was refused before it carried anything
            no_seat = error is not None and self._no_seat(error)
            limit = self.policy.seat_wait_s if no_seat else self.policy.give_up_after_s
            assert self._trying_since is not None
            if now - self._trying_since > limit:
                if no_seat and error is not None:
                    raise StreamClosedError(error.code, error.details)
                # (whatever a proxy's last refusal said, a stream no server ever took
                # found the service unavailable)
                raise ResumeError(
                    grpc.StatusCode.UNAVAILABLE if error is None or first else error.code,
                    f"could not {self._what_failed()} within {limit:g} s ({cause})",
                )
            with contextlib.suppress(TimeoutError):  # full jitter; cancel() ends it
                await asyncio.wait_for(self._cancelled.wait(), random.uniform(0, self._backoff_s))
            self._backoff_s = min(self.policy.max_backoff_s, self._backoff_s * 2)
        self._check_cancelled()
        self._call.cancel()
        if self._replay_task is not None:
            self._replay_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._replay_task
        await self._write_lock.acquire()
        released = False
        try:
            self._check_cancelled()
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
            # and from the start of each last final still kept that the server would
            # carry into the channel's next: it recognizes none of it again, and carries it
            carried = {
                ch: at for ch, at in self._carried_frames().items() if at >= self._kept.start
            }
            # and LISTEN_LEAD_S before that, of what is kept (for the channels' levels)
            start = max(self._kept.start, self._with_listen_lead(min([frame, *carried.values()])))
            self._kept.trim(start)
            offset_s = start / self._rate
            config = (
                self._config
                if first
                else self._resume_config(offset_s, frame / self._rate, frozenset(carried))
            )
            call = self._client._raw_stream(config, self._timeout_s)
            # a refusal shows up on the first read, and a call that failed at once on its
            # first write: either way the receiver reads its status and comes back here.
            # A host that never answers holds the write until grpc's connect timeout
            # (20 s): it is left when the outage's time is up, and the receiver gives up
            await self._within_outage(call.open())
            self._call = call
            if self._failed is not None:  # cancelled while the new call opened
                call.cancel()
                raise self._failed
            self._going_away_at = None
            items, self._acks_to_skip, self._acks_resent = replay_plan(
                self._kept.replay(),
                [self._finalizes.unacknowledged(ch) for ch in range(len(self._speaking))],
            )
            replayed_s = (self._kept.end - self._kept.start) / self._rate
            # the replay runs beside the receiver, which reads the new call's results;
            # the write lock keeps new audio behind the replayed audio. The task's done
            # callback releases it: a task cancelled before it ever ran runs no finally.
            self._replay_task = asyncio.create_task(self._replay(call, items))
            self._replay_task.add_done_callback(lambda _: self._write_lock.release())
            released = True
        finally:
            if not released:
                self._write_lock.release()
        if first:
            logger.info("stream %s refused (%s); trying again", self.session_id, cause)
        elif self._resuming is None or error is None:
            self._resuming = ResumeInfo(0, cause, offset_s, replayed_s, 0.0)
        else:  # another try within one outage: keep its first cause
            self._resuming = dataclasses.replace(
                self._resuming, stream_offset_s=offset_s, replayed_s=replayed_s
            )

    async def _within_outage(self, step: Coroutine[Any, Any, T]) -> tuple[bool, T | None]:
        """(True, its result) if ``step`` finished before the outage's time was up
        (``give_up_after_s`` since the break, plus one backoff, the bound the policy
        promises: a try answered at once still says how it ended), else (False, None),
        ``step`` cancelled. A StreamClosedError of it counts as finished: its call's
        status says the rest. A cancel() meanwhile ends the wait at once, (False, None):
        the caller finds the stream failed (a call to a host that never answers held it
        for grpc's connect timeout, 20 s)."""
        assert self._trying_since is not None
        policy = self.policy
        left = self._trying_since + policy.give_up_after_s + policy.max_backoff_s - time.monotonic()
        task = asyncio.ensure_future(step)
        cancelled = asyncio.ensure_future(self._cancelled.wait())
        try:
            done, _ = await asyncio.wait(
                {task, cancelled}, timeout=max(0.0, left), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            cancelled.cancel()
            if not task.done():  # out of time, cancel(), or this task cancelled
                task.cancel()
        if task not in done:
            return False, None
        try:
            return True, task.result()
        except StreamClosedError:
            return True, None

    async def _admitted_in_time(self, call: RecognitionStream) -> bool:
        """Whether a server admitted the outage's new ``call``, waiting no longer than the
        outage may last (``give_up_after_s``): a call to a host that takes the connection
        and never answers (a half-open balancer, a dropped SYN) would wait out grpc's own
        connect timeout (20 s) first, past a shorter give_up_after_s."""
        limit = self.policy.give_up_after_s
        answered, admitted = await self._within_outage(call.admitted())
        if self._failed is not None:  # cancelled meanwhile
            call.cancel()
            raise self._failed
        if answered:
            return bool(admitted)
        call.cancel()
        cause = self._resuming.cause if self._resuming is not None else "no answer"
        raise ResumeError(
            grpc.StatusCode.UNAVAILABLE,
            f"could not {self._what_failed()} within {limit:g} s ({cause}; the last try had "
            "no answer)",
        )

    def _what_failed(self) -> str:
        """What giving up failed to do: a stream no server ever took was not resumed, it
        never started."""
        return "resume the stream" if self._admitted else "start the stream (no server took it)"

    def _resumed(self) -> None:
        """A new call was admitted: the outage is over; a resume is counted and told."""
        assert self._outage_since is not None
        outage_s = time.monotonic() - self._outage_since
        self._outage_since = self._trying_since = None
        self._outage_told = False
        self._carried.set()
        self._admitted = True
        if self._resuming is None:
            return  # the stream's first seat, after refusals
        self.resumes += 1
        info = dataclasses.replace(self._resuming, count=self.resumes, outage_s=outage_s)
        self._resuming = None
        self._notices.extend(self._withdrawn_utterances())
        logger.info(
            "stream %s resumed (%s) at %.2f s, replaying %.2f s",
            self.session_id,
            info.cause,
            info.stream_offset_s,
            info.replayed_s,
        )
        self._tell("on_resume", self._on_resume, info)

    def _tell(self, name: str, callback: Callable[[Any], None] | None, info: object) -> None:
        """Call the caller's notification, if any: a bug in it is logged, and the stream
        goes on (raised, it ended the stream in the middle of its resume)."""
        if callback is None:
            return
        try:
            callback(info)
        except Exception:
            logger.exception("stream %s: its %s callback failed", self.session_id, name)

    def _withdrawn_utterances(self) -> list[asr_pb2.StreamingRecognizeResponse]:
        """SPEECH_RESUMED for each utterance the broken call left open past a promise:
        an eager result without its final, or a SPEECH_ENDED or EndOfTurn without its
        final or NO_WORDS. The new call hears that speech again under a new id, so the
        server sends neither for the old one, and a caller that began answering on it
        would wait for it forever (or, told the turn ended, hear it end twice)."""
        notices = []
        for channel, (eager, ended) in enumerate(
            zip(self._open_eager, self._ended_open, strict=True)
        ):
            open_ids = dict(ended)
            if eager is not None:  # the eager text went this far; no further
                open_ids[eager.utterance_id] = eager.end_s
            for utterance_id, offset_s in sorted(open_ids.items()):
                event = asr_pb2.SpeechEvent(
                    type=asr_pb2.SpeechEvent.SPEECH_RESUMED,
                    offset_s=offset_s,
                    channel=channel,
                    utterance_id=utterance_id,
                )
                progress = asr_pb2.Progress()
                progress.CopyFrom(self._last_progress)
                notices.append(
                    asr_pb2.StreamingRecognizeResponse(speech_event=event, progress=progress)
                )
            self._open_eager[channel] = None
            ended.clear()
        return notices

    async def _replay(self, call: RecognitionStream, items: list[bytes | FinalizeRequest]) -> None:
        try:
            for data in items:
                if isinstance(data, FinalizeRequest):
                    await call.finalize(data.channel)
                else:
                    await call.send_audio(data)
            if self._ended:
                await call.end()
        except StreamClosedError:
            pass  # the receiver sees the break and resumes again

    def _resume_config(
        self, offset_s: float, settled_s: float = 0.0, carried: frozenset[int] = frozenset()
    ) -> asr_pb2.StreamingConfig:
        """``settled_s``: nothing before it is recognized again (a replay from an earlier
        last final recognizes none of the rest again); ``carried``: the channels whose last final
        is in the replay."""
        config = asr_pb2.StreamingConfig()
        config.CopyFrom(self._config)
        config.resume.CopyFrom(
            asr_pb2.ResumeFrom(
                stream_offset_s=offset_s,
                session_id=self.session_id,
                channels=[
                    asr_pb2.ChannelResume(
                        next_utterance_id=self._next_utterance[c],
                        final_until_s=max(self._final_until[c], settled_s),
                        previous_text=self._last_final[c][-1000:],
                        language=self._language[c],
                        previous_start_s=self._final_start[c] if c in carried else 0.0,
                        previous_end_s=self._final_until[c] if c in carried else 0.0,
                        client_finalizes=self._client_finalizes[c],
                    )
                    for c in range(len(self._final_until))
                ],
            )
        )
        return config
