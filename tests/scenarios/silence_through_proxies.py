"""A call with five minutes of silence (a caller on hold), through nginx and Envoy at once.

Run in the background of the suite (tests/background.py): it waits a minute on the wall
clock and needs little CPU. Prints, as its last line, a JSON object: for each proxy the
(arrival time, kind) of every response, or ``{"skip": reason}``. The assertions are in
tests/integration/test_proxies.py.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from asr_client import AsrClient, audio_config
from tests.helpers import ROOT, read_pcm16
from tests.processes import proxied_replicas, proxies_missing

SR = 16_000
SPEECH = read_pcm16(ROOT / "audio_samples" / "libri_1089-134691-0001.flac")[0][:, 0]
#: Five minutes of silence in the middle of a call, sent at about 4.5x real time so that it
#: takes about a minute: what a proxy's timers see is the wall clock with no message from the
#: server, and that is what has to outlast their defaults.
SILENCE_S = 300
#: Wall-clock length of the silence. Through nginx the default grpc_read_timeout (60 s
#: between two messages from the server) would end the stream; through Envoy the defaults
#: are the route timeout (15 s, counted from the client's half-close) and the stream idle
#: timeout (5 min with nothing in either direction; audio keeps flowing here). 66 s of no
#: server message exceeds both 60 s and 15 s; both proxies are tested at once, so the
#: scenario costs one gap, not two.
SILENCE_WALL_S = 66


async def call_with_a_long_silence(port: int) -> list[tuple[float, str]]:
    """Speech, 5 min of silence, speech; (arrival time, kind) of every response."""
    received: list[tuple[float, str]] = []
    async with AsrClient(f"127.0.0.1:{port}", retry=False) as client:
        stream = client.stream(audio_config())
        await stream.open()

        async def send() -> None:
            try:
                await stream.send_audio(SPEECH.tobytes())
                second = np.zeros(SR, np.int16).tobytes()
                t0 = time.monotonic()
                for i in range(SILENCE_S):
                    await stream.send_audio(second)
                    due = t0 + (i + 1) * SILENCE_WALL_S / SILENCE_S
                    await asyncio.sleep(max(0.0, due - time.monotonic()))
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


async def both(nginx: int, envoy: int) -> dict[str, object]:
    calls = await asyncio.wait_for(
        asyncio.gather(call_with_a_long_silence(nginx), call_with_a_long_silence(envoy)),
        SILENCE_WALL_S + 60,
    )
    return dict(zip(("nginx", "envoy"), calls, strict=True))


def main() -> None:
    if (why := proxies_missing()) is not None:
        print(json.dumps({"skip": why}))
        return
    # no progress-only responses in silences: the proxies must keep a stream the server
    # sends nothing on for over a minute
    quiet = {"ASR_STREAMING__PROGRESS_EVERY_S": "0"}
    with (
        tempfile.TemporaryDirectory(prefix="silence-proxies-") as tmp,
        proxied_replicas(Path(tmp), replicas=2, max_streams=2, env=quiet) as cluster,
    ):
        result = asyncio.run(both(cluster.nginx, cluster.envoy))
    sys.stdout.flush()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
