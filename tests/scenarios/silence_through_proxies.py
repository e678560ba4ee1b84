"""Calls that hold a minute with no word from the server, through nginx and Envoy at once.

Two kinds of call, through each proxy: one sends five minutes of silence (a quiet line),
the other no audio at all, only a keep-alive every 20 s (a caller on hold, a muted
microphone). No stream resumes: a proxy that cuts one fails it.

Run in the background of the suite (tests/background.py): it waits a minute on the wall
clock and needs little CPU. Prints, as its last line, a JSON object: for each call
("nginx/silence", "envoy/hold", ...) the (arrival time, kind) of every response, or
``{"skip": reason}``. The assertions are in tests/integration/test_proxies.py.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np

from asr_client import AsrClient, audio_config
from asr_client.api import RecognitionStream
from tests.helpers import ROOT, read_pcm16
from tests.processes import proxied_replicas, proxies_missing
from tests.scenarios import stop_with_the_suite

SR = 16_000
SPEECH = read_pcm16(ROOT / "audio_samples" / "libri_1089-134691-0001.flac")[0][:, 0]
#: Five minutes of silence in the middle of a call, sent at about 4.5x real time so that it
#: takes about a minute: what a proxy's timers see is the wall clock with no message from the
#: server, and that is what has to outlast their defaults.
SILENCE_S = 300
#: Wall-clock length of the silence and of the hold: over a minute with no message from
#: the server. Through nginx the default grpc_read_timeout (60 s between two reads from the
#: server) ends a held call: while audio flows, the server's flow-control updates are reads
#: too, so only the hold shows it. Through Envoy the defaults are the route timeout (15 s,
#: counted from the client's half-close) and the stream idle timeout (5 min). All four
#: calls run at once, so the scenario costs one gap, not four.
SILENCE_WALL_S = 66
#: a held call's keep-alives: under the server's idle timeout and nginx's default
#: client_body_timeout (60 s each)
KEEPALIVE_EVERY_S = 20


async def send_silence(stream: RecognitionStream) -> None:
    """5 min of silent audio in SILENCE_WALL_S."""
    second = np.zeros(SR, np.int16).tobytes()
    t0 = time.monotonic()
    for i in range(SILENCE_S):
        await stream.send_audio(second)
        due = t0 + (i + 1) * SILENCE_WALL_S / SILENCE_S
        await asyncio.sleep(max(0.0, due - time.monotonic()))


async def hold(stream: RecognitionStream) -> None:
    """No audio for SILENCE_WALL_S, a keep-alive now and then (after a second of silence
    that ends the utterance before it)."""
    await stream.send_audio(np.zeros(SR, np.int16).tobytes())
    t0 = time.monotonic()
    while (left := t0 + SILENCE_WALL_S - time.monotonic()) > 0:
        await asyncio.sleep(min(KEEPALIVE_EVERY_S, left))
        await stream.keep_alive()


async def call_with_a_pause(
    port: int, pause: Callable[[RecognitionStream], Awaitable[None]]
) -> list[tuple[float, str]]:
    """Speech, the pause, speech; (arrival time, kind) of every response. A cut call
    raises: it is not resumed."""
    received: list[tuple[float, str]] = []
    async with AsrClient(f"127.0.0.1:{port}", retry=False) as client:
        stream = client.stream(audio_config(), resume=None)
        await stream.open()

        async def send() -> None:
            try:
                await stream.send_audio(SPEECH.tobytes())
                await pause(stream)
                await stream.send_audio(SPEECH.tobytes())
                await stream.end()
            except BaseException:
                stream.cancel()  # so that the reading below ends too
                raise

        sender = asyncio.create_task(send())
        try:
            async for response in stream:  # raises if a proxy ends the stream
                kind = response.WhichOneof("event") or "end"
                if kind == "result" and response.result.is_final:
                    kind = "final"
                received.append((time.monotonic(), kind))
        finally:
            await sender
    return received


async def every_call(nginx: int, envoy: int) -> dict[str, object]:
    calls = {
        f"{proxy}/{kind}": call_with_a_pause(port, pause)
        for proxy, port in (("nginx", nginx), ("envoy", envoy))
        for kind, pause in (("silence", send_silence), ("hold", hold))
    }
    async with asyncio.timeout(SILENCE_WALL_S + 60):
        results = await asyncio.gather(*calls.values())
    return dict(zip(calls, results, strict=True))


def main() -> None:
    stop_with_the_suite()
    if (why := proxies_missing()) is not None:
        print(json.dumps({"skip": why}))
        return
    # no progress-only responses in silences: the proxies must keep a stream the server
    # sends nothing on for over a minute
    quiet = {"ASR_STREAMING__PROGRESS_EVERY_S": "0"}
    with (
        tempfile.TemporaryDirectory(prefix="silence-proxies-") as tmp,
        proxied_replicas(Path(tmp), replicas=2, max_streams=4, env=quiet) as cluster,
    ):
        result = asyncio.run(every_call(cluster.nginx, cluster.envoy))
    sys.stdout.flush()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
