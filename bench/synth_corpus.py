"""A synthetic held-out corpus: speech the heuristics were never looked at on.

Every accuracy rule in the session (the carry and its checks, the split, the loop
trims) was found and measured on ``../shared/audio``. Those are few recordings, and the
product is judged on others; a rule that only fits them would show as streaming losing
to offline on speech they do not have. This script writes such speech with espeak-ng
(``apt install espeak-ng``): passages of two to four sentences, each phrase synthesized
alone and joined with pauses drawn at random, 0.25-0.9 s inside a sentence (where a
streaming server cuts and offline decoding does not) and 0.5-1.3 s between sentences;
five voices and variants, three speaking rates, light noise. It is robotic speech, so
its WER says little by itself; what it is for is the *difference* between streaming and
offline on the same files, which the benchmarks report.

It writes a directory laid out like ``../shared/audio`` (``MANIFEST.tsv``, ``NOTES.tsv``,
``audio/``), so every benchmark that reads ``ASR_SHARED_AUDIO`` runs on it unchanged:

    python bench/synth_corpus.py /tmp/synth
    ASR_SHARED_AUDIO=/tmp/synth python bench/accuracy_breakdown.py --variant carried_split6
    ASR_SHARED_AUDIO=/tmp/synth python bench/streaming_bench.py

The same seed writes the same corpus (for a given espeak-ng).
"""

from __future__ import annotations

import argparse
import csv
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

RATE = 16_000

#: passages written for this corpus; "|" marks a pause inside a sentence
PASSAGES = [
    "The ferry leaves at seven | so we should pack the car tonight. "
    "If the weather turns | we can always take the bridge instead.",
    "Before you sign anything | read the second page carefully. "
    "It says the deposit is returned | only if the flat is left clean.",
    "My grandmother grew tomatoes | beans and a row of sunflowers. "
    "Every summer | the birds ate more of the seeds than we did.",
    "The library will close early on Friday | because of the staff meeting. "
    "Books that are due that day | can be returned on Monday without a fine.",
    "When the engine started making that noise | I pulled over at once. "
    "The mechanic said | it was only a loose belt.",
    "Please send me the report | along with last quarter's figures. "
    "I want to compare them | before the board meets on Thursday.",
    "The river rose | almost two metres overnight. "
    "Farmers moved their cattle to higher ground | and waited for the rain to stop.",
    "She learned to play the violin | when she was nine years old. "
    "Now she teaches | a class of twenty students every week.",
    "Turn left at the church | then follow the road past the school. "
    "Our house is the third one | with a green door and a small garden.",
    "The museum has a new exhibition | about the history of clocks. "
    "Some of them are | more than three hundred years old. "
    "One still keeps perfect time.",
    "I called the bank this morning | but nobody answered. "
    "I will try again after lunch | and if that fails | I will go there myself.",
    "Our train was delayed | by almost an hour. "
    "By the time we arrived | the concert had already started.",
    "The recipe needs two cups of flour | a pinch of salt | and three eggs. "
    "Mix everything slowly | or the batter will turn lumpy.",
    "Doctor Patel will see you now | in room number four. "
    "Bring your records | and a list of the medicines you take.",
    "Last winter was the coldest | anyone in the village could remember. "
    "The lake froze solid | and children skated on it for weeks.",
    "We need to finish the roof | before the autumn storms arrive. "
    "Otherwise | the water will ruin the new kitchen.",
    "He opened the letter | and read it twice without a word. "
    "Then he folded it | put it in his pocket | and walked out into the rain.",
    "The company was founded in nineteen eighty four | by two brothers from Ohio. "
    "Today it employs | over five thousand people in twelve countries.",
]

#: (espeak-ng voice, words per minute)
VOICES = [
    ("en-us", 160),
    ("en-gb", 150),
    ("en-us+f3", 175),
    ("en-gb-x-rp+m3", 140),
    ("en-029+f2", 165),
    ("en-gb-scotland", 155),
]


def synthesize(text: str, voice: str, wpm: int, work: Path) -> np.ndarray:
    """One phrase at 16 kHz, espeak-ng's leading and trailing silence trimmed."""
    out = work / "phrase.wav"
    subprocess.run(
        ["espeak-ng", "-v", voice, "-s", str(wpm), "-w", str(out), text],
        check=True,
        capture_output=True,
    )
    audio, rate = sf.read(out, dtype="float32")
    audio = np.asarray(soxr.resample(audio, rate, RATE), np.float32)
    loud = np.flatnonzero(np.abs(audio) > 0.01)
    return audio[loud[0] : loud[-1] + 1] if loud.size else audio


