"""Protobuf ⇄ domain conversion, with config validation that names the bad field."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

from asr_api.v1 import asr_pb2
from asr_server.audio.decode import AudioFormat, AudioFormatError, Encoding
from asr_server.errors import AsrError
from asr_server.session.language import language_code
from asr_server.session.types import (
    EndOfTurn,
    Finalized,
    GoingAway,
    NoWords,
    OutEvent,
    Progress,
    ProgressReport,
    RecognitionResult,
    SpeechBoundary,
    SpeechResumed,
    StreamConfig,
    StreamDone,
    TurnEndReason,
)
from asr_server.settings import Settings
from asr_server.transport.resume import resume_from_proto
from asr_server.vad.turn import first_ask_threshold, is_narrowband

logger = logging.getLogger(__name__)

_ENCODINGS = {
    asr_pb2.AudioFormat.LINEAR16: Encoding.LINEAR16,
    asr_pb2.AudioFormat.FLOAT32: Encoding.FLOAT32,
    asr_pb2.AudioFormat.MULAW: Encoding.MULAW,
    asr_pb2.AudioFormat.ALAW: Encoding.ALAW,
}

_TURN_END_REASONS = {
    TurnEndReason.MODEL: asr_pb2.EndOfTurn.MODEL,
    TurnEndReason.MAX_SILENCE: asr_pb2.EndOfTurn.MAX_SILENCE,
    TurnEndReason.FINALIZE: asr_pb2.EndOfTurn.FINALIZE,
    TurnEndReason.END_OF_AUDIO: asr_pb2.EndOfTurn.END_OF_AUDIO,
}

#: how much of a client's string an error message quotes back
QUOTE_CHARS = 40


def _quote(value: str) -> str:
    """``repr`` of a client's string, cut short: a status message has to fit in the HTTP/2
    trailers (the client drops anything over 16 KiB of metadata as RESOURCE_EXHAUSTED)."""
    if len(value) <= QUOTE_CHARS:
        return repr(value)
    return f"{value[:QUOTE_CHARS]!r}… ({len(value)} characters)"


def stream_config_from_proto(
    msg: asr_pb2.StreamingConfig,
    settings: Settings,
    *,
    model_name: str,
    languages: frozenset[str] | None,
) -> StreamConfig:
    """Validate a client's config; ``languages`` is None when any code the model knows is fine."""
    if not msg.HasField("format"):
        raise AsrError.invalid("config.format is required (encoding, sample_rate_hz)")
    encoding = _ENCODINGS.get(msg.format.encoding)
    if encoding is None:
        name = (
            asr_pb2.AudioFormat.Encoding.Name(msg.format.encoding)
            if msg.format.encoding in (asr_pb2.AudioFormat.Encoding.values())
            else str(msg.format.encoding)
        )
        raise AsrError.invalid(
            f"config.format.encoding {name} is not supported; use LINEAR16, FLOAT32, MULAW or ALAW"
        )
    fmt = AudioFormat(encoding, msg.format.sample_rate_hz, msg.format.channels or 1)
    try:
        fmt.validate()
    except AudioFormatError as exc:
        raise AsrError.invalid(f"config.format: {exc}") from None
    if msg.model and msg.model != model_name:
        raise AsrError.invalid(
            f"config.model {_quote(msg.model)} is not served here; this server runs {model_name!r} "
            "(leave model empty to use it)"
        )
    language = language_code(msg.language) or None
    if language is not None and languages is not None and language not in languages:
        allowed = _known_languages(languages, "a Whisper language code")
        # (a model of one language has nothing to detect: empty is that language)
        empty = "leave empty to detect" if len(languages) > 1 else "leave empty"
        raise AsrError.invalid(
            f"config.language {_quote(msg.language)} is not supported by model {model_name!r} "
            f"(use {allowed}, or {empty})"
        )
    allowed_languages = _allowed_languages(msg, languages, model_name)
    if language is not None and allowed_languages and language not in allowed_languages:
        raise AsrError.invalid(
            f"config.language {_quote(msg.language)} is not among config.languages "
            f"({', '.join(allowed_languages)})"
        )
    vad = settings.vad
    max_utt = msg.endpointing.max_utterance_ms or vad.max_utterance_ms
    if not 2_000 <= max_utt <= 28_000:
        raise AsrError.invalid(
            f"config.endpointing.max_utterance_ms {max_utt} is out of range 2000-28000"
        )
    semantic = msg.endpointing.mode == asr_pb2.EndpointingConfig.SEMANTIC
    if msg.endpointing.mode not in (
        asr_pb2.EndpointingConfig.SILENCE,
        asr_pb2.EndpointingConfig.SEMANTIC,
    ):
        raise AsrError.invalid(f"config.endpointing.mode {msg.endpointing.mode} is unknown")
    endpointing = _Endpointing(
        silence_ms=msg.endpointing.silence_ms or vad.silence_ms,
        max_silence_ms=msg.endpointing.max_silence_ms or settings.turn.max_silence_ms,
        turn_threshold=msg.endpointing.turn_threshold or None,
        eager_threshold=msg.endpointing.eager_threshold or None,
    )
    endpointing.check(settings, fmt.sample_rate_hz, "config.endpointing")
    _check_prompt(msg.initial_prompt, msg.hotwords, settings, "config")
    hotwords = tuple(h.strip() for h in msg.hotwords if h.strip())
    config = StreamConfig(
        format=fmt,
        language=language,
        languages=allowed_languages,
        interim_results=msg.interim_results,
        silence_ms=endpointing.silence_ms,
        max_utterance_ms=max_utt,
        semantic=semantic,
        max_silence_ms=endpointing.max_silence_ms,
        eager_finals=msg.endpointing.eager_finals,
        turn_threshold=endpointing.turn_threshold,
        eager_threshold=endpointing.eager_threshold,
        initial_prompt=msg.initial_prompt.strip(),
        hotwords=hotwords,
        word_timestamps=msg.word_timestamps,
        resume=resume_from_proto(msg, fmt, settings, languages),
    )
    _warn_if_partly_read(config.prompt, "config")
    return config


