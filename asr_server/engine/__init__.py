"""Speech-to-text engines and the scheduler that shares one engine between streams.

Engines are blocking and thread-safe and import neither asyncio nor grpc; the
scheduler is the only place that calls them.
"""

from asr_server.engine.base import DecodeKind, DecodeRequest, Engine, Hypothesis, WordTiming

__all__ = ["DecodeKind", "DecodeRequest", "Engine", "Hypothesis", "WordTiming"]
