"""One recognition stream: reader, per-channel processors and writer under one TaskGroup."""

from asr_server.session.stream import SessionServices, StreamSession
from asr_server.session.types import (
    ConfigUpdate,
    Finalize,
    OutEvent,
    Progress,
    RecognitionResult,
    SpeechBoundary,
    SpeechResumed,
    StreamConfig,
    StreamDone,
)

__all__ = [
    "ConfigUpdate",
    "Finalize",
    "OutEvent",
    "Progress",
    "RecognitionResult",
    "SessionServices",
    "SpeechBoundary",
    "SpeechResumed",
    "StreamConfig",
    "StreamDone",
    "StreamSession",
]
