"""What scale-out costs: final latency through nginx against direct, and how long a cut hurts.

Starts two ``asr-server`` replicas with the embedded tiny.en and Debian's nginx in front
(deploy/nginx/nginx.conf, rendered by deploy/local/render_proxy.py), then:

1. streams the LibriSpeech samples at real-time pace alternately straight to a replica and
   through nginx (A/B in one run), and takes final latency per utterance = when the final
   arrived − when the audio at its end had been sent;
2. streams a 35 s read recording at real-time pace through a TCP proxy that cuts the
   connection (an RST) shortly after a partial, i.e. inside speech, every few seconds, and
   takes, per cut, the time to the new call carrying the stream (the resume) and to the
   first result (partial or final) after the cut.

Usage: python bench/scaleout_bench.py [--rounds 3] [--cuts 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from asr_client import AsrClient, audio_config  # noqa: E402
from asr_client.audio_files import load_audio  # noqa: E402
from asr_client.resume import ResumeInfo, ResumePolicy  # noqa: E402
from tests.faultproxy import FaultProxy  # noqa: E402
from tests.helpers import corpus  # noqa: E402
from tests.processes import (  # noqa: E402
    NGINX,
    connectable,
    free_port,
    render,
    spawn,
    start_replica,
    wait_for,
    wait_started,
)

SAMPLES = sorted((ROOT / "audio_samples").glob("libri_*.flac"))
CUT_RECORDING = "osr_us_000_0034_8k_up16k"  # ../shared/audio: 35 s, ten read sentences


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {"n": 0}
    return {
        "n": len(ordered),
        "median": round(statistics.median(ordered), 4),
        "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 4),
        "max": round(ordered[-1], 4),
    }


async def final_latencies(target: str, path: Path) -> list[float]:
    audio = load_audio(str(path))
    config = audio_config(sample_rate_hz=audio.sample_rate_hz, channels=audio.channels)
    out: list[float] = []
    async with AsrClient(target) as client:
        await client.wait_ready()
        async with client.stream(config) as stream:
            t0 = time.monotonic()

            async def send() -> None:
                for i, chunk in enumerate(audio.chunks(100)):
                    # sent once its last sample has been "recorded", as a live source would
                    await asyncio.sleep(max(0.0, t0 + (i + 1) * 0.1 - time.monotonic()))
                    await stream.send_audio(chunk)
                await stream.end()

            sender = asyncio.create_task(send())
            async for event in stream:
                if event.HasField("result") and event.result.is_final:
                    out.append(time.monotonic() - (t0 + event.result.end_s))
            await sender
    return out


async def cut_recovery(port: int, cuts: int, seed: int) -> dict[str, object]:
    """Cut inside speech again and again; per cut: time to resume and to the next result."""
    audio = load_audio(str(corpus()[CUT_RECORDING].path))
    rng = random.Random(seed)
    outage: list[float] = []
    to_result: list[float] = []
    pending_cut: list[float] = []
    last_cut = 0.0
    proxy = await FaultProxy(port).start()
    rounds = 0
    try:
        while len(to_result) < cuts and rounds < cuts:
            rounds += 1

            def resumed(info: ResumeInfo) -> None:
                outage.append(info.outage_s)

            config = audio_config(sample_rate_hz=audio.sample_rate_hz)
            async with AsrClient(f"127.0.0.1:{proxy.port}", resume=ResumePolicy()) as client:
                async with client.stream(config, on_resume=resumed) as stream:
                    t0 = time.monotonic()

                    async def send(s=stream, t=t0) -> None:  # type: ignore[no-untyped-def]
                        for i, chunk in enumerate(audio.chunks(100)):
                            await asyncio.sleep(max(0.0, t + (i + 1) * 0.1 - time.monotonic()))
                            await s.send_audio(chunk)
                        await s.end()

                    sender = asyncio.create_task(send())
                    async for event in stream:
                        now = time.monotonic()
                        if not event.HasField("result"):
                            continue
                        if pending_cut:
                            to_result.append(now - pending_cut.pop())
                        partial = not event.result.is_final
                        if partial and now - last_cut > 3.0 and len(to_result) < cuts:
                            await asyncio.sleep(rng.uniform(0.0, 0.3))
                            proxy.cut()
                            last_cut = time.monotonic()
                            pending_cut[:] = [last_cut]
                    await sender
                    pending_cut.clear()
    finally:
        await proxy.close()
    return {
        "cuts": len(to_result),
        "resume_s": summary(outage),
        "first_result_s": summary(to_result),
    }


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="passes over the samples (A/B)")
    p.add_argument("--cuts", type=int, default=20)
    p.add_argument("--json", type=Path)
    a = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        replicas = [start_replica(model="tiny.en", max_streams=16) for _ in range(2)]
        nginx = None
        try:
            for r in replicas:
                await asyncio.to_thread(wait_started, r)
            nginx_port = free_port()
            (Path(tmp) / "tmp").mkdir()
            conf = render("nginx", nginx_port, replicas, Path(tmp) / "nginx.conf")
            nginx = spawn([NGINX, "-p", tmp, "-e", "stderr", "-c", str(conf)])
            await asyncio.to_thread(wait_for, lambda: connectable(nginx_port), 30, "nginx")
            targets = {
                "direct": f"127.0.0.1:{replicas[0].port}",
                "nginx": f"127.0.0.1:{nginx_port}",
            }
            latency: dict[str, list[float]] = {k: [] for k in targets}
            for r in range(a.rounds):
                for path in SAMPLES:
                    order = list(targets) if r % 2 == 0 else list(reversed(targets))
                    for name in order:
                        latency[name] += await final_latencies(targets[name], path)
            figures: dict[str, object] = {
                "final_latency_s": {k: summary(v) for k, v in latency.items()},
                "cut_recovery": await cut_recovery(replicas[1].port, a.cuts, seed=1),
            }
        finally:
            if nginx is not None:
                nginx.stop()
            for r in replicas:
                r.stop()
    text = json.dumps(figures, indent=2)
    print(text)
    if a.json:
        a.json.write_text(text + "\n")


if __name__ == "__main__":
    asyncio.run(main())
