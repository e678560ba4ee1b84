"""Play many calls to a server at once, in real time, and record what each stream saw.

Each call is one StreamingRecognize stream: a sender paces the audio on an absolute
schedule (chunk i goes out once the last sample it holds would exist in a live call) and a
receiver records results as they come. Latencies are measured from that schedule, not
from when a write finished, so time lost to the server's backpressure counts against it,
as a caller would feel it; and from when the *chunk* holding the moment was whole, so the
client's own chunking (half a chunk on average) is left out (bench/streaming_bench.py
times from the sample itself):

* time to first partial: from when the audio where the server heard speech start existed
  (its SPEECH_STARTED offset) to the first partial of that utterance;
* end of speech to final: from when the audio where speech ended existed (SPEECH_ENDED)
  to the final; finals with no speech end (an utterance split at a pause or cut at the
  length limit, or the call ending inside it) are not endpointing and not counted: the
  report says how many finals were.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc

from asr_api.v1 import asr_pb2
from asr_client.api import AsrClient, StreamClosedError, audio_config
from asr_client.connection import ConnectionOptions
from asr_client.load.calls import Call
from asr_client.resume import ResumeInfo, ResumePolicy


@dataclass
class FinalResult:
    channel: int
    start_s: float
    end_s: float
    text: str


@dataclass
class StreamOutcome:
    call: Call
    silent: bool
    status: str = "PENDING"  # then OK or a gRPC status code name
    error: str = ""
    audio_sent_s: float = 0.0
    audio_processed_s: float = 0.0  # the server's last Progress
    max_lag_s: float = 0.0  # the server's largest reported lag
    max_send_delay_s: float = 0.0  # how far the sender fell behind real time (backpressure)
    partials: int = 0
    finals: list[FinalResult] = field(default_factory=list)
    #: per utterance that had a partial before its final
    first_partial_s: list[float] = field(default_factory=list)
    final_latency_s: list[float] = field(default_factory=list)
    #: finals of utterances that had no partial before them: under load partials back
    #: off, and an utterance may end before its first one (first_partial_s omits these)
    finals_without_partial: int = 0
    resumes: int = 0  # times the stream continued on a new call after a break

    @property
    def rejected(self) -> bool:
        return self.status == grpc.StatusCode.RESOURCE_EXHAUSTED.name

    def hypothesis(self, channel: int) -> str:
        chosen = sorted((f for f in self.finals if f.channel == channel), key=lambda f: f.start_s)
        return " ".join(f.text for f in chosen)


@dataclass
class LoadOptions:
    chunk_ms: int = 100
    speed: float = 1.0
    language: str = ""
    interim_results: bool = True
    ramp_s: float = 0.0  # stream k starts at k/N of the ramp
    connections: int = 1
    connect_timeout_s: float = 10.0
    resume: bool = True  # streams continue on a new call when theirs breaks


#: audio processed this close to a call's end counts as all of it (_made_by_call_end)
_CALL_END_SLACK_S = 0.005


class _Stream:
    """One call played to the server."""

    def __init__(self, outcome: StreamOutcome, options: LoadOptions) -> None:
        self.outcome = outcome
        self.options = options
        call = outcome.call
        self.step = max(1, call.sample_rate_hz * options.chunk_ms // 1000)  # frames per chunk
        self.t0 = 0.0
        self._speech_start: dict[tuple[int, int], float] = {}
        self._speech_end: dict[tuple[int, int], float] = {}
        self._partial_seen: set[tuple[int, int]] = set()

    def chunk_end(self, index: int) -> int:
        """The frame just past chunk ``index`` (the last chunk may be short)."""
        return min(len(self.outcome.call.frames), (index + 1) * self.step)

    def due_at(self, frame: int) -> float:
        """Wall time (monotonic) at which audio up to ``frame`` exists in a live call."""
        return self.t0 + frame / self.outcome.call.sample_rate_hz / self.options.speed

    def existed_at(self, audio_s: float) -> float:
        """Wall time (monotonic) at which the chunk holding audio time ``audio_s`` existed:
        when its last sample did, which is when it is sent."""
        frame = round(audio_s * self.outcome.call.sample_rate_hz)
        return self.due_at(self.chunk_end(max(0, math.ceil(frame / self.step) - 1)))

    async def play(self, client: AsrClient) -> None:
        call, out = self.outcome.call, self.outcome
        config = audio_config(
            sample_rate_hz=call.sample_rate_hz,
            encoding=call.encoding,
            channels=call.channels,
            language=self.options.language,
            interim_results=self.options.interim_results,
        )
        try:
            async with client.stream(config, on_resume=self._resumed) as stream:
                self.t0 = time.monotonic()
                async with asyncio.TaskGroup() as tasks:
                    tasks.create_task(self._send(stream))
                    tasks.create_task(self._receive(stream))
            out.status = grpc.StatusCode.OK.name
        except* StreamClosedError as group:
            error = group.exceptions[0]
            assert isinstance(error, StreamClosedError)
            out.status, out.error = error.code.name, error.details

    def _resumed(self, info: ResumeInfo) -> None:
        self.outcome.resumes = info.count

    async def _send(self, stream) -> None:  # type: ignore[no-untyped-def]
        call, out = self.outcome.call, self.outcome
        payload = call.payload()
        chunk_bytes = self.step * call.bytes_per_frame
        try:
            for i, offset in enumerate(range(0, len(payload), chunk_bytes)):
                # A live source has a chunk once its last sample exists, not its first.
                due = self.due_at(self.chunk_end(i))
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                await stream.send_audio(payload[offset : offset + chunk_bytes])
                late = time.monotonic() - due
                out.max_send_delay_s = max(out.max_send_delay_s, late)
                out.audio_sent_s = self.chunk_end(i) / call.sample_rate_hz
            await stream.end()
        except StreamClosedError:
            return  # the receiver reports the server's status

    async def _receive(self, stream) -> None:  # type: ignore[no-untyped-def]
        out = self.outcome
        async for response in stream:
            now = time.monotonic()
            if response.HasField("progress"):
                out.audio_processed_s = response.progress.audio_processed_s
                out.max_lag_s = max(out.max_lag_s, response.progress.lag_s)
            if response.HasField("speech_event"):
                ev = response.speech_event
                key = (ev.channel, ev.utterance_id)
                if ev.type == asr_pb2.SpeechEvent.SPEECH_STARTED:
                    self._speech_start[key] = ev.offset_s
                elif ev.type == asr_pb2.SpeechEvent.SPEECH_ENDED and not self._made_by_call_end(
                    response.progress
                ):
                    self._speech_end[key] = ev.offset_s
            elif response.HasField("result"):
                self._result(response.result, now)

    def _made_by_call_end(self, progress: asr_pb2.Progress) -> bool:
        """A speech end the end of the call made: the server ends an utterance still open
        there once it has all the call's audio, without the silence endpointing waits
        for, so its final is no endpointing latency. Its SPEECH_ENDED says where the voice
        stopped, up to a whole endpointing silence before the end (a call ending 300 ms
        after its last word); what tells it apart is the progress it comes with: all the
        audio processed. An endpointed end comes once its silence has been heard, before
        the end of a call that goes on past it."""
        return progress.audio_processed_s >= self.outcome.call.duration_s - _CALL_END_SLACK_S

    def _result(self, result: asr_pb2.Result, now: float) -> None:
        out = self.outcome
        key = (result.channel, result.utterance_id)
        if key not in self._partial_seen and not result.is_final:
            self._partial_seen.add(key)
            start = self._speech_start.get(key, result.start_s)
            out.first_partial_s.append(now - self.existed_at(start))
        if result.is_final:
            out.finals_without_partial += key not in self._partial_seen
            end = self._speech_end.get(key)
            # no speech end: the server split the utterance at a pause (its end_s is the
            # pause's pad, 200 ms after the speech) or cut it at the length limit, or the
            # call ended inside it (its end not kept: _made_by_call_end); none is endpointing,
            # whose latency this measures
            if end is not None:
                out.final_latency_s.append(now - self.existed_at(end))
            out.finals.append(
                FinalResult(result.channel, result.start_s, result.end_s, result.text)
            )
        else:
            out.partials += 1


async def run_load(
    server: str | ConnectionOptions,
    calls: Sequence[tuple[Call, bool]],
    options: LoadOptions,
    *,
    on_tick: Callable[[Sequence[StreamOutcome], float], None] | None = None,
    tick_s: float = 1.0,
) -> list[StreamOutcome]:
    """Play every ``(call, silent)`` at once (spread over the ramp); return their outcomes."""
    outcomes = [StreamOutcome(call, silent) for call, silent in calls]
    # No retries: a refusal is the capacity signal this tool reports, not something to hide.
    resume = ResumePolicy() if options.resume else None
    # Equal channel arguments share grpc's global subchannel pool, and so one TCP
    # connection: a local pool per client makes each of --connections its own.
    own_connection = [("grpc.use_local_subchannel_pool", 1)]
    clients = [
        AsrClient(server, retry=False, resume=resume, options=own_connection)
        for _ in range(max(1, options.connections))
    ]
    try:
        await asyncio.gather(*(c.wait_ready(options.connect_timeout_s) for c in clients))
        started = time.monotonic()

        async def one(k: int, outcome: StreamOutcome) -> None:
            if options.ramp_s and len(outcomes) > 1:
                await asyncio.sleep(options.ramp_s * k / len(outcomes))
            await _Stream(outcome, options).play(clients[k % len(clients)])

        async def ticker() -> None:
            while True:
                await asyncio.sleep(tick_s)
                if on_tick is not None:
                    on_tick(outcomes, time.monotonic() - started)

        tick = asyncio.create_task(ticker())
        try:
            await asyncio.gather(*(one(k, o) for k, o in enumerate(outcomes)))
        finally:
            tick.cancel()
        if on_tick is not None:
            on_tick(outcomes, time.monotonic() - started)
    finally:
        await asyncio.gather(*(c.close() for c in clients))
    return outcomes
