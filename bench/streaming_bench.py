"""Streaming benchmark: WER streaming vs offline, latency, CPU and memory. Prints figures.

Starts ``asr-server`` as a separate process (embedded tiny.en unless --model), streams the
shared corpus to it at real-time pace, one recording at a time, the way a microphone
would (a chunk is sent once the audio it holds would exist), and measures:

* WER of the streaming finals, and of offline faster-whisper (``WhisperModel.transcribe``
  with its defaults) on the same model, files and normaliser;
* time to first partial: from the speech onset the server reports (SPEECH_STARTED) to the
  first partial of that utterance;
* end-of-speech to final: from the end of speech (SPEECH_ENDED) to the final; finals of
  utterances the server split at a pause have no speech end and are counted apart. Each
  recording is followed by 2.5 s of silence, so every utterance ends by endpointing,
  never by the end of the stream;
* server CPU seconds per audio second, and its peak resident memory;
* with --finalize-at-vad-stop, pipecat's "time to final segment": the client runs its own
  Silero VAD (stop after 200 ms of silence, as pipecat's default) and sends Finalize when
  it stops, as pipecat's STT services do; TTFS runs from the end of speech that VAD heard
  (its stop minus the 200 ms) to the final that reaches it;
* with --word-latency, word emission latency: from the end of a spoken word to the first
  result (partial, eager or final) that shows it (bench/word_latency.py).

Usage: python bench/streaming_bench.py [--limit N] [--speed 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import re
import socket
import statistics
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
import soundfile as sf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from children import die_with_parent  # noqa: E402
from word_latency import ChannelWords, SpokenWord, spoken_words  # noqa: E402

from asr_client import AsrClient, audio_config  # noqa: E402
from asr_client.audio_files import to_int16  # noqa: E402
from asr_client.scoring import normalize, wer  # noqa: E402

SHARED = Path(os.environ.get("ASR_SHARED_AUDIO", ROOT.parent / "shared" / "audio"))
#: the shared corpus's categories that are scored, and bench/synth_corpus.py's
WER_CATEGORIES = {"short_read", "multispeaker", "telephony_8k", "synthetic_phrases"}
_CHANNEL_TAG = re.compile(r"\[(left|right)\]", re.IGNORECASE)


@dataclass
class Item:
    id: str
    path: Path
    duration_s: float
    transcript: str
    source: str


@dataclass
class Outcome:
    item: Item
    hypothesis: dict[int, str] = field(default_factory=dict)
    ttfp: list[float] = field(default_factory=list)
    final_latency: list[float] = field(default_factory=list)
    turn_latency: list[float] = field(default_factory=list)  # SEMANTIC: speech end → EndOfTurn
    # --eager: eager results sent, withdrawn (speech resumed), and finals that differed
    eager_sent: int = 0
    eager_withdrawn: int = 0
    eager_confirmed_same: int = 0
    eager_confirmed_changed: int = 0
    eager_latency: list[float] = field(default_factory=list)  # speech end → confirmed eager
    # --word-latency: end of a spoken word → first result showing it; words spoken, shown
    word_latency: list[float] = field(default_factory=list)
    words_spoken: int = 0
    words_shown: int = 0
    ttfs: list[float] = field(default_factory=list)  # --finalize-at-vad-stop
    #: finals of utterances the server split at a pause (no SPEECH_ENDED): not an end of
    #: speech, so not in final_latency
    split_finals: int = 0
    #: per split final: the pause it was cut at (its end_s) → the final
    split_latency: list[float] = field(default_factory=list)


def load_items(limit: int | None, pattern: str | None = None) -> list[Item]:
    """The corpus's WER set (``pattern``: ids it matches; ``limit``: the first so many).
    None of it is an error, not a perfect score over nothing."""
    try:
        wanted = re.compile(pattern or "")
    except re.error as exc:
        sys.exit(f"--ids {pattern!r} is not a regular expression: {exc}")
    if not (SHARED / "MANIFEST.tsv").is_file():
        sys.exit(f"no shared corpus at {SHARED} (set ASR_SHARED_AUDIO to its folder)")
    with open(SHARED / "NOTES.tsv", newline="") as f:
        category = {r["id"]: r["category"] for r in csv.DictReader(f, delimiter="\t")}
    items = []
    with open(SHARED / "MANIFEST.tsv", newline="") as f:
        for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            if r["language"] != "en" or r["transcript"] == "unknown":
                continue
            if category.get(r["id"]) not in WER_CATEGORIES:
                continue
            if not wanted.search(r["id"]):
                continue
            source = r["id"].split("_")[0]
            items.append(
                Item(r["id"], SHARED / r["file"], float(r["duration_s"]), r["transcript"], source)
            )
    items = items[:limit] if limit else items
    if not items:
        sys.exit("no recording of the corpus's WER set matches --ids/--limit")
    return items


def references(item: Item) -> dict[int, str]:
    """Per-channel references for [left]/[right] files, else one for channel 0."""
    parts = _CHANNEL_TAG.split(item.transcript)
    if len(parts) == 1:
        return {0: item.transcript}
    refs: dict[int, str] = {}
    for tag, text in zip(parts[1::2], parts[2::2], strict=True):
        ch = 0 if tag.lower() == "left" else 1
        refs[ch] = (refs.get(ch, "") + " " + text).strip()
    return refs


#: hisses per second of audio added to every recording (paired_bench --hiss; 0 = none):
#: 60 ms of white noise at -34 dBFS, at random moments (seeded per recording), a rough
#: stand-in for the breaths and clicks of a real microphone; webrtc takes each for voice
HISS_PER_S = 0.0
HISS_S, HISS_RMS = 0.06, 0.02


def load_pcm(item: Item) -> tuple[np.ndarray, int]:
    data, sr = sf.read(str(item.path), dtype="float32", always_2d=True)
    if len(references(item)) == 1 and data.shape[1] > 1:
        data = data.mean(axis=1, keepdims=True)  # one talker on several channels
    if HISS_PER_S:
        rng = np.random.default_rng(zlib.crc32(item.id.encode()))
        n = int(HISS_S * sr)
        for _ in range(rng.poisson(HISS_PER_S * data.shape[0] / sr)):
            at = int(rng.integers(0, max(1, data.shape[0] - n)))
            data[at : at + n] += rng.standard_normal((n, data.shape[1])) * HISS_RMS
    return (np.clip(data, -1, 1) * 32767).astype(np.int16), sr


def telephone(pcm: np.ndarray, sr: int) -> tuple[bytes, int]:
    """Each channel band-limited to 300-3400 Hz at 8 kHz, mu-law interleaved: a phone line."""
    from asr_client.load.calls import telephone_band
    from asr_server.audio.g711 import mulaw_encode

    narrow = np.stack([telephone_band(pcm[:, c], sr) for c in range(pcm.shape[1])], axis=1)
    return mulaw_encode(narrow.reshape(-1)), 8000


def resampled_call(mulaw: bytes, channels: int) -> np.ndarray:
    """A phone line's 8 kHz mu-law decoded and resampled to 16 kHz with soxr (frames x
    channels, float32): pipecat's path for Twilio's calls, nothing above 4 kHz."""
    import soxr

    from asr_server.audio.decode import Encoding, decode_samples

    at_8k = decode_samples(mulaw, Encoding.MULAW).reshape(-1, channels)
    return np.asarray(soxr.resample(at_8k, 8_000, 16_000), np.float32)


async def stream_one(
    port: int,
    item: Item,
    speed: float,
    chunk_ms: int,
    phone: bool = False,
    endpointing: str = "silence",
    eager: bool = False,
    spoken: dict[int, list[SpokenWord]] | None = None,
    language: str = "",
    speech_ends: list[float] | None = None,
    phone_resampled: bool = False,
) -> Outcome:
    """One recording at ``speed``; ``speech_ends`` (audio seconds): where a client VAD heard
    speech end, finalized VAD_STOP_S later (the --finalize-at-vad-stop mode)."""
    pcm, sr = load_pcm(item)
    channels = pcm.shape[1]
    data = pcm.tobytes()
    frame_bytes = 2 * channels
    encoding = "LINEAR16"
    if phone:
        data, sr = telephone(pcm, sr)
        frame_bytes, encoding = channels, "MULAW"
        if phone_resampled:  # decoded and sent on as 16 kHz PCM, as agent frameworks do
            data, sr = to_int16(resampled_call(data, channels)).tobytes(), 16_000
            frame_bytes, encoding = 2 * channels, "LINEAR16"
    chunk = int(sr * chunk_ms / 1000) * frame_bytes
    # after the recording, silence at the same pace: most recordings stop where their
    # speech does, and a stream that ended there would end its last utterance itself, so
    # that final would measure the end of the stream, not endpointing
    silence = silence_bytes(encoding, int(sr * TRAILING_SILENCE_S) * channels)
    out = Outcome(item)
    onset: dict[tuple[int, int], float] = {}
    speech_end: dict[tuple[int, int], float] = {}
    first_partial: set[tuple[int, int]] = set()
    texts: dict[int, list[str]] = {}
    shown = {ch: ChannelWords(words) for ch, words in (spoken or {}).items()}
    async with AsrClient(f"127.0.0.1:{port}") as client:
        config = audio_config(
            sample_rate_hz=sr,
            channels=channels,
            encoding=encoding,
            endpointing=endpointing,  # type: ignore[arg-type]
            eager_finals=eager,
            language=language,
        )
        pending_eager: dict[tuple[int, int], tuple[str, float]] = {}  # text, when received
        async with client.stream(config) as stream:
            t0 = time.monotonic()

            def wall(audio_s: float) -> float:  # when audio time x existed at the source
                return t0 + audio_s / speed

            async def send() -> None:
                sent = data + silence
                for start in range(0, len(sent), chunk):
                    piece = sent[start : start + chunk]
                    # a chunk can be sent only once the audio it holds has been "recorded"
                    due = wall((start + len(piece)) / frame_bytes / sr)
                    await asyncio.sleep(max(0.0, due - time.monotonic()))
                    await stream.send_audio(piece)
                    sent_s = (start + len(piece)) / frame_bytes / sr
                    while stops and stops[0] + VAD_STOP_S <= sent_s:
                        stops.pop(0)
                        await stream.finalize()
                await stream.end()

            stops = list(speech_ends or [])
            unfinished = list(speech_ends or [])

            sender = asyncio.create_task(send())
            async for event in stream:
                now = time.monotonic()
                if event.HasField("end_of_turn"):  # SEMANTIC: end of speech → the event
                    out.turn_latency.append(now - wall(event.end_of_turn.offset_s))
                    continue
                if event.HasField("speech_event"):
                    ev = event.speech_event
                    key = (ev.channel, ev.utterance_id)
                    if ev.type == ev.SPEECH_RESUMED:
                        pending_eager.pop(key, None)
                        out.eager_withdrawn += 1
                    elif ev.type == ev.SPEECH_STARTED:
                        onset[key] = ev.offset_s
                    else:
                        speech_end[key] = ev.offset_s
                    continue
                if not event.HasField("result"):  # the closing progress report
                    continue
                r = event.result
                key = (r.channel, r.utterance_id)
                if r.channel in shown:
                    shown[r.channel].result(
                        r.text, r.is_final and not r.eager, now, (now - t0) * speed
                    )
                if r.eager:
                    out.eager_sent += 1
                    pending_eager[key] = (r.text, now)
                    continue
                if not r.is_final:
                    if key not in first_partial and key in onset:
                        first_partial.add(key)
                        out.ttfp.append(now - wall(onset[key]))
                    continue
                texts.setdefault(r.channel, []).append(r.text)
                # the final that reaches a client-heard speech end (within its pad)
                while unfinished and r.end_s >= unfinished[0] - 0.1:
                    out.ttfs.append(now - wall(unfinished.pop(0)))
                end = speech_end.get(key)
                if end is None:  # split at a pause: its end_s is the pause's pad, no speech end
                    out.split_finals += 1
                    out.split_latency.append(now - wall(r.end_s))
                    continue
                out.final_latency.append(now - wall(end))
                if key in pending_eager:
                    eager_text, eager_at = pending_eager.pop(key)
                    if eager_text == r.text:
                        out.eager_confirmed_same += 1
                    else:
                        out.eager_confirmed_changed += 1
                    out.eager_latency.append(eager_at - wall(end))
            await sender
    for words in shown.values():
        out.word_latency += words.latencies(wall)
        out.words_spoken += len(words.spoken)
        out.words_shown += len(words.emitted_at)
    out.hypothesis = {ch: " ".join(t) for ch, t in texts.items()}
    return out


def as_server_hears(
    data: bytes, sample_rate_hz: int, channels: int, encoding: str
) -> list[np.ndarray]:
    """Wire audio as the server hears it: sent in 20 ms messages through its own decoder
    and resampler (16 kHz float32, one array per channel)."""
    from asr_server.audio.decode import AudioDecoder, AudioFormat, Encoding

    fmt = AudioFormat(Encoding(encoding), sample_rate_hz, channels)
    decoder = AudioDecoder(fmt)
    step = sample_rate_hz // 50 * fmt.frame_bytes
    pieces = [decoder.decode(data[i : i + step]) for i in range(0, len(data), step)]
    pieces.append(decoder.flush())
    return [np.concatenate([p[ch] for p in pieces]) for ch in range(channels)]


def channel_audio(item: Item, phone: bool = False) -> dict[int, np.ndarray]:
    """Each scored channel as 16 kHz float32, as the server gets it: at the recording's
    rate (or as a phone line) through the server's own decoder and resampler. Offline
    decodes the same audio, so the two differ only in how they decode it (tiny.en's WER
    moves by half a point between resamplers that agree to 80 dB in the voice band:
    docs/accuracy.md)."""
    pcm, sr = load_pcm(item)
    channels = pcm.shape[1]
    if phone:
        data, sr = telephone(pcm, sr)
        heard = as_server_hears(data, sr, channels, "MULAW")
    else:
        heard = as_server_hears(pcm.tobytes(), sr, channels, "LINEAR16")
    return {ch: heard[ch] for ch in references(item)}


def offline_text(model, audio: np.ndarray) -> str:  # type: ignore[no-untyped-def]
    """Offline faster-whisper with its defaults (beam 5, 30 s windows), the baseline."""
    segments, _ = model.transcribe(audio, language="en")
    return " ".join(s.text.strip() for s in segments)


def offline_model(model_name: str):  # type: ignore[no-untyped-def]
    """Offline faster-whisper (int8, CPU) on the model the server runs."""
    from faster_whisper import WhisperModel

    from asr_server.engine.models import resolve_model

    path = resolve_model(model_name, Path.home() / ".cache" / "streamasr").path_or_id
    return WhisperModel(path, device="cpu", compute_type="int8")


def offline_hypotheses(
    items: list[Item], model_name: str, phone: bool = False
) -> dict[tuple[str, int], str]:
    """Offline faster-whisper on the same audio the server gets (the phone line too)."""
    model = offline_model(model_name)
    return {
        (item.id, ch): offline_text(model, audio)
        for item in items
        for ch, audio in channel_audio(item, phone).items()
    }


#: the client VAD's stop delay (pipecat's VADParams.stop_secs default)
VAD_STOP_S = 0.2
#: silence sent after each recording: more than the longest a SEMANTIC pause is held
#: (endpointing.max_silence_ms, 2 s), so every utterance ends by endpointing
TRAILING_SILENCE_S = 2.5


def silence_bytes(encoding: str, samples: int) -> bytes:
    """``samples`` of silence on the wire (μ-law's zero is not the byte 0)."""
    from asr_server.audio.g711 import mulaw_encode

    zeros = np.zeros(samples, np.int16)
    return mulaw_encode(zeros) if encoding == "MULAW" else zeros.astype("<i2").tobytes()


def client_vad_speech_ends(item: Item) -> list[float]:
    """Where Silero (faster-whisper's copy) hears speech end in a mono recording, with
    pipecat's settings: confidence 0.7, 200 ms of silence to stop, 200 ms to start."""
    from faster_whisper.vad import VadOptions, get_speech_timestamps

    (audio,) = channel_audio(item).values()
    # with the silence the stream sends after it: speech up to the recording's end then
    # ends where the speech does, as a live VAD would hear it (not at the file's end)
    audio = np.concatenate([audio, np.zeros(int(16_000 * TRAILING_SILENCE_S), np.float32)])
    options = VadOptions(
        threshold=0.7, min_silence_duration_ms=200, min_speech_duration_ms=200, speech_pad_ms=0
    )
    return [seg["end"] / 16_000 for seg in get_speech_timestamps(audio, options)]


def word_ends(
    items: list[Item], model_name: str, phone: bool = False
) -> dict[tuple[str, int], list[SpokenWord]]:
    """The spoken words of each scored channel and when they end (offline word timestamps),
    taken before the server starts so that it has the CPU to itself."""
    model = offline_model(model_name)
    return {
        (item.id, ch): spoken_words(model, audio)
        for item in items
        for ch, audio in channel_audio(item, phone).items()
    }


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def start_server(
    model: str,
    extra: list[str],
    env: dict[str, str] | None = None,
    code: Path = ROOT,
    log_path: Path | None = None,
) -> tuple[asyncio.subprocess.Process, int, int]:
    """The server, its gRPC port and its metrics port; ``env``: settings (``ASR_*``) on
    top of this process's environment; ``code``: a checkout to run it from (another
    commit's ``git worktree``, to compare code in the same machine state); ``log_path``:
    where its log goes (``ASR_LOG_LEVEL=DEBUG`` in ``env`` logs every final decode)."""
    if log_path:
        log_path.parent.mkdir(parents=True, exist_ok=True)
    port, metrics_port = free_port(), free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "asr_server",
        "--port",
        str(port),
        "--metrics-port",
        str(metrics_port),
        "--model",
        model,
        *extra,
        cwd=code,
        env={**os.environ, **(env or {})},
        stderr=asyncio.subprocess.PIPE,
        preexec_fn=die_with_parent,
    )
    assert proc.stderr is not None
    said: list[str] = []
    while True:
        line = (await proc.stderr.readline()).decode()
        if not line:
            await proc.wait()
            last = "".join(said[-10:]).rstrip()  # the server's own reason (a bad --model)
            raise SystemExit(
                f"the server exited before it was ready (status {proc.returncode}):\n{last}"
            )
        said.append(line)
        if "streamasr is ready" in line:
            break

    async def drain() -> None:
        assert proc.stderr is not None
        log = log_path.open("ab") if log_path else None
        try:
            while line := await proc.stderr.readline():
                if log:
                    log.write(line)
        finally:
            if log:
                log.close()

    proc._drain = asyncio.create_task(drain())  # type: ignore[attr-defined]
    return proc, port, metrics_port


