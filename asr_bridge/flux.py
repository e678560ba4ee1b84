"""Deepgram Flux (``/v2/listen``) on the bridge: the pure part.

Flux is Deepgram's turn-based API for voice agents: instead of results per utterance it
reports *turns* (``TurnInfo`` messages: ``StartOfTurn``, ``Update``, ``EagerEndOfTurn``,
``TurnResumed``, ``EndOfTurn``), each carrying the whole turn's transcript so far. That is
the server's SEMANTIC endpointing (the turn model, eager finals, ``EndOfTurn``) under
another name, so agents written against Flux (pipecat's and LiveKit's Flux services, the
official SDKs) get the server's turn detection with only the base URL and key changed.

Query parameters → ``StreamingConfig``, client text messages → commands, gRPC responses →
Flux's messages (``FluxTurns``, a small state machine). No I/O: every mapping is unit
tested directly; ``flux_session.py`` runs a socket with it. What is supported, ignored
and refused is documented in ``docs/compat.md``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from asr_api.v1 import asr_pb2
from asr_bridge.deepgram import (
    ENCODINGS,
    CloseStream,
    Event,
    KeepAlive,
    ListenOptions,
    ListenQueryError,
    SchemaError,
    control_message,
    integer_option,
    listen_audio,
    shown,
    split_query,
)

#: Flux's models → the server's language ("" = detect; language_hint narrows it)
MODELS = {"flux-general-en": "en", "flux-general-multi": ""}
#: the server's range for the longest pause a SEMANTIC stream holds open (Flux allows up
#: to 60 s; longer values are capped, which only ends a silent turn sooner)
MIN_TIMEOUT_MS, MAX_TIMEOUT_MS = 300, 10_000
#: (token: the bridge's own check reads it; ``tag`` and ``extra``, repeatable, are
#: deepgram.REPEATED_BOOKKEEPING, accepted by split_query)
_IGNORED = {"mip_opt_out", "token"}
#: Flux features this server does not have: refused when turned on, accepted when off
_UNSUPPORTED_FEATURES = {"numerals", "profanity_filter", "redact"}
EAGER_IGNORED = (
    "eager_eot_threshold has no effect while eot_threshold is 1: the turn model is not "
    "asked, and an EagerEndOfTurn needs its answer"
)
_HANDLED = {
    "model",
    "encoding",
    "sample_rate",
    "eot_threshold",
    "eager_eot_threshold",
    "eot_timeout_ms",
}


@dataclass(frozen=True)
class FluxOptions:
    model: str = "flux-general-en"
    #: a raw encoding, or None: a container the bridge decodes (WAV, Ogg, WebM…)
    encoding: str | None = "linear16"
    sample_rate: int = 16_000
    #: confidence that ends a turn (Flux's default 0.7); 1.0: only ForceEndTurn does
    eot_threshold: float = 0.7
    #: None: no EagerEndOfTurn (Flux's default)
    eager_eot_threshold: float | None = None
    #: None: the server's longest pause (its ``turn.max_silence_ms``)
    eot_timeout_ms: int | None = None
    hotwords: tuple[str, ...] = ()
    language_hints: tuple[str, ...] = ()

    @property
    def multilingual(self) -> bool:
        return MODELS[self.model] == ""

    def audio(self) -> ListenOptions:
        """The audio framing, as the Deepgram route frames it (one channel)."""
        return ListenOptions(encoding=self.encoding, sample_rate=self.sample_rate)

    def decoded(self, sample_rate: int) -> FluxOptions:
        """These options for a container's audio once decoded (and mixed to one channel)."""
        return replace(self, encoding="linear16", sample_rate=sample_rate)


