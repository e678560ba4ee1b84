"""What decoding a container costs the bridge. Prints figures.

Encodes a recording of the shared corpus with FFmpeg (PyAV) as a browser's MediaRecorder
would (WebM/Opus, Ogg/Opus, fragmented MP4/AAC) or as a file (WAV, FLAC, MP3), then feeds
it to ``asr_bridge.container.ContainerDecoder`` in pieces of ``--piece-ms`` of audio, as
fast as it takes them, and prints for each format the process CPU time per second of
audio (median of ``--runs``; the queues' hops on the event loop included), and after how
many pieces the first audio came out (what the decoder holds back at the start: FFmpeg
reads enough to recognize the container, and a container's first whole block).

Usage: python bench/container_bench.py [--id libri_1089-134686-0000] [--piece-ms 250]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from asr_bridge.container import ContainerDecoder  # noqa: E402
from tests.helpers import corpus, encode_container, read_pcm16  # noqa: E402

FORMATS = [
    ("webm", "libopus", None),
    ("ogg", "libopus", None),
    ("mp4", "aac", {"movflags": "frag_keyframe+empty_moov+default_base_moof"}),
    ("wav", "pcm_s16le", None),
    ("flac", "flac", None),
    ("mp3", "libmp3lame", None),
]


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def decode(data: bytes, piece: int) -> int:
    """Feed ``data`` in pieces, take everything out; how many pieces went in before the
    first audio came out (each piece is given 0.2 s to come out before the next)."""
    decoder = ContainerDecoder("bench")
    pieces = [data[i : i + piece] for i in range(0, len(data), piece)]
    try:
        fed = 0
        heard = False
        while not heard and fed < len(pieces):
            await decoder.feed(pieces[fed])
            fed += 1
            while not heard:
                try:
                    item = await asyncio.wait_for(decoder.get(), timeout=0.2)
                except TimeoutError:
                    break  # it waits for more
                heard = isinstance(item, bytes)

        async def feed() -> None:
            for rest in pieces[fed:]:
                await decoder.feed(rest)
            await decoder.end()

        feeder = asyncio.create_task(feed())
        while await decoder.get() is not None:
            pass
        await feeder
    finally:
        decoder.close()
    return fed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--id", default="libri_1089-134686-0000", help="a corpus recording")
    parser.add_argument("--piece-ms", type=int, default=250)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    pcm, rate = read_pcm16(corpus()[args.id].path)
    seconds = len(pcm) / rate
    print(f"{args.id}: {seconds:.1f} s, pieces of {args.piece_ms} ms, {args.runs} runs each")
    for fmt, codec, options in FORMATS:
        data = encode_container(pcm[:, :1], rate, fmt, codec, options=options)
        piece = max(1, int(len(data) * args.piece_ms / 1000 / seconds))
        costs, first = [], []
        for _ in range(args.runs):
            before = cpu_s()
            first.append(asyncio.run(decode(data, piece)))
            costs.append(cpu_s() - before)
        cost = statistics.median(costs)
        print(
            f"  {fmt:4} {codec:10} {len(data) / seconds / 1000:6.1f} KB/s: CPU "
            f"{cost / seconds * 100:5.2f} % of real time ({cost * 1000:.0f} ms); first audio "
            f"out after {statistics.median(first) * args.piece_ms:.0f} ms of pieces"
        )


if __name__ == "__main__":
    main()