@dataclass(frozen=True)
class _Endpointing:
    """A stream's endpointing values, with the server's defaults filled in."""

    silence_ms: int
    max_silence_ms: int
    turn_threshold: float | None
    eager_threshold: float | None

    @classmethod
    def of(cls, config: StreamConfig) -> _Endpointing:
        return cls(
            config.silence_ms, config.max_silence_ms, config.turn_threshold, config.eager_threshold
        )

    def check(self, settings: Settings, sample_rate_hz: int, where: str) -> None:
        if not 100 <= self.silence_ms <= 10_000:
            raise AsrError.invalid(
                f"{where}.silence_ms {self.silence_ms} is out of range 100-10000"
            )
        if not 300 <= self.max_silence_ms <= 10_000:
            raise AsrError.invalid(
                f"{where}.max_silence_ms {self.max_silence_ms} is out of range 300-10000"
            )
        for name, value in (
            ("turn_threshold", self.turn_threshold),
            ("eager_threshold", self.eager_threshold),
        ):
            if value is not None and not 0.0 < value <= 1.0:  # NaN fails too
                raise AsrError.invalid(f"{where}.{name} {value:g} is out of range 0-1")
        turn = settings.turn
        first_ask = first_ask_threshold(
            turn.threshold,
            turn.narrowband_threshold,
            self.turn_threshold,
            narrowband=is_narrowband(sample_rate_hz),
        )
        eager = self.eager_threshold or settings.turn.eager_threshold
        if eager >= first_ask:
            raise AsrError.invalid(
                f"{where}.eager_threshold {eager:g} must be below the turn model's first "
                f"threshold ({first_ask:g})"
            )


