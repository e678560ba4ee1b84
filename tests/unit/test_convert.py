"""A client's endpointing settings against the server's turn thresholds (transport/convert)."""

from __future__ import annotations

import pytest

from asr_api.v1 import asr_pb2
from asr_client import audio_config
from asr_server.engine.whisper import whisper_languages
from asr_server.errors import AsrError
from asr_server.settings import Settings
from asr_server.transport.convert import stream_config_from_proto, stream_update_from_proto


def semantic_config(eager_threshold: float, **fmt: object) -> asr_pb2.StreamingConfig:
    return audio_config(  # type: ignore[return-value]
        endpointing="semantic", eager_finals=True, eager_threshold=eager_threshold, **fmt
    )


def parse(msg: asr_pb2.StreamingConfig):  # type: ignore[no-untyped-def]
    return stream_config_from_proto(msg, Settings(), model_name="tiny.en", languages=None)


def test_an_eager_threshold_must_stay_below_the_first_ask_of_its_own_line() -> None:
    # between the full-band first ask (0.98) and a phone line's (0.99)
    phone = parse(semantic_config(0.985, encoding="MULAW", sample_rate_hz=8000))
    assert phone.eager_threshold == pytest.approx(0.985)
    with pytest.raises(AsrError, match=r"first threshold \(0.98\)"):
        parse(semantic_config(0.985))
    # an update is checked against the stream's own line too
    update = asr_pb2.StreamingUpdate(eager_threshold=0.995)
    with pytest.raises(AsrError, match=r"first threshold \(0.99\)"):
        stream_update_from_proto(update, phone, Settings())
    update = asr_pb2.StreamingUpdate(eager_threshold=0.987)
    assert stream_update_from_proto(update, phone, Settings()).eager_threshold == pytest.approx(
        0.987
    )


def resuming(**channel: object) -> asr_pb2.StreamingConfig:
    msg = audio_config()
    msg.resume.stream_offset_s = 30.0
    msg.resume.channels.add(**channel)  # type: ignore[arg-type]
    return msg  # type: ignore[return-value]


def test_a_resumed_channels_language_must_be_one_the_model_knows() -> None:
    # decoded with as it stands: a code the model does not know would fail every decode
    # batched with it, other streams' too
    known = frozenset({"en", "es"})
    config = stream_config_from_proto(
        resuming(language="es"), Settings(), model_name="base", languages=known
    )
    assert config.resume is not None and config.resume.channels[0].language == "es"
    # a BCP-47 tag, as config.language takes it (a client sending back what it configured)
    for tag in ("es-ES", "ES_mx"):
        config = stream_config_from_proto(
            resuming(language=tag), Settings(), model_name="base", languages=known
        )
        assert config.resume is not None and config.resume.channels[0].language == "es"
    with pytest.raises(AsrError, match=r"language 'zz' is not one this server's model knows"):
        stream_config_from_proto(
            resuming(language="zz"), Settings(), model_name="base", languages=known
        )


def test_a_language_list_an_english_only_model_refuses_names_what_it_knows() -> None:
    msg = audio_config(languages=["de", "fr"])
    with pytest.raises(AsrError, match=r"'de', which model 'tiny.en' does not know \(use en\)"):
        stream_config_from_proto(msg, Settings(), model_name="tiny.en", languages=frozenset({"en"}))


def test_a_language_an_english_only_model_refuses_offers_no_detection() -> None:
    """tiny.en has nothing to detect: an empty language is English (German audio comes out
    as English words), so the refusal does not promise detection (a reviewer)."""
    english = frozenset({"en"})
    with pytest.raises(AsrError, match=r"model 'tiny.en' \(use en, or leave empty\)$"):
        stream_config_from_proto(
            audio_config(language="de"), Settings(), model_name="tiny.en", languages=english
        )
    known = frozenset({"en", "de", "fr", "es", "it", "pt"})
    with pytest.raises(AsrError, match=r"or leave empty to detect\)$"):
        stream_config_from_proto(
            audio_config(language="zz"), Settings(), model_name="base", languages=known
        )


