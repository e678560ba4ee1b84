"""A stream session driven chunk by chunk with the fake engine and an energy VAD (no grpc)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import numpy as np
import pytest

from asr_client.speech_level import at_speech_level
from asr_server.audio.decode import AudioFormat, Encoding
from asr_server.engine.base import (
    DecodeKind,
    DecodeRequest,
    EngineCapabilities,
    Hypothesis,
    WordTiming,
)
from asr_server.engine.fake import FakeEngine
from asr_server.engine.scheduler import EngineError, EngineScheduler
from asr_server.engine.text import spoken_words, without_unheard_loops
from asr_server.errors import AsrError, Status
from asr_server.metrics import Metrics
from asr_server.session import (
    Finalize,
    Progress,
    RecognitionResult,
    SessionServices,
    SpeechBoundary,
    SpeechResumed,
    StreamConfig,
    StreamDone,
    StreamSession,
)
from asr_server.session.types import (
    ChannelStart,
    ConfigUpdate,
    EndOfTurn,
    Finalized,
    NoWords,
    ResumeState,
    TurnEndReason,
)
from asr_server.session.utterance import UtteranceAudio
from asr_server.session.utterance_state import EarlyFinal, UtteranceState
from asr_server.settings import Settings
from asr_server.vad.base import SpeechCheck, VoiceDetector
from asr_server.vad.energy import EnergyVoiceDetector
from asr_server.vad.silero import silero_hears_speech
from asr_server.vad.turn import TurnDetection, TurnVerdict
from asr_server.vad.webrtc import WebRtcVoiceDetector
from tests.helpers import (
    corpus,
    entered,
    eventually,
    first_channel,
    read_pcm16,
    silence,
    tone,
)

SR = 16_000


def pcm16(x: np.ndarray) -> bytes:
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


async def chunks(
    data: bytes,
    chunk_bytes: int = 3200,
    *,
    pulled: list[int] | None = None,
    extra: list[object] | None = None,
) -> AsyncIterator[object]:
    for i in range(0, len(data), chunk_bytes):
        if pulled is not None:
            pulled.append(i + chunk_bytes)
        yield data[i : i + chunk_bytes]
    for item in extra or []:
        yield item


async def finalized_between(
    first: bytes, second: bytes, chunk_bytes: int = 3200
) -> AsyncIterator[object]:
    """``first``'s chunks, the client's FINALIZE, then ``second``'s."""
    async for c in chunks(first, chunk_bytes):
        yield c
    yield Finalize()
    async for c in chunks(second, chunk_bytes):
        yield c


class Harness:
    """Runs a session; with ``lockstep`` each chunk waits until the previous one is fully
    processed and the engine is idle, so partials are deterministic without real time."""

    def __init__(
        self,
        engine: FakeEngine | None = None,
        turn: TurnDetection | None = None,
        speech_check: SpeechCheck | None = None,
        vad: Callable[[], VoiceDetector] = EnergyVoiceDetector,
        **streaming: object,
    ) -> None:
        self.engine = engine or FakeEngine()
        self.vad = vad
        self.turn = turn
        self.speech_check = speech_check
        self.metrics = Metrics()
        s = Settings()
        self.settings = s.model_copy(update={"streaming": s.streaming.model_copy(update=streaming)})
        self.events: list[object] = []
        self.progress: list[Progress] = []
        self.session: StreamSession | None = None
        self.scheduler: EngineScheduler | None = None

    async def settle(self) -> None:
        assert self.session is not None and self.scheduler is not None
        decoder = self.session._decoder
        # (audio at another rate than 16 kHz: less what the resampler holds back, < 4 ms)
        sent = decoder.input_samples / decoder.format.sample_rate_hz
        if decoder.format.sample_rate_hz != SR:
            sent -= 0.004
        session, scheduler = self.session, self.scheduler
        await eventually(
            lambda: session.progress.audio_processed_s >= sent - 1e-6 and scheduler.idle
        )
        for _ in range(10):  # let result callbacks run and emit
            await asyncio.sleep(0)

    async def lockstep(self, source: AsyncIterator[object]) -> AsyncIterator[object]:
        async for item in source:
            yield item
            await self.settle()

    async def run(
        self,
        source: AsyncIterator[object],
        *,
        channels: int = 1,
        sample_rate: int = SR,
        interim: bool = True,
        max_utterance_ms: int = 15_000,
        send: Callable[[object, Progress], Awaitable[None]] | None = None,
        **config: object,
    ) -> list[object]:
        """The session's events; ``send`` (what the writer calls) instead of recording them."""
        scheduler = EngineScheduler(
            self.engine,
            self.metrics,
            workers=self.engine.workers,
        )
        await scheduler.start()
        config = StreamConfig(
            AudioFormat(Encoding.LINEAR16, sample_rate, channels),
            interim_results=interim,
            max_utterance_ms=max_utterance_ms,
            **config,  # type: ignore[arg-type]
        )
        services = SessionServices(
            self.settings,
            scheduler,
            self.metrics,
            self.vad,
            turn=self.turn,
            speech_check=self.speech_check,
        )
        session = StreamSession(config, services, "test")
        self.session, self.scheduler = session, scheduler

        async def record(event: object, progress: Progress) -> None:
            self.events.append(event)
            self.progress.append(progress)

        try:
            await session.run(source, send or record)  # type: ignore[arg-type]
        finally:
            await scheduler.close()
        return self.events


def results(events: list[object], final: bool | None = None) -> list[RecognitionResult]:
    return [
        e
        for e in events
        if isinstance(e, RecognitionResult) and (final is None or e.is_final == final)
    ]


async def test_partials_then_final_with_stable_prefix_that_never_changes() -> None:
    audio = np.concatenate([silence(0.5), tone(3.0), silence(1.0)])
    h = Harness(commit_partials=True)
    events = await h.run(h.lockstep(chunks(pcm16(audio))))
    kinds = [
        type(e).__name__ + (str(e.is_final) if isinstance(e, RecognitionResult) else "")
        for e in events
    ]
    assert kinds[0] == "SpeechBoundary"
    assert events[0] == SpeechBoundary(True, pytest.approx(0.5, abs=0.03), 0, 0)  # the onset
    # the last event closes the stream with progress that accounts for all the audio
    assert kinds[-1] == "StreamDone"
    assert h.progress[-1].audio_processed_s == h.progress[-1].audio_received_s == 4.5
    assert kinds[-2] == "RecognitionResultTrue"
    assert kinds.count("RecognitionResultTrue") == 1
    assert kinds.count("RecognitionResultFalse") >= 1
    assert events[-3] == SpeechBoundary(False, pytest.approx(3.5, abs=0.05), 0, 0)
    final = results(events, final=True)[0]
    assert final.text == " ".join(f"w{i}" for i in range(12))  # 3 s / 0.25 s per word
    stable_seen = ""
    for partial in results(events, final=False):
        assert partial.stable_text.startswith(stable_seen)
        assert partial.text.startswith(partial.stable_text)
        stable_seen = partial.stable_text
    assert final.text.startswith(stable_seen)
    assert stable_seen  # (something was committed)
    assert final.start_s == pytest.approx(0.2, abs=0.05)  # speech at 0.5 s minus pre-roll


async def test_by_default_nothing_is_committed_and_the_final_is_decoded_freely() -> None:
    """Greedy partials forced into finals cost accuracy (bench/accuracy_breakdown.py), so
    unless commit_partials is set every partial is unstable and no decode has a prefix."""
    audio = np.concatenate([silence(0.5), tone(3.0), silence(1.0)])
    h = Harness()
    events = await h.run(h.lockstep(chunks(pcm16(audio))))
    partials = results(events, final=False)
    assert len(partials) >= 3
    assert all(p.stable_text == "" and p.unstable_text == p.text for p in partials)
    assert all(r.prefix == "" for call in h.engine.calls for r in call)
    assert results(events, final=True)[0].text == " ".join(f"w{i}" for i in range(12))


async def test_finals_and_eager_results_say_how_sure_the_model_is() -> None:
    """The decoder's confidence (the fake engine's is 0.9) reaches finals and eager
    results, never greedy partials, and each final's goes to asr_final_confidence."""
    audio = np.concatenate([silence(0.5), tone(2.0), silence(0.35), tone(1.0), silence(1.0)])
    h = Harness()
    events = await h.run(h.lockstep(chunks(pcm16(audio))), eager_finals=True)
    eager = [e for e in results(events) if e.eager]
    partials = [e for e in results(events, final=False) if not e.eager]
    (final,) = results(events, final=True)
    assert eager and partials
    assert [e.confidence for e in [*eager, final]] == pytest.approx([0.9] * (len(eager) + 1))
    assert all(p.confidence == 0.0 for p in partials)
    registry = h.metrics.registry
    assert registry.get_sample_value("asr_final_confidence_count") == 1
    assert registry.get_sample_value("asr_final_confidence_sum") == pytest.approx(0.9)
    assert registry.get_sample_value("asr_final_confidence_bucket", {"le": "0.85"}) == 0


async def test_eager_finals_come_at_a_pause_and_are_withdrawn_when_speech_resumes() -> None:
    # a 0.35 s pause (shorter than the 0.5 s endpoint) inside the utterance, then the end
    audio = np.concatenate([silence(0.5), tone(2.0), silence(0.35), tone(1.0), silence(1.0)])
    h = Harness()
    events = await h.run(h.lockstep(chunks(pcm16(audio))), eager_finals=True)
    eager = [e for e in results(events) if e.eager]
    resumed = [e for e in events if isinstance(e, SpeechResumed)]
    final = results(events, final=True)
    assert len(eager) == 2 and len(final) == 1 and len(resumed) == 1
    first, second = eager
    # the first pause: the text so far, then withdrawn when the tone comes back
    assert first.text == " ".join(f"w{i}" for i in range(8))
    assert not first.is_final and first.utterance_id == resumed[0].utterance_id == 0
    assert resumed[0].offset_s == pytest.approx(2.85, abs=0.05)
    i_first, i_resumed, i_second, i_final = (
        events.index(x) for x in (first, resumed[0], second, final[0])
    )
    assert i_first < i_resumed < i_second < i_final
    # nothing but its withdrawal or its final follows an eager result
    assert not results(events[i_first + 1 : i_resumed])
    assert results(events[i_second + 1 : i_final]) == []
    # the final is what the second eager result said it would be
    assert second.text == final[0].text == " ".join(f"w{i}" for i in range(12))
    # an eager result is not stable: what may be withdrawn is not in stable_text
    for e in eager:
        assert e.stable_text == "" or e.text.startswith(e.stable_text)
        assert e.unstable_text
    assert h.metrics.results.labels("eager")._value.get() == 2
    assert h.metrics.speech_events.labels("resumed")._value.get() == 1


@pytest.mark.parametrize("commit_partials", [False, True])
async def test_an_eager_result_the_length_limit_overtakes_in_its_pause_is_the_final(
    commit_partials: bool,
) -> None:
    """The proto: an eager result is followed by its utterance's final with the eager
    text, or by SPEECH_RESUMED. An utterance that reaches the length limit in the pause of
    its eager result ends there with that result, although the speaker has not stopped
    for long (before, it was cut again and its final lost the eager text's last words,
    or ended elsewhere)."""
    audio = np.concatenate([silence(0.5), tone(9.3), silence(3.0)])
    h = Harness(commit_partials=commit_partials)
    events = await h.run(
        h.lockstep(chunks(pcm16(audio), 640)),
        eager_finals=True,
        max_utterance_ms=10_000,
        silence_ms=1000,
    )
    eager = [e for e in results(events) if e.eager]
    assert eager
    for e in eager:
        if any(isinstance(x, SpeechResumed) and x.utterance_id == e.utterance_id for x in events):
            continue
        (final,) = [f for f in results(events, final=True) if f.utterance_id == e.utterance_id]
        assert (final.text, final.end_s) == (e.text, e.end_s)
    # every word of the tone once, in order, across the finals
    words = " ".join(f.text for f in results(events, final=True)).split()
    assert words == [f"w{i}" for i in range(len(words))]


@pytest.mark.parametrize("final_until_s", [1.48, 1.72])
async def test_a_resumed_channel_starts_no_final_inside_audio_already_final(
    final_until_s: float,
) -> None:
    """Audio before a channel's final_until_s starts no utterance, and the first
    utterance after it takes no pre-roll from it: its final starts at that point, not up
    to 300 ms inside the final the client already has (speech resumed at once: an
    utterance cut by the length limit or a finalize just before the break). A point
    inside the speech (1.72 s, inside a 30 ms frame the detector hears voiced) is where
    the utterance starts and its speech too."""
    audio = np.concatenate([silence(1.5), tone(2.0), silence(1.0)])
    h = Harness()
    resume = ResumeState(
        10.0, (ChannelStart(next_utterance_id=7, final_until_sample=int(final_until_s * SR)),)
    )
    events = await h.run(h.lockstep(chunks(pcm16(audio))), resume=resume)
    (final,) = results(events, final=True)
    (started,) = [e for e in events if isinstance(e, SpeechBoundary) and e.started]
    # (times here are this connection's: the transport adds the stream offset)
    assert final.utterance_id == 7 == started.utterance_id
    assert final.start_s == pytest.approx(final_until_s, abs=1e-3)
    assert started.offset_s == pytest.approx(max(1.5, final_until_s), abs=0.03)
    assert started.offset_s >= final_until_s - 1e-6
    (asked,) = [c[0] for c in h.engine.calls if c[0].kind is DecodeKind.FINAL]
    assert asked.audio.size <= (5.0 - final_until_s) * SR


async def test_no_audio_is_in_two_finals_where_a_split_cut_into_a_quiet_talker_s_pause() -> None:
    """On a raised (quiet) channel the pause after a final's end (its last voiced frame
    and the 0.2 s pad) is held for the next utterance; but a split at the length limit,
    60 ms into a pause on a stream whose client finalizes (no final heard the whole pad
    there), cut further into it: 0.18 s was in two finals, and settled_s went back
    (the pause reviewer's case: -45 dBFS over noise at -58, a 2 s limit)."""
    rng = np.random.default_rng(10)
    talk = at_speech_level(first_channel(corpus()["libri_1089-134691-0001"].path), -45)
    parts = [silence(1.0)]
    for _ in range(4):
        length, at = rng.uniform(1.0, 1.8), int(rng.uniform(0, 2.0) * SR)
        parts += [talk[at : at + int(length * SR)], silence(rng.uniform(0.5, 0.9))]
    audio = np.concatenate(parts)
    audio += (rng.standard_normal(audio.size) * 10 ** (-58 / 20)).astype(np.float32)
    h = Harness(vad=lambda: WebRtcVoiceDetector(3))
    head, tail = pcm16(audio[: int(0.3 * SR)]), pcm16(audio[int(0.3 * SR) :])
    events = await h.run(
        h.lockstep(finalized_between(head, tail)), max_utterance_ms=2000, silence_ms=500
    )
    spans = [(f.start_s, f.end_s) for f in results(events, final=True)]
    assert len(spans) >= 4
    assert all(a[1] <= b[0] + 1e-6 for a, b in zip(spans, spans[1:], strict=False)), spans
    settled = [p.settled_s for p in h.progress]
    assert settled == sorted(settled)


def carrying_engine() -> FakeEngine:
    """A fake engine that takes carried context (it names words by place, so the new
    utterance's words continue the numbering of the carried ones)."""
    return FakeEngine(capabilities=EngineCapabilities(context_carry=True))


async def test_a_final_is_decoded_after_the_previous_one_across_a_short_pause() -> None:
    # 1 s of speech, a 1 s pause (an endpoint), 2 s, then a 3 s pause, 1 s
    audio = np.concatenate(
        [silence(0.5), tone(1.0), silence(1.0), tone(2.0), silence(3.0), tone(1.0), silence(1.0)]
    )
    h = Harness(carrying_engine(), carry_max_s=10.0, carry_gap_s=2.0)
    events = await h.run(h.lockstep(chunks(pcm16(audio))), interim=False)
    finals = results(events, final=True)
    finals_asked = [c[0] for c in h.engine.calls if c[0].kind is DecodeKind.FINAL]
    first, second, third = finals_asked[0], finals_asked[1], finals_asked[-1]
    assert first.prefix == ""
    # the second final is decoded after the first's audio, its text forced ahead of it
    assert second.prefix == finals[0].text == "w0 w1 w2 w3"
    assert second.audio.size > 2 * SR + first.audio.size - SR // 10
    # the fake hears w0..w11 over both; the final is only what the new audio said
    assert finals[1].text == " ".join(f"w{i}" for i in range(4, 12))
    # after the 3 s pause nothing is carried
    assert third.prefix == "" and third.audio.size < 1.6 * SR
    assert len(finals) == 3


