"""The load generator's calls and report: layout, telephone band, G.711 payload, figures."""

from __future__ import annotations

import time

import numpy as np
import pytest

from asr_api.v1 import asr_pb2
from asr_client.load.calls import Call, Clip, build_call, clips_from_manifest, telephone_band
from asr_client.load.report import percentiles, render_text, summarize
from asr_client.load.runner import FinalResult, LoadOptions, StreamOutcome, _Stream
from asr_server.audio.g711 import mulaw_decode


def clips(rate: int = 8000) -> list[Clip]:
    rng = np.random.default_rng(0)
    return [
        Clip(f"c{k}", (rng.normal(0, 3000, int(rate * (1 + k))).astype(np.int16)), f"words {k}")
        for k in range(3)
    ]


def test_stereo_call_alternates_turns_with_pauses_and_silence_between() -> None:
    rate = 8000
    call = build_call(
        7,
        clips(rate),
        rng=np.random.default_rng(1),
        duration_s=20,
        channels=2,
        sample_rate_hz=rate,
        encoding="MULAW",
        pause_s=(0.5, 1.0),
        lead_in_s=1.0,
    )
    assert call.channels == 2 and call.sample_rate_hz == rate
    assert call.duration_s >= 20
    assert call.turns[0].start_s == pytest.approx(1.0)
    assert [t.channel for t in call.turns] == [k % 2 for k in range(len(call.turns))]
    for a, b in zip(call.turns, call.turns[1:], strict=False):
        assert 0.5 <= b.start_s - a.end_s <= 1.0 + 1 / rate
    # each channel carries only its own turns: silent while the other speaks
    for turn in call.turns:
        lo, hi = round(turn.start_s * rate), round(turn.end_s * rate)
        assert np.any(call.frames[lo:hi, turn.channel])
        assert not np.any(call.frames[lo:hi, 1 - turn.channel])
    assert call.reference(0) == " ".join(t.transcript for t in call.turns if t.channel == 0)
    assert call.has_references
    # the wire payload: one mu-law byte per sample, interleaved, decoding close to the PCM
    payload = call.payload()
    assert len(payload) == call.frames.size and call.bytes_per_frame == 2
    decoded = mulaw_decode(payload).reshape(-1, 2).astype(np.int32)
    assert np.max(np.abs(decoded - call.frames)) <= 32767 * 0.04


def test_silent_call_has_no_turns() -> None:
    call = build_call(
        0,
        clips(),
        rng=np.random.default_rng(1),
        duration_s=5,
        channels=1,
        sample_rate_hz=8000,
        encoding="LINEAR16",
        pause_s=(1, 2),
        silent=True,
    )
    assert call.turns == () and not np.any(call.frames) and call.duration_s == 5
    assert len(call.payload()) == 5 * 8000 * 2


def test_telephone_band_keeps_only_300_to_3400_hz_at_8k() -> None:
    rate = 16_000
    t = np.arange(rate) / rate
    x = 8000 * (np.sin(2 * np.pi * 100 * t) + np.sin(2 * np.pi * 1000 * t))
    x += 8000 * np.sin(2 * np.pi * 6000 * t)
    out = telephone_band(x.astype(np.int16), rate)
    assert out.dtype == np.int16 and out.size == 8000
    spectrum = np.abs(np.fft.rfft(out.astype(np.float64)))
    freqs = np.fft.rfftfreq(out.size, 1 / 8000)
    power = {f: spectrum[np.argmin(np.abs(freqs - f))] for f in (100, 1000)}
    assert power[100] < power[1000] * 0.01  # below the band: gone; 6 kHz cannot exist at 8k


def short_phone_call() -> Call:
    """A 4 s mono μ-law call, for the report's figures."""
    return build_call(
        0,
        clips(),
        rng=np.random.default_rng(2),
        duration_s=4,
        channels=1,
        sample_rate_hz=8000,
        encoding="MULAW",
        pause_s=(0.5, 0.5),
    )


