"""Stream resume with real speech and the real tiny.en in real server processes: a stream
cut ten times at random points, a rolling restart of three replicas behind nginx and Envoy under 12
streams, and a replica SIGKILLed mid-utterance. Each stream's finals must equal those of
the same recording streamed once without trouble: none missing, none doubled.

Finals only (``interim_results=False``): a final depends on the utterance's audio alone,
while partials depend on timing, so two clean runs would not give identical partials.

What must match exactly is the words, in order. Where one final ends and the next begins
may move near a resume: the new call's voice detector starts without the adaptive state
the old one had built up, so it can split a sentence at a pause the old one bridged (or
the reverse). No final may overlap another, which is what a doubled final would do.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from asr_client import audio_config
from asr_client.resume import ResumeInfo, ResumePolicy
from asr_client.scoring import normalize
from tests.faultproxy import FaultProxy
from tests.helpers import corpus, read_pcm16, stream_audio
from tests.processes import (
    NGINX,
    Process,
    Replica,
    connectable,
    envoy_binary,
    envoy_healthy_hosts,
    free_port,
    render,
    spawn,
    start_replica,
    wait_for,
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
    assert words(got) == words(want), (got, want)
    for (_, _, end), (_, start, _) in itertools.pairwise(got):
        assert start >= end - 0.01, f"finals overlap: {got}"
    assert got[0][1] >= 0 and got[-1][2] <= want[-1][2] + 1.0


def words(finals: list[Final]) -> list[str]:
    return normalize(" ".join(text for text, _, _ in finals)).split()


@pytest.fixture(scope="module")
def pcm() -> np.ndarray:
    return speech()


@pytest.fixture(scope="module")
def reference(pcm: np.ndarray) -> Iterator[list[Final]]:
    """The recording's finals from a clean, unpaced run against a fresh replica."""
    replica = wait_started(start_replica(model="tiny.en"))
    try:
        yield asyncio.run(play(replica.port, pcm, speed=None, resume=None))
    finally:
        replica.stop()


async def test_real_speech_cut_ten_times_keeps_every_final(
    pcm: np.ndarray, reference: list[Final]
) -> None:
    assert len(reference) >= 8
    replica = await asyncio.to_thread(lambda: wait_started(start_replica(model="tiny.en")))
    proxy = await FaultProxy(replica.port).start()
    rng = random.Random(2026)
    duration = len(pcm) / SR
    cuts = sorted(rng.uniform(1.0, duration - 1.0) for _ in range(10))
    infos: list[ResumeInfo] = []

    async def cutter() -> None:
        t0 = asyncio.get_running_loop().time()
        for at in cuts:
            await asyncio.sleep(max(0.0, t0 + at - asyncio.get_running_loop().time()))
            proxy.cut()

    task = asyncio.create_task(cutter())
    try:
        got = await play(proxy.port, pcm, speed=1.0, infos=infos)
    finally:
        task.cancel()
        await proxy.close()
        replica.stop()
    assert proxy.cuts == 10
    assert len(infos) >= 9, infos
    same_finals(got, reference)


# -- behind nginx and Envoy --------------------------------------------------------------


