"""OpenAI Realtime transcription sessions, the protocol: client events in, server events out.

Pure (no I/O), like protocol.py; realtime_session.py runs a session with it. What a
transcription session of OpenAI's Realtime API (``/v1/realtime?intent=transcription``)
defines, mapped onto one streamasr stream:

* the session: ``session.update`` (GA shape: ``session.audio.input.{format, transcription,
  turn_detection, noise_reduction}``) or ``transcription_session.update`` (the beta shape:
  ``input_audio_format``, ``input_audio_transcription``, ``turn_detection``,
  ``input_audio_noise_reduction``), answered by ``session.updated`` or
  ``transcription_session.updated`` with the whole effective session;
* audio: ``input_audio_buffer.append`` (base64; pcm16 24 kHz mono, or G.711 μ-law/A-law
  8 kHz), ``.commit`` (ends the current utterance now), ``.clear`` (drops what was
  appended and not yet committed);
* out: ``input_audio_buffer.speech_started/stopped/committed``,
  ``conversation.item.input_audio_transcription.delta`` (append-only: text that became
  stable, and the rest with the final) and ``.completed``, and ``error`` in the
  documented shape.

What is accepted but has no effect here, and what is refused, is in docs/compat.md.
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from asr_api.v1 import asr_pb2
from asr_bridge.wire import json_message

Event = dict[str, Any]

#: (our encoding, sample rate, bytes per sample) of each format name, GA and beta
FORMATS: dict[str, tuple[str, int, int]] = {
    "audio/pcm": ("LINEAR16", 24_000, 2),
    "audio/pcmu": ("MULAW", 8_000, 1),
    "audio/pcma": ("ALAW", 8_000, 1),
    "pcm16": ("LINEAR16", 24_000, 2),
    "g711_ulaw": ("MULAW", 8_000, 1),
    "g711_alaw": ("ALAW", 8_000, 1),
}
_BETA_FORMAT = {"audio/pcm": "pcm16", "audio/pcmu": "g711_ulaw", "audio/pcma": "g711_alaw"}
_GA_FORMAT = {beta: ga for ga, beta in _BETA_FORMAT.items()}

#: server_vad's silence_duration_ms is our silence_ms; its range is ours
MIN_SILENCE_MS, MAX_SILENCE_MS = 100, 10_000
#: turn_detection null: the client commits; the server only ends an utterance on long silence
MANUAL_SILENCE_MS = MAX_SILENCE_MS
DEFAULT_TRANSCRIPTION_MODEL = "whisper-1"
#: semantic_vad's eagerness → the longest pause held open (OpenAI documents 8 s, 4 s and
#: 2 s as the maximum waits of low, medium and high; auto is medium)
SEMANTIC_MAX_SILENCE_MS = {"low": 8000, "medium": 4000, "auto": 4000, "high": 2000}


class RealtimeError(ValueError):
    """A client event the session cannot take: an ``error`` event; the session goes on."""

    def __init__(self, message: str, *, code: str = "invalid_value", param: str | None = None):
        super().__init__(message)
        self.code = code
        self.param = param


@dataclass
class TranscriptionSession:
    """The effective session, kept in the GA shape; ``to_beta`` renders the beta one."""

    format: str = "audio/pcm"
    model: str = DEFAULT_TRANSCRIPTION_MODEL
    language: str = ""
    languages: list[str] = field(default_factory=list)
    prompt: str = ""
    keywords: list[str] = field(default_factory=list)
    #: None = turn detection off (the client commits); else the server_vad settings
    turn_detection: dict[str, Any] | None = field(
        default_factory=lambda: {
            "type": "server_vad",
            "threshold": 0.5,
            "prefix_padding_ms": 300,
            "silence_duration_ms": 500,
        }
    )
    noise_reduction: dict[str, Any] | None = None
    include: list[str] | None = None

    # -- what the stream gets ------------------------------------------------------------

    @property
    def encoding(self) -> str:
        return FORMATS[self.format][0]

    @property
    def sample_rate(self) -> int:
        return FORMATS[self.format][1]

    @property
    def frame_bytes(self) -> int:
        return FORMATS[self.format][2]

    def seconds(self, audio: bytes) -> float:
        """How long ``audio`` in this session's format lasts."""
        return len(audio) / self.frame_bytes / self.sample_rate

    @property
    def server_vad(self) -> bool:
        return self.turn_detection is not None

    @property
    def speech_margins_ms(self) -> tuple[int, int]:
        """What OpenAI's speech_started/stopped times include around the speech: server_vad's
        prefix_padding_ms before and silence_duration_ms after (semantic_vad has neither)."""
        td = self.turn_detection
        if td is None or td.get("type") != "server_vad":
            return 0, 0
        return int(td.get("prefix_padding_ms", 300)), int(td.get("silence_duration_ms", 500))

    def streaming_config(self) -> asr_pb2.StreamingConfig:
        td = self.turn_detection
        semantic = td is not None and td.get("type") == "semantic_vad"
        if td is None:
            silence = MANUAL_SILENCE_MS
        elif semantic:
            silence = 0  # unused: the turn model decides, up to the longest pause
        else:
            silence = int(td.get("silence_duration_ms") or 500)
        endpointing = asr_pb2.EndpointingConfig(
            silence_ms=silence,
            mode="SEMANTIC" if semantic else "SILENCE",
            max_silence_ms=SEMANTIC_MAX_SILENCE_MS[td["eagerness"]] if semantic and td else 0,
        )
        prompt = self.prompt.strip()
        return asr_pb2.StreamingConfig(
            format=asr_pb2.AudioFormat(
                encoding=self.encoding, sample_rate_hz=self.sample_rate, channels=1
            ),
            language=self.language,
            languages=self.languages,
            interim_results=True,
            endpointing=endpointing,
            hotwords=self.keywords,
            initial_prompt=prompt,
        )

    # -- updates -------------------------------------------------------------------------

    def update_ga(self, session: Any) -> None:
        """Apply a ``session.update``'s session (only the fields present change)."""
        _expect(session, dict, "session")
        kind = session.get("type", "transcription")
        if kind != "transcription":
            raise RealtimeError(
                f"session.type {kind!r} is not served here: this endpoint transcribes "
                '(use "type": "transcription")',
                param="session.type",
            )
        audio = _expect(session.get("audio", {}), dict, "session.audio")
        given = _expect(audio.get("input", {}), dict, "session.audio.input")
        if "format" in given:
            fmt = _expect(given["format"], dict, "session.audio.input.format")
            name = fmt.get("type", "audio/pcm")
            self._set_format(name, "session.audio.input.format.type")
            rate = 24_000 if name == "audio/pcm" else 8_000  # G.711 is 8 kHz by definition
            if fmt.get("rate", rate) != rate:
                raise RealtimeError(
                    f"{name} is {rate} Hz in this API", param="session.audio.input.format.rate"
                )
        if "transcription" in given:
            self._set_transcription(given["transcription"], "session.audio.input.transcription")
        if "turn_detection" in given:
            self._set_turn_detection(given["turn_detection"], "session.audio.input.turn_detection")
        if "noise_reduction" in given:
            self.noise_reduction = _noise_reduction(
                given["noise_reduction"], "session.audio.input.noise_reduction"
            )
        if "include" in session:
            self.include = _string_list(session["include"], "session.include")

    def update_beta(self, session: Any) -> None:
        """Apply a ``transcription_session.update``'s session (the beta field names)."""
        _expect(session, dict, "session")
        if "input_audio_format" in session:
            self._set_format(session["input_audio_format"], "session.input_audio_format")
        if "input_audio_transcription" in session:
            self._set_transcription(
                session["input_audio_transcription"], "session.input_audio_transcription"
            )
        if "turn_detection" in session:
            self._set_turn_detection(session["turn_detection"], "session.turn_detection")
        if "input_audio_noise_reduction" in session:
            self.noise_reduction = _noise_reduction(
                session["input_audio_noise_reduction"], "session.input_audio_noise_reduction"
            )
        if "include" in session:
            self.include = _string_list(session["include"], "session.include")

    def _set_format(self, name: Any, param: str) -> None:
        if not isinstance(name, str) or name not in FORMATS:
            raise RealtimeError(
                f"unsupported audio format {name!r}: use audio/pcm (pcm16, 24 kHz), "
                "audio/pcmu (g711_ulaw) or audio/pcma (g711_alaw)",
                param=param,
            )
        self.format = _GA_FORMAT.get(name, name)

    def _set_transcription(self, value: Any, param: str) -> None:
        if value is None:
            raise RealtimeError(
                "transcription cannot be turned off in a transcription session", param=param
            )
        _expect(value, dict, param)
        if "model" in value:
            self.model = str(value["model"] or DEFAULT_TRANSCRIPTION_MODEL)
        if "language" in value:
            self.language = _expect(value["language"] or "", str, f"{param}.language")
        if "languages" in value:
            self.languages = _string_list(value["languages"] or [], f"{param}.languages")
        if "prompt" in value:
            self.prompt = _expect(value["prompt"] or "", str, f"{param}.prompt")
        if "keywords" in value:
            self.keywords = _string_list(value["keywords"] or [], f"{param}.keywords")

    def _set_turn_detection(self, value: Any, param: str) -> None:
        if value is None:
            self.turn_detection = None
            return
        _expect(value, dict, param)
        kind = value.get("type", "server_vad")
        if kind == "semantic_vad":
            eagerness = value.get("eagerness") or "auto"
            if not isinstance(eagerness, str) or eagerness not in SEMANTIC_MAX_SILENCE_MS:
                raise RealtimeError(
                    f"eagerness must be one of {', '.join(SEMANTIC_MAX_SILENCE_MS)}, got "
                    f"{eagerness!r}",
                    param=f"{param}.eagerness",
                )
            self.turn_detection = {"type": "semantic_vad", "eagerness": eagerness}
            return
        if kind != "server_vad":
            raise RealtimeError(
                f"turn_detection type {kind!r} is not supported here: use server_vad, "
                "semantic_vad, or null to commit turns yourself",
                param=f"{param}.type",
            )
        if (self.turn_detection or {}).get("type") == "semantic_vad":
            self.turn_detection = None  # server_vad's own defaults, not semantic's fields
        merged = dict(self.turn_detection or TranscriptionSession().turn_detection or {})
        merged.update({k: v for k, v in value.items() if v is not None})
        silence = merged.get("silence_duration_ms", 500)
        if type(silence) is not int or not MIN_SILENCE_MS <= silence <= MAX_SILENCE_MS:
            raise RealtimeError(
                f"silence_duration_ms must be an integer from {MIN_SILENCE_MS} to "
                f"{MAX_SILENCE_MS}, got {silence!r}",
                param=f"{param}.silence_duration_ms",
            )
        threshold = merged.get("threshold", 0.5)
        # (a bool is an int to isinstance: true was taken, and echoed)
        if type(threshold) not in (int, float) or not 0 <= threshold <= 1:
            raise RealtimeError(
                f"threshold must be from 0 to 1, got {threshold!r}", param=f"{param}.threshold"
            )
        padding = merged.get("prefix_padding_ms", 300)
        if type(padding) is not int or not 0 <= padding <= MAX_SILENCE_MS:
            raise RealtimeError(
                f"prefix_padding_ms must be an integer from 0 to {MAX_SILENCE_MS}, got {padding!r}",
                param=f"{param}.prefix_padding_ms",
            )
        merged["type"] = "server_vad"
        self.turn_detection = merged

    # -- what the client is told ---------------------------------------------------------

    def to_ga(self, session_id: str) -> Event:
        transcription: dict[str, Any] = {
            "model": self.model,
            "language": self.language or None,
            "prompt": self.prompt,
        }
        if self.languages:
            transcription["languages"] = self.languages
        if self.keywords:
            transcription["keywords"] = self.keywords
        fmt: dict[str, Any] = {"type": self.format}
        if self.format == "audio/pcm":
            fmt["rate"] = 24_000
        return {
            "type": "transcription",
            "object": "realtime.transcription_session",
            "id": session_id,
            "audio": {
                "input": {
                    "format": fmt,
                    "transcription": transcription,
                    "turn_detection": copy.deepcopy(self.turn_detection),
                    "noise_reduction": copy.deepcopy(self.noise_reduction),
                }
            },
            "include": self.include,
        }

    def to_beta(self, session_id: str) -> Event:
        return {
            "id": session_id,
            "object": "realtime.transcription_session",
            "input_audio_format": _BETA_FORMAT[self.format],
            "input_audio_transcription": {
                "model": self.model,
                "language": self.language,
                "prompt": self.prompt,
            },
            "turn_detection": copy.deepcopy(self.turn_detection),
            "input_audio_noise_reduction": copy.deepcopy(self.noise_reduction),
            "include": self.include,
        }