def stream_update_from_proto(
    msg: asr_pb2.StreamingUpdate, current: StreamConfig, settings: Settings
) -> StreamConfig:
    """The stream's config after a client's update (unset fields stay; 0 = the default)."""
    endpointing = _Endpointing.of(current)
    if msg.HasField("silence_ms"):
        endpointing = replace(endpointing, silence_ms=msg.silence_ms or settings.vad.silence_ms)
    if msg.HasField("max_silence_ms"):
        endpointing = replace(
            endpointing, max_silence_ms=msg.max_silence_ms or settings.turn.max_silence_ms
        )
    if msg.HasField("turn_threshold"):
        endpointing = replace(endpointing, turn_threshold=msg.turn_threshold or None)
    if msg.HasField("eager_threshold"):
        endpointing = replace(endpointing, eager_threshold=msg.eager_threshold or None)
    endpointing.check(settings, current.format.sample_rate_hz, "update")
    eager_finals = msg.eager_finals if msg.HasField("eager_finals") else current.eager_finals
    hotwords = current.hotwords
    if msg.replace_hotwords:
        _check_prompt("", msg.hotwords, settings, "update")
        hotwords = tuple(h.strip() for h in msg.hotwords if h.strip())
    elif msg.hotwords:
        raise AsrError.invalid("update.hotwords are set without replace_hotwords")
    updated = replace(
        current,
        silence_ms=endpointing.silence_ms,
        max_silence_ms=endpointing.max_silence_ms,
        turn_threshold=endpointing.turn_threshold,
        eager_threshold=endpointing.eager_threshold,
        eager_finals=eager_finals,
        hotwords=hotwords,
    )
    # with the stream's initial prompt, which stays; said once, as the prompt grows past
    # what is read: an agent updating its hotwords every turn logged a warning each time
    if msg.replace_hotwords and len(current.prompt) <= PROMPT_READ_CHARS:
        _warn_if_partly_read(updated.prompt, "update")
    return updated


#: about what Whisper reads of its context: the last 223 tokens, in English characters
PROMPT_READ_CHARS = 900


def _check_prompt(
    initial_prompt: str, hotwords: Sequence[str], settings: Settings, where: str
) -> None:
    limits = settings.streaming
    if len(initial_prompt) > limits.max_prompt_chars:
        raise AsrError.invalid(
            f"{where}.initial_prompt has {len(initial_prompt)} characters; the limit is "
            f"{limits.max_prompt_chars} (the model reads only about the last 900)"
        )
    if len(hotwords) > limits.max_hotwords:
        raise AsrError.invalid(
            f"{where}.hotwords has {len(hotwords)} entries; the limit is {limits.max_hotwords}"
        )
    for i, word in enumerate(hotwords):
        if len(word) > limits.max_hotword_chars:
            raise AsrError.invalid(
                f"{where}.hotwords[{i}] has {len(word)} characters; the limit is "
                f"{limits.max_hotword_chars}"
            )


def _warn_if_partly_read(prompt: str, where: str) -> None:
    """``prompt``: the text StreamConfig.prompt gives the model, of which it reads only
    the end. Taken (within the limits), but said."""
    if len(prompt) > PROMPT_READ_CHARS:
        logger.warning(
            "%s: initial_prompt and hotwords come to %d characters; the model reads only "
            "about the last %d, so the prompt and the first hotwords are not read",
            where,
            len(prompt),
            PROMPT_READ_CHARS,
        )


#: more candidates than this is no longer a short list (Whisper knows about 100 languages)
MAX_ALLOWED_LANGUAGES = 20


def _known_languages(languages: frozenset[str], many: str) -> str:
    """What a refusal suggests: the model's own codes when they are few (an English-only
    model: en), else ``many``."""
    return ", ".join(sorted(languages)) if len(languages) < 5 else many