def test_percentiles_and_summary() -> None:
    assert percentiles([]) == {"n": 0, "p50": None, "p95": None, "p99": None, "max": None}
    p = percentiles([float(i) for i in range(1, 101)])
    assert p["p50"] == pytest.approx(50.5) and p["max"] == 100
    call = short_phone_call()
    done = StreamOutcome(call, silent=False, status="OK", audio_sent_s=call.duration_s)
    done.audio_processed_s = call.duration_s
    done.finals = [FinalResult(0, t.start_s, t.end_s, t.transcript) for t in call.turns]
    done.final_latency_s = [0.5, 0.7]
    rejected = StreamOutcome(call, silent=False, status="RESOURCE_EXHAUSTED")
    summary = summarize([done, rejected], wall_s=5.0)
    assert summary["completed"] == 1 and summary["rejected"] == 1 and summary["failed"] == 0
    assert summary["wer"] == 0.0  # the rejected call is not scored
    assert summary["audio_unprocessed_s"] == 0.0
    assert summary["final_latency_s"]["p50"] == pytest.approx(0.6)
    # how many finals were timed (those that ended speech) is said, beside how many came
    assert summary["final_latency_s"]["n"] == 2
    text = render_text(summary, [])
    assert f"(2 of {len(done.finals)} finals ended speech)" in text
    # a stream that failed (its server gone for good) left what it sent and no server
    # processed: it read 0.0 s left unprocessed, whatever it lost
    failed = StreamOutcome(call, silent=False, status="UNAVAILABLE", audio_sent_s=4.0)
    failed.audio_processed_s = 1.0
    rejected.audio_sent_s = 0.2  # a chunk before the refusal reached it: not counted
    summary = summarize([done, failed, rejected], wall_s=5.0)
    assert summary["failed"] == 1
    assert summary["audio_unprocessed_s"] == 3.0


def test_finals_without_a_partial_are_counted_apart_from_first_partial_times() -> None:
    """Under load partials back off and a short utterance can end before its first one:
    the time to first partial covers only the utterances that had one, so the report
    says how many finals came without."""
    call = short_phone_call()
    outcome = StreamOutcome(call, silent=False, status="OK")
    stream = _Stream(outcome, LoadOptions())
    partial = asr_pb2.Result(text="hello", utterance_id=1, start_s=0.2, end_s=0.8)
    stream._result(partial, now=1.0)
    stream._speech_end.update({(0, 1): 1.5, (0, 2): 2.8})  # (their SPEECH_ENDED events)
    stream._result(asr_pb2.Result(is_final=True, text="hello there", utterance_id=1), 2.0)
    stream._result(asr_pb2.Result(is_final=True, text="bye", utterance_id=2, end_s=3.0), 4.0)
    assert len(outcome.first_partial_s) == 1 and len(outcome.final_latency_s) == 2
    assert outcome.finals_without_partial == 1
    summary = summarize([outcome], wall_s=5.0)
    assert summary["finals_without_partial"] == 1 and summary["finals"] == 2
    assert "(1 of 2 finals had none)" in render_text(summary, [])


def test_a_final_without_a_speech_end_has_no_endpointing_latency() -> None:
    """A final the server split at a pause comes with no SPEECH_ENDED, and its end_s is
    the pause's pad, 200 ms after the speech: measured from it, it read 200 ms early."""
    outcome = StreamOutcome(short_phone_call(), silent=False, status="OK")
    stream = _Stream(outcome, LoadOptions())
    stream._result(asr_pb2.Result(is_final=True, text="a split", utterance_id=1, end_s=6.7), 7.0)
    assert outcome.final_latency_s == [] and len(outcome.finals) == 1


async def test_a_final_the_end_of_the_call_made_has_no_endpointing_latency() -> None:
    """A call that ends inside an utterance (in speech, or 300 ms after its last word:
    less than the endpointing silence) gets its SPEECH_ENDED once all its audio is in,
    then a final with no silence waited for: it was timed, and pulled the latency
    figures down. Its offset is where the voice stopped; its progress tells."""
    call = short_phone_call()
    outcome = StreamOutcome(call, silent=False, status="OK")
    stream = _Stream(outcome, LoadOptions())

    def ended(utterance_id: int, offset_s: float, processed_s: float):  # type: ignore[no-untyped-def]
        event = asr_pb2.SpeechEvent(
            type=asr_pb2.SpeechEvent.SPEECH_ENDED, offset_s=offset_s, utterance_id=utterance_id
        )
        progress = asr_pb2.Progress(audio_processed_s=processed_s)
        return asr_pb2.StreamingRecognizeResponse(speech_event=event, progress=progress)

    def final(utterance_id: int):  # type: ignore[no-untyped-def]
        result = asr_pb2.Result(is_final=True, text="words", utterance_id=utterance_id)
        return asr_pb2.StreamingRecognizeResponse(result=result)

    end = call.duration_s

    class Replayed:
        def __aiter__(self):  # type: ignore[no-untyped-def]
            return self._responses()

        async def _responses(self):  # type: ignore[no-untyped-def]
            for response in (
                ended(1, end - 2.0, end - 1.5),  # endpointed: heard 0.5 s of silence
                final(1),
                ended(2, end - 0.3, end),  # the end of the call ended it
                final(2),
            ):
                yield response

    await stream._receive(Replayed())
    assert len(outcome.finals) == 2 and len(outcome.final_latency_s) == 1