def _expect(value: Any, kind: type, param: str) -> Any:
    if not isinstance(value, kind):
        raise RealtimeError(f"{param} must be a {kind.__name__}, got {value!r}"[:300], param=param)
    return value


def _string_list(value: Any, param: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RealtimeError(f"{param} must be a list of strings", param=param)
    return list(value)


def _noise_reduction(value: Any, param: str) -> dict[str, Any] | None:
    """Accepted so that clients that ask for it work; there is no filter here (compat.md)."""
    if value is None:
        return None
    _expect(value, dict, param)
    kind = value.get("type")
    if kind not in ("near_field", "far_field"):
        raise RealtimeError(
            f"noise_reduction type must be near_field or far_field, got {kind!r}",
            param=f"{param}.type",
        )
    return {"type": kind}


# -- client events -------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientEvent:
    type: str
    event_id: str | None
    body: dict[str, Any]


def parse_client_event(text: str) -> ClientEvent:
    try:
        message = json_message(text)
    except json.JSONDecodeError as exc:
        raise RealtimeError(f"not JSON: {exc}", code="invalid_json") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise RealtimeError('an event must be a JSON object with a "type"', code="invalid_event")
    event_id = message.get("event_id")
    return ClientEvent(message["type"], event_id if isinstance(event_id, str) else None, message)


def decode_audio(event: ClientEvent, frame_bytes: int) -> bytes:
    audio = event.body.get("audio")
    if not isinstance(audio, str):
        raise RealtimeError('"audio" must be a base64 string', param="audio")
    try:
        data = base64.b64decode(audio, validate=True)
    except ValueError:  # binascii.Error, or a string that is not ASCII
        raise RealtimeError('"audio" is not valid base64', param="audio") from None
    if len(data) % frame_bytes:
        raise RealtimeError(
            f"audio of {len(data)} bytes is not whole {frame_bytes}-byte samples", param="audio"
        )
    return data


# -- server events -------------------------------------------------------------------------


@dataclass
class _Pending:
    """A commit or clear sent to the server as FINALIZE, not yet acknowledged, and the
    replies to client events that came after it (``ServerEvents.in_order``)."""

    action: str  # "commit" or "clear"
    replies_after: list[Event] = field(default_factory=list)


@dataclass
class _Item:
    """One user message item: speech from its start to its end. The server may have cut
    that speech into several utterances (at a short pause once it is longer than the
    server's ``split_at_pause_after_s``, or at its length limit), with a final each and no
    speech end between them: those finals are this item's parts, as OpenAI makes one item
    of one stretch of speech (with server VAD) or of one commit (without)."""

    id: str
    parts: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: the client had its speech start (``speech_started`` with server VAD)
    started: bool = False
    #: its speech ended (it is committed); its last utterance's final is still to come
    ended: bool = False
    previous_id: str | None = None
    committed: bool = False
    #: delta text that came before the item was committed (a split's earlier parts): the
    #: real API sends deltas of committed items only, so these wait for the commit
    held: list[str] = field(default_factory=list)

    @property
    def transcript(self) -> str:
        return " ".join(self.parts)


@dataclass
class ServerEvents:
    """Numbered server events, and the results of a stream as transcription events."""

    session_id: str
    #: the item events in the GA shape (``conversation.item.added`` and ``.done``, for a
    #: client that sends ``session.update``) or the beta one (``conversation.item.created``,
    #: for ``transcription_session.update``)
    ga: bool = True
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    _sent: dict[int, str] = field(default_factory=dict)  # stable text sent, per utterance
    _previous_item: str | None = None
    #: each utterance whose final (or NO_WORDS) has not come yet → the item it is part of
    _items: dict[int, _Item] = field(default_factory=dict)
    #: the item whose speech is under way: the utterance after a split is part of it too
    _open: _Item | None = None
    #: the client's commits and clears sent to the server as FINALIZE, not yet acknowledged
    #: (FINALIZED), oldest first; and whether the oldest commit has committed an item
    _pending: deque[_Pending] = field(default_factory=deque)
    _pending_answered: bool = False
    #: utterances a clear ended: nothing of them reaches the client
    _cleared: set[int] = field(default_factory=set)
    _empty_items: itertools.count[int] = field(default_factory=itertools.count)
    #: after a resume, the items whose speech the new call hears again, oldest first,
    #: each with the text its deltas carried: the next utterances take them over
    _replayed: deque[tuple[_Item, str]] = field(default_factory=deque)
    #: where the last speech_stopped put its item's end (ms): the next item's audio, and
    #: so its speech_started, begins no earlier
    _last_end_ms: int = 0

    def commit(self) -> None:
        """The client committed the buffer (call before sending its FINALIZE)."""
        self._pending.append(_Pending("commit"))

    def clear(self) -> None:
        """``input_audio_buffer.clear`` (call before sending its FINALIZE): the utterance
        that FINALIZE ends produces nothing; what the VAD committed before stays."""
        self._pending.append(_Pending("clear"))

    def in_order(self, replies: list[Event]) -> list[Event]:
        """``replies`` to a client event, to send now; or none, and they follow the answer
        to the newest commit or clear still waiting for the server. OpenAI answers a commit
        at once (``committed``), so a client reads the replies to its events in the order
        it sent them: an error for a second, empty commit came before the first one's
        ``committed`` here."""
        if not self._pending:
            return replies
        self._pending[-1].replies_after.extend(replies)
        return []

    def resumed(self) -> None:
        """The stream went on on a new call (asr_client's resume). The server hears again,
        under new utterance ids, each utterance that had no final: each is still part of
        the item it was, which the client has had a speech start, perhaps a commit of,
        and is completed by the new call's final; a cleared one stays dropped."""
        cut: dict[int, tuple[_Item, str]] = {}
        for u in sorted({*self._items, *self._cleared}):
            item = self._items.get(u) or _Item(self.item(u), started=True)
            cut[id(item)] = (item, self._sent.pop(u, ""))  # its last utterance is the cut one
        if self._open is not None and id(self._open) not in cut:
            cut[id(self._open)] = (self._open, "")  # the part after a split, not yet heard
        for item, _ in cut.values():
            item.ended = False  # the replay's own speech end ends it (a split comes first)
        self._replayed.extendleft(reversed(cut.values()))
        self._items, self._cleared, self._open = {}, set(), None

    def event(self, kind: str, **fields: Any) -> Event:
        return {"event_id": f"event_{self.session_id}_{next(self._ids)}", "type": kind, **fields}

    def item(self, utterance_id: int) -> str:
        return f"item_{self.session_id}_{utterance_id}"

    def error(
        self,
        message: str,
        *,
        kind: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        event_id: str | None = None,
    ) -> Event:
        return self.event(
            "error",
            error={
                "type": kind,
                "code": code,
                "message": message,
                "param": param,
                "event_id": event_id,
            },
        )

    def response(
        self,
        response: asr_pb2.StreamingRecognizeResponse,
        *,
        server_vad: bool,
        margins_ms: tuple[int, int] = (0, 0),
    ) -> list[Event]:
        """``margins_ms``: added before speech_started's and after speech_stopped's time."""
        if response.HasField("speech_event"):
            return self._speech(response.speech_event, server_vad, margins_ms)
        if response.HasField("result"):
            return self._result(response.result)
        return []

    def finish(self) -> list[Event]:
        """The stream ended: an item whose speech had not ended (the audio stopped inside
        it) is committed and completed with what it has."""
        out = self._unheard()
        item, self._open = self._open, None
        if item is not None and item.parts:
            out += [*self._commit(item), *self._complete(item)]
        for pending in self._pending:  # (the replies held behind what the end left open)
            out += pending.replies_after
            pending.replies_after = []
        return out

    def _item_of(self, utterance_id: int) -> _Item:
        item = self._items.get(utterance_id)
        if item is None:
            if self._open is None and self._replayed:
                self._open, sent = self._replayed.popleft()
                if sent:  # the deltas go on from what they carried before the resume
                    self._sent[utterance_id] = sent
            item = self._open or _Item(self.item(utterance_id))
            self._items[utterance_id] = self._open = item
        return item

    def _unheard(self) -> list[Event]:
        """The items a resume left that the new call did not hear again before an
        acknowledgement (or the stream's end): a committed one is completed with what it
        has; the uncommitted one (the part after a split) is the one under way again."""
        out = []
        while self._replayed:
            item, _ = self._replayed.popleft()
            if item.committed:
                out += self._complete(item)
            elif self._open is None:
                self._open = item
        return out

    def _speech(
        self, e: asr_pb2.SpeechEvent, server_vad: bool, margins_ms: tuple[int, int] = (0, 0)
    ) -> list[Event]:
        if e.type == asr_pb2.SpeechEvent.FINALIZED:
            return self._finalized()
        ms = round(e.offset_s * 1000)
        if e.type == asr_pb2.SpeechEvent.SPEECH_STARTED:
            item = self._item_of(e.utterance_id)
            started, item.started = item.started, True
            if not server_vad or started:  # (started: heard again after a resume)
                return []
            return [
                self.event(
                    "input_audio_buffer.speech_started",
                    audio_start_ms=max(self._last_end_ms, ms - margins_ms[0]),
                    item_id=item.id,
                )
            ]
        if e.utterance_id in self._cleared:
            if e.type == asr_pb2.SpeechEvent.NO_WORDS:
                self._cleared.discard(e.utterance_id)
            return []
        if e.type == asr_pb2.SpeechEvent.NO_WORDS:
            return self._no_words(e.utterance_id)
        if e.type != asr_pb2.SpeechEvent.SPEECH_ENDED:
            return []  # (SPEECH_RESUMED: this API has no eager results)
        if e.from_finalize and self._pending:
            if self._pending[0].action == "clear":
                self._drop(e.utterance_id)
                return []
            self._pending_answered = True
        item = self._item_of(e.utterance_id)
        self._open, item.ended = None, True  # speech after this is another item
        if item.committed:  # its speech heard again after a resume: the client has its end
            return []
        out = []
        if server_vad:
            # the silence the VAD waited for is part of the item; a client's commit ends
            # it where it was made, with no such silence after it
            end_ms = ms if e.from_finalize else ms + margins_ms[1]
            self._last_end_ms = max(self._last_end_ms, end_ms)
            out.append(
                self.event(
                    "input_audio_buffer.speech_stopped", audio_end_ms=end_ms, item_id=item.id
                )
            )
        return [*out, *self._commit(item)]

    def _drop(self, utterance_id: int | None = None) -> None:
        """A clear: nothing of the uncommitted buffer reaches the client, neither the
        utterance its FINALIZE ended (None: it found none open) nor any earlier part of
        the item under way (a split's: the part after a split has no speech start)."""
        ended = [] if utterance_id is None else [utterance_id]
        item = self._open
        if item is not None and not item.committed:
            self._open = None
            ended += [u for u, i in self._items.items() if i is item]
        for u in ended:
            self._cleared.add(u)
            self._sent.pop(u, None)
            self._items.pop(u, None)

    def _finalized(self) -> list[Event]:
        """The server acknowledged the oldest commit or clear: everything of the audio
        before it has been answered. A commit that committed no item (the buffer held no
        speech, or the VAD had already committed it) commits one now: the parts of a
        split the speech ended in (a press whose speech stopped before the commit), or an
        empty one, completed with no transcript, as OpenAI does with audio without
        speech: clients wait for both."""
        if not self._pending:
            return []
        out = self._unheard()
        pending, answered = self._pending.popleft(), self._pending_answered
        self._pending_answered = False
        return [*out, *self._answer(pending.action, answered), *pending.replies_after]

    def _answer(self, action: str, answered: bool) -> list[Event]:
        """What the oldest commit or clear gets (``answered``: its commit has committed an
        item already)."""
        if action == "clear":
            self._drop()  # what was under way before the clear (its FINALIZE ended none)
            return []
        if answered:
            return []
        item, self._open = self._open, None
        if item is None or not item.parts:
            item = _Item(f"item_{self.session_id}_empty_{next(self._empty_items)}")
        else:  # any later result of its utterances starts another item
            self._items = {u: i for u, i in self._items.items() if i is not item}
        return [*self._commit(item), *self._complete(item)]

    def _commit(self, item: _Item) -> list[Event]:
        """``committed``, the user message item it adds to the conversation, and the
        deltas that waited for it."""
        item.previous_id, self._previous_item = self._previous_item, item.id
        item.committed = True
        held, item.held = item.held, []
        return [
            self.event(
                "input_audio_buffer.committed", item_id=item.id, previous_item_id=item.previous_id
            ),
            self.event(
                "conversation.item.added" if self.ga else "conversation.item.created",
                previous_item_id=item.previous_id,
                item=self._message(item.id, None),
            ),
            *(self._delta_event(item, text) for text in held),
        ]

    def _complete(self, item: _Item) -> list[Event]:
        """``completed`` with the whole item's transcript; in the GA shape, the item with
        it (``conversation.item.done``)."""
        out = [
            self.event(
                "conversation.item.input_audio_transcription.completed",
                item_id=item.id,
                content_index=0,
                transcript=item.transcript,
                logprobs=None,
                usage={"type": "duration", "seconds": round(item.seconds, 3)},
            )
        ]
        if self.ga:
            out.append(
                self.event(
                    "conversation.item.done",
                    previous_item_id=item.previous_id,
                    item=self._message(item.id, item.transcript),
                )
            )
        return out

    @staticmethod
    def _message(item_id: str, transcript: str | None) -> Event:
        return {
            "id": item_id,
            "object": "realtime.item",
            "type": "message",
            "status": "completed",
            "role": "user",
            "content": [{"type": "input_audio", "transcript": transcript}],
        }

    def _no_words(self, utterance_id: int) -> list[Event]:
        """An utterance without words: a committed item still gets its ``completed``, with
        the transcript of its other parts (empty if none), as OpenAI sends one for audio
        without speech (clients wait for it). A split part without words adds nothing."""
        self._sent.pop(utterance_id, None)
        item = self._items.pop(utterance_id, None)
        if item is None or not item.ended:
            return []
        return self._complete(item)

    def _delta(self, item: _Item, utterance_id: int, text: str) -> list[Event]:
        """Text the deltas of this utterance had not carried; the first of a part after
        another is spaced from it, so that the deltas add up to the transcript. Held
        until the item is committed."""
        if not self._sent.get(utterance_id) and item.parts:
            text = " " + text
        if not item.committed:
            item.held.append(text)
            return []
        return [self._delta_event(item, text)]

    def _delta_event(self, item: _Item, text: str) -> Event:
        return self.event(
            "conversation.item.input_audio_transcription.delta",
            item_id=item.id,
            content_index=0,
            delta=text,
        )

    def _result(self, r: asr_pb2.Result) -> list[Event]:
        if r.utterance_id in self._cleared:
            if r.is_final:
                self._cleared.discard(r.utterance_id)
            return []
        item = self._item_of(r.utterance_id)
        if r.is_final:
            return self._final(item, r)
        sent = self._sent.get(r.utterance_id, "")
        if len(r.stable_text) <= len(sent) or not r.stable_text.startswith(sent):
            return []
        deltas = self._delta(item, r.utterance_id, r.stable_text[len(sent) :])
        self._sent[r.utterance_id] = r.stable_text
        return deltas

    def _final(self, item: _Item, r: asr_pb2.Result) -> list[Event]:
        """A final is one part of its item: the last one once its speech has ended (then
        the item is completed), else a split's, and the item goes on."""
        out = []
        sent = self._sent.get(r.utterance_id, "")
        if len(r.text) > len(sent) and r.text.startswith(sent):
            # the text no delta has carried yet (all of it unless the server commits
            # partials): deltas then add up to the transcript, as OpenAI's do
            out += self._delta(item, r.utterance_id, r.text[len(sent) :])
        self._sent.pop(r.utterance_id, None)
        del self._items[r.utterance_id]
        item.parts.append(r.text)
        item.seconds += max(0.0, r.end_s - r.start_s)
        if not item.ended:
            return out
        return [*out, *self._complete(item)]
