"""Endpointing state machine with scripted detectors, and the real detectors on real audio."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from asr_client.speech_level import at_speech_level
from asr_server.session.channel import TRAILING_PAD_S
from asr_server.vad import endpointer
from asr_server.vad.base import VoiceDetector
from asr_server.vad.endpointer import (
    Endpointer,
    EndpointerConfig,
    SpeechAudio,
    SpeechEnded,
    SpeechStarted,
)
from asr_server.vad.silero import SileroVoiceDetector, silero_hears_speech
from asr_server.vad.tones import HIGH_GROUP_HZ, LOW_GROUP_HZ
from asr_server.vad.webrtc import WebRtcVoiceDetector
from tests.helpers import (
    corpus,
    first_channel,
    keyed_digits,
    read_pcm16,
    rustle_or_breaths,
)

FRAME = 480  # 30 ms


class ScriptedDetector:
    """Says 'speech' for frames whose script character is '#'."""

    frame_samples = FRAME
    blocking = False

    def __init__(self, script: str) -> None:
        self.script = script
        self.i = 0

    def speech_probability(self, frame: np.ndarray) -> float:
        voiced = self.i < len(self.script) and self.script[self.i] == "#"
        self.i += 1
        return 1.0 if voiced else 0.0

    def reset(self) -> None:
        self.i = 0


def run(script: str, config: EndpointerConfig, *, chunk_frames: int = 3):  # type: ignore[no-untyped-def]
    ep = Endpointer(ScriptedDetector(script), config)
    audio = np.full(len(script) * FRAME, 0.1, dtype=np.float32)  # audible: above the energy floor
    events = []
    step = chunk_frames * FRAME
    for i in range(0, audio.size, step):
        events += ep.feed(audio[i : i + step])
    events += ep.flush()
    return events


CONFIG = EndpointerConfig(start_ms=90, pre_roll_ms=150, silence_ms=300)


def utterances(
    audio: np.ndarray, detector: VoiceDetector, listen_until: int, *, chunk: int
) -> list[tuple[int, int]]:
    """(start, end) of each utterance an endpointer (the server's 120 ms start) reports
    in ``audio`` sent in ``chunk``-sample messages, listening only until ``listen_until``."""
    ep = Endpointer(detector, EndpointerConfig(start_ms=120))
    ep.listen_only_until(listen_until)
    events = [e for i in range(0, audio.size, chunk) for e in ep.feed(audio[i : i + chunk])]
    events += ep.flush()
    starts = [e.start_sample for e in events if isinstance(e, SpeechStarted)]
    ends = [e.end_sample for e in events if isinstance(e, SpeechEnded)]
    return list(zip(starts, ends, strict=True))


def test_speech_start_includes_pre_roll_and_end_after_silence() -> None:
    script = "." * 20 + "#" * 30 + "." * 20
    events = run(script, CONFIG)
    starts = [e for e in events if isinstance(e, SpeechStarted)]
    ends = [e for e in events if isinstance(e, SpeechEnded)]
    assert len(starts) == 1 and len(ends) == 1
    # voice begins at frame 20; the utterance starts the 150 ms pre-roll (5 frames) before
    assert starts[0].start_sample == (20 - 5) * FRAME
    assert ends[0].end_sample == 50 * FRAME  # end of the last voiced frame
    audio = [e for e in events if isinstance(e, SpeechAudio)]
    covered = sum(e.samples.size for e in audio)
    # contiguous audio from the start through the silence that confirmed the end
    assert audio[0].start_sample == starts[0].start_sample
    for a, b in zip(audio, audio[1:], strict=False):
        assert b.start_sample == a.start_sample + a.samples.size
    assert covered == 60 * FRAME - starts[0].start_sample


def test_speech_that_began_before_the_listening_point_is_reported_from_it() -> None:
    """A resumed stream: the client has finals up to frame 30 (its last was cut there, at
    the length limit or by a finalize). Speech that began before it is followed but not
    reported; going on past it, it is reported from the frame that holds the point."""
    script = "." * 10 + "#" * 40 + "." * 20
    ep = Endpointer(ScriptedDetector(script), CONFIG)
    ep.listen_only_until(30 * FRAME + 100)
    events = ep.feed(np.full(len(script) * FRAME, 0.1, dtype=np.float32)) + ep.flush()
    started, *audio, ended = events
    assert started == SpeechStarted(30 * FRAME, 30 * FRAME)  # (the frame holding it)
    assert isinstance(ended, SpeechEnded) and ended.end_sample == 50 * FRAME
    assert all(isinstance(a, SpeechAudio) for a in audio)
    assert audio[0].start_sample == 30 * FRAME
    assert sum(a.samples.size for a in audio) == 60 * FRAME - 30 * FRAME


def test_speech_detected_just_past_the_listening_point_is_reported_from_it() -> None:
    """The point inside the frames that make an utterance start (a finalize mid-speech,
    then a cut: the next frame began 10 ms before the point): reported at once, from the
    frame that holds the point. (It was taken for an utterance not reported, whose
    frames were let go: 0.15 s after the point was in no final, words changed.)"""
    script = "." * 10 + "#" * 40 + "." * 20
    ep = Endpointer(ScriptedDetector(script), CONFIG)
    ep.listen_only_until(10 * FRAME + 100)
    events = ep.feed(np.full(len(script) * FRAME, 0.1, dtype=np.float32)) + ep.flush()
    started, *audio, ended = events
    assert started == SpeechStarted(10 * FRAME, 10 * FRAME)
    assert audio[0].start_sample == 10 * FRAME
    assert sum(a.samples.size for a in audio) == 60 * FRAME - 10 * FRAME
    assert ended == SpeechEnded(50 * FRAME)


def test_speech_after_a_pause_past_the_listening_point_takes_only_a_pre_roll() -> None:
    """An utterance not reported, in a pause held open past the point (SEMANTIC's longest
    pause: on the uncut stream the turn model had ended it), then speech: reported with a
    new utterance's pre-roll, not from the point (its final took the whole pause, and
    "many times" read "many time")."""
    script = "." * 5 + "#" * 10 + "." * 40 + "#" * 10 + "." * 30
    config = dataclasses.replace(CONFIG, silence_ms=3000)
    detector = ScriptedDetector(script)
    detector.level_sensitive = True  # (as webrtcvad: its channel holds 2 s more, a look-back)
    ep = Endpointer(detector, config)
    ep.listen_only_until(20 * FRAME)
    events = ep.feed(np.full(len(script) * FRAME, 0.1, dtype=np.float32)) + ep.flush()
    (started,) = [e for e in events if isinstance(e, SpeechStarted)]
    pre_roll = round(config.pre_roll_ms * 16 / FRAME) + 4  # (and the 4-frame start window)
    assert started.start_sample == (56 - pre_roll) * FRAME


def test_an_utterance_before_the_listening_point_is_ended_but_not_reported() -> None:
    """Followed to its end by silence or by a finalize replayed there (as on the uncut
    stream, where it had its final), it says nothing; the next is reported as usual."""
    script = "." * 10 + "#" * 20 + "." * 20 + "#" * 20 + "." * 20
    for finalize_at in (None, 25):
        ep = Endpointer(ScriptedDetector(script), CONFIG)
        ep.listen_only_until(35 * FRAME)
        audio = np.full(len(script) * FRAME, 0.1, dtype=np.float32)
        if finalize_at is None:
            events = ep.feed(audio)
        else:
            events = ep.feed(audio[: finalize_at * FRAME + 200])
            assert ep.speaking and ep.force_end() == []  # (mid-speech)
            events += ep.feed(audio[finalize_at * FRAME + 200 :])
        events += ep.flush()
        (started,) = [e for e in events if isinstance(e, SpeechStarted)]
        assert started.onset_sample == 50 * FRAME
        assert [e for e in events if isinstance(e, SpeechEnded)] == [SpeechEnded(70 * FRAME)]


@pytest.mark.parametrize("last_final", [0, 1, 2])
def test_a_resumed_channel_s_utterances_are_those_of_the_uncut_stream(last_final: int) -> None:
    """Silero at a normal level: resumed after a final, the client replaying 9.6 s before
    it, every utterance after it begins and ends where it does uncut. (Followed with no end,
    the utterance before the point left its pause in the pre-roll, and the next began
    0.26 s earlier, into that pause: "Mr. Burke Foster's" then read "Mr. Burkett".)"""
    audio = first_channel(corpus()["libri_1272-128104-0004_8k_up16k"].path)

    def bounds(audio: np.ndarray, listen_until: int = 0) -> list[tuple[int, int]]:
        return utterances(audio, SileroVoiceDetector(), listen_until, chunk=512)

    uncut = bounds(audio)
    assert len(uncut) == 4
    final_until = uncut[last_final][1] + round(TRAILING_PAD_S * 16_000)
    replay = max(0, uncut[last_final][0] - int(9.6 * 16_000)) // 7680 * 7680  # (0.48 s)
    resumed = [(s + replay, e + replay) for s, e in bounds(audio[replay:], final_until - replay)]
    assert resumed == uncut[last_final + 1 :]


def test_short_pause_does_not_end_the_utterance() -> None:
    script = "." * 5 + "#" * 20 + "." * 5 + "#" * 20 + "." * 15
    events = run(script, CONFIG)
    assert sum(isinstance(e, SpeechStarted) for e in events) == 1
    assert sum(isinstance(e, SpeechEnded) for e in events) == 1


def test_isolated_clicks_do_not_start_speech() -> None:
    script = ".#..#...#....#." * 4
    assert not any(isinstance(e, SpeechStarted) for e in run(script, CONFIG))


def test_two_utterances() -> None:
    script = "#" * 15 + "." * 15 + "#" * 15 + "." * 15
    events = run(script, CONFIG)
    kinds = [type(e).__name__ for e in events if not isinstance(e, SpeechAudio)]
    assert kinds == ["SpeechStarted", "SpeechEnded", "SpeechStarted", "SpeechEnded"]


def test_flush_closes_open_speech() -> None:
    events = run("." * 3 + "#" * 10, CONFIG)
    assert isinstance(events[-1], SpeechEnded)
    assert events[-1].end_sample == 13 * FRAME


def test_force_end_then_speech_continues_as_new_utterance() -> None:
    ep = Endpointer(ScriptedDetector("#" * 40), CONFIG)
    loud = np.full(20 * FRAME, 0.1, dtype=np.float32)
    first = ep.feed(loud)
    assert any(isinstance(e, SpeechStarted) for e in first)
    forced = ep.force_end()
    assert forced == [SpeechEnded(20 * FRAME)]
    again = ep.feed(loud)
    assert any(isinstance(e, SpeechStarted) for e in again)


def test_force_end_mid_speech_keeps_the_samples_short_of_a_frame() -> None:
    # a push-to-talk release: the last 200 samples (less than a frame) are the
    # utterance's, and the final ends where the client's audio did
    ep = Endpointer(ScriptedDetector("#" * 40), CONFIG)
    ep.feed(np.full(20 * FRAME + 200, 0.1, dtype=np.float32))
    forced = ep.force_end()
    assert forced[-1] == SpeechEnded(20 * FRAME + 200)
    (tail,) = [e for e in forced if isinstance(e, SpeechAudio)]
    assert tail.start_sample == 20 * FRAME and tail.samples.size == 200
    # ... and the frames keep their grid: those samples begin the next frame, as they
    # would have without the finalize (a stream resumed after it is cut into the same
    # frames); the session gives them to no other utterance (ChannelRecognizer's
    # _decoded_until)
    assert ep.position == 20 * FRAME
    again = ep.feed(np.full(20 * FRAME - 200, 0.1, dtype=np.float32))
    assert ep.position == 40 * FRAME
    (started,) = [e for e in again if isinstance(e, SpeechStarted)]
    assert started.start_sample >= 20 * FRAME


def test_force_end_in_a_pause_ends_where_speech_ended() -> None:
    ep = Endpointer(ScriptedDetector("#" * 10 + "." * 5), CONFIG)
    ep.feed(np.full(15 * FRAME, 0.1, dtype=np.float32))  # 5 unvoiced frames: a pause
    assert ep.force_end() == [SpeechEnded(10 * FRAME)]


def test_digital_silence_is_never_speech() -> None:
    ep = Endpointer(ScriptedDetector("#" * 100), CONFIG)
    assert not ep.feed(np.zeros(100 * FRAME, dtype=np.float32))


def test_feed_if_quiet_takes_only_what_feed_would_find_nothing_in() -> None:
    """A SEMANTIC channel feeds a quiet line's audio whole this way (the turn model
    cannot be asked about audio no one speaks in), and anything else a frame at a time."""
    ep = Endpointer(ScriptedDetector("#" * 100), CONFIG)
    quiet = np.full(5 * FRAME + 100, 1e-4, dtype=np.float32)  # under the energy floor
    assert ep.feed_if_quiet(quiet) and ep.position == 5 * FRAME and not ep.speaking
    one_loud_frame = np.concatenate([quiet, np.full(FRAME, 0.1, dtype=np.float32)])
    assert not ep.feed_if_quiet(one_loud_frame) and ep.position == 5 * FRAME  # nothing taken
    assert ep.feed_if_quiet(np.full(FRAME - 101, 0.1, dtype=np.float32))  # no whole frame yet
    assert ep.position == 5 * FRAME
    speaking = Endpointer(ScriptedDetector("#" * 100), CONFIG)
    speaking.feed(np.full(10 * FRAME, 0.1, dtype=np.float32))
    assert speaking.speaking and not speaking.feed_if_quiet(quiet)


def test_trailing_silence_is_reported_with_the_audio() -> None:
    events = run("#" * 10 + "." * 8, CONFIG, chunk_frames=18)
    audio = [e for e in events if isinstance(e, SpeechAudio)]
    assert audio[-1].trailing_silence == 8 * FRAME
    assert audio[-1].last_voiced_end == 10 * FRAME


@pytest.mark.parametrize("detector", [WebRtcVoiceDetector, SileroVoiceDetector])
def test_real_detectors_find_the_speech_in_a_recording(detector) -> None:  # type: ignore[no-untyped-def]
    rec = corpus()["libri_1089-134691-0000"]  # 2.1 s: "HE COULD WAIT NO LONGER"
    pcm, sr = read_pcm16(rec.path)
    assert sr == 16_000
    audio = np.concatenate([np.zeros(16_000), pcm[:, 0] / 32768.0, np.zeros(16_000)]).astype(
        np.float32
    )
    ep = Endpointer(detector(), EndpointerConfig())
    events = ep.feed(audio) + ep.flush()
    starts = [e.start_sample / 16_000 for e in events if isinstance(e, SpeechStarted)]
    ends = [e.end_sample / 16_000 for e in events if isinstance(e, SpeechEnded)]
    assert len(starts) == 1 and len(ends) == 1
    # speech sits between 1.0 s and 3.1 s of this padded signal
    assert 0.8 <= starts[0] <= 1.6
    assert 2.4 <= ends[0] <= 3.2


def test_silero_second_opinion_hears_speech_but_not_noise_or_silence() -> None:
    pcm, _ = read_pcm16(corpus()["libri_1089-134691-0000"].path)  # speech from 0.55 s
    speech = (pcm[:, 0] / 32768.0).astype(np.float32)
    quiet = np.zeros(4000, np.float32)
    noise = (np.random.default_rng(1).standard_normal(1600) * 0.1).astype(np.float32)
    assert silero_hears_speech(speech[9600:16000], lead_in=quiet)  # 0.6–1.0 s
    assert not silero_hears_speech(np.concatenate([quiet, noise, quiet]), lead_in=quiet)
    assert not silero_hears_speech(quiet, lead_in=quiet)
    # the lead-in is heard but not judged: speech that ends just before is not "in" it
    assert not silero_hears_speech(quiet, lead_in=speech[8000:12000])


def test_the_onset_counts_the_samples_of_flushs_short_last_frame() -> None:
    # the end of the audio completes the start window with a frame of 200 real samples:
    # the onset is where the first voiced frame began, not a whole frame earlier
    from asr_server.vad.energy import EnergyVoiceDetector

    ep = Endpointer(EnergyVoiceDetector(), EndpointerConfig(start_ms=120, pre_roll_ms=0))
    speech = 0.1 * np.sin(np.arange(3 * 480 + 200) * 0.3).astype(np.float32)
    events = ep.feed(np.concatenate([np.zeros(4800, np.float32), speech])) + ep.flush()
    (started,) = [e for e in events if isinstance(e, SpeechStarted)]
    assert started.onset_sample == started.start_sample == 4800


def speech_spans(detector, audio: np.ndarray) -> list[tuple[float, float]]:  # type: ignore[no-untyped-def]
    """The endpointer's utterances in ``audio`` (default config), in seconds."""
    ep = Endpointer(detector, EndpointerConfig())
    events = ep.feed(audio) + ep.flush()
    starts = [e.onset_sample / 16_000 for e in events if isinstance(e, SpeechStarted)]
    ends = [e.end_sample / 16_000 for e in events if isinstance(e, SpeechEnded)]
    return list(zip(starts, ends, strict=True))


