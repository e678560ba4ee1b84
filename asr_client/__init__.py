"""streamasr client: a small async API plus the ``asr-client`` command.

Example::

    import asyncio
    from asr_client import AsrClient, audio_config

    async def main() -> None:
        async with AsrClient("localhost:50051") as client:
            async with client.stream(audio_config(sample_rate_hz=8000, encoding="MULAW")) as stream:
                async def send() -> None:
                    for chunk in chunks:                # e.g. 20 ms frames from a SIP gateway
                        await stream.send_audio(chunk)  # waits when the server pushes back
                    await stream.end()
                sender = asyncio.create_task(send())
                async for event in stream:
                    if event.HasField("result") and event.result.is_final:
                        print(event.result.channel, event.result.text)
                await sender

    asyncio.run(main())

A voice agent whose own VAD heard the speaker stop ends the turn and waits for its
transcript (while the loop above reads the events)::

    ack = await stream.finalize()
    await asyncio.wait_for(ack, 2.0)  # every final of the turn has been read
"""

import os

# gRPC core's own log: ERROR and worse, as gRPC documents its default. Since gRPC 1.65 an
# unset GRPC_VERBOSITY leaves it at absl's INFO, and every failed TLS handshake printed
# "I1207 … ssl_transport_security.cc:2563] Handshake failed …" ahead of the client's own
# one-line error. Read when grpc is loaded, so here, before it is; a caller's setting
# wins. (asr_server sets the same for the server.)
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from asr_client.acks import FinalizeAck
from asr_client.api import (
    AsrClient,
    AudioStream,
    RecognitionStream,
    StreamClosedError,
    audio_config,
    stream_update,
)
from asr_client.connection import ConnectionConfigError, ConnectionOptions
from asr_client.resume import OutageInfo, ResumeError, ResumeInfo, ResumePolicy
from asr_client.retry import balancing_service_config
from asr_client.turns import EagerTurn, Turn, TurnAssembler, TurnResumed

__all__ = [
    "AsrClient",
    "AudioStream",
    "ConnectionConfigError",
    "ConnectionOptions",
    "EagerTurn",
    "FinalizeAck",
    "OutageInfo",
    "RecognitionStream",
    "ResumeError",
    "ResumeInfo",
    "ResumePolicy",
    "StreamClosedError",
    "Turn",
    "TurnAssembler",
    "TurnResumed",
    "audio_config",
    "balancing_service_config",
    "stream_update",
]
