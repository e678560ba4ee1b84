"""Does batching requests from different streams pay on this machine? Prints figures.

Loads the engine (embedded tiny.en unless --model) in several layouts of the same cores
and measures decode throughput (requests per second) and the latency of one request:

* ``workers=W threads=T batch=B``: W concurrent engine calls, each with T CPU threads and
  up to B requests batched into one encoder/decoder call.
* one request alone, for each number of threads per call: the median time of a request
  decoded by itself (requests one after another, 50 ms apart), and the process's CPU use
  in those 50 ms gaps (an OpenMP team busy-waiting between calls would show there; numpy's
  BLAS once did, docs/gpu.md).

The requests are utterances of the shared corpus (3-10 s), the same list for every layout,
as partials (greedy) and as finals (beam 5). Each layout is measured ``--repeats`` times,
interleaved with the others so machine noise hits all alike; the median is printed.

``--device cuda`` measures the server's GPU layout instead (one engine call at a time,
float16): batches of 1-32 requests, finals with a 10 s and a 30 s shortest window, and how
many texts differ from the same request decoded alone (on a GPU a batch mixes windows,
padded to its longest: ``WhisperEngine.batch_key``).

``--composition`` instead compares how batches are composed, in the default layout (a
single-threaded call per core, batches of up to 4): a queue like a loaded server's,
partials of 1-15 s cut from a long reading, decoded in queue order four at a time (each
batch padded to its longest window, as the server did until 2026-12-03) or as the
scheduler now composes them (the oldest request and the next ones of its batch key, the
same encoder window). It prints the throughput and how many texts differ from the same
request decoded alone.

Usage: python bench/batching_bench.py [--requests 16] [--repeats 3] [--model tiny.en]
       python bench/batching_bench.py --composition [--requests 48]
       python bench/batching_bench.py --device cuda [--requests 32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from asr_server.engine.base import DecodeKind, DecodeRequest  # noqa: E402
from asr_server.engine.cpu import usable_cores  # noqa: E402
from asr_server.engine.models import resolve_model  # noqa: E402
from asr_server.engine.whisper import WhisperEngine  # noqa: E402
from tests.helpers import corpus, first_channel  # noqa: E402


def utterances(n: int) -> list[np.ndarray]:
    out = []
    for rec in sorted(corpus().values(), key=lambda r: r.id):
        if rec.category != "short_read" or not 3 <= rec.duration_s <= 10:
            continue
        out.append(first_channel(rec.path))
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


def alone(
    engine: WhisperEngine, requests: list[DecodeRequest], repeats: int
) -> tuple[float, float]:
    """Median seconds of one request decoded by itself, and the CPU cores the process used
    in the 50 ms pauses between requests."""
    walls, idle_cpu, idle_wall = [], 0.0, 0.0
    for _ in range(repeats):
        for request in requests:
            started = time.perf_counter()
            engine.transcribe([request])
            walls.append(time.perf_counter() - started)
            cpu, started = time.process_time(), time.perf_counter()
            time.sleep(0.05)
            idle_cpu += time.process_time() - cpu
            idle_wall += time.perf_counter() - started
    return statistics.median(walls), idle_cpu / idle_wall


def partials_of_a_reading(n: int, seed: int = 1) -> list[DecodeRequest]:
    """``n`` partials of 1-15 s at random places in the corpus's long LJ Speech reading."""
    reading = first_channel(corpus()["concat_ljspeech_LJ001-0001_to_0032"].path)
    rng = np.random.default_rng(seed)
    requests = []
    for _ in range(n):
        length = int(rng.uniform(1.0, 15.0) * 16_000)
        start = int(rng.integers(0, reading.size - length))
        audio = reading[start : start + length].astype(np.float32)
        requests.append(DecodeRequest(audio, DecodeKind.PARTIAL, language="en"))
    return requests


def batches_in_queue_order(engine: WhisperEngine, queue: list[DecodeRequest], size: int):  # type: ignore[no-untyped-def]
    return [queue[i : i + size] for i in range(0, len(queue), size)]


def batches_by_key(engine: WhisperEngine, queue: list[DecodeRequest], size: int):  # type: ignore[no-untyped-def]
    """As the scheduler takes them: the oldest request, then the next ones of its key."""
    waiting, batches = list(queue), []
    while waiting:
        key = engine.batch_key(waiting[0])
        batch = [r for r in waiting if engine.batch_key(r) == key][:size]
        taken = {id(r) for r in batch}
        waiting = [r for r in waiting if id(r) not in taken]
        batches.append(batch)
    return batches