class LevelBlindWebRtc(WebRtcVoiceDetector):
    """webrtcvad as the endpointer drove it before it raised quiet channels."""

    level_sensitive = False


def padded(rid: str) -> np.ndarray:
    gap = np.zeros(16_000, np.float32)
    return np.concatenate([gap, first_channel(corpus()[rid].path), gap])


@pytest.mark.parametrize("rid", ["libri_1995-1837-0001", "libri_1089-134686-0000"])
def test_a_quiet_talker_is_heard(rid: str) -> None:
    """webrtcvad's mode 3 hears fewer voiced frames the quieter the audio: 25 dB below
    these recordings' level it found a third of the first one's speech and none of the
    second's, where offline Whisper reads every word. The detector hears a quiet channel
    raised (the first second or so of a channel quiet from its start only partly)."""
    audio = padded(rid)
    loud = speech_spans(WebRtcVoiceDetector(3), audio)
    # a click first (a handset, a connect beep: 30 ms of 1 kHz at -20 dBFS) does not make
    # the channel one heard at a normal level (it did, and the talker got no gain)
    t = np.arange(480) / 16_000
    click = (np.sqrt(2) * 0.1 * np.sin(2 * np.pi * 1000 * t)).astype(np.float32)
    for db in (-20, -25):
        for first in (np.zeros(0, np.float32), click):
            quiet = speech_spans(
                WebRtcVoiceDetector(3),
                np.concatenate([first, audio * np.float32(10 ** (db / 20))]),
            )
            shift = first.size / 16_000
            assert abs(quiet[-1][1] - shift - loud[-1][1]) <= 0.3, (db, quiet, loud)
            heard = sum(e - s for s, e in quiet if s > shift)
            assert heard >= 0.55 * sum(e - s for s, e in loud), (db, first.size, quiet, loud)