def passage_audio(
    passage: str, voice: str, wpm: int, rng: np.random.Generator, work: Path
) -> np.ndarray:
    pieces = [np.zeros(int(RATE * rng.uniform(0.3, 0.6)), np.float32)]
    sentences = [s.strip() for s in passage.replace(". ", ".\n").splitlines() if s.strip()]
    for i, sentence in enumerate(sentences):
        phrases = [p.strip() for p in sentence.split("|")]
        for j, phrase in enumerate(phrases):
            pieces.append(synthesize(phrase, voice, wpm, work))
            last_phrase = j == len(phrases) - 1
            if not last_phrase:
                pause = rng.uniform(0.25, 0.9)
            elif i < len(sentences) - 1:
                pause = rng.uniform(0.5, 1.3)
            else:
                pause = rng.uniform(0.6, 1.0)
            pieces.append(np.zeros(int(RATE * pause), np.float32))
    audio = np.concatenate(pieces)
    audio *= 0.5 / max(1e-6, float(np.abs(audio).max()))
    # a quiet room: noise about 40 dB below the speech's peak
    audio += rng.normal(0, 0.005, audio.size).astype(np.float32)
    return np.clip(audio, -1, 1)


def reference(passage: str) -> str:
    return " ".join(passage.replace("|", " ").replace(".", " ").split()).upper()


def is_synthetic_corpus(folder: Path) -> bool:
    """``folder`` is empty, or holds what this script writes and nothing else."""
    if not folder.is_dir():
        return False
    entries = {p.name for p in folder.iterdir()}
    if not entries:
        return True
    made = {"audio", "MANIFEST.tsv", "NOTES.tsv"}
    return (
        entries <= made
        and all(p.name.startswith("synth_") for p in (folder / "audio").glob("*"))
        and "bench/synth_corpus.py" in (folder / "MANIFEST.tsv").read_text(errors="replace")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "out", type=Path, help="directory to write: new, empty, or an earlier synthetic corpus"
    )
    parser.add_argument("--seed", type=int, default=20261205)
    args = parser.parse_args()
    # only a corpus this script made is replaced: `synth_corpus.py .` from the checkout
    # deleted the checkout, and any folder given by mistake went before a word was said
    if args.out.exists() and not is_synthetic_corpus(args.out):
        sys.exit(f"{args.out} is not empty and not a corpus this script made: not replaced")
    if shutil.which("espeak-ng") is None:
        sys.exit("espeak-ng is not installed (apt install espeak-ng)")
    rng = np.random.default_rng(args.seed)
    if args.out.exists():
        shutil.rmtree(args.out)
    (args.out / "audio").mkdir(parents=True)
    manifest: list[dict[str, object]] = []
    notes: list[dict[str, object]] = []
    total_s = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for n, passage in enumerate(PASSAGES):
            voice, wpm = VOICES[n % len(VOICES)]
            audio = passage_audio(passage, voice, wpm, rng, Path(tmp))
            name = f"synth_{n:02d}"
            path = args.out / "audio" / f"{name}.wav"
            sf.write(path, (audio * 32767).astype(np.int16), RATE, subtype="PCM_16")
            total_s += audio.size / RATE
            manifest.append(
                {
                    "id": name,
                    "file": f"audio/{name}.wav",
                    "duration_s": f"{audio.size / RATE:.3f}",
                    "sample_rate": RATE,
                    "channels": 1,
                    "language": "en",
                    "license": "generated (espeak-ng, GPL-3.0 tool; text written for streamasr)",
                    "source_repo": "streamasr",
                    "source_path": "bench/synth_corpus.py",
                    "source_commit": f"seed {args.seed}, voice {voice}, {wpm} wpm",
                    "transcript": reference(passage),
                }
            )
            notes.append(
                {
                    "id": name,
                    "category": "synthetic_phrases",
                    "transcript_source": "the text synthesized",
                    "caveats": f"espeak-ng {voice} at {wpm} wpm",
                }
            )
    for filename, rows in (("MANIFEST.tsv", manifest), ("NOTES.tsv", notes)):
        with open(args.out / filename, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter="\t")
            writer.writeheader()
            writer.writerows(rows)
    print(f"{len(manifest)} recordings, {total_s:.0f} s, in {args.out}")


if __name__ == "__main__":
    main()
