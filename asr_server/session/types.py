"""Domain types of a stream: its validated config, what comes in and what goes out."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from asr_server.audio.decode import AudioFormat
from asr_server.engine.base import WordTiming


@dataclass(frozen=True)
class ChannelStart:
    """Where one channel of a resumed stream picks up (docs/scale-out.md, stream resume)."""

    next_utterance_id: int = 0
    #: audio of this channel before this sample (16 kHz, this connection's clock) already
    #: has its finals on the client: no utterance starts in it (the voice detection still
    #: hears it, to know the channel as the last server did)
    final_until_sample: int = 0
    previous_text: str = ""
    #: the language the stream had kept ("" = detect again)
    language: str = ""
    #: where the final of ``previous_text`` begins and ends (samples, this connection's
    #: clock): the client replays it, and it is carried into the channel's next final
    #: as on the uncut stream. None: not replayed
    previous_samples: tuple[int, int] | None = None
    #: the client has sent this channel a finalize (it ends its turns itself)
    client_finalizes: bool = False


@dataclass(frozen=True)
class ResumeState:
    """A stream that continues one that was cut off."""

    #: stream time of this connection's first sample; added to every time reported
    offset_s: float
    channels: tuple[ChannelStart, ...]
    session_id: str = ""

    def channel(self, index: int) -> ChannelStart:
        return self.channels[index] if index < len(self.channels) else ChannelStart()


@dataclass(frozen=True)
class StreamConfig:
    format: AudioFormat
    language: str | None = None  # None = detect
    #: detection chooses among these (empty: any language the model knows)
    languages: tuple[str, ...] = ()
    interim_results: bool = True
    silence_ms: int = 500
    max_utterance_ms: int = 15_000
    #: SEMANTIC: a turn model ends utterances at pauses (silence_ms is unused); the
    #: endpointer's own silence limit is max_silence_ms
    semantic: bool = False
    max_silence_ms: int = 2000
    #: send the speculative final at the first pause as an eager result (proto:
    #: EndpointingConfig.eager_finals)
    eager_finals: bool = False
    #: SEMANTIC: this stream's turn-ending probability (None: the server's thresholds)
    turn_threshold: float | None = None
    #: SEMANTIC eager finals: this stream's eager threshold (None: the server's)
    eager_threshold: float | None = None
    initial_prompt: str = ""
    hotwords: tuple[str, ...] = ()
    word_timestamps: bool = False
    resume: ResumeState | None = None

    @property
    def prompt(self) -> str:
        """The initial prompt and the hotwords, given to the model as context."""
        parts = [self.initial_prompt] if self.initial_prompt else []
        if self.hotwords:
            parts.append(", ".join(self.hotwords))
        return " ".join(parts)

    @property
    def time_offset_s(self) -> float:
        """Stream time of this connection's first sample (0 unless resumed)."""
        return self.resume.offset_s if self.resume is not None else 0.0


@dataclass(frozen=True)
class Finalize:
    """The client asked to finalize the current utterance now."""

    channel: int | None = None  # only this channel; None: every channel
    #: time.monotonic() when its request was read (for asr_finalize_answer_seconds)
    arrived: float = field(default_factory=time.monotonic, compare=False)


@dataclass(frozen=True)
class ConfigUpdate:
    """The client changed the stream's settings (proto: StreamingUpdate), from here on."""

    config: StreamConfig


@dataclass(frozen=True)
class SpeechBoundary:
    started: bool  # False = speech ended
    offset_s: float
    channel: int
    utterance_id: int
    from_finalize: bool = False  # an end the client's finalize made


@dataclass(frozen=True)
class NoWords:
    """The utterance ended without words: no final comes for it."""

    offset_s: float  # where its audio ended
    channel: int
    utterance_id: int


@dataclass(frozen=True)
class Finalized:
    """The client's finalize is done on this channel: every result for the audio
    before ``offset_s`` has been sent."""

    offset_s: float  # where the finalize came in the channel's audio
    channel: int
    utterance_id: int | None  # the channel's latest utterance (None: none yet)


@dataclass(frozen=True)
class SpeechResumed:
    """Speech went on after an eager result: that eager text is withdrawn."""

    offset_s: float  # where speech resumed
    channel: int
    utterance_id: int


@dataclass(frozen=True)
class RecognitionResult:
    is_final: bool
    stable_text: str
    unstable_text: str
    start_s: float
    end_s: float
    utterance_id: int
    channel: int
    language: str
    words: list[WordTiming] = field(default_factory=list)  # stream time
    #: detection's probability of ``language`` for this utterance (0: not detected)
    language_probability: float = 0.0
    #: an eager result: what the final will be unless the speaker goes on (not final)
    eager: bool = False
    #: SEMANTIC eager results: the turn model's first answer at this pause
    turn_probability: float = 0.0
    #: a final that the client's finalize ended (not the endpointer)
    from_finalize: bool = False
    #: finals and eager results: the decoder's confidence in the text (0: not known)
    confidence: float = 0.0

    @property
    def text(self) -> str:
        return " ".join(t for t in (self.stable_text, self.unstable_text) if t)

    @property
    def stability(self) -> float:
        if self.is_final:
            return 1.0
        text = self.text
        return len(self.stable_text) / len(text) if text else 0.0


@dataclass(frozen=True)
class Progress:
    audio_received_s: float
    audio_processed_s: float
    #: before this, every final has been emitted (see ChannelRecognizer.settled_sample)
    settled_s: float = 0.0

    @property
    def lag_s(self) -> float:
        return max(0.0, self.audio_received_s - self.audio_processed_s)


class TurnEndReason(enum.Enum):
    """What ended a SEMANTIC turn (proto: EndOfTurn.Reason)."""

    MODEL = "model"  # the turn model was sure enough
    MAX_SILENCE = "max_silence"  # the longest pause held open passed
    FINALIZE = "finalize"  # the client asked
    END_OF_AUDIO = "end_of_audio"  # the client ended the stream inside the turn


@dataclass(frozen=True)
class EndOfTurn:
    """SEMANTIC endpointing: the speaker has finished (the turn model said so, the
    longest pause passed, or the client finalized)."""

    offset_s: float
    channel: int
    utterance_id: int
    probability: float
    reason: TurnEndReason


@dataclass(frozen=True)
class StreamDone:
    """The last response of a stream: only progress, accounting for all the audio received."""


@dataclass(frozen=True)
class ProgressReport:
    """Only progress, mid-stream: the settled point moved on with nothing else to say
    it (a long silence), so that a resuming client can let go of audio that has its
    finals (asr_client/resume.py keeps what is not settled, up to 120 s)."""


@dataclass(frozen=True)
class GoingAway:
    """The server is draining: the stream will be cut after ``deadline_s``."""

    deadline_s: float
    reason: str


OutEvent = (
    SpeechBoundary
    | SpeechResumed
    | NoWords
    | Finalized
    | RecognitionResult
    | StreamDone
    | ProgressReport
    | GoingAway
    | EndOfTurn
)
