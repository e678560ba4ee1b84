"""End of turn: how often each endpointing cuts a speaker off, against how fast it answers.

Measured the way open end-of-turn benchmarks do it: sweep the decision threshold, then
report the false cut-offs at a latency budget (300 ms) and the latency at 5 % false
cut-offs. The recordings are the multi-sentence English ones of the shared corpus; the
reference turn ends are the ends of their reference sentences ("." "?" "!", or a change of
speaker tag), put in time by aligning the reference words with offline faster-whisper's
word timestamps.

* Every pause is found with the server's own voice detector (webrtc, mode 3, 30 ms
  frames). The pause nearest a reference turn end (within 0.6 s) is that turn's end; every
  other pause of 100 ms or more is inside a turn.
* At a turn end the speaker is taken to wait for an answer (the silence lasts), so what
  matters there is how soon the decision comes: its latency.
* Inside a turn the pause lasts as long as it does in the recording; ending the turn there
  is a false cut-off. A turn is cut off if any of its pauses ends it; the rate is over turns.
* SILENCE (VAD only) with silence T: ends at every pause of T or more; latency T.
* SEMANTIC: Smart Turn v3.2, asked after ``--probe-ms`` of pause with the audio of the turn
  so far (as the server asks it, its last 8 s), ends the turn if its probability reaches
  the threshold (latency = probe + the model's own time), else waits for
  ``--max-silence-ms`` (2 s, the server's default) like SILENCE.

* The server's own policy (``server_defaults``, eager finals, a stream's threshold) asks
  a phone line's speech with its narrowband first threshold: every recording with
  ``--telephone``, and at 16 kHz a recording whose speech the server's bandwidth meter
  finds has nothing above 4 kHz (``phone_line_recordings``; OSR's 8 kHz recording).
  ``server_full_band_threshold`` asks every recording as full-band audio.
* Eager finals (SEMANTIC): sent at the model's first answer in a pause when it is at
  least an eager threshold but below the one that ends the turn; withdrawn at a pause
  inside a turn, confirmed at a turn end (``eager_with_server_probes``).
* ``--punctuation``: Whisper's own guess that the sentence is over, as a second opinion
  at the first ask. The turn so far (its last 9.5 s) is decoded as the server's early
  final is, ``speculate_ms`` into the pause (beam 5); then the decoder's probability of
  ". ? ! ..." or the end of the text right after the last word. The server's two asks
  then end a turn at the first one only if that probability also reaches a gate
  (``punctuation_gates``). Tried 2026-12-03, not taken (docs/end-of-turn.md).

* ``--held-out``: the same figures on recordings the defaults were not chosen on: the
  corpus's one-sentence clips (read English, the other languages Smart Turn knows, each
  channel of the two-speaker stereo clip), each one turn that ends at its last voiced
  frame; every pause inside it is inside the turn. They pause less often than the
  recordings above and are mostly read aloud: compare policies on them, not their rates
  with those above.

Usage: python bench/turn_bench.py [--probe-ms 200] [--punctuation] [--telephone] [--held-out]
       [--json out.json]
"""

from __future__ import annotations

import argparse
import csv
import difflib
import functools
import json
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from streaming_bench import as_server_hears, telephone  # noqa: E402
from word_latency import words_of  # noqa: E402

from asr_client.audio_files import to_int16  # noqa: E402
from asr_server.audio.bandwidth import BandwidthMeter  # noqa: E402
from asr_server.settings import TurnSettings  # noqa: E402
from asr_server.vad.turn import TurnModel, default_model_path  # noqa: E402
from asr_server.vad.webrtc import WebRtcVoiceDetector  # noqa: E402

SHARED = Path(os.environ.get("ASR_SHARED_AUDIO", ROOT.parent / "shared" / "audio"))
SR = 16_000
#: the multi-sentence English recordings (one talker per turn, reference punctuation or
#: speaker tags); LibriSpeech excerpts have neither
RECORDINGS = ("osr_us_000_0034_8k", "concat_ljspeech_LJ001-0001_to_0032", "jfk")
SPEAKER_TAGGED = ("picovoice_diarization_test",)
#: NOTES.tsv categories whose clips are one sentence each (``--held-out``), less those
#: above, those with two sentences and the one whose 29 s are several
HELD_OUT_CATEGORIES = ("short_read", "non_english")
NOT_ONE_SENTENCE = ("kgs_et_test_with_silence", "kgs_et_test_2lauset")
#: one speaker per channel, a sentence each
ONE_SENTENCE_PER_CHANNEL = ("fw_stereo_diarization",)
MIN_PAUSE_S = 0.1
MATCH_S = 0.6
BUDGET_S = 0.3
FALSE_CUTOFF_TARGET = 0.05
#: pauses at which a two-stage policy asks the model again, with a lower threshold
SECOND_PROBES_S = (0.3, 0.4, 0.6)


