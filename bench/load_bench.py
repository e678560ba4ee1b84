"""Call-center capacity benchmark: latency against concurrency, and the cost of silent lines.

Starts ``asr-server`` as a separate process (embedded tiny.en unless --server-arg says
otherwise) and, with the ``asr-client load`` machinery, plays:

1. for each N of --concurrency: N talking calls at once, in real time (recorded English
   utterances of the shared corpus with 0.8-3 s pauses, --duration s each, the same calls
   at every level: same seed), and records WER, time to first partial and end of speech
   to final (p50/p95/p99), lag, audio sent against processed, and the server's CPU;
2. for each M of --silent: M open calls that stay silent (8 kHz mu-law, --silent-chunk-ms
   frames), and the server's CPU over the steady part of the run.

The load client runs in this process, on the same machine as the server: its CPU is
reported next to the server's, since on a 2-core machine it competes for the same cores.
The largest N whose final p95 stays under --target-p95 with nothing left unprocessed is
the capacity. Prints a table, writes JSON and (with matplotlib) a plot.

Usage: python bench/load_bench.py [--concurrency 4,8,12,16] [--silent 100,500]
       [--telephone] [--stereo] [--json out.json] [--plot out.png]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from children import die_with_parent  # noqa: E402

from asr_client.load.command import default_options, make_calls  # noqa: E402
from asr_client.load.report import summarize  # noqa: E402
from asr_client.load.runner import run_load  # noqa: E402

#: the silent calls' CPU is sampled from this far in (all calls open by then)
SILENT_WARM_UP_S = 8.0

SHARED = Path(os.environ.get("ASR_SHARED_AUDIO", ROOT.parent / "shared" / "audio"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, extra: list[str]) -> None:
        self.port = free_port()
        cmd = [
            sys.executable, "-m", "asr_server", "--host", "127.0.0.1", "--port", str(self.port),
            "--metrics-port", str(free_port()), "--max-streams", "2000", *extra,
        ]  # fmt: skip
        # the log goes to a file: a pipe nobody reads fills up and blocks the server's loop
        self.log = tempfile.NamedTemporaryFile(prefix="asr-server-", suffix=".log", delete=False)
        print(f"server log: {self.log.name}", flush=True)
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=self.log, preexec_fn=die_with_parent
        )
        self.ps = psutil.Process(self.proc.pid)

    def cpu_s(self) -> float:
        t = self.ps.cpu_times()
        return float(t.user + t.system)

    def rss_mb(self) -> float:
        return float(self.ps.memory_info().rss / 2**20)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def wait_ready(server: Server) -> None:
    """Until the server reports SERVING (its model loaded); if it exits first, its log's
    last lines say why (a bad --server-arg), at once rather than after 3 minutes."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:
                log = Path(server.log.name).read_text(errors="replace")  # noqa: ASYNC240 (once)
                last = log.splitlines()[-10:]
                raise SystemExit(
                    f"the server exited before it was ready (status {server.proc.returncode}):\n"
                    + "\n".join(last)
                )
            try:
                reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.5)
    raise TimeoutError("the server did not become ready")


async def talking_level(server: Server, n: int, args: argparse.Namespace) -> dict[str, Any]:
    calls = make_calls(
        corpus=SHARED,
        language="en",
        streams=n,
        duration_s=args.duration,
        telephone=args.telephone,
        stereo=args.stereo,
        seed=args.seed,
    )
    options = default_options(n, chunk_ms=args.chunk_ms, language="en")
    me = psutil.Process()
    cpu0, mine0, started = server.cpu_s(), sum(me.cpu_times()[:2]), time.monotonic()
    peak_rss = server.rss_mb()

    def tick(outcomes: object, elapsed: float) -> None:
        nonlocal peak_rss
        peak_rss = max(peak_rss, server.rss_mb())

    outcomes = await run_load(f"127.0.0.1:{server.port}", calls, options, on_tick=tick)
    wall = time.monotonic() - started
    summary = summarize(outcomes, wall)
    summary["problems"] = [
        {"call": o.call.id, "status": o.status, "error": o.error}
        for o in outcomes
        if o.status != "OK"
    ]
    audio = sum(c.duration_s * c.channels for c, _ in calls)
    summary.update(
        concurrency=n,
        server_cpu_cores=round((server.cpu_s() - cpu0) / wall, 3),
        server_cpu_s_per_audio_s=round((server.cpu_s() - cpu0) / audio, 3),
        client_cpu_cores=round((sum(me.cpu_times()[:2]) - mine0) / wall, 3),
        server_peak_rss_mb=round(peak_rss, 1),
    )
    return summary


async def silent_level(server: Server, m: int, args: argparse.Namespace) -> dict[str, Any]:
    calls = make_calls(streams=0, silent=m, duration_s=args.silent_duration, telephone=True)
    options = default_options(m, chunk_ms=args.silent_chunk_ms, ramp_s=5.0)
    samples: list[tuple[float, float]] = []  # (time, server cpu) once every call is open
    me = psutil.Process()
    mine: list[float] = []

    def tick(outcomes: Any, elapsed: float) -> None:
        if elapsed >= SILENT_WARM_UP_S and elapsed <= args.silent_duration:  # all open, none ended
            samples.append((time.monotonic(), server.cpu_s()))
            mine.append(sum(me.cpu_times()[:2]))

    outcomes = await run_load(f"127.0.0.1:{server.port}", calls, options, on_tick=tick)
    (t0, c0), (t1, c1) = samples[0], samples[-1]
    summary = summarize(outcomes, t1 - t0)
    return {
        "silent_streams": m,
        "completed": summary["completed"],
        "failed": summary["failed"],
        "chunk_ms": args.silent_chunk_ms,
        "server_cpu_cores": round((c1 - c0) / (t1 - t0), 3),
        "client_cpu_cores": round((mine[-1] - mine[0]) / (t1 - t0), 3),
        "max_send_delay_s": summary["max_send_delay_s"],
        "server_rss_mb": round(server.rss_mb(), 1),
    }


