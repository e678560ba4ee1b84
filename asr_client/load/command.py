"""``asr-client load``: a call-center simulator.

Opens N concurrent streams (plus, optionally, M silent ones: open lines on hold), each
playing a call made of recorded utterances with pauses, in real time, and reports per
stream and overall: WER against the references, time to first partial, end of speech to
final (p50/p95/p99), lag, rejected streams, audio sent against audio processed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from asr_client.connection import (
    ConnectionConfigError,
    connection_from_args,
    int_between,
    positive_float,
    seconds_at_least,
)
from asr_client.load.calls import Call, build_call, clips_from_files, clips_from_manifest
from asr_client.load.report import render_text, stream_record, summarize
from asr_client.load.runner import LoadOptions, StreamOutcome, run_load
from asr_client.scoring import can_score

ENCODINGS = {"linear16": "LINEAR16", "mulaw": "MULAW", "alaw": "ALAW"}


def _pause(text: str) -> tuple[float, float]:
    low, _, high = text.partition(":")
    try:
        pause = (float(low), float(high or low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN:MAX seconds, got {text}") from None
    if not 0 <= pause[0] <= pause[1]:
        raise argparse.ArgumentTypeError(f"expected 0 <= MIN <= MAX, got {text}")
    return pause


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _writable(path: str) -> str:
    """argparse type: a report path that can be written, checked before a run of minutes
    rather than found after it; left as it was found."""
    if path == "-":
        return path
    path = os.path.expanduser(path)
    existed = os.path.lexists(path)
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot write {path}: {exc.strerror}") from None
    if not existed:
        os.unlink(path)
    return path


def add_parser(sub: Any, common_server: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "load",
        parents=[common_server],
        help="call-center simulator: many concurrent real-time streams, with a report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "files",
        nargs="*",
        type=os.path.expanduser,
        metavar="FILE",
        help="audio files to build calls from (no references, so no WER); default: --corpus",
    )
    p.add_argument(
        "--corpus",
        type=os.path.expanduser,
        default="audio_samples",
        metavar="DIR",
        help="directory with MANIFEST.tsv/manifest.tsv (id, file, transcript, ...): recordings "
        "with references (default audio_samples)",
    )
    p.add_argument("--streams", type=_count, default=4, metavar="N", help="talking calls (4)")
    p.add_argument(
        "--silent", type=_count, default=0, metavar="M", help="extra calls that stay silent (0)"
    )
    p.add_argument(
        "--duration",
        type=seconds_at_least(0.1),  # (an infinite call was built in memory without end)
        default=60.0,
        metavar="S",
        help="seconds per call (60); its last turn plays whole, so a call may run longer, "
        "by up to one clip (30 s at most) and 1.5 s of pause",
    )
    p.add_argument(
        "--pause",
        type=_pause,
        default=(0.8, 3.0),
        metavar="MIN:MAX",
        help="seconds of silence between utterances (0.8:3)",
    )
    p.add_argument(
        "--telephone",
        action="store_true",
        help="phone audio: 300-3400 Hz band at 8 kHz, G.711 (see --encoding)",
    )
    p.add_argument(
        "--encoding",
        choices=sorted(ENCODINGS),
        default=None,
        help="wire encoding (default mulaw with --telephone, else linear16)",
    )
    p.add_argument(
        "--stereo", action="store_true", help="two channels: agent and customer take turns"
    )
    p.add_argument(
        "--chunk-ms",
        type=int_between(10, 1000, "ms"),
        default=100,
        metavar="MS",
        help="audio per message (100)",
    )
    p.add_argument(
        "--speed", type=positive_float, default=1.0, metavar="X", help="1 = real time (default)"
    )
    p.add_argument(
        "--ramp",
        type=seconds_at_least(0.0),
        default=None,
        metavar="S",
        help="spread stream starts over S seconds",
    )
    p.add_argument("--no-interim", action="store_true", help="finals only")
    p.add_argument(
        "--connections", type=int, default=0, metavar="K", help="gRPC channels (1 per 100 streams)"
    )
    p.add_argument("--seed", type=int, default=1, help="random seed for the call layout (1)")
    p.add_argument(
        "--json",
        type=_writable,
        metavar="FILE",
        help="write the full report as JSON ('-' = stdout)",
    )
    p.add_argument("--per-stream", action="store_true", help="print a line per stream")
    p.add_argument("--quiet", action="store_true", help="no live progress")


class _Progress:
    """One status line a second on a terminal; a plain line every 10 s otherwise."""

    def __init__(self, out: IO[str], quiet: bool) -> None:
        self.out = out
        self.quiet = quiet
        self.tty = out.isatty()
        self._last_plain = 0.0

    def __call__(self, outcomes: Sequence[StreamOutcome], elapsed: float) -> None:
        if self.quiet or (not self.tty and elapsed - self._last_plain < 10):
            return
        self._last_plain = elapsed
        open_ = sum(o.status == "PENDING" and o.audio_sent_s > 0 for o in outcomes)
        done = sum(o.status == "OK" for o in outcomes)
        rejected = sum(o.rejected for o in outcomes)
        finals = sum(len(o.finals) for o in outcomes)
        sent = sum(o.audio_sent_s for o in outcomes)
        latencies = [x for o in outcomes for x in o.final_latency_s[-20:]]
        recent = f"{np.percentile(latencies, 95):.2f}" if latencies else "-"
        lag = max((o.max_lag_s for o in outcomes), default=0.0)
        line = (
            f"{elapsed:6.0f} s  open {open_:4d}  done {done:4d}  rejected {rejected:3d}  "
            f"finals {finals:5d}  audio sent {sent:8.0f} s  final p95 (recent) {recent} s  "
            f"max lag {lag:.2f} s"
        )
        if self.tty:
            self.out.write("\r\x1b[2K" + line)
        else:
            self.out.write(line + "\n")
        self.out.flush()

    def close(self) -> None:
        if self.tty and not self.quiet:
            self.out.write("\n")


def make_calls(
    *,
    files: Sequence[str] = (),
    corpus: str | Path = "audio_samples",
    language: str = "",
    streams: int,
    silent: int = 0,
    duration_s: float = 60.0,
    pause_s: tuple[float, float] = (0.8, 3.0),
    telephone: bool = False,
    encoding: str | None = None,
    stereo: bool = False,
    seed: int = 1,
) -> list[tuple[Call, bool]]:
    """``streams`` talking calls then ``silent`` silent ones, as ``(call, silent)`` pairs."""
    rate = 8000 if telephone else 16_000
    wire = ENCODINGS[encoding or ("mulaw" if telephone else "linear16")]
    if not streams:
        clips = []  # silent calls only
    elif files:
        clips = clips_from_files(files, call_rate=rate, telephone=telephone)
    else:
        clips = clips_from_manifest(
            Path(corpus), language=language, call_rate=rate, telephone=telephone
        )
    if streams and not clips:
        raise ValueError(f"no usable recordings in {files or corpus}")
    rng = np.random.default_rng(seed)
    calls = []
    for k in range(streams + silent):
        quiet = k >= streams
        call = build_call(
            k,
            clips,
            rng=rng,
            duration_s=duration_s,
            channels=2 if stereo else 1,
            sample_rate_hz=rate,
            encoding=wire,
            pause_s=pause_s,
            lead_in_s=float(rng.uniform(0, 2)),
            silent=quiet,
        )
        calls.append((call, quiet))
    return calls


def default_options(
    calls: int,
    *,
    ramp_s: float | None = None,
    connections: int = 0,
    **options: Any,
) -> LoadOptions:
    """Options with the defaults that depend on the number of calls: starts spread over a
    quarter second per call (at most 10 s), one gRPC channel per 100 calls."""
    return LoadOptions(
        ramp_s=ramp_s if ramp_s is not None else min(10.0, 0.25 * calls),
        connections=connections or max(1, -(-calls // 100)),
        **options,
    )


def _write_json(path: Path, report: dict[str, Any]) -> None:
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


async def load_command(args: argparse.Namespace, stdout: IO[str], stderr: IO[str]) -> int:
    try:
        calls = await asyncio.to_thread(  # decodes and filters every clip
            lambda: make_calls(
                files=args.files,
                corpus=args.corpus,
                language=args.language,
                streams=args.streams,
                silent=args.silent,
                duration_s=args.duration,
                pause_s=args.pause,
                telephone=args.telephone,
                encoding=args.encoding,
                stereo=args.stereo,
                seed=args.seed,
            )
        )
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=stderr)
        return 1
    if any(call.has_references for call, _silent in calls) and not can_score():
        # said now, not as a traceback after the whole run
        print(
            "note: no WER in this report: it needs the eval extra (pip install -e '.[eval]' "
            "in a checkout, or 'streamasr[eval]')",
            file=stderr,
        )
    options = default_options(
        len(calls),
        chunk_ms=args.chunk_ms,
        speed=args.speed,
        language=args.language,
        interim_results=not args.no_interim,
        ramp_s=args.ramp,
        connections=args.connections,
        connect_timeout_s=args.connect_timeout,
        resume=args.resume,
    )
    progress = _Progress(stderr, args.quiet or args.json == "-")
    started = time.monotonic()
    try:
        outcomes = await run_load(connection_from_args(args), calls, options, on_tick=progress)
    except ConnectionConfigError as exc:
        print(f"error: {exc}", file=stderr)
        return 1
    except TimeoutError:
        print(f"error: cannot connect to {args.server}", file=stderr)
        return 1
    finally:
        progress.close()
    summary = summarize(outcomes, time.monotonic() - started)
    streams = [stream_record(o) for o in outcomes]
    report = {
        "settings": {
            "server": args.server,
            "streams": args.streams,
            "silent": args.silent,
            "duration_s": args.duration,
            "pause_s": list(args.pause),
            "telephone": args.telephone,
            "stereo": args.stereo,
            "encoding": calls[0][0].encoding if calls else None,
            "sample_rate_hz": calls[0][0].sample_rate_hz if calls else None,
            "chunk_ms": args.chunk_ms,
            "speed": args.speed,
            "ramp_s": options.ramp_s,
            "seed": args.seed,
        },
        "overall": summary,
        "streams": streams,
    }
    if args.json == "-":
        json.dump(report, stdout, indent=2)
        stdout.write("\n")
    else:
        shown = streams if args.per_stream else []
        print(render_text(summary, shown), file=stdout)
        if args.json:
            try:
                _write_json(Path(args.json), report)
            except OSError as exc:  # checked before the run, but it can change in minutes
                print(f"error: cannot write {args.json}: {exc.strerror}", file=stderr)
                return 1
    failed = summary["failed"] or summary["audio_unprocessed_s"] > 0
    return 2 if failed else 0
