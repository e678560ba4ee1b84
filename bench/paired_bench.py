"""Paired latency comparison: the same recordings, streamed to several servers in turn.

Latency figures on a shared machine drift by tens of percent within an hour (the same final
decode took 95 ms in one run and 200 ms in a later one), so two configurations measured in
separate runs are not comparable. This starts one server per configuration (each with its
own environment: any ``ASR_*`` setting) and streams every recording to each of them in
turn, one stream at a time, rotating which goes first; all of them therefore see the same
machine state. Figures are those of ``streaming_bench.py`` with ``--finalize-at-vad-stop``
(pipecat's time to final segment) in SEMANTIC mode, per configuration.

Usage: python bench/paired_bench.py "" "ASR_TURN__SPECULATE_MS=90" [--json out.json]
(each argument: comma-separated NAME=VALUE pairs; "" is the defaults; CODE=DIR runs that
configuration's server from another checkout, e.g. a ``git worktree`` of the commit
before a change: "CODE=/tmp/before" ""; VIA=deepgram streams that configuration through
an asr-bridge's Deepgram endpoint, as pipecat's DeepgramSTTService does, with Finalize at
the same VAD stops: ``paired_bench.py --endpointing silence "" "VIA=deepgram"`` sets the
bridge's path beside the direct one; the bridge asks for silence endpointing, so compare
it with ``--endpointing silence``)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import deepgram_stream as dg  # noqa: E402
import streaming_bench as sb  # noqa: E402


def environment(spec: str) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in spec.split(",") if pair)


async def run(a: argparse.Namespace) -> dict[str, object]:
    configs = [environment(spec) for spec in a.configs]
    items = [i for i in sb.load_items(a.limit, a.ids) if len(sb.references(i)) == 1]
    if not items:
        sys.exit("no mono recording of the corpus's WER set matches --ids/--limit")
    client_ends = {i.id: sb.client_vad_speech_ends(i) for i in items}
    servers: list[tuple[asyncio.subprocess.Process, int, int]] = []
    bridges: dict[int, tuple[asyncio.subprocess.Process, int]] = {}  # config → its bridge
    try:
        for env in configs:
            code = Path(env["CODE"]) if "CODE" in env else sb.ROOT
            settings = {k: v for k, v in env.items() if k not in ("CODE", "VIA")}
            log = a.server_logs / f"server{len(servers)}.log" if a.server_logs else None
            servers.append(await sb.start_server(a.model, [], settings, code, log))
            if env.get("VIA") == "deepgram":
                bridges[len(servers) - 1] = await dg.start_bridge(servers[-1][1])
            elif "VIA" in env:
                raise SystemExit(f"VIA={env['VIA']}: only VIA=deepgram is known")
        outcomes: list[list[sb.Outcome]] = [[] for _ in configs]
        for k, item in enumerate(items):
            order = [(k + j) % len(configs) for j in range(len(configs))]
            for i in order:
                _, port, _ = servers[i]
                if i in bridges:
                    outcomes[i].append(
                        await dg.stream_one(bridges[i][1], item, a.chunk_ms, client_ends[item.id])
                    )
                    continue
                outcomes[i].append(
                    await sb.stream_one(
                        port,
                        item,
                        1.0,
                        a.chunk_ms,
                        False,
                        a.endpointing,
                        False,
                        {},
                        "",
                        client_ends[item.id],
                    )
                )
            print(f"  {item.id}", file=sys.stderr)
        figures = []
        for env, outs, (_, _, metrics_port) in zip(configs, outcomes, servers, strict=True):
            refs, hyps, _ = sb.scored(outs)
            ttfp = [x for o in outs for x in o.ttfp]
            figures.append(
                {
                    "environment": env,
                    "ttfs_finalize_at_vad_stop": sb.ttfs_figures(outs),
                    "ttfp_median_s": round(statistics.median(ttfp), 3) if ttfp else None,
                    "streaming_wer": round(sb.wer(refs, hyps), 4),
                    "engine": sb.engine_times(metrics_port),
                    "early_finals_kept": sb.counter(metrics_port, "asr_early_finals_kept"),
                    # per recording, to find what made two configurations differ
                    "recordings": {
                        o.item.id: {"ttfs_s": [round(x, 3) for x in o.ttfs], "text": o.hypothesis}
                        for o in outs
                    }
                    if a.details
                    else None,
                }
            )
        return {
            "endpointing": a.endpointing,
            "chunk_ms": a.chunk_ms,
            "hiss_per_s": a.hiss,
            "configs": figures,
        }
    finally:
        for proc, _ in bridges.values():
            proc.terminate()
            await proc.wait()
        for proc, _, _ in servers:
            proc.terminate()
            await proc.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("configs", nargs="+", help='NAME=VALUE,... per server ("" = defaults)')
    p.add_argument("--ids", help="only recordings whose id matches this regular expression")
    p.add_argument("--limit", type=int)
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--endpointing", choices=("silence", "semantic"), default="semantic")
    p.add_argument("--chunk-ms", type=int, default=20)
    p.add_argument("--json", type=Path)
    p.add_argument("--details", action="store_true", help="per recording: TTFS and texts")
    p.add_argument(
        "--server-logs",
        type=Path,
        help="a folder for each server's log (server0.log, ...; with ASR_LOG_LEVEL=DEBUG "
        "in a configuration, each final decode and its cost)",
    )
    p.add_argument(
        "--hiss", type=float, default=0.0, help="hisses per second added (streaming_bench)"
    )
    a = p.parse_args()
    sb.HISS_PER_S = a.hiss
    figures = asyncio.run(run(a))
    print(json.dumps(figures, indent=2))
    if a.json:
        a.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