def utterance_starts(
    audio: np.ndarray,
    detector: WebRtcVoiceDetector | None = None,
    config: EndpointerConfig | None = None,
) -> list[float]:
    """Where the endpointer's utterances begin (their audio, pre-roll included), in s."""
    ep = Endpointer(detector or WebRtcVoiceDetector(3), config or EndpointerConfig())
    events = ep.feed(audio) + ep.flush()
    return [e.start_sample / 16_000 for e in events if isinstance(e, SpeechStarted)]


@pytest.mark.parametrize(
    "rid", ["libri_1995-1837-0001", "libri_1089-134691-0001", "libri_1089-134686-0000"]
)
def test_a_channel_quiet_from_its_first_word_keeps_its_first_words(rid: str) -> None:
    """The gain comes over the first second or so of a quiet channel's speech, so the
    detector hears its first words late: at -45 dBFS "It was the first great sorrow"
    began at "sorrow" (1.0 s late) and the final lost five words. An utterance that
    starts on a raised channel reaches back over the speech before its onset. At
    -50 dBFS average speech level the detector hears them 1.6 s late: a look-back of a
    second lost "It was the" (and LJ Speech's "The forms")."""
    audio = first_channel(corpus()[rid].path)
    (normal, *_) = utterance_starts(audio)
    for db in (-20, -25):  # these recordings 20 and 25 dB down: -45 to -50 dBFS
        (quiet, *_) = utterance_starts(audio * np.float32(10 ** (db / 20)))
        assert quiet <= normal + 0.25, (db, quiet, normal)
    # (with the server's 120 ms start: at 150 ms the -50 dBFS channel's first sentence
    # is no utterance at all)
    server = EndpointerConfig(start_ms=120)
    (normal, *_) = utterance_starts(audio, config=server)
    (quiet, *_) = utterance_starts(at_speech_level(audio, -50), config=server)
    assert quiet <= normal + 0.25, (-50, quiet, normal)


