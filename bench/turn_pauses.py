"""The turn model's answers pause by pause, at 16 kHz and as phone audio. Prints figures.

``turn_bench.py`` counts cut-off turns; on 26 turns a count moves by whole turns when one
answer crosses a bar. This asks Smart Turn at the *same* pauses (the 16 kHz voice
detector's, on ``turn_bench.py``'s recordings and reference turn ends) with three versions
of the audio: 16 kHz, the phone line through the server's own decoder and resampler, and
the phone line through soxr's. Per version: how its first answer (``--probe-ms`` into the
pause) and its second (600 ms in, where the pause lasts that long) sit against the
server's bars, at turn ends and inside turns; how many answers lie within 0.01 of the first
bar; and how far the versions' answers differ, in log-odds (docs/end-of-turn.md).

Usage: python bench/turn_pauses.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import turn_bench as tb  # noqa: E402
from streaming_bench import resampled_call, telephone  # noqa: E402

from asr_client.audio_files import to_int16  # noqa: E402
from asr_server.settings import TurnSettings  # noqa: E402

SR = tb.SR
VERSIONS = ("wide", "phone_server", "phone_soxr")


def phone_through_soxr(audio: np.ndarray) -> np.ndarray:
    """The same phone line as ``tb.as_phone_line``, resampled by soxr (HQ, whole file)."""
    wire, _ = telephone(to_int16(audio).reshape(-1, 1), SR)
    return resampled_call(wire, 1)[: audio.size, 0]


def logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = TurnSettings()
    p.add_argument("--probe-ms", type=int, default=defaults.probe_ms)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    whisper, turn_model = tb.load_models()
    first_s, second_s = a.probe_ms / 1000, defaults.second_probe_ms / 1000
    rows = tb.manifest_rows()
    answers: list[dict[str, object]] = []
    for rec in (*tb.RECORDINGS, *tb.SPEAKER_TAGGED):
        row = rows[rec]
        wide = tb.recording_audio(row)
        ends = tb.turn_end_times(wide, tb.reference_turns(row), whisper)
        audio = {
            "wide": wide,
            "phone_server": tb.as_phone_line(wide),
            "phone_soxr": phone_through_soxr(wide),
        }
        turn_start = 0.0
        for pause in tb.label(tb.pauses_of(wide), ends):
            answer: dict[str, object] = {"recording": rec, "at_s": pause.start_s}
            answer["ends_turn"] = pause.ends_turn
            for version, heard in audio.items():
                for ask, at in (("first", first_s), ("second", second_s)):
                    if pause.ends_turn or pause.length_s >= at:
                        answer[f"{version}_{ask}"] = tb.probability_at(
                            turn_model, heard, pause, turn_start, at, []
                        )
            answers.append(answer)
            if pause.ends_turn:
                turn_start = pause.start_s
    figures: dict[str, object] = {
        "turn_ends": sum(bool(x["ends_turn"]) for x in answers),
        "pauses_inside_turns": sum(not x["ends_turn"] for x in answers),
        "first_bar": defaults.threshold,
        "second_bar": defaults.second_threshold,
    }
    for version in VERSIONS:
        per: dict[str, object] = {}
        for group, wanted in (("turn_ends", True), ("inside_turns", False)):
            for ask, bar in (("first", defaults.threshold), ("second", defaults.second_threshold)):
                got = [
                    float(x[f"{version}_{ask}"])  # type: ignore[arg-type]
                    for x in answers
                    if x["ends_turn"] is wanted and f"{version}_{ask}" in x
                ]
                if got:
                    per[f"{group}_{ask}"] = {
                        "asked": len(got),
                        "median": round(statistics.median(got), 3),
                        "reach_bar": round(sum(g >= bar for g in got) / len(got), 3),
                        "at_least_0.9": round(sum(g >= 0.9 for g in got) / len(got), 3),
                        "at_least_0.7": round(sum(g >= 0.7 for g in got) / len(got), 3),
                    }
        firsts = [float(x[f"{version}_first"]) for x in answers if f"{version}_first" in x]  # type: ignore[arg-type]
        per["first_answers_within_0.01_of_bar"] = sum(
            abs(g - defaults.threshold) < 0.01 for g in firsts
        )
        figures[version] = per
    for one, other in (("wide", "phone_server"), ("phone_server", "phone_soxr")):
        pairs = [
            (float(x[f"{one}_first"]), float(x[f"{other}_first"]))  # type: ignore[arg-type]
            for x in answers
            if f"{one}_first" in x and f"{other}_first" in x
        ]
        deltas = [logit(b) - logit(a) for a, b in pairs]
        bar = defaults.threshold
        crossed = sum((a >= bar) != (b >= bar) for a, b in pairs)
        figures[f"first_answer_log_odds_{other}_minus_{one}"] = {
            "median_abs": round(statistics.median(abs(d) for d in deltas), 2),
            "mean": round(statistics.fmean(deltas), 2),
            "stdev": round(statistics.stdev(deltas), 2),
            "crossing_the_first_bar": crossed,
        }
    print(json.dumps(figures, indent=2))
    if a.json:
        a.json.write_text(json.dumps({"figures": figures, "answers": answers}, indent=2))


if __name__ == "__main__":
    main()