class RealCluster:
    """Three tiny.en replicas on fixed ports behind nginx or Envoy; replicas restart."""

    def __init__(self, tmp: Path, proxy: str) -> None:
        self.ports = [free_port() for _ in range(3)]
        self.replicas: list[Replica] = []
        self.proxy_process: Process | None = None
        self.proxy = proxy
        self.port = free_port()
        self.tmp = tmp

    def start(self) -> RealCluster:
        self.replicas = [self._replica(p) for p in self.ports]
        for r in self.replicas:
            wait_started(r)
        if self.proxy == "nginx":
            (self.tmp / "tmp").mkdir(parents=True, exist_ok=True)
            conf = render("nginx", self.port, self.replicas, self.tmp / "nginx.conf")
            self.proxy_process = spawn(
                [NGINX, "-p", str(self.tmp), "-e", "stderr", "-c", str(conf)]
            )
            wait_for(lambda: connectable(self.port), 30, "nginx listening")
        else:
            envoy, admin = envoy_binary(), free_port()
            assert envoy is not None
            conf = render("envoy", self.port, self.replicas, self.tmp / "envoy.yaml", admin)
            self.proxy_process = spawn([envoy, "-c", str(conf), "--disable-hot-restart"])
            wait_for(lambda: envoy_healthy_hosts(admin) == 3, 30, "envoy health checks")
        return self

    def _replica(self, port: int) -> Replica:
        # a short drain keeps the test short; clients move within an utterance or two
        return start_replica(
            model="tiny.en", port=port, max_streams=16, env={"ASR_DRAIN_TIMEOUT_S": "15"}
        )

    def restart(self, index: int, sig: signal.Signals) -> None:
        old = self.replicas[index]
        old.proc.send_signal(sig)
        old.proc.wait(40)
        old.stop()
        self.replicas[index] = wait_started(self._replica(self.ports[index]))

    def serving(self, before: list[int]) -> int:
        """The replica that opened a stream since ``before`` (counts of opened streams)."""
        opened = [r.opened - b for r, b in zip(self.replicas, before, strict=True)]
        return opened.index(max(opened))

    def stop(self) -> None:
        if self.proxy_process is not None:
            self.proxy_process.stop()
        for r in self.replicas:
            r.stop()


@pytest.fixture(scope="module", params=["nginx", "envoy"])
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealCluster]:
    """The real cluster behind each proxy (scripts/test.sh installs nginx and Envoy)."""
    c = RealCluster(tmp_path_factory.mktemp(request.param), request.param)
    try:
        yield c.start()
    finally:
        c.stop()


async def test_rolling_restart_under_twelve_streams_loses_nothing(
    cluster: RealCluster, pcm: np.ndarray, reference: list[Final]
) -> None:
    infos: list[list[ResumeInfo]] = [[] for _ in range(12)]

    async def one(k: int) -> list[Final]:
        await asyncio.sleep(0.3 * k)
        return await play(cluster.port, pcm, speed=1.0, infos=infos[k])

    async def rolling_restart() -> None:
        await asyncio.sleep(5.0)
        for i in range(3):  # SIGTERM each in turn: drain, exit, start again
            await asyncio.to_thread(cluster.restart, i, signal.SIGTERM)

    restarts = asyncio.create_task(rolling_restart())
    results = await asyncio.gather(*(one(k) for k in range(12)))
    await restarts
    for got in results:
        same_finals(got, reference)
    causes = [i.cause for stream in infos for i in stream]
    assert len(causes) >= 12, causes  # every stream moved at least once
    assert "going away" in causes


async def test_sigkill_of_the_serving_replica_mid_utterance(
    cluster: RealCluster, pcm: np.ndarray, reference: list[Final]
) -> None:
    before = [r.opened for r in cluster.replicas]
    killed = asyncio.Event()
    finals_seen = 0
    infos: list[ResumeInfo] = []
    loop = asyncio.get_running_loop()

    def on_event(response) -> None:  # type: ignore[no-untyped-def]
        nonlocal finals_seen
        if response.HasField("result") and response.result.is_final:
            finals_seen += 1
        started = response.speech_event.type == 1 and response.HasField("speech_event")
        if started and finals_seen >= 2 and not killed.is_set():
            killed.set()  # speech has just started: kill the replica inside the utterance
            index = cluster.serving(before)
            victim = cluster.replicas[index]
            victim.proc.send_signal(signal.SIGKILL)
            loop.run_in_executor(None, cluster.restart, index, signal.SIGKILL)

    got = await play(cluster.port, pcm, speed=1.0, infos=infos, on_event=on_event)
    assert killed.is_set()
    assert len(infos) >= 1 and infos[0].cause != "going away"
    same_finals(got, reference)