def test_a_bcp47_tag_names_its_language() -> None:
    """Clients of Google's, Riva's and Deepgram's APIs send en-US; the proto says BCP-47."""
    known = frozenset({"en", "de", "pt", "zh"})
    msg = audio_config(language="en-US", languages=["de-CH", "pt_BR", "zh-Hant-TW", "EN"])
    config = stream_config_from_proto(msg, Settings(), model_name="base", languages=known)
    assert config.language == "en"
    assert config.languages == ("de", "pt", "zh", "en")
    for tag, code in [("cmn-Hans-CN", "zh"), ("nb-NO", "no"), ("iw-IL", "he"), ("jv-ID", "jw")]:
        msg = audio_config(language=tag)
        config = stream_config_from_proto(msg, Settings(), model_name="base", languages=None)
        assert config.language == code, tag
    with pytest.raises(AsrError, match=r"config.language 'xx-US' is not supported"):
        stream_config_from_proto(
            audio_config(language="xx-US"), Settings(), model_name="base", languages=known
        )


def test_only_languages_the_models_tokenizer_has_are_offered() -> None:
    class BaseTokenizer:  # base and small have no token for large-v3's Cantonese
        def token_to_id(self, token: str) -> int | None:
            return None if token == "<|yue|>" else 1

    every = whisper_languages()
    assert every is not None and "yue" in every
    assert whisper_languages(BaseTokenizer()) == every - {"yue"}


@pytest.mark.parametrize("until", [1.7e308, 30.0 + 4 * 3600 + 1, -1.0, float("inf")])
def test_a_resumes_final_end_out_of_range_is_invalid_not_an_overflow(until: float) -> None:
    with pytest.raises(AsrError, match=r"final_until_s must be between 0 and"):
        parse(resuming(final_until_s=until))
    assert parse(resuming(final_until_s=29.5)).resume is not None


def test_a_resumes_previous_text_longer_than_the_prompt_limit_keeps_its_end() -> None:
    # the client sends its last final's last 1000 characters; a server whose limit is
    # lower keeps their end rather than refuse the resume (the stream would end)
    settings = Settings(streaming={"max_prompt_chars": 100})  # type: ignore[arg-type]
    text = "x" * 900 + " and the last words"
    config = stream_config_from_proto(
        resuming(previous_text=text), settings, model_name="tiny.en", languages=None
    )
    assert config.resume is not None
    assert config.resume.channels[0].previous_text == text[-100:]


def test_a_resumes_previous_final_is_carried_only_when_replayed_whole() -> None:
    def previous(**channel: object) -> tuple[int, int] | None:
        config = parse(resuming(**{"previous_text": "the words", "final_until_s": 34.0, **channel}))
        assert config.resume is not None
        return config.resume.channels[0].previous_samples

    assert previous(previous_start_s=31.0, previous_end_s=33.5) == (16_000, 56_000)
    assert previous(previous_start_s=29.0, previous_end_s=33.5) is None  # not replayed
    # longer than the server carries (10 s): its audio would be held for nothing, for as
    # long as the client makes it (hours of muted audio arrive in seconds)
    assert previous(previous_start_s=31.0, previous_end_s=34.0, final_until_s=10_000.0) == (
        16_000,
        64_000,
    )
    assert previous(previous_start_s=31.0, previous_end_s=9_000.0, final_until_s=10_000.0) is None
    assert previous(previous_start_s=31.0, previous_end_s=41.5, final_until_s=42.0) is None
    assert previous(previous_start_s=31.0, previous_end_s=41.0, final_until_s=42.0) is not None
    assert previous() is None
    for start, end in [(33.0, 34.5), (33.0, 32.0), (-1.0, 2.0), (float("nan"), 33.0)]:
        with pytest.raises(AsrError, match=r"previous_start_s and previous_end_s must"):
            previous(previous_start_s=start, previous_end_s=end)
    # its text cut to the server's prompt limit is no longer that audio's: not carried
    settings = Settings(streaming={"max_prompt_chars": 5})  # type: ignore[arg-type]
    msg = resuming(
        previous_text="the words", previous_start_s=31.0, previous_end_s=33.5, final_until_s=34.0
    )
    config = stream_config_from_proto(msg, settings, model_name="tiny.en", languages=None)
    assert config.resume is not None and config.resume.channels[0].previous_samples is None
    # with no text there is nothing to carry (the decoder carries audio with its text)
    msg.resume.channels[0].previous_text = " "
    config = stream_config_from_proto(msg, Settings(), model_name="tiny.en", languages=None)
    assert config.resume is not None and config.resume.channels[0].previous_samples is None


