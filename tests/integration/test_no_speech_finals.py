"""Whisper's words on a sound that is no speech never become a final (the real server
and model on a recording)."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from asr_client import AsrClient, audio_config
from asr_client.scoring import wer
from asr_server.audio.g711 import mulaw_encode
from tests.helpers import corpus, first_channel, keyed_digits, read_pcm16, sample, stream_audio

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]


async def test_applause_after_the_last_word_gives_no_final(make_server) -> None:  # type: ignore[no-untyped-def]
    # JFK's speech ends at about 10.5 s and the recording's last half second is the
    # crowd. A voice agent finalizes at its VAD's stop; the crowd is then an utterance of
    # its own, decoded after the previous final, and Whisper, having heard the speech,
    # went on with "Thank you." (its no-speech rule cannot judge a carried final, whose
    # audio begins with speech). Silero hears no speech in it: no final.
    server = await make_server()
    rec = corpus()["jfk"]
    pcm, sr = read_pcm16(rec.path)
    audio = pcm.mean(axis=1).astype(np.int16)
    cut = int(10.65 * sr)
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        async with client.stream(audio_config(sample_rate_hz=sr)) as stream:
            await stream.finalize()  # a client that ends its turns itself
            await stream.send_audio(audio[:cut].tobytes())
            await stream.finalize()
            await stream.send_audio(audio[cut:].tobytes())
            await stream.end()
            events = [e async for e in stream]
    finals = [e.result.text for e in events if e.HasField("result") and e.result.is_final]
    ended = [
        e
        for e in events
        if e.HasField("speech_event") and e.speech_event.type == e.speech_event.SPEECH_ENDED
    ]
    assert "thank" not in " ".join(finals).lower()
    assert wer([rec.transcript], [" ".join(finals)]) <= 0.1  # the speech's words all came
    assert sample(server, "asr_finals_without_speech_total") == 1
    assert len(ended) == len(finals) + 1  # the crowd's utterance ended, without words
    # and the stream said so, where that utterance's final would have come
    no_words = [
        e
        for e in events
        if e.HasField("speech_event") and e.speech_event.type == e.speech_event.NO_WORDS
    ]
    assert [e.speech_event.utterance_id for e in no_words] == [ended[-1].speech_event.utterance_id]


async def test_a_caller_keying_digits_on_a_quiet_line_gets_no_final(make_server) -> None:  # type: ignore[no-untyped-def]
    # An 8 kHz μ-law call whose line is quiet (noise at -58 dBFS): the caller keys 48
    # digits (-30 to -45 dBFS), then speaks softly (-45 dBFS or so). The detector hears
    # the quiet channel raised, and took the digits for speech: seven finals of "ha",
    # "ah", "Oh, oh, oh, oh, oh, oh". Now none, and the talker's words all come.
    server = await make_server()
    line = keyed_digits((-30, -35, -40, -45, -30, -35, -40, -45), -58, sr=8_000)
    rec = corpus()["libri_1089-134691-0001"]
    talker = soxr.resample(first_channel(rec.path), 16_000, 8_000) * np.float32(0.1)
    call = np.concatenate([line, talker.astype(np.float32)])
    pcm = (np.clip(call, -1, 1) * 32767).astype(np.int16)
    received = await stream_audio(
        server.port, pcm, 8_000, speed=None, encoding="MULAW", payload=mulaw_encode(pcm)
    )
    responses = [r.response for r in received]
    started = [
        r.speech_event.offset_s
        for r in responses
        if r.HasField("speech_event") and r.speech_event.type == r.speech_event.SPEECH_STARTED
    ]
    finals = [r.result.text for r in responses if r.HasField("result") and r.result.is_final]
    assert started and min(started) > line.size / 8_000 - 0.5, started  # (its pre-roll)
    assert wer([rec.transcript], [" ".join(finals)]) <= 0.1, finals
