"""Shared test helpers: the recorded corpus, servers on port 0, streaming a file."""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from asr_api.v1 import asr_pb2
from asr_client import AsrClient, ConnectionOptions, StreamClosedError, audio_config
from asr_client.resume import OutageInfo, ResumeInfo, ResumePolicy
from asr_server.app import RunningServer, start_server
from asr_server.engine.base import Engine
from asr_server.engine.fake import FakeEngine
from asr_server.metrics import Metrics
from asr_server.settings import Settings
from asr_server.vad.energy import EnergyVoiceDetector

ROOT = Path(__file__).resolve().parents[1]
SHARED_AUDIO = Path(os.environ.get("ASR_SHARED_AUDIO", ROOT.parent / "shared" / "audio"))


@dataclass(frozen=True)
class Recording:
    id: str
    path: Path
    duration_s: float
    sample_rate: int
    channels: int
    language: str
    category: str
    transcript: str


def corpus() -> dict[str, Recording]:
    """The shared recordings with their categories (MANIFEST.tsv joined with NOTES.tsv)."""
    with open(SHARED_AUDIO / "NOTES.tsv", newline="") as f:
        categories = {r["id"]: r["category"] for r in csv.DictReader(f, delimiter="\t")}
    out = {}
    with open(SHARED_AUDIO / "MANIFEST.tsv", newline="") as f:
        for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            out[r["id"]] = Recording(
                r["id"],
                SHARED_AUDIO / r["file"],
                float(r["duration_s"]),
                int(r["sample_rate"]),
                int(r["channels"]),
                r["language"],
                categories.get(r["id"], ""),
                r["transcript"],
            )
    return out


def read_pcm16(path: Path) -> tuple[np.ndarray, int]:
    """(frames × channels int16, sample rate)."""
    import soundfile as sf

    data, sr = sf.read(str(path), dtype="int16", always_2d=True)
    return data, sr


def first_channel(path: Path, rate: int = 16_000) -> np.ndarray:
    """A recording's first channel as float32 in [-1, 1], resampled to ``rate`` (soxr)."""
    import soxr

    pcm, sr = read_pcm16(path)
    return np.asarray(soxr.resample(pcm[:, 0].astype(np.float32) / 32768, sr, rate), np.float32)


def settings(**overrides: object) -> Settings:
    base: dict[str, object] = {"host": "127.0.0.1", "port": 0, "metrics_port": 0}
    base.update(overrides)
    return Settings.model_validate(base)