def parse_flux_query(params: Iterable[tuple[str, str]]) -> FluxOptions:
    """The options of a ``/v2/listen`` URL's query (``keyterm`` and ``language_hint`` may
    repeat). Raises ``ListenQueryError`` (HTTP 400 on the handshake, as Deepgram answers)."""
    single, repeated = split_query(
        params,
        repeatable=("keyterm", "language_hint"),
        handled=_HANDLED,
        ignored=_IGNORED,
        unsupported=_UNSUPPORTED_FEATURES,
    )
    hotwords = [v.strip() for k, v in repeated if k == "keyterm" and v.strip()]
    hints = [
        h.strip() for k, v in repeated if k == "language_hint" for h in v.split(",") if h.strip()
    ]
    model = single.get("model")
    if model is None:
        raise ListenQueryError("model is required (flux-general-en or flux-general-multi)")
    if model not in MODELS:
        raise ListenQueryError(
            f"model {shown(model)} is not a Flux model (use flux-general-en or flux-general-multi)"
        )
    # a container (WAV, Ogg, WebM…) without encoding or as ogg-opus, as Flux takes them
    encoding, rate = listen_audio(single, decoded=("ogg-opus",))
    eot = _number(single, "eot_threshold", 0.5, 1.0)
    eager = _number(single, "eager_eot_threshold", 0.3, 0.9)
    if eager is not None and eager > (eot if eot is not None else 0.7):
        raise ListenQueryError("eager_eot_threshold must not be above eot_threshold")
    timeout = (
        integer_option(single, "eot_timeout_ms", 500, 60_000)
        if "eot_timeout_ms" in single
        else None
    )
    if hints and not MODELS[model] == "":
        raise ListenQueryError("language_hint is only for flux-general-multi")
    for hint in hints:
        if not re.fullmatch(r"[A-Za-z]{2,3}(-[A-Za-z0-9]{1,8})*", hint):
            raise ListenQueryError(f"language_hint must be a language code, got {shown(hint)}")
    return FluxOptions(
        model=model,
        encoding=encoding,
        sample_rate=rate,
        eot_threshold=eot if eot is not None else 0.7,
        eager_eot_threshold=eager,
        eot_timeout_ms=None if timeout is None else min(MAX_TIMEOUT_MS, timeout),
        hotwords=tuple(hotwords),
        language_hints=tuple(dict.fromkeys(h.split("-")[0].lower() for h in hints)),
    )


def _number(single: dict[str, str], key: str, low: float, high: float) -> float | None:
    value = single.get(key)
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not low <= number <= high:  # NaN fails too
        raise ListenQueryError(f"{key} must be a number from {low} to {high}, got {shown(value)}")
    return number


def _raw(encoding: str | None) -> str:
    if encoding is None:
        raise ValueError("a container's stream is configured once it is decoded")
    return encoding


def streaming_config(options: FluxOptions) -> asr_pb2.StreamingConfig:
    """Flux's turns are the server's SEMANTIC endpointing, with partials and eager finals.
    ``eot_threshold=1`` is the stream's turn threshold 1: the turn model is not asked, and
    turns end only on ForceEndTurn or the timeout (Flux's "bring your own turn detection")."""
    return asr_pb2.StreamingConfig(
        format=asr_pb2.AudioFormat(
            encoding=ENCODINGS[_raw(options.encoding)],  # type: ignore[arg-type]
            sample_rate_hz=options.sample_rate,
            channels=1,
        ),
        language=MODELS[options.model],
        languages=list(options.language_hints),
        interim_results=True,
        endpointing=asr_pb2.EndpointingConfig(
            mode=asr_pb2.EndpointingConfig.SEMANTIC,
            max_silence_ms=_max_silence_ms(options.eot_timeout_ms),
            eager_finals=options.eager_eot_threshold is not None,
            turn_threshold=options.eot_threshold,
            eager_threshold=options.eager_eot_threshold or 0.0,
        ),
        hotwords=list(options.hotwords),
        word_timestamps=True,  # Flux's turns carry words with times and confidences
    )


def _keyterms(value: object) -> tuple[str, ...]:
    """A Configure's keyterms: a list of strings, or one string (the SDK's type is
    ``Union[str, List[str]]``), a list of one."""
    terms = [value] if isinstance(value, str) else value
    if not isinstance(terms, list) or not all(isinstance(k, str) for k in terms):
        raise ConfigureError("CONFIGURE_INVALID", "keyterms must be a string or a list of strings")
    return tuple(k.strip() for k in terms if k.strip())


def _max_silence_ms(eot_timeout_ms: int | None) -> int:
    """Flux's eot_timeout_ms → the server's max_silence_ms (0: the server's default)."""
    if eot_timeout_ms is None:
        return 0
    return min(MAX_TIMEOUT_MS, max(MIN_TIMEOUT_MS, eot_timeout_ms))


