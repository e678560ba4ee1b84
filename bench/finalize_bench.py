"""What a finalize mid-speech costs: push-to-talk released mid-word, an agent cutting in.

Streams each English single-talker recording of the shared corpus (``--ids``) at full
speed (100 ms messages, the server's backpressure the only brake), with a finalize after
every ``--every`` seconds of audio sent, wherever it falls: inside words, in pauses. Per
interval it prints the WER of the finals joined (Whisper's English normaliser), the
finalizes answered with NO_WORDS (``speech_event`` NO_WORDS: a cut fragment Whisper heard
as no speech), and the same recordings streamed without a finalize, for comparison. A cut
inside a word leaves a fragment on each side ("calligraph." / "y to perfection"): some
loss is the price of the cut, not a defect; compare code by running it on each
(``--code`` runs the server from another checkout, a ``git worktree`` of the commit
before a change).

Usage: python bench/finalize_bench.py [--every 0.9 --every 1.6] [--ids REGEX]
       [--code DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from streaming_bench import Item, load_items, references, start_server  # noqa: E402

from asr_api.v1 import asr_pb2  # noqa: E402
from asr_client import AsrClient, audio_config  # noqa: E402
from asr_client.audio_files import load_audio  # noqa: E402
from asr_client.scoring import wer  # noqa: E402

CHUNK_S = 0.1
RATE = 16_000


@dataclass
class Figures:
    every_s: float | None  # None: no finalize
    wer: float
    no_words: int
    finals: int
    texts: dict[str, str]


async def stream(client: AsrClient, pcm: bytes, every_s: float | None) -> tuple[str, int, int]:
    """The finals' text joined, the NO_WORDS events and the finals, for one recording
    with a finalize after every ``every_s`` of audio (None: none)."""
    chunk = int(CHUNK_S * RATE) * 2
    every = int(every_s * RATE) * 2 if every_s else 0
    finals: list[str] = []
    no_words = 0
    async with client.stream(audio_config(sample_rate_hz=RATE, language="en")) as s:

        async def send() -> None:
            due = every
            for i in range(0, len(pcm), chunk):
                await s.send_audio(pcm[i : i + chunk])
                if every and i + chunk >= due:
                    await s.finalize()
                    due += every
            await s.end()

        sender = asyncio.create_task(send())
        async for e in s:
            if e.HasField("result") and e.result.is_final:
                finals.append(e.result.text)
            elif e.speech_event.type == asr_pb2.SpeechEvent.NO_WORDS:
                no_words += 1
        await sender
    return " ".join(finals), no_words, len(finals)


async def measure(target: str, items: list[Item], intervals: list[float | None]) -> list[Figures]:
    pcm = {i.id: load_audio(str(i.path)).mixed().resampled(RATE).to_bytes() for i in items}
    out = []
    async with AsrClient(target) as client:
        await client.wait_ready(30)
        for every_s in intervals:
            texts: dict[str, str] = {}
            no_words = finals = 0
            for item in items:
                texts[item.id], n_none, n_finals = await stream(client, pcm[item.id], every_s)
                no_words += n_none
                finals += n_finals
            score = wer([references(i)[0] for i in items], [texts[i.id] for i in items])
            out.append(Figures(every_s, score, no_words, finals, texts))
            what = f"a finalize every {every_s:.1f} s" if every_s else "no finalize"
            print(
                f"{what:>24}: WER {100 * score:5.2f} %  NO_WORDS {no_words:3d}  "
                f"finals {finals:4d}  ({len(items)} recordings)",
                flush=True,
            )
    return out


async def run(a: argparse.Namespace) -> list[Figures]:
    items = [i for i in load_items(None, a.ids) if len(references(i)) == 1 and i.duration_s < 20]
    if not items:
        sys.exit("no single-talker recording under 20 s matches --ids")
    intervals: list[float | None] = [None, *(a.every or [0.9, 1.6])]
    proc, port, _ = await start_server(a.model, ["--host", "127.0.0.1"], code=a.code or ROOT)
    try:
        return await measure(f"127.0.0.1:{port}", items, intervals)
    finally:
        proc.terminate()
        await proc.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--every", type=float, action="append", metavar="S", help="repeatable")
    p.add_argument("--ids", help="recordings whose id matches this regular expression")
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--code", type=Path, help="run the server from this checkout")
    p.add_argument("--json", type=Path, help="also write the figures and every text here")
    a = p.parse_args()
    t0 = time.monotonic()
    figures = asyncio.run(run(a))
    print(f"({time.monotonic() - t0:.0f} s)", file=sys.stderr)
    if a.json:
        a.json.write_text(json.dumps([asdict(f) for f in figures], indent=1))


if __name__ == "__main__":
    main()
