"""What exposure costs: latency of TLS + token against plaintext, and memory after rapid reset.

Starts two ``asr-server`` processes with the embedded tiny.en, one plaintext and one with
TLS (certificates made now by trustme) and a token file, and streams the same recordings
to both, alternating A/B so machine noise hits both alike, at ``--speed`` times real time.
Per utterance it takes final latency = when the final arrived − when the audio at the
final's end had been sent, and per stream the connection set-up time (channel ready).
Then it sends ``--bursts`` rapid-reset bursts of ``--burst`` streams (HEADERS [+ config]
+ RST_STREAM on one connection) to the TLS-less server and prints its resident memory
before and after each, and whether it still transcribes.

Usage: python bench/security_bench.py [--rounds 3] [--speed 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from children import die_with_parent  # noqa: E402

from asr_client import AsrClient, ConnectionOptions, audio_config  # noqa: E402
from asr_client.audio_files import load_audio  # noqa: E402
from asr_server.transport.auth import new_token  # noqa: E402
from tests.pki import SERVER_NAME, Pki  # noqa: E402
from tests.rapid_reset import rapid_reset  # noqa: E402

SAMPLES = sorted((ROOT / "audio_samples").glob("libri_*.flac"))


@dataclass
class Server:
    proc: asyncio.subprocess.Process
    port: int
    log: list[str]

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.terminate()
            await self.proc.wait()


async def start_server(*args: str) -> Server:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "asr_server", "--port", "0", "--metrics-port", "0", *args,
        cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stderr=asyncio.subprocess.PIPE,
        preexec_fn=die_with_parent,
    )  # fmt: skip
    log: list[str] = []
    found: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def read() -> None:
        assert proc.stderr is not None
        async for raw in proc.stderr:
            line = raw.decode(errors="replace")
            log.append(line)
            if (m := re.search(r"gRPC on 127\.0\.0\.1:(\d+)", line)) and not found.done():
                found.set_result(int(m.group(1)))

    asyncio.create_task(read())  # noqa: RUF006 - ends with the process
    return Server(proc, await asyncio.wait_for(found, 180), log)


async def one_stream(options: ConnectionOptions, path: Path, speed: float) -> dict[str, object]:
    audio = load_audio(str(path))
    chunk_ms = 100
    t_connect = time.monotonic()
    async with AsrClient(options) as client:
        await client.wait_ready()
        connect_s = time.monotonic() - t_connect
        config = audio_config(sample_rate_hz=audio.sample_rate_hz, channels=audio.channels)
        latencies: list[float] = []
        async with client.stream(config) as stream:
            t0 = time.monotonic()

            async def send() -> None:
                for i, chunk in enumerate(audio.chunks(chunk_ms)):
                    # sent once its last sample has been "recorded", as a live source would
                    delay = t0 + (i + 1) * chunk_ms / 1000 / speed - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await stream.send_audio(chunk)
                await stream.end()

            sender = asyncio.create_task(send())
            async for event in stream:
                if event.HasField("result") and event.result.is_final:
                    sent_at = t0 + event.result.end_s / speed
                    latencies.append(time.monotonic() - max(sent_at, t0))
            await sender
    return {"connect_s": connect_s, "final_latency_s": latencies}


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "median": round(statistics.median(ordered), 4),
        "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 4),
    }


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5, help="passes over the recordings")
    p.add_argument("--speed", type=float, default=1.0, help="x real time (1 = a microphone)")
    p.add_argument("--burst", type=int, default=10_000, help="streams per rapid-reset burst")
    p.add_argument("--bursts", type=int, default=3)
    p.add_argument("--json", type=Path, help="also write the figures here")
    a = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        pki = Pki(Path(tmp))
        cert, key = pki.server()
        token, line = new_token("bench")
        (Path(tmp) / "tokens").write_text(line + "\n")
        plain = await start_server()
        secure = await start_server(
            "--tls-cert", str(cert), "--tls-key", str(key), "--auth-tokens", f"{tmp}/tokens"
        )
        try:
            targets = {
                "plaintext": ConnectionOptions(f"127.0.0.1:{plain.port}"),
                "tls+token": ConnectionOptions(
                    f"127.0.0.1:{secure.port}",
                    ca_file=pki.ca_file,
                    server_name=SERVER_NAME,
                    token=token,
                ),
            }
            runs: dict[str, list[dict[str, object]]] = {k: [] for k in targets}
            for r in range(a.rounds):
                for path in SAMPLES:
                    order = list(targets) if r % 2 == 0 else list(reversed(targets))
                    for name in order:  # A/B, alternating which goes first
                        runs[name].append(await one_stream(targets[name], path, a.speed))
            figures: dict[str, object] = {"streams_per_target": len(runs["plaintext"])}
            for name, results in runs.items():
                latencies = [x for res in results for x in res["final_latency_s"]]  # type: ignore[attr-defined]
                connects = [float(res["connect_s"]) for res in results]  # type: ignore[arg-type]
                figures[name] = {
                    "final_latency_s": summary(latencies),
                    "connect_s": summary(connects),
                }

            rss = psutil.Process(plain.proc.pid).memory_info().rss
            memory = [{"burst": 0, "streams": 0, "rss_mb": round(rss / 2**20, 1)}]
            for b in range(1, a.bursts + 1):
                report = await asyncio.to_thread(rapid_reset, plain.port, a.burst)
                await asyncio.sleep(2)  # let the server finish tearing calls down
                rss = psutil.Process(plain.proc.pid).memory_info().rss
                check = await one_stream(targets["plaintext"], SAMPLES[0], 8.0)
                memory.append(
                    {
                        "burst": b,
                        "streams": report.streams,
                        "burst_s": round(report.seconds, 2),
                        "goaways": report.goaways,
                        "rss_mb": round(rss / 2**20, 1),
                        "transcribes_after": bool(check["final_latency_s"]),
                    }
                )
            figures["rapid_reset_plaintext_server"] = memory
        finally:
            await plain.stop()
            await secure.stop()
    text = json.dumps(figures, indent=2)
    print(text)
    if a.json:
        a.json.write_text(text + "\n")


if __name__ == "__main__":
    asyncio.run(main())
