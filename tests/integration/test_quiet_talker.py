"""A quiet talker's words all reach a final (the real server and model on a recording)."""

from __future__ import annotations

import numpy as np
import pytest

from asr_client.scoring import normalize, wer
from asr_client.speech_level import at_speech_level
from tests.helpers import corpus, first_channel, stream_audio, to_pcm16

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]


@pytest.mark.parametrize("dbfs", [-45, -48])
async def test_a_quiet_talker_s_soft_words_between_utterances_reach_a_final(
    make_server, dbfs: int
) -> None:  # type: ignore[no-untyped-def]
    # LibriSpeech's "He hoped there would be stew for dinner..." at -45 dBFS (a far-field
    # or laptop microphone): webrtcvad, hearing the channel raised, still hears none of
    # "there would be", the first utterance ends after "the", and the words between its
    # final's end and the next utterance's pre-roll were in no final ("He hoped the...
    # stew for dinner. her nips and carrots"). Now the next utterance takes them in.
    server = await make_server()
    rec = corpus()["libri_1089-134686-0000"]
    gap = np.zeros(16_000, np.float32)
    audio = at_speech_level(np.concatenate([gap, first_channel(rec.path), gap]), dbfs)
    received = await stream_audio(server.port, to_pcm16(audio), 16_000, speed=None)
    text = " ".join(
        r.response.result.text
        for r in received
        if r.response.HasField("result") and r.response.result.is_final
    )
    assert "hoped there would be stew" in normalize(text), text
    # (offline: 0.11 at both levels; a 6 s utterance's split at a pause webrtcvad hears
    # inside "pieces" costs a word or two more)
    assert wer([rec.transcript], [text]) <= 0.2, text