def scored(outcomes: list[Outcome]) -> tuple[list[str], list[str], list[str]]:
    """References, hypotheses and sources, one of each per scored channel."""
    refs, hyps, sources = [], [], []
    for o in outcomes:
        for ch, ref in references(o.item).items():
            refs.append(ref)
            hyps.append(o.hypothesis.get(ch, ""))
            sources.append(o.item.source)
    return refs, hyps, sources


def ttfs_figures(outcomes: list[Outcome]) -> dict[str, object]:
    """Time to final segment (--finalize-at-vad-stop): median, p95, p99."""
    ttfs = [x for o in outcomes for x in o.ttfs]
    return {
        "speech_ends": len(ttfs),
        "median_s": round(statistics.median(ttfs), 3) if ttfs else None,
        "p95_s": round(pct(ttfs, 95), 3),
        "p99_s": round(pct(ttfs, 99), 3),
    }


def metric_families(metrics_port: int) -> list:  # type: ignore[type-arg]
    """The server's metrics, parsed."""
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    text = urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    return list(text_string_to_metric_families(text))


def engine_times(metrics_port: int) -> dict[str, dict[str, float]]:
    """Mean engine call time and queue wait per decode kind, from the server's metrics:
    where the time to a final goes."""
    sums: dict[tuple[str, str], dict[str, float]] = {}
    for family in metric_families(metrics_port):
        if family.name not in ("asr_engine_inference_seconds", "asr_engine_queue_wait_seconds"):
            continue
        for sample in family.samples:
            if sample.name.endswith(("_sum", "_count")):
                key = (family.name, sample.labels.get("kind", ""))
                sums.setdefault(key, {})[sample.name.rsplit("_", 1)[1]] = sample.value
    out: dict[str, dict[str, float]] = {}
    for (name, kind), v in sorted(sums.items()):
        if v.get("count"):
            what = "inference_mean_s" if "inference" in name else "queue_wait_mean_s"
            out.setdefault(kind, {})[what] = round(v["sum"] / v["count"], 4)
            out[kind]["calls"] = int(v["count"])
    return out


