"""Does a final's confidence say when its words are wrong? Prints figures.

Starts ``asr-server`` (embedded tiny.en unless --model) and streams every English
recording of the shared corpus to it as fast as it takes them, as the streaming benchmark
scores them, at each noise level asked for (white noise at a signal-to-noise ratio; none
by default), at 16 kHz or as phone audio (--telephone). For each recording it takes the
finals' ``Result.confidence`` (weighted by their words) and the recording's WER, then
prints:

* per noise level: the finals' confidence (median, 10th percentile) and the pooled WER;
* over all recordings and levels: the rank correlation of confidence with WER, and the
  pooled WER of the recordings in each confidence band, least sure first: what an agent
  that asks the speaker again below a level would catch.

Usage: python bench/confidence_bench.py [--snr clean,10,0] [--telephone] [--limit N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from streaming_bench import (  # noqa: E402
    Item,
    load_items,
    load_pcm,
    references,
    start_server,
    telephone,
)

from asr_client import AsrClient, audio_config  # noqa: E402
from asr_client.scoring import wer  # noqa: E402

CHUNK_MS = 100


@dataclass
class Scored:
    item: Item
    snr: str
    channel: int
    reference: str
    hypothesis: str
    confidence: float  # the finals' mean, weighted by their words (0: no final)


def with_noise(pcm: np.ndarray, snr_db: float | None, seed: int) -> np.ndarray:
    """``pcm`` (int16) with white noise ``snr_db`` below its speech power."""
    if snr_db is None:
        return pcm
    x = pcm.astype(np.float32) / 32768
    noise = np.random.default_rng(seed).standard_normal(x.shape).astype(np.float32)
    noise *= np.sqrt(np.mean(x**2) / np.mean(noise**2) / 10 ** (snr_db / 10))
    return (np.clip(x + noise, -1, 1) * 32767).astype(np.int16)


async def stream(port: int, item: Item, snr: str, phone: bool) -> list[Scored]:
    pcm, sr = load_pcm(item)
    pcm = with_noise(pcm, None if snr == "clean" else float(snr), zlib.crc32(item.id.encode()))
    channels = pcm.shape[1]
    data, encoding, frame_bytes = pcm.tobytes(), "LINEAR16", 2 * channels
    if phone:
        data, sr = telephone(pcm, sr)
        encoding, frame_bytes = "MULAW", channels
    chunk = int(sr * CHUNK_MS / 1000) * frame_bytes
    finals: dict[int, list[tuple[str, float]]] = {}
    config = audio_config(
        sample_rate_hz=sr, channels=channels, encoding=encoding, interim_results=False
    )
    async with AsrClient(f"127.0.0.1:{port}") as client, client.stream(config) as s:

        async def send() -> None:
            for start in range(0, len(data), chunk):
                await s.send_audio(data[start : start + chunk])
            await s.end()

        sender = asyncio.create_task(send())
        async for response in s:
            r = response.result
            if response.HasField("result") and r.is_final:
                finals.setdefault(r.channel, []).append((r.text, r.confidence))
        await sender
    out = []
    for ch, reference in references(item).items():
        got = finals.get(ch, [])
        words = [len(t.split()) for t, _ in got]
        confidence = (
            sum(n * c for n, (_, c) in zip(words, got, strict=True)) / sum(words) if got else 0.0
        )
        out.append(Scored(item, snr, ch, reference, " ".join(t for t, _ in got), confidence))
    return out


def ranks(values: list[float]) -> np.ndarray:
    """Ranks from 0, tied values sharing their mean rank (as Spearman's rho wants: many
    recordings tie at 0 % WER, and an arbitrary order among them would bias it)."""
    v = np.asarray(values, dtype=float)
    order = np.argsort(v, kind="stable")
    r = np.empty(len(v))
    r[order] = np.arange(len(v))
    for value in np.unique(v):
        tied = v == value
        r[tied] = r[tied].mean()
    return r


def rank_correlation(results: list[Scored]) -> float:
    """Spearman's rho of the recordings' confidence with their WER (negative: the less
    sure, the more errors)."""
    each = [wer([s.reference], [s.hypothesis]) for s in results]
    return float(np.corrcoef(ranks([s.confidence for s in results]), ranks(each))[0, 1])


def report(results: list[Scored], levels: list[str], bands: int) -> None:
    print(
        f"{'noise':>8} {'recordings':>10} {'conf. median':>12} {'conf. p10':>9} {'WER':>7}"
        f" {'rank corr.':>10}"
    )
    for snr in levels:
        at = [s for s in results if s.snr == snr]
        confidences = [s.confidence for s in at]
        score = wer([s.reference for s in at], [s.hypothesis for s in at])
        label = snr if snr == "clean" else f"{snr} dB"
        print(
            f"{label:>8} {len(at):>10} {statistics.median(confidences):>12.3f} "
            f"{np.percentile(confidences, 10):>9.3f} {score:>7.2%} {rank_correlation(at):>+10.2f}"
        )
    print(f"\nrank correlation of confidence with WER, all {len(results)}: ", end="")
    print(f"{rank_correlation(results):+.2f}")
    print(f"\n{'confidence band':>17} {'recordings':>10} {'words':>6} {'WER':>7}")
    ordered = sorted(results, key=lambda s: s.confidence)
    for part in np.array_split(np.arange(len(ordered)), bands):
        group = [ordered[i] for i in part]
        if not group:
            continue
        low, high = group[0].confidence, group[-1].confidence
        words = sum(len(s.reference.split()) for s in group)
        score = wer([s.reference for s in group], [s.hypothesis for s in group])
        print(f"{low:>8.3f}-{high:<8.3f} {len(group):>10} {words:>6} {score:>7.2%}")


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--snr", default="clean", help="noise levels, e.g. clean,10,0 (dB)")
    p.add_argument("--telephone", action="store_true", help="8 kHz mu-law, 300-3400 Hz")
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--limit", type=int, help="only the first N recordings")
    p.add_argument("--bands", type=int, default=4, help="confidence bands (equal counts)")
    p.add_argument("server_args", nargs="*", help="extra asr-server flags after --")
    args = p.parse_args()
    levels = [s.strip() for s in args.snr.split(",")]
    items = load_items(args.limit)
    proc, port, _ = await start_server(args.model, args.server_args)
    results: list[Scored] = []
    try:
        for snr in levels:
            for item in items:
                results += await stream(port, item, snr, args.telephone)
    finally:
        proc.terminate()
        await proc.wait()
    line = "phone line (8 kHz mu-law)" if args.telephone else "16 kHz"
    print(f"{args.model}, {len(items)} recordings, {line}, streamed as fast as taken\n")
    report(results, levels, args.bands)


if __name__ == "__main__":
    asyncio.run(main())