def _allowed_languages(
    msg: asr_pb2.StreamingConfig, languages: frozenset[str] | None, model_name: str
) -> tuple[str, ...]:
    if len(msg.languages) > MAX_ALLOWED_LANGUAGES:
        raise AsrError.invalid(
            f"config.languages has {len(msg.languages)} entries; at most "
            f"{MAX_ALLOWED_LANGUAGES} (leave it empty to allow every language)"
        )
    allowed: list[str] = []
    for code in msg.languages:
        lang = language_code(code)
        if languages is not None and lang not in languages:
            known = _known_languages(languages, "Whisper language codes such as en, de, es")
            raise AsrError.invalid(
                f"config.languages has {_quote(code)}, which model {model_name!r} does not "
                f"know (use {known})"
            )
        if lang not in allowed:
            allowed.append(lang)
    return tuple(allowed)


def result_to_proto(result: RecognitionResult, offset_s: float = 0.0) -> asr_pb2.Result:
    """``offset_s``: stream time of the connection's first sample (a resumed stream)."""
    return asr_pb2.Result(
        is_final=result.is_final,
        text=result.text,
        stability=result.stability,
        start_s=offset_s + result.start_s,
        end_s=offset_s + result.end_s,
        utterance_id=result.utterance_id,
        channel=result.channel,
        language=result.language,
        language_probability=result.language_probability,
        words=[
            asr_pb2.Word(
                word=w.word,
                start_s=offset_s + w.start_s,
                end_s=offset_s + w.end_s,
                probability=w.probability,
            )
            for w in result.words
        ],
        stable_text=result.stable_text,
        unstable_text=result.unstable_text,
        eager=result.eager,
        turn_probability=result.turn_probability,
        from_finalize=result.from_finalize,
        confidence=result.confidence,
    )


def event_to_proto(
    event: OutEvent, progress: Progress, offset_s: float = 0.0
) -> asr_pb2.StreamingRecognizeResponse:
    """The response for ``event``; every time is shifted by ``offset_s`` (a resumed stream)."""
    progress_msg = asr_pb2.Progress(
        audio_received_s=offset_s + progress.audio_received_s,
        audio_processed_s=offset_s + progress.audio_processed_s,
        lag_s=progress.lag_s,
        settled_s=offset_s + progress.settled_s,
    )
    if isinstance(event, GoingAway):
        return asr_pb2.StreamingRecognizeResponse(
            going_away=asr_pb2.GoingAway(deadline_s=event.deadline_s, reason=event.reason),
            progress=progress_msg,
        )
    if isinstance(event, EndOfTurn):
        return asr_pb2.StreamingRecognizeResponse(
            end_of_turn=asr_pb2.EndOfTurn(
                offset_s=offset_s + event.offset_s,
                channel=event.channel,
                utterance_id=event.utterance_id,
                probability=event.probability,
                reason=_TURN_END_REASONS[event.reason],
            ),
            progress=progress_msg,
        )
    if isinstance(event, SpeechBoundary | SpeechResumed | NoWords | Finalized):
        if isinstance(event, Finalized):
            kind = asr_pb2.SpeechEvent.FINALIZED
        elif isinstance(event, NoWords):
            kind = asr_pb2.SpeechEvent.NO_WORDS
        elif isinstance(event, SpeechResumed):
            kind = asr_pb2.SpeechEvent.SPEECH_RESUMED
        elif event.started:
            kind = asr_pb2.SpeechEvent.SPEECH_STARTED
        else:
            kind = asr_pb2.SpeechEvent.SPEECH_ENDED
        return asr_pb2.StreamingRecognizeResponse(
            speech_event=asr_pb2.SpeechEvent(
                type=kind,
                offset_s=offset_s + event.offset_s,
                channel=event.channel,
                utterance_id=event.utterance_id,
                from_finalize=isinstance(event, SpeechBoundary) and event.from_finalize,
            ),
            progress=progress_msg,
        )
    if isinstance(event, StreamDone | ProgressReport):
        return asr_pb2.StreamingRecognizeResponse(progress=progress_msg)
    return asr_pb2.StreamingRecognizeResponse(
        result=result_to_proto(event, offset_s), progress=progress_msg
    )
