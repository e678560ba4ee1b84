"""Streaming accuracy under real-world audio conditions, against offline. Prints figures.

Makes altered copies of ~12 English recordings of the shared corpus (numpy and soxr only:
quiet and loud speech, clipping, DC offset, mains hum, white and pink noise, a second
talker, reverberation, long quiet padding, other sample rates), streams each copy to one
``asr-server`` at full speed (as ``asr-client file --fast`` does: 100 ms messages, as fast
as backpressure allows, language en) and decodes the same audio offline with
faster-whisper on the same model. Per condition it prints the pooled WER of the streaming
finals and of offline, the gap in points, and the files where streaming lost 3 or more
reference words that offline got right: a gap that offline does not share is the server's
(its detector, endpointing or streaming decode), not the model's.

Every copy starts from the recording set to -26 dBFS average speech level (the ``clean``
condition), so conditions differ only in what they add. Noise is seeded per seed,
condition and recording: a run is repeatable, and choosing other conditions does not
change a condition's noise. Offline hypotheses are cached (``--offline-cache``) across
runs, keyed by the model and the audio decoded.

The script starts its own server on a free port (``--server-arg`` passes flags to it, e.g.
``--server-arg=--vad --server-arg=silero`` to compare detectors) unless ``--server`` names
one already running, which must run ``--model``.

Usage: python bench/conditions_bench.py [--condition clean --condition level-45 ...]
       [--ids REGEX] [--server-arg=--vad --server-arg=silero] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from streaming_bench import (  # noqa: E402
    Item,
    as_server_hears,
    load_items,
    offline_model,
    offline_text,
    references,
    start_server,
)

from asr_client import AsrClient, audio_config  # noqa: E402
from asr_client.audio_files import PcmAudio  # noqa: E402
from asr_client.scoring import normalize, wer  # noqa: E402
from asr_client.speech_level import active_rms  # noqa: E402

SR = 16_000
#: the audio-condition review's recordings: read speech from several sources, rates and
#: microphones, 3.5-11.7 s each (the order matters: it pairs the second talkers)
DEFAULT_IDS = (
    "libri_1089-134686-0000",
    "libri_1995-1837-0001",
    "libri_2412-153948-0000",
    "picovoice_leopard_test_en",
    "libri_1089-134691-0001",
    "ljspeech_LJ001-0001",
    "ljspeech_LJ001-0005",
    "ljspeech_LJ001-0015",
    "ljspeech_LJ001-0031",
    "jfk",
    "picovoice_cheetah_test_en",
    "cmusphinx_cards_005",
)
#: every copy's average speech level before its condition is applied
CLEAN_DBFS = -26.0
#: a file is listed when streaming lost at least this many words that offline got right
LOST_WORDS = 3
#: what ``asr-client file`` sends per message by default
CHUNK_MS = 100
#: a stream that takes longer than this is abandoned (and scored as nothing heard)
STREAM_TIMEOUT_S = 120.0


# -- levels and signals ---------------------------------------------------------------------


def at_level(x: np.ndarray, dbfs: float) -> np.ndarray:
    """``x`` scaled to an average speech level of ``dbfs``."""
    return x * (10 ** (dbfs / 20) / active_rms(x, SR))


def below_speech(noise: np.ndarray, x: np.ndarray, db: float) -> np.ndarray:
    """``noise`` scaled to ``db`` below the speech level of ``x`` (an SNR of ``db``)."""
    return noise / noise.std() * active_rms(x) / 10 ** (db / 20)


def pink(n: int, rng: np.random.Generator) -> np.ndarray:
    """Pink (1/f power) noise: white noise shaped by 1/sqrt(f) in the frequency domain."""
    spectrum = np.fft.rfft(rng.standard_normal(n))
    f = np.arange(len(spectrum), dtype=np.float64)
    f[0] = 1.0  # leave DC as it is rather than divide by zero
    return np.fft.irfft(spectrum / np.sqrt(f), n)


def load_16k(path: Path) -> np.ndarray:
    """A recording as mono float64 at 16 kHz (soxr), its channels averaged."""
    data, sr = sf.read(str(path), dtype="float32", always_2d=True)
    mono = data.mean(axis=1)
    if sr != SR:
        mono = soxr.resample(mono, sr, SR)
    return np.asarray(mono, np.float64)


# -- the conditions -------------------------------------------------------------------------


@dataclass
class Recording:
    """One recording at the clean level, and the other talker that babble mixes under it."""

    item: Item
    clean: np.ndarray  # float64, 16 kHz, CLEAN_DBFS
    other: np.ndarray  # another recording, float64, 16 kHz, CLEAN_DBFS


#: a condition: the clean recording and its generator -> samples (float, may exceed
#: full scale: the wire form clips) and their sample rate
Make = Callable[[Recording, np.random.Generator], tuple[np.ndarray, int]]


def level(dbfs: float, r: Recording, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    return at_level(r.clean, dbfs), SR


def clipped(gain_db: float, r: Recording, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    # a hot input stage: the peaks flattened at full scale
    return np.clip(r.clean * 10 ** (gain_db / 20), -1, 1), SR


def dc_offset(offset: float, r: Recording, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    return r.clean + offset, SR


def hum(hz: float, r: Recording, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """Mains hum 10 dB below the speech: the fundamental and the harmonics a transformer
    or ground loop adds, each at a random phase."""
    t = np.arange(len(r.clean)) / SR
    harmonics = [(1, 1.0), (2, 0.3), (3, 0.5), (5, 0.2)]
    h = sum(a * np.sin(2 * np.pi * hz * k * t + rng.uniform(0, 2 * np.pi)) for k, a in harmonics)
    return r.clean + below_speech(np.asarray(h), r.clean, 10), SR


def noise(
    kind: str, snr_db: float, r: Recording, rng: np.random.Generator
) -> tuple[np.ndarray, int]:
    n = len(r.clean)
    hiss = rng.standard_normal(n) if kind == "white" else pink(n, rng)
    return r.clean + below_speech(hiss, r.clean, snr_db), SR


def babble(db: float, r: Recording, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """Another talker ``db`` below the speaker, looped or cut to last the whole recording."""
    other = np.resize(at_level(r.other, CLEAN_DBFS + db), len(r.clean))
    return r.clean + other, SR


def reverb(rt60_s: float, r: Recording, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """A synthetic room: exponentially decaying noise (60 dB down after ``rt60_s``) whose
    energy equals the direct sound's (0 dB direct-to-reverberant ratio), with the tail
    after the recording kept (0.3 s) and the speech level restored."""
    length = int(SR * rt60_s * 1.2)
    t = np.arange(length) / SR
    ir = rng.standard_normal(length) * np.exp(-6.9 * t / rt60_s)  # ln(1000) = 6.9: -60 dB
    ir[0] = 0.0
    ir /= np.sqrt((ir**2).sum())
    ir[0] = 1.0
    wet = np.convolve(r.clean, ir)[: len(r.clean) + int(0.3 * SR)]
    return at_level(wet, CLEAN_DBFS), SR


def padded(
    pad_s: float, floor_dbfs: float, r: Recording, rng: np.random.Generator
) -> tuple[np.ndarray, int]:
    """``pad_s`` of silence before and after, and a faint noise floor under all of it: a
    microphone opened early and closed late."""
    pad = np.zeros(int(pad_s * SR))
    y = np.concatenate([pad, r.clean, pad])
    return y + rng.standard_normal(len(y)) * 10 ** (floor_dbfs / 20), SR


def rate(sample_rate: int, r: Recording, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    # sent at this rate: the server's resampler brings it back to 16 kHz
    return np.asarray(soxr.resample(r.clean.astype(np.float32), SR, sample_rate)), sample_rate


@dataclass(frozen=True)
class Condition:
    name: str
    what: str
    make: Make


CONDITIONS = [
    Condition("clean", f"speech at {CLEAN_DBFS:g} dBFS", partial(level, CLEAN_DBFS)),
    *(
        Condition(f"level{db}", f"speech at {db} dBFS", partial(level, db))
        for db in (-35, -40, -42, -45, -48, -50)
    ),
    Condition("clip+12", "+12 dB, hard-clipped at full scale", partial(clipped, 12)),
    Condition("dc-offset", "DC offset of 0.1 (-20 dBFS)", partial(dc_offset, 0.1)),
    Condition("hum50", "50 Hz hum and harmonics, 10 dB below speech", partial(hum, 50)),
    *(
        Condition(f"{kind}{snr}", f"{kind} noise at {snr} dB SNR", partial(noise, kind, snr))
        for kind in ("white", "pink")
        for snr in (20, 10, 5)
    ),
    Condition("babble", "a second talker 15 dB below", partial(babble, -15)),
    Condition("reverb0.5", "synthetic reverb, RT60 0.5 s", partial(reverb, 0.5)),
    Condition("pad5s", "5 s of -60 dBFS noise before and after", partial(padded, 5, -60)),
    *(
        Condition(f"sr{hz}", f"sent at {hz} Hz", partial(rate, hz))
        for hz in (8_000, 22_050, 48_000)
    ),
]
BY_NAME = {c.name: c for c in CONDITIONS}


def recordings(items: list[Item]) -> list[Recording]:
    """Each item at the clean level, with its second talker: the review's pairing (the
    recording five places on in DEFAULT_IDS), or for another id one picked by its name."""
    pool = load_items(None, "^(" + "|".join(DEFAULT_IDS) + ")$")
    by_id = {i.id: i for i in pool}
    pool = [by_id[i] for i in DEFAULT_IDS if i in by_id]
    loaded: dict[str, np.ndarray] = {}

    def clean(item: Item) -> np.ndarray:
        if item.id not in loaded:
            loaded[item.id] = at_level(load_16k(item.path), CLEAN_DBFS)
        return loaded[item.id]

    out = []
    for item in items:
        ids = [p.id for p in pool]
        at = ids.index(item.id) if item.id in ids else zlib.crc32(item.id.encode())
        other = pool[(at + 5) % len(pool)]
        if other.id == item.id:  # never the speaker under itself
            other = pool[(at + 6) % len(pool)]
        out.append(Recording(item, clean(item), clean(other)))
    return out


def on_the_wire(condition: Condition, r: Recording, seed: int) -> tuple[np.ndarray, int]:
    """The altered copy as 16-bit PCM (clipped at full scale, as a WAV file would hold it)
    and its rate; its noise seeded by the seed, the condition and the recording."""
    rng = np.random.default_rng(
        [seed, zlib.crc32(condition.name.encode()), zlib.crc32(r.item.id.encode())]
    )
    samples, sr = condition.make(r, rng)
    return np.rint(np.clip(samples, -1, 1) * 32767).astype(np.int16), sr


# -- decoding -------------------------------------------------------------------------------


@dataclass
class Copy:
    """One recording under one condition, and what each side heard in it."""

    condition: str
    item: Item
    pcm: np.ndarray
    sample_rate: int
    offline: str = ""
    stream: str = ""
    error: str = ""


def decode_offline(copies: list[Copy], model_name: str, cache_path: Path) -> None:
    """Offline faster-whisper on the audio exactly as the server hears it (its decoder and
    resampler), cached by the model and that audio: a cache hit is the same decode."""
    cache: dict[str, str] = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    model = None
    for n, c in enumerate(copies, 1):
        audio = as_server_hears(c.pcm.tobytes(), c.sample_rate, 1, "LINEAR16")[0]
        key = f"{model_name}|{hashlib.sha1(audio.tobytes()).hexdigest()[:16]}"
        if key not in cache:
            if model is None:
                model = offline_model(model_name)
            cache[key] = offline_text(model, audio)
            print(f"  offline {n}/{len(copies)} {c.condition}/{c.item.id}", file=sys.stderr)
            cache_path.write_text(json.dumps(cache))  # a run cut short keeps what it decoded
        c.offline = cache[key]


async def stream_text(client: AsrClient, pcm: np.ndarray, sample_rate: int, language: str) -> str:
    """Stream mono PCM as ``asr-client file --fast`` does (100 ms messages, no pacing, the
    server's backpressure the only brake) and return its finals' text."""
    audio = PcmAudio(pcm.reshape(-1, 1), sample_rate)
    config = audio_config(sample_rate_hz=sample_rate, channels=1, language=language)
    finals: list[str] = []
    async with client.stream(config) as stream:

        async def send() -> None:
            for chunk in audio.chunks(CHUNK_MS):
                await stream.send_audio(chunk)
            await stream.end()

        sender = asyncio.create_task(send())
        async for event in stream:
            if event.HasField("result") and event.result.is_final:
                finals.append(event.result.text)
        await sender
    return " ".join(finals)


async def decode_streaming(copies: list[Copy], target: str, language: str) -> None:
    """Each copy streamed in turn over one connection; a stream that fails is recorded
    (and scored as nothing heard) and the run goes on."""
    async with AsrClient(target) as client:
        await client.wait_ready(30)
        for n, c in enumerate(copies, 1):
            try:
                c.stream = await asyncio.wait_for(
                    stream_text(client, c.pcm, c.sample_rate, language), STREAM_TIMEOUT_S
                )
            except Exception as exc:  # a timeout too: reported, and the run goes on
                c.error = f"{type(exc).__name__}: {exc}"[:300]
            note = f"ERROR {c.error}" if c.error else c.stream[:60]
            print(f"  stream {n}/{len(copies)} {c.condition}/{c.item.id}  {note}", file=sys.stderr)


# -- scoring --------------------------------------------------------------------------------


def words_right(reference: str, hypothesis: str) -> set[int]:
    """The positions of the (normalised) reference words the hypothesis got right."""
    import jiwer

    ref, hyp = normalize(reference), normalize(hypothesis)
    if not ref:
        return set()
    chunks = jiwer.process_words(ref, hyp).alignments[0]
    return {
        i for ch in chunks if ch.type == "equal" for i in range(ch.ref_start_idx, ch.ref_end_idx)
    }


def words_lost(reference: str, stream: str, offline: str) -> int:
    """Reference words offline got right and streaming did not: what streaming lost,
    not what the model never heard."""
    return len(words_right(reference, offline) - words_right(reference, stream))


@dataclass
class Figures:
    """One condition's outcome."""

    what: str
    streaming_wer: float
    offline_wer: float
    gap_points: float
    #: id, words lost, both texts: the files where streaming lost LOST_WORDS+ words
    files_lost_words: list[dict[str, object]]
    stream_errors: dict[str, str]
    #: per file: both texts and their WERs
    files: dict[str, dict[str, object]]


def figures(condition: str, copies: list[Copy]) -> Figures:
    mine = [c for c in copies if c.condition == condition]
    refs = [c.item.transcript for c in mine]
    ws = wer(refs, [c.stream for c in mine])
    wo = wer(refs, [c.offline for c in mine])
    lost: list[dict[str, object]] = []
    for c in mine:
        n = words_lost(c.item.transcript, c.stream, c.offline)
        if n >= LOST_WORDS:
            lost.append(
                {"id": c.item.id, "words_lost": n, "stream": c.stream, "offline": c.offline}
            )
    return Figures(
        what=BY_NAME[condition].what,
        streaming_wer=round(ws, 4),
        offline_wer=round(wo, 4),
        gap_points=round(100 * (ws - wo), 2),
        files_lost_words=lost,
        stream_errors={c.item.id: c.error for c in mine if c.error},
        files={
            c.item.id: {
                "stream": c.stream,
                "offline": c.offline,
                "streaming_wer": round(wer([c.item.transcript], [c.stream]), 4),
                "offline_wer": round(wer([c.item.transcript], [c.offline]), 4),
            }
            for c in mine
        },
    )


def print_table(results: dict[str, Figures]) -> None:
    head = f"{'condition':12s} {'stream':>7s} {'offline':>7s} {'gap':>7s}"
    print(f"{head}  files where streaming lost {LOST_WORDS}+ words offline kept")
    for name, f in results.items():
        listed = ", ".join(f"{x['id']} ({x['words_lost']})" for x in f.files_lost_words) or "-"
        if f.stream_errors:
            listed += f"  [{len(f.stream_errors)} stream error(s)]"
        print(
            f"{name:12s} {100 * f.streaming_wer:6.2f}% {100 * f.offline_wer:6.2f}% "
            f"{f.gap_points:+7.2f}  {listed}"
        )


# -- the run --------------------------------------------------------------------------------


async def run(a: argparse.Namespace) -> dict[str, Figures]:
    items = [i for i in load_items(None, a.ids) if len(references(i)) == 1]
    if not items:
        sys.exit("no single-talker recording matches --ids")
    chosen = [BY_NAME[n] for n in dict.fromkeys(a.condition)] if a.condition else CONDITIONS
    recs = recordings(items)
    copies = [Copy(c.name, r.item, *on_the_wire(c, r, a.seed)) for c in chosen for r in recs]
    print(f"{len(items)} recordings x {len(chosen)} conditions", file=sys.stderr)
    # offline first, so the server then has the CPU to itself
    decode_offline(copies, a.model, a.offline_cache)
    if a.server:
        await decode_streaming(copies, a.server, a.language)
    else:
        proc, port, _ = await start_server(
            a.model, ["--host", "127.0.0.1", *a.server_arg], log_path=a.server_log
        )
        try:  # the server goes with the script, on an error or Ctrl-C too
            await decode_streaming(copies, f"127.0.0.1:{port}", a.language)
        finally:
            proc.terminate()
            await proc.wait()
    return {c.name: figures(c.name, copies) for c in chosen}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--condition",
        action="append",
        choices=list(BY_NAME),
        metavar="NAME",
        help="a condition to run (repeatable; default: all): " + ", ".join(BY_NAME),
    )
    p.add_argument(
        "--ids",
        default="^(" + "|".join(DEFAULT_IDS) + ")$",
        help="recordings whose id matches this regular expression (default: the review's 12)",
    )
    p.add_argument("--model", default="tiny.en", help="the server's model, decoded offline too")
    p.add_argument("--language", default="en", help="the streams' language")
    p.add_argument("--seed", type=int, default=0, help="seeds every condition's noise")
    p.add_argument(
        "--server", metavar="HOST:PORT", help="a running server (running --model) instead of one"
    )
    p.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="a flag for the server started here (repeatable): --server-arg=--vad "
        "--server-arg=silero",
    )
    p.add_argument("--server-log", type=Path, help="where the started server's log goes")
    p.add_argument(
        "--offline-cache", type=Path, default=Path("/tmp/streamasr-conditions-offline.json")
    )
    p.add_argument("--json", type=Path, help="also write the figures (and every text) here")
    a = p.parse_args()
    if a.server and a.server_arg:
        p.error("--server-arg is for the server started here, not one given with --server")
    t0 = time.monotonic()
    results = asyncio.run(run(a))
    wall_s = time.monotonic() - t0
    print_table(results)
    print(f"({wall_s:.0f} s)", file=sys.stderr)
    if a.json:
        a.json.write_text(
            json.dumps(
                {
                    "model": a.model,
                    "language": a.language,
                    "seed": a.seed,
                    "ids": a.ids,
                    "server": a.server or "started here",
                    "server_args": a.server_arg,
                    "clean_dbfs": CLEAN_DBFS,
                    "wall_s": round(wall_s, 1),
                    "conditions": {name: asdict(f) for name, f in results.items()},
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
