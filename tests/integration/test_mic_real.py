"""``asr-client mic`` for real: PortAudio → ALSA's pulse plugin → a private PulseAudio daemon
whose null sink plays a recording from ../shared/audio, so the client hears it from the
sink's monitor exactly as it would hear a microphone. The server runs the real tiny.en model.

scripts/test.sh installs pulseaudio, libportaudio2 and libasound2-plugins; without them
this test fails rather than skips.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import soundfile

from tests.conftest import ServerFactory
from tests.helpers import corpus

pytestmark = pytest.mark.model

RECORDING = "libri_1089-134691-0001"  # "for a full hour he had paced up and down waiting ..."
SINK = "asr_test_mic"


def normalized_words(text: str) -> list[str]:
    return re.sub(r"[^a-z' ]+", " ", text.lower()).split()


async def _wait_for_line(stream: asyncio.StreamReader, needle: str, timeout_s: float) -> str:
    """Read lines until one contains ``needle``; returns everything read."""
    seen = ""

    async def scan() -> None:
        nonlocal seen
        while needle not in seen:
            line = await stream.readline()
            if not line:
                raise AssertionError(f"{needle!r} never came; got:\n{seen}")
            seen += line.decode(errors="replace")

    await asyncio.wait_for(scan(), timeout_s)
    return seen


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except TimeoutError:
            proc.kill()
            await proc.wait()


@pytest.fixture
async def pulse() -> AsyncIterator[dict[str, str]]:
    """A PulseAudio daemon of our own (private socket, no other clients, stopped after);
    yields the environment in which PortAudio's ALSA "pulse" device reaches it."""
    missing = [tool for tool in ("pulseaudio", "paplay") if shutil.which(tool) is None]
    assert not missing, f"{missing} not installed: scripts/test.sh installs pulseaudio"
    # short: a unix socket path may not exceed 107 bytes
    runtime = tempfile.mkdtemp(prefix="asr-pulse-")
    socket = f"{runtime}/native"
    env = {
        **os.environ,
        "HOME": runtime,  # libpulse keeps its cookie and state under $HOME
        "XDG_CONFIG_HOME": runtime,
        "XDG_RUNTIME_DIR": runtime,
        "PULSE_RUNTIME_PATH": runtime,
        "PULSE_SERVER": f"unix:{socket}",
    }
    daemon = await asyncio.create_subprocess_exec(
        "pulseaudio", "--daemonize=no", "-n", "--exit-idle-time=-1", "--use-pid-file=no",
        "--log-target=stderr", "--log-level=info",
        f"--load=module-native-protocol-unix socket={socket} auth-anonymous=1",
        # 48 kHz stereo, like a typical sound card: PulseAudio converts for the client
        f"--load=module-null-sink sink_name={SINK} rate=48000 channels=2",
        stdin=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )  # fmt: skip
    assert daemon.stderr is not None
    try:
        await _wait_for_line(daemon.stderr, "Daemon startup complete", 20)
        drain = asyncio.create_task(daemon.stderr.read())  # keep its pipe from filling
        yield env
    finally:
        await _stop(daemon)
        shutil.rmtree(runtime, ignore_errors=True)
    await drain


async def test_mic_hears_a_recording_played_into_pulseaudio(
    pulse: dict[str, str], make_server: ServerFactory, tmp_path: Path
) -> None:
    recording = corpus()[RECORDING]
    server = await make_server()
    transcript, audio, events = (tmp_path / n for n in ("t.txt", "a.wav", "e.jsonl"))
    client = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "asr_client", "mic",
        "--server", f"127.0.0.1:{server.port}", "--device", "pulse", "--rate", "48000",
        # an utterance ends only after 3 s of silence, far longer than this test waits
        # after the recording: its final can only come from the flush on Ctrl-C
        "--silence-ms", "3000", "--language", "en", "--verbose",
        "--save-transcript", str(transcript), "--save-audio", str(audio), "--json-out", str(events),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**pulse, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert client.stdout is not None and client.stderr is not None
    try:
        head = await _wait_for_line(client.stderr, "listening on", 30)
        assert "pulse (ALSA), 48000 Hz" in head
        player = await asyncio.create_subprocess_exec(
            "paplay", f"--device={SINK}", str(recording.path), env=pulse
        )
        assert await asyncio.wait_for(player.wait(), 30) == 0
        # Ctrl-C as the recording ends: the utterance is still in progress
        client.send_signal(signal.SIGINT)
        stdout, rest = await asyncio.wait_for(client.communicate(), 60)
    finally:
        await _stop(client)
    stderr = head + rest.decode()
    assert client.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert "stopping: finishing the last utterance" in stderr
    assert re.search(r"recorded \d+\.\d s; [1-9]\d* final result\(s\)$", stderr.strip()), stderr

    records = [json.loads(line) for line in events.read_text().splitlines()]
    assert "speech_started" in {r["type"] for r in records}
    finals = [r["text"] for r in records if r["type"] == "final"]
    heard = normalized_words(" ".join(finals))
    expected = [w for w in normalized_words(recording.transcript) if len(w) >= 4]
    missing = [w for w in expected if w not in heard]
    assert len(missing) <= 1, f"missing {missing} in {heard}"
    # the last words of the recording made it through the Ctrl-C
    assert "longer" in heard, heard
    # the final came last, then the closing progress that accounts for all the audio
    assert [r["type"] for r in records[-2:]] == ["final", "progress"]
    assert records[-1]["progress"]["lag_s"] == 0

    # the finals were shown on stdout and saved, the audio saved at the rate declared
    lines = [line for line in stdout.decode().splitlines() if " ~ " not in line and "(" not in line]
    assert [line.split("  ", 1)[1] for line in lines] == finals
    assert transcript.read_text().splitlines() == lines
    info = soundfile.info(str(audio))
    assert (info.samplerate, info.channels) == (48_000, 1)
    assert info.duration >= recording.duration_s - 0.5


async def test_mic_without_a_reachable_device_says_so_plainly(tmp_path: Path) -> None:
    # PulseAudio not reachable, so ALSA's "pulse" device is gone
    env = {**os.environ, "PULSE_SERVER": f"unix:{tmp_path}/nobody-here"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "asr_client", "mic", "--device", "pulse",
        "--server", "127.0.0.1:1",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 1
    assert re.fullmatch(r"error: no (audio input device found|input device matches 'pulse') .*\n",
                        stderr.decode()), stderr.decode()  # fmt: skip
    assert stdout == b""
