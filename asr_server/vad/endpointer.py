"""Endpointing: turns per-frame speech probabilities into utterance boundaries.

A small hysteresis state machine in the spirit of pipecat's VAD analyser:

    QUIET --(enough voiced frames in a short window)--> SPEAKING
    SPEAKING --(configured trailing silence)--> QUIET

While quiet it keeps a pre-roll of recent audio so the first syllable is never
cut. While speaking every frame is passed on as ``SpeechAudio``, silence
included, since a pause may turn out to be inside the utterance. Offsets are
sample counts at 16 kHz since the channel's first sample.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from asr_server.vad.base import VoiceDetector
from asr_server.vad.level import LevelTracker
from asr_server.vad.tones import dtmf_frames

#: frames quieter than this (RMS, full scale = 1) are silence whatever the detector says
ENERGY_FLOOR_DB = -60.0
ENERGY_FLOOR = 10 ** (ENERGY_FLOOR_DB / 20)
#: the level a frame below the energy floor is held at (the look-back never takes it)
QUIET_FRAME_DB = -100.0
#: frames quieter than this are digital silence, or as good as (A-law has no zero: its
#: idle code decodes to -72 dBFS), for the level tracker (vad/level.py)
SILENT_DB = -70.0
SILENT_MEAN_SQUARE = 10 ** (SILENT_DB / 10)
#: a channel raised for the detector (vad/level.py) gets its gain over its first second
#: or two of speech: webrtcvad heard "It was the first great sorrow" at -45 dBFS from
#: "sorrow" on, 1.0 s late, and at -50 dBFS 1.6 s late (a second of look-back lost "It
#: was the"). Until the channel has been heard at a normal level it keeps this much
#: more audio before an utterance, and an utterance that starts raised reaches back over
#: the frames above the energy floor before its pre-roll (gaps of at most
#: LOOK_BACK_GAP_S between them: between words, not silence before the first)
RAISED_LOOK_BACK_S = 2.0
LOOK_BACK_GAP_S = 0.3
#: ... and, on a line whose noise is above the energy floor (under QUIET_SHARE_OF_CLEAN_LINE
#: of the held frames below it), this far above the channel's noise floor: there the
#: look-back took the whole second of the noise before every utterance
LOOK_BACK_ABOVE_FLOOR_DB = 6.0
QUIET_SHARE_OF_CLEAN_LINE = 0.25
#: a touch-tone digit (vad/tones.py) is no speech, but its edges (a frame that holds only
#: part of it) are heard as speech, and so are the frames webrtcvad scores next (its
#: hangover after "speech"). The frames heard voiced just before a digit's first frame no
#: longer count towards an utterance's start, and the detector's verdicts for this long
#: after its last are not speech; in an open utterance all of these are neither speech nor
#: pause (a caller keying digits while talking is not cut)
TONE_GUARD_MS = 90
#: ... but not for longer than this more than a pause: digits keyed right after speech
#: (an account number) would hold the utterance open to its length limit
TONE_HOLD_MS = 1000
#: the level a digit's frame, and one in the TONE_GUARD_MS after it, is held at: the
#: look-back stops there (it reached over digits keyed just before a quiet talker's
#: first word: their edges hold part of a digit, and some held a level taken back)
TONE_FRAME_DB = -200.0


@dataclass(frozen=True)
class EndpointerConfig:
    threshold: float = 0.5
    start_ms: int = 150
    pre_roll_ms: int = 300
    silence_ms: int = 500
    #: of the pause an utterance ends on, what its final decodes (the session's trailing
    #: pad): a next utterance's pre-roll never reaches back into it
    decoded_pad_ms: int = 200


@dataclass(frozen=True)
class SpeechStarted:
    start_sample: int  # where the utterance's audio begins: the onset minus the pre-roll
    onset_sample: int  # the first voiced frame


@dataclass(frozen=True)
class SpeechAudio:
    start_sample: int
    samples: np.ndarray
    #: silence heard since the last voiced frame, as of the end of these samples
    trailing_silence: int = 0
    #: end of the last voiced frame, as of the end of these samples
    last_voiced_end: int = 0


@dataclass(frozen=True)
class SpeechEnded:
    #: end of the last voiced frame; audio after it that was already passed on is trailing silence
    end_sample: int


EndpointEvent = SpeechStarted | SpeechAudio | SpeechEnded


def _square_sums(frames: np.ndarray) -> np.ndarray:
    """Per row of ``frames``: the sum of its squared samples."""
    # (ufunc calls: the einsum wrapper's Python overhead showed in profiles of many streams)
    return np.add.reduce(np.square(frames), axis=1)


def _loud(frames: np.ndarray, square_sums: np.ndarray | None = None) -> np.ndarray:
    """Per row of ``frames``: is its RMS above the energy floor?"""
    sums = _square_sums(frames) if square_sums is None else square_sums
    return sums > ENERGY_FLOOR * ENERGY_FLOOR * frames.shape[1]


class Endpointer:
    def __init__(self, detector: VoiceDetector, config: EndpointerConfig) -> None:
        self.detector = detector
        self.config = config
        frame = detector.frame_samples
        self._start_frames = self._frames(config.start_ms)
        self._start_window = self._start_frames + max(1, self._start_frames // 2)
        self._silence_frames = self._frames(config.silence_ms)
        self._pre_roll_frames = round(config.pre_roll_ms * 16 / frame)
        self._decoded_pad = config.decoded_pad_ms * 16
        # a detector whose decisions depend on the level (webrtcvad) hears a quiet
        # channel raised (vad/level.py)
        level_sensitive = getattr(detector, "level_sensitive", False)
        self._level = LevelTracker(frame / 16_000, ENERGY_FLOOR_DB) if level_sensitive else None
        self._look_back_frames = round(RAISED_LOOK_BACK_S * 16_000 / frame) if self._level else 0
        self._look_back_gap = round(LOOK_BACK_GAP_S * 16_000 / frame)
        self._pre_roll_kept = self._pre_roll_frames + self._start_window
        held = self._pre_roll_kept + self._look_back_frames
        self._pre_roll: deque[np.ndarray] = deque(maxlen=held)
        #: each held frame's level (dB; QUIET_FRAME_DB below the energy floor,
        #: TONE_FRAME_DB a digit's)
        self._pre_roll_db: deque[float] = deque(maxlen=held)
        self._recent_voiced: deque[bool] = deque(maxlen=self._start_window)
        self._pending = np.zeros(0, dtype=np.float32)
        self.position = 0  # samples scored so far
        self.speaking = False
        self._silent_run = 0
        self._neutral_run = 0  # touch tones and their edges since the last voiced frame
        self._last_voiced_end = 0
        self._listen_only_until = 0  # (listen_only_until)
        #: the open utterance's speech began before _listen_only_until: it is followed as
        #: on the uncut stream, and nothing of it is reported
        self._unheard_utterance = False
        self._tone_guard = TONE_GUARD_MS * 16
        self._tone_hold_frames = self._frames(TONE_HOLD_MS)
        self._tone_guard_until = 0  # (a sample position)
        #: the level tracker's state before the last frame, if that frame raised it
        self._before_raise: tuple[float, float, float, float, int] | None = None
        #: in an utterance, the pause before the last frame, if that frame was voiced (a
        #: digit's first edge, if a digit follows: the utterance's end is not moved onto it)
        self._before_voiced: tuple[int, int, int] | None = None

    def listen_only_until(self, sample: int) -> None:
        """Audio before ``sample`` already has its finals (a resumed stream, whose client
        replays it): an utterance whose speech starts before it is followed as on the
        uncut stream, to its end (a finalize replayed in it included), but not reported;
        if speech goes on after ``sample`` within it, an utterance is reported from there.
        (Heard as silence, a quiet channel's gain and webrtcvad's own model of the
        channel's noise started again from nothing on every resume: a -45 dBFS talker went
        unheard for a second or more after it, words were lost, sentences cut, and the
        splits moved for the rest of the call. Followed but not ended where the uncut
        stream ended them, the pre-roll of the next utterance reached further back, and a
        finalize's cut moved the frames.) An utterance that starts just after it may reach
        back before it; the session keeps it out of audio that has its final."""
        self._listen_only_until = sample

    def _frames(self, ms: int) -> int:
        """Whole detector frames in ``ms`` (at least one)."""
        return max(1, round(ms * 16 / self.detector.frame_samples))

    def set_silence_ms(self, silence_ms: int) -> None:
        """The silence that ends an utterance, from the next frame on (a stream's update);
        a pause already longer ends at that frame."""
        self.config = dataclasses.replace(self.config, silence_ms=silence_ms)
        self._silence_frames = self._frames(silence_ms)

    @property
    def unclaimed_from(self) -> int:
        """Between utterances: the first sample a later ``SpeechStarted`` could still take
        in (the oldest audio of the pre-roll window). Not meaningful while speaking."""
        return self.position - sum(a.size for a in self._pre_roll)

    def feed_if_quiet(self, samples: np.ndarray) -> bool:
        """``feed(samples)`` where it would find nothing, nobody speaking before or after
        (no whole frame above the energy floor: feed's own fast path), and True; else
        nothing is taken, and False."""
        if self.speaking:
            return False
        frames, rest = self._whole_frames(samples)
        sums = _square_sums(frames)
        if _loud(frames, sums).any():
            return False
        self._pending = rest
        self._pass_quiet(frames, sums)
        return True

    def feed(self, samples: np.ndarray) -> list[EndpointEvent]:
        """Score whole frames of ``samples``; the remainder waits for the next call."""
        frames, self._pending = self._whole_frames(samples)
        events: list[EndpointEvent] = []
        if not len(frames):
            return events
        sums = _square_sums(frames)
        loud = _loud(frames, sums).tolist()  # a few Python bools: cheaper than numpy scalars
        if not self.speaking and not any(loud):
            self._pass_quiet(frames, sums)
            return events
        energies = (sums / frames.shape[1]).tolist()
        for i in range(len(frames)):
            self._frame(frames[i], events, loud=loud[i], energy=energies[i])
        return events

    def _whole_frames(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The whole frames of what was pending and ``samples`` (rows), and the rest."""
        frame = self.detector.frame_samples
        buf = np.concatenate([self._pending, samples]) if self._pending.size else samples
        count = buf.size // frame
        return buf[: count * frame].reshape(count, frame), buf[count * frame :].copy()

    def _pass_quiet(self, frames: np.ndarray, square_sums: np.ndarray) -> None:
        """An open line with nobody talking (most of a call center's streams): no detector
        calls and no per-frame work, only the pre-roll bookkeeping."""
        self.position += frames.size
        self._before_raise = self._before_voiced = None  # (as a quiet frame does in _frame)
        if self._level is not None:
            # (digital silence, a VoIP line's between its comfort noise, says nothing
            # of the noise under a sound: it does not set the floor)
            silent = SILENT_MEAN_SQUARE * frames.shape[1]
            self._level.quiet(int(np.count_nonzero(square_sums > silent)))
        held = frames[-(self._pre_roll.maxlen or 1) :]
        self._pre_roll.extend(held)
        self._pre_roll_db.extend([QUIET_FRAME_DB] * len(held))
        self._trim_pre_roll()
        self._recent_voiced.extend([False] * min(len(frames), self._recent_voiced.maxlen or 1))

    def _trim_pre_roll(self) -> None:
        """Only a channel that may yet be raised holds the look-back (RAISED_LOOK_BACK_S),
        and only while it holds a frame above the energy floor: a look-back reaches no
        further than one (an open line with nobody on it holds no more than before)."""
        if len(self._pre_roll) <= self._pre_roll_kept:
            return
        if (
            self._level is not None
            and not self._level.heard
            and max(self._pre_roll_db) > QUIET_FRAME_DB
        ):
            return
        while len(self._pre_roll) > self._pre_roll_kept:
            self._pre_roll.popleft()
            self._pre_roll_db.popleft()

    def _hold_pause_after(self, sample: int) -> None:
        """An utterance ended: of the pause it ended on, the frames from ``sample`` on
        (after what its final decodes) are the next one's pre-roll on a raised channel,
        and the look-back's (a quiet talker's soft words there, which the detector did
        not hear even raised, were in neither final); elsewhere none are."""
        if self._level is None or self._level.gain_db <= 0.0:
            self._pre_roll.clear()
            self._pre_roll_db.clear()
            return
        kept, frame_start = 0, self.position
        for audio in reversed(self._pre_roll):
            frame_start -= audio.size
            if frame_start < sample:
                break
            kept += 1
        for _ in range(len(self._pre_roll) - kept):
            self._pre_roll.popleft()
            self._pre_roll_db.popleft()

    def _onset_look_back(self, keep: int, onset_frames: int) -> int:
        """How many of the held frames an utterance that starts now takes in: ``keep``
        (its pre-roll and start window, the last ``onset_frames`` from the first voiced
        one), or, on a raised channel, more: the pre-roll before the first frame above
        the energy floor (on a noisy line, LOOK_BACK_ABOVE_FLOOR_DB above its noise floor)
        before the onset, across gaps between words (RAISED_LOOK_BACK_S), not over a
        touch-tone digit. (Whisper needs the lead-in: cut at the very onset of "For a
        full hour", it read "a full hour", at any level.)"""
        if self._level is None or self._level.gain_db <= 0.0:
            return keep
        levels = self._pre_roll_db
        quiet = sum(1 for level in levels if level == QUIET_FRAME_DB)
        above = ENERGY_FLOOR_DB
        if quiet < QUIET_SHARE_OF_CLEAN_LINE * len(levels):  # a noisy line
            above = max(above, self._level.floor_db + LOOK_BACK_ABOVE_FLOOR_DB)
        earliest, gap = None, 0
        for i in range(len(levels) - onset_frames - 1, -1, -1):
            if levels[i] == TONE_FRAME_DB:
                break
            if levels[i] > above:
                earliest, gap = i, 0
            else:
                gap += 1
                if gap > self._look_back_gap:
                    break
        if earliest is None:
            return keep
        return max(keep, min(len(levels), len(levels) - earliest + self._pre_roll_frames))

    def _heard(self, frame: np.ndarray, loud: bool, energy: float) -> np.ndarray:
        """``frame`` (its mean square ``energy``) as the detector hears it: raised if the
        channel is quiet."""
        if self._level is None:
            return frame
        if not loud:
            self._level.quiet(1 if energy > SILENT_MEAN_SQUARE else 0)  # (see _pass_quiet)
            return frame
        gain = self._level.gain_for(energy)
        return frame if gain == 1.0 else frame * np.float32(gain)

    def flush(self) -> list[EndpointEvent]:
        """End of audio: score the partial frame and close an open utterance."""
        events: list[EndpointEvent] = []
        if self._pending.size:
            tail = self._pending
            padded = np.zeros(self.detector.frame_samples, dtype=np.float32)
            padded[: tail.size] = tail
            self._pending = np.zeros(0, dtype=np.float32)
            sums = _square_sums(padded[None, :])
            self._frame(
                padded,
                events,
                loud=bool(_loud(padded[None, :], sums)[0]),
                energy=float(sums[0]) / padded.size,
                real_samples=tail.size,
            )
        if self.speaking:
            self._end_utterance(self._last_voiced_end, events)
        return events

    def force_end(self) -> list[EndpointEvent]:
        """The client asked to finalize now (or the turn model said the turn is over): end
        the open utterance where speech ended, the current position if mid-speech. A
        client whose own VAD heard the pause finalizes in it, as voice agents do: then the
        final decoded early in the pause is the one it gets."""
        if not self.speaking:
            return []
        events: list[EndpointEvent] = []
        cut_at = self.speech_going_on_until  # (None: in a pause)
        if cut_at is not None and self._pending.size:
            # mid-speech (a push-to-talk release): the samples short of a whole frame are
            # the utterance's last; everything the client sent before its finalize is in
            # this final. They stay pending too, so that the frames keep their grid (moved
            # by a finalize, the rest of the call was cut into other frames than a stream
            # resumed after it, and words changed); the session gives the next utterance
            # none of them (its _decoded_until)
            if not self._unheard_utterance:
                events.append(SpeechAudio(self.position, self._pending, 0, cut_at))
        self._end_utterance(self._last_voiced_end if cut_at is None else cut_at, events)
        return events

    @property
    def speech_going_on_until(self) -> int | None:
        """Where a finalize now would cut speech still going on (every sample received so
        far: see force_end); None when no utterance is open, or it is in a pause."""
        if not self.speaking or self._silent_run or self._neutral_run:
            return None
        return self.position + self._pending.size

    def _report_from_listen_point(
        self, frames: Sequence[np.ndarray], events: list[EndpointEvent]
    ) -> None:
        """Speech goes on past the listening point in an utterance not reported (the
        client's last final was cut there: at the length limit, by a finalize): it is
        reported from the frame that holds that point. ``frames``: the utterance's latest
        frames, up to the current one (its frames since it began are held: see _frame)."""
        self._unheard_utterance = False
        kept: list[np.ndarray] = []
        start = self.position
        for audio in reversed(frames):
            # (and no further back than a new utterance's pre-roll: after a pause the
            # turn model ended on the uncut stream, a SEMANTIC one's final took the pause)
            if start <= self._listen_only_until or len(kept) >= self._pre_roll_kept:
                break
            kept.append(audio)
            start -= audio.size
        kept.reverse()
        events.append(SpeechStarted(start, start))
        events.append(SpeechAudio(start, np.concatenate(kept), 0, self.position))

    def _end_utterance(self, end: int, events: list[EndpointEvent]) -> None:
        """The open utterance ends at ``end`` (its speech's end, or where it was cut):
        back to listening for the next, with the pause after what the final decodes
        (``_hold_pause_after``)."""
        if not self._unheard_utterance:
            events.append(SpeechEnded(end))
        self._unheard_utterance = False
        self.speaking = False
        self._silent_run = self._neutral_run = 0
        self._recent_voiced.clear()
        self._hold_pause_after(end + self._decoded_pad)

    def _frame(
        self,
        frame: np.ndarray,
        events: list[EndpointEvent],
        *,
        loud: bool,
        energy: float,
        real_samples: int | None = None,
    ) -> None:
        n = frame.size if real_samples is None else real_samples
        start = self.position
        self.position += n
        # quiet frames never reach the detector (a stateful one sees only the loud frames)
        tracker = self._level if loud else None
        before = tracker.snapshot() if tracker is not None else None
        heard = self._heard(frame, loud, energy)
        voiced = loud and self.detector.speech_probability(heard) >= self.config.threshold
        # what it took for speech, or what raised the channel's level, may be a touch-tone
        # digit (vad/tones.py): no speech, and nothing of the level either (a loud digit
        # made a quiet channel "heard", and its talker went unheard); while speaking,
        # neither speech nor pause (TONE_HOLD_MS)
        raised = tracker is not None and before is not None and tracker.raised_since(before)
        tone = (voiced or raised) and bool(dtmf_frames(frame[None, :])[0])
        if tracker is not None and before is not None:
            if tone:  # and the frame before it, if it raised the level: its first edge
                tracker.restore(self._before_raise or before)
            elif raised and start < self._tone_guard_until:  # its last edge
                tracker.restore(before)
        self._before_raise = before if raised and not tone else None
        if tone:
            self._tone_guard_until = self.position + self._tone_guard
            if not self.speaking:  # the digit's first edge, heard as speech
                self._recent_voiced.clear()
            elif self._before_voiced is not None:  # ... heard as speech resumed
                self._silent_run, self._neutral_run, self._last_voiced_end = self._before_voiced
                self._neutral_run += 1
        neutral = tone or start < self._tone_guard_until  # (its last edge, the hangover)
        voiced = voiced and not neutral
        audio = frame[:n]
        # (the level the tracker just took of it: only a raised channel looks back)
        if neutral:
            level_db = TONE_FRAME_DB
        elif loud and self._level is not None:
            level_db = self._level.level_db
        else:
            level_db = QUIET_FRAME_DB
        self._pre_roll.append(audio)  # (while speaking: the pause that may end it)
        self._pre_roll_db.append(level_db)
        if self.speaking:
            self._before_voiced = (
                (self._silent_run, self._neutral_run, self._last_voiced_end) if voiced else None
            )
            if voiced:
                self._silent_run = self._neutral_run = 0
                self._last_voiced_end = self.position
            elif neutral:
                self._neutral_run += 1
            else:
                self._silent_run += 1
            if self._unheard_utterance and voiced and start >= self._listen_only_until:
                self._report_from_listen_point(self._pre_roll, events)
            elif not self._unheard_utterance:
                # (to the session, digits are no pause: reported as one, digits keyed
                # while talking made SEMANTIC end turns and SILENCE split sentences)
                events.append(
                    SpeechAudio(start, audio, self._silent_run * frame.size, self._last_voiced_end)
                )
            paused = self._silent_run + self._neutral_run
            if not voiced and (
                self._silent_run >= self._silence_frames
                or paused >= self._silence_frames + self._tone_hold_frames
            ):
                self._end_utterance(self._last_voiced_end, events)
            return
        self._trim_pre_roll()
        self._recent_voiced.append(voiced)
        if voiced and sum(self._recent_voiced) >= self._start_frames:
            # the utterance starts pre_roll before the first voiced frame of the window
            window = list(self._recent_voiced)
            onset_frames = len(window) - window.index(True)  # counted back from the newest
            keep = min(len(self._pre_roll), onset_frames + self._pre_roll_frames)
            keep = self._onset_look_back(keep, onset_frames)
            kept = list(self._pre_roll)[-keep:]
            first = self.position - sum(a.size for a in kept)
            # (in the samples the frames really held: flush's last frame is short)
            onset = self.position - sum(a.size for a in kept[-onset_frames:])
            audio = np.concatenate(kept)
            self.speaking = True
            self._silent_run = self._neutral_run = 0
            self._before_voiced = None
            self._last_voiced_end = self.position
            self._pre_roll.clear()
            self._pre_roll_db.clear()
            self._recent_voiced.clear()
            self._unheard_utterance = onset < self._listen_only_until
            if not self._unheard_utterance:
                events.append(SpeechStarted(first, onset))
                events.append(SpeechAudio(first, audio, 0, self.position))
            elif self.position > self._listen_only_until:  # ... and goes on past the point
                self._report_from_listen_point(kept, events)
