"""Stream resume with real speech and the real tiny.en in a real server process: a stream
cut ten times at random points by a fault-injecting proxy. Its finals must equal those of
the same recording streamed once without trouble: none missing, none doubled. (Rolling
restarts and SIGKILL behind nginx and Envoy: test_cluster_resume.py.)

Finals only (``interim_results=False``): a final depends on the utterance's audio alone,
while partials depend on timing, so two clean runs would not give identical partials.

What must match exactly is the words, in order. Where one final ends and the next begins
may move near a resume: the new call's voice detector has heard only the replayed audio
(the client replays LISTEN_LEAD_S more than it must, for this), not the whole call, so it
can split a sentence at a pause the old one bridged (or the reverse). No final may overlap
another, which is what a doubled final would do.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import random
from typing import Any

import numpy as np
import pytest

from asr_client import audio_config
from asr_client.resume import ResumeInfo, ResumePolicy
from asr_client.scoring import normalize
from asr_client.speech_level import at_speech_level
from tests.faultproxy import FaultProxy
from tests.helpers import corpus, read_pcm16, stream_audio
from tests.processes import (
    start_replica,
    wait_started,
)

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

SR = 16_000
RECORDING = "osr_us_000_0034_8k_up16k"  # 35 s, ten read sentences with pauses


def speech() -> np.ndarray:
    pcm, sr = read_pcm16(corpus()[RECORDING].path)
    assert sr == SR
    return pcm[:, 0]


Final = tuple[str, float, float]
RESUME = ResumePolicy()


async def play(
    port: int,
    pcm: np.ndarray,
    *,
    speed: float | None,
    resume: ResumePolicy | None = RESUME,
    infos: list[ResumeInfo] | None = None,
    on_event=None,  # type: ignore[no-untyped-def]
) -> list[Final]:
    """Stream ``pcm`` in 100 ms chunks at ``speed``× real time; the finals."""
    received = await stream_audio(
        port,
        pcm.reshape(-1, 1),
        SR,
        speed=speed,
        config=audio_config(language="en", interim_results=False),
        resume=resume,
        on_resume=infos.append if infos is not None else None,
        on_response=on_event,
    )
    return [
        (r.result.text, round(r.result.start_s, 2), round(r.result.end_s, 2))
        for r in (x.response for x in received)
        if r.HasField("result") and r.result.is_final
    ]


def same_finals(got: list[Final], want: list[Final]) -> None:
    """The same words in the same order, and no final doubled (overlapping another)."""
    assert words(got) == words(want), "\n".join(
        ["got:"] + [repr(f) for f in got] + ["want:"] + [repr(f) for f in want]
    )
    for (_, _, end), (_, start, _) in itertools.pairwise(got):
        assert start >= end - 0.01, f"finals overlap: {got}"
    assert got[0][1] >= 0 and got[-1][2] <= want[-1][2] + 1.0


def words(finals: list[Final]) -> list[str]:
    return normalize(" ".join(text for text, _, _ in finals)).split()


@pytest.fixture(scope="module")
def pcm() -> np.ndarray:
    return speech()


async def within(awaitable, timeout_s: float, cluster: Any):  # type: ignore[no-untyped-def]
    """``awaitable``, or a failure that shows what every task and process was doing."""
    try:
        return await asyncio.wait_for(awaitable, timeout_s)
    except TimeoutError:
        stacks = io.StringIO()
        for task in asyncio.all_tasks():
            task.print_stack(limit=12, file=stacks)
        logs = ["".join(p.log[-15:]) for p in [*cluster.replicas, cluster.proxy_process] if p]
        pytest.fail(f"streams hung\n{stacks.getvalue()}\n" + "\n---\n".join(logs))


_references: dict[float | None, list[Final]] = {}


async def reference_finals(pcm: np.ndarray, dbfs: float | None = None) -> list[Final]:
    """The recording's finals from a clean, unpaced run against a fresh replica; made once
    per level, on a test's own event loop (grpc.aio must not be used from a second loop)."""
    if dbfs not in _references:
        replica = await asyncio.to_thread(lambda: wait_started(start_replica(model="tiny.en")))
        try:
            _references[dbfs] = await within(
                play(replica.port, pcm, speed=None, resume=None), 120, None
            )
        finally:
            replica.stop()
    return _references[dbfs]


def at_level(pcm: np.ndarray, dbfs: float | None) -> np.ndarray:
    if dbfs is None:
        return pcm
    quiet = at_speech_level(pcm.astype(np.float32) / 32768, dbfs)
    return np.round(quiet * 32768).astype(np.int16)


@pytest.mark.parametrize("dbfs", [None, -45.0])
async def test_real_speech_cut_ten_times_keeps_every_final(
    pcm: np.ndarray, dbfs: float | None
) -> None:
    """At a normal level, and a quiet talker (-45 dBFS), whose channel the voice detector
    hears raised by what it has learnt of its level: the new server hears the replayed
    audio for that (heard as silence, the talker went unheard for a second or more after
    each resume, and ten cuts lost "journey home" and more)."""
    pcm = at_level(pcm, dbfs)
    reference = await reference_finals(pcm, dbfs)
    assert len(reference) >= 8
    replica = await asyncio.to_thread(lambda: wait_started(start_replica(model="tiny.en")))
    proxy = await FaultProxy(replica.port).start()
    rng = random.Random(2026)
    duration = len(pcm) / SR
    cuts = sorted(rng.uniform(1.0, duration - 1.0) for _ in range(10))  # audio seconds
    infos: list[ResumeInfo] = []
    speed = 2.0  # faster than a live caller, as a client catching up after a stall sends

    async def cutter() -> None:
        t0 = asyncio.get_running_loop().time()
        for at in cuts:
            await asyncio.sleep(max(0.0, t0 + at / speed - asyncio.get_running_loop().time()))
            proxy.cut()

    task = asyncio.create_task(cutter())
    try:
        got = await play(proxy.port, pcm, speed=speed, infos=infos)
    finally:
        task.cancel()
        await proxy.close()
        replica.stop()
    assert proxy.cuts == 10
    assert len(infos) >= 9, infos
    same_finals(got, reference)


async def test_the_first_final_after_a_resume_is_carried_as_on_the_uncut_stream() -> None:
    """A server decodes each final after the previous one's audio and text (the carry).
    The client keeps that final's audio and replays it, so the new server carries it too:
    cut in the pause after the first sentence, the second comes out as it does uncut
    (decoded alone, tiny.en heard "Mr. Carker used to" as "Mr. Carkeur is to")."""
    pcm, sr = read_pcm16(corpus()["libri_1272-128104-0004_8k_up16k"].path)
    assert sr == SR
    pcm = pcm[: int(19.5 * SR), 0]  # two sentences, and the pause after the second
    replica = await asyncio.to_thread(lambda: wait_started(start_replica(model="tiny.en")))
    proxy = await FaultProxy(replica.port).start()
    infos: list[ResumeInfo] = []

    def cut_after_the_first_final(response: Any) -> None:
        if response.HasField("result") and response.result.is_final and not proxy.cuts:
            proxy.cut()

    try:
        uncut = await within(play(replica.port, pcm, speed=None, resume=None), 60, None)
        got = await within(
            play(proxy.port, pcm, speed=2.0, infos=infos, on_event=cut_after_the_first_final),
            60,
            None,
        )
    finally:
        await proxy.close()
        replica.stop()
    assert proxy.cuts == 1 and len(infos) == 1, infos
    assert len(uncut) == 2, uncut
    # the replay began at the first final (on the replay grid), and did not repeat it
    assert infos[0].stream_offset_s <= uncut[0][1], infos
    assert got == uncut
