"""The ``asr-client`` command end to end against the real server running the fake engine."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import socket
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import soundfile

from asr_api.v1 import asr_pb2
from asr_client.audio_files import AudioFileError, PcmAudio, load_audio
from asr_client.cli import StreamStats, build_parser, run, send_paced
from asr_client.render import PlainRenderer, clock, final_line
from asr_server.engine.fake import FakeEngine
from tests.helpers import eventually

RATE = 16_000
FINAL_LINE = re.compile(r"^\[\d\d:\d\d\.\d-\d\d:\d\d\.\d\] ch(\d)  (.*)$")


def speech_like(rate: int = RATE) -> np.ndarray:
    """1 s silence, 1.5 s of a 440 Hz tone (the fake engine hears anything loud), 1 s silence."""
    t = np.arange(int(1.5 * rate)) / rate
    tone = 0.3 * np.sin(2 * np.pi * 440 * t)
    return np.concatenate([np.zeros(rate), tone, np.zeros(rate)])


@pytest.fixture
def mono_wav(tmp_path: Path) -> Path:
    path = tmp_path / "tone.wav"
    soundfile.write(path, speech_like(), RATE, subtype="PCM_16")
    return path


@pytest.fixture
def stereo_wav(tmp_path: Path) -> Path:
    left = speech_like()
    path = tmp_path / "stereo.wav"
    soundfile.write(path, np.stack([left, np.zeros_like(left)], axis=1), RATE, subtype="PCM_16")
    return path


def read_events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_well_ordered(events: list[dict]) -> None:
    """Receive times never go back, and no partial of an utterance follows its final."""
    ts = [e["t"] for e in events]
    recv = [e["recv_time"] for e in events]
    assert ts == sorted(ts) and ts[0] >= 0
    assert recv == sorted(recv)
    final_at = {
        (e["channel"], e["utterance_id"]): i for i, e in enumerate(events) if e["type"] == "final"
    }
    for i, e in enumerate(events):
        key = (e.get("channel"), e.get("utterance_id"))
        if e["type"] == "partial" and key in final_at:
            assert i < final_at[key], f"partial {e} after the final of its utterance"


# -- file ---------------------------------------------------------------------------------


async def test_the_callers_sigterm_handler_is_back_after_a_command(
    server: str, mono_wav: Path
) -> None:
    """The command's own handler was removed to SIGTERM's default: a program running the
    command lost its handler (pytest's, which ends a cancelled run with its teardowns)."""
    import signal

    def handler(signum: int, frame: object) -> None: ...

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        assert await run(["file", str(mono_wav), "--server", server, "--fast"]) == 0
        assert signal.getsignal(signal.SIGTERM) is handler
    finally:
        signal.signal(signal.SIGTERM, previous)


async def test_an_asyncio_callers_sigterm_handler_still_runs_after_a_command(
    server: str, mono_wav: Path
) -> None:
    """An asyncio program's own handler (its loop's, behind a no-op Python handler) was
    lost: SIGTERM then killed it, or, with the no-op put back, did nothing at all."""
    import os
    import signal

    loop = asyncio.get_running_loop()
    saved = signal.getsignal(signal.SIGTERM)
    heard = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, heard.set)
    try:
        assert await run(["file", str(mono_wav), "--server", server, "--fast"]) == 0
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(heard.wait(), 5)
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, saved)


async def test_file_fast_writes_json_lines(server: str, mono_wav: Path, tmp_path: Path, capsys):
    out = tmp_path / "events.jsonl"
    code = await run(["file", str(mono_wav), "--server", server, "--fast", "--json-out", str(out)])
    assert code == 0
    events = read_events(out)
    types = [e["type"] for e in events]
    assert "speech_started" in types
    # the stream's last response accounts for all the audio: nothing left unprocessed
    closing = events[-1]
    assert closing["type"] == "progress" and "text" not in closing
    assert closing["progress"]["audio_processed_s"] == closing["progress"]["audio_received_s"]
    assert closing["progress"]["audio_received_s"] == pytest.approx(3.5, abs=0.01)
    finals = [e for e in events if e["type"] == "final"]
    assert finals and finals[0]["text"].startswith("w0")
    assert finals[0]["channel"] == 0 and finals[0]["stability"] == 1.0
    assert finals[0]["confidence"] == pytest.approx(0.9)  # the fake engine's, passed through
    assert 0.5 <= finals[0]["start_s"] < finals[0]["end_s"] <= 3.5
    assert set(finals[0]["progress"]) == {"audio_received_s", "audio_processed_s", "lag_s"}
    assert types.index("speech_started") < types.index("final")
    assert_well_ordered(events)
    captured = capsys.readouterr()
    # not a terminal: plain lines, finals only
    lines = captured.out.splitlines()
    assert lines and all(FINAL_LINE.match(line) for line in lines)
    assert FINAL_LINE.match(lines[0]).group(2).startswith("w0")  # type: ignore[union-attr]
    assert "sent 3.5 s of audio" in captured.err and "1 final result(s)" in captured.err


async def test_file_paced_sends_partials_before_final(server: str, mono_wav: Path, tmp_path):
    out = tmp_path / "events.jsonl"
    code = await run(
        ["file", str(mono_wav), "--server", server, "--speed", "4", "--json-out", str(out),
         "--chunk-ms", "50", "--quiet"]
    )  # fmt: skip
    assert code == 0
    events = read_events(out)
    assert_well_ordered(events)
    partials = [e for e in events if e["type"] == "partial"]
    final = next(e for e in events if e["type"] == "final")
    # at 4x the server has 125 ms of wall time per partial interval: ample for the fake engine
    assert partials, "paced streaming should show partials"
    assert all(final["text"].startswith(p["stable_text"]) for p in partials)
    # the final follows the end of the tone (2.5 s of audio), which is sent ≥ 2.5/4 s in
    assert final["t"] >= 2.5 / 4


async def test_json_out_dash_keeps_stdout_pure_json(server: str, mono_wav: Path, capsys):
    code = await run(["file", str(mono_wav), "--server", server, "--fast", "--json-out", "-"])
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    events = [json.loads(line) for line in lines]
    assert any(e["type"] == "final" for e in events)


async def test_stereo_results_carry_their_channel(
    server: str, stereo_wav: Path, tmp_path: Path
) -> None:
    out = tmp_path / "events.jsonl"
    code = await run(
        ["file", str(stereo_wav), "--server", server, "--fast", "--json-out", str(out), "--quiet"]
    )
    assert code == 0
    finals = [e for e in read_events(out) if e["type"] == "final"]
    assert finals and {e["channel"] for e in finals} == {0}
    assert finals[0]["text"].startswith("w0")