@dataclass
class Pause:
    start_s: float  # end of the last voiced frame
    length_s: float  # inf at the end of the recording
    turn: int  # index of the turn it is in (or ends)
    ends_turn: bool
    #: the turn model's answers: seconds of pause when it was asked → probability
    asked: dict[float, float] = field(default_factory=dict)
    #: Whisper's probability that the sentence ends at this pause (``--punctuation``)
    sentence_end: float = 1.0
    #: a phone line's speech, to the server: sent at 8 kHz, or with nothing above 4 kHz
    narrowband: bool = False


def line_probes(
    p: Pause, probes: list[tuple[float, float]], narrowband_first: float
) -> list[tuple[float, float]]:
    """The probes as the server asks them at ``p``: on a phone line's speech the first
    ask's bar is at least ``narrowband_first`` (0: as everywhere)."""
    if not p.narrowband or not probes:
        return probes
    (at, threshold), *rest = probes
    return [(at, max(threshold, narrowband_first)), *rest]


def as_band_limited_line(audio: np.ndarray) -> np.ndarray:
    """``--telephone band``: the phone line's band at 8 kHz, as linear PCM (no mu-law)."""
    from asr_client.load.calls import telephone_band

    narrow = telephone_band(to_int16(audio), SR)
    return as_server_hears(narrow.tobytes(), 8000, 1, "LINEAR16")[0][: audio.size]


def as_mulaw_at_16k(audio: np.ndarray) -> np.ndarray:
    """``--telephone mulaw``: mu-law's quantizing alone, at 16 kHz (the full band)."""
    from asr_server.audio.g711 import mulaw_encode

    return as_server_hears(mulaw_encode(to_int16(audio)), SR, 1, "MULAW")[0][: audio.size]


def as_phone_line(audio: np.ndarray) -> np.ndarray:
    """16 kHz audio as the server hears it from a phone line: the 300-3400 Hz band at
    8 kHz, mu-law (streaming_bench's phone line), then decoded and resampled to 16 kHz by
    the server's own decoder."""
    wire, rate = telephone(to_int16(audio).reshape(-1, 1), SR)
    return as_server_hears(wire, rate, 1, "MULAW")[0][: audio.size]


#: --telephone: what the recordings go through, and whether it is sent at 8 kHz
LINES = {
    "phone": (as_phone_line, True),
    "band": (as_band_limited_line, True),
    "mulaw": (as_mulaw_at_16k, False),
}


def reference_turns(row: dict[str, str]) -> list[list[str]]:
    """The reference's turns as word lists: sentences, or speaker-tagged stretches."""
    text = row["transcript"].strip('"')
    if row["id"] in SPEAKER_TAGGED:
        parts = re.split(r"\[spk\d+\]", text)
    else:
        parts = re.split(r"(?<=[.?!])\s+", text)
    return [w for w in (words_of(p) for p in parts) if w]


def turn_end_times(audio: np.ndarray, turns: list[list[str]], model) -> list[float]:  # type: ignore[no-untyped-def]
    """When each reference turn's last word ends, from offline word timestamps."""
    segments, _ = model.transcribe(audio, language="en", word_timestamps=True)
    hyp = [(w, word.end) for s in segments for word in s.words for w in words_of(word.word)[:1]]
    ref = [w for t in turns for w in t]
    matcher = difflib.SequenceMatcher(a=ref, b=[w for w, _ in hyp], autojunk=False)
    end_of = {}
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            end_of[block.a + k] = hyp[block.b + k][1]
    ends, last = [], -1
    for t in turns:
        last += len(t)
        known = [end_of[i] for i in range(last, last - len(t), -1) if i in end_of]
        ends.append(known[0] if known else float("nan"))
    return ends


