"""Long-form benchmark: continuous speech, streamed at real-time pace. Prints figures.

The corpus's WER set is short recordings; a lecture, a dictation or a meeting is minutes of
speech whose pauses between sentences (0.2-0.4 s) are shorter than the silence that ends
an utterance. This streams such recordings (by default the 231 s LJ Speech chapter read
aloud, ``concat_ljspeech_LJ001-0001_to_0032``, and the 35 s Harvard sentences) to a fresh
``asr-server``, each on ``--streams`` concurrent streams started up to 3 s apart, and
prints per recording: streaming WER (whisper-normalizer's English normaliser, as
``streaming_bench.py``), the finals per stream (those that end at a speech end and those
of utterances split at a pause), end of speech → final (median / p95), the pause a split
final was cut at → that final (median / p95), and the server's engine time.

With ``--offline`` it also prints offline faster-whisper's WER on the same recording and
model (beam 5, 30 s windows: ``streaming_bench.py``'s baseline), computed after the
streams, on the same machine.

Usage: python bench/longform_bench.py [--streams 4] [--endpointing semantic]
       [--env ASR_STREAMING__X=Y ...] [--server-logs DIR] [--offline]
       [--code /path/to/another/checkout] [--ids REGEX]
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import random
import re
import sys
from pathlib import Path

from streaming_bench import (
    SHARED,
    Item,
    counter,
    engine_times,
    offline_hypotheses,
    pct,
    scored,
    start_server,
    stream_one,
)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from asr_client.scoring import wer  # noqa: E402

DEFAULT_IDS = r"^(concat_ljspeech_LJ001-0001_to_0032|osr_us_000_0034_8k)$"


def long_items(pattern: str) -> list[Item]:
    """The recordings whose ids ``pattern`` matches (a bad pattern, or no corpus, is a
    usage error, said in one line, as streaming_bench's load_items says it)."""
    try:
        wanted = re.compile(pattern)
    except re.error as exc:
        sys.exit(f"--ids {pattern!r} is not a regular expression: {exc}")
    if not (SHARED / "MANIFEST.tsv").is_file():
        sys.exit(f"no shared corpus at {SHARED} (set ASR_SHARED_AUDIO to its folder)")
    with open(SHARED / "MANIFEST.tsv", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [
        Item(r["id"], SHARED / r["file"], float(r["duration_s"]), r["transcript"], r["id"])
        for r in rows
        if wanted.search(r["id"]) and r["transcript"] != "unknown"
    ]


async def delayed(delay_s: float, port: int, item: Item, a: argparse.Namespace):  # type: ignore[no-untyped-def]
    """One real-time stream of ``item``, started ``delay_s`` late (streams that start
    together would all pause, and ask for their finals, at the same moments)."""
    await asyncio.sleep(delay_s)
    return await stream_one(port, item, 1.0, a.chunk_ms, endpointing=a.endpointing)


async def run(a: argparse.Namespace) -> dict[str, object]:
    env = dict(kv.split("=", 1) for kv in a.env)
    figures: dict[str, object] = {
        "streams": a.streams,
        "endpointing": a.endpointing,
        "env": env,
        "code": str(a.code),
    }
    items = long_items(a.ids)
    if not items:
        sys.exit(f"no recording with a transcript matches --ids {a.ids!r}")
    for item in items:
        log = a.server_logs / f"{item.id}.log" if a.server_logs else None
        proc, port, metrics_port = await start_server(
            a.model, [], env=env, code=a.code, log_path=log
        )
        try:
            starts = random.Random(a.streams)
            delays = [0.0] + [starts.uniform(0, 3.0) for _ in range(a.streams - 1)]
            outcomes = await asyncio.gather(*(delayed(d, port, item, a) for d in delays))
            refs, hyps, _ = scored(outcomes)
            latency = [x for o in outcomes for x in o.final_latency]
            split = [x for o in outcomes for x in o.split_latency]
            figures[item.id] = {
                "duration_s": item.duration_s,
                "wer": round(wer(refs, hyps), 4),
                "finals_per_stream": round((len(latency) + len(split)) / a.streams, 1),
                "split_finals_per_stream": round(len(split) / a.streams, 1),
                "final_latency_median_s": round(pct(latency, 50), 3),
                "final_latency_p95_s": round(pct(latency, 95), 3),
                "split_final_latency_median_s": round(pct(split, 50), 3) if split else None,
                "split_final_latency_p95_s": round(pct(split, 95), 3) if split else None,
                "pause_splits": counter(metrics_port, "asr_pause_splits"),
                "carry_fallbacks": counter(metrics_port, "asr_carry_fallbacks"),
                "engine": engine_times(metrics_port),
            }
            if a.show:
                for hyp in hyps:
                    print(f"[{item.id}] {hyp}", file=sys.stderr)
        finally:
            proc.terminate()
            await proc.wait()
        if a.offline:  # after the server has gone: not beside the real-time streams
            offline = offline_hypotheses([item], a.model)[(item.id, 0)]
            figures[item.id]["offline_wer"] = round(wer(refs[:1], [offline]), 4)  # type: ignore[index]
            if a.show:
                print(f"[{item.id}] offline: {offline}", file=sys.stderr)
        print(item.id, json.dumps(figures[item.id]), file=sys.stderr, flush=True)
    return figures


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--streams", type=int, default=1, help="concurrent streams per recording")
    p.add_argument("--ids", default=DEFAULT_IDS, help="recordings (regular expression on ids)")
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--chunk-ms", type=int, default=20)
    p.add_argument("--endpointing", choices=("silence", "semantic"), default="silence")
    p.add_argument("--env", action="append", default=[], help="server setting, KEY=VALUE")
    p.add_argument("--code", type=Path, default=ROOT, help="a checkout to run the server from")
    p.add_argument("--json", type=Path)
    p.add_argument(
        "--server-logs",
        type=Path,
        help="a folder for each recording's server log (with --env ASR_LOG_LEVEL=DEBUG: "
        "every final decode and carry decision, with the texts)",
    )
    p.add_argument("--show", action="store_true", help="print the streams' transcripts")
    p.add_argument("--offline", action="store_true", help="offline faster-whisper's WER too")
    a = p.parse_args()
    figures = asyncio.run(run(a))
    print(json.dumps(figures, indent=2))
    if a.json:
        a.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