@pytest.mark.parametrize("right_gain", [0.8, -0.8])
@pytest.mark.parametrize(("option", "channels"), [(None, {0}), ("mix", {0}), ("separate", {0, 1})])
async def test_a_plain_stereo_recording_is_transcribed_once(
    server: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    option: str | None,
    channels: set[int],
    right_gain: float,
) -> None:
    """The same signal on both channels (a stereo copy of a mono recording, as
    audio_samples/jfk.flac is): one transcript unless asked, not every line twice. A
    right channel wired upside down (-0.8) is the same signal too, and mixing it must not
    cancel the left to silence."""
    left = speech_like()
    path = tmp_path / "same.wav"  # the same signal, a little quieter on the right
    soundfile.write(path, np.stack([left, right_gain * left], axis=1), RATE, subtype="PCM_16")
    out = tmp_path / "events.jsonl"
    argv = ["file", str(path), "--server", server, "--fast", "--json-out", str(out)]
    assert await run([*argv, *(["--channels", option] if option else [])]) == 0
    finals = [e for e in read_events(out) if e["type"] == "final"]
    assert finals and {e["channel"] for e in finals} == channels
    said = "carry the same signal" in capsys.readouterr().err
    assert said == (option is None)


async def test_long_chunks_of_many_channels_fit_the_servers_message_limit(
    server: str, tmp_path: Path
) -> None:
    """--chunk-ms goes up to 5 s: at 44.1 kHz with 4 separate channels that is 1.7 MB a
    message, over the 1 MiB a server takes by default, which refused the stream."""
    rate = 44_100
    call = np.stack([speech_like(rate) * g for g in (1.0, 0.0, 0.0, 0.0)], axis=1)
    path = tmp_path / "four.wav"
    soundfile.write(path, call, rate, subtype="PCM_16")
    out = tmp_path / "events.jsonl"
    argv = ["file", str(path), "--server", server, "--fast", "--json-out", str(out)]
    assert await run([*argv, "--channels", "separate", "--chunk-ms", "5000", "--quiet"]) == 0
    finals = [e for e in read_events(out) if e["type"] == "final"]
    assert finals and {e["channel"] for e in finals} == {0}


def test_chunks_are_whole_frames_under_a_message_limit() -> None:
    audio = PcmAudio(np.arange(4 * 44_100 * 6, dtype=np.int16).reshape(-1, 4) % 1000, 44_100)
    chunks = list(audio.chunks(5000))
    assert max(len(c) for c in chunks) <= 1 << 20
    assert all(len(c) % 8 == 0 for c in chunks)
    assert b"".join(chunks) == audio.to_bytes()
    assert len(list(audio.chunks(100))) == 60  # short chunks are as asked
    from asr_server.settings import StreamingSettings

    # the client's limit is the server's default
    assert StreamingSettings().max_audio_message_bytes == 1 << 20


def test_channels_alike_tells_one_recording_from_a_call() -> None:
    from asr_client.audio_files import PcmAudio

    rng = np.random.default_rng(1)
    speech = (rng.normal(0, 3000, 16_000)).astype(np.int16)
    other = (rng.normal(0, 3000, 16_000)).astype(np.int16)
    assert PcmAudio(np.stack([speech, speech], axis=1), RATE).channels_alike()
    assert not PcmAudio(np.stack([speech, other], axis=1), RATE).channels_alike()
    # the same signal with one channel's polarity reversed: alike, and mixed right side up
    inverted = PcmAudio(np.stack([speech, -speech], axis=1), RATE)
    assert inverted.channels_alike()
    assert np.array_equal(inverted.mixed().frames[:, 0], speech)
    # silence on both is alike; silence beside speech is not
    silent = np.zeros_like(speech)
    assert PcmAudio(np.stack([silent, silent], axis=1), RATE).channels_alike()
    assert not PcmAudio(np.stack([silent, speech], axis=1), RATE).channels_alike()
    # a call: each side mostly silent while the other talks, a little echo across
    agent = np.concatenate([speech, np.zeros(16_000, np.int16)])
    customer = np.concatenate([np.zeros(16_000, np.int16), other])
    echo = (agent * 0.05).astype(np.int16)
    call = PcmAudio(np.stack([agent, customer + echo], axis=1), RATE)
    assert not call.channels_alike()
    mixed = PcmAudio(np.stack([speech, np.zeros_like(speech)], axis=1), RATE).mixed()
    assert mixed.channels == 1 and np.array_equal(mixed.frames[:, 0], np.round(speech / 2))