def pauses_of(audio: np.ndarray) -> list[tuple[float, float]]:
    """(start, length) of every unvoiced run between voiced frames, and the final one."""
    detector = WebRtcVoiceDetector(3)
    frame = detector.frame_samples
    voiced = [
        detector.speech_probability(audio[i : i + frame]) >= 0.5
        for i in range(0, audio.size - frame + 1, frame)
    ]
    out, last_voiced = [], None
    for i, v in enumerate(voiced):
        if v:
            if last_voiced is not None and i - last_voiced - 1 >= 1:
                gap = (i - last_voiced - 1) * frame / SR
                if gap >= MIN_PAUSE_S:
                    out.append(((last_voiced + 1) * frame / SR, gap))
            last_voiced = i
    if last_voiced is not None:
        out.append(((last_voiced + 1) * frame / SR, float("inf")))
    return out


def label(pauses: list[tuple[float, float]], ends: list[float]) -> list[Pause]:
    """Each turn end takes its nearest pause; the others are inside turns."""
    labelled = [Pause(s, n, 0, False) for s, n in pauses]
    for end in ends:
        if np.isnan(end) or not labelled:
            continue
        best = min(labelled, key=lambda p: abs(p.start_s - end))
        if abs(best.start_s - end) <= MATCH_S:
            best.ends_turn = True
    turn = 0
    for p in labelled:
        p.turn = turn
        if p.ends_turn:
            turn += 1
    return [p for p in labelled if p.ends_turn or p.turn < turn]  # drop pauses after the end


def probability_at(
    model: TurnModel,
    audio: np.ndarray,
    pause: Pause,
    turn_start: float,
    after_s: float,
    times: list[float],
) -> float:
    """The model on the turn so far and ``after_s`` of the pause: at a turn end the
    speaker waits (silence); inside a turn, what the recording has there."""
    if pause.ends_turn:
        speech = audio[int(turn_start * SR) : int(pause.start_s * SR)]
        heard = np.concatenate([speech, np.zeros(int(after_s * SR), np.float32)])
    else:
        heard = audio[int(turn_start * SR) : int((pause.start_s + after_s) * SR)]
    t0 = time.perf_counter()
    probability = model.predict(heard).probability
    times.append(time.perf_counter() - t0)
    return probability


SENTENCE_ENDS = (".", "?", "!", "...")


