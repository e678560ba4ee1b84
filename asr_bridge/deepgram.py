"""Deepgram's live API (``/v1/listen``) on the bridge: the pure part.

Query parameters → ``StreamingConfig``, client text messages → commands, gRPC responses →
Deepgram's server messages, refusals → Deepgram's error shapes. No I/O, so every mapping is
unit-tested directly; ``deepgram_session.py`` runs a socket with it. What is supported,
ignored and refused is documented in ``docs/compat.md``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from asr_api.v1 import asr_pb2
from asr_bridge.wire import json_message
from asr_server.audio.decode import MAX_CHANNELS, MAX_RATE_HZ, MIN_RATE_HZ
from asr_server.audio.g711 import alaw_decode, mulaw_decode

Event = dict[str, Any]

#: the server's endpointing range: Deepgram's default of 10 ms would cut Whisper's context
#: at every breath, so shorter values are raised to the server's minimum
MIN_SILENCE_MS, MAX_SILENCE_MS = 100, 10_000
#: one binary frame at most, as on /ws; the SDK's examples send 10-100 ms chunks
MAX_FRAME_BYTES = 256 * 1024

#: what this server reports as its model (Deepgram's Results carry model metadata)
MODEL_INFO = {"name": "streamasr", "version": "1", "arch": "whisper"}
MODEL_UUID = str(uuid.uuid5(uuid.NAMESPACE_URL, "https://github.com/streamasr/whisper"))

#: Deepgram's raw encodings → the server's (``linear32`` is 32-bit float PCM, as Web Audio
#: hands it out)
ENCODINGS = {"linear16": "LINEAR16", "linear32": "FLOAT32", "mulaw": "MULAW", "alaw": "ALAW"}
#: encodings FFmpeg decodes in the bridge (container.py), as a query without ``encoding``
#: is: Deepgram's ``opus`` and ``ogg-opus`` are Opus in Ogg, its ``flac`` a FLAC stream
DECODED_ENCODINGS = {"opus", "ogg-opus", "flac"}
_BYTES_PER_SAMPLE = {"linear16": 2, "linear32": 4, "mulaw": 1, "alaw": 1}
#: accepted and without effect here: model choice, billing and bookkeeping options
_IGNORED = {"model", "version", "mip_opt_out", "token"}
#: bookkeeping options that may be given many times (Deepgram documents several
#: ``extra``s, and its SDKs send a list as repeated keys): accepted, their values unused
REPEATED_BOOKKEEPING = ("tag", "extra")
#: Deepgram features this server does not have: refused when turned on, accepted when off
_UNSUPPORTED_FEATURES = {
    "diarize",
    "detect_entities",
    "dictation",
    "numerals",
    "profanity_filter",
    "redact",
    "search",
    "replace",
    "callback",
    "callback_method",
    "diarize_model",
    "language_hint",
    "detect_language",
}
_HANDLED = {
    "encoding",
    "sample_rate",
    "channels",
    "multichannel",
    "interim_results",
    "endpointing",
    "utterance_end_ms",
    "vad_events",
    "punctuate",
    "smart_format",
    "language",
    "keywords",
    "keyterm",
    #: Deepgram's smart_format may hold back a final to format numbers that span results;
    #: no_delay turns that off. Nothing is held back here: checked, then without effect
    "no_delay",
    #: "uh" and "um" written out: LiveKit's Deepgram plugin turns it on by default (for its
    #: turn detector), and refusing it refused that plugin's every connection. Checked,
    #: then without effect: Whisper leaves most fillers out, as Deepgram does without it
    "filler_words",
}


class ListenQueryError(ValueError):
    """A query parameter the bridge refuses: HTTP 400 on the handshake, as Deepgram does."""


class SchemaError(ValueError):
    """A client text message that is not one of Deepgram's."""


# -- the query string ------------------------------------------------------------------