# -- client text messages ----------------------------------------------------------------


@dataclass(frozen=True)
class ForceEndTurn:
    pass


@dataclass(frozen=True)
class Configure:
    """Flux's mid-stream reconfiguration; None: not supplied, unchanged. Its values are
    checked against the stream's settings by ``FluxTurns.configure``."""

    eot_threshold: object = None
    eager_eot_threshold: object = None
    eot_timeout_ms: object = None
    keyterms: object = None
    language_hints: object = None
    #: features the server lacks, which a Configure may turn off (as pipecat's Flux
    #: service sends them whenever its settings change) but not on
    numerals: object = None
    profanity_filter: object = None


class ConfigureError(ValueError):
    """A Configure that is not applied: Flux's ConfigureFailure, and the stream goes on."""

    def __init__(self, code: str, description: str) -> None:
        super().__init__(description)
        self.code = code
        self.description = description


# CloseStream and KeepAlive are the live API's (KeepAlive is not one of Flux's messages,
# but Deepgram's clients send it; there is nothing to do)
ControlMessage = CloseStream | ForceEndTurn | Configure | KeepAlive
_CONTROL: dict[str, type[ControlMessage]] = {
    "CloseStream": CloseStream,
    "ForceEndTurn": ForceEndTurn,
    "Configure": Configure,
    "KeepAlive": KeepAlive,
}


def parse_text(text: str) -> ControlMessage:
    message = control_message(text, _CONTROL, "CloseStream, ForceEndTurn or Configure")
    kind = _CONTROL[message["type"]]
    if kind is Configure:
        thresholds = message.get("thresholds") or {}
        if not isinstance(thresholds, dict):
            raise SchemaError("Configure's thresholds must be an object")
        return Configure(
            eot_threshold=thresholds.get("eot_threshold"),
            eager_eot_threshold=thresholds.get("eager_eot_threshold"),
            eot_timeout_ms=thresholds.get("eot_timeout_ms"),
            keyterms=message.get("keyterms"),
            language_hints=message.get("language_hints"),
            numerals=message.get("numerals"),
            profanity_filter=message.get("profanity_filter"),
        )
    return kind()


# -- server messages ---------------------------------------------------------------------


@dataclass
class _Ending:
    """An utterance that ends the turn (its speech ended): the turn ends at its final."""

    utterance_id: int
    confidence: float = 0.0
    trigger: str = ""  # "" until known: the server's EndOfTurn says, or the bridge infers


_TRIGGERS = {
    asr_pb2.EndOfTurn.MODEL: "model",
    asr_pb2.EndOfTurn.MAX_SILENCE: "timeout",
    asr_pb2.EndOfTurn.FINALIZE: "manual",
}


