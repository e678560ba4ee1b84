"""Figures of a load run: per stream and overall, as a dict (for JSON) and as text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from asr_client.load.runner import StreamOutcome


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """The figures of ``values``, and how many there were (``n``)."""
    if not values:
        return {"n": 0, "p50": None, "p95": None, "p99": None, "max": None}
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    return {
        "n": len(values),
        "p50": round(float(p50), 3),
        "p95": round(float(p95), 3),
        "p99": round(float(p99), 3),
        "max": round(max(values), 3),
    }


def _wer(outcomes: Sequence[StreamOutcome]) -> float | None:
    """Corpus WER over every channel of every scored call (None: no references)."""
    refs, hyps = [], []
    for o in outcomes:
        if o.silent or not o.call.has_references or o.rejected:
            continue
        for channel in range(o.call.channels):
            ref = o.call.reference(channel)
            if ref:
                refs.append(ref)
                hyps.append(o.hypothesis(channel))
    from asr_client.scoring import can_score, wer

    if not refs or not can_score():  # (the command said so at its start)
        return None
    return round(wer(refs, hyps), 4)


def stream_record(o: StreamOutcome) -> dict[str, Any]:
    return {
        "call": o.call.id,
        "silent": o.silent,
        "status": o.status,
        "error": o.error,
        "channels": o.call.channels,
        "sample_rate_hz": o.call.sample_rate_hz,
        "encoding": o.call.encoding,
        "audio_s": round(o.call.duration_s, 2),
        "speech_s": round(o.call.speech_s, 2),
        "audio_sent_s": round(o.audio_sent_s, 2),
        "audio_processed_s": round(o.audio_processed_s, 2),
        "max_lag_s": round(o.max_lag_s, 3),
        "max_send_delay_s": round(o.max_send_delay_s, 3),
        "turns": len(o.call.turns),
        "finals": len(o.finals),
        "finals_without_partial": o.finals_without_partial,
        "partials": o.partials,
        "resumes": o.resumes,
        "wer": _wer([o]),
        "first_partial_s": percentiles(o.first_partial_s),
        "final_latency_s": percentiles(o.final_latency_s),
        "transcripts": [
            {
                "channel": ch,
                "reference": o.call.reference(ch),
                "hypothesis": o.hypothesis(ch),
                "clips": [t.clip_id for t in o.call.turns if t.channel == ch],
            }
            for ch in range(o.call.channels)
        ],
    }


def summarize(outcomes: Sequence[StreamOutcome], wall_s: float) -> dict[str, Any]:
    talking = [o for o in outcomes if not o.silent]
    completed = [o for o in outcomes if o.status == "OK"]
    return {
        "streams": len(outcomes),
        "talking_streams": len(talking),
        "silent_streams": len(outcomes) - len(talking),
        "completed": len(completed),
        "rejected": sum(o.rejected for o in outcomes),
        "failed": sum(o.status not in ("OK", "RESOURCE_EXHAUSTED") for o in outcomes),
        "resumes": sum(o.resumes for o in outcomes),
        "wall_s": round(wall_s, 2),
        # rejected calls may have sent a chunk or two before the rejection reached them
        "audio_sent_s": round(sum(o.audio_sent_s for o in outcomes if not o.rejected), 2),
        # per channel, like the server's Progress; a call's channels are processed together
        "audio_processed_s": round(sum(o.audio_processed_s for o in outcomes), 2),
        # a failed stream's too: what it sent and lost (it read 0 when its server died)
        "audio_unprocessed_s": round(
            sum(max(0.0, o.audio_sent_s - o.audio_processed_s) for o in outcomes if not o.rejected),
            2,
        ),
        "speech_s": round(sum(o.call.speech_s for o in talking), 2),
        "finals": sum(len(o.finals) for o in outcomes),
        "finals_without_partial": sum(o.finals_without_partial for o in outcomes),
        "turns": sum(len(o.call.turns) for o in talking if not o.rejected),
        "wer": _wer(outcomes),
        "first_partial_s": percentiles([x for o in outcomes for x in o.first_partial_s]),
        "final_latency_s": percentiles([x for o in outcomes for x in o.final_latency_s]),
        "max_lag_s": round(max((o.max_lag_s for o in outcomes), default=0.0), 3),
        "max_send_delay_s": round(max((o.max_send_delay_s for o in outcomes), default=0.0), 3),
    }


def _fmt(p: dict[str, float | None]) -> str:
    if p["p50"] is None:
        return "-"
    return f"p50 {p['p50']:.2f}  p95 {p['p95']:.2f}  p99 {p['p99']:.2f}  max {p['max']:.2f} s"


def render_text(summary: dict[str, Any], streams: Sequence[dict[str, Any]]) -> str:
    lines = []
    if streams:
        lines.append(
            f"{'call':>4} {'status':<18} {'ch':>2} {'sent s':>7} {'done s':>7} {'finals':>6} "
            f"{'WER':>6} {'1st partial p50':>15} {'final p50/p95':>13} {'max lag':>7}"
        )
        for s in streams:
            wer = "-" if s["wer"] is None else f"{100 * s['wer']:.1f}%"
            fp, fl = s["first_partial_s"], s["final_latency_s"]
            first = "-" if fp["p50"] is None else f"{fp['p50']:.2f}"
            final = "-" if fl["p50"] is None else f"{fl['p50']:.2f}/{fl['p95']:.2f}"
            status = s["status"] + (" (silent)" if s["silent"] else "")
            lines.append(
                f"{s['call']:>4} {status:<18} {s['channels']:>2} {s['audio_sent_s']:>7.1f} "
                f"{s['audio_processed_s']:>7.1f} {s['finals']:>6} {wer:>6} {first:>15} "
                f"{final:>13} {s['max_lag_s']:>7.2f}"
            )
        lines.append("")
    wer = "-" if summary["wer"] is None else f"{100 * summary['wer']:.1f}%"
    lines += [
        f"streams: {summary['streams']} ({summary['talking_streams']} talking, "
        f"{summary['silent_streams']} silent); completed {summary['completed']}, "
        f"rejected {summary['rejected']}, failed {summary['failed']}, "
        f"resumed {summary['resumes']} time(s)",
        f"audio sent {summary['audio_sent_s']:.1f} s, processed {summary['audio_processed_s']:.1f}"
        f" s, left unprocessed {summary['audio_unprocessed_s']:.1f} s; "
        f"{summary['finals']} finals for {summary['turns']} turns",
        f"WER: {wer}",
        f"time to first partial: {_fmt(summary['first_partial_s'])}"
        f" ({summary['finals_without_partial']} of {summary['finals']} finals had none)",
        f"end of speech to final: {_fmt(summary['final_latency_s'])}"
        # (finals without a speech end, at a split or the call's end, are not endpointing)
        f" ({summary['final_latency_s']['n']} of {summary['finals']} finals ended speech)",
        f"max server lag {summary['max_lag_s']:.2f} s; "
        f"max client send delay {summary['max_send_delay_s']:.2f} s",
    ]
    return "\n".join(lines)