def served_model(server_args: list[str]) -> str:
    """The model the server was started with: its --model flag, else the environment's
    ASR_ENGINE__MODEL (the server inherits it), else the embedded tiny.en."""
    for i, arg in enumerate(server_args):
        if arg == "--model" and i + 1 < len(server_args):
            return server_args[i + 1]
        if arg.startswith("--model="):
            return arg.split("=", 1)[1]
    return os.environ.get("ASR_ENGINE__MODEL") or "tiny.en"


def plot(levels: list[dict[str, Any]], path: Path, target: float, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [lv["concurrency"] for lv in levels]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for key, label, style in (
        ("final_latency_s", "end of speech → final", "-"),
        ("first_partial_s", "speech start → first partial", "--"),
    ):
        for q, marker in (("p50", "o"), ("p95", "s")):
            ax.plot(n, [lv[key][q] for lv in levels], style, marker=marker, label=f"{label} {q}")
    ax.axhline(target, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("concurrent talking calls")
    ax.set_ylabel("seconds")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


async def measure(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    server = Server(args.server_arg)
    try:
        await wait_ready(server)
        levels = []
        for n in [int(x) for x in args.concurrency.split(",") if x]:
            lv = await talking_level(server, n, args)
            levels.append(lv)
            fl, fp = lv["final_latency_s"], lv["first_partial_s"]
            print(
                f"{n:3d} calls: final p50 {fl['p50']} p95 {fl['p95']} p99 {fl['p99']} | "
                f"1st partial p50 {fp['p50']} p95 {fp['p95']} "
                f"({lv['finals_without_partial']}/{lv['finals']} finals had none) | "
                f"WER {lv['wer']} | "
                f"unprocessed {lv['audio_unprocessed_s']} s | max lag {lv['max_lag_s']} s | "
                f"send delay {lv['max_send_delay_s']} s | server {lv['server_cpu_cores']} cores"
                f" ({lv['server_cpu_s_per_audio_s']} s/audio-s), client "
                f"{lv['client_cpu_cores']} | rss {lv['server_peak_rss_mb']} MB",
                flush=True,
            )
        silent = []
        for m in [int(x) for x in args.silent.split(",") if x]:
            sv = await silent_level(server, m, args)
            silent.append(sv)
            print(
                f"{m:4d} silent calls ({sv['chunk_ms']} ms chunks): server "
                f"{sv['server_cpu_cores']} cores, client {sv['client_cpu_cores']} cores, "
                f"completed {sv['completed']}, failed {sv['failed']}, send delay "
                f"{sv['max_send_delay_s']} s, rss {sv['server_rss_mb']} MB",
                flush=True,
            )
    finally:
        server.stop()
    return levels, silent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="4,8,12,16")
    parser.add_argument("--silent", default="100,500")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument(
        "--silent-duration",
        type=float,
        default=40.0,
        help=f"seconds per silent call (40); CPU is sampled from {SILENT_WARM_UP_S:g} s in, "
        "once all are open, so it must be longer",
    )
    parser.add_argument("--chunk-ms", type=int, default=100)
    parser.add_argument("--silent-chunk-ms", type=int, default=100)
    parser.add_argument("--telephone", action="store_true")
    parser.add_argument("--stereo", action="store_true")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--target-p95", type=float, default=2.0)
    parser.add_argument("--server-arg", action="append", default=[], help="passed to asr-server")
    parser.add_argument("--json")
    parser.add_argument("--plot")
    args = parser.parse_args()
    if args.silent and args.silent_duration <= SILENT_WARM_UP_S + 1:
        parser.error(
            f"--silent-duration must be more than {SILENT_WARM_UP_S + 1:g} s: the silent calls' "
            f"CPU is sampled from {SILENT_WARM_UP_S:g} s in"
        )
    if args.plot:
        try:  # said now, not after a run of minutes
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error("--plot needs matplotlib: .venv/bin/pip install -e '.[bench]'")
    levels, silent = asyncio.run(measure(args))
    ok = [
        lv["concurrency"]
        for lv in levels
        if lv["final_latency_s"]["p95"] is not None
        and lv["final_latency_s"]["p95"] < args.target_p95
        and lv["audio_unprocessed_s"] == 0
        and lv["failed"] == 0
    ]
    print(f"capacity: {max(ok) if ok else 0} talking calls with final p95 < {args.target_p95} s")
    report = {"settings": vars(args), "cpu_count": os.cpu_count(), "talking": levels,
              "silent": silent}  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    if args.plot and levels:
        kind = "8 kHz μ-law" if args.telephone else "16 kHz"
        kind += " stereo" if args.stereo else ""
        plot(
            levels,
            Path(args.plot),
            args.target_p95,
            f"{served_model(args.server_arg)}, {os.cpu_count()} CPU cores, {kind} calls, real time",
        )


if __name__ == "__main__":
    main()