@dataclass
class FluxTurns:
    """Turns one stream's gRPC responses into Flux's messages, keeping Flux's rules: a
    turn opens with ``StartOfTurn`` (with its first words), ``EagerEndOfTurn`` always has
    words, ``TurnResumed`` only follows ``EagerEndOfTurn``, ``EndOfTurn``'s transcript is
    the preceding ``EagerEndOfTurn``'s (or a ``TurnResumed`` with the new one comes first),
    and ``turn_index`` counts up after each ``EndOfTurn``.

    A turn is the server's utterances from the first words to an utterance whose speech
    ended: an utterance the server split (its length limit, a long reading's pause) goes
    on in the same turn. ``sequence_id`` is stamped by ``stamp`` when a message is sent.

    A resumed stream (``resumed``) goes on in the same turn: the new call hears the cut
    utterance again, under a new id, and its partials are not told while they repeat
    what the client was told before the cut.
    """

    options: FluxOptions
    request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    turn_index: int = 0
    _sequence: int = 0
    _open: bool = False  # StartOfTurn sent
    _eager: str | None = None  # the transcript of an EagerEndOfTurn not yet resolved
    _finals: list[str] = field(default_factory=list)  # this turn's finals (a split turn)
    _final_words: list[Event] = field(default_factory=list)
    _partial: str = ""  # the current utterance's latest partial (or eager) text
    _start: float | None = None
    _end: float = 0.0
    _confidence: float = 0.0  # the turn model's latest answer in this turn
    # the turn's finals' languages, each with its seconds of speech, and the current
    # partial's: a partial's is its own guess from a second or two of audio (before a
    # stream has settled on a language, "띠" read as Korean), which a final replaces
    _languages: dict[str, float] = field(default_factory=dict)
    _partial_language: str = ""
    _ending: _Ending | None = None
    _utterance: int = -1  # the latest utterance heard of
    _told: str = ""  # the transcript of this turn's latest message
    _replaying: bool = False  # after a resume, until the replay goes past ``_told``

    def stamp(self, events: list[Event]) -> list[Event]:
        """Number the messages in the order they are sent (Flux's ``sequence_id``)."""
        for event in events:
            event["sequence_id"] = self._sequence
            self._sequence += 1
        return events

    def connected(self) -> list[Event]:
        return [{"type": "Connected", "request_id": self.request_id}, *self.eager_ignored()]

    def eager_ignored(self) -> list[Event]:
        """Flux's Warning while an eager threshold can give nothing: with eot_threshold 1
        the turn model is not asked, and an eager end needs its answer. (Not a refusal:
        the stream works as asked otherwise, its turns ended by the client.)"""
        o = self.options
        if o.eager_eot_threshold is None or o.eot_threshold < 1:
            return []
        return [self.warning("EAGER_EOT_THRESHOLD_IGNORED", EAGER_IGNORED)]

    def response(self, response: asr_pb2.StreamingRecognizeResponse) -> list[Event]:
        kind = response.WhichOneof("event")
        if kind == "speech_event":
            e = response.speech_event
            if e.type == asr_pb2.SpeechEvent.FINALIZED:
                return []  # a ForceEndTurn's end of turn is told by its EndOfTurn
            out = self._next_utterance(e.utterance_id)
            if e.type == asr_pb2.SpeechEvent.SPEECH_ENDED:
                # a ForceEndTurn's FINALIZE made this end ("manual"); else, in silence
                # mode, the server's silence did, as Flux's timeout (SEMANTIC streams'
                # EndOfTurn, next, says which it was)
                self._ending = _Ending(e.utterance_id, trigger="manual" if e.from_finalize else "")
            elif (
                e.type == asr_pb2.SpeechEvent.SPEECH_RESUMED
                and self._eager is not None
                and not self._repeats(through=False)
            ):
                self._eager = None
                out.append(self._turn_info("TurnResumed"))
            elif e.type == asr_pb2.SpeechEvent.NO_WORDS:
                out += self._no_final(e.utterance_id)
            return out
        if kind == "end_of_turn":
            t = response.end_of_turn
            self._confidence = t.probability
            if t.reason == asr_pb2.EndOfTurn.END_OF_AUDIO:
                self._ending = None  # as Flux: CloseStream does not end the turn
            else:
                self._ending = _Ending(t.utterance_id, t.probability, _TRIGGERS.get(t.reason, ""))
            return []
        if kind == "result":
            return self._result(response.result)
        return []

    def resumed(self) -> None:
        """The stream continues on a new call (asr_client's resume, before the new call's
        first response): the new server hears again, under a new utterance id, the audio
        after the last final. The cut utterance's speech end and partial are forgotten,
        not taken for an utterance without words: the replay continues the same turn."""
        self._ending = None
        self._partial = ""
        self._replaying = self._open

    def closing(self) -> list[Event]:
        """The stream ended (CloseStream): as Flux does, a turn still open gets no
        EndOfTurn (its last Update stands), unless its end was already decided and only
        a final with no words was missing."""
        return self._end_turn() if self._ending is not None and self._open else []

    def _next_utterance(self, utterance_id: int) -> list[Event]:
        """An event of a later utterance: one whose speech ended and whose final has not
        come had no words (the server sends finals in order; servers that predate
        NO_WORDS say no more), so its turn ends now."""
        out: list[Event] = []
        if utterance_id > self._utterance:
            if self._ending is not None and self._ending.utterance_id < utterance_id:
                out = self._no_final(self._ending.utterance_id)
            self._utterance = utterance_id
        return out

    def _no_final(self, utterance_id: int) -> list[Event]:
        """The utterance ended without words (a noise): if it ended the turn, the turn
        ends now, with the words of its finals only."""
        self._partial = ""  # words only a partial heard, which no final confirmed
        if self._ending is None or self._ending.utterance_id != utterance_id:
            return []  # (a split part without words: the turn goes on)
        out = self._end_turn() if self._open else []
        self._reset()
        return out

    def _result(self, r: asr_pb2.Result) -> list[Event]:
        out = self._next_utterance(r.utterance_id)
        if r.utterance_id < self._utterance:
            return out  # a late partial of an utterance already over
        if self._start is None:
            self._start = r.start_s
        self._end = max(self._end, r.end_s)
        if r.language and self.options.multilingual:
            if r.is_final:
                seconds = max(r.end_s - r.start_s, 0.0)
                self._languages[r.language] = self._languages.get(r.language, 0.0) + seconds
                self._partial_language = ""
            else:
                self._partial_language = r.language
        if r.is_final:
            return out + self._final(r)
        self._partial = r.text.strip()
        # an eager end the client was told is a repeat, one it was not told is news
        if self._repeats(through=not r.eager or self._eager is not None):
            return out
        if r.eager:
            self._confidence = r.turn_probability or self._confidence
            out += self._open_turn()
            if self._transcript():
                self._eager = self._transcript()
                out.append(self._turn_info("EagerEndOfTurn"))
            return out
        if not self._open:
            return out + self._open_turn()
        if self._eager is not None:  # not expected: the server resumes the speech first
            self._eager = None
            out.append(self._turn_info("TurnResumed"))
        return out + [self._turn_info("Update")]

    def _repeats(self, *, through: bool) -> bool:
        """After a resume: the transcript is (a prefix of) what the client was last told,
        so the replay repeats it; ``through``: the same words count as a repeat too.
        Once the replay goes past it, the turn goes on as before the cut."""
        if not self._replaying:
            return False
        heard, told = self._transcript().split(), self._told.split()
        if heard == told[: len(heard)] and (len(heard) < len(told) or through):
            return True
        self._replaying = False
        return False

    def _final(self, r: asr_pb2.Result) -> list[Event]:
        self._replaying = False  # a final is news: its words are the turn's from now on
        self._partial = ""
        if r.text.strip():
            self._finals.append(r.text.strip())
            self._final_words.extend(
                {
                    "word": w.word.strip(),
                    "confidence": round(w.probability, 4),
                    "start": round(w.start_s, 3),
                    "end": round(w.end_s, 3),
                }
                for w in r.words
                if w.word.strip()
            )
        if self._ending is not None and self._ending.utterance_id == r.utterance_id:
            out = self._end_turn()
            self._reset()
            return out
        # a turn that goes on (the server split it), or the stream's last words
        if not self._open:
            return self._open_turn()
        return [self._turn_info("Update")]

    def _open_turn(self) -> list[Event]:
        if self._open or not self._transcript():
            return []
        self._open = True
        return [self._turn_info("StartOfTurn")]

    def _end_turn(self) -> list[Event]:
        out = self._open_turn()
        if not self._open:
            return out  # no words in the whole turn: nothing to tell
        assert self._ending is not None
        if self._eager is not None and self._eager != self._transcript():
            out.append(self._turn_info("TurnResumed"))
        trigger = self._ending.trigger or "timeout"
        self._confidence = self._ending.confidence or self._confidence
        out.append(self._turn_info("EndOfTurn", trigger=trigger))
        self.turn_index += 1
        return out

    def _reset(self) -> None:
        self._open = False
        self._eager = None
        self._finals.clear()
        self._final_words = []
        self._partial = ""
        self._start = None
        self._end = 0.0
        self._confidence = 0.0
        self._languages.clear()
        self._partial_language = ""
        self._ending = None
        self._told = ""
        self._replaying = False

    def _transcript(self) -> str:
        return " ".join(t for t in (*self._finals, self._partial) if t)

    def _turn_info(self, event: str, *, trigger: str | None = None) -> Event:
        # words: the finals' (times and Whisper's probabilities), then the partial's,
        # which Whisper gives no times or probabilities for (confidence 0)
        words = list(self._final_words) + [
            {"word": w, "confidence": 0.0} for w in self._partial.split()
        ]
        message: Event = {
            "type": "TurnInfo",
            "request_id": self.request_id,
            "event": event,
            "turn_index": self.turn_index,
            "audio_window_start": round(self._start or 0.0, 3),
            "audio_window_end": round(self._end, 3),
            "transcript": self._transcript(),
            "words": words,
            "end_of_turn_confidence": round(self._confidence, 4),
        }
        if trigger is not None:
            message["trigger"] = trigger
        self._told = message["transcript"]
        if self.options.multilingual and self._languages:  # most speech first
            message["languages"] = sorted(self._languages, key=lambda k: -self._languages[k])
        elif self.options.multilingual and self._partial_language:  # no final yet
            message["languages"] = [self._partial_language]
        if self.options.language_hints:
            message["languages_hinted"] = list(self.options.language_hints)
        return message

    def warning(self, code: str, description: str) -> Event:
        return {
            "type": "Warning",
            "request_id": self.request_id,
            "code": code,
            "description": description,
        }

    def configure(self, c: Configure) -> tuple[asr_pb2.StreamingUpdate, Event]:
        """The server's update for a client's Configure, and the ConfigureSuccess to send
        once it is on its way (the settings now in effect); raises ``ConfigureError``."""
        o = self.options
        if c.language_hints is not None:
            raise ConfigureError(
                "CONFIGURE_NOT_SUPPORTED", "language hints cannot change on a running stream here"
            )
        for name, value in (("numerals", c.numerals), ("profanity_filter", c.profanity_filter)):
            if value is True:
                raise ConfigureError("CONFIGURE_NOT_SUPPORTED", f"{name} is not supported here")
            if value not in (None, False):
                raise ConfigureError("CONFIGURE_INVALID", f"{name} must be true or false")
        eot = _configured(c.eot_threshold, "eot_threshold", 0.5, 1.0, o.eot_threshold)
        eager = _configured(
            c.eager_eot_threshold, "eager_eot_threshold", 0.3, 0.9, o.eager_eot_threshold
        )
        if eager is not None and eager > eot:
            raise ConfigureError(
                "CONFIGURE_INVALID", "eager_eot_threshold must not be above eot_threshold"
            )
        timeout = _configured(c.eot_timeout_ms, "eot_timeout_ms", 500, 60_000, o.eot_timeout_ms)
        keyterms = o.hotwords
        if c.keyterms is not None:
            keyterms = _keyterms(c.keyterms)
        self.options = replace(
            o,
            eot_threshold=eot,
            eager_eot_threshold=eager,
            # capped as a query's is: ConfigureSuccess echoes what is in effect
            eot_timeout_ms=None if timeout is None else min(MAX_TIMEOUT_MS, int(timeout)),
            hotwords=keyterms,
        )
        update = asr_pb2.StreamingUpdate(
            turn_threshold=eot,
            max_silence_ms=_max_silence_ms(self.options.eot_timeout_ms),
            replace_hotwords=c.keyterms is not None,
            hotwords=list(keyterms) if c.keyterms is not None else [],
        )
        if eager is not None:
            update.eager_threshold = eager
            if o.eager_eot_threshold is None:  # eager mode from here on
                update.eager_finals = True
        thresholds: Event = {"eot_threshold": eot}
        if eager is not None:
            thresholds["eager_eot_threshold"] = eager
        if self.options.eot_timeout_ms is not None:
            thresholds["eot_timeout_ms"] = self.options.eot_timeout_ms
        success: Event = {
            "type": "ConfigureSuccess",
            "request_id": self.request_id,
            "thresholds": thresholds,
            "keyterms": list(keyterms),
        }
        return update, success

    def configure_failure(self, error: ConfigureError) -> Event:
        return {
            "type": "ConfigureFailure",
            "request_id": self.request_id,
            "code": error.code,
            "description": error.description,
        }


def _configured(value: object, name: str, low: float, high: float, current: float | None) -> Any:
    """A Configure threshold: the current value when not supplied, else checked."""
    if value is None:
        return current
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ConfigureError("CONFIGURE_INVALID", f"{name} must be a number from {low} to {high}")
    return value


def fatal_error(code: str, description: str) -> Event:
    """Flux's ``Error``: the session ends after it."""
    return {"type": "Error", "code": code, "description": description}