class _TimedStream:
    """Records when each chunk was sent (monotonic) and how many frames it held."""

    def __init__(self, bytes_per_frame: int) -> None:
        self.bytes_per_frame = bytes_per_frame
        self.sent: list[tuple[float, int]] = []

    async def send_audio(self, chunk: bytes) -> None:
        self.sent.append((time.monotonic(), len(chunk) // self.bytes_per_frame))

    async def end(self) -> None:
        pass


async def test_a_chunk_is_sent_once_its_last_sample_exists() -> None:
    """A live source has a chunk only when its last sample exists; sending it earlier
    gave the server audio a chunk early and made every latency read a chunk low."""
    call = short_phone_call()
    speed = 20.0  # 100 ms chunks go out every 5 ms
    stream = _Stream(StreamOutcome(call, silent=False), LoadOptions(chunk_ms=100, speed=speed))
    fake = _TimedStream(call.bytes_per_frame)
    stream.t0 = time.monotonic()
    await stream._send(fake)
    assert sum(n for _, n in fake.sent) == len(call.frames)
    end = 0
    for sent_at, frames in fake.sent:
        end += frames
        due = stream.t0 + end / call.sample_rate_hz / speed
        assert sent_at >= due - 1e-3, (end, sent_at - stream.t0)
        # latencies are measured from the time the chunk holding an offset was sent
        assert stream.existed_at(end / call.sample_rate_hz) == pytest.approx(due)
    assert stream.outcome.audio_sent_s == pytest.approx(call.duration_s)


def test_manifest_rows_short_of_fields_are_read_as_empty(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A row with fewer fields than the header (a spreadsheet strips a trailing empty
    transcript or duration) used to crash with AttributeError/TypeError on None."""
    import soundfile

    rate = 16_000
    for name, seconds in (("a.wav", 1.0), ("b.wav", 1.5), ("long.wav", 31.0)):
        soundfile.write(tmp_path / name, np.zeros(int(rate * seconds), np.int16), rate)
    (tmp_path / "manifest.tsv").write_text(
        "id\tfile\tchannels\tlanguage\ttranscript\tduration_s\n"
        "a\ta.wav\t1\ten\n"  # no transcript (nor duration): skipped
        "b\tb.wav\t1\ten\thello there\n"  # no duration: measured
        "long\tlong.wav\t1\ten\ttoo long\n"  # no duration, and longer than a clip may be
    )
    clips = clips_from_manifest(tmp_path, language="en", call_rate=rate, telephone=False)
    assert [(c.id, c.transcript, len(c.samples)) for c in clips] == [
        ("b", "hello there", int(1.5 * rate))
    ]


def test_a_call_ends_soon_after_its_last_turn_whatever_the_pauses() -> None:
    """Past --duration only the last turn and a short pause are added: with --pause 20:30
    a 5 s call used to run 27-35 s, the last turn followed by a whole drawn pause."""
    rate = 8000
    for seed in range(5):
        call = build_call(
            0,
            clips(rate),
            rng=np.random.default_rng(seed),
            duration_s=5,
            channels=1,
            sample_rate_hz=rate,
            encoding="LINEAR16",
            pause_s=(20.0, 30.0),
        )
        (turn,) = call.turns
        assert call.duration_s == pytest.approx(max(5.0, turn.end_s + 1.5))


def test_a_talking_call_shorter_than_its_lead_in_still_talks() -> None:
    """With --duration under the lead-in (0-2 s), a "talking" call had no turn at all, and
    the report counted it as talking with 0 finals for 0 turns."""
    rate, rng = 8000, np.random.default_rng(0)
    call = build_call(0, clips(rate), rng=rng, duration_s=1.0, pause_s=(0.8, 3.0), lead_in_s=1.7,
                      channels=1, sample_rate_hz=rate, encoding="LINEAR16")  # fmt: skip
    (turn,) = call.turns
    assert turn.start_s == pytest.approx(1.7)
    assert turn.end_s < call.duration_s <= turn.end_s + 1.5