@dataclass(frozen=True)
class ListenOptions:
    #: a raw encoding (``ENCODINGS``), or None: a container the bridge decodes, whose
    #: rate and channels are known once it is read (``decoded``)
    encoding: str | None = "linear16"
    sample_rate: int = 16_000
    channels: int = 1
    multichannel: bool = False
    interim_results: bool = False
    #: None: the server's default; else the silence that ends an utterance
    silence_ms: int | None = None
    utterance_end_ms: int | None = None
    vad_events: bool = False
    punctuate: bool = False
    language: str = "en"
    hotwords: tuple[str, ...] = ()

    @property
    def downmix(self) -> bool:
        """Several channels without ``multichannel``: Deepgram transcribes them as one, so
        the bridge mixes them to mono (the server would otherwise recognize each)."""
        return self.channels > 1 and not self.multichannel

    @property
    def reported_channels(self) -> int:
        return 1 if self.downmix else self.channels

    @property
    def containerized(self) -> bool:
        return self.encoding is None

    def decoded(self, sample_rate: int, channels: int) -> ListenOptions:
        """These options for the container's audio once decoded: 16-bit PCM as it is."""
        return dataclasses.replace(
            self, encoding="linear16", sample_rate=sample_rate, channels=channels
        )

    @property
    def frame_bytes(self) -> int:
        if self.encoding is None:
            raise ValueError("a container has no frames until it is decoded")
        return _BYTES_PER_SAMPLE[self.encoding] * self.channels

    @property
    def bytes_per_second(self) -> int:
        return self.frame_bytes * self.sample_rate


def split_query(
    params: Iterable[tuple[str, str]],
    *,
    repeatable: Collection[str],
    handled: Collection[str],
    ignored: Collection[str],
    unsupported: Collection[str],
) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """A Deepgram query's options, as both routes take them: each ``handled`` or
    ``ignored`` key once (or repeated alike), the ``repeatable`` keys' (key, value) pairs
    in order, ``REPEATED_BOOKKEEPING`` keys any number of times (unused), an
    ``unsupported`` feature only when off; anything else is refused."""
    single: dict[str, str] = {}
    repeated: list[tuple[str, str]] = []
    for key, value in params:
        if key in REPEATED_BOOKKEEPING:
            continue
        if key in repeatable:
            repeated.append((key, value))
        elif key in unsupported:
            if value.lower() not in ("false", ""):
                raise ListenQueryError(
                    f"{key} is not supported by this server (leave it out or set it to false)"
                )
        elif key in handled or key in ignored:
            if key in single and single[key] != value:
                raise ListenQueryError(f"{key} is given twice with different values")
            single[key] = value
        else:
            raise ListenQueryError(f"unknown query parameter {shown(key)}")
    return single, repeated


def listen_audio(
    single: dict[str, str], decoded: Collection[str] = DECODED_ENCODINGS
) -> tuple[str | None, int]:
    """A Deepgram query's audio: raw (``encoding`` and ``sample_rate``, both required)
    or, as Deepgram takes it, a container when no ``encoding`` is given or one of the
    route's ``decoded`` encodings (FFmpeg decodes them): (None, 0); ``sample_rate`` and
    ``channels`` are then the container's, as on Deepgram."""
    encoding = single.get("encoding")
    if encoding is None or encoding in decoded:
        if "sample_rate" in single:
            integer_option(single, "sample_rate", MIN_RATE_HZ, MAX_RATE_HZ)  # well formed
        return None, 0
    if encoding not in ENCODINGS:
        raise ListenQueryError(
            f"encoding {shown(encoding)} is not supported: use linear16, linear32, mulaw or "
            f"alaw for raw audio, {' or '.join(sorted(decoded))}, or no encoding for a "
            "container (WebM, Ogg, WAV, FLAC, MP3…)"
        )
    if "sample_rate" not in single:
        raise ListenQueryError("sample_rate is required with encoding")
    return encoding, integer_option(single, "sample_rate", MIN_RATE_HZ, MAX_RATE_HZ)


