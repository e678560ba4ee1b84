"""How loud a channel is, and the gain that lets a level-sensitive detector hear it.

webrtcvad's decisions depend on the signal's level: the same recording scaled from a
loudest 30 ms frame of -10 dBFS down to -34 keeps fewer and fewer voiced frames, and
below that almost none. A reviewer's quiet copies of the shared corpus (-42 and -45 dBFS
average speech level) lost whole phrases, with no ``speech_started``, where offline
Whisper read every word of the same audio: a quiet talker (a far-field or laptop
microphone, a low-gain phone line) was silently dropped. So the detector hears each
frame of a quiet channel raised:

* the channel's loudest recent frame (``peak``: follows a louder frame at once, falls
  10 dB a second, 0.5 once the channel has been heard at a normal level: 0.6 s of frames
  within 6 dB of the target) is brought up to
  ``TARGET_PEAK_DB``, a few dB above where webrtcvad's hearing falls away; a channel that
  loud gets nothing (the shared corpus: all but two recordings, 1 dB below; soft-spoken
  talkers at -18 to -24 dBFS, whose pauses may hold a fainter voice; and the peak
  starts there, so that a channel
  earns its gain by staying quiet: the noise before a talker's first word can be as loud
  as a quiet talker, -43 dBFS in jfk.flac);
* never so far that the channel's noise floor (``floor``: follows a quieter frame at
  once, rises 10 dB a second; the frames below the endpointer's energy floor count at it,
  but digital silence, a VoIP line's between bursts of comfort noise, does not count)
  passes ``NOISE_CEILING_DB``: webrtcvad takes stationary noise for speech from about
  -35 dBFS (pink noise: 0.5 % of its frames at -35, 29 % at -30), and jfk.flac's hiss
  from about -40. Hence at most 10 dB, for a channel with silence under its speech
  (counting those frames at their own level, for up to 20 dB, was tried on 2026-12-07 in
  three versions and taken back: it made idle lines' rustle, breaths and hum into
  utterances, or held a quiet talker's utterances open past the words; docs/accuracy.md).

Only what the detector hears is raised; the audio decoded is the channel's own. Levels
are frame RMS in dB relative to full scale.
"""

from __future__ import annotations

import math

#: a channel whose loudest recent frame is quieter than this is raised to it
TARGET_PEAK_DB = -28.0
#: the gain never lifts the channel's noise floor above this
NOISE_CEILING_DB = -50.0
#: per second of frames above the energy floor (a silence keeps the level of the speech
#: before it): how fast the peak forgets a louder past, on a channel that has not yet been
#: as loud as the target, and on one that has (its talker is heard well: someone further
#: off in its pauses, a TV, another agent, stays as faint as they are, unless the channel
#: stays that quiet for long)
PEAK_FALL_DB_PER_S = 10.0
HEARD_PEAK_FALL_DB_PER_S = 0.5
#: "heard at a normal level": frames this loud, HEARD_FOR_S of them in all (a talker at
#: a normal level, soft-spoken too, within a second or two; a click, a beep, a DTMF digit
#: on a quiet line not, and it keeps its gain)
HEARD_LEVEL_DB = TARGET_PEAK_DB - 6.0
HEARD_FOR_S = 0.6
#: per second of frames: how fast the floor forgets a quieter past
FLOOR_RISE_DB_PER_S = 10.0


class LevelTracker:
    """One channel's peak and noise floor, and the detector's gain (see the module).
    ``quiet_db``: the endpointer's energy floor, the level given to the frames below it,
    which it does not score."""

    def __init__(self, frame_s: float, quiet_db: float) -> None:
        self._peak_fall = PEAK_FALL_DB_PER_S * frame_s
        self._heard_peak_fall = HEARD_PEAK_FALL_DB_PER_S * frame_s
        self._frames_heard = 0  # at HEARD_LEVEL_DB or louder
        self._heard_after_frames = max(1, round(HEARD_FOR_S / frame_s))
        self._floor_rise = FLOOR_RISE_DB_PER_S * frame_s
        self._quiet_db = quiet_db
        self.peak_db = TARGET_PEAK_DB  # earned by staying quiet (see the module)
        self.floor_db = math.inf
        self.gain_db = 0.0  # the latest loud frame's (0: not raised)
        self.level_db = -100.0  # the latest loud frame's level

    def snapshot(self) -> tuple[float, float, float, float, int]:
        """The state a frame changes, to take that frame back (a touch tone's)."""
        return self.peak_db, self.floor_db, self.gain_db, self.level_db, self._frames_heard

    def restore(self, state: tuple[float, float, float, float, int]) -> None:
        self.peak_db, self.floor_db, self.gain_db, self.level_db, self._frames_heard = state

    def raised_since(self, state: tuple[float, float, float, float, int]) -> bool:
        """The last frame counted towards "heard", or lifted the peak by more than a
        line's noise does from frame to frame (3 dB)."""
        return self._frames_heard > state[4] or self.peak_db > state[0] + 3.0

    @property
    def heard(self) -> bool:
        """The channel has been heard at a normal level (its gain falls slowly now)."""
        return self._frames_heard >= self._heard_after_frames

    def quiet(self, frames: int) -> None:
        """``frames`` frames below the energy floor (not digital silence) went by."""
        if frames:
            self.floor_db = min(self._quiet_db, self.floor_db + self._floor_rise * frames)

    def gain_for(self, energy: float) -> float:
        """The linear gain for a frame above the energy floor whose mean square is
        ``energy``, counting its own level first (a louder frame lowers the gain from
        itself on)."""
        self.level_db = level = 10.0 * math.log10(max(energy, 1e-10))  # silence: -100 dB
        self._frames_heard += level >= HEARD_LEVEL_DB
        fall = self._heard_peak_fall if self.heard else self._peak_fall
        self.peak_db = max(level, self.peak_db - fall)
        self.floor_db = min(level, self.floor_db + self._floor_rise)
        gain_db = min(TARGET_PEAK_DB - self.peak_db, NOISE_CEILING_DB - self.floor_db)
        self.gain_db = max(0.0, gain_db)
        return 10.0 ** (gain_db / 20.0) if gain_db > 0.0 else 1.0