def pink_noise(seconds: float, dbfs: float, seed: int) -> np.ndarray:
    n = int(seconds * 16_000)
    rng = np.random.default_rng(seed)
    spectrum = np.fft.rfft(rng.standard_normal(n)) / np.sqrt(np.arange(1, n // 2 + 2))
    noise = np.fft.irfft(spectrum, n)
    return (noise * 10 ** (dbfs / 20) / np.sqrt(np.mean(noise**2))).astype(np.float32)


@pytest.mark.parametrize("kind", ["paper", "breath"])
@pytest.mark.parametrize("noise_db", [-70, -67])
def test_an_idle_line_s_rustle_and_breaths_are_not_raised_into_speech(
    kind: str, noise_db: int
) -> None:
    """Paper rustle and breaths 15 dB above a near-silent line's noise are no utterance.
    Counting the noise below the energy floor at its own level (a gain of up to 20 dB,
    tried on 2026-12-07 for talkers at -50 dBFS and taken back) made them utterances,
    and "Thank you." finals: docs/accuracy.md."""
    line = rustle_or_breaths(kind, -55, noise_db, seed=1)
    assert speech_spans(WebRtcVoiceDetector(3), line) == []


@pytest.mark.parametrize("idle", [0.0, 8 / 32768])  # digital silence; A-law's idle code
def test_comfort_noise_between_silences_is_not_raised_into_speech(idle: float) -> None:
    """A VoIP line in DTX: bursts of comfort noise at -48 dBFS with silence between.
    The silence counted as a noise floor at -60 dBFS, and each burst was raised 8 dB,
    into speech for webrtcvad (the quiet-lines reviewer: SPEECH_STARTED, NO_WORDS)."""
    gap = np.full(16_000, idle, np.float32)
    line = np.concatenate(
        [part for seed in range(6) for part in (gap, pink_noise(1.5, -48, seed))] + [gap]
    )
    assert speech_spans(WebRtcVoiceDetector(3), line) == []


def test_on_a_noisy_line_the_look_back_stops_at_the_noise() -> None:
    """On a line whose noise is above the energy floor the look-back took its whole
    second of noise before every utterance (start_s 1.3 s before the speech): it now
    takes only frames well above the line's noise floor."""
    speech = first_channel(corpus()["libri_1089-134691-0001"].path)
    speech = speech * np.float32(10 ** (-18 / 20))  # about -42 dBFS
    lead = 3.0
    audio = np.concatenate([np.zeros(int(lead * 16_000), np.float32), speech])
    audio = audio + pink_noise(audio.size / 16_000, -56, 1)
    (first, *_) = utterance_starts(audio)
    assert first >= lead + 0.42 - 0.65, first  # the speech begins 0.42 s in


def test_an_open_line_with_nobody_on_it_holds_no_look_back() -> None:
    """The look-back reaches no further than a frame above the energy floor: a silent
    line (most of a call center's) holds the pre-roll alone, as before (a second more
    of it was 80 KiB more per idle channel, the diff reviewer), and a quiet line with a
    sound on it holds the second."""
    ep = Endpointer(WebRtcVoiceDetector(3), EndpointerConfig())
    for _ in range(250):  # 5 s of 20 ms chunks
        ep.feed(np.zeros(320, np.float32))
    assert ep.position - ep.unclaimed_from <= 0.55 * 16_000
    hiss = np.random.default_rng(0).standard_normal(16_000).astype(np.float32) * 10 ** (-55 / 20)
    ep.feed(hiss)
    assert ep.position - ep.unclaimed_from >= 1.4 * 16_000


@pytest.mark.parametrize("rid", ["jfk", "picovoice_cheetah_test_en", "riva_en-US_antiberta"])
def test_a_channel_at_a_normal_level_is_heard_as_it_is(rid: str) -> None:
    """No gain for a talker at a normal level, nor for the noise before the first word
    (jfk.flac's, at -43 dBFS, is taken for speech raised by 5 dB), and no reach back
    before its utterances' pre-roll."""
    audio = padded(rid)
    assert speech_spans(WebRtcVoiceDetector(3), audio) == speech_spans(LevelBlindWebRtc(3), audio)
    assert utterance_starts(audio) == utterance_starts(audio, LevelBlindWebRtc(3))


@pytest.mark.parametrize("below_db", [15, 20, 25])
@pytest.mark.parametrize(
    "rid",
    [
        "libri_1089-134686-0000",
        "libri_1089-134686-0001",  # soft-spoken: its loudest frame -18 dBFS, few near it
    ],
)
def test_a_faint_voice_in_a_normal_talkers_pauses_is_not_raised(rid: str, below_db: int) -> None:
    """Someone further off (a TV, another agent) in the pauses of a talker heard at a
    normal level stays as faint as it is (the diff reviewers: 25 dB below, it became an
    utterance of its own; and behind a soft-spoken talker, until the target came down to
    -28 dBFS)."""
    gap = np.zeros(16_000, np.float32)
    talker = first_channel(corpus()[rid].path)
    far = first_channel(corpus()["libri_1995-1837-0001"].path) * np.float32(10 ** (-below_db / 20))
    audio = np.concatenate([gap, talker, gap, far, gap])
    assert speech_spans(WebRtcVoiceDetector(3), audio) == speech_spans(LevelBlindWebRtc(3), audio)


@pytest.mark.parametrize("level_db", [-55, -45, -40, -35])
def test_noise_alone_is_not_raised_into_speech(level_db: int) -> None:
    """The gain for quiet channels stops short of lifting a line's noise to where
    webrtcvad takes it for speech."""
    rng = np.random.default_rng(3)
    n = 20 * 16_000
    for shape in (0, 1):  # white, pink
        spectrum = np.fft.rfft(rng.standard_normal(n)) / np.arange(1, n // 2 + 2) ** (shape / 2)
        noise = np.fft.irfft(spectrum, n)
        noise *= 10 ** (level_db / 20) / np.sqrt(np.mean(noise**2))
        silence_first = np.concatenate([np.zeros(16_000), noise]).astype(np.float32)
        assert speech_spans(WebRtcVoiceDetector(3), silence_first) == []


def test_the_detectors_gain() -> None:
    from asr_server.vad.level import LevelTracker

    def gain_db(tracker: LevelTracker, db: float) -> float:  # a frame at ``db`` dBFS RMS
        return float(20 * np.log10(tracker.gain_for(10 ** (db / 10))))

    quiet = LevelTracker(0.03, -60.0)
    quiet.quiet(10)  # silence below the energy floor
    assert gain_db(quiet, -40) < 0.5  # at first, next to none: earned by staying quiet
    for _ in range(100):  # 3 s of a quiet talker whose loudest frames are -38 dBFS
        gain_db(quiet, -38)
        quiet.quiet(1)
    # the floor's -60 raised to -50 at most (it rose 0.3 dB since the last quiet frame)
    assert gain_db(quiet, -38) == pytest.approx(9.7)
    noisy = LevelTracker(0.03, -60.0)
    for _ in range(100):
        gain_db(noisy, -52)  # noise at -52 dBFS: raised to -50
    assert gain_db(noisy, -52) == pytest.approx(2.0, abs=0.05)
    normal = LevelTracker(0.03, -60.0)
    assert gain_db(normal, -15) == 0.0  # a talker at a normal level is heard as it is
    assert gain_db(normal, -45) == 0.0  # and so are the quieter frames after


def phone_band(audio: np.ndarray) -> np.ndarray:
    """``audio`` as an 8 kHz line carries it, back at 16 kHz."""
    import soxr

    return soxr.resample(soxr.resample(audio, 16_000, 8_000), 8_000, 16_000).astype(np.float32)


@pytest.mark.parametrize(
    "levels", [(-30, -35, -40, -45, -30, -35, -40, -45), (-10, -15, -10, -15, -10, -15)]
)
def test_touch_tones_on_a_quiet_line_are_no_speech(
    levels: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller keying digits on a quiet line (-58 dBFS of noise): the channel is raised
    for webrtcvad, which took the digits, their edges and its own hangover after them
    for speech, and Whisper wrote "ha", "ah", "Oh, oh, oh" (seven finals for 48 digits at
    -30 to -45 dBFS). Neither the digits nor the talker after them are lost or made up:
    digits as loud as a phone sends them (-10 dBFS) made the quiet channel one "heard" at
    a normal level, and the talker after them was not raised (the gate's second review)."""
    line = phone_band(keyed_digits(tuple(float(level) for level in levels), -58))
    assert speech_spans(WebRtcVoiceDetector(3), line) == []

    # a quiet talker after the digits is heard at least as well as after the same line
    # with nobody keying digits (the same noise: digits at -200 dBFS)
    talker = first_channel(corpus()["libri_1089-134691-0001"].path) * np.float32(10 ** (-20 / 20))
    silent_keys = phone_band(keyed_digits((-200.0,) * len(levels), -58))
    heard = speech_spans(WebRtcVoiceDetector(3), np.concatenate([line, talker]))
    expected = speech_spans(WebRtcVoiceDetector(3), np.concatenate([silent_keys, talker]))
    shift = line.size / 16_000
    assert expected and expected[0][0] > shift
    assert heard[0][0] > shift and heard[0][0] <= expected[0][0] + 0.1, (heard, expected)
    assert sum(e - s for s, e in heard) >= 0.9 * sum(e - s for s, e in expected)

    # (without the tone check the same line has utterances: this test can fail)
    monkeypatch.setattr(endpointer, "dtmf_frames", lambda frames: np.zeros(len(frames), bool))
    assert speech_spans(WebRtcVoiceDetector(3), line) != []


def digits_over(
    audio: np.ndarray, at_s: float, above_db: float, ms: int, gap_ms: int
) -> np.ndarray:
    """``audio`` with six digits keyed over it from ``at_s``, ``above_db`` louder than it."""
    level = np.sqrt(np.mean(audio[np.abs(audio) > 0.01] ** 2))
    out = audio.copy()
    pos = int(at_s * 16_000)
    for k in range(6):
        t = np.arange(ms * 16) / 16_000
        pair = (LOW_GROUP_HZ[k % 4], HIGH_GROUP_HZ[k % 3])
        digit = np.sin(2 * np.pi * pair[0] * t) + np.sin(2 * np.pi * pair[1] * t)
        digit *= level * 10 ** (above_db / 20) / np.sqrt(np.mean(digit**2))
        out[pos : pos + digit.size] += digit.astype(np.float32)
        pos += digit.size + gap_ms * 16
    return out


def spans_in_messages(audio: np.ndarray) -> list[tuple[float, float]]:
    """The server's endpointing (its 120 ms start) fed 20 ms messages."""
    ep = Endpointer(WebRtcVoiceDetector(3), EndpointerConfig(start_ms=120))
    events = [e for i in range(0, audio.size, 320) for e in ep.feed(audio[i : i + 320])]
    events += ep.flush()
    starts = [e.onset_sample / 16_000 for e in events if isinstance(e, SpeechStarted)]
    ends = [e.end_sample / 16_000 for e in events if isinstance(e, SpeechEnded)]
    return list(zip(starts, ends, strict=True))


@pytest.mark.parametrize(("ms", "gap_ms"), [(100, 60), (150, 60)])
def test_digits_keyed_while_talking_neither_end_nor_split_the_utterance(
    ms: int, gap_ms: int
) -> None:
    """Digits keyed over speech, 10 dB louder: with the digits counted as silence, six
    of them 60 ms apart ended the utterance and the words under them were in none (the
    gate's reviewer: "bruised potatoes and fat mutton pieces to be" lost). While an
    utterance is open a digit is neither speech nor pause (for up to TONE_HOLD_MS more
    than a pause, 1.5 s of keying: six keys of 300 ms do end it)."""
    gap = np.zeros(16_000, np.float32)
    talker = np.concatenate([gap, first_channel(corpus()["libri_1089-134686-0000"].path), gap])
    assert spans_in_messages(digits_over(talker, 4.0, 10, ms, gap_ms)) == spans_in_messages(talker)


def test_a_word_long_after_a_digit_is_heard_as_without_it() -> None:
    """The frames just after a digit are not speech (its edge, webrtcvad's hangover); a
    count of frames since it stood still over silence, so a short word 2 s later lost
    its first 90 ms, and with them its utterance (the gate's reviewer)."""
    talk = first_channel(corpus()["libri_1089-134691-0001"].path)
    word = talk[int(1.3 * 16_000) : int(1.45 * 16_000)].copy()
    word *= np.minimum(1, np.minimum(np.arange(word.size), np.arange(word.size)[::-1]) / 80)
    t = np.arange(150 * 16) / 16_000
    digit = np.sin(2 * np.pi * 770 * t) + np.sin(2 * np.pi * 1336 * t)
    digit *= np.minimum(1, np.minimum(t, t[::-1]) / 0.005) * 0.1 / np.sqrt(np.mean(digit**2))
    silence = np.zeros(2 * 16_000, np.float32)
    keyed = np.concatenate([silence[:8000], digit.astype(np.float32), silence, word, silence])
    quiet = np.concatenate([silence[:8000], 0 * digit.astype(np.float32), silence, word, silence])
    heard, expected = spans_in_messages(keyed), spans_in_messages(quiet)
    assert len(heard) == len(expected) == 1, (heard, expected)
    # the same start (webrtcvad, having heard the digit's edge, may end a frame apart)
    assert heard[0][0] == expected[0][0] and abs(heard[0][1] - expected[0][1]) <= 0.06


def words_then_digits() -> tuple[np.ndarray, float]:
    """Words, then 20 s of digits keyed 80 ms on, 60 ms off at -35 dBFS (an account
    number, and more), and where the words end (the endpointer's end without digits)."""
    talk = first_channel(corpus()["libri_1089-134691-0001"].path)[: int(2.4 * 16_000)]
    words = np.concatenate([np.zeros(8000, np.float32), talk])
    (alone,) = spans_in_messages(np.concatenate([words, np.zeros(3 * 16_000, np.float32)]))
    t = np.arange(80 * 16) / 16_000
    keys = []
    for k in range(140):
        digit = np.sin(2 * np.pi * LOW_GROUP_HZ[k % 4] * t)
        digit += np.sin(2 * np.pi * HIGH_GROUP_HZ[k % 3] * t)
        keys += [(digit * 10 ** (-35 / 20) / np.sqrt(np.mean(digit**2))), np.zeros(60 * 16)]
    return np.concatenate([words, *[k.astype(np.float32) for k in keys]]), alone[1]


def test_digits_keyed_after_speech_end_the_utterance_where_the_words_ended() -> None:
    """Digits right after speech held the utterance open ("neither speech nor pause") to
    its length limit: the final came 15 s late, with the digits' end as its end (the
    gate's second review). Now digits hold it at most TONE_HOLD_MS more than a pause."""
    audio, words_end = words_then_digits()
    ep = Endpointer(WebRtcVoiceDetector(3), EndpointerConfig(start_ms=120))
    ended_at = None
    for i in range(0, audio.size, 320):
        for event in ep.feed(audio[i : i + 320]):
            if isinstance(event, SpeechEnded) and ended_at is None:
                ended_at = (event.end_sample / 16_000, (i + 320) / 16_000)
    assert ended_at is not None
    end, heard_at = ended_at
    # (its last 30 ms frame, directly before the first digit, is taken for its first edge)
    assert words_end - 0.031 <= end <= words_end
    assert heard_at <= words_end + (500 + endpointer.TONE_HOLD_MS) / 1000 + 0.1


def test_a_finalize_during_digits_after_speech_ends_where_the_words_ended() -> None:
    """A client's finalize while the caller keys digits after speaking: the digits were
    taken for more of the utterance and decoded with the words (the gate's second review)."""
    audio, words_end = words_then_digits()
    ep = Endpointer(WebRtcVoiceDetector(3), EndpointerConfig(start_ms=120))
    cut = int((words_end + 0.9) * 16_000)
    for i in range(0, cut, 320):
        ep.feed(audio[i : min(i + 320, cut)])
    (ended,) = [e for e in ep.force_end() if isinstance(e, SpeechEnded)]
    assert words_end - 0.031 <= ended.end_sample / 16_000 <= words_end


@pytest.mark.parametrize("at_s", [2.4, 4.0, 6.6])
def test_digits_keyed_while_talking_are_no_pause_to_the_session(at_s: float) -> None:
    """The session starts early finals, asks the turn model and splits long utterances
    at the pauses the endpointer reports: digits keyed over speech reported as a pause
    made SEMANTIC end the turn under them (the words there in neither final) and SILENCE
    split the sentence (the gate's third review)."""
    gap = np.zeros(16_000, np.float32)
    talker = np.concatenate([gap, first_channel(corpus()["libri_1089-134686-0000"].path), gap])

    def longest_pause(audio: np.ndarray) -> float:
        ep = Endpointer(WebRtcVoiceDetector(3), EndpointerConfig(start_ms=120))
        window = range(int(at_s * 16_000), int((at_s + 2.0) * 16_000))
        return max(
            (
                e.trailing_silence / 16_000
                for i in range(0, audio.size, 320)
                for e in ep.feed(audio[i : i + 320])
                if isinstance(e, SpeechAudio) and e.start_sample in window
            ),
            default=0.0,
        )

    assert longest_pause(digits_over(talker, at_s, 10, 150, 100)) <= longest_pause(talker)


@pytest.mark.parametrize(("on_ms", "off_ms"), [(100, 100), (80, 120), (100, 250), (150, 350)])
def test_digits_keyed_at_a_person_s_pace_after_speech_end_where_the_words_ended(
    on_ms: int, off_ms: int
) -> None:
    """Keyed with gaps longer than the 90 ms after a digit, each digit's first edge was
    heard as speech resumed: the utterance ran on to the last digits and ended on them,
    3.6 to 6.7 s of digits decoded with the words (the gate's fourth review)."""
    talk = first_channel(corpus()["libri_1089-134691-0001"].path)[: int(2.4 * 16_000)]
    words = np.concatenate([np.zeros(8000, np.float32), talk])
    (alone,) = spans_in_messages(np.concatenate([words, np.zeros(3 * 16_000, np.float32)]))
    t = np.arange(on_ms * 16) / 16_000
    keys = []
    for k in range(20):
        digit = np.sin(2 * np.pi * LOW_GROUP_HZ[k % 4] * t)
        digit += np.sin(2 * np.pi * HIGH_GROUP_HZ[k % 3] * t)
        digit *= 10 ** (-20 / 20) / np.sqrt(np.mean(digit**2))
        keys += [digit.astype(np.float32), np.zeros(off_ms * 16, np.float32)]
    rng = np.random.default_rng(0)
    audio = np.concatenate([words, *keys])
    audio += (rng.standard_normal(audio.size) * 10 ** (-70 / 20)).astype(np.float32)
    (heard, *_) = spans_in_messages(audio)
    assert abs(heard[0] - alone[0]) <= 0.05 and alone[1] - 0.031 <= heard[1] <= alone[1] + 0.3, (
        heard,
        alone,
    )


def test_a_digit_takes_back_only_its_own_edge_however_the_audio_is_cut() -> None:
    """A digit takes back the level the frame just before it gave (its first edge). A
    quiet stretch passed in messages of its own forgot to forget that frame, so a digit
    0.6 s after a knock took the knock back too, and a quiet talker after it was raised
    or not depending on how the audio was cut into messages (the gate's fourth review)."""
    rng = np.random.default_rng(1)

    def noise(seconds: float) -> np.ndarray:
        return (rng.standard_normal(int(seconds * 16_000)) * 10 ** (-66 / 20)).astype(np.float32)

    t = np.arange(int(0.12 * 16_000)) / 16_000
    digit = np.sin(2 * np.pi * 697 * t) + np.sin(2 * np.pi * 1209 * t)
    digit *= 10 ** (-25 / 20) / np.sqrt(np.mean(digit**2))
    knock = (rng.standard_normal(480) * 10 ** (-8 / 20)).astype(np.float32)
    audio = np.concatenate([noise(0.99), knock, noise(0.6), digit.astype(np.float32), noise(0.09)])

    def level_after(step: int) -> tuple[float, ...]:
        ep = Endpointer(WebRtcVoiceDetector(3), EndpointerConfig(start_ms=150))
        for i in range(0, audio.size, step):
            ep.feed(audio[i : i + step])
        assert ep._level is not None
        return ep._level.snapshot()

    assert level_after(480) == level_after(audio.size) == level_after(1600)


@pytest.mark.parametrize("offset", [0, 160, 320, 400, 460])
@pytest.mark.parametrize("gap_s", [0.1, 0.2])
def test_the_look_back_never_reaches_over_a_digit(offset: int, gap_s: float) -> None:
    """A quiet channel's look-back reaches over the frames above the energy floor before
    an utterance's onset. A digit keyed just before a quiet talker's first word was a gap
    to it, and the edges on either side of it were held at a level (their own, or one
    taken back: the frame's before the digit), so the utterance reached back over the
    digit to its first edge, and 0.3 s before that (the gate's last read)."""
    rng = np.random.default_rng(3)

    def noise(seconds: float) -> np.ndarray:
        return (rng.standard_normal(int(seconds * 16_000)) * 10 ** (-66 / 20)).astype(np.float32)

    talk = first_channel(corpus()["libri_1089-134691-0001"].path) * np.float32(10 ** (-22 / 20))
    t = np.arange(int(0.125 * 16_000)) / 16_000
    tone = np.sin(2 * np.pi * 770 * t) + np.sin(2 * np.pi * 1477 * t)
    tone *= np.minimum(1, np.minimum(t, t[::-1]) / 0.008)
    tone *= 10 ** (-30 / 20) / np.sqrt(np.mean(tone**2))
    lead = int(np.argmax(np.abs(talk) > 0.003))  # (the talker's first word, now)
    first_words = np.concatenate([noise(1.0), talk[: 2 * 16_000], noise(1.5 + offset / 16_000)])
    after = np.concatenate([noise(gap_s), talk[lead:], noise(1.0)])

    def starts(digit: np.ndarray) -> tuple[list[int], int]:
        """Where the utterances start; and the one after the digit"""
        audio = np.concatenate([first_words, digit.astype(np.float32), after])
        ep = Endpointer(WebRtcVoiceDetector(3), EndpointerConfig(start_ms=120))
        events = [e for i in range(0, audio.size, 320) for e in ep.feed(audio[i : i + 320])]
        assert ep._level is not None and ep._level.gain_db > 0  # (a raised channel)
        started = [e for e in events if isinstance(e, SpeechStarted)]
        after_digit = [e.onset_sample > first_words.size for e in started].index(True)
        return [e.start_sample for e in started], after_digit

    (keyed, k), (alone, a) = starts(tone), starts(0 * tone)
    assert k == a and keyed[:k] == alone[:k] and len(keyed) == len(alone)
    # (with nothing above the energy floor before it, it has its pre-roll only)
    assert keyed[k] >= alone[k], (keyed[k] - first_words.size, alone[k] - first_words.size)


@pytest.mark.parametrize("dbfs", [-45, -48])
def test_a_quiet_talker_s_soft_words_between_utterances_are_in_the_next(dbfs: int) -> None:
    """At -45 dBFS, "He hoped there would be stew" was cut after "the": "there would be"
    is too soft for webrtcvad even raised, the next utterance started 0.3 s before "stew"
    (its pre-roll), and what lay between the first final's end (the last voiced frame and
    its 0.2 s of pause) and that was in no final. On a raised channel the next utterance
    now takes the pause after the last final's end as its pre-roll, and its look-back
    reaches over it; never the audio the last final decoded."""
    audio = at_speech_level(padded("libri_1089-134686-0000"), dbfs)
    ep = Endpointer(WebRtcVoiceDetector(3), EndpointerConfig(start_ms=120))
    events = [e for i in range(0, audio.size, 320) for e in ep.feed(audio[i : i + 320])]
    events += ep.flush()
    pad = round(TRAILING_PAD_S * 16_000)  # (what a final decodes of its pause)
    bounds = [e for e in events if isinstance(e, SpeechStarted | SpeechEnded)]
    follows = [
        (ended.end_sample + pad, started.start_sample)
        for ended, started in zip(bounds, bounds[1:], strict=False)
        if isinstance(ended, SpeechEnded) and isinstance(started, SpeechStarted)
    ]
    assert follows and all(final_end <= start for final_end, start in follows), follows
    # (at -45 dBFS the words after "the"): the next starts within a frame of its end
    assert any(start - final_end < 480 for final_end, start in follows), follows


@pytest.mark.parametrize("ended_by", ["silence", "finalize"])
@pytest.mark.parametrize(("dbfs", "raised"), [(-26, False), (-45, True)])
def test_between_utterances_only_a_raised_channel_holds_the_pause(
    dbfs: int, raised: bool, ended_by: str
) -> None:
    """When an utterance ends, the pause after its final's end is held for the next one
    only on a raised channel: at a normal level the next one's pre-roll starts where the
    last utterance ended, as it did before. The same when a FINALIZE (or the turn model)
    ends it in its pause, 0.6 s in: it dropped the whole pause, and a quiet talker's soft
    words there were in no final."""
    talk = first_channel(corpus()["libri_1089-134691-0001"].path)[: int(2.4 * 16_000)]
    gap = np.zeros(16_000, np.float32)
    audio = at_speech_level(np.concatenate([gap, talk, gap, talk, gap]), dbfs)
    # (finalized: silence never ends it)
    silence_ms = 5000 if ended_by == "finalize" else 500
    ep = Endpointer(WebRtcVoiceDetector(3), EndpointerConfig(start_ms=120, silence_ms=silence_ms))
    finalize_at = {gap.size + talk.size + 9_600, 2 * (gap.size + talk.size) + 9_600}
    held_after_end = []
    for i in range(0, audio.size, 480):  # (a frame a message: the end is the last frame)
        events = ep.feed(audio[i : i + 480])
        if ended_by == "finalize" and any(i < at <= i + 480 for at in finalize_at):
            events += ep.force_end()
        for event in events:
            if isinstance(event, SpeechEnded):
                assert ep._level is not None and (ep._level.gain_db > 0) == raised
                assert event.end_sample < i
                final_end = event.end_sample + round(TRAILING_PAD_S * 16_000)
                held_after_end.append((ep.unclaimed_from, final_end, ep.position))
    assert len(held_after_end) == 2
    for unclaimed, final_end, position in held_after_end:
        if raised:
            assert final_end <= unclaimed < final_end + 480
        else:
            assert unclaimed == position


def test_a_resumed_quiet_phone_channel_is_heard_as_on_the_uncut_call() -> None:
    """A resumed stream's replay before the point its client has finals up to starts no
    utterance, but is heard: heard as silence, a -45 dBFS phone channel's gain and
    webrtcvad's model of its noise started from nothing, and the next utterances began
    seconds late or merged (a reviewer's 8 kHz call lost "whether you could help me with
    that" and more). Resumed after the 2nd and 4th utterances (the client replays the
    9.6 s before the last final's start), every utterance after that point starts no
    later and ends within two frames of where it does uncut."""
    from asr_server.audio.g711 import mulaw_decode, mulaw_encode
    from asr_server.audio.resample import resampler_for

    talk = first_channel(corpus()["google_commercial_mono_8k"].path, 8_000)
    line = mulaw_decode(mulaw_encode(np.round(at_speech_level(talk, -45, 8_000) * 32767)))
    audio = resampler_for(8_000, 16_000).process(line.astype(np.float32) / 32768, last=True)

    def bounds(audio: np.ndarray, listen_until: int = 0) -> list[tuple[int, int]]:
        return utterances(audio, WebRtcVoiceDetector(3), listen_until, chunk=320)

    uncut = bounds(audio)
    assert len(uncut) >= 10
    for last_final in (2, 4):
        final_until = uncut[last_final][1] + round(TRAILING_PAD_S * 16_000)
        replay = max(0, uncut[last_final][0] - int(9.6 * 16_000)) // 480 * 480
        resumed = [
            (s + replay, e + replay) for s, e in bounds(audio[replay:], final_until - replay)
        ]
        assert all(start >= final_until for start, _ in resumed)
        want = [(s, e) for s, e in uncut if s >= final_until]
        assert len(resumed) == len(want), (last_final, resumed, want)
        for (start, end), (want_start, want_end) in zip(resumed, want, strict=True):
            assert start <= want_start + 480 and abs(end - want_end) <= 960, (start, end)