def parse_listen_query(params: Iterable[tuple[str, str]]) -> ListenOptions:
    """The options of a ``/v1/listen`` URL's query (repeated keys allowed for keywords)."""
    single, repeated = split_query(
        params,
        repeatable=("keywords", "keyterm"),
        handled=_HANDLED,
        ignored=_IGNORED,
        unsupported=_UNSUPPORTED_FEATURES,
    )
    hotwords: list[str] = []
    for key, value in repeated:
        # keywords carry an optional boost ("word:2"); the server's hotwords take none
        term = re.sub(r":-?\d+(\.\d+)?$", "", value) if key == "keywords" else value
        if term.strip():
            hotwords.append(term.strip())
    encoding, rate = listen_audio(single)
    _boolean(single, "no_delay", False)  # well formed (see _HANDLED)
    _boolean(single, "filler_words", False)
    channels = integer_option(single, "channels", 1, MAX_CHANNELS, default=1)
    if encoding is None:
        channels, rate = 1, ListenOptions.sample_rate  # until the container is read
    utterance_end_ms = (
        integer_option(single, "utterance_end_ms", 1, 60_000)
        if "utterance_end_ms" in single
        else None
    )
    return ListenOptions(
        encoding=encoding,
        sample_rate=rate,
        channels=channels,
        multichannel=_boolean(single, "multichannel", False),
        interim_results=_boolean(single, "interim_results", False),
        silence_ms=_endpointing(single.get("endpointing")),
        utterance_end_ms=utterance_end_ms,
        vad_events=_boolean(single, "vad_events", False),
        # smart_format punctuates too; Whisper writes cased, punctuated text either way
        punctuate=_boolean(single, "punctuate", False) or _boolean(single, "smart_format", False),
        language=_language(single.get("language", "en")),
        hotwords=tuple(hotwords),
    )


def shown(value: str) -> str:
    return repr(value[:40] + ("…" if len(value) > 40 else ""))


def _boolean(single: dict[str, str], key: str, default: bool) -> bool:
    value = single.get(key)
    if value is None:
        return default
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ListenQueryError(f"{key} must be true or false, got {shown(value)}")


def integer_option(single: dict[str, str], key: str, low: int, high: int, default: int = 0) -> int:
    value = single.get(key)
    if value is None:
        return default
    if not re.fullmatch(r"\d{1,9}", value) or not low <= int(value) <= high:
        raise ListenQueryError(f"{key} must be an integer from {low} to {high}, got {shown(value)}")
    return int(value)


def _endpointing(value: str | None) -> int | None:
    if value is None or value.lower() == "true":
        return None  # the server's default silence
    if value.lower() == "false":
        return MAX_SILENCE_MS  # no endpointing: only the longest silence ends an utterance
    if not re.fullmatch(r"\d{1,9}", value):
        raise ListenQueryError(f"endpointing must be milliseconds or false, got {shown(value)}")
    return min(MAX_SILENCE_MS, max(MIN_SILENCE_MS, int(value)))


def _language(value: str) -> str:
    """A BCP-47 tag → the server's language code: ``en-US`` → ``en``; ``multi`` → detect."""
    if value.lower() == "multi":
        return ""
    if not re.fullmatch(r"[A-Za-z]{2,3}(-[A-Za-z0-9]{1,8})*", value):
        raise ListenQueryError(f"language must be a BCP-47 tag such as en-US, got {shown(value)}")
    return value.split("-")[0].lower()


def streaming_config(options: ListenOptions) -> asr_pb2.StreamingConfig:
    if options.encoding is None:
        raise ValueError("a container's stream is configured once it is decoded")
    encoding = "LINEAR16" if options.downmix else ENCODINGS[options.encoding]
    return asr_pb2.StreamingConfig(
        format=asr_pb2.AudioFormat(
            encoding=encoding,  # type: ignore[arg-type]
            sample_rate_hz=options.sample_rate,
            channels=options.reported_channels,
        ),
        language=options.language,
        interim_results=options.interim_results,
        endpointing=asr_pb2.EndpointingConfig(silence_ms=options.silence_ms or 0),
        hotwords=list(options.hotwords),
        word_timestamps=True,  # Deepgram's finals always carry words
    )


# -- audio -------------------------------------------------------------------------------