async def test_a_resumed_channel_carries_the_final_its_client_replays() -> None:
    """The client replays its last final's audio (ChannelStart.previous_samples): heard
    as silence, and carried into the next final with its text, as on the uncut stream."""
    audio = np.concatenate([silence(0.48), tone(1.0), silence(1.0), tone(2.0), silence(1.0)])
    h = Harness(carrying_engine(), carry_max_s=10.0, carry_gap_s=2.0)
    previous = (int(0.48 * SR), int(1.48 * SR))
    start = ChannelStart(
        next_utterance_id=3,
        final_until_sample=previous[1],
        previous_text="w0 w1 w2 w3",
        language="en",
        previous_samples=previous,
    )
    events = await h.run(h.lockstep(chunks(pcm16(audio))), resume=ResumeState(10.0, (start,)))
    (final,) = results(events, final=True)
    (asked,) = [c[0] for c in h.engine.calls if c[0].kind is DecodeKind.FINAL]
    assert asked.prefix == "w0 w1 w2 w3"
    assert asked.audio.size > SR + 2 * SR  # the replayed second, then the new speech
    assert np.abs(asked.audio[: SR // 2]).max() > 0.1  # the replayed tone, not silence
    # as uncut: the fake hears w0..w11 over both; the final is what the new audio said
    assert (final.utterance_id, final.text) == (3, " ".join(f"w{i}" for i in range(4, 12)))


@pytest.mark.parametrize("language", [None, "de"])
async def test_a_detecting_stream_hears_each_final_alone(language: str | None) -> None:
    """Language detection on a final must hear only that utterance (a change of language
    would be drowned by the carried one): carry only when the language is set."""
    engine = FakeEngine(
        capabilities=EngineCapabilities(context_carry=True, language_detection=True)
    )
    audio = np.concatenate([silence(0.5), tone(1.0), silence(1.0), tone(2.0), silence(1.0)])
    h = Harness(engine, carry_max_s=10.0)
    await h.run(h.lockstep(chunks(pcm16(audio))), interim=False, language=language)
    second = [c[0] for c in engine.calls if c[0].kind is DecodeKind.FINAL][-1]
    assert bool(second.prefix) == (language is not None)


class HearsNothingAtFirst(FakeEngine):
    """Like Whisper on a syllable or two: no words until 0.85 s of speech."""

    def _hear(self, req):  # type: ignore[no-untyped-def]
        if np.count_nonzero(np.abs(req.audio) > 1e-3) < 0.85 * SR:
            return Hypothesis("", req.language or "en", rejected=True)
        return super()._hear(req)


async def test_until_the_first_words_partials_are_asked_more_often() -> None:
    engine = HearsNothingAtFirst()
    audio = np.concatenate([silence(0.5), tone(3.0), silence(1.0)])
    h = Harness(engine)
    events = await h.run(h.lockstep(chunks(pcm16(audio), 640)))  # 20 ms chunks
    first = results(events, final=False)[0]
    shown_at = h.progress[events.index(first)].audio_processed_s
    # asked again as soon as an empty answer is back and 50 ms more audio came (here at
    # every third 20 ms chunk): shown within 60 ms of the 0.85 s it needs (asked every
    # 0.5 s, at 1.2 s of speech)
    assert 0.5 + 0.85 <= shown_at <= 0.5 + 0.85 + 0.065, shown_at
    partial_asks = [c[0].audio.size / SR for c in engine.calls if c[0].kind is DecodeKind.PARTIAL]
    later = [b - a for a, b in zip(partial_asks, partial_asks[1:], strict=False) if a > 1.2]
    assert later and min(later) >= 0.45  # then the usual cadence


async def test_first_partial_asks_go_one_at_a_time() -> None:
    """Asks before the first words wait for the previous answer: a slow engine (or a busy
    one) gets fewer of them, never a pile of urgent decodes of the same stream."""
    running, most = [0], [0]
    lock = threading.Lock()

    def slow_partials(requests) -> None:  # type: ignore[no-untyped-def]
        if requests[0].kind is DecodeKind.PARTIAL:
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            time.sleep(0.15)
            with lock:
                running[0] -= 1

    engine = HearsNothingAtFirst(workers=2, on_call=slow_partials)
    h = Harness(engine)

    reached: list[float] = []  # wall time from the first chunk to 0.85 s of audio

    async def paced() -> AsyncIterator[object]:
        t0, sent = time.monotonic(), 0
        async for chunk in chunks(pcm16(np.concatenate([tone(2.0), silence(1.0)])), 640):
            yield chunk
            sent += 320
            if sent >= 0.85 * SR and not reached:
                reached.append(time.monotonic() - t0)
            await asyncio.sleep(0.01)  # audio at twice real time

    events = await h.run(paced())
    assert most[0] == 1
    asks = [c[0].audio.size / SR for c in engine.calls if c[0].kind is DecodeKind.PARTIAL]
    # each 0.15 s answer covers 0.3 s of audio at this pace: about 3 asks before 0.85 s;
    # one at a time, no more than answers fit in the time that audio took to arrive (a
    # loaded machine sends it slower: more fit)
    assert 2 <= len([a for a in asks if a < 0.85]) <= reached[0] / 0.15 + 2, (asks, reached)
    assert results(events, final=False) and len(results(events, final=True)) == 1


class StopsAfterThePrefix(FakeEngine):
    """Whisper's failure that carrying risks: given a forced prefix it ends right after it."""

    def _hear(self, req):  # type: ignore[no-untyped-def]
        if req.prefix:
            return Hypothesis(req.prefix, req.language or "en")
        return super()._hear(req)


class RestartsAfterThePrefix(FakeEngine):
    """Whisper forced through a carried passage going back over its end: the carried
    final begins with the carried text's last two words again."""

    def _hear(self, req):  # type: ignore[no-untyped-def]
        hyp = super()._hear(req)
        if not req.prefix:
            return hyp
        forced = req.prefix.split()
        new = hyp.text.split()[len(forced) :]
        return Hypothesis(" ".join([*forced, *forced[-2:], *new]), hyp.language)


@pytest.mark.parametrize(
    "engine_type",
    [StopsAfterThePrefix, RestartsAfterThePrefix],
    ids=["lost its words", "restarts with the carried end"],
)
async def test_a_carried_final_that_went_wrong_is_decoded_alone(
    engine_type: type[FakeEngine],
) -> None:
    engine = engine_type(capabilities=EngineCapabilities(context_carry=True))
    audio = np.concatenate([silence(0.5), tone(1.0), silence(1.0), tone(2.0), silence(1.0)])
    h = Harness(engine, carry_max_s=10.0)
    events = await h.run(h.lockstep(chunks(pcm16(audio))))
    finals = [r.text for r in results(events, final=True)]
    # the fake numbers words from the start of what it hears: alone, w0..w7
    assert finals == ["w0 w1 w2 w3", " ".join(f"w{i}" for i in range(8))]
    assert h.metrics.carry_fallbacks._value.get() == 1


async def test_no_final_is_carried_while_the_engine_is_behind_on_finals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under load (finals queued, as when many calls end utterances at once) each final
    is decoded alone: carried, it would cost about twice as much and every queued final
    would wait for it. Context backs off as partials do."""
    audio = np.concatenate([silence(0.5), tone(1.0), silence(1.0), tone(2.0), silence(1.0)])
    monkeypatch.setattr(EngineScheduler, "finals_waiting", property(lambda self: True))
    h = Harness(carrying_engine(), carry_max_s=10.0, carry_gap_s=2.0)
    events = await h.run(h.lockstep(chunks(pcm16(audio))), interim=False)
    finals_asked = [c[0] for c in h.engine.calls if c[0].kind is DecodeKind.FINAL]
    assert len(finals_asked) == 2
    assert all(r.prefix == "" for r in finals_asked)
    assert finals_asked[1].audio.size < 2.6 * SR  # its own audio only
    # the fake hears eight words in two seconds of tone, numbered from the start
    assert [r.text for r in results(events, final=True)] == [
        "w0 w1 w2 w3",
        " ".join(f"w{i}" for i in range(8)),
    ]
    assert h.metrics.carry_skipped_under_load._value.get() == 1  # the second utterance's final


async def test_an_engine_that_cannot_carry_context_decodes_each_utterance_alone() -> None:
    audio = np.concatenate([silence(0.5), tone(1.0), silence(1.0), tone(2.0), silence(1.0)])
    h = Harness(carry_max_s=10.0)  # the default fake declares context_carry=False
    events = await h.run(h.lockstep(chunks(pcm16(audio))), interim=False)
    assert all(r.prefix == "" for call in h.engine.calls for r in call)
    assert results(events, final=True)[1].text == " ".join(f"w{i}" for i in range(8))


async def test_carried_words_leave_no_timing_behind() -> None:
    audio = np.concatenate([silence(0.5), tone(1.0), silence(1.0), tone(2.0), silence(1.0)])
    h = Harness(carrying_engine(), carry_max_s=10.0, carry_gap_s=2.0)
    events = await h.run(h.lockstep(chunks(pcm16(audio))), interim=False, word_timestamps=True)
    second = results(events, final=True)[1]
    assert [w.word for w in second.words] == second.text.split()
    # stream times: within the second utterance, which starts at 2.5 s (tone) - pre-roll
    assert second.start_s == pytest.approx(2.2, abs=0.05)
    assert second.words[0].start_s == pytest.approx(2.5, abs=0.1)
    assert second.words[-1].end_s == pytest.approx(4.5, abs=0.1)


class ScriptedTurnModel:
    """Says the same probability every time, and counts how much audio it was shown."""

    def __init__(self, probability: float) -> None:
        self.probability = probability
        self.heard: list[float] = []

    def predict(self, audio: np.ndarray) -> TurnVerdict:
        self.heard.append(audio.size / SR)
        return TurnVerdict(self.probability)


def assert_ended_near(processed_s: float, expected_s: float) -> None:
    """A turn the model ended, at ``expected_s`` of audio processed: lockstep waits for
    the engine, not for the model's answer, which comes back from its thread a chunk or
    two late on a loaded machine (3.21 s once for 3.1), never early. The asks are 0.45 s
    apart, so the bound still tells which one ended the turn."""
    assert expected_s - 0.1 <= processed_s <= expected_s + 0.25, (processed_s, expected_s)


def semantic(model: ScriptedTurnModel) -> TurnDetection:
    """The settings' defaults: asked at 150 ms (0.98) and 600 ms (0.7), eager from 0.5."""
    return TurnDetection(model, 0.98, 150, 600, 0.7, eager_threshold=0.5, narrowband_threshold=0.99)  # type: ignore[arg-type]


async def test_no_partial_is_asked_while_the_final_is_decoded_early() -> None:
    """In a SEMANTIC pause the final's decode starts at 60 ms; partials would only
    compete with it (their result is dropped)."""
    audio = np.concatenate([silence(0.5), tone(2.0), silence(2.5)])
    h = Harness(turn=semantic(ScriptedTurnModel(0.99)), partial_interval_ms=100)
    await h.run(h.lockstep(chunks(pcm16(audio), 320)), semantic=True)
    partial_ends = [
        0.2 + c[0].audio.size / SR for c in h.engine.calls if c[0].kind is DecodeKind.PARTIAL
    ]  # (the utterance's audio starts with 0.3 s of pre-roll: at 0.2 s)
    assert partial_ends and max(partial_ends) <= 2.5 + 0.07, partial_ends
    finals = [c[0] for c in h.engine.calls if c[0].kind is DecodeKind.FINAL]
    assert len(finals) == 1


def partials_heard_past(h: Harness, speech_end_s: float) -> list[float]:
    """How far past ``speech_end_s`` each partial's audio ran (the utterance's audio
    starts with 0.3 s of pre-roll before a tone at 0.5 s)."""
    return [
        round(0.2 + c[0].audio.size / SR - speech_end_s, 3)
        for c in h.engine.calls
        if c[0].kind is DecodeKind.PARTIAL
    ]


@pytest.mark.parametrize("speech_s", [2.0, 2.01, 2.02, 2.03, 2.04, 2.05])
async def test_no_partial_is_asked_once_a_pause_begins_where_the_final_comes_early(
    speech_s: float,
) -> None:
    """A partial asked in a pause's first 60 ms would run beside the final decoded early
    in that pause and slow it down: SEMANTIC streams ask none once a pause has begun
    (whatever the phase of the partial grid against the voice detector's 30 ms frames)."""
    audio = np.concatenate([silence(0.5), tone(speech_s), silence(2.0)])
    h = Harness(turn=semantic(ScriptedTurnModel(0.99)), partial_interval_ms=100)
    await h.run(h.lockstep(chunks(pcm16(audio), 320)), semantic=True)
    past = partials_heard_past(h, 0.5 + speech_s)
    assert past and max(past) <= 0.03, past  # (the last voiced frame may overlap the end)


async def test_silence_streams_ask_partials_into_the_pause() -> None:
    """Where the final waits for the endpoint, a partial early in the pause shows the last
    words sooner, and still comes: up to 150 ms into it."""
    heard_into_pause = []
    for speech_s in (2.0, 2.01, 2.02, 2.03, 2.04, 2.05):
        audio = np.concatenate([silence(0.5), tone(speech_s), silence(1.0)])
        h = Harness(partial_interval_ms=100)
        await h.run(h.lockstep(chunks(pcm16(audio), 320)))
        heard_into_pause.append(max(partials_heard_past(h, 0.5 + speech_s)))
    assert max(heard_into_pause) > 0.03, heard_into_pause
    assert max(heard_into_pause) <= 0.15 + 0.03, heard_into_pause


@pytest.mark.parametrize(("gap_s", "hears_previous"), [(0.7, True), (2.5, False)])
async def test_the_turn_model_hears_a_turn_the_speaker_went_on_with(
    gap_s: float, hears_previous: bool
) -> None:
    """Cut where the model judged the turn over, a speaker who goes on within the longest
    pause a turn holds (2 s here) is still in that turn: the model hears what came
    before too, with the pause between (at most 1 s), as it would had the cut not been."""
    model = ScriptedTurnModel(0.99)
    audio = np.concatenate([silence(0.5), tone(2.0), silence(gap_s), tone(1.0), silence(1.0)])
    h = Harness(turn=semantic(model))
    events = await h.run(
        h.lockstep(chunks(pcm16(audio), 480)), semantic=True, max_silence_ms=2000, interim=False
    )
    assert len(results(events, final=True)) == 2
    first_utterance = 0.3 + 2.0 + 0.15  # pre-roll, speech, the pause at the first probe
    second_alone = 0.3 + 1.0 + 0.15
    assert model.heard[0] == pytest.approx(first_utterance, abs=0.05)
    if hears_previous:
        # the previous utterance ends where its final did (the turn ended at its probe);
        # the next one begins with its pre-roll: the pause between is put back as silence
        between = gap_s - 0.15 - 0.3
        expected = first_utterance + between + second_alone
    else:
        expected = second_alone
    assert model.heard[1] == pytest.approx(expected, abs=0.06)


@pytest.mark.parametrize(
    ("probability", "ends_after_s"),
    [
        (0.99, 0.15),  # sure at the first probe: the turn ends there
        (0.8, 0.6),  # unsure at first, enough at the second probe
        (0.1, 2.0),  # never enough: the longest pause ends it
    ],
)
async def test_semantic_asks_twice_then_waits_for_the_longest_pause(
    probability: float, ends_after_s: float
) -> None:
    model = ScriptedTurnModel(probability)
    turn = semantic(model)
    audio = np.concatenate([silence(0.5), tone(2.0), silence(3.0)])
    h = Harness(turn=turn)
    events = await h.run(h.lockstep(chunks(pcm16(audio), 480)), semantic=True, max_silence_ms=2000)
    (end,) = [e for e in events if isinstance(e, EndOfTurn)]
    (ended,) = [e for e in events if isinstance(e, SpeechBoundary) and not e.started]
    assert end.offset_s == ended.offset_s == pytest.approx(2.5, abs=0.05)
    # when the utterance ended: its final covers the audio up to then (+ the 0.2 s pad)
    # and the model was asked once per probe reached
    asked = {0.99: 1, 0.8: 2, 0.1: 2}[probability]
    assert len(model.heard) == asked
    assert model.heard[0] == pytest.approx(0.3 + 2.0 + 0.15, abs=0.05)  # pre-roll, speech
    final = results(events, final=True)[0]
    assert final.text == " ".join(f"w{i}" for i in range(8))
    assert end.probability == pytest.approx(probability)
    # what ended it: the model when it was sure enough, else the longest pause
    assert end.reason is (TurnEndReason.MAX_SILENCE if probability < 0.7 else TurnEndReason.MODEL)
    assert len(model.heard) < 2 or model.heard[1] == pytest.approx(2.3 + 0.6, abs=0.05)
    # the turn ended after ends_after_s of pause: the audio processed when it was sent
    processed = h.progress[events.index(end)].audio_processed_s
    assert_ended_near(processed, 2.5 + ends_after_s)
    # the final is decoded once, early in the pause (before the first probe), whenever
    # the turn ends after it; it used to be decoded again with the 0.2 s pad: 0.1 s added
    # to every SEMANTIC final
    finals = [r for call in h.engine.calls for r in call if r.kind is DecodeKind.FINAL]
    assert len(finals) == 1
    assert final.end_s == pytest.approx(2.5 + Settings().turn.speculate_ms / 1000, abs=0.035)


def test_a_carried_final_is_forced_without_its_closing_punctuation() -> None:
    from asr_server.session.carry import Carry

    carry = Carry(np.zeros(SR, np.float32), SR, "which led me to leave.", "en")
    assert carry.forced == "which led me to leave"
    hyp = Hypothesis("which led me to leave, my native country.", "en")
    assert carry.strip(hyp).text == "my native country."
    # a hypothesis that does not start with the forced text is not trusted
    assert carry.strip(Hypothesis("something else", "en")).rejected


def test_a_carried_final_keeps_only_its_own_words_however_the_aligner_split_the_carried() -> None:
    from asr_server.session.carry import Carry

    # the aligner split "up-gards" in two: the carried text is 3 words, its timings 4
    carry = Carry(np.zeros(SR // 2, np.float32), SR, "the up-gards poem.", "en")  # 0.5 s
    said = ["the", "up", "-gards", "poem.", "Mr.", "Carker"]
    timed = [WordTiming(w, 0.2 * i, 0.2 * i + 0.15, 0.9) for i, w in enumerate(said)]
    hyp = Hypothesis("the up-gards poem. Mr. Carker", "en", timed)
    stripped = carry.strip(hyp)
    assert stripped.text == "Mr. Carker"
    assert [w.word for w in stripped.words] == ["Mr.", "Carker"]
    assert stripped.words[0].start_s == pytest.approx(0.8 - 0.5)  # after the carried audio


def test_a_carried_final_cut_inside_a_word_times_the_words_rest() -> None:
    """A FINALIZE cut "Godspeed": the previous final read "his God", and the model, the
    carried text forced, read on "Godspeed." as one word, timed among the carried ones:
    this final, "speed.", came without word timings."""
    from asr_server.session.carry import Carry

    carry = Carry(np.zeros(SR, np.float32), SR, "welcome his God.", "en")  # 1 s
    said = [("welcome", 0.1, 0.4), ("his", 0.4, 0.6), ("Godspeed.", 0.7, 1.3)]
    timed = [WordTiming(w, a, b, 0.8) for w, a, b in said]
    stripped = carry.strip(Hypothesis("welcome his Godspeed.", "en", timed))
    assert stripped.text == "speed."
    assert stripped.words == [WordTiming("speed.", 0.0, pytest.approx(0.3), 0.8)]
    # where the carried text ends at a word's end, only its punctuation is past the cut
    said = [("welcome", 0.1, 0.4), ("his", 0.4, 0.6), ("God.", 0.7, 0.9), ("Speed", 1.1, 1.4)]
    timed = [WordTiming(w, a, b, 0.8) for w, a, b in said]
    stripped = carry.strip(Hypothesis("welcome his God. Speed", "en", timed))
    assert stripped.text == "Speed"
    assert [w.word for w in stripped.words] == ["Speed"]


def test_a_carried_final_that_read_the_carried_passage_again_went_wrong() -> None:
    from asr_server.session.carry import Carry

    carry = Carry(np.zeros(SR, np.float32), SR, "Please fasten your seat belts.", "en")
    again = Hypothesis("please fasten your seat belts. Thank you.", "en")
    assert carry.went_wrong(again, heard=[])  # read again, then the new words
    assert carry.went_wrong(Hypothesis("your seat belts thank you", "en"), heard=[])
    thanks = ["thank", "you"]
    assert carry.went_wrong(Hypothesis("thank you for flying with us today", "en"), thanks)
    lost = Hypothesis("you", "en")
    assert carry.went_wrong(lost, heard=["thank", "you", "very", "much"])
    assert not carry.went_wrong(Hypothesis("Thank you.", "en"), heard=thanks)
    assert not carry.went_wrong(Hypothesis("Thank you, all.", "en"), heard=[])


class ReadsTheLastWordAgain(FakeEngine):
    """Given the previous final as a forced prefix, nothing after it; alone, a short
    sound is "again" (the previous final's last word) and a longer one a sentence."""

    def _hear(self, req: DecodeRequest) -> Hypothesis:
        if req.prefix:
            return Hypothesis(req.prefix, "en")
        loud = np.count_nonzero(np.abs(req.audio) > 1e-3)
        if not loud:
            return Hypothesis("", "en", rejected=True)
        return Hypothesis("again" if loud < 0.6 * SR else "we said it again", "en")


def hears_sound(audio: np.ndarray, lead_in: np.ndarray) -> bool:
    return bool(np.any(np.abs(audio) > 1e-3))


async def test_a_word_said_again_after_a_pause_is_kept() -> None:
    """A speaker saying the previous final's last word again ("No. ... No."): Whisper,
    forced through the previous final, reads nothing new, and alone the word is read.
    A rule that took such a read for the carried end read again (to mend a split inside
    "themselves", LJ Speech at -35 dBFS, said twice) dropped it: NO_WORDS (a diff
    reviewer); it was taken back."""
    engine = ReadsTheLastWordAgain(capabilities=EngineCapabilities(context_carry=True))
    h = Harness(engine, speech_check=hears_sound, carry_max_s=10.0)
    audio = np.concatenate([tone(1.5), silence(1.0), tone(0.3), silence(1.0)])
    events = await h.run(h.lockstep(chunks(pcm16(audio))), interim=False)
    assert [r.text for r in results(events, final=True)] == ["we said it again", "again"]
    assert not any(isinstance(e, NoWords) for e in events)


async def test_the_rest_of_a_word_a_finalize_cut_is_not_read_again() -> None:
    """A finalize cut inside "used": the final read the whole word, the carried decode of
    the rest rightly had no new words, and alone it was "used." again, a final of its own
    ("…are used. used.": the finalize bench, a diff reviewer). The rest of a word cut by a
    finalize, read alone as the previous final's end, is no final (NO_WORDS)."""
    engine = ReadsTheLastWordAgain(capabilities=EngineCapabilities(context_carry=True))
    h = Harness(engine, speech_check=hears_sound, carry_max_s=10.0)
    rest = np.concatenate([tone(0.3), silence(1.0)])
    events = await h.run(
        h.lockstep(finalized_between(pcm16(tone(1.5)), pcm16(rest))), interim=False
    )
    assert [r.text for r in results(events, final=True)] == ["we said it again"]
    assert [e.utterance_id for e in events if isinstance(e, NoWords)] == [1]


async def test_a_resumed_channel_knows_its_last_final_was_cut_mid_word() -> None:
    """As above, on a stream resumed just after that final: the client replays it with
    the finalize that cut it (and the rest, which has no final yet). The new server
    must carry it as cut mid-speech too, as the old one would have: carried as a final
    that ended in a pause, the rest read alone was "again", a final of its own."""
    engine = ReadsTheLastWordAgain(capabilities=EngineCapabilities(context_carry=True))
    h = Harness(engine, speech_check=hears_sound, carry_max_s=10.0)
    cut = int(1.5 * SR)
    start = ChannelStart(
        next_utterance_id=1,
        final_until_sample=cut,
        previous_text="we said it again",
        language="en",
        previous_samples=(0, cut),
    )
    rest = np.concatenate([tone(0.3), silence(1.0)])
    events = await h.run(
        h.lockstep(finalized_between(pcm16(tone(1.5)), pcm16(rest))),
        interim=False,
        resume=ResumeState(0.0, (start,)),
    )
    assert results(events, final=True) == []
    assert [e.utterance_id for e in events if isinstance(e, NoWords)] == [1]


class ReadsOnAfterTheCut(FakeEngine):
    """A finalize cuts the speech after ``first`` (its final's text); after it, forced
    ahead, the carried decode reads ``carried``; alone, as the partials hear it, the
    next utterance is ``alone``."""

    def __init__(self, first: str, carried: str, alone: str) -> None:
        super().__init__(capabilities=EngineCapabilities(context_carry=True))
        self.first, self.carried, self.alone = first, carried, alone

    def _hear(self, req: DecodeRequest) -> Hypothesis:
        loud = np.count_nonzero(np.abs(req.audio) > 1e-3)
        if not loud:
            return Hypothesis("", "en", rejected=True)
        if req.prefix:  # the carried final
            return Hypothesis(f"{req.prefix} {self.carried}", "en")
        if req.kind is DecodeKind.FINAL and loud < 1.2 * SR:  # the first utterance
            return Hypothesis(self.first, "en")
        return Hypothesis(self.alone, "en")


@pytest.mark.parametrize(
    ("first", "carried", "alone", "final"),
    [
        # cut inside "exquisite": the partials read its rest "is it", the carried decode
        # rightly does not (the resume reviewer's push-to-talk read: "is it itals…" came
        # out, the final decoded alone)
        (
            "and Mason's exquisite",
            "itals are as national.",
            "is it itals are as national.",
            "itals are as national.",
        ),
        # cut after "most": "if" is a word of its own, which the carried decode skipped
        # (LJ Speech; a diff reviewer): the final decoded alone keeps it
        (
            "differs from most",
            "not from all the arts.",
            "if not from all the arts.",
            "if not from all the arts.",
        ),
    ],
)
async def test_words_the_partials_heard_at_a_cut_are_the_cut_words_rest_only_if_they_spell_it(
    first: str, carried: str, alone: str, final: str
) -> None:
    """After a finalize cut inside speech, the next utterance's partials, decoded without
    the previous final, may hear the rest of a cut word as words of their own. Taken for
    words the carried final skipped, they made it look wrong, and the final decoded alone
    was kept; but only words that spell about the end of the cut word are its rest."""
    engine = ReadsOnAfterTheCut(first, carried, alone)
    h = Harness(engine, speech_check=hears_sound, carry_max_s=10.0)
    rest = np.concatenate([tone(1.5), silence(1.0)])
    events = await h.run(h.lockstep(finalized_between(pcm16(tone(1.0)), pcm16(rest))))
    partials = [r.text for r in results(events, final=False) if r.utterance_id == 1]
    assert partials and partials[-1] == alone  # what the partials heard
    assert [r.text for r in results(events, final=True)] == [first, final]


def test_a_carried_final_that_skips_the_partials_first_word_went_wrong() -> None:
    from asr_server.session.carry import Carry

    carry = Carry(np.zeros(SR, np.float32), SR, "are at present concerned differs from both", "en")
    carried = Hypothesis("not from all the arts and crafts", "en")
    assert carry.went_wrong(carried, spoken_words("if not from all the arts"))
    assert not carry.went_wrong(carried, spoken_words("not from all the arts"))
    # the partial read the carried end, not a word of this utterance
    assert not carry.went_wrong(carried, spoken_words("both not from all the arts"))


def test_a_carried_final_that_begins_with_the_carried_end_restarts() -> None:
    from asr_server.session.carry import Carry

    carry = Carry(np.zeros(SR, np.float32), SR, "But the first Bible actually dated,", "en")

    def restarts(text: str, partial: str) -> bool:
        return carry.restarts(Hypothesis(text, "en"), spoken_words(partial))

    # LJ Speech split at a pause: the carried decode read the cut's last two words again
    assert restarts("actually dated, and also was printed at Mainz", "which also was printed")
    # the speaker said them again: the partial, which heard the utterance alone, has them
    assert not restarts("actually dated, which also was", "actually dated which also")
    assert not restarts("which also was printed at Mainz", "which also was printed")
    assert not restarts("dated, which also was printed", "which also was printed")  # one
    assert not restarts("actually dated, and also", "")  # no partial to judge by


def test_a_carried_final_that_reads_its_end_twice_went_wrong() -> None:
    from asr_server.session.carry import Carry

    carry = Carry(np.zeros(SR, np.float32), SR, "But the first Bible actually dated", "en")

    def loops(text: str, partial: str) -> bool:
        return carry.reads_its_end_twice(Hypothesis(text, "en"), spoken_words(partial))

    # Whisper looping at the end of a long carried decode (LJ Speech, split at pauses)
    assert loops(
        "imitates a much freer hand, simpler, simpler.", "a much freer hand simpler rounder"
    )
    assert loops("On the whole, on the whole, on", "and easier to read on the whole")
    assert loops("not only by chauffeur, not only by", "years not only by Schoeffer")
    # the speaker's own repeat, which the partials heard too; and no repeat at all
    assert not loops("I said no, no.", "i said no no")
    assert loops("I said no, no.", "i said no")
    assert not loops("which was printed at Maintz in 1462.", "which was printed at")


def test_timings_follow_the_words_a_final_keeps() -> None:
    from asr_server.session.finals import timings_kept

    text = "the Bible actually dated, actually dated, and perfection—the middle"
    words = [WordTiming(w, i, i + 1, 0.9) for i, w in enumerate(text.split())]
    kept = timings_kept(words, "the Bible actually dated, and perfection")
    assert [(w.word, w.start_s) for w in kept] == [
        ("the", 0),
        ("Bible", 1),
        ("actually", 2),
        ("dated,", 3),
        ("and", 6),
        ("perfection", 7),
    ]


class LoopsAtItsEnd(FakeEngine):
    """Whisper out of audio mid-sentence: a final jumps back a few words and reads them
    again ("...has never been surpassed. Printing, then, for our purpose, has never been
    surpassed."): here the 10th to 8th last words. Partials do not."""

    def _hear(self, req):  # type: ignore[no-untyped-def]
        hyp = super()._hear(req)
        words = hyp.text.split()
        if req.kind is DecodeKind.FINAL and len(words) >= 10:
            return dataclasses.replace(hyp, text=" ".join([*words, *words[-10:-7]]))
        return hyp


@pytest.mark.parametrize(
    ("interim", "partial_interval_ms", "trimmed"),
    [
        (True, 500, True),  # partials heard w0..w15, each once: the repeat is a loop
        (False, 500, False),  # nothing else heard it: it could be the speaker's
        (True, 2500, False),  # the last partial stopped 1.8 s short of the end
    ],
)
async def test_a_final_that_reads_its_end_again_loses_the_repeat_its_partials_lack(
    interim: bool, partial_interval_ms: int, trimmed: bool
) -> None:
    engine = LoopsAtItsEnd()
    audio = np.concatenate([silence(0.5), tone(4.0), silence(1.0)])
    h = Harness(engine, partial_interval_ms=partial_interval_ms)
    events = await h.run(h.lockstep(chunks(pcm16(audio))), interim=interim)
    (final,) = [r.text for r in results(events, final=True)]
    words = [f"w{i}" for i in range(16)]
    if interim:  # the latest partial had the looped phrase once
        assert "w6 w7 w8" in results(events, final=False)[-1].text
    assert final == " ".join(words if trimmed else [*words, "w6", "w7", "w8"])
    assert h.metrics.looped_tails_trimmed._value.get() == int(trimmed)


class SaysItsEndAgain(LoopsAtItsEnd):
    """The same final, from an engine that found the repeat spoken in the audio."""

    def _hear(self, req):  # type: ignore[no-untyped-def]
        hyp = super()._hear(req)
        if req.kind is not DecodeKind.FINAL:
            return hyp
        return dataclasses.replace(hyp, spoken_phrases=(" ".join(hyp.text.split()[-3:]),))


async def test_a_repeat_the_engine_found_spoken_stays_though_the_partials_lack_it() -> None:
    """The latest partial had heard both copies but read the phrase over and over and was
    cut to one copy; the final, checked against it, lost its spoken copy (diff review:
    "He could wait no longer." twice, streamed at real time)."""
    audio = np.concatenate([silence(0.5), tone(4.0), silence(1.0)])
    h = Harness(SaysItsEndAgain(), partial_interval_ms=500)
    events = await h.run(h.lockstep(chunks(pcm16(audio))), interim=True)
    (final,) = [r.text for r in results(events, final=True)]
    assert final == " ".join([*(f"w{i}" for i in range(16)), "w6", "w7", "w8"])
    assert h.metrics.looped_tails_trimmed._value.get() == 0


def test_a_spoken_phrase_is_let_stand_and_every_other_loop_still_cut() -> None:
    """The engine vouches for the phrases it found spoken twice, not for the whole final:
    a blanket mark let a two-word loop and a re-read tail ride along with them."""
    from asr_server.session.finals import heard_with

    phrase = "He hoped there would be stew for dinner."
    partial = f"{phrase} turnips and carrots and bruised potatoes."  # the phrase read once
    for loop, kept in (
        ("turnips and carrots, and carrots and bruised potatoes.", "carrots, and bruised"),
        ("turnips and carrots and bruised potatoes and carrots and bruised potatoes.", ""),
        ("turnips and carrots and bruised potatoes, turnips and carrots and bruised patatoes.", ""),
    ):
        final = f"{phrase} {phrase} {loop}"
        out = without_unheard_loops(final, heard_with(partial, (phrase,)))
        assert out.startswith(f"{phrase} {phrase} turnips"), out  # the speaker's, kept
        assert out.count("carrots") == 1 and kept in out, out  # the loops, cut
        # the partial alone cut the speaker's repeat too
        alone = without_unheard_loops(final, heard_with(partial, ()))
        assert not alone.startswith(f"{phrase} {phrase}"), alone


def test_a_carried_final_that_hears_other_words_than_the_partials_is_doubtful() -> None:
    from asr_server.session.carry import Carry

    carry = Carry(np.zeros(SR, np.float32), SR, "and it's like", "en")
    heard = spoken_words("Ladies and gentlemen, please fasten your seat belts.")
    other = Hypothesis("they didn't get to me. Please fasten your seat belts. They didn't", "en")
    assert carry.agreement(other, heard) == (5, 5)  # the words after "belts" are not held
    assert carry.doubtful(other, heard)
    # a word or two mended at the cut is what carrying is for
    assert not carry.doubtful(Hypothesis("ask not what your country", "en"), ["s", "not"])
    assert not carry.doubtful(Hypothesis("ladies and gentlemen, please", "en"), heard)
    assert not carry.doubtful(other, [])  # no partial to compare with


def test_words_hyphenated_in_one_decode_are_not_other_words() -> None:
    """LibriSpeech: the partial wrote "fat-mutton", the carried final "fat mutton"; with a
    misheard first word that made three words "the partials do not have" and a second
    decode alone, 263 ms, for the same text."""
    from asr_server.session.carry import Carry

    carry = Carry(np.zeros(SR, np.float32), SR, "He hoped there would be stew for dinner.", "en")
    heard = spoken_words("Ternips and carrots and bruised potatoes and fat-mutton pieces")
    carried = Hypothesis("turnips and carrots and bruised potatoes and fat mutton pieces", "en")
    assert carry.agreement(carried, heard) == (9, 1)
    assert not carry.doubtful(carried, heard)


def test_a_word_read_another_way_is_not_held_against_a_carried_final() -> None:
    """From the voice-agent runs, where each of these cost a second decode alone (about
    150 ms after the first) that read the same words: LJ Speech's "may be considered" in
    a partial's "maybe consider", a name written as one word or two."""
    from asr_server.session.carry import Carry, read_alike

    carry = Carry(np.zeros(SR, np.float32), SR, "printing then for our purpose.", "en")
    heard = spoken_words("maybe consider as the art of making...")
    carried = Hypothesis("may be considered as the art of making books.", "en")
    assert carry.agreement(carried, heard) == (8, 0)
    assert not carry.doubtful(carried, heard)
    assert read_alike(["swain", "high"], ["swainheim"]) == [0]
    assert read_alike(["maybe", "consider"], ["may", "be", "considered"]) == [0, 1, 2]
    # short words that begin alike are other words
    assert read_alike(["in", "the"], ["into", "them"]) == []
    # and other words are still other words
    other = Hypothesis("they didn't get to me. Please fasten your seat belts.", "en")
    heard = spoken_words("Ladies and gentlemen, please fasten your seat belts.")
    assert carry.doubtful(other, heard)


def test_the_word_count_check_allows_for_what_the_partial_did_not_hear() -> None:
    """A carried final is not "reading something twice" for having more words than a
    partial of part of its audio, nor "short of words" for one word fewer than two."""
    from asr_server.session.carry import Carry

    carry = Carry(np.zeros(SR, np.float32), SR, "exquisite itals are as", "en")
    carried = Hypothesis("national as a jingo poem.", "en")  # the partial: "National Elegingo"
    heard = ["national", "elegingo"]
    assert carry.went_wrong(carried, heard)  # as if the partial had heard it all
    assert not carry.went_wrong(carried, heard, heard_share=1.74 / 2.19)
    assert not carry.went_wrong(Hypothesis("Swainheim,", "en"), ["swain", "high"])
    lost = Hypothesis("you", "en")
    assert carry.went_wrong(lost, heard=["thank", "you", "very", "much"])


def test_digits_written_as_one_numeral_are_not_words_lost() -> None:
    """CMU Sphinx's digit strings in the voice-agent runs: the partial wrote "0 1 8 0",
    the carried final "01803" (one word for four: "lost words"), and the decode alone,
    200 ms after it, read "01803" too. Written apart where the partial had a numeral
    ("9 0 2 1 0" for "90210"), a carried final still goes to the decode alone, which
    writes the numeral as a reader wants it."""
    from asr_server.session.carry import Carry, spells_out

    carry = Carry(np.zeros(SR, np.float32), SR, "Zip code", "en")
    assert not carry.went_wrong(Hypothesis("01803", "en"), spoken_words("0 1 8 0"), 0.8)
    assert carry.went_wrong(Hypothesis("9 0 2 1 0", "en"), spoken_words("90210"), 0.9)
    # digits really lost are still that
    assert carry.went_wrong(Hypothesis("0", "en"), spoken_words("0 1 8 0"))
    assert carry.went_wrong(Hypothesis("18", "en"), spoken_words("0 1 8 0"))
    assert spells_out(["0", "1", "8", "0"], ["01803"])
    assert not spells_out([], ["01803"])


def test_a_partial_of_the_first_tenth_of_the_audio_does_not_judge_a_carried_final() -> None:
    """The voice-agent runs: "Thank you." from a partial of 0.12 s of a 1.6 s utterance
    made the carried final "exquisite, itals are as..." doubtful; the decode alone read
    the same, 190 ms later."""
    from asr_server.session.carry import Carry

    carry = Carry(np.zeros(SR, np.float32), SR, "and the", "en")
    carried = Hypothesis("exquisite, itals are as...", "en")
    heard = spoken_words("Thank you.")
    assert carry.doubtful(carried, heard)  # as if it had heard the whole utterance
    assert not carry.doubtful(carried, heard, heard_share=0.12 / 1.62)
    assert carry.doubtful(carried, heard, heard_share=0.6)


def test_a_partial_that_stopped_short_is_not_the_one_a_final_is_checked_against() -> None:
    state = UtteranceState(0, UtteranceAudio(0), 0.0)
    state.hear("The aforementioned Gutenberg", SR)
    state.hear("The", 2 * SR)  # Whisper's greedy decode ended after one word
    assert (state.heard_text, state.heard_samples) == ("The aforementioned Gutenberg", SR)
    state.hear("The aforementioned", 2 * SR)  # fewer words, but not half: a new reading
    assert (state.heard_text, state.heard_samples) == ("The aforementioned", 2 * SR)


class StopsShortOnLongPartials(FakeEngine):
    """Words named by their place in the utterance's own audio, carried or not (so a
    carried final and its partials agree), "a0 a1..." for a soft tone and "b0 b1..." for
    a loud one (so two utterances' words differ), and partials of 1.6 s or more that end
    after their first word, as Whisper's greedy decode now and then does."""

    def _hear(self, req):  # type: ignore[no-untyped-def]
        hyp = super()._hear(req)
        if hyp.rejected:
            return hyp
        forced = req.prefix.split()
        name = "b" if np.abs(req.audio[-SR:]).max() > 0.4 else "a"
        new = [f"{name}{i}" for i in range(len(hyp.text.split()) - len(forced))]
        if req.kind is DecodeKind.PARTIAL and req.audio.size >= 1.6 * SR:
            new = new[:1]
        return Hypothesis(" ".join([*forced, *new]), hyp.language)


async def test_a_carried_final_is_checked_against_the_fuller_partial() -> None:
    """The carried final has eight words and the latest partial one: counted against
    that, it "read something twice" and was decoded again alone (the voice-agent runs:
    "the aforementioned Gutenberg Bible." replaced by "The a four said Guttenberg
    Bible."). The partial before it, which had stopped at nothing, is the witness."""
    engine = StopsShortOnLongPartials(capabilities=EngineCapabilities(context_carry=True))
    loud = tone(2.0, amp=0.5)
    audio = np.concatenate([silence(0.5), tone(1.0), silence(1.0), loud, silence(1.0)])
    h = Harness(engine, carry_max_s=10.0, carry_gap_s=2.0)
    events = await h.run(h.lockstep(chunks(pcm16(audio))))
    partials = [r.text for r in results(events, final=False)]
    assert partials[-1] == "b0", partials  # the stopped-short partial did come
    finals = [r.text for r in results(events, final=True)]
    assert finals == ["a0 a1 a2 a3", " ".join(f"b{i}" for i in range(8))]
    finals_asked = [c[0] for c in engine.calls if c[0].kind is DecodeKind.FINAL]
    assert len(finals_asked) == 2 and finals_asked[1].prefix  # carried, and only once
    assert h.metrics.carry_fallbacks._value.get() == 0


class EveryPartialStopsShort(StopsShortOnLongPartials):
    """Every partial of the loud utterance ends after its first word, so none is a
    fuller witness; and that utterance's final decoded alone reads its words another way
    ("c0 c1..."), so that which of the two finals was kept shows."""

    def _hear(self, req):  # type: ignore[no-untyped-def]
        hyp = super()._hear(req)
        if hyp.rejected or np.abs(req.audio[-SR:]).max() <= 0.4:
            return hyp
        words = hyp.text.split()
        if req.kind is DecodeKind.PARTIAL:
            return dataclasses.replace(hyp, text=words[0])
        if not req.prefix:
            return dataclasses.replace(hyp, text=" ".join(w.replace("b", "c") for w in words))
        return hyp


async def test_a_carried_final_with_more_words_than_partials_that_stopped_short_stands() -> None:
    """Counted against partials that all stopped after a word, the carried final "read
    something twice" and is decoded again alone; alone it reads as many words, so the
    carried one read nothing twice, and it stands (in a voice-agent run: "the
    aforementioned Gutenberg Bible." had given way to "The afore said Guttenberg
    Bible.", its partials all "The")."""
    engine = EveryPartialStopsShort(capabilities=EngineCapabilities(context_carry=True))
    loud = tone(2.0, amp=0.5)
    audio = np.concatenate([silence(0.5), tone(1.0), silence(1.0), loud, silence(1.0)])
    h = Harness(engine, carry_max_s=10.0, carry_gap_s=2.0)
    events = await h.run(h.lockstep(chunks(pcm16(audio))))
    assert {r.text for r in results(events, final=False) if r.text.startswith("b")} == {"b0"}
    finals = [r.text for r in results(events, final=True)]
    assert finals == ["a0 a1 a2 a3", " ".join(f"b{i}" for i in range(8))]
    finals_asked = [c[0] for c in engine.calls if c[0].kind is DecodeKind.FINAL]
    assert len(finals_asked) == 3 and not finals_asked[2].prefix  # it was decoded alone
    assert h.metrics.carry_fallbacks._value.get() == 0


def test_a_decode_alone_with_fewer_words_says_the_carried_one_read_twice() -> None:
    from asr_server.session.carry import Carry

    carry = Carry(np.zeros(SR), SR, "Write to", "en")
    wordy = Hypothesis("me and my friends went there twice", "en")
    assert carry.only_wordier_than_heard(wordy, ["me", "and"])  # more than they allow
    # alone, fewer words: the carried one did read something twice, or wrote apart
    # what alone is one word ("9 0 2 1 0" / "90210")
    assert not carry.reads_no_more_alone(wordy, Hypothesis("me and my friends", "en"))
    assert not carry.reads_no_more_alone(wordy, Hypothesis("", "en", rejected=True))
    carried = Hypothesis("the aforementioned Gutenberg Bible.", "en")
    assert carry.only_wordier_than_heard(carried, ["the"])
    assert carry.reads_no_more_alone(carried, Hypothesis("The afore said Guttenberg Bible.", "en"))
    # fewer words than the partial, or the carried passage read again: no partial that
    # stopped short explains those
    assert not carry.only_wordier_than_heard(Hypothesis("b0", "en"), ["b0", "b1", "b2"])
    reread = Hypothesis("write to me tomorrow at nine and then", "en")
    assert not Carry(np.zeros(SR), SR, "Please write to me", "en").only_wordier_than_heard(
        reread, ["at"]
    )


class HearsOtherWordsWhenCarried(FakeEngine):
    """Whisper in another speaker's context: the carried final begins with words nobody
    said, then goes on as the utterance alone does."""

    def _hear(self, req):  # type: ignore[no-untyped-def]
        hyp = super()._hear(req)
        if not req.prefix:
            return hyp
        new = hyp.text.split()[len(req.prefix.split()) :]
        words = [*req.prefix.split(), "x0", "x1", "x2", *new[2:]]
        return Hypothesis(" ".join(words), hyp.language)


class AloneReadsItOtherwiseToo(HearsOtherWordsWhenCarried):
    """The final decoded alone differs from the partials as well (a misheard name)."""

    def _hear(self, req):  # type: ignore[no-untyped-def]
        hyp = super()._hear(req)
        if req.kind is DecodeKind.FINAL and not req.prefix and hyp.text.count(" ") > 4:
            return dataclasses.replace(hyp, text="z0 " + hyp.text.split(" ", 1)[1])
        return hyp


@pytest.mark.parametrize(
    ("engine_type", "partials", "alone_wins"),
    [
        (HearsOtherWordsWhenCarried, True, True),  # alone it reads what the partials did
        (AloneReadsItOtherwiseToo, True, False),  # alone it differs too: carried stands
        (HearsOtherWordsWhenCarried, False, False),  # no partial to judge by: no 2nd decode
    ],
)
async def test_a_carried_final_unlike_its_partials_gives_way_to_the_decode_alone(
    engine_type: type[FakeEngine], partials: bool, alone_wins: bool
) -> None:
    engine = engine_type(capabilities=EngineCapabilities(context_carry=True))
    audio = np.concatenate([silence(0.5), tone(1.0), silence(1.0), tone(2.0), silence(1.0)])
    h = Harness(engine, carry_max_s=10.0)
    events = await h.run(h.lockstep(chunks(pcm16(audio))), interim=partials)
    finals = [r.text for r in results(events, final=True)]
    finals_asked = [r for c in engine.calls for r in c if r.kind is DecodeKind.FINAL]
    assert len(finals_asked) == (3 if partials else 2)
    if alone_wins:  # the partials heard w0..w7, as the decode alone did
        assert finals[1] == " ".join(f"w{i}" for i in range(8))
    else:
        assert finals[1].split()[:3] == ["x0", "x1", "x2"]
    assert h.metrics.carry_fallbacks._value.get() == int(alone_wins)


async def test_without_eager_finals_a_pause_sends_nothing_early() -> None:
    audio = np.concatenate([silence(0.5), tone(2.0), silence(0.35), tone(1.0), silence(1.0)])
    h = Harness()
    events = await h.run(h.lockstep(chunks(pcm16(audio))))
    assert not any(e.eager for e in results(events))
    assert not any(isinstance(e, SpeechResumed) for e in events)
    assert len(results(events, final=True)) == 1


async def test_an_update_turns_eager_finals_on_and_off_from_there_on() -> None:
    """StreamingUpdate.eager_finals: the same phrase (a 0.35 s pause inside it) sends no
    eager result before the update, one at its pause after it, and none once it is off."""
    h = Harness()
    phrase = pcm16(np.concatenate([tone(2.0), silence(0.35), tone(1.0), silence(1.0)]))

    async def source() -> AsyncIterator[object]:
        async for c in h.lockstep(chunks(phrase)):
            yield c
        yield ConfigUpdate(dataclasses.replace(h.session.config, eager_finals=True))
        async for c in h.lockstep(chunks(phrase)):
            yield c
        yield ConfigUpdate(dataclasses.replace(h.session.config, eager_finals=False))
        async for c in h.lockstep(chunks(phrase)):
            yield c

    events = await h.run(source())
    finals = results(events, final=True)
    assert [f.utterance_id for f in finals] == [0, 1, 2]
    eager_ids = [e.utterance_id for e in results(events) if e.eager]
    # the second phrase's pause, and its end (the final's text, sent as the pause began)
    assert eager_ids and set(eager_ids) == {1}
    resumed = [e for e in events if isinstance(e, SpeechResumed)]
    assert [e.utterance_id for e in resumed] == [1]


async def test_a_partial_finishing_after_a_newer_one_is_not_shown() -> None:
    """With two workers a stream's older partial can finish last; it must not roll back."""
    slowed: list[int] = []
    overtaken = threading.Event()
    waited: list[bool] = []

    def slow_one_partial(requests) -> None:  # type: ignore[no-untyped-def]
        # asks go one at a time until a partial has words (0.25 s of tone, the fake's
        # first word); past 0.75 s they no longer wait: hold one until the next has run
        if requests[0].kind is not DecodeKind.PARTIAL or requests[0].audio.size < 0.75 * SR:
            return
        if not slowed:
            slowed.append(requests[0].audio.size)
            waited.append(overtaken.wait(5))  # in the engine's thread
            # ... and until the newer partial's result is out (a fixed sleep was too short
            # on a loaded machine: the older result came first and was shown)
            newer = slowed[0] / SR
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not any(
                r.end_s > newer for r in results(list(h.events), final=False)
            ):
                time.sleep(0.005)
        else:
            overtaken.set()

    h = Harness(FakeEngine(workers=2, on_call=slow_one_partial))

    async def paced() -> AsyncIterator[object]:
        async for chunk in chunks(pcm16(np.concatenate([tone(2.5), silence(1.0)])), 8000):
            yield chunk
            await asyncio.sleep(0.2)

    events = await h.run(paced())
    partial_ends = [r.end_s for r in results(events, final=False)]
    assert waited == [True]  # a newer partial ran while the older one was held
    assert partial_ends == sorted(partial_ends), partial_ends
    assert slowed[0] / SR not in partial_ends  # the overtaken partial was dropped
    assert len(results(events, final=True)) == 1


async def test_silence_produces_no_events_and_no_engine_calls() -> None:
    h = Harness()
    events = await h.run(chunks(pcm16(silence(5.0))))
    assert events == [StreamDone()]  # only the closing progress
    assert h.engine.calls == []


async def test_without_interim_results_only_finals() -> None:
    audio = np.concatenate([tone(1.0), silence(1.0), tone(2.0), silence(1.0)])
    h = Harness()
    events = await h.run(chunks(pcm16(audio)), interim=False)
    assert results(events, final=False) == []
    assert [r.text for r in results(events, final=True)] == [
        "w0 w1 w2 w3",
        " ".join(f"w{i}" for i in range(8)),
    ]
    assert [r.utterance_id for r in results(events)] == [0, 1]


async def test_finalize_control_ends_the_utterance_without_closing() -> None:
    first = pcm16(tone(1.0))
    second = pcm16(np.concatenate([tone(1.0), silence(1.0)]))

    events = await Harness().run(finalized_between(first, second), interim=False)
    finals = results(events, final=True)
    assert [f.text for f in finals] == ["w0 w1 w2 w3", "w0 w1 w2 w3"]
    assert finals[0].end_s == pytest.approx(1.0, abs=0.05)
    # the first final answers the finalize, and the acknowledgement follows it; the
    # second ended on silence
    assert [f.from_finalize for f in finals] == [True, False]
    ends = [e for e in events if isinstance(e, SpeechBoundary) and not e.started]
    assert [e.from_finalize for e in ends] == [True, False]
    acks = [e for e in events if isinstance(e, Finalized)]
    assert acks == [Finalized(pytest.approx(1.0, abs=1e-3), 0, 0)]
    assert events.index(acks[0]) == events.index(finals[0]) + 1


class TimesWordsToTheEnd(FakeEngine):
    """Times its last word to the end of the audio it hears, silence included."""

    def _hear(self, req: DecodeRequest) -> Hypothesis:
        hyp = super()._hear(req)
        if not hyp.words:
            return hyp
        last = dataclasses.replace(hyp.words[-1], end_s=req.audio.size / 16_000)
        return dataclasses.replace(hyp, words=[*hyp.words[:-1], last])


@pytest.mark.parametrize("pause_s", [0.0, 0.06])
async def test_a_final_cut_short_by_a_finalize_is_decoded_with_its_pause(pause_s: float) -> None:
    """A push-to-talk release mid-word: the final's audio ends where speech was still
    going, and Whisper took "He could" cut there (0.45 s, LibriSpeech 1089-134691-0000)
    for no speech; followed by the pause a final normally has, it read "He could." So
    the final is decoded with the rest of that pause as silence, and no word is timed
    past the audio sent."""
    first = pcm16(np.concatenate([tone(1.0), silence(pause_s)]))
    second = pcm16(np.concatenate([tone(1.0), silence(1.0)]))
    h = Harness(TimesWordsToTheEnd())
    events = await h.run(
        h.lockstep(finalized_between(first, second, 480)), interim=False, word_timestamps=True
    )
    finals = results(events, final=True)
    assert [f.from_finalize for f in finals] == [True, False]
    asked = [c[0] for c in h.engine.calls if c[0].kind is DecodeKind.FINAL]
    cut = asked[0].audio
    # (in a pause, the samples short of a whole frame are the next utterance's)
    assert finals[0].start_s == 0.0 and finals[0].end_s == pytest.approx(1.0 + pause_s, abs=0.015)
    # the utterance's audio, then the rest of the 0.2 s pause after its last voiced frame
    # (the detector's 30 ms frames: voiced to 1.02 s)
    padded = cut.size - round(finals[0].end_s * SR)
    assert padded == pytest.approx((0.2 - pause_s) * SR, abs=480)
    assert not cut[-padded:].any() and np.abs(cut[SR - 160 : SR]).max() > 0.1
    assert finals[0].words[-1].end_s <= finals[0].end_s
    # the next utterance, ended by its own pause, is decoded as it was heard
    assert asked[-1].audio.size < round(1.6 * SR) and finals[1].words[-1].end_s <= finals[1].end_s


class LoopsItsFinalTail(FakeEngine):
    """Whisper's loop: a final that reads its third and fourth words twice."""

    def _hear(self, req: DecodeRequest) -> Hypothesis:
        hyp = super()._hear(req)
        if req.kind is DecodeKind.FINAL and not hyp.rejected:
            words = hyp.text.split()
            looped = words[:4] + words[2:4] + words[4:]
            return dataclasses.replace(hyp, text=" ".join(looped), words=[])
        return hyp


async def test_the_silence_a_finalize_adds_is_no_audio_the_partial_missed() -> None:
    """A loop the partial did not read is cut where the partial heard all but 0.8 s of
    the final's audio; counted as audio, the 0.2 s of silence after a finalize's cut let
    such a loop through (the diff reviewer: 1.9 s of speech, a partial of 1.5 s)."""
    first = pcm16(np.concatenate([silence(0.5), tone(1.9)]))
    h = Harness(LoopsItsFinalTail(), partial_interval_ms=1000)
    events = await h.run(h.lockstep(finalized_between(first, pcm16(silence(1.0)), 640)))
    (final,) = results(events, final=True)
    assert final.text == "w0 w1 w2 w3 w4 w5 w6 w7"


class SpeaksChineseWithSpaces(FakeEngine):
    def _hear(self, req: DecodeRequest) -> Hypothesis:
        hyp = super()._hear(req)
        if hyp.rejected:
            return hyp
        return dataclasses.replace(hyp, text="廣州市 佛地產 中間協會分析", language="zh")


async def test_a_chinese_final_and_its_partials_have_no_spaces_between_han_words() -> None:
    h = Harness(SpeaksChineseWithSpaces(capabilities=EngineCapabilities(languages=None)))
    audio = np.concatenate([silence(0.5), tone(2.0), silence(1.0)])
    events = await h.run(h.lockstep(chunks(pcm16(audio))), language="zh")
    texts = [r.text for r in results(events)]
    assert results(events, final=False) and results(events, final=True)
    assert set(texts) == {"廣州市佛地產中間協會分析"}


async def test_speech_begun_just_before_a_finalize_opens_the_next_utterance() -> None:
    """The proto's exception: 60 ms of speech (under the detector's start time) before a
    finalize are no utterance yet; the finalize is acknowledged at once and that speech
    starts the next utterance, whose final holds it (not a fraction of a word alone)."""
    before = pcm16(np.concatenate([silence(0.5), tone(0.06)]))
    after = pcm16(np.concatenate([tone(1.0), silence(1.0)]))

    h = Harness()
    events = await h.run(h.lockstep(finalized_between(before, after, 480)), interim=False)
    (ack,) = [e for e in events if isinstance(e, Finalized)]
    (started,) = [e for e in events if isinstance(e, SpeechBoundary) and e.started]
    (final,) = results(events, final=True)
    assert ack.offset_s == pytest.approx(0.56, abs=1e-3)
    assert events.index(ack) < events.index(started) < events.index(final)
    assert started.offset_s == pytest.approx(0.5, abs=0.035)  # the onset before the finalize
    assert final.start_s < 0.5 < final.end_s and not final.from_finalize


@pytest.mark.parametrize(("rate", "held_back_s"), [(8_000, 0.0032), (8_001, 0.0), (44_101, 0.0)])
async def test_a_finalize_covers_the_audio_a_resampler_holds_back(
    rate: int, held_back_s: float
) -> None:
    """Before, the finalize went ahead of the samples soxr still held at the rates it
    converts (8001 Hz): 40-115 ms missing from the final and from FINALIZED's offset.
    The server's own resampler keeps its 1.6-3.2 ms (AudioDecoder.catch_up says why)."""
    speech = pcm16(np.concatenate([silence(0.5, rate), tone(1.5, rate)]))  # up to the end

    after = pcm16(silence(1.0, rate))
    source = finalized_between(speech, after, rate // 50 * 2)
    events = await Harness().run(source, interim=False, sample_rate=rate)
    acks = [e for e in events if isinstance(e, Finalized)]
    assert acks == [Finalized(pytest.approx(2.0 - held_back_s, abs=1e-3), 0, 0)]
    assert results(events, final=True)[0].end_s == pytest.approx(2.0 - held_back_s, abs=1e-3)


async def test_a_finalize_with_nothing_open_is_acknowledged_at_once() -> None:
    """Every finalize gets its acknowledgement, so a client can wait for it: in silence
    (a voice agent's VAD stopped on a noise) and after a final the endpointer sent."""
    speech = pcm16(np.concatenate([tone(1.0), silence(1.0)]))

    async def source() -> AsyncIterator[object]:
        yield Finalize()  # before any audio
        async for c in chunks(speech):
            yield c
        yield Finalize()  # the utterance ended on silence already

    h = Harness()
    events = await h.run(h.lockstep(source()), interim=False)
    kinds = [type(e).__name__ for e in events]
    assert kinds == [
        "Finalized",
        "SpeechBoundary",
        "SpeechBoundary",
        "RecognitionResult",
        "Finalized",
        "StreamDone",
    ]
    first, second = (e for e in events if isinstance(e, Finalized))
    assert first == Finalized(0.0, 0, None)  # no utterance yet: none to name
    assert second == Finalized(pytest.approx(2.0, abs=1e-3), 0, 0)
    assert not results(events, final=True)[0].from_finalize
    # how long each finalizing client waited for its answer
    registry = h.metrics.registry
    assert registry.get_sample_value("asr_finalize_answer_seconds_count") == 2
    assert registry.get_sample_value("asr_speech_events_total", {"type": "finalized"}) == 2


async def test_a_finalize_of_one_channel_leaves_the_other_speaking() -> None:
    """A stereo call: the agent's side (channel 1) is finalized on its own; the
    customer's utterance (channel 0) runs on to its own end."""
    both = np.stack([tone(2.0), tone(2.0)], axis=1).reshape(-1)
    rest = np.stack([silence(1.0), silence(1.0)], axis=1).reshape(-1)

    async def source() -> AsyncIterator[object]:
        async for c in chunks(pcm16(both)):
            yield c
        yield Finalize(channel=1)
        async for c in chunks(pcm16(rest)):
            yield c

    h = Harness()
    events = await h.run(h.lockstep(source()), channels=2, interim=False)
    finals = {f.channel: f for f in results(events, final=True)}
    assert finals[1].from_finalize and finals[1].end_s == pytest.approx(2.0, abs=0.05)
    assert not finals[0].from_finalize and finals[0].end_s > 2.1
    assert [e.channel for e in events if isinstance(e, Finalized)] == [1]


async def test_finalizes_sent_without_reading_their_answers_are_held_back() -> None:
    """Each FINALIZE makes a response. A client that sends them and reads nothing is held
    back as one sending audio too fast is: the responses fill the send queue, the channel
    waits to send, its inbox fills and the reader stops reading (HTTP/2 flow control
    then holds the client). Nothing piles up without bound, and nothing is lost."""
    total = 2000
    pulled = 0

    async def source() -> AsyncIterator[object]:
        nonlocal pulled
        for _ in range(total):
            pulled += 1
            yield Finalize()

    h = Harness()
    scheduler = EngineScheduler(h.engine, h.metrics, workers=h.engine.workers)
    await scheduler.start()
    config = StreamConfig(AudioFormat(Encoding.LINEAR16, SR, 1))
    session = StreamSession(
        config, SessionServices(h.settings, scheduler, h.metrics, EnergyVoiceDetector), "test"
    )
    reading = asyncio.Event()
    acks = 0

    async def send(event: object, progress: Progress) -> None:
        nonlocal acks
        await reading.wait()  # the client reads nothing until told to
        acks += isinstance(event, Finalized)

    run = asyncio.create_task(session.run(source(), send))  # type: ignore[arg-type]
    try:
        await asyncio.sleep(0.3)
        queued = h.settings.streaming.result_queue_size
        assert pulled < queued + 100, pulled  # the send queue, the inbox's 32, a few more
        reading.set()
        await asyncio.wait_for(run, 30)
    finally:
        run.cancel()
        await scheduler.close()
    assert acks == total


async def test_a_finalize_of_a_channel_the_stream_lacks_is_invalid() -> None:
    async def source() -> AsyncIterator[object]:
        async for c in chunks(pcm16(tone(0.5))):
            yield c
        yield Finalize(channel=1)

    with pytest.raises(AsrError) as err:
        await Harness().run(source())
    assert err.value.status is Status.INVALID_ARGUMENT
    assert "control.channel 1" in str(err.value) and "1 channel(s)" in str(err.value)


@pytest.mark.parametrize(
    ("turn_threshold", "reason", "ends_after_s"),
    [
        (None, TurnEndReason.MAX_SILENCE, 2.0),  # 0.6 is under the server's 0.7
        (0.5, TurnEndReason.MODEL, 0.6),  # this stream trusts 0.6 at the second ask
        (1.0, TurnEndReason.MAX_SILENCE, 2.0),  # never the model's call: it is not asked
    ],
)
async def test_a_stream_sets_its_own_turn_threshold(
    turn_threshold: float | None, reason: TurnEndReason, ends_after_s: float
) -> None:
    model = ScriptedTurnModel(0.6)
    h = Harness(turn=semantic(model))
    audio = np.concatenate([silence(0.5), tone(2.0), silence(3.0)])
    events = await h.run(
        h.lockstep(chunks(pcm16(audio), 480)),
        semantic=True,
        max_silence_ms=2000,
        turn_threshold=turn_threshold,
    )
    (end,) = [e for e in events if isinstance(e, EndOfTurn)]
    assert end.reason is reason
    processed = h.progress[events.index(end)].audio_processed_s
    assert_ended_near(processed, 2.5 + ends_after_s)
    assert (model.heard == []) == (turn_threshold == 1.0)


def hissing_tone(seconds: float, rate: int = SR) -> np.ndarray:
    """A tone with a hiss across the band: full-band audio to the bandwidth meter."""
    hiss = np.random.default_rng(0).standard_normal(int(seconds * rate)) * 0.02
    return tone(seconds, rate) + hiss.astype(np.float32)


@pytest.mark.parametrize(
    ("rate", "full_band", "ends_after_s"),
    [
        (SR, True, 0.15),  # full band: 0.985 reaches the first ask's 0.98
        (8_000, True, 0.6),  # a phone line's first ask wants 0.99: the second (0.7) ends it
        (SR, False, 0.6),  # so does speech with nothing above 4 kHz, at any rate
    ],
)
async def test_a_phone_lines_first_ask_needs_the_narrowband_threshold(
    rate: int, full_band: bool, ends_after_s: float
) -> None:
    model = ScriptedTurnModel(0.985)
    h = Harness(turn=semantic(model))
    speech = hissing_tone(2.0, rate) if full_band else tone(2.0, rate)
    audio = np.concatenate([silence(0.5, rate), speech, silence(1.5, rate)])
    events = await h.run(
        h.lockstep(chunks(pcm16(audio), 960 * rate // SR)), semantic=True, sample_rate=rate
    )
    (end,) = [e for e in events if isinstance(e, EndOfTurn)]
    assert end.reason is TurnEndReason.MODEL and end.probability == pytest.approx(0.985)
    processed = h.progress[events.index(end)].audio_processed_s
    assert_ended_near(processed, 2.5 + ends_after_s)
    assert len(results(events, final=True)) == 1
    # judged by its band, not its rate: counted
    assert h.metrics.turn_phone_band._value.get() == (rate == SR and not full_band)


@pytest.mark.parametrize("message_s", [0.02, 0.5, 6.0])
async def test_a_turn_ends_where_the_model_said_however_the_audio_is_cut(
    message_s: float,
) -> None:
    """Unsure at the first ask (0.98), sure enough at the second (0.7, 600 ms in), of a
    0.9 s pause. In 0.5 s messages speech resumed in the second ask's own message before
    its answer came back, the answer was dropped, and the two sentences were one
    utterance (whose final, from real Whisper, then left the first sentence out)."""
    model = ScriptedTurnModel(0.8)
    h = Harness(turn=semantic(model))
    audio = np.concatenate([silence(0.5), tone(2.0), silence(0.9), tone(1.0), silence(3.0)])
    message = int(message_s * SR) * 2
    events = await h.run(chunks(pcm16(audio), message), semantic=True, max_silence_ms=2000)
    ends = [e for e in events if isinstance(e, EndOfTurn)]
    assert [e.reason for e in ends] == [TurnEndReason.MODEL, TurnEndReason.MODEL], ends
    assert [round(e.offset_s, 1) for e in ends] == [2.5, 4.4]
    assert len(results(events, final=True)) == 2
    assert not [e for e in events if isinstance(e, SpeechResumed)]


async def test_a_live_clients_audio_never_waits_for_the_model() -> None:
    """Audio sent live is heard as it comes, whatever the model is asked: an answer that
    comes after the speaker went on (the model took 0.5 s, speech resumed 0.2 s after
    the ask) changes nothing, as it never did; only audio sent ahead of time waits."""

    class SlowModel(ScriptedTurnModel):
        def predict(self, audio: np.ndarray) -> TurnVerdict:
            time.sleep(0.5)
            return super().predict(audio)

    h = Harness(turn=semantic(SlowModel(0.99)))
    audio = np.concatenate([silence(0.3), tone(1.0), silence(0.35), tone(1.0), silence(1.0)])

    async def live() -> AsyncIterator[object]:
        start = time.monotonic()
        async for c in chunks(pcm16(audio), 640):  # 20 ms
            yield c
            due = start + h.session.progress.audio_received_s  # (its last sample's time)
            await asyncio.sleep(max(0.0, due - time.monotonic()))

    events = await h.run(live(), semantic=True, max_silence_ms=2000)
    ends = [e for e in events if isinstance(e, EndOfTurn)]
    assert [e.reason for e in ends] == [TurnEndReason.MODEL], ends
    assert len(results(events, final=True)) == 1  # the speaker went on: one turn


async def test_a_turn_ends_where_the_model_said_in_a_message_heard_on_arrival() -> None:
    """An idle channel hears a message on the reader's turn (take_inline); one holding a
    whole short turn, its pause and more speech went to the channel as one list of
    events, and the model's yes came back after the speech that followed the pause."""
    model = ScriptedTurnModel(0.99)
    h = Harness(turn=semantic(model))
    lead = pcm16(silence(0.48))
    turns = pcm16(np.concatenate([tone(0.6), silence(0.3), tone(0.6)]))  # one message
    tail = pcm16(silence(3.0))

    async def source() -> AsyncIterator[object]:
        async for c in h.lockstep(chunks(lead, 640)):
            yield c
        yield turns
        await h.settle()
        async for c in h.lockstep(chunks(tail, 640)):
            yield c

    events = await h.run(source(), semantic=True, max_silence_ms=2000)
    ends = [e for e in events if isinstance(e, EndOfTurn)]
    assert [e.reason for e in ends] == [TurnEndReason.MODEL, TurnEndReason.MODEL], ends
    assert len(results(events, final=True)) == 2


async def test_an_update_changes_the_turn_threshold_and_hotwords_from_there_on() -> None:
    """StreamingUpdate, in order with the audio: the first turn ends at the server's
    thresholds (never sure enough: the longest pause), the second at the stream's new one;
    finals decoded after the update carry the new hotwords in their prompt."""
    model = ScriptedTurnModel(0.6)
    h = Harness(turn=semantic(model))
    turn = pcm16(np.concatenate([silence(0.3), tone(1.0), silence(2.3)]))

    async def source() -> AsyncIterator[object]:
        async for c in h.lockstep(chunks(turn, 480)):
            yield c
        config = h.session.config
        yield ConfigUpdate(dataclasses.replace(config, turn_threshold=0.5, hotwords=("Ishmael",)))
        async for c in h.lockstep(chunks(turn, 480)):
            yield c

    events = await h.run(source(), semantic=True, max_silence_ms=2000, interim=False)
    ends = [e for e in events if isinstance(e, EndOfTurn)]
    assert [e.reason for e in ends] == [TurnEndReason.MAX_SILENCE, TurnEndReason.MODEL]
    ended_at = [h.progress[events.index(e)].audio_processed_s for e in ends]
    assert ended_at[0] == pytest.approx(1.3 + 2.0, abs=0.1)
    assert_ended_near(ended_at[1], 3.6 + 1.3 + 0.6)
    finals = [r for call in h.engine.calls for r in call if r.kind is DecodeKind.FINAL]
    assert "Ishmael" not in finals[0].prompt and "Ishmael" in finals[-1].prompt


async def test_an_update_of_silence_ms_ends_utterances_at_shorter_pauses() -> None:
    # speech, a 0.4 s pause, speech: one utterance at the default 500 ms, two at 300 ms
    h = Harness()
    phrase = pcm16(np.concatenate([tone(1.0), silence(0.4), tone(1.0), silence(1.0)]))

    async def source() -> AsyncIterator[object]:
        async for c in h.lockstep(chunks(phrase, 480)):
            yield c
        yield ConfigUpdate(dataclasses.replace(h.session.config, silence_ms=300))
        async for c in h.lockstep(chunks(phrase, 480)):
            yield c

    events = await h.run(source(), interim=False)
    assert len(results(events, final=True)) == 1 + 2


def test_a_streams_turn_threshold_never_trusts_the_first_ask_more() -> None:
    server = semantic(ScriptedTurnModel(0.5))
    assert server.for_stream() is server
    lower = server.for_stream(0.5, 0.3)
    assert lower.probes() == [(150, 0.98), (600, 0.5)] and lower.eager_threshold == 0.3
    higher = server.for_stream(0.99)
    assert higher.probes() == [(150, 0.99), (600, 0.99)] and higher.eager_threshold == 0.5
    never = server.for_stream(1.0)
    assert never.threshold > 1 and never.second_threshold > 1
    assert never.probes() == []  # nothing to ask
    # a phone line's first ask starts from the narrowband threshold, and a stream's own
    # threshold still only raises it
    phone = server.for_stream(narrowband=True)
    assert phone.probes() == [(150, 0.99), (600, 0.7)] and phone.eager_threshold == 0.5
    assert server.for_stream(0.5, 0.3, narrowband=True).probes() == [(150, 0.99), (600, 0.5)]
    assert server.for_stream(0.995, narrowband=True).probes() == [(150, 0.995), (600, 0.995)]


async def test_a_semantic_turn_the_client_finalizes_says_so() -> None:
    # the model is unsure at the first probe (0.15 s); the client finalizes at 0.3 s
    model = ScriptedTurnModel(0.1)
    h = Harness(turn=semantic(model))

    async def source() -> AsyncIterator[object]:
        async for c in h.lockstep(chunks(pcm16(np.concatenate([tone(2.0), silence(0.3)])), 480)):
            yield c
        yield Finalize()
        async for c in h.lockstep(chunks(pcm16(silence(0.5)), 480)):
            yield c

    events = await h.run(source(), semantic=True, interim=False)
    (end,) = [e for e in events if isinstance(e, EndOfTurn)]
    assert end.reason is TurnEndReason.FINALIZE
    assert end.probability == pytest.approx(0.1)
    assert len(results(events, final=True)) == 1


def final_decodes(h: Harness) -> int:
    return sum(r.kind is DecodeKind.FINAL for call in h.engine.calls for r in call)


async def a_turn_ended_by_the_client(
    h: Harness, pause: list[np.ndarray], **config: Any
) -> list[object]:
    """A first turn (after it the channel decodes finals 60 ms into each pause), then a
    turn of 2 s whose pause holds ``pause``, finalized by the client at its end."""
    first = [pcm16(tone(2.0)), pcm16(silence(0.3)), Finalize(), pcm16(silence(0.5))]
    second = [pcm16(tone(2.0)), pcm16(np.concatenate(pause)), Finalize(), pcm16(silence(0.5))]

    async def source() -> AsyncIterator[object]:
        for item in [pcm16(silence(0.5)), *first, *second]:  # turns at 0.5 and 3.3 s
            if isinstance(item, bytes):
                async for c in h.lockstep(chunks(item, 480)):
                    yield c
            else:
                yield item

    return await h.run(source(), interim=False, **config)


async def test_finalize_in_a_pause_gets_the_final_decoded_early_in_it() -> None:
    # what a voice agent does: its own VAD hears 0.3 s of pause and it finalizes
    audio = pcm16(np.concatenate([silence(0.5), tone(2.0), silence(0.3)]))
    rest = pcm16(silence(1.0))

    async def source() -> AsyncIterator[object]:
        async for c in h.lockstep(chunks(audio, 480)):
            yield c
        yield Finalize()
        async for c in chunks(rest, 480):
            yield c

    h = Harness()
    events = await h.run(source(), interim=False)
    (ended,) = [e for e in events if isinstance(e, SpeechBoundary) and not e.started]
    (final,) = results(events, final=True)
    assert ended.offset_s == pytest.approx(2.5, abs=0.05)  # where speech ended, not 2.8
    assert final.end_s == pytest.approx(2.5 + 0.2, abs=0.05)  # with the usual pad
    assert final_decodes(h) == 1  # the one started 0.2 s into the pause


async def test_after_a_client_finalize_finals_are_decoded_early_in_each_pause() -> None:
    # a voice agent finalizes 0.3 s into each pause (its own VAD); the server's decode
    # starts 0.2 s into a pause, until the first finalize shows the client ends turns
    # itself: then 60 ms in (turn.speculate_ms), so it is ready sooner
    h = Harness()
    events = await a_turn_ended_by_the_client(h, [silence(0.3)])
    first, second = results(events, final=True)
    assert first.end_s == pytest.approx(2.5 + 0.2, abs=0.035)  # the 0.2 s decode
    assert second.end_s == pytest.approx(5.3 + 0.06, abs=0.035)  # the early one
    assert final_decodes(h) == 2  # each finalize got the decode already under way


class SlowFinals(FakeEngine):
    """Finals take half a second of wall time; says whether one is being decoded."""

    def __init__(self) -> None:
        super().__init__()
        self.decoding_final = False

    def transcribe(self, requests):  # type: ignore[no-untyped-def]
        if all(r.kind is not DecodeKind.FINAL for r in requests):
            return super().transcribe(requests)
        self.decoding_final = True
        try:
            time.sleep(0.5)
            return super().transcribe(requests)
        finally:
            self.decoding_final = False


class WatchesTheEngine(ScriptedTurnModel):
    """Notes, at each ask, whether a final was being decoded beside it."""

    def __init__(self, probability: float, engine: SlowFinals) -> None:
        super().__init__(probability)
        self.engine = engine
        self.beside_a_final: list[bool] = []

    def predict(self, audio: np.ndarray) -> TurnVerdict:
        self.beside_a_final.append(self.engine.decoding_final)
        return super().predict(audio)


@pytest.mark.parametrize(("finalize_pause_s", "waits"), [(0.25, True), (0.8, False)])
async def test_the_turn_model_waits_for_the_early_final_where_the_client_ends_turns_first(
    finalize_pause_s: float, waits: bool
) -> None:
    """On a voice agent's stream (its VAD finalizes 200-300 ms into a pause) the model,
    asked 150 ms in, would only slow the final decoded from 60 ms in: it waits for that
    decode. A client that finalizes later leaves the turn to the model, asked at once."""
    engine = SlowFinals()
    model = WatchesTheEngine(0.1, engine)  # never sure: the client or the pause ends turns
    h = Harness(engine, turn=semantic(model))
    asked_in_the_first_turn = 0

    async def source() -> AsyncIterator[object]:
        nonlocal asked_in_the_first_turn
        first = np.concatenate([silence(0.5), tone(2.0), silence(finalize_pause_s)])
        async for c in h.lockstep(chunks(pcm16(first), 480)):
            yield c
        yield Finalize()  # (from now on the final is decoded 60 ms into each pause)
        async for c in h.lockstep(chunks(pcm16(np.concatenate([silence(0.3), tone(2.0)])), 480)):
            yield c
        asked_in_the_first_turn = len(model.beside_a_final)
        async for c in chunks(pcm16(silence(0.1)), 480):
            yield c
        await eventually(lambda: engine.decoding_final)  # (begun 60 ms into the pause)
        async for c in chunks(pcm16(silence(0.9)), 480):  # both asks come due meanwhile
            yield c
        await eventually(lambda: len(model.beside_a_final) == asked_in_the_first_turn + 2)

    events = await h.run(source(), semantic=True, interim=False, max_silence_ms=2000)
    beside = model.beside_a_final[asked_in_the_first_turn:]
    assert len(beside) == 2  # the asks at 150 and 600 ms of the second pause
    assert not any(beside) if waits else all(beside), beside
    assert final_decodes(h) == 2  # each turn's final decoded once, early in its pause
    assert [r.text for r in results(events, final=True)] == ["w0 w1 w2 w3 w4 w5 w6 w7"] * 2
    registry = h.metrics.registry
    assert registry.get_sample_value("asr_turn_model_seconds_count") == len(model.heard)
    assert registry.get_sample_value("asr_turn_model_skipped_total") == 0


async def test_a_question_the_clients_finalize_answers_first_is_not_asked() -> None:
    """The agent's VAD finalizes 250 ms into the pause, while the early final (begun at
    60 ms) is still being decoded: the model's question (due at 150 ms) is moot, and
    skipped; the turn's final is the early one."""
    engine = SlowFinals()
    model = WatchesTheEngine(0.1, engine)
    h = Harness(engine, turn=semantic(model))

    async def source() -> AsyncIterator[object]:
        first = np.concatenate([silence(0.5), tone(2.0), silence(0.25)])
        async for c in h.lockstep(chunks(pcm16(first), 480)):
            yield c
        yield Finalize()
        async for c in h.lockstep(chunks(pcm16(np.concatenate([silence(0.3), tone(2.0)])), 480)):
            yield c
        async for c in chunks(pcm16(silence(0.1)), 480):
            yield c
        await eventually(lambda: engine.decoding_final)
        async for c in chunks(pcm16(silence(0.15)), 480):
            yield c
        await asyncio.sleep(0.1)  # the question at 150 ms has come due meanwhile
        assert engine.decoding_final
        yield Finalize()
        async for c in h.lockstep(chunks(pcm16(silence(0.5)), 480)):
            yield c

    events = await h.run(source(), semantic=True, interim=False)
    ends = [e for e in events if isinstance(e, EndOfTurn)]
    assert [e.reason for e in ends] == [TurnEndReason.FINALIZE] * 2
    assert len(model.heard) == 1  # only in the first turn (the client had not finalized yet)
    registry = h.metrics.registry
    assert registry.get_sample_value("asr_turn_model_skipped_total") == 1
    assert registry.get_sample_value("asr_turn_model_seconds_count") == 1
    assert final_decodes(h) == 2
    assert [r.text for r in results(events, final=True)] == ["w0 w1 w2 w3 w4 w5 w6 w7"] * 2


def breath(seconds: float = 0.06, rms: float = 0.05) -> np.ndarray:
    """Loud enough for the energy detector, and no speech to Silero (white noise)."""
    return (np.random.default_rng(7).standard_normal(int(seconds * SR)) * rms).astype(np.float32)


@pytest.mark.parametrize("second_opinion", [True, False])
async def test_a_breath_in_the_pause_does_not_cost_the_final_a_decode(
    second_opinion: bool,
) -> None:
    # the voice agent's case: its VAD hears 0.25 s of pause and finalizes; the server's
    # detector took a breath 0.1 s into the pause for speech, after the final's early
    # decode (60 ms in) had begun, and only 50 ms before the finalize
    h = Harness(speech_check=silero_hears_speech if second_opinion else None)
    events = await a_turn_ended_by_the_client(h, [silence(0.1), breath(), silence(0.05)])
    _, second = results(events, final=True)
    _, ended = [e.offset_s for e in events if isinstance(e, SpeechBoundary) and not e.started]
    if second_opinion:  # Silero hears no speech in the breath: the early final stands
        assert ended == pytest.approx(5.3, abs=0.035)  # and speech ended before the breath
        assert second.end_s == pytest.approx(5.3 + 0.06, abs=0.035)
        assert final_decodes(h) == 2
        assert h.metrics.early_finals_kept._value.get() == 1
    else:  # without it, the breath counts as speech: the final is decoded again with it
        assert ended == pytest.approx(5.3 + 0.16, abs=0.035)  # the breath's end
        assert second.end_s > 5.3 + 0.16
        assert final_decodes(h) == 3
        assert h.metrics.early_finals_kept._value.get() == 0
    assert second.text == "w0 w1 w2 w3 w4 w5 w6 w7"


async def test_an_eager_result_withdrawn_at_a_breath_is_not_kept_as_the_final() -> None:
    # with eager finals the pause's early final went out as an eager result, and the
    # breath withdrew it (SPEECH_RESUMED): a client was told the speaker went on, so the
    # final is no longer that set-aside result, ending before the resumption it was told
    h = Harness(speech_check=silero_hears_speech)
    pause = [silence(0.25), breath(), silence(0.05)]
    events = await a_turn_ended_by_the_client(h, pause, eager_finals=True)
    (resumed,) = [e for e in events if isinstance(e, SpeechResumed)]
    (ended,) = [
        e
        for e in events
        if isinstance(e, SpeechBoundary)
        and not e.started
        and e.utterance_id == resumed.utterance_id
    ]
    assert ended.offset_s >= resumed.offset_s
    (final,) = [f for f in results(events, final=True) if f.utterance_id == resumed.utterance_id]
    assert final.end_s >= resumed.offset_s and final.text == "w0 w1 w2 w3 w4 w5 w6 w7"
    assert h.metrics.early_finals_kept._value.get() == 0


async def test_an_eager_result_after_an_early_final_set_aside_is_the_final() -> None:
    # the pause's first early final (decoded from 60 ms) was set aside at a breath before
    # its eager result was due (200 ms); the pause went on and the next early final went
    # out as the eager result. Silero hears no speech in the breath: the set-aside final,
    # ending before it, was the final, and the eager text the client had was neither it
    # nor withdrawn (a reviewer's fuzzing: "...his gospel." eager, "...this gospel." final)
    h = Harness(speech_check=silero_hears_speech)
    pause = [silence(0.1), breath(), silence(0.35)]
    events = await a_turn_ended_by_the_client(h, pause, eager_finals=True)
    assert not any(isinstance(e, SpeechResumed) for e in events)
    (eager,) = [e for e in results(events) if e.eager and e.utterance_id == 1]
    (final,) = [f for f in results(events, final=True) if f.utterance_id == eager.utterance_id]
    assert (final.text, final.end_s) == (eager.unstable_text, eager.end_s)


async def test_only_an_early_final_the_engine_began_is_set_aside() -> None:
    # setting aside costs nothing for a decode under way (it cannot be stopped); a
    # queued one is dropped as before, or pauses inside sentences would cost decodes
    utt = UtteranceState(0, UtteranceAudio(0), speech_arrived=0.0)
    queued, running = EarlyFinal(0, 960, ""), EarlyFinal(0, 960, "")
    for early in (queued, running):
        early.task = asyncio.create_task(asyncio.sleep(10))
    running.mark_started()
    utt.speculation = queued
    utt.set_speculation_aside()
    utt.speculation = running
    utt.set_speculation_aside()
    await asyncio.sleep(0)
    assert queued.task.cancelled() and not running.task.cancelled()
    assert utt.speculation is None and utt.set_aside is running
    utt.drop_speculation()
    await asyncio.sleep(0)
    assert running.task.cancelled() and utt.set_aside is None


async def test_speech_in_the_pause_is_decoded_with_the_turn() -> None:
    # the same, but the sound in the pause is a spoken word: Silero hears it, and the
    # final set aside when it began (which lacks it) is not used
    pcm, _ = read_pcm16(corpus()["libri_1089-134691-0000"].path)  # "he could wait…"
    word = (pcm[int(0.6 * SR) : int(1.0 * SR), 0] / 32768).astype(np.float32)
    h = Harness(speech_check=silero_hears_speech)
    events = await a_turn_ended_by_the_client(h, [silence(0.1), word, silence(0.05)])
    _, second = results(events, final=True)
    assert second.end_s >= 5.3 + 0.1 + 0.4 - 0.035
    assert len(second.text.split()) > 8  # the fake engine heard the word too
    assert h.metrics.early_finals_kept._value.get() == 0


class MakesUpWordsForNoise(FakeEngine):
    """The fake engine, hearing words in tones only, with Whisper's habit on a noise: after
    a forced prefix (the previous final, carried) it hears nothing new there, and alone
    it makes up "Thank you."."""

    def __init__(self) -> None:
        super().__init__(capabilities=EngineCapabilities(context_carry=True))

    def _hear(self, req: DecodeRequest) -> Hypothesis:
        blocks = req.audio[: req.audio.size // 160 * 160].reshape(-1, 160)
        crossings = np.mean(np.diff(np.sign(blocks), axis=1) != 0, axis=1)
        tones = req.audio.copy()
        tones[: blocks.size][np.repeat(crossings > 0.3, 160)] = 0  # white noise: many
        hyp = super()._hear(dataclasses.replace(req, audio=tones))
        if hyp.rejected and not req.prefix and np.abs(req.audio).max() > 1e-3:
            return Hypothesis("Thank you.", req.language or "en")
        return hyp


@pytest.mark.parametrize("second_opinion", [True, False])
async def test_a_noise_after_a_final_gets_no_words(second_opinion: bool) -> None:
    # a noise the voice detector takes for speech, 1 s after an utterance
    audio = np.concatenate([silence(0.5), tone(1.0), silence(1.0), breath(0.6), silence(1.0)])
    h = Harness(
        MakesUpWordsForNoise(), speech_check=silero_hears_speech if second_opinion else None
    )
    events = await h.run(h.lockstep(chunks(pcm16(audio))), interim=False)
    finals = [f.text for f in results(events, final=True)]
    # its utterance begins and ends, as the voice detector heard it, either way
    assert [e.started for e in events if isinstance(e, SpeechBoundary)] == [True, False] * 2
    no_words = [e for e in events if isinstance(e, NoWords)]
    if second_opinion:  # decoded after the first final, it had no new words: none
        assert finals == ["w0 w1 w2 w3"]
        assert h.metrics.finals_without_speech._value.get() == 1
        assert final_decodes(h) == 2
        # and the stream says so where its final would have come, after its speech end
        (nothing,) = no_words
        ended = [e for e in events if isinstance(e, SpeechBoundary) and not e.started][-1]
        assert nothing.utterance_id == ended.utterance_id == 1
        assert events.index(nothing) > events.index(ended)
    else:  # then decoded alone, as before, and made up
        assert no_words == []
        assert finals == ["w0 w1 w2 w3", "Thank you."]
        assert h.metrics.finals_without_speech._value.get() == 0
        assert final_decodes(h) == 3


async def test_audio_ending_inside_speech_is_finalized() -> None:
    events = await Harness().run(chunks(pcm16(tone(1.5))))
    assert results(events, final=True)[-1].text == " ".join(f"w{i}" for i in range(6))


async def test_a_semantic_turn_the_audio_ends_inside_says_so() -> None:
    h = Harness(turn=semantic(ScriptedTurnModel(0.1)))
    events = await h.run(chunks(pcm16(tone(1.5))), semantic=True)
    (end,) = [e for e in events if isinstance(e, EndOfTurn)]
    assert end.reason is TurnEndReason.END_OF_AUDIO
    assert results(events, final=True)[-1].text == " ".join(f"w{i}" for i in range(6))


def speech_events(events: list[object]) -> list[tuple[bool, int]]:
    """(started?, utterance id) of each SPEECH_STARTED / SPEECH_ENDED, in order."""
    return [(e.started, e.utterance_id) for e in events if isinstance(e, SpeechBoundary)]


async def test_a_long_utterance_is_split_at_a_short_pause_with_its_early_final() -> None:
    # 7 s of speech, a 0.35 s pause (under the 500 ms that ends an utterance), 2 s more
    audio = np.concatenate([silence(0.5), tone(7.0), silence(0.35), tone(2.0), silence(1.0)])
    h = Harness(split_at_pause_after_s=6.0)
    events = await h.run(h.lockstep(chunks(pcm16(audio), 640)))
    finals = results(events, final=True)
    assert len(finals) == 2
    # the first part ends 200 ms into the pause (the final's trailing pad); the second
    # begins there, and nothing is lost between them (0.25 s a word, +-1 at the cut)
    assert finals[0].end_s == pytest.approx(7.7, abs=0.05)
    assert finals[1].start_s == pytest.approx(finals[0].end_s, abs=0.01)
    assert abs(sum(len(f.text.split()) for f in finals) - 36) <= 1
    # one stretch of speech to the client: a split, not an end
    first, second = finals[0].utterance_id, finals[1].utterance_id
    assert speech_events(events) == [(True, first), (False, second)]
    assert events.index(finals[0]) < next(
        i for i, e in enumerate(events) if isinstance(e, SpeechBoundary) and not e.started
    )
    # the early final decoded in the pause is the first part's final: no decode again
    assert final_decodes(h) == 2
    assert h.metrics.pause_splits._value.get() == 1


async def test_a_long_silence_setting_splits_a_short_utterance_at_a_long_pause() -> None:
    """silence_ms 3000 (a dictation, a bridge whose client ends its turns): two sentences
    a second apart were one utterance, decoded whole, and Whisper often left one out.
    A pause of the default silence's length splits it, however short; one of 0.35 s
    does not (under 6 s, the length rule's)."""
    audio = np.concatenate(
        [silence(0.5), tone(2.0), silence(0.35), tone(1.0), silence(1.0), tone(2.0), silence(4.0)]
    )
    h = Harness(split_at_pause_after_s=6.0)
    events = await h.run(h.lockstep(chunks(pcm16(audio), 640)), silence_ms=3000)
    finals = results(events, final=True)
    assert len(finals) == 2
    assert finals[0].end_s == pytest.approx(4.05, abs=0.05)  # 200 ms into the long pause
    assert finals[1].start_s == pytest.approx(finals[0].end_s, abs=0.01)
    assert abs(sum(len(f.text.split()) for f in finals) - 20) <= 1
    first, second = finals[0].utterance_id, finals[1].utterance_id
    assert speech_events(events) == [(True, first), (False, second)]  # a split, not an end
    assert h.metrics.pause_splits._value.get() == 1


async def test_a_long_pause_whose_eager_result_went_out_makes_it_the_first_parts_final() -> None:
    """Eager finals on a long-silence SILENCE stream: the pause's eager result was
    withdrawn when speech resumed and the two sentences decoded whole, as before the
    split. It is now the first part's final, with its text, as at the length limit."""
    audio = np.concatenate([silence(0.5), tone(2.0), silence(1.0), tone(2.0), silence(4.0)])
    h = Harness(split_at_pause_after_s=6.0)
    events = await h.run(h.lockstep(chunks(pcm16(audio), 640)), silence_ms=3000, eager_finals=True)
    finals = results(events, final=True)
    eager = [e for e in results(events) if e.eager]
    assert h.metrics.pause_splits._value.get() == 1
    assert len(finals) == 2
    assert eager and eager[0].text == finals[0].text
    assert eager[0].utterance_id == finals[0].utterance_id
    assert not [e for e in events if isinstance(e, SpeechResumed)]
    assert finals[1].start_s == pytest.approx(finals[0].end_s, abs=0.01)
    assert abs(sum(len(f.text.split()) for f in finals) - 16) <= 1


async def test_a_long_pause_splits_after_the_client_has_finalized_too() -> None:
    """A client that finalizes (a bridge's push-to-talk: silence_ms 10000 and a FINALIZE at
    each commit) has each pause's final decoded 60 ms in, which hears too little of the
    pause to cut at: from its first FINALIZE on, no utterance was split, and the lost
    sentences came back. A pause that reaches the long pause gets its final with the pad."""
    first = pcm16(np.concatenate([silence(0.5), tone(1.0), silence(0.3)]))
    pair = pcm16(np.concatenate([tone(2.0), silence(1.0), tone(2.0), silence(4.0)]))
    h = Harness(split_at_pause_after_s=6.0)
    events = await h.run(h.lockstep(finalized_between(first, pair, 640)), silence_ms=10000)
    finals = results(events, final=True)
    assert h.metrics.pause_splits._value.get() == 1
    assert len(finals) == 3
    assert finals[1].end_s == pytest.approx(4.0, abs=0.05)  # 200 ms into the long pause
    assert finals[2].start_s == pytest.approx(finals[1].end_s, abs=0.01)


async def test_a_long_pause_splits_a_semantic_stream_whose_turn_model_is_not_asked() -> None:
    """turn_threshold 1 (Flux's eot_threshold=1, its own turn detection): no model holds
    the pause open, the client or the longest pause ends the turn; two sentences a
    second apart were one utterance, decoded whole, as in a long-silence SILENCE stream.
    Split as there; the turn still ends once, after the second part."""
    audio = np.concatenate([silence(0.5), tone(2.0), silence(1.0), tone(2.0), silence(4.0)])
    model = ScriptedTurnModel(0.99)
    h = Harness(turn=semantic(model), split_at_pause_after_s=6.0)
    events = await h.run(h.lockstep(chunks(pcm16(audio), 640)), semantic=True, turn_threshold=1.0)
    finals = results(events, final=True)
    assert h.metrics.pause_splits._value.get() == 1
    assert len(finals) == 2
    assert finals[0].end_s == pytest.approx(2.7, abs=0.05)  # 200 ms into the pause
    turns = [e for e in events if isinstance(e, EndOfTurn)]
    assert [t.utterance_id for t in turns] == [finals[1].utterance_id]
    assert model.heard == []  # not asked


class StopsAtAPause(FakeEngine):
    """The fake engine, with Whisper's habit on two sentences and a pause between in one
    final decode: it reads the first and ends there."""

    def _hear(self, req: DecodeRequest) -> Hypothesis:
        if req.kind is DecodeKind.FINAL:
            loud = np.abs(req.audio) > 1e-3
            quiet_run, first_loud = 0, None
            for i in range(0, req.audio.size, 160):  # 10 ms steps
                if loud[i : i + 160].any():
                    if first_loud is not None and quiet_run >= int(0.45 * SR):
                        req = dataclasses.replace(req, audio=req.audio[: i - quiet_run])
                        break
                    first_loud = i if first_loud is None else first_loud
                    quiet_run = 0
                else:
                    quiet_run += 160
        return super()._hear(req)


class StopsAtAPauseTimedToItsEnd(StopsAtAPause, TimesWordsToTheEnd):
    """Stops at a pause, and times its last word to the end of the audio it read."""


async def test_a_rest_read_on_after_a_finalize_has_no_word_past_the_audio() -> None:
    """The rest read on after a held pause was decoded with the silence a finalize's cut
    added, and its last word ended 0.2 s past the final's audio (the diff reviewer)."""
    h = Harness(StopsAtAPauseTimedToItsEnd(), turn=semantic(ScriptedTurnModel(0.3)))
    first = pcm16(np.concatenate([silence(0.5), tone(2.0), silence(0.7), tone(1.5)]))
    events = await h.run(
        h.lockstep(finalized_between(first, pcm16(silence(1.0)), 640)),
        semantic=True,
        interim=False,
        word_timestamps=True,
    )
    (final,) = results(events, final=True)
    assert final.from_finalize and h.metrics.held_pauses_read_on._value.get() == 1
    assert final.words[-1].end_s <= final.end_s


@pytest.mark.parametrize("word_timestamps", [False, True])
async def test_a_final_that_stopped_at_a_held_pause_reads_on(word_timestamps: bool) -> None:
    """SEMANTIC holds a 0.7 s pause open (the model is unsure), and the turn's final
    decode of both sentences stopped after the first: the second was in no final (a
    reviewer's fuzzing, LibriSpeech pairs). The rest is decoded on its own and joined."""
    h = Harness(StopsAtAPause(), turn=semantic(ScriptedTurnModel(0.3)))
    audio = np.concatenate([silence(0.5), tone(2.0), silence(0.7), tone(1.5), silence(3.0)])
    events = await h.run(
        h.lockstep(chunks(pcm16(audio), 640)),
        semantic=True,
        interim=False,
        word_timestamps=word_timestamps,
    )
    (final,) = results(events, final=True)
    # 2 s and 1.5 s of words (the fake engine names the rest's words from w0)
    assert final.text == " ".join([f"w{i}" for i in range(8)] + [f"w{i}" for i in range(6)])
    assert h.metrics.held_pauses_read_on._value.get() == 1
    if word_timestamps:
        assert [w.word for w in final.words] == final.text.split()
        assert final.words[8].start_s == pytest.approx(3.2, abs=0.05)  # the second tone
    else:
        assert final.words == []


@pytest.mark.parametrize(
    ("pauses", "silence_ms"),
    [
        ((0.7, 0.7), 500),  # a rest read on stops at the next held pause: read on again
        ((0.55,), 500),
        ((0.7,), 800),  # a pause shorter than silence_ms is held open too
    ],
)
async def test_every_held_pause_a_final_stopped_at_is_read_on(
    pauses: tuple[float, ...], silence_ms: int
) -> None:
    h = Harness(StopsAtAPause(), turn=semantic(ScriptedTurnModel(0.3)))
    parts = [silence(0.5), tone(2.0)]
    for pause in pauses:
        parts += [silence(pause), tone(1.5)]
    events = await h.run(
        h.lockstep(chunks(pcm16(np.concatenate([*parts, silence(3.0)])), 640)),
        semantic=True,
        interim=False,
        silence_ms=silence_ms,
    )
    (final,) = results(events, final=True)
    assert len(final.text.split()) == 8 + 6 * len(pauses)  # a word per 0.25 s of tone


async def test_a_rest_read_on_is_decoded_once_per_turn() -> None:
    """A halting speaker: nine phrases, eight held pauses, a decode that stops at each. An
    early final is decoded at every pause, and each read every rest again: 84 decodes for
    one 14 s final (the third diff reviewer). A rest that stopped at a later pause is
    kept for the turn's next final decodes."""
    h = Harness(StopsAtAPause(), turn=semantic(ScriptedTurnModel(0.3)))
    phrases = [np.concatenate([tone(1.0), silence(0.6)]) for _ in range(9)]
    events = await h.run(
        h.lockstep(chunks(pcm16(np.concatenate([silence(0.5), *phrases, silence(2.4)])), 640)),
        semantic=True,
        interim=False,
    )
    (final,) = results(events, final=True)
    assert len(final.text.split()) == 36
    assert final_decodes(h) <= 40


async def test_a_rest_whose_audio_ended_before_a_later_held_pause_is_not_kept() -> None:
    """An early final's rest (its audio ended in the short pause after phrase B) waited
    for the engine while the speaker said C and held a pause: it counted as a rest that
    stopped at that pause, was kept, and the turn's final joined it, C in no final (the
    fourth diff reviewer's case)."""
    release = threading.Event()

    class SlowFirstRest(StopsAtAPause):
        held = False

        def transcribe(self, requests: Sequence[DecodeRequest]) -> list[Hypothesis]:
            if not self.held and any(r.kind is DecodeKind.FINAL and r.prompt for r in requests):
                self.held = True
                release.wait(30)
            return super().transcribe(requests)

    def loud_is_speech(audio: np.ndarray, lead_in: np.ndarray) -> bool:
        return bool((np.abs(audio) > 1e-3).any())

    h = Harness(SlowFirstRest(), turn=semantic(ScriptedTurnModel(0.3)), speech_check=loud_is_speech)
    head = np.concatenate([silence(0.5), tone(2.0), silence(0.7), tone(1.0)])  # A, B
    mid = np.concatenate([silence(0.15), tone(0.25), silence(0.55), tone(0.04)])  # C
    tail = np.concatenate([tone(0.96), silence(3.0)])  # D

    async def source() -> AsyncIterator[object]:
        async for c in h.lockstep(chunks(pcm16(head), 640)):
            yield c
        async for c in chunks(pcm16(mid), 640):
            yield c
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        release.set()
        await asyncio.sleep(0.3)
        async for c in h.lockstep(chunks(pcm16(tail), 640)):
            yield c

    events = await h.run(source(), semantic=True, interim=False, word_timestamps=True)
    (final,) = results(events, final=True)
    assert len(final.text.split()) == 8 + 5 + 4  # A, B with C (its first word), D
    assert any(w.start_s == pytest.approx(4.36, abs=0.05) for w in final.words)  # C


async def test_a_length_limit_on_the_frame_speech_resumed_still_reads_on() -> None:
    """The 15 s limit fell on the very frame speech resumed after a held pause: the split
    went first, and the resumption was recorded nowhere (the diff reviewer: 11.35 s)."""
    for first_s in (11.35, 11.36):
        h = Harness(StopsAtAPause(), turn=semantic(ScriptedTurnModel(0.3)))
        audio = np.concatenate(
            [silence(0.5), tone(first_s), silence(0.25), tone(2.35), silence(0.7), tone(2.3)]
        )
        events = await h.run(
            h.lockstep(chunks(pcm16(np.concatenate([audio, silence(3.0)])), 640)),
            semantic=True,
            interim=False,
        )
        heard = sum(len(f.text.split()) for f in results(events, final=True))
        assert heard >= round((first_s + 2.35 + 2.3) / 0.25) - 1, first_s


def test_a_rest_read_on_is_joined_as_its_language_is_written() -> None:
    from asr_server.session.finals import joined

    assert joined("It was around it.", "Stuff it into you.", "en") == (
        "It was around it. Stuff it into you."
    )
    assert (
        joined("我们今天去公园玩。", "我们今天去公。", "zh") == "我们今天去公园玩。我们今天去公。"
    )


async def test_a_held_pause_after_a_split_at_the_length_limit_still_reads_on() -> None:
    """The 15 s limit cut the utterance before speech resumed after a held pause: the
    rest, a new utterance, did not know of the pause, and its final stopped at it (the
    diff reviewer's case)."""
    h = Harness(StopsAtAPause(), turn=semantic(ScriptedTurnModel(0.3)))
    audio = np.concatenate(
        [silence(0.5), tone(10.0), silence(0.25), tone(2.35), silence(0.7), tone(2.3)]
    )
    events = await h.run(
        h.lockstep(chunks(pcm16(np.concatenate([audio, silence(3.0)])), 640)),
        semantic=True,
        interim=False,
    )
    heard = sum(len(f.text.split()) for f in results(events, final=True))
    assert heard >= round((10.0 + 2.35 + 2.3) / 0.25) - 1  # a word per 0.25 s of tone
    assert h.metrics.held_pauses_read_on._value.get() == 1


@pytest.mark.parametrize("config", [{"silence_ms": 3000, "semantic": 0.1}, {"silence_ms": 500}])
async def test_a_long_pause_splits_only_silence_streams_that_hold_it(
    config: dict[str, object],
) -> None:
    """SEMANTIC holds such a pause open on purpose; at the default silence it ends the
    utterance (two finals, each with its SPEECH_ENDED)."""
    audio = np.concatenate([silence(0.5), tone(2.0), silence(1.0), tone(2.0), silence(4.0)])
    config = dict(config)
    probability = config.pop("semantic", None)
    turn = semantic(ScriptedTurnModel(probability)) if probability is not None else None  # type: ignore[arg-type]
    h = Harness(turn=turn, split_at_pause_after_s=6.0)
    events = await h.run(h.lockstep(chunks(pcm16(audio), 640)), semantic=turn is not None, **config)
    assert h.metrics.pause_splits._value.get() == 0
    if turn is not None:
        assert len(results(events, final=True)) == 1


@pytest.mark.parametrize(
    ("speech_s", "pause_s", "setting", "config"),
    [
        (4.0, 0.35, 6.0, {}),  # too short to split
        (7.0, 0.35, 0.0, {}),  # splitting off
        (7.0, 0.25, 6.0, {}),  # a pause too short: speech may begin before it is voiced
        # SEMANTIC with an eager result at the pause (the turn model said it may be over):
        # that is withdrawn when speech resumes, and the utterance goes on whole
        (7.0, 0.35, 6.0, {"semantic": 0.6, "eager_finals": True}),
        # SEMANTIC, a pause as long as silence endpointing's: the turn model holds it open
        # on purpose (a speaker thinking mid-sentence), and the sentence stays whole
        (7.0, 0.6, 6.0, {"semantic": 0.1}),
    ],
)
async def test_an_utterance_is_split_at_a_short_pause_only_when_long(
    speech_s: float, pause_s: float, setting: float, config: dict[str, object]
) -> None:
    audio = np.concatenate(
        [silence(0.5), tone(speech_s), silence(pause_s), tone(2.0), silence(2.5)]
    )
    config = dict(config)
    probability = config.pop("semantic", None)
    turn = semantic(ScriptedTurnModel(probability)) if probability is not None else None  # type: ignore[arg-type]
    h = Harness(turn=turn, split_at_pause_after_s=setting)
    events = await h.run(h.lockstep(chunks(pcm16(audio), 640)), semantic=turn is not None, **config)
    finals = results(events, final=True)
    assert len(finals) == 1
    assert finals[0].end_s > speech_s + 2.5
    assert h.metrics.pause_splits._value.get() == 0
    if config.get("eager_finals"):
        assert [e for e in events if isinstance(e, SpeechResumed)]


async def test_a_long_semantic_utterance_is_split_with_a_final_that_heard_the_whole_pad() -> None:
    # the turn model is unsure at every pause (a reader's 0.35 s between sentences): the
    # utterance would run to the length limit. Its final decoded 60 ms into the pause
    # hears too little of it for a cut inside speech; the one decoded at 200 ms is used
    audio = np.concatenate([silence(0.5), tone(7.0), silence(0.35), tone(2.0), silence(2.5)])
    model = ScriptedTurnModel(0.1)
    h = Harness(turn=semantic(model), split_at_pause_after_s=6.0)
    events = await h.run(h.lockstep(chunks(pcm16(audio), 640)), semantic=True)
    finals = results(events, final=True)
    assert len(finals) == 2
    assert finals[0].end_s == pytest.approx(7.7, abs=0.05)  # 200 ms into the pause
    assert finals[1].start_s == pytest.approx(finals[0].end_s, abs=0.01)
    assert abs(sum(len(f.text.split()) for f in finals) - 36) <= 1
    first, second = finals[0].utterance_id, finals[1].utterance_id
    assert speech_events(events) == [(True, first), (False, second)]
    # the turn ended once, after the second part
    turns = [e for e in events if isinstance(e, EndOfTurn)]
    assert [t.utterance_id for t in turns] == [second]
    assert h.metrics.pause_splits._value.get() == 1
    # at the second part's pause the model heard the first part too (the turn so far;
    # its window is the last 8 s), not the second part's 2.3 s alone
    assert model.heard[-1] == pytest.approx(8.0)


@pytest.mark.parametrize("interim", [True, False])
async def test_long_speech_is_split_and_nothing_is_lost(interim: bool) -> None:
    audio = np.concatenate([tone(40.0), silence(1.0)])
    events = await Harness().run(chunks(pcm16(audio)), interim=interim, max_utterance_ms=10_000)
    finals = results(events, final=True)
    assert len(finals) >= 4
    assert all(f.end_s - f.start_s <= 10.05 for f in finals)
    # utterances tile the audio: each starts where the previous ended
    for a, b in zip(finals, finals[1:], strict=False):
        assert b.start_s == pytest.approx(a.end_s, abs=0.01)
    words = sum(len(f.text.split()) for f in finals)
    assert abs(words - 160) <= len(finals)  # 40 s at 0.25 s per word, ±1 per cut


async def test_stereo_channels_are_recognized_separately() -> None:
    left = np.concatenate([tone(1.0), silence(2.0)])
    right = np.concatenate([silence(0.5), tone(2.0), silence(0.5)])
    stereo = np.stack([left, right], axis=1)
    events = await Harness().run(chunks(pcm16(stereo), 6400), channels=2, interim=False)
    by_channel = {f.channel: f.text for f in results(events, final=True)}
    assert by_channel == {0: "w0 w1 w2 w3", 1: " ".join(f"w{i}" for i in range(8))}


async def test_engine_failure_surfaces() -> None:
    h = Harness(FakeEngine(fail_with=RuntimeError("model exploded")))
    with pytest.raises(EngineError):
        await h.run(chunks(pcm16(np.concatenate([tone(1.0), silence(1.0)]))), interim=False)


async def test_odd_byte_count_is_invalid_argument() -> None:
    with pytest.raises(AsrError) as err:
        await Harness().run(chunks(b"\x00" * 3201, 3201))
    assert err.value.status is Status.INVALID_ARGUMENT
    assert "3201 bytes" in err.value.message


async def test_oversized_message_is_invalid_argument() -> None:
    with pytest.raises(AsrError) as err:
        await Harness(max_audio_message_bytes=4096).run(chunks(bytes(8192), 8192))
    assert err.value.status is Status.INVALID_ARGUMENT


async def test_stream_longer_than_the_limit_is_out_of_range() -> None:
    with pytest.raises(AsrError) as err:
        await Harness(max_stream_duration_s=2.0).run(chunks(pcm16(silence(3.0))))
    assert err.value.status is Status.OUT_OF_RANGE


async def test_backpressure_stops_reading_and_loses_nothing() -> None:
    gate = threading.Event()
    engine = FakeEngine(gate=gate)
    entered_event = entered(engine)
    h = Harness(engine, max_buffered_audio_s=2.0)
    # speech, then a pause (its final blocks on the stalled engine), then 30 s more
    audio = np.concatenate([tone(1.0), silence(1.0), tone(30.0), silence(1.0)])
    data = pcm16(audio)
    pulled: list[int] = []
    run = asyncio.create_task(h.run(chunks(data, pulled=pulled), interim=False))
    await entered_event.wait()  # the first final has reached the (stalled) engine
    for _ in range(200):  # give the reader every chance to run ahead
        await asyncio.sleep(0)
    pulled_s = pulled[-1] / 2 / SR
    # the processor stopped at ~2 s (the pause); the reader may run ahead by the 2 s cap
    # plus one chunk, never through the remaining 30 s
    assert pulled_s <= 2.0 + 2.0 + 0.2
    buffered = h.metrics.buffered_audio._value.get()
    assert buffered <= 2.0 + 0.1
    gate.set()
    events = await run
    finals = results(events, final=True)
    assert sum(len(f.text.split()) for f in finals) == pytest.approx(4 + 120, abs=len(finals))
    assert h.progress[-1].audio_processed_s == pytest.approx(len(data) / 2 / SR, abs=0.05)
    assert h.metrics.buffered_audio._value.get() == pytest.approx(0.0, abs=1e-6)


async def test_previous_finals_become_context_when_enabled() -> None:
    audio = np.concatenate([tone(1.0), silence(1.0), tone(1.0), silence(1.0)])
    h = Harness(context_chars=200)
    await h.run(chunks(pcm16(audio)), interim=False)
    prompts = [c[0].prompt for c in h.engine.calls]
    assert prompts == ["", "w0 w1 w2 w3"]


def assert_settled_never_runs_ahead(h: Harness) -> None:
    """Progress.settled_s is a promise: no final sent later starts before it."""
    sent = list(zip(h.events, h.progress, strict=True))
    for i, (_, progress) in enumerate(sent):
        for later, _ in sent[i + 1 :]:
            if isinstance(later, RecognitionResult) and later.is_final:
                assert later.start_s >= progress.settled_s - 1e-9, (progress, later)


@pytest.mark.parametrize("channels", [1, 2])
async def test_settled_time_never_passes_an_unfinished_utterance(channels: int) -> None:
    # short utterances, pauses, and a 25 s utterance split twice at the 10 s limit: after a
    # split the rest goes on under the next id with no SPEECH_STARTED, and must stay unsettled
    mono = np.concatenate(
        [silence(1.0), tone(1.5), silence(3.0), tone(25.0), silence(2.0), tone(0.6), silence(4.0)]
    )
    audio = np.stack([mono, np.roll(mono, 8000)], axis=1)[:, :channels].reshape(-1)
    h = Harness()
    events = await h.run(
        chunks(pcm16(audio), 3200 * channels), channels=channels, max_utterance_ms=10_000
    )
    finals = results(events, final=True)
    assert len(finals) >= 5 * channels
    assert_settled_never_runs_ahead(h)
    settled = [p.settled_s for p in h.progress]
    # it moves on: in the pauses it comes within the pre-roll window of what was processed,
    # and the last response (all audio accounted for) settles everything
    lead = [p.audio_processed_s - p.settled_s for p in h.progress if p.audio_processed_s > 2.5]
    assert min(lead) < 0.8, lead
    assert settled[-1] == pytest.approx(len(mono) / SR)
    # the long utterance (speech from 5.5 s, 0.3 s pre-roll) is cut at 15.2 s and 25.2 s:
    # while its second part is open, nothing past that part's start is settled
    during = [p.settled_s for p in h.progress if 16 < p.audio_processed_s < 25]
    assert during and 5.1 < min(during) and max(during) < 15.3, during


@pytest.mark.parametrize("max_utterance_ms", [15_000, 2_000])
async def test_settled_time_never_goes_back_at_a_finalize(max_utterance_ms: int) -> None:
    """The acknowledgement of a FINALIZE carried the settled time from before its
    utterance began (0 after a chain of length-limit splits): a client that trusts each
    value would be told to keep audio it had been allowed to drop."""
    speech = pcm16(np.concatenate([silence(1.0), tone(0.8 if max_utterance_ms > 2000 else 4.6)]))

    async def source() -> AsyncIterator[object]:
        async for c in chunks(speech):
            yield c
        yield Finalize()
        async for c in chunks(pcm16(silence(1.0))):
            yield c

    h = Harness()
    events = await h.run(h.lockstep(source()), max_utterance_ms=max_utterance_ms)
    assert any(isinstance(e, Finalized) for e in events)
    settled = [p.settled_s for p in h.progress]
    names = [type(e).__name__ for e in events]
    assert settled == sorted(settled), list(zip(names, settled, strict=True))
    assert_settled_never_runs_ahead(h)


class _TimesEveryPartialWordAtZero(FakeEngine):
    """Its partials time every word at 0.0 s, as tiny.en's aligner did for speech after a
    long stretch of music the voice detector took for speech."""

    def _hear(self, req: DecodeRequest) -> Hypothesis:
        hyp = super()._hear(req)
        if req.kind is DecodeKind.PARTIAL and hyp.words:
            zero = [WordTiming(w.word, 0.0, 0.0, w.probability) for w in hyp.words]
            return dataclasses.replace(hyp, words=zero)
        return hyp


class _PartialsAgreeOnTheFirstWordOnly(FakeEngine):
    """Its partials change every word but the first from one answer to the next, so
    only that word is ever committed (real speech whose partials keep revising)."""

    def _hear(self, req: DecodeRequest) -> Hypothesis:
        hyp = super()._hear(req)
        if req.kind is not DecodeKind.PARTIAL or len(hyp.words) < 2:
            return hyp
        self.revisions = getattr(self, "revisions", 0) + 1
        words = [hyp.words[0]] + [
            WordTiming(f"r{self.revisions}x{i}", w.start_s, w.end_s, w.probability)
            for i, w in enumerate(hyp.words[1:])
        ]
        return dataclasses.replace(hyp, text=" ".join(w.word for w in words), words=words)


async def test_a_split_after_under_a_second_of_committed_words_loses_none() -> None:
    """The cut after the committed words was pushed to at least 1 s into the utterance,
    but the final was their text alone: the speech between their end and that second was
    in no final (a reviewer saw "gives his sitter" come out as "Give")."""
    audio = np.concatenate([silence(0.5), tone(4.0), silence(1.5)])
    h = Harness(_PartialsAgreeOnTheFirstWordOnly(), commit_partials=True)
    events = await h.run(h.lockstep(chunks(pcm16(audio))), max_utterance_ms=3_000)
    finals = results(events, final=True)
    assert len(finals) >= 2, finals  # split at the limit
    assert finals[0].text.split()[0] == "w0"  # the committed word, kept
    # the tone's 16 words (0.25 s each), every one in some final (a part's words are named
    # from w0 by the fake: counted, not compared; a cut inside a word may count it twice)
    assert 16 <= sum(len(f.text.split()) for f in finals) <= 16 + len(finals), finals


async def test_a_length_limit_split_does_not_trust_committed_words_timed_at_zero() -> None:
    """Committed words whose timing cannot be right (all at 0.0 s) are not cut after: that
    sent them as a final of the utterance's first second, and again in the next one."""
    audio = np.concatenate([silence(0.5), tone(12.0), silence(1.5)])
    h = Harness(_TimesEveryPartialWordAtZero(), commit_partials=True)
    events = await h.run(h.lockstep(chunks(pcm16(audio))), max_utterance_ms=10_000)
    finals = results(events, final=True)
    assert len(finals) >= 2 and finals[0].end_s > 5.0, finals
    # each of the tone's 48 words once (the fake names a part's words from w0)
    assert sum(len(f.text.split()) for f in finals) == pytest.approx(48, abs=len(finals))


@pytest.mark.parametrize("prefix_forcing", [True, False])
async def test_an_engine_without_prefix_forcing_gets_nothing_committed(
    prefix_forcing: bool,
) -> None:
    """The session adapts to what the engine declares: a final could not be made to start
    with committed words, so none are committed and every partial stays unstable."""
    engine = FakeEngine(capabilities=EngineCapabilities(prefix_forcing=prefix_forcing))
    h = Harness(engine, commit_partials=True)
    audio = np.concatenate([silence(0.5), tone(3.0), silence(1.0)])
    events = await h.run(h.lockstep(chunks(pcm16(audio))))
    partials = results(events, final=False)
    assert partials and results(events, final=True)[0].text == " ".join(f"w{i}" for i in range(12))
    committed = [p.stable_text for p in partials if p.stable_text]
    assert bool(committed) == prefix_forcing
    prefixes = [r.prefix for call in engine.calls for r in call]
    assert any(prefixes) == prefix_forcing  # nothing is asked to be kept verbatim


async def an_eager_semantic_turn_with_a_pause(
    probability: float, **config: Any
) -> tuple[Harness, list[object]]:
    """A 0.35 s pause inside the turn, then the end of the turn; the model answers
    ``probability`` at every ask."""
    audio = np.concatenate([silence(0.5), tone(2.0), silence(0.35), tone(1.0), silence(2.5)])
    h = Harness(turn=semantic(ScriptedTurnModel(probability)))
    events = await h.run(
        h.lockstep(chunks(pcm16(audio), 480)),
        semantic=True,
        eager_finals=True,
        max_silence_ms=1500,
        **config,
    )
    return h, events


async def test_a_semantic_stream_whose_model_is_never_asked_sends_no_eager_results() -> None:
    # turn_threshold 1: no answer could end the turn, so the model is not asked, and no
    # first answer can reach the eager threshold (the proto's condition for one)
    _, events = await an_eager_semantic_turn_with_a_pause(0.9, turn_threshold=1.0)
    assert not [e for e in results(events) if e.eager]
    assert not [e for e in events if isinstance(e, SpeechResumed)]
    (final,) = results(events, final=True)
    assert final.text == " ".join(f"w{i}" for i in range(12))


@pytest.mark.parametrize("probability", [0.8, 0.3])
async def test_semantic_eager_results_wait_for_a_first_answer_that_the_turn_may_be_over(
    probability: float,
) -> None:
    h, events = await an_eager_semantic_turn_with_a_pause(probability)
    eager = [e for e in results(events) if e.eager]
    resumed = [e for e in events if isinstance(e, SpeechResumed)]
    (final,) = results(events, final=True)
    assert final.text == " ".join(f"w{i}" for i in range(12))
    if probability < 0.5:
        # unsure at every first answer: nothing early, though a final was decoded at each
        # pause (60 ms in)
        assert eager == [] and resumed == []
        assert sum(r.kind is DecodeKind.FINAL for c in h.engine.calls for r in c) == 2
        return
    # possibly over at both pauses: an eager result at each; the first is withdrawn, the
    # second becomes the final (the second ask, at 600 ms, trusts 0.8)
    first, second = eager
    assert len(resumed) == 1
    assert events.index(first) < events.index(resumed[0]) < events.index(second)
    assert events.index(second) < events.index(final)
    assert first.text == " ".join(f"w{i}" for i in range(8))
    assert second.text == final.text
    # each says how sure the model was at its pause (a client may weigh it)
    assert first.turn_probability == second.turn_probability == pytest.approx(0.8)


def test_an_utterances_audio_since_an_offset_is_what_a_reader_has_not_had() -> None:
    audio = UtteranceAudio(48_000, capacity=4)
    audio.append(np.arange(3, dtype=np.float32))
    audio.append(np.arange(3, 10, dtype=np.float32))  # grows past its capacity
    assert audio.since(0).tolist() == list(range(10))
    assert audio.since(7).tolist() == [7, 8, 9]
    assert audio.since(10).size == 0 and audio.since(99).size == 0
    tail = audio.since(8)
    tail[:] = -1  # a copy: the utterance's audio is not touched
    assert audio.since(8).tolist() == [8, 9]


class HearsNoiseAsWelsh(FakeEngine):
    """A multilingual stand-in whose finals carry detection scores: a quiet noise (which
    it rejects, as Whisper does non-speech) sounds Welsh to it, a loud tone Spanish."""

    is_multilingual = True

    def _hear(self, req: DecodeRequest) -> Hypothesis:
        hyp = super()._hear(req)
        noise = float(np.abs(req.audio).max()) < 0.1
        if noise:
            hyp = Hypothesis("", "cy", rejected=True)
        scores = (("cy", 0.9), ("es", 0.1)) if noise else (("es", 0.95), ("cy", 0.05))
        return dataclasses.replace(
            hyp,
            language=req.language or scores[0][0],
            language_scores=scores if req.kind is DecodeKind.FINAL else (),
        )


class SpanishThenGerman(FakeEngine):
    """Detection hears a loud tone as Spanish and a quieter one as German, sure of both;
    its words are marked with the language they were decoded in."""

    is_multilingual = True

    def _hear(self, req: DecodeRequest) -> Hypothesis:
        hyp = super()._hear(req)
        german = float(np.abs(req.audio).max()) < 0.2
        scores = (("de", 0.99), ("es", 0.01)) if german else (("es", 0.99), ("de", 0.01))
        language = req.language or scores[0][0]
        return dataclasses.replace(
            hyp,
            text=" ".join(f"{language}-{w}" for w in hyp.text.split()),
            language=language,
            language_scores=scores if req.kind is DecodeKind.FINAL else (),
        )


async def test_an_eager_result_is_not_sent_in_the_language_its_final_leaves() -> None:
    # Spanish, kept; then 2.5 s of German, sure enough to switch at its final. The pause's
    # early decode is in Spanish: sent as an eager result, its final came in German
    engine = SpanishThenGerman(
        capabilities=EngineCapabilities(languages=None, language_detection=True)
    )
    audio = [silence(0.3), tone(2.5, amp=0.5), silence(1.0), tone(2.5, amp=0.1), silence(1.0)]
    h = Harness(engine)
    events = await h.run(
        h.lockstep(chunks(pcm16(np.concatenate(audio)))), interim=False, eager_finals=True
    )
    finals = results(events, final=True)
    assert [f.language for f in finals] == ["es", "de"]
    assert finals[1].text.startswith("de-w0")
    for eager in (e for e in results(events) if e.eager):
        (final,) = [f for f in finals if f.utterance_id == eager.utterance_id]
        assert eager.text == final.text


async def test_a_noise_without_words_does_not_choose_the_streams_language() -> None:
    # 3 s of line noise the detector took for speech, detected at 0.9 as Welsh: that is
    # no speech to keep a language on; the Spanish speech after it is decoded as Spanish
    engine = HearsNoiseAsWelsh(
        capabilities=EngineCapabilities(languages=None, language_detection=True)
    )
    audio = np.concatenate([silence(0.3), tone(3.0, amp=0.05), silence(1.0), tone(1.9)])
    h = Harness(engine)
    events = await h.run(h.lockstep(chunks(pcm16(np.concatenate([audio, silence(1.0)])))))
    (final,) = results(events, final=True)
    assert final.language == "es"
    assert all(r.language == "es" for r in results(events, final=False))
    finals = [r for call in engine.calls for r in call if r.kind is DecodeKind.FINAL]
    assert all(r.language != "cy" for r in finals)  # nothing was decoded again in Welsh


async def test_a_finalize_mid_speech_decodes_every_sample_sent_before_it() -> None:
    # a push-to-talk release rarely falls on a voice-detector frame: the samples short of
    # a whole frame are the final's too, as the acknowledgement says
    spoken = pcm16(np.concatenate([silence(0.3), tone(1.2)]))[: 2 * 21_000]  # 1.3125 s

    async def source() -> AsyncIterator[object]:
        async for c in chunks(spoken, 2000):
            yield c
        yield Finalize()

    h = Harness()
    events = await h.run(source(), interim=False)
    (final,) = results(events, final=True)
    (ack,) = [e for e in events if isinstance(e, Finalized)]
    assert ack.offset_s == pytest.approx(21_000 / SR)
    assert final.end_s == pytest.approx(21_000 / SR)
    (decode,) = [r for call in h.engine.calls for r in call if r.kind is DecodeKind.FINAL]
    # every sample sent, then the pause a final has (0.2 s) as silence
    heard = decode.audio[: 21_000 - round(final.start_s * SR)]
    assert final.start_s * SR + decode.audio.size == pytest.approx(21_000 + 0.2 * SR, abs=1)
    assert heard[-1] != 0.0 and not decode.audio[heard.size :].any()


async def test_the_length_limit_in_a_pause_cuts_at_the_pauses_final() -> None:
    # speech to 2.7 s, the pause's final decoded 200 ms in, the 3 s limit 300 ms in:
    # that final is the first part's (no second decode), and the rest of the pause is
    # no utterance to decode or to end before it began
    h = Harness()
    audio = np.concatenate([silence(0.3), tone(2.4), silence(1.0), tone(1.0), silence(1.0)])
    events = await h.run(h.lockstep(chunks(pcm16(audio))), interim=False, max_utterance_ms=3000)
    finals = results(events, final=True)
    assert [f.text for f in finals] == [" ".join(f"w{i}" for i in range(10)), "w0 w1 w2 w3"]
    assert finals[0].end_s == pytest.approx(2.9, abs=0.02)  # speech end + the 200 ms pad
    decodes = [r for call in h.engine.calls for r in call if r.kind is DecodeKind.FINAL]
    assert len(decodes) == 2
    ends = [e for e in events if isinstance(e, SpeechBoundary) and not e.started]
    assert ends[0].utterance_id == 1 and ends[0].offset_s == pytest.approx(2.9, abs=0.02)
    assert [e.utterance_id for e in events if isinstance(e, NoWords)] == [1]


async def test_eager_results_wait_for_the_promised_pause_after_a_client_finalize() -> None:
    """A client's finalize makes the channel decode finals 60 ms into each pause, for
    speed; the eager result still waits for the ~200 ms pause the proto promises. Sent
    60 ms in, it came at a sentence's short pauses (0.15 s here), only to be withdrawn."""
    h = Harness()
    short = [silence(0.15), tone(0.5), silence(0.25)]
    events = await a_turn_ended_by_the_client(h, short, eager_finals=True)
    second = [e for e in events if getattr(e, "utterance_id", None) == 1]
    eager = [e for e in second if isinstance(e, RecognitionResult) and e.eager]
    assert not [e for e in second if isinstance(e, SpeechResumed)], second
    # one eager result, in the 0.25 s pause; its audio ends with the second tone
    assert len(eager) == 1, second
    assert eager[0].end_s == pytest.approx(3.3 + 2.0 + 0.15 + 0.5 + 0.06, abs=0.035)


async def test_a_client_that_stops_reading_holds_no_pile_of_partials() -> None:
    """Results that cannot go out (a client that stopped reading) stopped nothing but the
    stream's writer: every half second of speech started another partial, which decoded
    and waited to be sent with its copy of the utterance's audio, hundreds for one stream
    of 8 channels. Now a partial waiting to be sent holds back the next."""
    h = Harness(result_queue_size=8)
    never = asyncio.Event()

    async def send(event: object, progress: Progress) -> None:
        await never.wait()  # the client reads nothing

    stereo = pcm16(np.stack([tone(24.0), tone(24.0)], axis=1))  # two channels, no pause
    pulled: list[int] = []

    async def at_5x_real_time() -> AsyncIterator[object]:  # (not behind: partials are asked)
        async for chunk in chunks(stereo, 6400, pulled=pulled):
            yield chunk
            await asyncio.sleep(0.02)

    run = asyncio.create_task(
        h.run(at_5x_real_time(), channels=2, max_utterance_ms=28_000, send=send)
    )
    try:
        await eventually(lambda: h.scheduler is not None)
        assert h.session is not None and h.scheduler is not None
        for _ in range(300):  # until the audio is no longer read: it is all in, or held back
            before = len(pulled)
            await asyncio.sleep(0.05)
            if len(pulled) == before and h.scheduler.idle:
                break
        heard_s = len(pulled) * 0.1
        assert heard_s > 8, heard_s  # enough speech for a pile: a partial every 0.5 s each
        partials = len(h.session._partial_tasks)
        assert partials <= 4, (partials, heard_s)
    finally:
        run.cancel()  # (the harness closes its scheduler)
        await asyncio.gather(run, return_exceptions=True)
