"""SEMANTIC endpointing with the real tiny.en and the real Smart Turn model.

A read sentence with a 0.9 s pause put in the middle of it, where it is plainly not
finished ("... which led me to leave | my native country"): with silence endpointing
(500 ms) the pause cuts it in two finals. SEMANTIC holds a pause open up to its longest
silence (2 s) unless the turn model says the speaker is done, so the sentence stays whole,
and the turns that are finished end early, each with an EndOfTurn carrying the model's
probability (at or above the threshold only when the model ended it) before its final.
"""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest

from asr_api.v1 import asr_pb2
from asr_client import AsrClient, StreamClosedError, audio_config
from asr_client.scoring import normalize
from tests.helpers import corpus, first_channel, read_pcm16, serve_fake, stream_audio

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

RECORDING = "libri_2412-153948-0000"  # "... nor of the circumstances which led me to leave
#                                        my native country. The narrative would be ..."


def with_a_pause_mid_sentence() -> tuple[np.ndarray, float]:
    """The recording at 16 kHz with 0.9 s of silence in its quietest spot between 40 and
    60 % (between "leave" and "my native country"), and 2 s of silence after it."""
    audio = first_channel(corpus()[RECORDING].path)
    audio = (np.clip(audio, -1, 1) * 32767).astype(np.int16)
    frames = audio[: len(audio) // 480 * 480].reshape(-1, 480).astype(np.float64)
    lo, hi = len(frames) * 4 // 10, len(frames) * 6 // 10
    cut = (lo + int(np.argmin((frames[lo:hi] ** 2).mean(axis=1)))) * 480 + 240
    quiet = np.zeros(int(0.9 * 16_000), np.int16)
    return np.concatenate([audio[:cut], quiet, audio[cut:], np.zeros(32_000, np.int16)]), (
        cut / 16_000
    )


async def events(port: int, mode: str):  # type: ignore[no-untyped-def]
    audio, pause_at = with_a_pause_mid_sentence()
    received = await stream_audio(
        port,
        audio.reshape(-1, 1),
        16_000,
        speed=2.0,  # paced: the model answers within a pause, as it would live
        config=audio_config(endpointing=mode, interim_results=False),  # type: ignore[arg-type]
    )
    return [r.response for r in received], pause_at


def finals(responses) -> list[str]:  # type: ignore[no-untyped-def]
    return [normalize(r.result.text) for r in responses if r.HasField("result")]


async def test_semantic_endpointing_holds_a_mid_sentence_pause_and_ends_finished_turns(  # type: ignore[no-untyped-def]
    make_server,
) -> None:
    server = await make_server()  # tiny.en; the turn model from asr-server turn-model
    # side by side, as two callers would (the model still answers within each pause)
    (silence, pause_at), (semantic, _) = await asyncio.gather(
        events(server.port, "silence"), events(server.port, "semantic")
    )
    by_silence, by_semantic = finals(silence), finals(semantic)
    # the same words either way
    assert " ".join(by_semantic).split() == " ".join(by_silence).split(), (by_semantic, by_silence)
    # silence: a final ends at the pause (its last word "leave"); semantic: no final does
    assert any(f.endswith("leave") for f in by_silence), by_silence
    assert not any(f.endswith("leave") for f in by_semantic), (
        by_semantic,
        [
            (r.end_of_turn.offset_s, r.end_of_turn.probability)
            for r in semantic
            if r.HasField("end_of_turn")
        ],
    )
    assert any("leave my native country" in f for f in by_semantic), by_semantic
    # every semantic final is announced by an EndOfTurn of its utterance, just before it
    kinds = [r.WhichOneof("event") for r in semantic]
    turns = [r.end_of_turn for r in semantic if r.HasField("end_of_turn")]
    assert len(turns) == len(by_semantic)
    for i, kind in enumerate(kinds):
        if kind == "result":
            before = [k for k in kinds[:i] if k in ("end_of_turn", "result")]
            assert before and before[-1] == "end_of_turn", kinds
    # the last one is a finished sentence: the model said so, well above the threshold
    assert turns[-1].probability > 0.8
    assert turns[-1].reason == asr_pb2.EndOfTurn.MODEL
    assert all(not t.offset_s == pytest.approx(pause_at, abs=0.3) for t in turns)
    assert not any(r.HasField("end_of_turn") for r in silence)


async def test_a_high_turn_threshold_keeps_jfk_one_sentence(make_server) -> None:  # type: ignore[no-untyped-def]
    # the model is 0.93-0.98 sure that "And so my fellow Americans" ends the turn: at the
    # defaults that pause ends it; a stream that asks for 0.99 holds it (and the others)
    server = await make_server()
    rec = corpus()["jfk"]
    pcm, sr = read_pcm16(rec.path)
    received = await stream_audio(
        server.port,
        pcm.mean(axis=1).astype(np.int16).reshape(-1, 1),
        sr,
        speed=2.0,
        config=audio_config(
            sample_rate_hz=sr, endpointing="semantic", turn_threshold=0.99, interim_results=False
        ),
    )
    finals = [
        r.response.result.text
        for r in received
        if r.response.HasField("result") and r.response.result.is_final
    ]
    assert len(finals) == 1, finals
    assert normalize(finals[0]) == normalize(rec.transcript), finals


async def test_a_phone_call_resampled_to_16_khz_is_asked_as_a_phone_line(make_server) -> None:  # type: ignore[no-untyped-def]
    """Harvard sentences recorded at 8 kHz, sent at 16 kHz as agent frameworks resample
    calls: the server hears no speech above 4 kHz and asks the turn model with the phone
    line's first threshold (counted); full-band speech is not counted."""
    import soxr

    server = await make_server()
    counted = server.metrics.turn_phone_band

    async def semantic_at_16k(pcm: np.ndarray) -> list[str]:
        received = await stream_audio(
            server.port,
            pcm.reshape(-1, 1),
            16_000,
            speed=2.0,
            config=audio_config(endpointing="semantic", interim_results=False),
        )
        return [r.response.result.text for r in received if r.response.HasField("result")]

    pcm, sr = read_pcm16(corpus()["osr_us_000_0034_8k"].path)
    _, texts = await asyncio.gather(  # side by side: the full-band call must not count
        semantic_at_16k((first_channel(corpus()[RECORDING].path) * 32767).astype(np.int16)),
        semantic_at_16k(soxr.resample(pcm[: 12 * sr, 0], sr, 16_000)),  # 3 sentences
    )
    assert counted._value.get() == 1  # the phone line's, once
    assert "gold ring" in normalize(" ".join(texts)), texts


async def test_semantic_without_the_model_is_a_clear_refusal(make_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server, cache_dir=str(tmp_path))  # no turn model there
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        stream = client.stream(audio_config(endpointing="semantic"))
        with pytest.raises(StreamClosedError) as err:
            async with stream:
                async for _ in stream:
                    pass
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "asr-server turn-model" in err.value.details


@pytest.mark.parametrize("content", [None, b"not an onnx model"])
async def test_a_configured_turn_model_that_does_not_load_stops_the_start(
    tmp_path, content: bytes | None
) -> None:
    """The operator named a file: one missing or wrong is a mistake to fix, not a server
    that serves with SEMANTIC quietly off (and a hint to install into the cache, which
    the configured path would still not use)."""
    from asr_server.app import start_server
    from asr_server.metrics import Metrics
    from asr_server.vad.turn import TurnModelError
    from tests.helpers import fake_factory, settings

    path = tmp_path / "smart-turn.onnx"
    if content is not None:
        path.write_bytes(content)
    server = await start_server(
        settings(turn={"model_path": str(path)}), metrics=Metrics(), engine_factory=fake_factory()
    )
    try:
        assert server._loader is not None
        with pytest.raises(TurnModelError) as err:
            await asyncio.wait_for(server._loader, 30)
        assert not server.ready.is_set()
    finally:
        await server.close()
    message = str(err.value)
    assert "turn.model_path (ASR_TURN__MODEL_PATH)" in message and str(path) in message
    if content is None:
        assert "is not a file" in message and "or unset it" in message
    else:
        assert "is not the pinned smart-turn-v3.2-cpu.onnx" in message