async def running_server(
    engine_factory: Callable[[Settings], Engine] | None = None, **overrides: object
) -> RunningServer:
    kwargs = {} if engine_factory is None else {"engine_factory": engine_factory}
    server = await start_server(settings(**overrides), metrics=Metrics(), **kwargs)  # type: ignore[arg-type]
    ready = asyncio.create_task(server.ready.wait())
    loader = server._loader
    assert loader is not None
    await asyncio.wait({ready, loader}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    if not ready.done():  # a load that failed says why at once, not after a minute
        ready.cancel()
        failed = loader.exception() if loader.done() else None
        await server.close()
        raise AssertionError(f"the server did not become ready: {failed or 'timeout'}")
    return server


@dataclass
class Received:
    t: float  # seconds since the first audio was sent
    response: asr_pb2.StreamingRecognizeResponse


async def stream_audio(
    port: int | ConnectionOptions,
    pcm: np.ndarray,
    sample_rate: int,
    *,
    speed: float | None = 4.0,
    chunk_ms: int = 100,
    config: asr_pb2.StreamingConfig | None = None,
    encoding: str = "LINEAR16",
    payload: bytes | None = None,
    resume: ResumePolicy | None = None,
    on_resume: Callable[[ResumeInfo], None] | None = None,
    on_outage: Callable[[OutageInfo], None] | None = None,
    on_response: Callable[[asr_pb2.StreamingRecognizeResponse], None] | None = None,
) -> list[Received]:
    """Stream ``pcm`` (frames × channels int16) at ``speed``× real time (None = unpaced) to a
    plaintext server on 127.0.0.1:``port``, or through ``ConnectionOptions``; with
    ``resume``, a stream that resumes when its call breaks."""
    channels = pcm.shape[1] if pcm.ndim == 2 else 1
    config = config or audio_config(
        sample_rate_hz=sample_rate, channels=channels, encoding=encoding
    )
    data = payload if payload is not None else pcm.astype("<i2").tobytes()
    bytes_per_frame = len(data) // max(1, pcm.shape[0])
    chunk = max(1, int(sample_rate * chunk_ms / 1000)) * bytes_per_frame
    received: list[Received] = []
    target = port if isinstance(port, ConnectionOptions) else f"127.0.0.1:{port}"
    async with AsrClient(target) as client:
        async with client.stream(
            config, resume=resume, on_resume=on_resume, on_outage=on_outage
        ) as stream:
            t0 = time.monotonic()

            async def send() -> None:
                for i, start in enumerate(range(0, len(data), chunk)):
                    await stream.send_audio(data[start : start + chunk])
                    if speed:
                        due = t0 + (i + 1) * chunk_ms / 1000 / speed
                        await asyncio.sleep(max(0.0, due - time.monotonic()))
                await stream.end()

            sender = asyncio.create_task(send())
            try:
                async for response in stream:
                    received.append(Received(time.monotonic() - t0, response))
                    if on_response is not None:
                        on_response(response)
            finally:
                await sender
    return received


def finals(received: list[Received], channel: int | None = None) -> list[asr_pb2.Result]:
    return [
        r.response.result
        for r in received
        if r.response.HasField("result")
        and r.response.result.is_final
        and (channel is None or r.response.result.channel == channel)
    ]


def final_text(received: list[Received], channel: int | None = None) -> str:
    return " ".join(r.text for r in finals(received, channel))


def tone(seconds: float, sr: int = 16_000, freq: float = 440.0, amp: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def keyed_digits(
    levels_db: tuple[float, ...], noise_db: float, sr: int = 16_000, seed: int = 0
) -> np.ndarray:
    """A line with nobody talking (white noise at ``noise_db`` dBFS) where a caller keys
    six touch-tone digits (ITU-T Q.23 pairs, 80–200 ms, 60–300 ms apart) at each of
    ``levels_db`` in turn, 3 s between the groups; float32 at ``sr``."""
    from asr_server.vad.tones import HIGH_GROUP_HZ, LOW_GROUP_HZ

    rng = np.random.default_rng(seed)
    parts: list[np.ndarray] = [np.zeros(sr, np.float32)]
    for level in levels_db:
        for _ in range(6):
            t = np.arange(int(rng.uniform(0.08, 0.2) * sr)) / sr
            low, high = rng.choice(LOW_GROUP_HZ), rng.choice(HIGH_GROUP_HZ)
            digit = np.sin(2 * np.pi * low * t) + np.sin(2 * np.pi * high * t)
            digit *= np.minimum(1, np.minimum(t, t[::-1]) / 0.005)  # 5 ms ramps
            digit *= 10 ** (level / 20) / np.sqrt(np.mean(digit**2))
            parts += [digit.astype(np.float32), np.zeros(int(rng.uniform(0.06, 0.3) * sr))]
        parts.append(np.zeros(3 * sr, np.float32))
    line = np.concatenate(parts).astype(np.float32)
    return line + (rng.standard_normal(line.size) * 10 ** (noise_db / 20)).astype(np.float32)


def band_noise(n: int, low_hz: float, high_hz: float, rng: np.random.Generator) -> np.ndarray:
    spectrum = np.fft.rfft(rng.standard_normal(n))
    hz = np.fft.rfftfreq(n, 1 / 16_000)
    spectrum[(hz < low_hz) | (hz > high_hz)] = 0
    return np.fft.irfft(spectrum, n)


def rustle_or_breaths(kind: str, level_db: float, noise_db: float, seed: int) -> np.ndarray:
    """30 s of an idle line (white noise at ``noise_db``) with paper rustle or breaths at
    about ``level_db`` every 1 to 3 s (the floor reviewer's scenes)."""
    rng = np.random.default_rng(seed)
    out = np.zeros(30 * 16_000)
    at = int(rng.uniform(1.5, 2.5) * 16_000)
    while True:
        level = level_db + rng.uniform(-3, 3)
        if kind == "paper":  # high-band noise under a slow, jagged envelope
            n = int(rng.uniform(0.5, 1.5) * 16_000)
            envelope = np.abs(band_noise(n, 2, 30, rng))
            sound = band_noise(n, 1500, 7500, rng) * envelope / envelope.max()
        else:  # a breath: mid-band noise swelling and fading
            n = int(rng.uniform(0.3, 0.7) * 16_000)
            sound = band_noise(n, 300, 2500, rng) * np.sin(np.linspace(0, np.pi, n)) ** 2
        sound *= 10 ** (level / 20) / np.sqrt(np.mean(sound**2))
        if at + n >= out.size - 16_000:
            break
        out[at : at + n] += sound
        at += n + int(rng.uniform(1.0, 3.0) * 16_000)
    out += rng.standard_normal(out.size) * 10 ** (noise_db / 20)
    return out.astype(np.float32)


def silence(seconds: float, sr: int = 16_000) -> np.ndarray:
    return np.zeros(int(seconds * sr), dtype=np.float32)


def to_pcm16(x: np.ndarray) -> np.ndarray:
    return (
        (np.clip(x, -1, 1) * 32767).astype(np.int16).reshape(-1, 1)
        if x.ndim == 1
        else (np.clip(x, -1, 1) * 32767).astype(np.int16)
    )


async def eventually(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait until ``predicate()`` holds, for state changed by threads or gRPC internals that
    offer no event to wait on; fails the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    pause = 0.0002  # most conditions hold within a thread hand-off: look again soon, then
    while not predicate():  # noqa: ASYNC110 - no event exists for these conditions
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.005)  # less often, as the wait grows


def entered(engine: object) -> asyncio.Event:
    """An event set (thread-safely) the first time the fake engine is called."""
    loop = asyncio.get_running_loop()
    event = asyncio.Event()
    previous = engine.on_call  # type: ignore[attr-defined]

    def hook(requests: object) -> None:
        loop.call_soon_threadsafe(event.set)
        if previous is not None:
            previous(requests)

    engine.on_call = hook  # type: ignore[attr-defined]
    return event


def fake_factory(engine: FakeEngine | None = None):  # type: ignore[no-untyped-def]
    """An engine factory that always returns ``engine`` (a fresh FakeEngine by default)."""
    engine = engine or FakeEngine()
    return lambda settings: engine


async def serve_fake(make_server, engine: FakeEngine | None = None, **settings):  # type: ignore[no-untyped-def]
    """A server on the fake engine with the energy detector (exact on tones)."""
    server = await make_server(fake_factory(engine), **settings)
    # tones, not speech: an energy detector keeps these logic tests exact
    server.servicer.services = dataclasses.replace(
        server.servicer.services, vad_factory=EnergyVoiceDetector
    )
    return server


def sample(server, name: str, **labels: str) -> float | None:  # type: ignore[no-untyped-def]
    """One value of an in-process server's metrics (None if that series has no value)."""
    return server.metrics.registry.get_sample_value(name, labels)


def speech_pcm(seconds: float = 1.0) -> np.ndarray:
    audio = np.concatenate([tone(seconds), silence(0.7)])
    return (audio * 32767).astype(np.int16).reshape(-1, 1)


def encode_container(
    pcm: np.ndarray,
    rate: int,
    fmt: str,
    codec: str,
    *,
    out_rate: int = 48_000,
    options: dict[str, str] | None = None,
) -> bytes:
    """``pcm`` (int16, frames × channels) encoded with FFmpeg (PyAV) into a ``fmt``
    container of ``codec`` at ``out_rate``: what a browser's MediaRecorder or a file
    upload hands a Deepgram client, made at test time from real recordings."""
    import io

    import av

    layout = {1: "mono", 2: "stereo"}[pcm.shape[1]]
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=fmt, options=options or {}) as container:
        stream = container.add_stream(codec, rate=out_rate, layout=layout)
        assert isinstance(stream, av.AudioStream)
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(pcm, dtype=np.int16).reshape(1, -1), format="s16", layout=layout
        )
        frame.sample_rate = rate
        to_codec = av.AudioResampler(
            format=stream.codec_context.codec.audio_formats[0].name, layout=layout, rate=out_rate
        )
        for piece in [*to_codec.resample(frame), *to_codec.resample(None)]:
            for packet in stream.encode(piece):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buffer.getvalue()


async def status_of(stream) -> tuple[grpc.StatusCode, str]:  # type: ignore[no-untyped-def]
    """Read a stream until it ends: its status code and details."""
    try:
        async for _ in stream:
            pass
    except StreamClosedError as exc:
        return exc.code, exc.details
    return grpc.StatusCode.OK, ""


async def bridge_with_a_cut(make_server, make_bridge):  # type: ignore[no-untyped-def]
    """A bridge reaching a fake server through a FaultProxy (``proxy.cut()`` breaks its
    gRPC stream) whose engine stalls while ``gate`` is clear: (gate, proxy, bridge)."""
    from tests.faultproxy import FaultProxy

    gate = threading.Event()
    gate.set()
    server = await serve_fake(make_server, FakeEngine(gate=gate))
    proxy = await FaultProxy(server.port).start()
    return gate, proxy, await make_bridge(proxy.port)


class SocketEvents(list[dict[str, Any]]):
    """The JSON events a WebSocket client has read, in order."""

    async def until(self, ws: Any, kind: str, timeout_s: float = 10.0) -> None:
        """Read until an event of ``kind`` has come."""
        while not self or self[-1]["type"] != kind:
            self.append(json.loads(await asyncio.wait_for(ws.recv(), timeout_s)))
