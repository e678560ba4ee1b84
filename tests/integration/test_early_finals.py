"""A voice agent's turn end on the real server: the final decoded early in the pause is
the one it gets, even when a noise in the pause made the server's VAD hear voice."""

from __future__ import annotations

import asyncio

import numpy as np

from asr_client import AsrClient, audio_config
from asr_client.scoring import wer
from tests.helpers import corpus, eventually, read_pcm16, sample

CHUNK = 320  # 20 ms at 16 kHz, what voice agents send


def pcm(seconds: float, rms: float = 0.0) -> np.ndarray:
    noise = np.random.default_rng(5).standard_normal(int(seconds * 16_000)) * rms * 32767
    return noise.astype(np.int16)


async def test_a_noise_in_the_pause_does_not_cost_the_final_a_decode(make_server) -> None:  # type: ignore[no-untyped-def]
    server = await make_server()
    rec = corpus()["libri_1089-134691-0000"]  # "he could wait no longer", speech to ~1.7 s
    audio, sr = read_pcm16(rec.path)
    assert sr == 16_000
    speech = audio[: int(1.75 * sr), 0]
    # 0.1 s into the pause a 60 ms hiss, voice to webrtc and no speech to Silero; the
    # client's own VAD heard none and finalizes 50 ms after it
    pause = np.concatenate([pcm(0.1), pcm(0.06, rms=0.05), pcm(0.05)])
    scheduler = server.servicer.services.scheduler

    def speech_heard() -> bool:
        processed = sample(server, "asr_audio_processed_seconds_total") or 0.0
        return processed >= speech.size / sr - 1e-6 and scheduler.idle

    events = []
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        # no partials: one asked as the pause begins (the voice detector still hears the
        # speech's end) held the engine on a loaded machine, the pause's early final
        # queued behind it was not started at the hiss, and was dropped
        config = audio_config(sample_rate_hz=sr, interim_results=False)
        async with client.stream(config) as stream:

            async def send() -> None:
                await stream.finalize()  # a client that ends turns itself: early finals
                await stream.send_audio(speech.tobytes())
                # the speech is processed and the engine idles (waited for: not a fixed time)
                await eventually(speech_heard, timeout_s=60)
                for start in range(0, pause.size, CHUNK):  # the pause in real time
                    await stream.send_audio(pause[start : start + CHUNK].tobytes())
                    await asyncio.sleep(0.02)
                await stream.finalize()
                await stream.send_audio(pcm(0.3).tobytes())
                await stream.end()

            sender = asyncio.create_task(send())
            events = [e async for e in stream]
            await sender
    finals = [e.result for e in events if e.HasField("result") and e.result.is_final]
    ended = [
        e.speech_event.offset_s
        for e in events
        if e.HasField("speech_event") and e.speech_event.type == e.speech_event.SPEECH_ENDED
    ]
    assert len(finals) == 1 and wer([rec.transcript], [finals[0].text]) <= 0.2
    assert sample(server, "asr_early_finals_kept_total") == 1
    # the early decode was the final: no second one at the finalize
    assert sample(server, "asr_engine_inference_seconds_count", kind="final") == 1
    assert ended == [ended[0]] and ended[0] < 1.75 + 0.1  # speech ended before the hiss
    assert finals[0].end_s < 1.75 + 0.1
