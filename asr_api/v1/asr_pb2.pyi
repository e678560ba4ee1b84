from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AudioFormat(_message.Message):
    __slots__ = ("encoding", "sample_rate_hz", "channels")
    class Encoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ENCODING_UNSPECIFIED: _ClassVar[AudioFormat.Encoding]
        LINEAR16: _ClassVar[AudioFormat.Encoding]
        FLOAT32: _ClassVar[AudioFormat.Encoding]
        MULAW: _ClassVar[AudioFormat.Encoding]
        ALAW: _ClassVar[AudioFormat.Encoding]
    ENCODING_UNSPECIFIED: AudioFormat.Encoding
    LINEAR16: AudioFormat.Encoding
    FLOAT32: AudioFormat.Encoding
    MULAW: AudioFormat.Encoding
    ALAW: AudioFormat.Encoding
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_HZ_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    encoding: AudioFormat.Encoding
    sample_rate_hz: int
    channels: int
    def __init__(self, encoding: _Optional[_Union[AudioFormat.Encoding, str]] = ..., sample_rate_hz: _Optional[int] = ..., channels: _Optional[int] = ...) -> None: ...

class EndpointingConfig(_message.Message):
    __slots__ = ("silence_ms", "max_utterance_ms", "mode", "max_silence_ms", "eager_finals", "turn_threshold", "eager_threshold")
    class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        SILENCE: _ClassVar[EndpointingConfig.Mode]
        SEMANTIC: _ClassVar[EndpointingConfig.Mode]
    SILENCE: EndpointingConfig.Mode
    SEMANTIC: EndpointingConfig.Mode
    SILENCE_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_UTTERANCE_MS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MAX_SILENCE_MS_FIELD_NUMBER: _ClassVar[int]
    EAGER_FINALS_FIELD_NUMBER: _ClassVar[int]
    TURN_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    EAGER_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    silence_ms: int
    max_utterance_ms: int
    mode: EndpointingConfig.Mode
    max_silence_ms: int
    eager_finals: bool
    turn_threshold: float
    eager_threshold: float
    def __init__(self, silence_ms: _Optional[int] = ..., max_utterance_ms: _Optional[int] = ..., mode: _Optional[_Union[EndpointingConfig.Mode, str]] = ..., max_silence_ms: _Optional[int] = ..., eager_finals: _Optional[bool] = ..., turn_threshold: _Optional[float] = ..., eager_threshold: _Optional[float] = ...) -> None: ...

class StreamingConfig(_message.Message):
    __slots__ = ("format", "language", "interim_results", "endpointing", "hotwords", "initial_prompt", "word_timestamps", "model", "resume", "languages")
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    INTERIM_RESULTS_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTING_FIELD_NUMBER: _ClassVar[int]
    HOTWORDS_FIELD_NUMBER: _ClassVar[int]
    INITIAL_PROMPT_FIELD_NUMBER: _ClassVar[int]
    WORD_TIMESTAMPS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    LANGUAGES_FIELD_NUMBER: _ClassVar[int]
    format: AudioFormat
    language: str
    interim_results: bool
    endpointing: EndpointingConfig
    hotwords: _containers.RepeatedScalarFieldContainer[str]
    initial_prompt: str
    word_timestamps: bool
    model: str
    resume: ResumeFrom
    languages: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, format: _Optional[_Union[AudioFormat, _Mapping]] = ..., language: _Optional[str] = ..., interim_results: _Optional[bool] = ..., endpointing: _Optional[_Union[EndpointingConfig, _Mapping]] = ..., hotwords: _Optional[_Iterable[str]] = ..., initial_prompt: _Optional[str] = ..., word_timestamps: _Optional[bool] = ..., model: _Optional[str] = ..., resume: _Optional[_Union[ResumeFrom, _Mapping]] = ..., languages: _Optional[_Iterable[str]] = ...) -> None: ...

class ResumeFrom(_message.Message):
    __slots__ = ("stream_offset_s", "channels", "session_id")
    STREAM_OFFSET_S_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    stream_offset_s: float
    channels: _containers.RepeatedCompositeFieldContainer[ChannelResume]
    session_id: str
    def __init__(self, stream_offset_s: _Optional[float] = ..., channels: _Optional[_Iterable[_Union[ChannelResume, _Mapping]]] = ..., session_id: _Optional[str] = ...) -> None: ...

class ChannelResume(_message.Message):
    __slots__ = ("next_utterance_id", "final_until_s", "previous_text", "language", "previous_start_s", "previous_end_s", "client_finalizes")
    NEXT_UTTERANCE_ID_FIELD_NUMBER: _ClassVar[int]
    FINAL_UNTIL_S_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_TEXT_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_START_S_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_END_S_FIELD_NUMBER: _ClassVar[int]
    CLIENT_FINALIZES_FIELD_NUMBER: _ClassVar[int]
    next_utterance_id: int
    final_until_s: float
    previous_text: str
    language: str
    previous_start_s: float
    previous_end_s: float
    client_finalizes: bool
    def __init__(self, next_utterance_id: _Optional[int] = ..., final_until_s: _Optional[float] = ..., previous_text: _Optional[str] = ..., language: _Optional[str] = ..., previous_start_s: _Optional[float] = ..., previous_end_s: _Optional[float] = ..., client_finalizes: _Optional[bool] = ...) -> None: ...