@dataclass
class AudioFramer:
    """Deepgram takes audio cut anywhere; the server takes whole sample frames. Holds back
    the bytes of a frame cut in two until the rest arrives, and mixes channels down when
    the client asked for one transcript of several channels."""

    options: ListenOptions
    _held: bytes = b""

    def feed(self, data: bytes) -> bytes:
        data = self._held + data
        whole = len(data) - len(data) % self.options.frame_bytes
        data, self._held = data[:whole], data[whole:]
        return self._mix(data) if self.options.downmix and data else data

    def seconds(self, framed: bytes) -> float:
        """How long the audio of ``feed``'s output lasts."""
        if self.options.downmix:  # mixed down to 16-bit mono
            return len(framed) / 2 / self.options.sample_rate
        return len(framed) / self.options.bytes_per_second

    def _mix(self, data: bytes) -> bytes:
        """The channels' mean, as 16-bit PCM (what ``streaming_config`` says is sent)."""
        encoding = self.options.encoding
        samples: np.ndarray
        if encoding == "linear16":
            samples = np.frombuffer(data, dtype="<i2")
        elif encoding == "linear32":
            floats = np.frombuffer(data, dtype="<f4")
            if not np.all(np.isfinite(floats)):  # refused, as the server refuses them
                raise ValueError("linear32 audio contains NaN or infinity")
            samples = np.round(np.clip(floats, -1.0, 1.0) * 32767)
        else:
            samples = mulaw_decode(data) if encoding == "mulaw" else alaw_decode(data)
        frames = samples.reshape(-1, self.options.channels).astype(np.float64)
        return frames.mean(axis=1).round().astype("<i2").tobytes()


# -- client text messages ----------------------------------------------------------------


@dataclass(frozen=True)
class KeepAlive:
    pass


@dataclass(frozen=True)
class Finalize:
    channel: int | None = None  # only this channel (Deepgram's optional "channel")


@dataclass(frozen=True)
class CloseStream:
    pass


@dataclass(frozen=True)
class Configure:
    """Deepgram's mid-stream reconfiguration: this server cannot change a running stream."""


ControlMessage = KeepAlive | Finalize | CloseStream | Configure
_CONTROL: dict[str, type[ControlMessage]] = {
    "KeepAlive": KeepAlive,
    "Finalize": Finalize,
    "CloseStream": CloseStream,
    "Configure": Configure,
}


def control_message(text: str, types: Collection[str], hint: str) -> dict[str, Any]:
    """A client text message of one of ``types`` (``hint`` names the ones to use), as a
    JSON object; ``SchemaError`` otherwise."""
    try:
        message = json_message(text)
    except json.JSONDecodeError:
        raise SchemaError("a text message must be JSON") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise SchemaError('a text message must be a JSON object with a "type"')
    if message["type"] not in types:
        raise SchemaError(f"unknown message type {shown(message['type'])} (use {hint})")
    return message


def parse_text(text: str) -> ControlMessage:
    message = control_message(text, _CONTROL, "KeepAlive, Finalize, CloseStream or Configure")
    if message["type"] == "Finalize" and message.get("channel") is not None:
        channel = message["channel"]
        if isinstance(channel, bool) or not isinstance(channel, int) or channel < 0:
            raise SchemaError(
                f"Finalize's channel must be a channel index, not {json.dumps(channel)}"
            )
        return Finalize(channel)
    return _CONTROL[message["type"]]()


# -- server messages ---------------------------------------------------------------------


def error_message(description: str, *, variant: str = "SchemaError", message: str = "") -> Event:
    """Deepgram's ``Error`` message; ``message`` echoes the client text that was refused."""
    event: Event = {"type": "Error", "variant": variant, "description": description}
    if message:
        event["message"] = message[:200]
    return event


def errors(code: str, message: str) -> list[Event]:
    """The gate's refusals of an accepted socket, for ``app.protocol``. The Deepgram route
    refuses on the handshake instead (``handshake_refusal``), so this is its fallback."""
    return [error_message(f"{code}: {message}", variant=code)]


#: the gate's status names → the HTTP status and ``err_code`` of Deepgram's refusal
_HANDSHAKE_STATUS = {
    "INVALID_ARGUMENT": (400, "Bad Request"),
    "UNAUTHENTICATED": (401, "INVALID_AUTH"),
    "RESOURCE_EXHAUSTED": (429, "TOO_MANY_REQUESTS"),
}


@dataclass(frozen=True)
class HandshakeRefusal:
    status: int
    body: Event
    request_id: str

    @property
    def headers(self) -> dict[str, str]:
        # Deepgram puts the request id and the error in headers too: many WebSocket
        # libraries show a refused handshake's headers but not its body
        # (HTTP headers are Latin-1: anything else, such as the "…" of a cut value, is "?")
        error = self.body["err_msg"][:500].encode("latin-1", "replace").decode("latin-1")
        return {"dg-request-id": self.request_id, "dg-error": error}


