"""The WebSocket message protocol: parse what the browser sends, shape what it receives.

Pure functions and small classes, no I/O, so every message shape is unit-tested directly.
The protocol itself is described in ``docs/websocket-protocol.md``; this module is the
one place that knows it.

Browser → bridge: one JSON ``start`` message, then binary frames of little-endian int16
mono PCM at the declared rate, and optionally JSON ``finalize`` / ``stop`` messages.
Bridge → browser: JSON events, either in streamasr's own shape (``partial``, ``final``…)
or, on request, in the shape of OpenAI Realtime transcription events.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from asr_api.v1 import asr_pb2
from asr_bridge.realtime import ServerEvents
from asr_bridge.wire import json_message
from asr_client.api import SPEECH_EVENT_TYPES, TURN_END_REASONS, speech_event_utterance
from asr_server.audio.decode import MAX_RATE_HZ, MIN_RATE_HZ

if TYPE_CHECKING:
    from asr_client.resume import ResumeInfo

EventShape = Literal["streamasr", "openai"]
EVENT_SHAPES: tuple[EventShape, ...] = ("streamasr", "openai")

#: the subprotocol the bridge answers with when a browser offers it
SUBPROTOCOL = "streamasr.v1"
#: one binary frame at most: 1 s of 48 kHz int16 is 96 kB; larger frames only add latency
MAX_FRAME_BYTES = 256 * 1024

# Close codes. 1000/1011/1013 are RFC 6455's; 4400 and 4401 mirror HTTP 400 and 401.
CLOSE_NORMAL = 1000
CLOSE_SERVER_ERROR = 1011
CLOSE_TRY_AGAIN_LATER = 1013
CLOSE_BAD_REQUEST = 4400
CLOSE_UNAUTHORIZED = 4401

#: statuses that are the client's to fix (the others: try again, or the server's fault)
CLIENT_FAULTS = {"INVALID_ARGUMENT", "FAILED_PRECONDITION", "OUT_OF_RANGE"}
_TRY_AGAIN = {"RESOURCE_EXHAUSTED", "UNAVAILABLE"}


class ProtocolError(ValueError):
    """A message the browser should not have sent; reported as INVALID_ARGUMENT."""


# -- browser → bridge --------------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    sample_rate: int
    language: str = ""
    languages: tuple[str, ...] = ()  # detection chooses among these
    interim_results: bool = True
    silence_ms: int = 0
    endpointing: Literal["silence", "semantic"] = "silence"
    eager_finals: bool = False
    #: semantic: the stream's turn threshold (0: the server's)
    turn_threshold: float = 0.0
    hotwords: tuple[str, ...] = ()
    word_timestamps: bool = False
    events: EventShape | None = None  # None: as the query string said, else streamasr


@dataclass(frozen=True)
class Audio:
    pcm: bytes


@dataclass(frozen=True)
class Finalize:
    """End the current utterance now; the stream stays open."""


@dataclass(frozen=True)
class Stop:
    """No more audio: the server finalizes what is pending, then the bridge closes."""


ClientMessage = Start | Audio | Finalize | Stop
T = TypeVar("T")


def parse_binary(data: bytes) -> Audio:
    if len(data) % 2:
        raise ProtocolError(f"audio frames are int16 samples: {len(data)} bytes is odd")
    if len(data) > MAX_FRAME_BYTES:
        raise ProtocolError(f"audio frame of {len(data)} bytes is over {MAX_FRAME_BYTES}")
    return Audio(data)


def parse_text(text: str) -> ClientMessage:
    try:
        message = json_message(text)
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError('a text message must be a JSON object with a "type"')
    kind = message["type"]
    if kind == "start":
        return _parse_start(message)
    if kind in ("finalize", "input_audio_buffer.commit"):
        return Finalize()
    if kind == "stop":
        return Stop()
    if kind == "input_audio_buffer.append":  # the OpenAI Realtime way to send audio
        try:
            pcm = base64.b64decode(message.get("audio", ""), validate=True)
        # (binascii.Error, and the ValueError of a non-ASCII string, are ValueErrors)
        except (ValueError, TypeError):
            raise ProtocolError('"audio" must be base64 of int16 PCM') from None
        return parse_binary(pcm)  # (its size and length errors, as for a binary frame)
    raise ProtocolError(f"unknown message type {kind!r}")


def _parse_start(m: dict[str, Any]) -> Start:
    rate = m.get("sample_rate")
    if type(rate) is not int or not MIN_RATE_HZ <= rate <= MAX_RATE_HZ:
        raise ProtocolError(
            f'"sample_rate" must be an integer from {MIN_RATE_HZ} to {MAX_RATE_HZ}, got {rate!r}'
        )
    events = m.get("events")
    if events is not None and events not in EVENT_SHAPES:
        raise ProtocolError(f'"events" must be one of {", ".join(EVENT_SHAPES)}')
    hotwords = m.get("hotwords", [])
    if not isinstance(hotwords, list) or not all(isinstance(h, str) for h in hotwords):
        raise ProtocolError('"hotwords" must be a list of strings')
    endpointing = m.get("endpointing", "silence")
    if endpointing not in ("silence", "semantic"):
        raise ProtocolError('"endpointing" must be "silence" or "semantic"')
    turn_threshold = m.get("turn_threshold", 0.0)
    if (
        isinstance(turn_threshold, bool)
        or not isinstance(turn_threshold, int | float)
        or not 0.0 <= turn_threshold <= 1.0
    ):
        raise ProtocolError(
            f'"turn_threshold" must be a number from 0 to 1, got {turn_threshold!r}'
        )
    languages = m.get("languages", [])
    if not isinstance(languages, list) or not all(isinstance(c, str) for c in languages):
        raise ProtocolError('"languages" must be a list of language codes, e.g. ["de", "fr"]')
    return Start(
        sample_rate=rate,
        language=_typed(m, "language", str, ""),
        languages=tuple(languages),
        interim_results=_typed(m, "interim_results", bool, True),
        silence_ms=_silence_ms(m),
        endpointing=endpointing,
        eager_finals=_typed(m, "eager_finals", bool, False),
        turn_threshold=float(turn_threshold),
        hotwords=tuple(hotwords),
        word_timestamps=_typed(m, "word_timestamps", bool, False),
        events=events,
    )


#: the silences a stream may ask for: the server's range (0 asks for its default)
MIN_SILENCE_MS, MAX_SILENCE_MS = 100, 10_000


def _silence_ms(m: dict[str, Any]) -> int:
    value = _typed(m, "silence_ms", int, 0)
    # refused here, before the stream opens: the server would refuse it only once the
    # page had been told ``ready`` (and a uint32 in the config it becomes)
    if value != 0 and not MIN_SILENCE_MS <= value <= MAX_SILENCE_MS:
        raise ProtocolError(
            f'"silence_ms" must be from {MIN_SILENCE_MS} to {MAX_SILENCE_MS} '
            f"(0: the server's default), got {value}"
        )
    return value


def _typed(m: dict[str, Any], key: str, kind: type[T], default: T) -> T:
    value = m.get(key, default)
    # bool is an int subclass: "silence_ms": true must not pass as 1
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ProtocolError(f'"{key}" must be {kind.__name__}, got {value!r}')
    return value


def streaming_config(start: Start) -> asr_pb2.StreamingConfig:
    return asr_pb2.StreamingConfig(
        format=asr_pb2.AudioFormat(
            encoding=asr_pb2.AudioFormat.LINEAR16, sample_rate_hz=start.sample_rate, channels=1
        ),
        language=start.language,
        languages=list(start.languages),
        interim_results=start.interim_results,
        endpointing=asr_pb2.EndpointingConfig(
            silence_ms=start.silence_ms,
            mode=start.endpointing.upper(),
            eager_finals=start.eager_finals,
            turn_threshold=start.turn_threshold,
        ),
        hotwords=list(start.hotwords),
        word_timestamps=start.word_timestamps,
    )


# -- errors ------------------------------------------------------------------------------


def close_code_for(status: str) -> int:
    """The WebSocket close code for a gRPC status name (or the bridge's own, same names)."""
    if status in CLIENT_FAULTS:
        return CLOSE_BAD_REQUEST
    if status in _TRY_AGAIN:
        return CLOSE_TRY_AGAIN_LATER
    if status == "UNAUTHENTICATED":
        return CLOSE_UNAUTHORIZED
    return CLOSE_SERVER_ERROR


def close_reason(message: str) -> str:
    """A close reason fits in 123 bytes of UTF-8; cut longer ones on a character boundary."""
    encoded = message.encode()
    if len(encoded) <= 123:
        return message
    return encoded[:120].decode(errors="ignore") + "..."


# -- bridge → browser --------------------------------------------------------------------

Event = dict[str, Any]


class EventWriter(Protocol):
    """Turns what happens on the gRPC stream into the JSON events of one shape."""

    def ready(self, session_id: str, sample_rate: int) -> list[Event]: ...
    def response(self, response: asr_pb2.StreamingRecognizeResponse) -> list[Event]: ...
    def error(self, code: str, message: str) -> list[Event]: ...
    def reconnecting(self, cause: str) -> list[Event]: ...
    def resumed(self, info: ResumeInfo) -> list[Event]: ...
    def closed(self) -> list[Event]: ...


def event_writer(shape: EventShape) -> EventWriter:
    return OpenAIEvents() if shape == "openai" else StreamasrEvents()


class StreamasrEvents:
    """streamasr's own events: the gRPC responses, flattened to JSON."""

    def ready(self, session_id: str, sample_rate: int) -> list[Event]:
        return [{"type": "ready", "session_id": session_id, "sample_rate": sample_rate}]

    def response(self, response: asr_pb2.StreamingRecognizeResponse) -> list[Event]:
        lag = round(response.progress.lag_s, 3)
        if response.HasField("speech_event"):
            e = response.speech_event
            return [
                {
                    "type": SPEECH_EVENT_TYPES.get(e.type, "speech_event"),
                    # null: a finalized on a session that has had no utterance yet
                    "utterance_id": speech_event_utterance(e),
                    "offset_s": round(e.offset_s, 3),
                    "lag_s": lag,
                }
            ]
        if response.HasField("end_of_turn"):
            t = response.end_of_turn
            return [
                {
                    "type": "end_of_turn",
                    "utterance_id": t.utterance_id,
                    "offset_s": round(t.offset_s, 3),
                    "probability": round(t.probability, 3),
                    "reason": TURN_END_REASONS.get(t.reason, ""),
                    "lag_s": lag,
                }
            ]
        if not response.HasField("result"):
            return []
        r = response.result
        event: Event = {
            "type": "final" if r.is_final else "eager" if r.eager else "partial",
            "utterance_id": r.utterance_id,
            "text": r.text,
            "stable_text": r.stable_text,
            "unstable_text": r.unstable_text,
            "start_s": round(r.start_s, 3),
            "end_s": round(r.end_s, 3),
            "lag_s": lag,
        }
        if r.confidence:  # finals and eager results
            event["confidence"] = round(r.confidence, 3)
        if r.is_final:
            event["language"] = r.language
            if r.language_probability:
                event["language_probability"] = round(r.language_probability, 3)
            if r.from_finalize:
                event["from_finalize"] = True
            if r.words:
                event["words"] = [
                    {
                        "word": w.word,
                        "start_s": round(w.start_s, 3),
                        "end_s": round(w.end_s, 3),
                        "probability": round(w.probability, 3),
                    }
                    for w in r.words
                ]
        return [event]

    def error(self, code: str, message: str) -> list[Event]:
        return [{"type": "error", "code": code, "message": message}]

    def reconnecting(self, cause: str) -> list[Event]:
        """The bridge's gRPC call broke and the stream is resuming: results pause until
        ``resumed`` (or an error, if no server takes it in time); the audio is kept."""
        return [{"type": "reconnecting", "cause": cause}]

    def resumed(self, info: ResumeInfo) -> list[Event]:
        """The bridge continued the stream on a new gRPC call: no final is lost or repeated;
        the partials of an utterance that was cut start over under a new id."""
        return [
            {"type": "resumed", "count": info.count, "offset_s": round(info.stream_offset_s, 3)}
        ]

    def closed(self) -> list[Event]:
        return [{"type": "closed"}]


@dataclass
class OpenAIEvents:
    """The shape of OpenAI Realtime transcription events, for clients written against it.

    One stretch of speech is one conversation item (an utterance, or the parts the server
    split a long one into). ``…transcription.delta`` carries only text
    that has become *stable* (append-only, as OpenAI deltas are), and
    ``…transcription.completed`` the final transcript, which starts with those deltas. The
    events are realtime.py's, as the full ``/v1/realtime`` endpoint sends them.
    """

    _events: ServerEvents = field(default_factory=lambda: ServerEvents(""))

    def ready(self, session_id: str, sample_rate: int) -> list[Event]:
        self._events = ServerEvents(session_id, ga=False)  # (the beta session's shape)
        session = {
            "id": session_id,
            "object": "realtime.transcription_session",
            "input_audio_format": "pcm16",
            "sample_rate": sample_rate,
        }
        return [self._events.event("transcription_session.created", session=session)]

    def response(self, response: asr_pb2.StreamingRecognizeResponse) -> list[Event]:
        return self._events.response(response, server_vad=True)

    def error(self, code: str, message: str) -> list[Event]:
        kind = "invalid_request_error" if code in CLIENT_FAULTS else "server_error"
        return [self._events.error(message, kind=kind, code=code)]

    def reconnecting(self, cause: str) -> list[Event]:
        return []  # the Realtime protocol has no such event: its results just pause

    def resumed(self, info: ResumeInfo) -> list[Event]:
        # the Realtime protocol has no such event; the transcript simply goes on: what the
        # new call hears again continues the items the client has (a committed one is
        # completed by the new call's final, not told again as a new item)
        self._events.resumed()
        return []

    def closed(self) -> list[Event]:
        return self._events.finish()  # an item the audio ended inside of
