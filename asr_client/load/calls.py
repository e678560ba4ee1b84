"""Simulated calls for the load generator: recorded utterances laid out like a phone call.

A call is one or two channels of audio at the call's rate. Utterances (clips) follow each
other with pauses drawn at random, as people leave between sentences; in a stereo call the
turns alternate between the agent (channel 0) and the customer (channel 1), each channel
silent while the other speaks. Every turn keeps its reference transcript, so the results
of each channel can be scored. Telephone calls are band-limited to 300-3400 Hz, sampled at
8 kHz and G.711-encoded, as a phone network delivers them.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asr_client.audio_files import load_audio
from asr_server.audio.g711 import alaw_encode, mulaw_encode

#: the longest clip used: longer recordings would make one turn the whole call
MAX_CLIP_S = 30.0
#: the shortest: a clip shorter holds no word, and calls made of it would be thousands of
#: turns (none at all, at --pause 0:0, and building the call would never end)
MIN_CLIP_S = 0.1
#: the most silence after a call's last turn past --duration: enough for the server's
#: endpointing (0.5 s by default) to end that turn as a real call's would
FINAL_PAUSE_S = 1.5
TELEPHONE_BAND_HZ = (300.0, 3400.0)


@dataclass(frozen=True)
class Clip:
    id: str
    samples: np.ndarray  # int16 mono at the call rate
    transcript: str  # "" when unknown


@dataclass(frozen=True)
class Turn:
    channel: int
    start_s: float
    end_s: float
    clip_id: str
    transcript: str


@dataclass(frozen=True)
class Call:
    id: int
    frames: np.ndarray  # int16, (samples, channels), at ``sample_rate_hz``
    sample_rate_hz: int
    encoding: str  # LINEAR16 | MULAW | ALAW
    turns: tuple[Turn, ...]

    @property
    def channels(self) -> int:
        return int(self.frames.shape[1])

    @property
    def duration_s(self) -> float:
        return len(self.frames) / self.sample_rate_hz

    @property
    def speech_s(self) -> float:
        return sum(t.end_s - t.start_s for t in self.turns)

    def reference(self, channel: int) -> str:
        return " ".join(t.transcript for t in self.turns if t.channel == channel and t.transcript)

    @property
    def has_references(self) -> bool:
        return bool(self.turns) and all(t.transcript for t in self.turns)

    def payload(self) -> bytes:
        """The whole call in its wire encoding, interleaved."""
        if self.encoding == "MULAW":
            return mulaw_encode(self.frames.reshape(-1))
        if self.encoding == "ALAW":
            return alaw_encode(self.frames.reshape(-1))
        return np.ascontiguousarray(self.frames, dtype="<i2").tobytes()

    @property
    def bytes_per_frame(self) -> int:
        return self.channels * (2 if self.encoding == "LINEAR16" else 1)


def telephone_band(samples: np.ndarray, rate: int) -> np.ndarray:
    """int16 mono at ``rate`` → int16 at 8 kHz holding only the 300-3400 Hz telephone band."""
    import soxr

    x = samples.astype(np.float64)
    spectrum = np.fft.rfft(x)
    freqs = np.fft.rfftfreq(x.size, 1 / rate)
    low, high = TELEPHONE_BAND_HZ
    spectrum[(freqs < low) | (freqs > high)] = 0
    band = np.fft.irfft(spectrum, n=x.size)
    return np.clip(np.rint(soxr.resample(band, rate, 8000)), -32768, 32767).astype(np.int16)


def prepare_clip(clip_id: str, samples: np.ndarray, rate: int, *, call_rate: int, telephone: bool,
                 transcript: str = "") -> Clip:  # fmt: skip
    """One recording (int16 mono at ``rate``) made ready to be laid into calls."""
    import soxr

    if telephone:
        out = telephone_band(samples, rate)
    elif rate != call_rate:
        resampled = soxr.resample(samples.astype(np.float32) / 32768, rate, call_rate)
        out = np.clip(np.rint(resampled * 32768), -32768, 32767).astype(np.int16)
    else:
        out = samples.astype(np.int16, copy=False)
    if out.size < MIN_CLIP_S * call_rate:
        raise ValueError(
            f"{clip_id}: {out.size / call_rate:.2f} s of audio at {call_rate} Hz;"
            f" a recording needs at least {MIN_CLIP_S:g} s"
        )
    return Clip(clip_id, out, transcript)


def clips_from_manifest(
    directory: Path, *, language: str, call_rate: int, telephone: bool, limit: int = 0
) -> list[Clip]:
    """The mono recordings of ``directory``'s MANIFEST.tsv / manifest.tsv with a transcript
    (columns id, file, duration_s, channels, language, transcript), at most MAX_CLIP_S long."""
    manifest = next(
        (directory / n for n in ("MANIFEST.tsv", "manifest.tsv") if (directory / n).is_file()),
        None,
    )
    if manifest is None:
        raise FileNotFoundError(f"{directory}: no MANIFEST.tsv or manifest.tsv")
    clips = []
    with open(manifest, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            # a row shorter than the header (a trailing empty field stripped) has None
            # for the fields it lacks: read them as empty
            row_language = row.get("language")  # None: no such column, or field
            if language and row_language is not None and row_language != language:
                continue
            duration = row.get("duration_s") or ""
            if int(row.get("channels") or 1) != 1 or float(duration or 0) > MAX_CLIP_S:
                continue
            if not (row.get("transcript") or "").strip():
                continue
            path = directory / row["file"]
            if not path.is_file():  # manifests written relative to their parent
                path = directory.parent / row["file"]
            audio = load_audio(path)
            if not duration and audio.frames.shape[0] > MAX_CLIP_S * audio.sample_rate_hz:
                continue  # no duration given: measured
            clips.append(
                prepare_clip(
                    row["id"],
                    audio.frames[:, 0],
                    audio.sample_rate_hz,
                    call_rate=call_rate,
                    telephone=telephone,
                    transcript=row["transcript"],
                )
            )
            if limit and len(clips) == limit:
                break
    return clips


def clips_from_files(paths: Iterable[str], *, call_rate: int, telephone: bool) -> list[Clip]:
    """Any audio files, without references (channel 0 of each)."""
    clips = []
    for path in paths:
        audio = load_audio(path)
        clips.append(
            prepare_clip(
                Path(path).name,
                audio.frames[:, 0],
                audio.sample_rate_hz,
                call_rate=call_rate,
                telephone=telephone,
            )
        )
    return clips


def build_call(
    call_id: int,
    clips: Sequence[Clip],
    *,
    rng: np.random.Generator,
    duration_s: float,
    channels: int,
    sample_rate_hz: int,
    encoding: str,
    pause_s: tuple[float, float],
    lead_in_s: float = 0.0,
    silent: bool = False,
) -> Call:
    """Turns of random clips separated by pauses until ``duration_s`` is reached (the last
    turn is played whole, then at most FINAL_PAUSE_S of silence); a talking call has at
    least one turn, however short the duration or long the lead-in. ``silent``: the whole
    call is silence (an open line on hold)."""
    rate = sample_rate_hz
    turns: list[Turn] = []
    pieces: list[tuple[int, int, np.ndarray]] = []  # (channel, start sample, samples)
    position = int(lead_in_s * rate)
    last_turn_end = 0
    if not silent:
        order = rng.permutation(len(clips))
        k = 0
        while position < duration_s * rate or not turns:
            clip = clips[order[k % len(order)]]
            channel = k % channels
            pieces.append((channel, position, clip.samples))
            turns.append(
                Turn(
                    channel,
                    position / rate,
                    (position + clip.samples.size) / rate,
                    clip.id,
                    clip.transcript,
                )
            )
            last_turn_end = position + clip.samples.size
            position = last_turn_end + int(rng.uniform(*pause_s) * rate)
            k += 1
    # past the duration only the last turn and a short pause: the whole drawn pause after
    # it (up to --pause's longest, 30 s) made calls mostly silence at long pauses
    tail = min(position, last_turn_end + int(FINAL_PAUSE_S * rate))
    total = max(tail, int(duration_s * rate))
    frames = np.zeros((total, channels), dtype=np.int16)
    for channel, start, samples in pieces:
        frames[start : start + samples.size, channel] = samples
    return Call(call_id, frames, rate, encoding, tuple(turns))