def handshake_refusal(code: str, message: str, request_id: str = "") -> HandshakeRefusal:
    """Deepgram's refusal of a WebSocket upgrade: an HTTP status with a JSON body."""
    request_id = request_id or str(uuid.uuid4())
    status, err_code = _HANDSHAKE_STATUS.get(code, (500, "INTERNAL_SERVER_ERROR"))
    if status == 401:
        message = "Invalid credentials."  # Deepgram's words; the SDK reports 401 as such
    body = {"err_code": err_code, "err_msg": message, "request_id": request_id}
    return HandshakeRefusal(status, body, request_id)


def _plain(word: str) -> str:
    """Deepgram's ``word``: lower case, no punctuation around it (``punctuated_word`` has it)."""
    return re.sub(r"^[^\w']+|[^\w']+$", "", word.strip()).lower()


@dataclass
class DeepgramMessages:
    """Turns one stream's gRPC responses into Deepgram's server messages."""

    options: ListenOptions
    request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    created: str = field(
        default_factory=lambda: datetime.now(UTC).isoformat(timespec="milliseconds")
    )
    #: (channel, utterance) whose speech ended: their final is ``speech_final``; the
    #: value: the client's Finalize ended it
    _ended: dict[tuple[int, int], bool] = field(default_factory=dict)
    #: channels whose latest Finalize a final ended (``from_finalize``) before the
    #: server's acknowledgement (FINALIZED) came
    _answered: set[int] = field(default_factory=set)
    #: (channel, utterance) → where its first interim started, until its final
    _interim_start: dict[tuple[int, int], float] = field(default_factory=dict)
    #: channel → the end of the last word of its finals since its last UtteranceEnd
    _word_end: dict[int, float] = field(default_factory=dict)
    #: channels whose speech started and has not ended yet
    _speaking: set[int] = field(default_factory=set)
    #: channel → the latest start of speech on it, and the latest end
    _started_at: dict[int, float] = field(default_factory=dict)
    _ended_at: dict[int, float] = field(default_factory=dict)

    def _finalized(self, e: asr_pb2.SpeechEvent) -> list[Event]:
        """The server acknowledged a Finalize on this channel. If no final answered it
        (nothing was open, or what was open held no words), the answer is an empty final
        with ``from_finalize``, as Deepgram's is when it has nothing new: pipecat, which
        sends Finalize at every stop of its VAD, stops waiting on it then."""
        if e.channel in self._answered:
            self._answered.discard(e.channel)
            return []
        empty = asr_pb2.Result(
            is_final=True,
            start_s=e.offset_s,
            end_s=e.offset_s,
            utterance_id=e.utterance_id,
            channel=e.channel,
            from_finalize=True,
        )
        return self._results(empty)

    def _channel(self, channel: int) -> list[int]:
        return [channel, self.options.reported_channels]

    def _no_words(self, e: asr_pb2.SpeechEvent) -> list[Event]:
        """The utterance ended without words (its interims may have read some): Deepgram
        supersedes every interim with a final, so the answer is an empty final over the
        interims' span, ``speech_final`` if its speech ended. Ended by a Finalize, it is
        that Finalize's answer."""
        key = (e.channel, e.utterance_id)
        by_finalize = self._ended.get(key, False)
        if by_finalize:
            self._answered.add(e.channel)
        empty = asr_pb2.Result(
            is_final=True,
            start_s=min(self._interim_start.get(key, e.offset_s), e.offset_s),
            end_s=e.offset_s,
            utterance_id=e.utterance_id,
            channel=e.channel,
            from_finalize=by_finalize,
        )
        return self._results(empty)

    def _speech_started(self, e: asr_pb2.SpeechEvent) -> list[Event]:
        """A SpeechStarted, once per start: a resumed gRPC call sends the replayed audio's
        again (while that speech is open, no later than the channel's latest start, or
        before its latest end). A start at the very offset of the latest end is new: a
        Finalize mid-speech ends the utterance there and the next one begins there."""
        if (
            e.channel in self._speaking
            or e.offset_s <= self._started_at.get(e.channel, -1.0)
            or e.offset_s < self._ended_at.get(e.channel, -1.0)
        ):
            return []
        self._speaking.add(e.channel)
        self._started_at[e.channel] = e.offset_s
        if not self.options.vad_events:
            return []
        return [
            {
                "type": "SpeechStarted",
                "channel": self._channel(e.channel),
                "timestamp": round(e.offset_s, 3),
            }
        ]

    def response(self, response: asr_pb2.StreamingRecognizeResponse) -> list[Event]:
        if response.HasField("speech_event"):
            e = response.speech_event
            if e.type == asr_pb2.SpeechEvent.SPEECH_ENDED:
                self._ended[(e.channel, e.utterance_id)] = e.from_finalize
                self._speaking.discard(e.channel)
                self._ended_at[e.channel] = max(e.offset_s, self._ended_at.get(e.channel, 0.0))
                return []
            if e.type == asr_pb2.SpeechEvent.NO_WORDS:
                return self._no_words(e)
            if e.type == asr_pb2.SpeechEvent.FINALIZED:
                return self._finalized(e)
            if e.type == asr_pb2.SpeechEvent.SPEECH_STARTED:
                return self._speech_started(e)
            return []
        if not response.HasField("result"):
            return []
        return self._results(response.result)

    def _results(self, r: asr_pb2.Result) -> list[Event]:
        key = (r.channel, r.utterance_id)
        if not r.is_final:
            self._interim_start.setdefault(key, r.start_s)
        else:
            self._interim_start.pop(key, None)
        speech_final = r.is_final and key in self._ended
        if r.is_final:
            self._ended.pop(key, None)
        from_finalize = r.is_final and r.from_finalize
        if from_finalize and r.text:  # (the empty answer above is no final of the server's)
            self._answered.add(r.channel)
        words = [
            {
                "word": _plain(w.word),
                "start": round(w.start_s, 3),
                "end": round(w.end_s, 3),
                "confidence": round(w.probability, 4),
                "punctuated_word": w.word.strip(),
            }
            for w in r.words
            if _plain(w.word)
        ]
        if self.options.punctuate:
            transcript = r.text.strip()
        else:
            transcript = " ".join(p for p in map(_plain, r.text.split()) if p)
        # the server's for a final (Whisper has none for a partial); from a server that
        # predates it, the words' mean probability, where the final has words
        confidence = round(r.confidence, 4)
        if not confidence and words:
            confidence = round(sum(w["confidence"] for w in words) / len(words), 4)
        results: Event = {
            "type": "Results",
            "channel_index": self._channel(r.channel),
            "duration": round(max(0.0, r.end_s - r.start_s), 3),
            "start": round(r.start_s, 3),
            "is_final": r.is_final,
            "speech_final": speech_final,
            "channel": {
                "alternatives": [
                    {"transcript": transcript, "confidence": confidence, "words": words}
                ]
            },
            "metadata": {
                "request_id": self.request_id,
                "model_info": MODEL_INFO,
                "model_uuid": MODEL_UUID,
            },
            "from_finalize": from_finalize,
        }
        out = [results]
        if r.is_final and transcript:
            self._word_end[r.channel] = words[-1]["end"] if words else round(r.end_s, 3)
        # after the words of this final, or of an earlier part of a speech the server
        # split whose last part had none
        last_word_end = self._word_end.pop(r.channel, None) if speech_final else None
        if last_word_end is not None and self.options.utterance_end_ms is not None:
            out.append(
                {
                    "type": "UtteranceEnd",
                    "channel": self._channel(r.channel),
                    "last_word_end": last_word_end,
                }
            )
        return out

    def metadata(self, duration_s: float, sha256: str) -> Event:
        """The summary Deepgram sends after the last result of a stream closed by
        ``CloseStream``: ``duration`` is the audio received, in seconds, and ``sha256``
        that of the bytes received."""
        return {
            "type": "Metadata",
            "transaction_key": "deprecated",
            "request_id": self.request_id,
            "sha256": sha256,
            "created": self.created.replace("+00:00", "Z"),
            "duration": round(duration_s, 3),
            "channels": self.options.reported_channels,
            "models": [MODEL_UUID],
            "model_info": {MODEL_UUID: MODEL_INFO},
        }

    def configure_failure(self) -> Event:
        return {
            "type": "ConfigureFailure",
            "request_id": self.request_id,
            "code": "CONFIGURE_KEYTERMS_NOT_SUPPORTED",
            "description": "this server does not change a stream's settings once it is open",
        }