class GoingAway(_message.Message):
    __slots__ = ("deadline_s", "reason")
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    deadline_s: float
    reason: str
    def __init__(self, deadline_s: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class StreamingUpdate(_message.Message):
    __slots__ = ("turn_threshold", "eager_threshold", "max_silence_ms", "silence_ms", "replace_hotwords", "hotwords", "eager_finals")
    TURN_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    EAGER_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    MAX_SILENCE_MS_FIELD_NUMBER: _ClassVar[int]
    SILENCE_MS_FIELD_NUMBER: _ClassVar[int]
    REPLACE_HOTWORDS_FIELD_NUMBER: _ClassVar[int]
    HOTWORDS_FIELD_NUMBER: _ClassVar[int]
    EAGER_FINALS_FIELD_NUMBER: _ClassVar[int]
    turn_threshold: float
    eager_threshold: float
    max_silence_ms: int
    silence_ms: int
    replace_hotwords: bool
    hotwords: _containers.RepeatedScalarFieldContainer[str]
    eager_finals: bool
    def __init__(self, turn_threshold: _Optional[float] = ..., eager_threshold: _Optional[float] = ..., max_silence_ms: _Optional[int] = ..., silence_ms: _Optional[int] = ..., replace_hotwords: _Optional[bool] = ..., hotwords: _Optional[_Iterable[str]] = ..., eager_finals: _Optional[bool] = ...) -> None: ...

class Control(_message.Message):
    __slots__ = ("action", "channel")
    class Action(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ACTION_UNSPECIFIED: _ClassVar[Control.Action]
        FINALIZE: _ClassVar[Control.Action]
        KEEPALIVE: _ClassVar[Control.Action]
    ACTION_UNSPECIFIED: Control.Action
    FINALIZE: Control.Action
    KEEPALIVE: Control.Action
    ACTION_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    action: Control.Action
    channel: int
    def __init__(self, action: _Optional[_Union[Control.Action, str]] = ..., channel: _Optional[int] = ...) -> None: ...

class StreamingRecognizeRequest(_message.Message):
    __slots__ = ("config", "audio", "control", "update")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    CONTROL_FIELD_NUMBER: _ClassVar[int]
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    config: StreamingConfig
    audio: bytes
    control: Control
    update: StreamingUpdate
    def __init__(self, config: _Optional[_Union[StreamingConfig, _Mapping]] = ..., audio: _Optional[bytes] = ..., control: _Optional[_Union[Control, _Mapping]] = ..., update: _Optional[_Union[StreamingUpdate, _Mapping]] = ...) -> None: ...

class SpeechEvent(_message.Message):
    __slots__ = ("type", "offset_s", "channel", "utterance_id", "from_finalize")
    class Type(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        TYPE_UNSPECIFIED: _ClassVar[SpeechEvent.Type]
        SPEECH_STARTED: _ClassVar[SpeechEvent.Type]
        SPEECH_ENDED: _ClassVar[SpeechEvent.Type]
        SPEECH_RESUMED: _ClassVar[SpeechEvent.Type]
        NO_WORDS: _ClassVar[SpeechEvent.Type]
        FINALIZED: _ClassVar[SpeechEvent.Type]
    TYPE_UNSPECIFIED: SpeechEvent.Type
    SPEECH_STARTED: SpeechEvent.Type
    SPEECH_ENDED: SpeechEvent.Type
    SPEECH_RESUMED: SpeechEvent.Type
    NO_WORDS: SpeechEvent.Type
    FINALIZED: SpeechEvent.Type
    TYPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_S_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    UTTERANCE_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_FINALIZE_FIELD_NUMBER: _ClassVar[int]
    type: SpeechEvent.Type
    offset_s: float
    channel: int
    utterance_id: int
    from_finalize: bool
    def __init__(self, type: _Optional[_Union[SpeechEvent.Type, str]] = ..., offset_s: _Optional[float] = ..., channel: _Optional[int] = ..., utterance_id: _Optional[int] = ..., from_finalize: _Optional[bool] = ...) -> None: ...

class EndOfTurn(_message.Message):
    __slots__ = ("offset_s", "channel", "utterance_id", "probability", "reason")
    class Reason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        REASON_UNSPECIFIED: _ClassVar[EndOfTurn.Reason]
        MODEL: _ClassVar[EndOfTurn.Reason]
        MAX_SILENCE: _ClassVar[EndOfTurn.Reason]
        FINALIZE: _ClassVar[EndOfTurn.Reason]
        END_OF_AUDIO: _ClassVar[EndOfTurn.Reason]
    REASON_UNSPECIFIED: EndOfTurn.Reason
    MODEL: EndOfTurn.Reason
    MAX_SILENCE: EndOfTurn.Reason
    FINALIZE: EndOfTurn.Reason
    END_OF_AUDIO: EndOfTurn.Reason
    OFFSET_S_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    UTTERANCE_ID_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    offset_s: float
    channel: int
    utterance_id: int
    probability: float
    reason: EndOfTurn.Reason
    def __init__(self, offset_s: _Optional[float] = ..., channel: _Optional[int] = ..., utterance_id: _Optional[int] = ..., probability: _Optional[float] = ..., reason: _Optional[_Union[EndOfTurn.Reason, str]] = ...) -> None: ...

class Word(_message.Message):
    __slots__ = ("word", "start_s", "end_s", "probability")
    WORD_FIELD_NUMBER: _ClassVar[int]
    START_S_FIELD_NUMBER: _ClassVar[int]
    END_S_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    word: str
    start_s: float
    end_s: float
    probability: float
    def __init__(self, word: _Optional[str] = ..., start_s: _Optional[float] = ..., end_s: _Optional[float] = ..., probability: _Optional[float] = ...) -> None: ...

class Result(_message.Message):
    __slots__ = ("is_final", "text", "stability", "start_s", "end_s", "utterance_id", "channel", "language", "words", "stable_text", "unstable_text", "language_probability", "eager", "turn_probability", "from_finalize", "confidence")
    IS_FINAL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    STABILITY_FIELD_NUMBER: _ClassVar[int]
    START_S_FIELD_NUMBER: _ClassVar[int]
    END_S_FIELD_NUMBER: _ClassVar[int]
    UTTERANCE_ID_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    WORDS_FIELD_NUMBER: _ClassVar[int]
    STABLE_TEXT_FIELD_NUMBER: _ClassVar[int]
    UNSTABLE_TEXT_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    EAGER_FIELD_NUMBER: _ClassVar[int]
    TURN_PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    FROM_FINALIZE_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    is_final: bool
    text: str
    stability: float
    start_s: float
    end_s: float
    utterance_id: int
    channel: int
    language: str
    words: _containers.RepeatedCompositeFieldContainer[Word]
    stable_text: str
    unstable_text: str
    language_probability: float
    eager: bool
    turn_probability: float
    from_finalize: bool
    confidence: float
    def __init__(self, is_final: _Optional[bool] = ..., text: _Optional[str] = ..., stability: _Optional[float] = ..., start_s: _Optional[float] = ..., end_s: _Optional[float] = ..., utterance_id: _Optional[int] = ..., channel: _Optional[int] = ..., language: _Optional[str] = ..., words: _Optional[_Iterable[_Union[Word, _Mapping]]] = ..., stable_text: _Optional[str] = ..., unstable_text: _Optional[str] = ..., language_probability: _Optional[float] = ..., eager: _Optional[bool] = ..., turn_probability: _Optional[float] = ..., from_finalize: _Optional[bool] = ..., confidence: _Optional[float] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("audio_received_s", "audio_processed_s", "lag_s", "settled_s")
    AUDIO_RECEIVED_S_FIELD_NUMBER: _ClassVar[int]
    AUDIO_PROCESSED_S_FIELD_NUMBER: _ClassVar[int]
    LAG_S_FIELD_NUMBER: _ClassVar[int]
    SETTLED_S_FIELD_NUMBER: _ClassVar[int]
    audio_received_s: float
    audio_processed_s: float
    lag_s: float
    settled_s: float
    def __init__(self, audio_received_s: _Optional[float] = ..., audio_processed_s: _Optional[float] = ..., lag_s: _Optional[float] = ..., settled_s: _Optional[float] = ...) -> None: ...

class StreamingRecognizeResponse(_message.Message):
    __slots__ = ("speech_event", "result", "going_away", "end_of_turn", "progress")
    SPEECH_EVENT_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    GOING_AWAY_FIELD_NUMBER: _ClassVar[int]
    END_OF_TURN_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    speech_event: SpeechEvent
    result: Result
    going_away: GoingAway
    end_of_turn: EndOfTurn
    progress: Progress
    def __init__(self, speech_event: _Optional[_Union[SpeechEvent, _Mapping]] = ..., result: _Optional[_Union[Result, _Mapping]] = ..., going_away: _Optional[_Union[GoingAway, _Mapping]] = ..., end_of_turn: _Optional[_Union[EndOfTurn, _Mapping]] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ...) -> None: ...

class RecognizeRequest(_message.Message):
    __slots__ = ("config", "audio")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    config: StreamingConfig
    audio: bytes
    def __init__(self, config: _Optional[_Union[StreamingConfig, _Mapping]] = ..., audio: _Optional[bytes] = ...) -> None: ...

class RecognizeResponse(_message.Message):
    __slots__ = ("results", "duration_s")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[Result]
    duration_s: float
    def __init__(self, results: _Optional[_Iterable[_Union[Result, _Mapping]]] = ..., duration_s: _Optional[float] = ...) -> None: ...