def counter(metrics_port: int, name: str) -> float | None:
    """A counter's value from the server's metrics (``name`` without ``_total``); None if
    that server has no such counter (older code)."""
    for family in metric_families(metrics_port):
        if family.name == name:
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    return None


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--limit", type=int, help="only the first N recordings")
    p.add_argument("--ids", help="only recordings whose id matches this regular expression")
    p.add_argument("--speed", type=float, default=1.0, help="1 = real time")
    p.add_argument(
        "--chunk-ms", type=int, default=20, help="audio per message (voice agents send 20 ms)"
    )
    p.add_argument("--model", default="tiny.en")
    p.add_argument(
        "--language", default="", help="the streams' language (en for a multilingual model)"
    )
    p.add_argument("--no-offline", action="store_true", help="skip the offline WER baseline")
    p.add_argument(
        "--telephone",
        action="store_true",
        help="send every recording as a phone line: 300-3400 Hz, 8 kHz, mu-law",
    )
    p.add_argument(
        "--resampled",
        action="store_true",
        help="with --telephone: send the phone line resampled to 16 kHz PCM, as agent "
        "frameworks do (the offline baseline and word timing still hear it at 8 kHz)",
    )
    p.add_argument(
        "--endpointing",
        choices=("silence", "semantic"),
        default="silence",
        help="semantic: the turn model ends utterances (needs asr-server turn-model)",
    )
    p.add_argument(
        "--eager",
        action="store_true",
        help="eager finals: count how many were withdrawn or changed, and their latency",
    )
    p.add_argument(
        "--finalize-at-vad-stop",
        action="store_true",
        help="pipecat's time to final segment: a client VAD finalizes 200 ms into each pause "
        "(mono recordings only)",
    )
    p.add_argument(
        "--word-latency",
        action="store_true",
        help="word emission latency (needs offline word timestamps first: about a minute)",
    )
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("--show", action="store_true", help="print texts that differ from offline")
    p.add_argument("server_args", nargs="*", help="extra asr-server flags after --")
    a = p.parse_args()
    items = load_items(a.limit, a.ids)
    if a.finalize_at_vad_stop:
        items = [i for i in items if len(references(i)) == 1]
    if not items:
        sys.exit(
            "no recording of the corpus's WER set matches --ids/--limit (or, with "
            "--finalize-at-vad-stop, is mono)"
        )
    spoken = word_ends(items, a.model, a.telephone) if a.word_latency else {}
    client_ends = {i.id: client_vad_speech_ends(i) for i in items} if a.finalize_at_vad_stop else {}
    proc, port, metrics_port = await start_server(a.model, a.server_args)
    try:  # the server goes with the script, also when a stream fails
        server = psutil.Process(proc.pid)
        cpu0 = server.cpu_times()
        outcomes = []
        t_start = time.monotonic()
        for item in items:
            outcomes.append(
                await stream_one(
                    port,
                    item,
                    a.speed,
                    a.chunk_ms,
                    a.telephone,
                    a.endpointing,
                    a.eager,
                    {ch: w for (i, ch), w in spoken.items() if i == item.id},
                    a.language,
                    client_ends.get(item.id),
                    a.resampled,
                )
            )
            print(
                f"  {item.id:40s} {item.duration_s:6.1f}s  "
                f"{' | '.join(outcomes[-1].hypothesis.values())[:70]}",
                file=sys.stderr,
            )
        wall_s = time.monotonic() - t_start
        cpu1 = server.cpu_times()
        cpu_s = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
        peak_mb = peak_rss_mb(proc.pid)
        engine = engine_times(metrics_port)
    finally:
        proc.terminate()
        await proc.wait()

    refs, hyps, sources = scored(outcomes)
    audio_s = sum(o.item.duration_s for o in outcomes)
    ttfp = [x for o in outcomes for x in o.ttfp]
    fl = [x for o in outcomes for x in o.final_latency]
    tl = [x for o in outcomes for x in o.turn_latency]
    figures: dict[str, object] = {
        "recordings": len(outcomes),
        "audio_s": round(audio_s, 1),
        "wall_s": round(wall_s, 1),
        "streaming_wer": round(wer(refs, hyps), 4),
        "ttfp_median_s": round(statistics.median(ttfp), 3) if ttfp else None,
        "ttfp_p95_s": round(pct(ttfp, 95), 3),
        "final_latency_median_s": round(statistics.median(fl), 3) if fl else None,
        "final_latency_p95_s": round(pct(fl, 95), 3),
        "utterances": len(fl),
        "split_finals": sum(o.split_finals for o in outcomes),
        "endpointing": a.endpointing,
        "end_of_turn_median_s": round(statistics.median(tl), 3) if tl else None,
        "end_of_turn_p95_s": round(pct(tl, 95), 3) if tl else None,
        "server_cpu_s_per_audio_s": round(cpu_s / audio_s, 3),
        "final_latency_p99_s": round(pct(fl, 99), 3),
        "server_peak_rss_mb": round(peak_mb, 1),
        "engine": engine,
        "speed": a.speed,
        "chunk_ms": a.chunk_ms,
        "model": a.model,
        "language": a.language or None,
        "cpu_count": os.cpu_count(),
    }
    if a.finalize_at_vad_stop:
        figures["ttfs_finalize_at_vad_stop"] = ttfs_figures(outcomes)
    if a.word_latency:
        wl = [x for o in outcomes for x in o.word_latency]
        figures["word_emission"] = {
            "mean_s": round(statistics.fmean(wl), 3) if wl else None,
            "median_s": round(statistics.median(wl), 3) if wl else None,
            "p95_s": round(pct(wl, 95), 3),
            "words_shown": sum(o.words_shown for o in outcomes),
            "words_spoken": sum(o.words_spoken for o in outcomes),
        }
    if a.eager:
        el = [x for o in outcomes for x in o.eager_latency]
        figures["eager"] = {
            "sent": sum(o.eager_sent for o in outcomes),
            "withdrawn": sum(o.eager_withdrawn for o in outcomes),
            "confirmed_same_text": sum(o.eager_confirmed_same for o in outcomes),
            "confirmed_other_text": sum(o.eager_confirmed_changed for o in outcomes),
            "latency_median_s": round(statistics.median(el), 3) if el else None,
            "latency_p95_s": round(pct(el, 95), 3) if el else None,
        }
    by_source: dict[str, tuple[list[str], list[str]]] = {}
    for s, r, h in zip(sources, refs, hyps, strict=True):
        by_source.setdefault(s, ([], []))[0].append(r)
        by_source[s][1].append(h)
    figures["streaming_wer_by_source"] = {
        s: round(wer(r, h), 4) for s, (r, h) in sorted(by_source.items())
    }
    if not a.no_offline:
        offline = offline_hypotheses([o.item for o in outcomes], a.model, a.telephone)
        off = [offline[(o.item.id, ch)] for o in outcomes for ch in references(o.item)]
        figures["offline_wer"] = round(wer(refs, off), 4)
        figures["offline_wer_by_source"] = {
            s: round(
                wer(
                    [r for r, src in zip(refs, sources, strict=True) if src == s],
                    [h for h, src in zip(off, sources, strict=True) if src == s],
                ),
                4,
            )
            for s in sorted(by_source)
        }
        ids = [o.item.id for o in outcomes for _ in references(o.item)]  # one per channel
        worse = [
            (o_id, normalize(h), normalize(oh))
            for o_id, h, oh in zip(ids, hyps, off, strict=True)
            if normalize(h) != normalize(oh)
        ]
        figures["files_differing_from_offline"] = len(worse)
        if a.show:
            for o_id, h, oh in worse:
                print(f"{o_id}\n  stream:  {h}\n  offline: {oh}", file=sys.stderr)
    print(json.dumps(figures, indent=2))
    if a.json:  # with every latency, for bench/plot_latency.py
        figures["samples"] = {
            "final_latency_s": [round(x, 4) for x in fl],
            "ttfp_s": [round(x, 4) for x in ttfp],
            "word_emission_s": [round(x, 4) for o in outcomes for x in o.word_latency],
            "ttfs_s": [round(x, 4) for o in outcomes for x in o.ttfs],
            "end_of_turn_s": [round(x, 4) for x in tl],
        }
        a.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