def sentence_end_probability(whisper, audio: np.ndarray) -> float:  # type: ignore[no-untyped-def]
    """How sure Whisper (a faster-whisper ``WhisperModel``) is that the sentence ends
    with ``audio``: decoded as a final is (10 s window, beam 5), then, with its words
    forced, the probability of a closing mark or the end of the text after them."""
    import ctranslate2

    tok, ends = _english_tokenizer(whisper.hf_tokenizer)
    window = np.zeros(max(10 * SR, audio.size), np.float32)
    window[: audio.size] = audio
    mel = whisper.feature_extractor(window)[:, : window.size // 160]
    features = ctranslate2.StorageView.from_array(np.ascontiguousarray(mel[None]))
    encoded = whisper.model.encode(features, to_cpu=False)
    prompt = [*tok.sot_sequence, tok.no_timestamps]
    decoded = whisper.model.generate(encoded, [prompt], beam_size=5, max_length=200)[0]
    words = [i for i in decoded.sequences_ids[0] if i < tok.eot]
    while words and tok.decode(words[-1:]).strip() in (*SENTENCE_ENDS, ",", ""):
        words.pop()
    # beam search returns one step's logits; greedy with the words forced returns each
    # step's (max_length counts the prompt, and more than one step must be left)
    forced = whisper.model.generate(
        encoded,
        [prompt + words],
        beam_size=1,
        max_length=len(prompt) + 2 * len(words) + 6,
        return_logits_vocab=True,
    )[0]
    logits = np.asarray(forced.logits[0][len(words)], np.float64).ravel()
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    return float(probs[ends].sum() + probs[tok.eot])


@functools.cache
def _english_tokenizer(hf_tokenizer):  # type: ignore[no-untyped-def]
    """faster-whisper's English tokenizer, and the ids of its closing marks."""
    from faster_whisper.tokenizer import Tokenizer

    tok = Tokenizer(hf_tokenizer, False, task="transcribe", language="en")
    return tok, [i for i in range(tok.eot) if tok.decode([i]).strip() in SENTENCE_ENDS]


def separation(pauses: list[Pause], score_of) -> float:  # type: ignore[no-untyped-def]
    """The chance that a turn end scores above a pause inside a turn (ties count half):
    1 separates them perfectly, 0.5 not at all."""
    ends = [score_of(p) for p in pauses if p.ends_turn]
    inner = [score_of(p) for p in pauses if not p.ends_turn]
    pairs = [(e > i) + 0.5 * (e == i) for e in ends for i in inner]
    return round(sum(pairs) / len(pairs), 3)


#: the server's voice detector frame: silence_ms is counted in whole frames of it
FRAME_S = 0.03


def sweep_silence(pauses: list[Pause], n_turns: int) -> list[dict[str, float]]:
    """Each silence_ms as the server applies it: round(silence_ms / 30) silent frames
    (250 ms is 8 frames, 240 ms), every turn end answered that long after it."""
    rows = []
    for t_ms in range(100, 2001, 50):
        t = max(1, round(t_ms / 1000 / FRAME_S)) * FRAME_S
        cut = {p.turn for p in pauses if not p.ends_turn and p.length_s >= t}
        rows.append(
            {
                "silence_ms": t_ms,
                "false_cutoff": len(cut) / n_turns,
                "latency_s": round(t, 3),
                "latency_p90_s": round(t, 3),
                "latency_mean_s": round(t, 3),
            }
        )
    return rows


INF = float("inf")
THRESHOLDS = [*np.round(np.arange(0.05, 0.96, 0.05), 2), 0.97, 0.98, 0.99, 0.995, 0.999]


def ends_at(
    p: Pause,
    probes: list[tuple[float, float]],
    model_s: float,
    max_silence_s: float,
    first_gate: float = 0.0,
    narrowband_first: float = 0.0,
) -> float:
    """When SEMANTIC ends the turn at pause ``p`` (inf: it does not), asking the model at
    each ``(pause, threshold)`` of ``probes`` (``line_probes``). Its answer comes
    ``model_s`` later and counts only if the pause still lasts (as in the server); then
    the longest pause ends it. At a turn end the speaker waits, however short the pause in
    the recording. The first ask also needs Whisper's sentence end probability to reach
    ``first_gate``."""
    length = INF if p.ends_turn else p.length_s
    for k, (at, threshold) in enumerate(line_probes(p, probes, narrowband_first)):
        decided = at + model_s
        gated = k == 0 and p.sentence_end < first_gate
        if length >= decided and p.asked.get(at, 0.0) >= threshold and not gated:
            return decided
    return max_silence_s if length >= max_silence_s else INF


def score(
    pauses: list[Pause],
    n_turns: int,
    probes: list[tuple[float, float]],
    model_s: float,
    max_silence_s: float,
    first_gate: float = 0.0,
    narrowband_first: float = 0.0,
) -> dict[str, float]:
    """False cut-offs (share of turns) and the latency at turn ends, of one policy."""
    decide = functools.partial(
        ends_at,
        probes=probes,
        model_s=model_s,
        max_silence_s=max_silence_s,
        first_gate=first_gate,
        narrowband_first=narrowband_first,
    )
    cut = {p.turn for p in pauses if not p.ends_turn and decide(p) < INF}
    latencies = [decide(p) for p in pauses if p.ends_turn]
    return {
        "false_cutoff": round(len(cut) / n_turns, 4),
        "latency_s": round(statistics.median(latencies), 3),
        "latency_p90_s": round(float(np.percentile(latencies, 90)), 3),
        "latency_mean_s": round(statistics.fmean(latencies), 3),
    }


def sweep_semantic(
    pauses: list[Pause], n_turns: int, probe_s: float, model_s: float, max_silences: list[float]
) -> list[dict[str, float]]:
    """One ask at the probe, each threshold, then each longest pause."""
    return [
        {"threshold": float(threshold), "max_silence_ms": round(max_silence_s * 1000)}
        | score(pauses, n_turns, [(probe_s, threshold)], model_s, max_silence_s)
        for max_silence_s in max_silences
        for threshold in THRESHOLDS
    ]


def sweep_two_stage(
    pauses: list[Pause], n_turns: int, probe_s: float, model_s: float, max_silence_s: float
) -> list[dict[str, float]]:
    """Ask at the probe with a high threshold; if not sure, ask again later in the pause
    with a lower one; then the longest pause."""
    return [
        {"threshold": first, "second_probe_ms": round(later * 1000), "second_threshold": second}
        | score(pauses, n_turns, [(probe_s, first), (later, second)], model_s, max_silence_s)
        for first in (0.9, 0.95, 0.97, 0.98, 0.99)
        for later in SECOND_PROBES_S
        for second in (0.3, 0.5, 0.7, 0.9)  # (the server's defaults are among these)
    ]


STREAM_THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995)