def test_a_finalized_before_any_utterance_names_none_and_utterance_0_is_named() -> None:
    """Utterance ids start at 0, so 0 cannot also mean "none yet": a FINALIZED on a
    channel that has had no utterance leaves utterance_id unset; every other event sets
    it, 0 included."""
    from asr_server.session.types import Finalized, Progress, SpeechBoundary
    from asr_server.transport.convert import event_to_proto

    progress = Progress(1.0, 1.0)
    none_yet = event_to_proto(Finalized(0.0, 0, None), progress).speech_event
    assert none_yet.type == asr_pb2.SpeechEvent.FINALIZED
    assert not none_yet.HasField("utterance_id")
    for event in (Finalized(1.0, 0, 0), SpeechBoundary(0.5, True, 0, 0)):
        named = event_to_proto(event, progress).speech_event
        assert named.HasField("utterance_id") and named.utterance_id == 0


def test_hotwords_past_what_the_model_reads_are_taken_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Whisper reads only the last 223 tokens of the prompt and hotwords (about 900
    characters): 122 hotwords were taken without a word, and the first of them (and the
    initial prompt) had no effect. Taken still, within the limits, but said."""
    few = [f"Name{i}" for i in range(20)]
    many = [f"Product name {i}" for i in range(122)]
    with caplog.at_level("WARNING", logger="asr_server.transport.convert"):
        assert parse(audio_config(hotwords=few, initial_prompt="A support call.")).hotwords
        assert not caplog.records
        assert len(parse(audio_config(hotwords=many)).hotwords) == 122
    (record,) = caplog.records
    assert "the model reads only about the last 900" in record.getMessage()
    assert "the prompt and the first hotwords are not read" in record.getMessage()


def test_the_warning_counts_the_prompt_as_the_model_is_given_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The check estimated the length apart from StreamConfig.prompt's join, and an
    update's new hotwords were measured without the stream's initial prompt, which
    stays: 600 characters of prompt and 400 of new hotwords came without a warning."""
    prompt = "A support call about billing and refunds. " * 14  # 588 characters
    current = parse(audio_config(initial_prompt=prompt, hotwords=["Acme"]))
    hotwords = [f"Product line {i:03d}" for i in range(20)]  # 16 characters each
    update = asr_pb2.StreamingUpdate(replace_hotwords=True, hotwords=hotwords)
    with caplog.at_level("WARNING", logger="asr_server.transport.convert"):
        updated = stream_update_from_proto(update, current, Settings())
    assert len(updated.prompt) > 900
    (record,) = caplog.records
    assert record.getMessage().startswith(
        f"update: initial_prompt and hotwords come to {len(updated.prompt)} characters"
    )
    # what is given exactly at the limit is read: no warning
    caplog.clear()
    exact = "x" * (900 - len(", ".join(["Acme", "Beta"])) - 1)
    with caplog.at_level("WARNING", logger="asr_server.transport.convert"):
        config = parse(audio_config(initial_prompt=exact, hotwords=["Acme", "Beta"]))
    assert len(config.prompt) == 900 and not caplog.records


def test_updates_past_what_the_model_reads_warn_once(caplog: pytest.LogCaptureFixture) -> None:
    """Each update with hotwords past what the model reads logged a warning, so an agent
    updating its hotwords every turn (or any client, 50 KB a line) filled the log. Said
    when the prompt grows past it, not again while it stays past."""
    current = parse(audio_config(hotwords=["Acme"]))
    many = asr_pb2.StreamingUpdate(
        replace_hotwords=True, hotwords=[f"Product name {i}" for i in range(80)]
    )
    few = asr_pb2.StreamingUpdate(replace_hotwords=True, hotwords=["Acme"])
    with caplog.at_level("WARNING", logger="asr_server.transport.convert"):
        for update in (many, many, many, few, many):
            current = stream_update_from_proto(update, current, Settings())
    assert len(caplog.records) == 2  # the first crossing, and the one after it came back
    assert all("the model reads only" in r.getMessage() for r in caplog.records)
