"""docs/voice-agent.md's code runs as written: its ``turns()`` against the real server,
tiny.en and the turn model, on recorded speech paced as a caller speaks it."""

from __future__ import annotations

import asyncio
import gc
import re
import sys
import types
from collections.abc import AsyncIterator

import numpy as np
import pytest

from asr_api.v1 import asr_pb2
from asr_client.scoring import wer
from tests.helpers import ROOT, corpus, eventually, first_channel

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

DOC = ROOT / "docs" / "voice-agent.md"
RECORDING = "libri_2412-153948-0000"  # two read sentences
FRAME = 320  # 20 ms at 16 kHz


def doc_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The guide's first Python block, loaded as a module (its dataclass needs one in
    sys.modules), for this test only."""
    block = re.search(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert block, "docs/voice-agent.md lost its code"
    module = types.ModuleType("voice_agent_doc")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(block.group(1), str(DOC), "exec"), module.__dict__)  # noqa: S102 - our doc
    return module


async def caller(audio: np.ndarray, speed: float) -> AsyncIterator[bytes]:
    """``audio`` in 20 ms frames, each sent once it would have been spoken."""
    for start in range(0, audio.size, FRAME):
        yield audio[start : start + FRAME].tobytes()
        await asyncio.sleep(FRAME / 16_000 / speed)


async def test_the_guides_turns_come_whole_with_their_confidence(make_server, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    server = await make_server()
    rec = corpus()[RECORDING]
    speech = first_channel(rec.path)
    # the caller speaks, then waits for the answer (3 s: past the longest pause)
    audio = (np.concatenate([speech, np.zeros(3 * 16_000)]) * 32767).astype(np.int16)
    turns = doc_module(monkeypatch).turns
    barge_ins = []
    got = [
        turn
        async for turn in turns(  # type: ignore[operator]
            f"127.0.0.1:{server.port}",
            caller(audio, speed=2.0),
            on_barge_in=lambda: barge_ins.append(1),
        )
    ]
    assert got, "no turn came"
    assert wer([rec.transcript], [" ".join(t.text for t in got)]) <= 0.15, got
    # a turn ends by the model or by the longest pause, not by the end of the audio:
    # the 3 s of silence let it end while the stream was open
    ended_by = {t.reason for t in got}
    assert ended_by <= {asr_pb2.EndOfTurn.MODEL, asr_pb2.EndOfTurn.MAX_SILENCE}, got
    assert all(0.3 < t.confidence <= 1.0 for t in got), got
    assert len(barge_ins) >= len(got)  # each turn began with the caller starting to speak


async def test_the_guides_turns_leave_nothing_behind_when_the_agent_stops_reading(  # type: ignore[no-untyped-def]
    make_server, monkeypatch, caplog
) -> None:
    """An agent that stops after a turn (the call hung up): the guide's sender task failed
    with the cancelled stream and nobody read its error ("Task exception was never
    retrieved", once per call)."""
    server = await make_server()
    speech = first_channel(corpus()[RECORDING].path)
    audio = (np.concatenate([speech, np.zeros(3 * 16_000)]) * 32767).astype(np.int16)
    turns = doc_module(monkeypatch).turns(f"127.0.0.1:{server.port}", caller(audio, speed=2.0))
    first = await anext(turns)  # type: ignore[call-overload]
    assert first.text
    await turns.aclose()
    await asyncio.sleep(0.5)  # the sender's next frame: into the cancelled stream
    gc.collect()
    await asyncio.sleep(0)
    assert "never retrieved" not in caplog.text and "destroyed" not in caplog.text
    await eventually(lambda: server.servicer.active == 0)
