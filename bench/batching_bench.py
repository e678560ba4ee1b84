"""Does batching requests from different streams pay on this machine? Prints figures.

Loads the engine (embedded tiny.en unless --model) in several layouts of the same cores
and measures decode throughput (requests per second) and the latency of one request:

* ``workers=W threads=T batch=B``: W concurrent engine calls, each with T CPU threads and
  up to B requests batched into one encoder/decoder call.

The requests are utterances of the shared corpus (3-10 s), the same list for every layout,
as partials (greedy) and as finals (beam 5). Each layout is measured ``--repeats`` times,
interleaved with the others so machine noise hits all alike; the median is printed.

Usage: python bench/batching_bench.py [--requests 16] [--repeats 3] [--model tiny.en]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from asr_server.engine.base import DecodeKind, DecodeRequest  # noqa: E402
from asr_server.engine.models import resolve_model  # noqa: E402
from asr_server.engine.whisper import WhisperEngine  # noqa: E402
from tests.helpers import corpus, read_pcm16  # noqa: E402


def utterances(n: int) -> list[np.ndarray]:
    import soxr

    out = []
    for rec in sorted(corpus().values(), key=lambda r: r.id):
        if rec.category != "short_read" or not 3 <= rec.duration_s <= 10:
            continue
        pcm, rate = read_pcm16(rec.path)
        audio = pcm[:, 0].astype(np.float32) / 32768
        out.append(soxr.resample(audio, rate, 16_000).astype(np.float32))
        if len(out) == n:
            break
    return out


def layouts(cores: int) -> list[tuple[int, int, int]]:
    """(workers, threads per call, batch size) using all ``cores``."""
    return [
        (cores, 1, 1),
        (cores, 1, 2),
        (cores, 1, 4),
        (1, cores, 1),
        (1, cores, 2),
        (1, cores, cores * 2),
    ]


def run_layout(engine: WhisperEngine, requests: list[DecodeRequest], batch: int) -> float:
    """Seconds to decode all ``requests`` with the engine's workers, ``batch`` per call."""
    batches = [requests[i : i + batch] for i in range(0, len(requests), batch)]
    with ThreadPoolExecutor(engine.workers) as pool:
        started = time.perf_counter()
        list(pool.map(engine.transcribe, batches))
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()

    audio = utterances(args.requests)
    total_audio = sum(a.size for a in audio) / 16_000
    print(f"{len(audio)} utterances, {total_audio:.1f} s of audio, {args.cores} cores")
    from asr_server.settings import Settings

    model = resolve_model(args.model, Settings().engine.cache_dir)
    engines = {}
    for workers, threads, _batch in layouts(args.cores):
        key = (workers, threads)
        if key not in engines:
            engines[key] = WhisperEngine(
                model,
                device="cpu",
                compute_type="int8",
                cpu_threads=threads,
                workers=workers,
                max_batch_size=64,
                final_beam_size=5,
            )
    for kind in (DecodeKind.PARTIAL, DecodeKind.FINAL):
        requests = [DecodeRequest(a, kind, language="en") for a in audio]
        timings: dict[tuple[int, int, int], list[float]] = {lay: [] for lay in layouts(args.cores)}
        for engine in engines.values():  # warm-up
            engine.transcribe(requests[:1])
        for _ in range(args.repeats):
            for lay in timings:
                engine = engines[lay[:2]]
                timings[lay].append(run_layout(engine, requests, lay[2]))
        print(f"\n{kind.name.lower()}s ({'greedy' if kind is DecodeKind.PARTIAL else 'beam 5'}):")
        print("  workers threads batch   requests/s   audio-s per s   (median of runs)")
        for (workers, threads, batch), runs in timings.items():
            wall = statistics.median(runs)
            print(
                f"  {workers:7d} {threads:7d} {batch:5d}   {len(requests) / wall:10.2f}"
                f"   {total_audio / wall:13.1f}    runs: {', '.join(f'{r:.2f}' for r in runs)}"
            )


if __name__ == "__main__":
    main()
