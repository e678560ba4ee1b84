"""``asr-client file`` as a real process against the real server and the real tiny.en model."""

from __future__ import annotations

import asyncio
import csv
import json
import os
import re
import sys
from pathlib import Path

import pytest

from asr_server.app import start_server
from asr_server.settings import Settings

pytestmark = pytest.mark.model

SAMPLES = Path(__file__).parents[2] / "audio_samples"
SAMPLE_ID = "libri_1089-134691-0001"


def normalized_words(text: str) -> list[str]:
    return re.sub(r"[^a-z' ]+", " ", text.lower()).split()


def reference(sample_id: str) -> tuple[Path, str]:
    with (SAMPLES / "manifest.tsv").open(newline="") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            if row["id"] == sample_id:
                return SAMPLES / row["file"], row["transcript"]
    raise LookupError(f"{sample_id} is not in audio_samples/manifest.tsv")


async def test_file_command_transcribes_librispeech(tmp_path: Path) -> None:
    path, transcript = reference(SAMPLE_ID)
    running = await start_server(Settings(host="127.0.0.1", port=0, metrics_port=0))
    try:
        await asyncio.wait_for(running.ready.wait(), 120)
        out = tmp_path / "events.jsonl"
        # the server runs on this event loop, so the client must run without blocking it
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "asr_client", "file", str(path),
            "--server", f"127.0.0.1:{running.port}", "--fast", "--language", "en",
            "--json-out", str(out),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        try:
            stdout, stderr = await asyncio.wait_for(proc.communicate(), 120)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
    finally:
        await running.close()

    assert proc.returncode == 0, stderr.decode()
    events = [json.loads(line) for line in out.read_text().splitlines()]
    finals = [e for e in events if e["type"] == "final"]
    assert finals, f"no final results in {events}"
    heard = set(normalized_words(" ".join(e["text"] for e in finals)))
    expected = [w for w in normalized_words(transcript) if len(w) >= 4]
    missing = [w for w in expected if w not in heard]
    # tiny.en gets this clean utterance (nearly) right; allow one slip
    assert len(missing) <= 1, f"missing {missing} in {heard}"
    # not a terminal: one plain line per final on stdout, the summary on stderr
    lines = stdout.decode().splitlines()
    assert [line.split("  ", 1)[1] for line in lines] == [e["text"] for e in finals]
    assert f"{len(finals)} final result(s)" in stderr.decode()


async def test_a_quiet_recording_is_told_and_normalize_brings_its_words_back(
    tmp_path: Path,
) -> None:
    """A clean recording 50 dB below full scale came back from `recognize` as nothing,
    exit 0, not a word said (the server's voice detector raises a quiet channel by 10 dB
    at most): the user is told, and --normalize raises it before sending."""
    import numpy as np
    import soundfile as sf

    path, transcript = reference(SAMPLE_ID)
    audio, rate = sf.read(str(path), dtype="float64")
    quiet = tmp_path / "quiet.wav"
    sf.write(str(quiet), audio / np.abs(audio).max() * 10 ** (-50 / 20), rate, subtype="PCM_16")
    running = await start_server(Settings(host="127.0.0.1", port=0, metrics_port=0))
    try:
        await asyncio.wait_for(running.ready.wait(), 120)

        async def recognize(*flags: str) -> tuple[str, str]:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "asr_client", "recognize", str(quiet),
                "--server", f"127.0.0.1:{running.port}", *flags,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            stdout, stderr = await asyncio.wait_for(proc.communicate(), 120)
            assert proc.returncode == 0, stderr.decode()
            return stdout.decode(), stderr.decode()

        as_it_is, told = await recognize()
        raised, told_raised = await recognize("--normalize")
    finally:
        await running.close()
    assert "the recording is quiet" in told and "--normalize raises it first" in told, told
    assert "--normalize: raised by" in told_raised and "is quiet" not in told_raised
    heard = set(normalized_words(raised))
    missing = [w for w in normalized_words(transcript) if len(w) >= 4 and w not in heard]
    assert len(missing) <= 1, f"missing {missing} in {raised!r} (as it is: {as_it_is!r})"