def compare_composition(engine: WhisperEngine, n: int, repeats: int) -> None:
    queue = partials_of_a_reading(n)
    alone = [engine.transcribe([r])[0].text for r in queue]
    print(f"{n} partials of 1-15 s, {sum(r.audio.size for r in queue) / 16_000:.0f} s of audio")
    print("  batches           calls  requests/s (median)  texts unlike alone   runs")
    walls: dict[str, list[float]] = {"queue order": [], "one key each": []}
    composers = {"queue order": batches_in_queue_order, "one key each": batches_by_key}
    differ = {}
    for _ in range(repeats):
        for name, compose in composers.items():
            batches = compose(engine, queue, 4)
            with ThreadPoolExecutor(engine.workers) as pool:
                started = time.perf_counter()
                results = list(pool.map(engine.transcribe, batches))
                walls[name].append(time.perf_counter() - started)
            texts = {
                id(r): h.text
                for batch, hyps in zip(batches, results, strict=True)
                for r, h in zip(batch, hyps, strict=True)
            }
            unlike = sum(texts[id(r)] != a for r, a in zip(queue, alone, strict=True))
            differ[name] = (unlike, len(batches))
    for name, runs in walls.items():
        print(
            f"  {name:16s} {differ[name][1]:6d}  {n / statistics.median(runs):19.2f}"
            f"  {differ[name][0]:18d}   {', '.join(f'{r:.2f}' for r in runs)}"
        )


GPU_BATCH_SIZES = (1, 2, 4, 8, 16, 32)


def gpu_batches(model_name: str, n: int, repeats: int) -> None:
    """The CUDA layout: requests/s and time per engine call against the batch size."""
    import gc

    from asr_server.settings import Settings

    model = resolve_model(model_name, Settings().engine.cache_dir)
    distinct = utterances(16)
    audio = [distinct[i % len(distinct)] for i in range(n)]
    total_audio = sum(a.size for a in audio) / 16_000
    print(f"{n} utterances ({len(distinct)} distinct), {total_audio:.1f} s of audio, cuda")
    print("  kind     window  batch  requests/s  ms per call  audio-s per s  unlike alone  runs")
    for final_window in (10.0, 30.0):
        engine = WhisperEngine(
            model,
            device="cuda",
            compute_type="float16",
            workers=1,
            max_batch_size=max(GPU_BATCH_SIZES),
            final_beam_size=5,
            final_min_window_s=final_window,
        )
        # a partial's window does not depend on the final's: measured once
        kinds = [DecodeKind.PARTIAL] if final_window == 10.0 else []
        for kind in [*kinds, DecodeKind.FINAL]:
            requests = [DecodeRequest(a, kind, language="en") for a in audio]
            engine.transcribe(requests[:1])  # warm-up: CUDA kernels, allocator
            alone = [engine.transcribe([r])[0].text for r in requests]
            window = "5+" if kind is DecodeKind.PARTIAL else f"{final_window:.0f}"
            for size in GPU_BATCH_SIZES:
                runs, texts = [], []
                for _ in range(repeats):
                    started = time.perf_counter()
                    texts = [
                        h.text
                        for i in range(0, n, size)
                        for h in engine.transcribe(requests[i : i + size])
                    ]
                    runs.append(time.perf_counter() - started)
                wall = statistics.median(runs)
                calls = -(-n // size)
                unlike = sum(t != a for t, a in zip(texts, alone, strict=True))
                print(
                    f"  {kind.name.lower():8s} {window:>6s} {size:6d}  {n / wall:10.1f}"
                    f"  {1000 * wall / calls:11.1f}  {total_audio / wall:13.1f}  {unlike:12d}"
                    f"  {', '.join(f'{r:.2f}' for r in runs)}"
                )
        del engine
        gc.collect()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, help="16, or 48 with --composition")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument(
        "--cores", type=int, default=usable_cores(), help="the server's count by default"
    )
    parser.add_argument("--composition", action="store_true", help="compare batch composition")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    if args.device == "cuda":
        gpu_batches(args.model, args.requests or 32, args.repeats)
        return
    if args.composition:
        from asr_server.settings import Settings

        engine = WhisperEngine(
            resolve_model(args.model, Settings().engine.cache_dir),
            device="cpu",
            compute_type="int8",
            cpu_threads=1,
            workers=args.cores,
            max_batch_size=4,
        )
        compare_composition(engine, args.requests or 48, args.repeats)
        return

    audio = utterances(args.requests or 16)
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
        print("  one request alone: threads  median ms   CPU cores used between requests")
        for (_workers, threads), engine in engines.items():
            wall, idle = alone(engine, requests, args.repeats)
            print(f"  {threads:26d}  {1000 * wall:9.0f}   {idle:.2f}")


if __name__ == "__main__":
    main()
