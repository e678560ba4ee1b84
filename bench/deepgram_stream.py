"""One recording streamed through asr-bridge's Deepgram live endpoint (``/v1/listen``), the
way pipecat's ``DeepgramSTTService`` streams it: raw linear16 at real-time pace, interim
results, and a ``Finalize`` message when the client's VAD stops (the time to final
segment of ``streaming_bench.py --finalize-at-vad-stop``, taken on the bridge's path).

``start_bridge`` starts an ``asr-bridge`` in front of a server; ``stream_one`` returns the
same ``Outcome`` as ``streaming_bench.stream_one``, so ``paired_bench.py`` can set the
bridge's path beside the direct gRPC one in the same machine state (``VIA=deepgram``).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from urllib.parse import urlencode

import streaming_bench as sb
from websockets.asyncio.client import connect


async def start_bridge(grpc_port: int) -> tuple[asyncio.subprocess.Process, int]:
    """An ``asr-bridge`` (no token: loopback only) in front of the server at ``grpc_port``."""
    port = sb.free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "asr_bridge",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--server",
        f"127.0.0.1:{grpc_port}",
        "--log-level",
        "WARNING",
        env={k: v for k, v in os.environ.items() if k != "ASR_BRIDGE_TOKEN"},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        preexec_fn=sb.die_with_parent,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return proc, port
        except OSError:
            await asyncio.sleep(0.1)
    proc.terminate()
    raise RuntimeError("asr-bridge did not start listening within 30 s")


async def stream_one(
    bridge_port: int, item: sb.Item, chunk_ms: int, speech_ends: list[float]
) -> sb.Outcome:
    """``item`` (mono) through the bridge at real-time pace, a ``Finalize`` at each of
    ``speech_ends`` plus the VAD's stop delay, then ``CloseStream``."""
    pcm, sr = sb.load_pcm(item)
    assert pcm.shape[1] == 1, "the bridge's path is measured on mono recordings"
    # then silence, as streaming_bench sends: every utterance ends by endpointing or a
    # Finalize, never by the end of the stream
    data = pcm.tobytes() + bytes(2 * int(sr * sb.TRAILING_SILENCE_S))
    chunk = int(sr * chunk_ms / 1000) * 2
    query = urlencode(
        {  # pipecat's defaults (DeepgramSTTService.Settings), with its VAD events on
            "model": "nova-3-general",
            "language": "en",
            "encoding": "linear16",
            "sample_rate": sr,
            "channels": 1,
            "interim_results": "true",
            "punctuate": "true",
            "smart_format": "false",
            "vad_events": "true",
        }
    )
    out = sb.Outcome(item)
    texts: list[str] = []
    unfinished = list(speech_ends)
    stops = list(speech_ends)
    onset: float | None = None
    async with connect(f"ws://127.0.0.1:{bridge_port}/v1/listen?{query}") as ws:
        t0 = time.monotonic()

        def wall(audio_s: float) -> float:  # when audio time x existed at the source
            return t0 + audio_s

        async def send() -> None:
            for start in range(0, len(data), chunk):
                piece = data[start : start + chunk]
                sent_s = (start + len(piece)) / 2 / sr
                await asyncio.sleep(max(0.0, wall(sent_s) - time.monotonic()))
                await ws.send(piece)
                while stops and stops[0] + sb.VAD_STOP_S <= sent_s:
                    stops.pop(0)
                    await ws.send(json.dumps({"type": "Finalize"}))
            await ws.send(json.dumps({"type": "CloseStream"}))

        sender = asyncio.create_task(send())
        async for raw in ws:
            now = time.monotonic()
            message = json.loads(raw)
            if message["type"] == "SpeechStarted":
                onset = message["timestamp"]
                continue
            if message["type"] != "Results":
                continue
            transcript = message["channel"]["alternatives"][0]["transcript"]
            if not message["is_final"]:
                if onset is not None and transcript:
                    out.ttfp.append(now - wall(onset))
                    onset = None
                continue
            if transcript:
                texts.append(transcript)
            end_s = message["start"] + message["duration"]
            # the final that reaches a client-heard speech end (within its pad)
            while unfinished and end_s >= unfinished[0] - 0.1:
                out.ttfs.append(now - wall(unfinished.pop(0)))
        await sender
    out.hypothesis = {0: " ".join(texts)} if texts else {}
    return out
