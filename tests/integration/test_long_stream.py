"""One stream held for a long call (hundreds of utterances, fake engine, real gRPC): the
server keeps nothing per utterance, so its memory stays flat however long the call runs
(streams may last 4 hours, ``max_stream_duration_s``)."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc

import numpy as np
import pytest

from asr_client import AsrClient, audio_config
from asr_server.engine.fake import FakeEngine
from tests.helpers import eventually, serve_fake, silence, tone

pytestmark = pytest.mark.timeout(120)

UTTERANCE = np.concatenate([tone(2.0), silence(0.7)])  # 2 s of "speech", then a pause
UTTERANCE_BYTES = (UTTERANCE * 32767).astype("<i2").tobytes()
UTTERANCES = 450  # about 20 minutes of audio, sent as fast as the server takes it
#: from the 250th on: before it the channel's record of message arrival times (the last
#: 4,096 messages, 410 s at 100 ms) is still filling up
MEASURE_AT = (250, UTTERANCES)


async def test_memory_stays_flat_over_a_long_stream(make_server) -> None:  # type: ignore[no-untyped-def]
    engine = FakeEngine()
    server = await serve_fake(make_server, engine)
    finals = 0
    traced: list[int] = []
    objects: list[int] = []
    tracemalloc.start()
    try:
        async with AsrClient(f"127.0.0.1:{server.port}") as client:
            async with client.stream(audio_config()) as stream:

                async def read() -> None:
                    nonlocal finals
                    async for response in stream:  # counted, not kept
                        finals += response.HasField("result") and response.result.is_final

                reader = asyncio.create_task(read())
                for n in range(1, UTTERANCES + 1):
                    for start in range(0, len(UTTERANCE_BYTES), 3_200):  # 100 ms messages
                        await stream.send_audio(UTTERANCE_BYTES[start : start + 3_200])
                    if n in MEASURE_AT:
                        # measured once every utterance sent so far has its final, so that
                        # no decode (and no copy of audio for it) is in flight
                        await eventually(lambda: finals >= n, 30)  # noqa: B023
                        engine.calls.clear()  # the test's own record of the requests
                        # the least of a few looks: a buffer in flight for a moment (once
                        # 270 KiB, there at one look and gone at the next) is not kept
                        gc.collect()  # (once: in a full suite's process a collection is slow)
                        looks = []
                        for _ in range(3):
                            await asyncio.sleep(0.1)
                            looks.append(
                                (tracemalloc.get_traced_memory()[0], len(gc.get_objects()))
                            )
                        traced.append(min(t for t, _ in looks))
                        objects.append(min(o for _, o in looks))
                await stream.end()
                await reader
    finally:
        tracemalloc.stop()
    print(f"traced: {[f'{t / 1024:.0f} KiB' for t in traced]}, objects: {objects}")
    assert finals == UTTERANCES
    # 200 utterances between the measurements: one utterance's audio kept would add
    # 170 KiB each, a kilobyte kept per utterance 200 KiB, one object per utterance 200
    # objects (measured here: -5 to +8 KiB, +0 objects; a 1 h stream stayed within 60 KiB;
    # in a full suite's process, what other tests leave behind moved the count by -74 to
    # +117 between the two looks, so the bound sits between that and 200)
    assert traced[-1] - traced[0] < 128 << 10, traced
    assert objects[-1] - objects[0] < 160, objects
    assert server.servicer.active == 0