@pytest.mark.parametrize("rate", [16_000, 44_100])
def test_channels_alike_allows_for_a_spaced_microphone_pair(rate: int) -> None:
    """A stereo recording whose right microphone hears the scene a little later (up to
    5 ms: a spaced pair) is one signal, not two speakers transcribed twice; a call's two
    sides stay apart, even with a delayed echo of one in the other."""
    rng = np.random.default_rng(3)
    scene = rng.normal(0, 3000, 3 * rate)
    for lag_ms in (0.25, 1.0, 4.5):
        lag = round(lag_ms * rate / 1000)
        later = 0.7 * np.concatenate([np.zeros(lag), scene[: len(scene) - lag]])
        stereo = np.stack([scene, later], axis=1).astype(np.int16)
        assert PcmAudio(stereo, rate).channels_alike(), lag_ms
    agent = np.concatenate([scene, np.zeros(3 * rate)])
    customer = np.concatenate([np.zeros(3 * rate), rng.normal(0, 3000, 3 * rate)])
    echo = 0.3 * np.concatenate([np.zeros(rate // 500), agent[: -(rate // 500)]])
    call = np.stack([agent, customer + echo], axis=1).astype(np.int16)
    assert not PcmAudio(call, rate).channels_alike()


def test_channels_alike_reads_a_long_file_by_blocks(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # the same answers block by block (a DC offset, channels alike or not), and memory
    # bounded by a block, not 8 times the file's samples
    import tracemalloc

    from asr_client import audio_files

    rng = np.random.default_rng(2)
    speech = (rng.normal(400, 3000, 2_000_000)).astype(np.int16)  # 400: a DC offset
    other = (rng.normal(0, 3000, 2_000_000)).astype(np.int16)
    echo = (speech * 0.9 + other * 0.3).astype(np.int16)
    monkeypatch.setattr(audio_files, "CORRELATION_BLOCK_FRAMES", 1 << 15)
    for right, alike in ((speech, True), (other, False), (echo, True)):
        audio = audio_files.PcmAudio(np.stack([speech, right], axis=1), RATE)
        tracemalloc.start()
        try:
            assert audio.channels_alike() is alike
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < audio.frames.nbytes / 4, peak  # (8 MB of samples)


@pytest.mark.parametrize(("rate", "sent_at"), [(96_000, 48_000), (6_000, 16_000)])
async def test_a_file_at_a_rate_the_server_refuses_is_resampled(
    server: str, tmp_path: Path, capsys, rate: int, sent_at: int
) -> None:
    """The server takes 8-48 kHz: a 96 kHz master or a 6 kHz recording used to end with
    INVALID_ARGUMENT; the client resamples it (soxr) to 48 kHz or 16 kHz."""
    path = tmp_path / f"tone-{rate}.wav"
    soundfile.write(path, speech_like(rate), rate, subtype="PCM_16")
    out = tmp_path / "events.jsonl"
    argv = ["file", str(path), "--server", server, "--fast", "--json-out", str(out)]
    assert await run(argv) == 0, capsys.readouterr().err
    events = read_events(out)
    # 3.5 s of audio arrived as such, so the declared rate matched what was sent
    assert events[-1]["progress"]["audio_received_s"] == pytest.approx(3.5, abs=0.01)
    finals = [e for e in events if e["type"] == "final"]
    assert finals and finals[0]["text"] == "w0 w1 w2 w3 w4 w5"
    assert f"resampling from {rate} Hz to {sent_at} Hz" in capsys.readouterr().err


async def test_a_file_saying_a_rate_no_recording_has_is_refused(tmp_path: Path, capsys) -> None:
    """A header saying 100 Hz was resampled to 16 kHz: each second of audio in it became
    160 s for the server, of nothing anyone said."""
    path = tmp_path / "broken.wav"
    soundfile.write(path, speech_like(RATE)[:RATE], 100, subtype="PCM_16")
    # before connecting: nothing listens on port 1
    assert await run(["file", str(path), "--server", "127.0.0.1:1"]) == 1
    assert capsys.readouterr().err == (
        f"error: {path}: its sample rate is 100 Hz; rates below 4000 Hz are refused (a "
        "damaged or wrong header?)\n"
    )


async def test_more_channels_than_the_server_takes_is_a_usage_error_unless_mixed(
    server: str, tmp_path: Path, capsys
) -> None:
    rng = np.random.default_rng(4)
    path = tmp_path / "ten.wav"
    soundfile.write(path, rng.normal(0, 0.1, (RATE, 10)), RATE, subtype="PCM_16")
    # before connecting: nothing listens on port 1
    assert await run(["file", str(path), "--server", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path} has 10 channels") and "--channels mix" in err
    assert await run(["recognize", str(path), "--server", "127.0.0.1:1"]) == 2
    capsys.readouterr()
    argv = ["file", str(path), "--server", server, "--fast", "--channels", "mix", "--quiet"]
    assert await run(argv) == 0, capsys.readouterr().err


async def test_word_timestamps_reach_the_json(server: str, mono_wav: Path, tmp_path: Path):
    out = tmp_path / "events.jsonl"
    argv = ["file", str(mono_wav), "--server", server, "--fast", "--word-timestamps"]
    assert await run([*argv, "--json-out", str(out), "--quiet"]) == 0
    final = next(e for e in read_events(out) if e["type"] == "final")
    assert [w["word"].strip() for w in final["words"]] == final["text"].split()
    assert all(w["start_s"] < w["end_s"] for w in final["words"])


# -- recognize ----------------------------------------------------------------------------


async def test_recognize_prints_final_lines(server: str, stereo_wav: Path, capsys):
    assert await run(["recognize", str(stereo_wav), "--server", server]) == 0
    lines = capsys.readouterr().out.splitlines()
    matches = [FINAL_LINE.match(line) for line in lines]
    assert matches and all(matches)
    assert {m.group(1) for m in matches if m} == {"0"}
    assert matches[0].group(2).startswith("w0")  # type: ignore[union-attr]


async def test_recognize_json(server: str, mono_wav: Path, capsys):
    argv = ["recognize", str(mono_wav), "--server", server, "--json", "--word-timestamps"]
    assert await run(argv) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["duration_s"] == pytest.approx(3.5)
    (result,) = document["results"]
    assert result["text"].startswith("w0") and result["words"]


# -- errors -------------------------------------------------------------------------------


async def test_a_recognize_request_over_the_limit_is_told_before_it_is_sent(
    tmp_path: Path, monkeypatch, capsys
):
    """The check counted the PCM alone: a file just under the limit as PCM made a request
    over it (its config and framing), which grpc refused with an unreadable error and the
    server's exit status."""
    import asr_client.cli as cli

    monkeypatch.setattr(cli, "MAX_RECOGNIZE_BYTES", 32_000)
    path = tmp_path / "limit.wav"
    soundfile.write(path, np.zeros(16_000, np.int16), 16_000)  # 32000 bytes as PCM
    assert await run(["recognize", str(path), "--server", "127.0.0.1:1"]) == 1
    err = capsys.readouterr().err
    assert "more than one call may carry (0 MiB); stream it instead" in err, err


@pytest.mark.parametrize("target", ["", "  ", "dns:///", "dns://8.8.8.8/", "ipv4:"])
async def test_a_server_address_that_names_nothing_is_refused(mono_wav: Path, capsys, target: str):
    """grpc took it, never connected, and the command hung in the channel's shutdown after
    its "cannot connect" error (an unset variable: --server "$ASR_SERVER")."""
    assert await asyncio.wait_for(run(["file", str(mono_wav), "--server", target]), 10) == 1
    assert f"no server address in {target!r}" in capsys.readouterr().err


@pytest.mark.parametrize("pace", [[], ["--fast"]])
async def test_server_rejection_exits_2(server: str, mono_wav: Path, capsys, pace):
    # with --fast a write is in flight as the server aborts: grpc.aio then reports
    # INTERNAL for the write (grpc/grpc#36066); the client must still show the real status
    code = await run(["file", str(mono_wav), "--server", server, "--language", "xx", *pace])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: INVALID_ARGUMENT: ") and "language" in err
    assert "sent" not in err  # no summary after an error


async def test_recognize_rejection_exits_2(server: str, mono_wav: Path, capsys):
    code = await run(["recognize", str(mono_wav), "--server", server, "--language", "xx"])
    assert code == 2
    assert capsys.readouterr().err.startswith("error: INVALID_ARGUMENT: ")


async def test_no_server_is_a_readable_error(mono_wav: Path, capsys):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = ["file", str(mono_wav), "--server", f"127.0.0.1:{port}", "--connect-timeout", "0.2"]
    assert await run(argv) == 1
    assert f"cannot connect to 127.0.0.1:{port}" in capsys.readouterr().err


async def test_unreadable_file_is_a_readable_error(tmp_path: Path, capsys):
    bogus = tmp_path / "notes.wav"
    bogus.write_text("not audio")
    assert await run(["recognize", str(bogus)]) == 1
    assert capsys.readouterr().err.startswith(f"error: {bogus}: ")


async def run_into_a_closed_pipe(argv: list[str]) -> tuple[int | None, str, float]:
    """``python -m asr_client ARGV | true``: stdout a pipe whose reader has gone, as with
    ``| head -1`` once it has its line; the exit status, stderr and seconds taken."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    t0 = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "asr_client", *argv,
            stdout=write_end, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
    finally:
        os.close(write_end)
    try:
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return proc.returncode, err.decode(), time.monotonic() - t0


@pytest.mark.parametrize(
    "flags",
    [
        ["file", "--speed", "1", "--verbose"],  # the reader goes away mid-stream
        ["file", "--fast", "--json-out", "-"],
        ["recognize"],
    ],
)
async def test_a_reader_that_goes_away_ends_the_command_quietly(
    make_server, tmp_path: Path, flags: list[str]
) -> None:  # type: ignore[no-untyped-def]
    server = await make_server(engine_factory=lambda s: FakeEngine())
    path = tmp_path / "long.wav"  # 20 s: the tone at once, then silence
    soundfile.write(path, np.concatenate([speech_like()[RATE:], np.zeros(17 * RATE)]), RATE)
    command, *rest = flags
    argv = [command, str(path), "--server", f"127.0.0.1:{server.port}", *rest]
    code, err, took = await run_into_a_closed_pipe(argv)
    assert (code, err) == (141, "")  # no traceback: 128 + SIGPIPE, as `cat` killed by it
    assert took < 10  # not the 20 s the paced file takes to send
    await eventually(lambda: server.servicer.active == 0)  # the call ended with the client


@pytest.mark.parametrize(
    "flags",
    [
        ["--fast", "--speed", "2"],
        ["--speed", "0"],
        ["--chunk-ms", "1"],
        ["--turn-threshold", "1.5"],
        ["--turn-threshold", "nan"],
        ["--silence-ms", "-5"],  # a uint32 in the config: it used to raise a traceback
        ["--silence-ms", "4294967296"],
    ],
)
def test_usage_errors_exit_2(flags: list[str], capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["file", "x.wav", *flags])
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_silence_ms_takes_the_servers_range_or_0() -> None:
    for value in (0, 100, 10_000):
        args = build_parser().parse_args(["file", "x.wav", "--silence-ms", str(value)])
        assert args.silence_ms == value


@pytest.mark.parametrize("flags", [["--speed", "0"], ["--chunk-ms", "0"], ["--speed", "-1"]])
def test_load_usage_errors_exit_2(flags: list[str], capsys):
    # --speed 0 used to divide by zero once the calls had started
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["load", *flags])
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["file", "x.wav", "--chunk-ms", "abc"],
            "argument --chunk-ms: 'abc' is not a whole number",
        ),
        (["file", "x.wav", "--silence-ms", "1.5"], "argument --silence-ms: '1.5' is not a whole"),
        # the help's range, told before a connection (the server refused it after one)
        (["mic", "--silence-ms", "50"], "argument --silence-ms: must be 0 or 100 to 10000 ms"),
        (["mic", "--rate", "16k"], "argument --rate: '16k' is not a whole number"),
        (["file", "x.wav", "--speed", "fast"], "argument --speed: 'fast' is not a number"),
    ],
)
def test_a_bad_number_is_named_as_such(argv: list[str], message: str, capsys) -> None:  # type: ignore[no-untyped-def]
    # argparse names a type function it gets a ValueError from: "invalid parse value"
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "invalid" not in err


def test_turn_threshold_reaches_the_config() -> None:
    from asr_client.cli import streaming_config

    args = build_parser().parse_args(
        ["file", "x.wav", "--endpointing", "semantic", "--turn-threshold", "0.9"]
    )
    config = streaming_config(args, sample_rate_hz=16_000, channels=1)
    assert config.endpointing.mode == asr_pb2.EndpointingConfig.SEMANTIC
    assert config.endpointing.turn_threshold == pytest.approx(0.9)


# -- pieces -------------------------------------------------------------------------------


@pytest.mark.parametrize("subtype", ["FLOAT", "PCM_24", "PCM_16"])
def test_load_audio_converts_to_int16(tmp_path: Path, subtype: str):
    path = tmp_path / "audio.wav"
    soundfile.write(path, np.array([0.0, 0.5, -0.5, 1.0]), 8000, subtype=subtype)
    audio = load_audio(path)
    assert audio.sample_rate_hz == 8000 and audio.channels == 1
    assert audio.frames.dtype == np.int16
    assert audio.frames[:, 0].tolist() == [0, 16384, -16384, 32767]


def test_a_float_files_broken_samples_are_silence_or_full_scale(tmp_path: Path):
    # NaN used to reach numpy's int cast: a RuntimeWarning on the user's terminal and
    # whatever integer the cast made of it
    path = tmp_path / "broken.wav"
    samples = np.array([0.25, np.nan, np.inf, -np.inf, -0.25], dtype=np.float32)
    soundfile.write(path, samples, 8000, subtype="FLOAT")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        audio = load_audio(path)
    assert audio.frames[:, 0].tolist() == [8192, 0, 32767, -32768, -8192]


def test_converting_a_long_recording_takes_little_more_than_its_result() -> None:
    """Each step of the conversion copied the whole float array: a 30-minute stereo file
    peaked at 8x its int16 size before a byte was sent."""
    import tracemalloc

    from asr_client.audio_files import to_int16

    rng = np.random.default_rng(0)
    samples = rng.uniform(-1.2, 1.2, (2_000_000, 2)).astype(np.float32)  # 16 MB
    samples[::1000] = np.nan
    expected = np.clip(np.rint(np.nan_to_num(samples) * 32768.0), -32768, 32767)
    tracemalloc.start()
    try:
        converted = to_int16(samples)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert np.array_equal(converted, expected.astype(np.int16))
    # the int16 result (8 MB), and a few MB for a block besides it, not whole copies (48 MB)
    assert peak < converted.nbytes + 4_000_000, peak


def test_a_wav_whose_header_sizes_were_never_written_is_read_whole(tmp_path: Path):
    """A recorder killed before it wrote its header's sizes leaves them 0: libsndfile reads
    no frames, ffmpeg (PyAV) reads them all; it must not be called empty."""
    path = tmp_path / "cut.wav"
    soundfile.write(path, speech_like(), RATE, subtype="PCM_16")
    raw = bytearray(path.read_bytes())
    data = raw.index(b"data")
    raw[4:8] = raw[data + 4 : data + 8] = bytes(4)  # RIFF and data sizes: 0
    path.write_bytes(bytes(raw))
    audio = load_audio(path)
    assert len(audio.frames) == len(speech_like())


def tone_at(rate: int, seconds: float, hz: float, channels: int = 1) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return np.stack([0.3 * np.sin(2 * np.pi * hz * (c + 1) * t) for c in range(channels)], 1)


def dominant_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples.astype(float) * np.hanning(samples.size)))
    return float(np.argmax(spectrum) * rate / samples.size)


@pytest.mark.parametrize(
    ("fmt", "subtype", "rate"),
    [("OGG", "VORBIS", 16_000), ("OGG", "OPUS", 48_000), ("MP3", "MPEG_LAYER_III", 16_000)],
)
def test_files_joined_end_to_end_are_read_whole(
    tmp_path: Path, fmt: str, subtype: str, rate: int
) -> None:
    """A chained Ogg (Icecast records them so) or MP3s joined with cat: libsndfile read
    the first part only, silently, and the rest of the recording was never sent."""
    joined = b""
    for i, (seconds, hz) in enumerate([(3.0, 300.0), (5.0, 500.0)]):
        part = tmp_path / f"part{i}.{fmt.lower()}"
        soundfile.write(part, tone_at(rate, seconds, hz), rate, format=fmt, subtype=subtype)
        joined += part.read_bytes()
    path = tmp_path / f"joined.{fmt.lower()}"
    path.write_bytes(joined)
    audio = load_audio(path)
    assert 7.9 < len(audio.frames) / audio.sample_rate_hz < 8.3
    late = audio.frames[int(6.0 * audio.sample_rate_hz) :][: audio.sample_rate_hz, 0]
    assert abs(dominant_hz(late, audio.sample_rate_hz) - 500) < 10


def test_packets_the_decoder_skips_are_said(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    """Packets the decoder refuses are skipped (a joined file's header is one), but a
    damaged file's gaps were closed up silently: its audio came out shorter, unsaid."""
    rate = 16_000
    clean = tmp_path / "clean.mp3"
    soundfile.write(clean, tone_at(rate, 5.0, 500.0), rate, format="MP3", subtype="MPEG_LAYER_III")
    with caplog.at_level("WARNING", logger="asr_client.audio_files"):
        load_audio(clean)
    assert caplog.records == []
    damaged = bytearray(clean.read_bytes())
    rng = np.random.default_rng(0)
    for at in range(2000, len(damaged) - 2000, 1500):
        damaged[at : at + 40] = rng.integers(0, 256, 40, dtype=np.uint8).tobytes()
    path = tmp_path / "damaged.mp3"
    path.write_bytes(bytes(damaged))
    with caplog.at_level("WARNING", logger="asr_client.audio_files"):
        audio = load_audio(path)
    assert len(audio.frames) < 5 * rate
    (record,) = caplog.records
    assert re.fullmatch(
        rf"{re.escape(str(path))}: [1-9]\d* packet\(s\) the decoder could not read were"
        r" skipped \(a joined file's header is one; more means the file is damaged\)",
        record.getMessage(),
    ), record.getMessage()


def test_a_chained_oggs_links_in_other_formats_come_out_in_the_first_ones(
    tmp_path: Path,
) -> None:
    rate = 16_000
    first, second = tmp_path / "a.ogg", tmp_path / "b.ogg"
    soundfile.write(first, tone_at(rate, 3.0, 300.0), rate, format="OGG", subtype="OPUS")
    stereo = np.repeat(tone_at(44_100, 5.0, 500.0), 2, axis=1)
    soundfile.write(second, stereo, 44_100, format="OGG", subtype="VORBIS")
    path = tmp_path / "chained.ogg"
    path.write_bytes(first.read_bytes() + second.read_bytes())
    audio = load_audio(path)
    assert (audio.sample_rate_hz, audio.channels) == (rate, 1)
    assert 7.9 < len(audio.frames) / rate < 8.1
    assert abs(dominant_hz(audio.frames[6 * rate : 7 * rate, 0], rate) - 500) < 10


def test_an_ogg_file_keeps_its_rate_channel_order_and_length(tmp_path: Path) -> None:
    """As libsndfile reads them: FFmpeg (which read every Ogg for a while) decodes Opus at
    48 kHz whatever the file's rate (3x the bytes for a 16 kHz voice note), puts a 3+
    channel Vorbis file's channels in its own order, and ends Vorbis off its length."""
    opus = tmp_path / "note.ogg"
    soundfile.write(opus, tone_at(16_000, 3.0, 300.0), 16_000, format="OGG", subtype="OPUS")
    audio = load_audio(opus)
    assert audio.sample_rate_hz == 16_000 and len(audio.frames) == 48_000
    vorbis = tmp_path / "three.ogg"
    frames = 16_000 * 3 + 123
    offsets = np.tile([0.0, 0.2, 0.4], (frames, 1))  # each channel told by its level
    soundfile.write(vorbis, offsets, 16_000, format="OGG", subtype="VORBIS")
    audio = load_audio(vorbis)
    assert len(audio.frames) == frames
    levels = audio.frames[1000:-1000].mean(axis=0) / 32768
    assert np.allclose(levels, [0.0, 0.2, 0.4], atol=0.02), levels


def test_ogg_links_are_cut_where_a_page_begins_a_new_stream(tmp_path: Path) -> None:
    from asr_client.audio_files import ogg_links

    parts = []
    for i in range(3):
        part = tmp_path / f"{i}.ogg"
        soundfile.write(part, tone_at(8_000, 1.0 + i, 300.0), 8_000, format="OGG", subtype="VORBIS")
        parts.append(part.read_bytes())
    assert ogg_links(b"".join(parts)) == parts
    assert ogg_links(parts[0]) == [parts[0]]
    assert ogg_links(parts[0][:-7]) == [parts[0][:-7]]  # cut short: not walked, one link


@pytest.mark.parametrize(
    ("first", "second"),
    [((16_000, "mono"), (16_000, "stereo")), ((16_000, "mono"), (44_100, "mono"))],
)
def test_a_file_whose_layout_or_rate_changes_part_way_is_read_in_the_first(
    tmp_path: Path, first: tuple[int, str], second: tuple[int, str]
) -> None:
    """Joined ADTS AAC (only PyAV reads it) whose second part has another layout or rate:
    PyAV's one resampler refused the second part ("Frame does not match AudioResampler
    setup") and the file was called unreadable."""
    import av

    joined = b""
    for i, ((rate, layout), hz) in enumerate([(first, 300.0), (second, 500.0)]):
        part = tmp_path / f"part{i}.aac"
        channels = av.AudioLayout(layout).nb_channels
        samples = tone_at(rate, 2.0, hz, channels).T.astype(np.float32)
        with av.open(str(part), "w", format="adts") as container:
            stream = container.add_stream("aac", rate=rate, layout=layout)
            for at in range(0, samples.shape[1], 1024):
                frame = av.AudioFrame.from_ndarray(
                    np.ascontiguousarray(samples[:, at : at + 1024]), format="fltp", layout=layout
                )
                frame.sample_rate, frame.pts = rate, at
                for packet in stream.encode(frame):
                    container.mux(packet)
            for packet in stream.encode(None):
                container.mux(packet)
        joined += part.read_bytes()
    path = tmp_path / "joined.aac"
    path.write_bytes(joined)
    audio = load_audio(path)
    assert audio.sample_rate_hz == first[0] and audio.channels == 1
    assert 3.9 < len(audio.frames) / first[0] < 4.4
    late = audio.frames[int(3.0 * first[0]) :][: first[0] // 2, 0]
    assert abs(dominant_hz(late, first[0]) - 500) < 10


def test_an_empty_file_is_said_to_be_empty_once(tmp_path: Path):
    path = tmp_path / "empty.wav"
    soundfile.write(path, np.zeros(0, np.int16), 16_000, subtype="PCM_16")
    with pytest.raises(AudioFileError) as caught:
        load_audio(path)
    assert str(caught.value) == f"{path}: the file holds no audio"


def test_load_audio_keeps_stereo_interleaved(stereo_wav: Path):
    audio = load_audio(stereo_wav)
    assert audio.frames.shape == (int(3.5 * RATE), 2)
    assert audio.duration_s == pytest.approx(3.5)
    assert np.abs(audio.frames[:, 1]).max() == 0 and np.abs(audio.frames[:, 0]).max() > 9000
    pcm = np.frombuffer(audio.to_bytes(), dtype="<i2")
    assert pcm[0::2].tolist() == audio.frames[:, 0].tolist()  # L R L R …


def test_chunks_cover_the_audio_in_chunk_ms_pieces():
    audio = PcmAudio(np.arange(2 * 2500, dtype=np.int16).reshape(-1, 2), 10_000)
    chunks = list(audio.chunks(100))
    assert [len(c) for c in chunks] == [4000, 4000, 2000]  # 1000 frames × 2 ch × 2 bytes
    assert b"".join(chunks) == audio.to_bytes()


def test_pyav_reads_what_soundfile_cannot(stereo_wav: Path, monkeypatch):
    expected = load_audio(stereo_wav)

    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Format not recognised")

    monkeypatch.setattr(soundfile, "read", refuse)
    audio = load_audio(stereo_wav)
    assert audio.sample_rate_hz == RATE
    assert np.array_equal(audio.frames, expected.frames)


def test_load_audio_rejects_missing_file(tmp_path: Path):
    with pytest.raises(AudioFileError, match="no such file"):
        load_audio(tmp_path / "nope.flac")


def test_load_audio_tells_a_directory_or_fifo_from_a_missing_file(tmp_path: Path):
    with pytest.raises(AudioFileError, match="is a directory, not an audio file"):
        load_audio(tmp_path)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    # not opened: opening a FIFO nobody writes to would block
    with pytest.raises(AudioFileError, match="not a regular file"):
        load_audio(fifo)


async def test_a_directory_is_a_readable_error(tmp_path: Path, capsys):
    assert await run(["recognize", str(tmp_path), "--server", "127.0.0.1:1"]) == 1
    assert capsys.readouterr().err == f"error: {tmp_path}: is a directory, not an audio file\n"


class RecordingStream:
    """Stands in for RecognitionStream: notes when each chunk was sent."""

    def __init__(self, stall_on: int, stall_s: float) -> None:
        self.sent_at: list[float] = []
        self.ended = False
        self._stall_on, self._stall_s = stall_on, stall_s

    async def send_audio(self, data: bytes) -> None:
        self.sent_at.append(time.monotonic())
        if len(self.sent_at) == self._stall_on + 1:
            # backpressure: a slow write must not push the rest of the schedule back
            await asyncio.sleep(self._stall_s)

    async def end(self) -> None:
        self.ended = True


async def test_send_paced_follows_an_absolute_schedule():
    audio = PcmAudio(np.zeros((800, 1), dtype=np.int16), 16_000)  # 5 chunks of 10 ms
    stream = RecordingStream(stall_on=1, stall_s=0.03)
    stats = StreamStats()
    t0 = time.monotonic()
    await send_paced(stream, audio, chunk_ms=10, speed=1.0, t0=t0, stats=stats)  # type: ignore[arg-type]
    assert stream.ended and stats.audio_sent_s == pytest.approx(0.05)
    for i, sent in enumerate(stream.sent_at):
        assert sent >= t0 + i * 0.01  # never early
    # after the 30 ms stall chunks 2 and 3 are overdue and go at once: no drift added
    assert stream.sent_at[3] - stream.sent_at[2] < 0.005


async def test_send_paced_keeps_time_with_chunks_of_a_fraction_of_a_sample(monkeypatch):
    """At 22050 Hz a 10 ms chunk is 220.5 samples, sent as 220: scheduled at i*10 ms the
    sender ran ahead of the audio by 8 s an hour. Each chunk goes when the audio before
    it would have been heard."""
    import types

    import asr_client.cli as cli

    clock = [0.0]

    async def sleep(seconds: float) -> None:
        clock[0] += seconds

    monkeypatch.setattr(cli, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(cli, "asyncio", types.SimpleNamespace(sleep=sleep))

    class ClockedStream:
        def __init__(self) -> None:
            self.sent: list[tuple[float, int]] = []  # (clock, frames)

        async def send_audio(self, data: bytes) -> None:
            self.sent.append((clock[0], len(data) // 2))

        async def end(self) -> None:
            pass

    rate = 22_050
    audio = PcmAudio(np.zeros((rate * 60, 1), dtype=np.int16), rate)
    stream, stats = ClockedStream(), StreamStats()
    await send_paced(stream, audio, chunk_ms=10, speed=1.0, t0=0.0, stats=stats)  # type: ignore[arg-type]
    before = 0
    for sent_at, frames in stream.sent:
        assert sent_at == pytest.approx(before / rate, abs=1e-6)
        before += frames
    assert before == len(audio.frames) and stats.audio_sent_s == pytest.approx(60)


def test_clock_and_final_line():
    assert clock(3.24) == "00:03.2" and clock(67.96) == "01:08.0" and clock(3725) == "1:02:05.0"
    result = asr_pb2.Result(is_final=True, text="hello there", start_s=3.2, end_s=7.9, channel=1)
    assert final_line(result) == "[00:03.2-00:07.9] ch1  hello there"


def test_plain_renderer_prints_only_finals_unless_verbose(tmp_path: Path):
    partial = asr_pb2.StreamingRecognizeResponse(result=asr_pb2.Result(text="a"))
    final = asr_pb2.StreamingRecognizeResponse(result=asr_pb2.Result(text="a b", is_final=True))
    started = asr_pb2.StreamingRecognizeResponse(
        speech_event=asr_pb2.SpeechEvent(type=asr_pb2.SpeechEvent.SPEECH_STARTED)
    )
    for verbose, expected in ((False, 1), (True, 3)):
        path = tmp_path / f"out-{verbose}.txt"
        with path.open("w") as out, PlainRenderer(out, verbose=verbose) as renderer:
            for response in (started, partial, final):
                renderer.event(response)
        lines = path.read_text().splitlines()
        assert len(lines) == expected and lines[-1].endswith("ch0  a b")


@pytest.mark.parametrize("command", ["file", "recognize", "mic", "load"])
def test_every_command_takes_the_connection_options(command: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from asr_client.connection import connection_from_args

    monkeypatch.setenv("ASR_TOKEN", "from-env")
    path = [] if command in ("mic", "load") else ["a.wav"]
    args = build_parser().parse_args(
        [command, *path, "--server", "asr.example:443", "--ca", "ca.pem", "--cert", "c.pem"]
        + ["--key", "k.pem", "--connect-timeout", "3"]
    )
    options = connection_from_args(args)
    assert options.target == "asr.example:443"
    assert options.uses_tls and str(options.ca_file) == "ca.pem"
    assert (str(options.cert_file), str(options.key_file)) == ("c.pem", "k.pem")
    assert options.token == "from-env"  # ASR_TOKEN when --token is not given
    assert options.connect_timeout_s == 3
    args = build_parser().parse_args([command, *path, "--tls", "--token", "explicit"])
    options = connection_from_args(args)
    assert options.uses_tls and options.ca_file is None and options.token == "explicit"
    assert options.call_metadata() == (("authorization", "Bearer explicit"),)


async def test_half_a_client_key_pair_is_a_readable_error(mono_wav: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    code = await run(["file", str(mono_wav), "--cert", "only-the-cert.pem"])
    assert code == 1
    assert "needs both --cert and --key" in capsys.readouterr().err


def test_every_event_gets_its_own_name_and_line() -> None:
    from asr_client.render import event_record, event_type

    Response = asr_pb2.StreamingRecognizeResponse
    eager = Response(result=asr_pb2.Result(text="hello there", unstable_text="hello there"))
    eager.result.eager = True
    resumed = Response(
        speech_event=asr_pb2.SpeechEvent(type=asr_pb2.SpeechEvent.SPEECH_RESUMED, offset_s=1.5)
    )
    turn = Response(
        end_of_turn=asr_pb2.EndOfTurn(
            offset_s=2.0, probability=0.99, reason=asr_pb2.EndOfTurn.FINALIZE
        )
    )
    assert [event_type(r) for r in (eager, resumed, turn, Response())] == [
        "eager",
        "speech_resumed",
        "end_of_turn",
        "progress",
    ]
    record = event_record(turn, recv_time=0.0, t=0.0)
    assert record["probability"] == 0.99 and record["reason"] == "finalize"
    out = io.StringIO()
    renderer = PlainRenderer(out, verbose=True)
    for response in (eager, resumed, turn):
        renderer.event(response)
    assert out.getvalue().splitlines() == [
        "[00:00.0-00:00.0] ch0 ? hello there",
        "[00:01.5] ch0  (speech resumed)",
        "[00:02.0] ch0  (end of turn: finalize)",
    ]


def test_the_live_view_says_what_ended_each_turn() -> None:
    from rich.console import Console

    from asr_client.render import LiveRenderer

    Response = asr_pb2.StreamingRecognizeResponse
    out = io.StringIO()
    renderer = LiveRenderer(Console(file=out, force_terminal=True, width=200))

    def final(
        text: str, utterance: int, *, from_finalize: bool = False, confidence: float = 0.9
    ) -> Response:
        r = asr_pb2.Result(is_final=True, text=text, utterance_id=utterance)
        r.from_finalize, r.confidence = from_finalize, confidence
        return Response(result=r)

    def turn_end(utterance: int, reason: int, p: float = 0.0) -> Response:
        return Response(
            end_of_turn=asr_pb2.EndOfTurn(utterance_id=utterance, reason=reason, probability=p)
        )

    with renderer:
        renderer.event(turn_end(0, asr_pb2.EndOfTurn.MODEL, 0.934))
        renderer.event(final("I want to fly home.", 0))
        renderer.event(turn_end(1, asr_pb2.EndOfTurn.MAX_SILENCE))
        renderer.event(final("Tomorrow.", 1))
        renderer.event(final("Hold on.", 2, from_finalize=True))  # a SILENCE stream's
        renderer.event(final("Yes.", 3))  # a pause ended it: nothing to add
        renderer.event(turn_end(4, asr_pb2.EndOfTurn.MODEL, 0.8))  # a noise, no final:
        no_words = asr_pb2.SpeechEvent(type=asr_pb2.SpeechEvent.NO_WORDS, utterance_id=4)
        renderer.event(Response(speech_event=no_words))  # its turn end is not kept
        renderer.event(turn_end(5, asr_pb2.EndOfTurn.REASON_UNSPECIFIED))  # an older server
        renderer.event(final("Right.", 5))
        renderer.event(final("Go on.", 6))  # the final first, then its turn's end
        renderer.event(turn_end(6, asr_pb2.EndOfTurn.MODEL, 0.9))
        renderer.event(final("Mm the fourth.", 7, confidence=0.42))  # the model doubts it
        renderer.event(final("Sure.", 8, confidence=0.0))  # a server that predates it
        # a resumed stream sends a turn's end again: it is on screen already
        renderer.event(turn_end(6, asr_pb2.EndOfTurn.MODEL, 0.9))
        renderer.event(turn_end(0, asr_pb2.EndOfTurn.MODEL, 0.934))
    lines = [line for line in out.getvalue().splitlines() if "ch0  " in line]
    text = [re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", line).split("ch0  ")[-1] for line in lines]
    assert text == [
        "I want to fly home.  ⏎ end of turn: model, 93 % sure",
        "Tomorrow.  ⏎ end of turn: longest pause",
        "Hold on.  ⏎ finalized",
        "Yes.",
        "Right.  ⏎ end of turn: the server",
        "Go on.",
        "⏎ end of turn: model, 90 % sure",
        "Mm the fourth.  (unsure: 42 %)",
        "Sure.",
    ]
    assert renderer._turn_ends == {}


def test_the_live_view_drops_a_partial_that_no_final_will_replace() -> None:
    from rich.console import Console

    from asr_client.render import LiveRenderer

    Response = asr_pb2.StreamingRecognizeResponse
    no_words = asr_pb2.SpeechEvent.NO_WORDS
    renderer = LiveRenderer(Console(file=io.StringIO(), force_terminal=True))
    with renderer:
        renderer.event(Response(result=asr_pb2.Result(text="Thank you.", utterance_id=3)))
        # another utterance's NO_WORDS (or none shown at all) leaves it alone
        renderer.event(Response(speech_event=asr_pb2.SpeechEvent(type=no_words, utterance_id=2)))
        assert renderer._partials[0].text == "Thank you."
        renderer.event(Response(speech_event=asr_pb2.SpeechEvent(type=no_words, utterance_id=3)))
        assert renderer._partials == {}
        renderer.event(Response(speech_event=asr_pb2.SpeechEvent(type=no_words, utterance_id=4)))


def test_the_live_view_keeps_the_next_utterances_partial_at_a_final() -> None:
    """A final replaces its own utterance's live line, not the one of the utterance after
    it, which a split at a pause may have under way before the final arrives."""
    from rich.console import Console

    from asr_client.render import LiveRenderer

    Response = asr_pb2.StreamingRecognizeResponse
    renderer = LiveRenderer(Console(file=io.StringIO(), force_terminal=True))
    with renderer:
        renderer.event(Response(result=asr_pb2.Result(text="and the", utterance_id=4)))
        final = asr_pb2.Result(text="It was late.", utterance_id=3, is_final=True)
        renderer.event(Response(result=final))
        assert renderer._partials[0].text == "and the"
        final = asr_pb2.Result(text="And then?", utterance_id=4, is_final=True)
        renderer.event(Response(result=final))
        assert renderer._partials == {}


@pytest.mark.parametrize(
    ("flag", "value"), [("--duration", "inf"), ("--duration", "nan"), ("--ramp", "-3")]
)
def test_load_seconds_that_cannot_be_are_usage_errors(flag: str, value: str, capsys) -> None:  # type: ignore[no-untyped-def]
    """--duration inf built its call in memory without end; a negative ramp ran as none."""
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["load", flag, value])
    assert exc.value.code == 2
    assert "must be a finite number of seconds" in capsys.readouterr().err


def test_load_report_path_that_cannot_be_written_is_a_usage_error(tmp_path: Path, capsys):
    """Found only after the whole run, it used to end in a traceback and lose the report."""
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["load", "--json", str(tmp_path / "missing" / "r.json")])
    assert exc.value.code == 2
    assert "cannot write" in capsys.readouterr().err
    assert not (tmp_path / "missing").exists()
    # a path that can be written is left as it was found
    build_parser().parse_args(["load", "--json", str(tmp_path / "r.json")])
    assert not (tmp_path / "r.json").exists()


async def test_load_report_that_cannot_be_written_at_the_end_is_still_printed(
    server: str, tmp_path: Path, capsys
):
    from asr_client.load.command import load_command

    folder = tmp_path / "reports"
    folder.mkdir()
    args = build_parser().parse_args(
        ["load", "--server", server, "--streams", "0", "--silent", "1", "--duration", "1",
         "--speed", "10", "--ramp", "0", "--quiet", "--json", str(folder / "r.json")]
    )  # fmt: skip
    folder.rmdir()  # gone while the calls ran
    code = await load_command(args, sys.stdout, sys.stderr)
    out, err = capsys.readouterr()
    assert code == 1
    assert "completed" in out  # the text report
    assert f"error: cannot write {folder / 'r.json'}: " in err


async def test_load_of_a_recording_too_short_to_hold_a_word_is_refused(
    server: str, tmp_path: Path, capsys
):
    """One 48 kHz sample is no sample at 16 kHz: with --pause 0:0 building the call never
    ended (nor let SIGTERM end the command), its lists growing without bound."""
    from asr_client.load.command import load_command

    soundfile.write(tmp_path / "blip.wav", np.full(1, 1000, np.int16), 48_000)
    args = build_parser().parse_args(
        ["load", "--server", server, "--streams", "1", "--duration", "5", "--pause", "0:0",
         "--quiet", str(tmp_path / "blip.wav")]
    )  # fmt: skip
    async with asyncio.timeout(20):
        code = await load_command(args, sys.stdout, sys.stderr)
    assert code == 1  # as for a recording that cannot be read
    err = capsys.readouterr().err
    assert "blip.wav: 0.00 s of audio at 16000 Hz; a recording needs at least 0.1 s" in err


def test_json_lines_carry_the_documented_fields_of_each_event() -> None:
    """The README's fields of finals, eager results, SPEECH_ENDED and GoingAway reach
    ``--json-out``; GoingAway used to be written as a bare progress record."""
    from asr_client.render import event_record

    Response = asr_pb2.StreamingRecognizeResponse
    final = Response(
        result=asr_pb2.Result(is_final=True, text="hallo", language="de", language_probability=0.93)
    )
    eager = Response(result=asr_pb2.Result(eager=True, text="yes", turn_probability=0.88))
    ended = Response(
        speech_event=asr_pb2.SpeechEvent(
            type=asr_pb2.SpeechEvent.SPEECH_ENDED, offset_s=2.0, from_finalize=True
        )
    )
    going = Response(going_away=asr_pb2.GoingAway(deadline_s=25.0, reason="draining"))
    records = [event_record(r, recv_time=0.0, t=0.0) for r in (final, eager, ended, going)]
    assert records[0]["language_probability"] == 0.93
    assert records[1]["turn_probability"] == 0.88
    assert records[2]["type"] == "speech_ended" and records[2]["from_finalize"] is True
    assert records[3]["type"] == "going_away"
    assert (records[3]["deadline_s"], records[3]["reason"]) == (25.0, "draining")
    # the first utterance is 0; a FINALIZED before any utterance names none (null)
    finalized = Response(speech_event=asr_pb2.SpeechEvent(type=asr_pb2.SpeechEvent.FINALIZED))
    assert event_record(finalized, recv_time=0.0, t=0.0)["utterance_id"] is None
    finalized.speech_event.utterance_id = 0
    assert event_record(finalized, recv_time=0.0, t=0.0)["utterance_id"] == 0
    assert records[2]["utterance_id"] == 0  # unset on another event: 0, as servers sent it
    # a going-away is not a speech event to show
    out = io.StringIO()
    PlainRenderer(out, verbose=True).event(going)
    assert out.getvalue() == ""


async def test_sigterm_ends_the_file_command_and_gives_the_terminal_back(
    server: str, mono_wav: Path
) -> None:
    """SIGTERM (timeout, kill) used to kill the command where it stood: on a terminal the
    live view had hidden the cursor and never showed it again. It ends now as Ctrl-C
    does, with 143."""
    import pty
    import signal

    leader, follower = pty.openpty()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "asr_client",
        "file",
        str(mono_wav),
        "--server",
        server,
        stdin=follower,
        stdout=follower,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "80"},
    )
    os.close(follower)
    screen = b""
    try:
        while b"\x1b[?25l" not in screen:  # the live view is up: the cursor hidden
            screen += await asyncio.wait_for(asyncio.to_thread(os.read, leader, 4096), 20)
        process.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(process.communicate(), 20)
        with contextlib.suppress(OSError):  # (EIO once the child has gone)
            while chunk := os.read(leader, 4096):
                screen += chunk
    finally:
        os.close(leader)
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 143, err
    assert err.decode().splitlines()[-1] == "terminated"
    assert screen.rfind(b"\x1b[?25h") > screen.rfind(b"\x1b[?25l"), screen[-200:]


async def test_paths_may_start_at_home(
    server: str, mono_wav: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No shell expands ``~`` after ``--json-out=``, nor in a systemd unit or a Kubernetes
    ``args:`` list: the command looked for a folder named ``~`` and said "no such file"."""
    monkeypatch.setenv("HOME", str(tmp_path))
    code = await run(
        ["file", "~/tone.wav", "--server", server, "--fast", "--json-out=~/events.jsonl"]
    )
    assert code == 0
    assert "final" in [e["type"] for e in read_events(tmp_path / "events.jsonl")]
    flags = ["--ca=~/ca.pem", "--cert=~/c.pem", "--key=~/k.pem"]
    args = build_parser().parse_args(["file", "~/tone.wav", *flags])
    assert (args.path, args.ca, args.cert, args.key) == (
        mono_wav,
        tmp_path / "ca.pem",
        tmp_path / "c.pem",
        tmp_path / "k.pem",
    )
    args = build_parser().parse_args(["mic", "--save-audio=~/a.wav", "--save-transcript=~/t"])
    assert (args.save_audio, args.save_transcript) == (tmp_path / "a.wav", tmp_path / "t")
    # empty (a wrapper's unset variable): nothing saved, as before, not a write to "."
    args = build_parser().parse_args(["mic", "--save-audio=", "--save-transcript", ""])
    assert (args.save_audio, args.save_transcript) == (None, None)
    args = build_parser().parse_args(["load", "~/tone.wav", "--corpus=~/c", "--json=~/r.json"])
    assert (args.files, args.corpus, args.json) == (
        [str(mono_wav)],
        str(tmp_path / "c"),
        str(tmp_path / "r.json"),
    )