def sweep_stream_threshold(
    pauses: list[Pause],
    n_turns: int,
    server_probes: list[tuple[float, float]],
    model_s: float,
    max_silence_s: float,
    narrowband_first: float,
) -> list[dict[str, float]]:
    """A stream's own ``turn_threshold`` (EndpointingConfig) as the server applies it: the
    second ask's threshold, and the first ask's where it is above the server's."""
    (first_s, first), (second_s, _) = server_probes
    return [
        {"turn_threshold": t}
        | score(
            pauses,
            n_turns,
            [(first_s, max(first, t)), (second_s, t)],
            model_s,
            max_silence_s,
            narrowband_first=narrowband_first,
        )
        for t in STREAM_THRESHOLDS
    ]


EAGER_THRESHOLDS = (0.1, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95)


def sweep_eager(
    pauses: list[Pause],
    probes: list[tuple[float, float]],
    model_s: float,
    max_silence_s: float,
    narrowband_first: float,
) -> list[dict[str, float]]:
    """Eager finals in SEMANTIC mode: an eager result goes out at the model's first answer
    in a pause when that answer reaches the eager threshold but not the one that ends the
    turn. Inside a turn it is withdrawn when speech resumes; at a turn end the final
    confirms it, later by ``lead`` (when the turn is decided minus the first answer)."""
    probe = probes[0][0]
    answered = probe + model_s
    rows = []
    for eager in EAGER_THRESHOLDS:
        withdrawn = confirmed = 0
        leads = []
        for p in pauses:
            first = p.asked.get(probe, 0.0)
            threshold = line_probes(p, probes, narrowband_first)[0][1]
            if not eager <= first < threshold:
                continue
            if p.ends_turn:
                confirmed += 1
                ends = ends_at(p, probes, model_s, max_silence_s, narrowband_first=narrowband_first)
                leads.append(ends - answered)
            elif p.length_s >= answered:
                withdrawn += 1
        sent = withdrawn + confirmed
        rows.append(
            {
                "eager_threshold": eager,
                "sent": sent,
                "withdrawn": withdrawn,
                "withdrawn_share": round(withdrawn / sent, 3) if sent else 0.0,
                "turn_ends_with_eager": confirmed,
                "lead_median_s": round(statistics.median(leads), 3) if leads else 0.0,
            }
        )
    return rows


def at_budget(rows: list[dict[str, float]], latency: str = "latency_s") -> dict[str, float] | None:
    """The fewest false cut-offs with a median latency (or ``latency``: p90, mean) within
    the budget. The median lets up to half the turn ends wait for max_silence."""
    ok = [r for r in rows if r[latency] <= BUDGET_S + 1e-9]
    return min(ok, key=lambda r: (r["false_cutoff"], r[latency])) if ok else None


def at_target(rows: list[dict[str, float]]) -> dict[str, float] | None:
    """The lowest median latency with at most 5 % false cut-offs."""
    ok = [r for r in rows if r["false_cutoff"] <= FALSE_CUTOFF_TARGET + 1e-9]
    return min(ok, key=lambda r: (r["latency_s"], r["false_cutoff"])) if ok else None


def load_models():  # type: ignore[no-untyped-def]
    """tiny.en (faster-whisper, for the turn ends' word timestamps) and the turn model."""
    from faster_whisper import WhisperModel

    from asr_server.engine.models import resolve_model

    cache = Path.home() / ".cache" / "streamasr"
    whisper = WhisperModel(
        resolve_model("tiny.en", cache).path_or_id, device="cpu", compute_type="int8"
    )
    return whisper, TurnModel(default_model_path(cache))


def manifest_rows() -> dict[str, dict[str, str]]:
    with open(SHARED / "MANIFEST.tsv", newline="") as f:
        return {r["id"]: r for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)}


def recording_audio(row: dict[str, str]) -> np.ndarray:
    """A manifest row's recording, its channels mixed, at 16 kHz."""
    data, sr = sf.read(str(SHARED / row["file"]), dtype="float32", always_2d=True)
    return soxr.resample(data.mean(axis=1), sr, SR).astype(np.float32)


