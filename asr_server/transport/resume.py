"""The ``ResumeFrom`` of a config, validated and turned into the session's ResumeState."""

from __future__ import annotations

import math

from asr_api.v1 import asr_pb2
from asr_server.audio.decode import SAMPLE_RATE, AudioFormat
from asr_server.errors import AsrError
from asr_server.session.language import language_code
from asr_server.session.types import ChannelStart, ResumeState
from asr_server.settings import Settings

#: utterance ids stay exact in a JSON number (the bridge and browsers read them)
MAX_UTTERANCE_ID = 2**53
MAX_SESSION_ID_CHARS = 128
MAX_LANGUAGE_CHARS = 16


def resume_from_proto(
    msg: asr_pb2.StreamingConfig,
    fmt: AudioFormat,
    settings: Settings,
    languages: frozenset[str] | None = None,
) -> ResumeState | None:
    """``languages``: the codes the model knows (None: any). A channel's language is
    decoded with as it stands, so a code the model does not know would fail every
    decode it is batched with: refused here, as ``config.language`` is."""
    if not msg.HasField("resume"):
        return None
    r = msg.resume
    limit = settings.streaming.max_stream_duration_s
    if not (math.isfinite(r.stream_offset_s) and 0 <= r.stream_offset_s <= limit):
        raise AsrError.invalid(f"config.resume.stream_offset_s must be between 0 and {limit:.0f} s")
    if len(r.channels) > fmt.channels:
        raise AsrError.invalid(
            f"config.resume.channels has {len(r.channels)} entries for {fmt.channels} channel(s)"
        )
    if len(r.session_id) > MAX_SESSION_ID_CHARS:
        raise AsrError.invalid(
            f"config.resume.session_id is longer than {MAX_SESSION_ID_CHARS} characters"
        )
    channels = []
    for i, c in enumerate(r.channels):
        # no final of the session can end past what this stream may still hear (further
        # out, the sample counts would overflow)
        until_limit = r.stream_offset_s + limit
        if not (math.isfinite(c.final_until_s) and 0 <= c.final_until_s <= until_limit):
            raise AsrError.invalid(
                f"config.resume.channels[{i}].final_until_s must be between 0 and "
                f"{until_limit:.0f} s"
            )
        if c.next_utterance_id >= MAX_UTTERANCE_ID:
            raise AsrError.invalid(f"config.resume.channels[{i}].next_utterance_id is too large")
        # context, not a request: its end is what matters, and a client that sends more
        # than this server takes (its limit set lower) must not lose its stream over it
        previous_text = c.previous_text[-settings.streaming.max_prompt_chars :]
        prev_start, prev_end = c.previous_start_s, c.previous_end_s
        if not (
            math.isfinite(prev_start)
            and math.isfinite(prev_end)
            and 0 <= prev_start <= prev_end <= max(c.final_until_s, r.stream_offset_s)
        ):
            raise AsrError.invalid(
                f"config.resume.channels[{i}].previous_start_s and previous_end_s must "
                "bound the channel's last final: 0 <= start <= end <= final_until_s"
            )
        # carried only when this stream hears it whole, and forced whole (the text cut
        # to the limit above is no longer that audio's); and only a final this server
        # would carry: its audio is kept until its end arrives, so a window of hours
        # (already final, taken faster than real time) would hold the whole stream in memory
        carried = (
            prev_end > prev_start >= r.stream_offset_s
            and previous_text == c.previous_text
            and bool(previous_text.strip())
            and prev_end - prev_start <= settings.streaming.carry_max_s
        )
        # as config.language is read: a BCP-47 tag ("pt-BR", which a hand-written client
        # may send back as it configured it) is its language's code
        language = language_code(c.language)
        if language and (
            len(language) > MAX_LANGUAGE_CHARS or not language.replace("-", "").isalnum()
        ):
            raise AsrError.invalid(f"config.resume.channels[{i}].language is not a language")
        if language and languages is not None and language not in languages:
            raise AsrError.invalid(
                f"config.resume.channels[{i}].language {language!r} is not one this server's "
                "model knows (leave it empty to detect)"
            )
        final_until_here_s = max(0.0, c.final_until_s - r.stream_offset_s)  # (this call's clock)
        previous = (
            (
                round((prev_start - r.stream_offset_s) * SAMPLE_RATE),
                round((prev_end - r.stream_offset_s) * SAMPLE_RATE),
            )
            if carried
            else None
        )
        channels.append(
            ChannelStart(
                c.next_utterance_id,
                round(final_until_here_s * SAMPLE_RATE),
                previous_text,
                language,
                previous_samples=previous,
                client_finalizes=c.client_finalizes,
            )
        )
    return ResumeState(r.stream_offset_s, tuple(channels), r.session_id)
