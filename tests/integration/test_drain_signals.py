"""A draining server (SIGTERM) ends its open streams at once on a second signal."""

from __future__ import annotations

import signal
import time

import grpc
import pytest

from asr_client import AsrClient, StreamClosedError
from tests.helpers import audio_config, silence
from tests.processes import start_replica, wait_for, wait_started

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT])
async def test_a_second_signal_ends_the_drain_at_once(second: signal.Signals) -> None:
    """Before, a second SIGTERM or a Ctrl-C during a drain was ignored: the operator could
    only wait out drain_timeout_s (30 s by default) or SIGKILL the server."""
    replica = wait_started(start_replica(env={"ASR_DRAIN_TIMEOUT_S": "30"}))
    try:
        async with AsrClient(f"127.0.0.1:{replica.port}", resume=None) as client:
            stream = await client.stream(audio_config()).open()
            await stream.send_audio((silence(0.5) * 32767).astype("<i2").tobytes())
            wait_for(lambda: replica.opened == 1, 10, "the stream to be seated")
            replica.proc.send_signal(signal.SIGTERM)
            wait_for(lambda: replica.count("draining:"), 10, "the drain to begin")
            started = time.monotonic()
            replica.proc.send_signal(second)
            wait_for(lambda: replica.proc.poll() is not None, 10, "the server to exit")
            assert time.monotonic() - started < 10  # not the 30 s drain
            assert replica.count("a second signal: ending the 1 open stream") == 1
            with pytest.raises(StreamClosedError) as ended:
                async for _ in stream:
                    pass
            assert ended.value.code is grpc.StatusCode.UNAVAILABLE
    finally:
        replica.stop()
    assert replica.proc.returncode == 0