def phone_band_only(audio: np.ndarray) -> bool:
    """The server's bandwidth meter on the recording's speech (its loud stretches)."""
    frames = audio[: audio.size // 320 * 320].reshape(-1, 320)
    level = np.abs(frames).max(axis=1)
    meter = BandwidthMeter()
    meter.add(frames[level > 0.05 * level.max()].ravel())
    return meter.narrowband


def recordings(held_out: bool, rows, whisper):  # type: ignore[no-untyped-def]
    """(name, 16 kHz audio, reference turn ends) of each recording measured; a held-out
    clip's one turn end is left empty: its last voiced frame, as the detector hears it."""
    if held_out:
        return [(rec, audio, []) for rec, audio in held_out_clips(rows)]
    out = []
    for rec in (*RECORDINGS, *SPEAKER_TAGGED):
        audio = recording_audio(rows[rec])
        ends = turn_end_times(audio, reference_turns(rows[rec]), whisper)  # full band
        out.append((rec, audio, ends))
    return out


def held_out_clips(rows: dict[str, dict[str, str]]) -> list[tuple[str, np.ndarray]]:
    """``--held-out``: (name, 16 kHz audio) of each one-sentence clip the defaults were not
    chosen on; a clip's one turn ends at its last voiced frame."""
    with open(SHARED / "NOTES.tsv", newline="") as f:
        notes = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    chosen_on = {*RECORDINGS, *SPEAKER_TAGGED}
    clips = []
    for note in notes:
        rec = note["id"]
        if (
            note["category"] not in HELD_OUT_CATEGORIES
            or rec in chosen_on
            or rec in NOT_ONE_SENTENCE
            or rec.startswith("ljspeech_")  # the parts of concat_ljspeech_*
        ):
            continue
        clips.append((rec, recording_audio(rows[rec])))
    for rec in ONE_SENTENCE_PER_CHANNEL:
        data, sr = sf.read(str(SHARED / rows[rec]["file"]), dtype="float32", always_2d=True)
        for ch in range(data.shape[1]):
            clips.append((f"{rec}:{ch}", soxr.resample(data[:, ch], sr, SR).astype(np.float32)))
    return clips


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    defaults = TurnSettings()
    p.add_argument(
        "--probe-ms", type=int, default=defaults.probe_ms, help="pause before the model is asked"
    )
    p.add_argument("--max-silence-ms", type=int, default=defaults.max_silence_ms)
    p.add_argument(
        "--punctuation",
        action="store_true",
        help="also gate the first ask on Whisper's sentence end probability (slower)",
    )
    p.add_argument(
        "--telephone",
        nargs="?",
        const="phone",
        choices=sorted(LINES),
        help="the voice detector and the turn model hear each recording as a phone line "
        "(300-3400 Hz, 8 kHz mu-law); the reference turn ends stay those of the original. "
        "'band': the band at 8 kHz without mu-law; 'mulaw': mu-law alone at 16 kHz",
    )
    p.add_argument(
        "--held-out",
        action="store_true",
        help="the one-sentence clips instead of the multi-sentence recordings (see above)",
    )
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    whisper, turn_model = load_models()
    probe_s = a.probe_ms / 1000
    rows = manifest_rows()
    all_pauses: list[Pause] = []
    n_turns = 0
    model_times = []
    per_recording = {}
    line, sent_at_8k = LINES[a.telephone] if a.telephone else (None, False)
    for rec, audio, ends in recordings(a.held_out, rows, whisper):
        if line is not None:
            audio = line(audio)
        heard = pauses_of(audio)
        pauses = label(heard, ends or [heard[-1][0]])  # (held out: its last voiced frame)
        narrowband = sent_at_8k or phone_band_only(audio)
        for pause in pauses:
            pause.narrowband = narrowband
        turn_start = 0.0
        for pause in pauses:
            ask = functools.partial(probability_at, turn_model, audio, pause, turn_start)
            for at in (probe_s, *SECOND_PROBES_S):
                if pause.ends_turn or pause.length_s >= at:  # (shorter: never asked)
                    pause.asked[at] = ask(at, model_times)
            if a.punctuation:  # the utterance so far, 60 ms into the pause
                heard_from = max(turn_start, pause.start_s - 9.5)
                heard_to = pause.start_s + defaults.speculate_ms / 1000
                pause.sentence_end = sentence_end_probability(
                    whisper, audio[int(heard_from * SR) : int(heard_to * SR)]
                )
            pause.turn += n_turns
            if pause.ends_turn:
                turn_start = pause.start_s
        found = sum(p.ends_turn for p in pauses)
        per_recording[rec] = {
            "turns": len(ends) if ends else 1,
            "narrowband": narrowband,
            "turn_ends_found": found,
            "pauses_inside_turns": sum(not p.ends_turn for p in pauses),
        }
        n_turns += found
        all_pauses += pauses
    model_s = statistics.median(model_times)
    silence = sweep_silence(all_pauses, n_turns)
    # at the server's longest pause (max_silence_ms), and with shorter ones: SEMANTIC
    # with an earlier silence fallback
    semantic = sweep_semantic(all_pauses, n_turns, probe_s, model_s, [a.max_silence_ms / 1000])
    combined = sweep_semantic(
        all_pauses, n_turns, probe_s, model_s, [x / 1000 for x in range(400, 2001, 100)]
    )
    two_stage = sweep_two_stage(all_pauses, n_turns, probe_s, model_s, a.max_silence_ms / 1000)
    # the server's thresholds: on a phone line's speech (sent at 8 kHz, or measured to
    # have nothing above 4 kHz) the first ask's is the narrowband one
    server_probes = [
        (probe_s, defaults.threshold),
        (defaults.second_probe_ms / 1000, defaults.second_threshold),
    ]
    narrowband_first = defaults.narrowband_threshold
    max_silence_s = a.max_silence_ms / 1000

    def server_row(narrowband_first: float) -> dict[str, float] | None:
        if a.probe_ms != defaults.probe_ms:
            return None
        return {"narrowband_threshold": narrowband_first} | score(
            all_pauses,
            n_turns,
            server_probes,
            model_s,
            max_silence_s,
            narrowband_first=narrowband_first,
        )

    eager = sweep_eager(all_pauses, server_probes, model_s, max_silence_s, narrowband_first)
    stream_thresholds = sweep_stream_threshold(
        all_pauses, n_turns, server_probes, model_s, max_silence_s, narrowband_first
    )
    gated = (
        [
            {"first_gate": gate}
            | score(
                all_pauses,
                n_turns,
                server_probes,
                model_s,
                max_silence_s,
                gate,
                narrowband_first=narrowband_first,
            )
            for gate in (0.0, 0.3, 0.5, 0.7, 0.8, 0.85, 0.9, 0.95)
        ]
        if a.punctuation
        else None
    )
    figures = {
        "recordings": per_recording,
        "turns": n_turns,
        "pauses_inside_turns": sum(not p.ends_turn for p in all_pauses),
        "probe_ms": a.probe_ms,
        "telephone": a.telephone,
        "held_out": a.held_out,
        "turn_model_median_ms": round(model_s * 1000, 1),
        "silence_at_300ms": at_budget(silence),
        "semantic_at_300ms": at_budget(semantic),
        # the same budget on the mean and on the p90 of the latency at turn ends (a policy
        # within it on the median may hold many turn ends until max_silence)
        "semantic_at_300ms_mean": at_budget(semantic, "latency_mean_s"),
        "semantic_at_300ms_p90": at_budget(semantic, "latency_p90_s"),
        "silence_at_5pct": at_target(silence),
        "semantic_at_5pct": at_target(semantic),
        "semantic_with_shorter_max_silence_at_5pct": at_target(combined),
        "phone_line_recordings": [r for r, v in per_recording.items() if v["narrowband"]],
        "server_defaults": server_row(narrowband_first),
        # phone lines asked as full-band audio is (before the narrowband threshold)
        "server_full_band_threshold": server_row(0.0),
        "two_stage_at_300ms": at_budget(two_stage),
        "two_stage_at_5pct": at_target(two_stage),
        "eager_with_server_probes": eager,
        "stream_turn_threshold": stream_thresholds,
        "punctuation_gates": gated,
        "turn_end_above_inner_pause": {
            "turn_model_first_ask": separation(all_pauses, lambda p: p.asked.get(probe_s, 0.0)),
            "whisper_punctuation": separation(all_pauses, lambda p: p.sentence_end),
        }
        if a.punctuation
        else None,
        "silence_sweep": silence,
        "semantic_sweep": semantic,
        "combined_sweep": combined,
        "two_stage_sweep": two_stage,
    }
    print(json.dumps({k: v for k, v in figures.items() if not k.endswith("_sweep")}, indent=2))
    if a.json:
        a.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
