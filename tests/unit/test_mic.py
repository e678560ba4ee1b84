"""``asr-client mic`` logic with a scripted fake sounddevice: device choice, rate fallback,
the level meter, the thread → asyncio hand-off, plain errors, and Ctrl-C flushing the last
final (against the real server running the fake engine). The real PortAudio path is
tests/integration/test_mic_real.py."""

from __future__ import annotations

import asyncio
import importlib.abc
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import soundfile

from asr_client.cli import run
from asr_client.mic import (
    SILENCE_DBFS,
    CaptureFormat,
    InputDevice,
    MicCapture,
    MicError,
    choose_format,
    import_sounddevice,
    input_devices,
    level_dbfs,
    meter_bar,
    select_device,
)
from asr_server.app import start_server
from asr_server.engine.fake import FakeEngine
from asr_server.settings import Settings

# -- a fake sounddevice -------------------------------------------------------------------


class PortAudioError(Exception):
    pass


class FakeStream:
    """Feeds ``script`` (frames × channels int16) to the callback from its own thread, one
    block at a time, then calls ``when_done`` (the test's stand-in for the user)."""

    def __init__(self, sd: FakeSoundDevice, **kwargs: Any) -> None:
        self.sd = sd
        self.kwargs = kwargs
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._feed, daemon=True)

    def _feed(self) -> None:
        block, script = self.kwargs["blocksize"], self.sd.script
        for start in range(0, len(script), block):
            if self._stopped.is_set():
                break
            status = SimpleNamespace(input_overflow=False)
            self.kwargs["callback"](script[start : start + block], block, None, status)
        if self.sd.when_done is not None:
            self.sd.when_done()
        self._stopped.wait(10)
        self.kwargs["finished_callback"]()

    def start(self) -> None:
        self.sd.opened.append(self.kwargs)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()

    def close(self) -> None:
        pass


class FakeSoundDevice:
    """What mic.py uses of the sounddevice module. ``rates[i]``: the rates device i accepts."""

    PortAudioError = PortAudioError

    def __init__(
        self,
        devices: list[dict[str, Any]],
        *,
        default: int = 0,
        rates: dict[int, set[int]] | None = None,
        mono: bool = True,
        script: np.ndarray | None = None,
        when_done: Callable[[], None] | None = None,
    ) -> None:
        self._devices = devices
        self.default = SimpleNamespace(device=[default, -1])
        self.rates = rates or {}
        self.mono = mono
        self.script = script if script is not None else np.zeros((0, 1), np.int16)
        self.when_done = when_done
        self.opened: list[dict[str, Any]] = []

    def query_hostapis(self) -> list[dict[str, Any]]:
        return [{"name": "Fake API"}]

    def query_devices(self, device: int | None = None, kind: str | None = None) -> Any:
        if kind == "input":
            index = self.default.device[0]
            if index < 0:
                raise PortAudioError("Error querying device -1")
            return {**self._devices[index], "index": index}
        return self._devices

    def check_input_settings(self, *, device: int, samplerate: int, channels: int, dtype: str):
        assert dtype == "int16"
        if samplerate not in self.rates.get(device, {16_000}):
            raise PortAudioError("Invalid sample rate [PaErrorCode -9997]")
        if channels == 1 and not self.mono:
            raise PortAudioError("Invalid number of channels [PaErrorCode -9998]")

    def InputStream(self, **kwargs: Any) -> FakeStream:  # noqa: N802 - sounddevice's name
        return FakeStream(self, **kwargs)


def device(name: str, inputs: int = 2, rate: float = 44_100.0) -> dict[str, Any]:
    return {
        "name": name,
        "hostapi": 0,
        "max_input_channels": inputs,
        "max_output_channels": 2,
        "default_samplerate": rate,
    }


DEVICES = [
    device("HDA Intel PCH: ALC257 Analog (hw:0,0)"),
    device("HDMI 0", inputs=0),
    device("USB Headset: Audio (hw:1,0)", inputs=1, rate=48_000.0),
    device("pulse"),
    device("default"),
]


def speech_like(rate: int, seconds: float = 1.5) -> np.ndarray:
    """0.5 s of silence then a loud tone (the fake engine hears a word per 0.25 s of it)."""
    t = np.arange(int(seconds * rate)) / rate
    tone = (0.3 * 32767 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
    return np.concatenate([np.zeros(rate // 2, np.int16), tone]).reshape(-1, 1)


# -- devices and formats ------------------------------------------------------------------


def test_input_devices_skip_outputs_and_mark_the_default():
    devices = input_devices(FakeSoundDevice(DEVICES, default=4))
    assert [d.index for d in devices] == [0, 2, 3, 4]
    assert [d.is_default for d in devices] == [False, False, False, True]
    assert devices[1] == InputDevice(2, "USB Headset: Audio (hw:1,0)", "Fake API", 1, 48_000)
    assert devices[3].describe() == "*   4  default  (Fake API, 2 ch, default 44100 Hz)"


@pytest.mark.parametrize(
    ("spec", "index"),
    [(None, 4), ("2", 2), ("usb", 2), ("PULSE", 3), ("default", 4), (" 0", 0)],
)
def test_select_device(spec: str | None, index: int):
    devices = input_devices(FakeSoundDevice(DEVICES, default=4))
    assert select_device(devices, spec).index == index


def test_exact_name_beats_substring():
    devices = input_devices(FakeSoundDevice([device("pulse"), device("pulse monitor")]))
    assert select_device(devices, "pulse").index == 0
    assert select_device(devices, "monitor").index == 1


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("1", "no input device with index 1"),  # HDMI: output only
        ("9", "no input device with index 9"),
        ("bluetooth", "no input device matches 'bluetooth'"),
        ("hw:", "'hw:' matches several input devices (0: HDA Intel"),
    ],
)
def test_select_device_errors_are_plain(spec: str, message: str):
    with pytest.raises(MicError, match="^" + message.replace("(", r"\(")):
        select_device(input_devices(FakeSoundDevice(DEVICES)), spec)


def test_no_default_device_takes_the_first_input_and_none_is_an_error():
    assert select_device(input_devices(FakeSoundDevice(DEVICES, default=-1)), None).index == 0
    with pytest.raises(MicError, match="no audio input device found"):
        select_device(input_devices(FakeSoundDevice([device("HDMI", inputs=0)])), None)


def test_16k_is_preferred_when_the_device_offers_it():
    sd = FakeSoundDevice(DEVICES, rates={0: {16_000, 44_100, 48_000}})
    fmt = choose_format(sd, input_devices(sd)[0])
    assert (fmt.rate, fmt.channels, fmt.blocksize) == (16_000, 1, 1600)


def test_a_device_without_16k_is_recorded_at_its_own_rate():
    sd = FakeSoundDevice(DEVICES, rates={2: {48_000}})
    fmt = choose_format(sd, input_devices(sd)[1], chunk_ms=50)
    assert (fmt.rate, fmt.channels, fmt.blocksize) == (48_000, 1, 2400)


def test_a_default_rate_above_48k_falls_back_to_a_common_rate():
    sd = FakeSoundDevice([device("studio", rate=96_000.0)], rates={0: {96_000, 44_100}})
    assert choose_format(sd, input_devices(sd)[0]).rate == 44_100


def test_a_stereo_only_device_is_opened_stereo():
    sd = FakeSoundDevice(DEVICES, rates={0: {16_000}}, mono=False)
    assert choose_format(sd, input_devices(sd)[0]).channels == 2


def test_an_explicit_rate_is_checked_and_not_replaced():
    sd = FakeSoundDevice(DEVICES, rates={0: {16_000}})
    with pytest.raises(MicError, match=r"accepts none of the rates tried \(22050 Hz x1: Invalid"):
        choose_format(sd, input_devices(sd)[0], rate=22_050)


# -- level meter --------------------------------------------------------------------------


def test_level_dbfs():
    t = np.arange(16_000) / 16_000
    full = (32767 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
    assert level_dbfs(full) == pytest.approx(-3.01, abs=0.05)  # a full-scale sine
    assert level_dbfs(full // 10) == pytest.approx(-23.01, abs=0.1)
    assert level_dbfs(np.zeros(160, np.int16)) == SILENCE_DBFS
    assert level_dbfs(np.zeros(0, np.int16)) == SILENCE_DBFS
    assert level_dbfs(np.full(10, -32768, np.int16)) == pytest.approx(0.0)


def test_meter_bar():
    assert meter_bar(0.0, width=10) == "█" * 10
    assert meter_bar(-30.0, width=10) == "█" * 5 + "░" * 5
    assert meter_bar(SILENCE_DBFS, width=10) == "░" * 10
    assert meter_bar(6.0, width=10) == "█" * 10


# -- the thread → asyncio hand-off --------------------------------------------------------


async def test_capture_delivers_every_block_in_order_mixed_to_mono():
    left = np.arange(4800, dtype=np.int16)
    script = np.stack([left, left + 2], axis=1)  # stereo; the mix is left + 1
    sd = FakeSoundDevice(DEVICES, script=script)
    fmt = CaptureFormat(input_devices(sd)[0], 16_000, 2, 100)
    levels: list[float] = []
    async with MicCapture(sd, fmt, on_chunk=lambda c: levels.append(c.dbfs)) as mic:
        received = []
        async for chunk in mic:
            received.append(np.frombuffer(chunk.pcm, "<i2"))
            if len(received) == 3:
                await mic.stop()
    assert np.array_equal(np.concatenate(received), left + 1)
    assert len(levels) == 3 and mic.dropped == 0 and mic.error is None


async def test_a_full_queue_drops_and_counts_instead_of_growing():
    sd = FakeSoundDevice(DEVICES, script=np.ones((16_000, 1), np.int16))  # 10 chunks
    fmt = CaptureFormat(input_devices(sd)[0], 16_000, 1, 100)
    done = threading.Event()
    sd.when_done = done.set
    async with MicCapture(sd, fmt, max_queue_s=0.4) as mic:
        # nobody reads while the device delivers everything
        while not done.is_set():  # noqa: ASYNC110 - the fake device's thread offers no event
            await _tick()
        await mic.stop()
        received = [chunk async for chunk in mic]
    assert len(received) == 4 and mic.dropped == 6


async def test_a_device_that_stops_by_itself_is_reported():
    sd = FakeSoundDevice(DEVICES, script=np.ones((3200, 1), np.int16))
    fmt = CaptureFormat(input_devices(sd)[0], 16_000, 1, 100)
    mic = MicCapture(sd, fmt)
    await mic.start()
    mic._stream._stopped.set()  # the device goes away: the stream finishes on its own
    received = [chunk async for chunk in mic]
    assert len(received) <= 2
    assert mic.error == (
        "the input device 'HDA Intel PCH: ALC257 Analog (hw:0,0)' stopped delivering audio"
    )
    await mic.__aexit__(None, None, None)


async def _tick() -> None:
    await asyncio.sleep(0.001)


# -- plain errors -------------------------------------------------------------------------


class _RaiseOnImport(importlib.abc.MetaPathFinder):
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def find_spec(self, name: str, path: object, target: object = None) -> None:
        if name == "sounddevice":
            raise self.exc
        return None


@pytest.mark.parametrize(
    ("exc", "message"),
    [
        (OSError("PortAudio library not found"), "error: the PortAudio library is not installed"),
        (
            ImportError("No module named 'sounddevice'"),
            "error: the microphone needs the sounddevice package",
        ),
    ],
)
async def test_missing_portaudio_or_sounddevice_is_one_plain_line(
    exc: Exception, message: str, monkeypatch, capsys
):
    monkeypatch.delitem(sys.modules, "sounddevice", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_RaiseOnImport(exc), *sys.meta_path])
    with pytest.raises(MicError):
        import_sounddevice()
    assert await run(["mic", "--server", "127.0.0.1:1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(message)
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("argv", [["mic"], ["mic", "--list-devices"]])
async def test_no_input_device_is_one_plain_line(argv: list[str], monkeypatch, capsys):
    sd = FakeSoundDevice([device("HDMI", inputs=0)], default=-1)
    monkeypatch.setitem(sys.modules, "sounddevice", sd)
    assert await run([*argv, "--server", "127.0.0.1:1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: no audio input device found") and err.count("\n") == 1


async def test_list_devices(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "sounddevice", FakeSoundDevice(DEVICES, default=3))
    assert await run(["mic", "--list-devices"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line[:6] for line in lines] == ["    0 ", "    2 ", "*   3 ", "    4 "]


# -- the whole command against the server (fake engine) -----------------------------------


async def test_ctrl_c_flushes_the_final_of_the_utterance_in_progress(
    server: str, tmp_path: Path, monkeypatch, capsys
):
    # a device without 16 kHz: recorded at 44.1 kHz, declared as such; the fake engine hears
    # a word per 0.25 s *after the server's resampling*, so 1.5 s of tone is w0..w5 only if
    # the rate reached the server correctly
    script = speech_like(44_100)
    # the "user" presses Ctrl-C as soon as the last block is captured: the speech has not
    # ended, so only the half-close can produce its final
    sd = FakeSoundDevice(
        DEVICES,
        rates={0: {44_100}},
        script=script,
        when_done=lambda: signal.raise_signal(signal.SIGINT),
    )
    monkeypatch.setitem(sys.modules, "sounddevice", sd)
    transcript, audio = tmp_path / "transcript.txt", tmp_path / "audio.wav"
    argv = ["mic", "--server", server, "--device", "0", "--verbose"]
    argv += ["--save-transcript", str(transcript), "--save-audio", str(audio)]
    before = signal.getsignal(signal.SIGINT)
    assert await run(argv) == 0
    out, err = capsys.readouterr()
    assert sd.opened[0]["samplerate"] == 44_100 and sd.opened[0]["blocksize"] == 4410
    assert "listening on 0: HDA Intel PCH: ALC257 Analog (hw:0,0) (Fake API), 44100 Hz" in err
    assert "stopping: finishing the last utterance" in err
    assert err.splitlines()[-1] == "recorded 2.0 s; 1 final result(s)"
    assert "(speech started)" in out
    finals = [line for line in out.splitlines() if "  w0" in line]
    assert finals == [line for line in out.splitlines() if "~" not in line and "(" not in line]
    assert finals[-1].endswith("ch0  w0 w1 w2 w3 w4 w5"), out
    assert transcript.read_text().splitlines() == finals
    saved, rate = soundfile.read(audio, dtype="int16")
    assert rate == 44_100 and np.array_equal(saved, script[:, 0])
    # Ctrl-C is back to its usual meaning afterwards
    assert signal.getsignal(signal.SIGINT) == before


async def test_a_second_ctrl_c_quits_without_waiting(tmp_path: Path, monkeypatch, capsys):
    gate = threading.Event()  # the engine never answers until the test is over
    running = await start_server(
        Settings(host="127.0.0.1", port=0, metrics_port=0),
        engine_factory=lambda s: FakeEngine(gate=gate),
    )
    sd = FakeSoundDevice(DEVICES, script=speech_like(16_000))
    stopped = threading.Event()
    real_stop = FakeStream.stop

    def stop(stream: FakeStream) -> None:
        stopped.set()
        real_stop(stream)

    def user() -> None:
        signal.raise_signal(signal.SIGINT)  # stop and wait for the final ...
        stopped.wait(10)  # ... which cannot come: the capture stopped, the engine stalls
        signal.raise_signal(signal.SIGINT)  # so: quit now

    sd.when_done = user
    monkeypatch.setattr(FakeStream, "stop", stop)
    monkeypatch.setitem(sys.modules, "sounddevice", sd)
    try:
        await running.ready.wait()
        assert await run(["mic", "--server", f"127.0.0.1:{running.port}"]) == 130
    finally:
        gate.set()
        await running.close()
    err = capsys.readouterr().err
    assert "stopping: finishing the last utterance" in err
    assert err.splitlines()[-1] == "interrupted"


def heard_and_told(monkeypatch, notice: str) -> tuple[threading.Event, threading.Event]:  # type: ignore[no-untyped-def]
    """Two events the mic command sets: ``heard`` at the server's first response (it took
    the stream: a break now is a resume, not a refusal), ``told`` once the ``notice``
    (asr_client.cli's, where the commands' notices come from) is written."""
    import asr_client.cli as cli
    import asr_client.mic_session as mic_session

    heard, told = threading.Event(), threading.Event()
    status_event, write_notice = mic_session.MicStatus.event, getattr(cli, notice)

    def on_event(status: Any, response: Any) -> None:
        heard.set()
        status_event(status, response)

    def noted(info: Any) -> str:
        told.set()
        return write_notice(info)  # type: ignore[no-any-return]

    monkeypatch.setattr(mic_session.MicStatus, "event", on_event)
    monkeypatch.setattr(cli, notice, noted)
    return heard, told


async def test_a_resumed_stream_is_recorded_in_json_out_and_counted(
    make_server, tmp_path: Path, monkeypatch, capsys
):
    """docs/scale-out.md promises a ``{"type": "resumed"}`` record in ``--json-out``, as
    ``asr-client file`` writes; mic only said so on the screen."""
    import json

    from tests.faultproxy import FaultProxy
    from tests.helpers import serve_fake

    server = await serve_fake(make_server)
    proxy = await FaultProxy(server.port).start()
    loop = asyncio.get_running_loop()
    heard, resumed = heard_and_told(monkeypatch, "resume_notice")

    def user() -> None:  # the network drops once the speech is captured; then Ctrl-C
        heard.wait(10)
        loop.call_soon_threadsafe(proxy.cut)
        resumed.wait(10)
        signal.raise_signal(signal.SIGINT)

    sd = FakeSoundDevice(DEVICES, script=speech_like(16_000), when_done=user)
    monkeypatch.setitem(sys.modules, "sounddevice", sd)
    events = tmp_path / "events.jsonl"
    try:
        argv = ["mic", "--server", f"127.0.0.1:{proxy.port}", "--json-out", str(events)]
        assert await run(argv) == 0
    finally:
        await proxy.close()
    records = [json.loads(line) for line in events.read_text().splitlines()]
    assert [r["count"] for r in records if r["type"] == "resumed"] == [1]
    assert [r["text"] for r in records if r["type"] == "final"] == ["w0 w1 w2 w3 w4 w5"]
    err = capsys.readouterr().err
    assert "stream resumed (" in err
    assert err.splitlines()[-1].endswith("; the stream resumed 1 time(s)"), err


async def test_an_outage_is_told_as_it_begins_and_ctrl_c_says_what_it_waits_for(
    make_server, tmp_path: Path, monkeypatch, capsys
):
    """The server goes away mid-session and no other takes the stream: the screen said
    nothing until the stream resumed or gave up (30 s), and a Ctrl-C then said it was
    finishing the last utterance, and waited for the outage's end without saying why."""
    import json

    from tests.faultproxy import FaultProxy
    from tests.helpers import serve_fake

    server = await serve_fake(make_server)
    proxy = await FaultProxy(server.port).start()
    loop = asyncio.get_running_loop()
    heard, lost = heard_and_told(monkeypatch, "outage_notice")

    def user() -> None:  # the server goes for good once the speech is captured
        heard.wait(10)
        asyncio.run_coroutine_threadsafe(proxy.close(), loop).result(10)
        lost.wait(10)
        signal.raise_signal(signal.SIGINT)  # stop: the last utterance waits for a server
        time.sleep(0.5)
        signal.raise_signal(signal.SIGINT)  # and quit

    sd = FakeSoundDevice(DEVICES, script=speech_like(16_000), when_done=user)
    monkeypatch.setitem(sys.modules, "sounddevice", sd)
    events = tmp_path / "events.jsonl"
    argv = ["mic", "--server", f"127.0.0.1:{proxy.port}", "--json-out", str(events)]
    assert await asyncio.wait_for(run(argv), 20) == 130
    records = [json.loads(line) for line in events.read_text().splitlines()]
    (outage,) = [r for r in records if r["type"] == "outage"]
    assert outage["cause"].startswith("UNAVAILABLE") and outage["started"], outage
    err = capsys.readouterr().err
    assert "connection lost (UNAVAILABLE" in err and "resuming within 30 s" in err, err
    assert "stopping: the last utterance is finished once the stream resumes" in err, err
    assert err.splitlines()[-1] == "interrupted"


async def test_a_stream_no_server_took_at_first_is_not_shown_reconnecting(
    make_server, tmp_path: Path, monkeypatch, capsys
):
    """A new stream refused twice (a server still loading or draining) is told as a
    wait, but it was never connected: the status line said "reconnecting" from then on,
    since only a resume cleared it."""
    import asr_client.cli as cli
    import asr_client.mic_session as mic_session
    from tests.helpers import serve_fake

    server = await serve_fake(make_server)
    server.servicer.draining = True  # refuses every new call, with a pushback
    told: list[Any] = []
    seen: list[bool] = []  # the status line's flag at each server response
    status_event, notice = mic_session.MicStatus.event, cli.outage_notice

    def noted(info: Any) -> str:
        told.append(info)
        server.servicer.draining = False  # the next try is taken
        return notice(info)

    def on_event(status: Any, response: Any) -> None:
        seen.append(status.reconnecting)
        status_event(status, response)

    monkeypatch.setattr(cli, "outage_notice", noted)
    monkeypatch.setattr(mic_session.MicStatus, "event", on_event)
    sd = FakeSoundDevice(DEVICES, script=speech_like(16_000))
    sd.when_done = lambda: signal.raise_signal(signal.SIGINT)
    monkeypatch.setitem(sys.modules, "sounddevice", sd)
    assert await run(["mic", "--server", f"127.0.0.1:{server.port}"]) == 0
    assert [i.started for i in told] == [False]
    assert seen and not any(seen), seen
    assert "no server has taken the stream yet (UNAVAILABLE" in capsys.readouterr().err


def a_device_that_never_stops(monkeypatch) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """PortAudio's stop (and close, behind the same lock) never returning: what an ALSA
    source that stopped sending without an error does. Released when the test ends."""
    import asr_client.mic as mic

    release = threading.Event()
    seen: dict[str, Any] = {"closed": False, "release": release}

    def stop(stream: FakeStream) -> None:
        stream._stopped.set()  # the feeder ends; PortAudio's stop does not return
        release.wait(30)

    def close(stream: FakeStream) -> None:
        seen["closed"] = True
        release.wait(30)

    monkeypatch.setattr(FakeStream, "stop", stop)
    monkeypatch.setattr(FakeStream, "close", close)
    monkeypatch.setattr(mic, "DEVICE_STOP_TIMEOUT_S", 0.5)
    monkeypatch.setattr(mic, "_stuck_devices", set())  # (main() then ends with os._exit)
    return seen


async def test_a_device_that_never_stops_does_not_keep_the_command_from_ending(
    server: str, monkeypatch, capsys
):
    """Ctrl-C: stopping the device is given a bound, the last final still comes, and the
    stuck device is left alone (closing it would block as well)."""
    seen = a_device_that_never_stops(monkeypatch)
    sd = FakeSoundDevice(
        DEVICES, script=speech_like(16_000), when_done=lambda: signal.raise_signal(signal.SIGINT)
    )
    monkeypatch.setitem(sys.modules, "sounddevice", sd)
    try:
        assert await asyncio.wait_for(run(["mic", "--server", server]), 20) == 0
    finally:
        seen["release"].set()
    out, err = capsys.readouterr()
    assert out.splitlines()[-1].endswith("ch0  w0 w1 w2 w3 w4 w5"), out
    assert not seen["closed"]
    import asr_client.mic as mic

    assert mic.devices_left_stuck()


async def test_a_second_ctrl_c_quits_while_the_device_will_not_stop(
    server: str, monkeypatch, capsys
):
    """The second Ctrl-C used to do nothing: the device's close ran on the event loop,
    behind the stuck stop, and the loop never saw the signal again."""
    import asr_client.mic as mic

    seen = a_device_that_never_stops(monkeypatch)
    monkeypatch.setattr(mic, "DEVICE_STOP_TIMEOUT_S", 30.0)

    def user() -> None:
        signal.raise_signal(signal.SIGINT)
        time.sleep(0.5)  # stopping, and stuck
        signal.raise_signal(signal.SIGINT)

    sd = FakeSoundDevice(DEVICES, script=speech_like(16_000), when_done=user)
    monkeypatch.setitem(sys.modules, "sounddevice", sd)
    started = time.monotonic()
    try:
        assert await asyncio.wait_for(run(["mic", "--server", server]), 20) == 130
    finally:
        seen["release"].set()
    assert time.monotonic() - started < 10  # not the 30 s the device would hold it
    assert capsys.readouterr().err.splitlines()[-1] == "interrupted"


async def test_sigterm_stops_a_recording_as_ctrl_c_does(
    server: str, tmp_path: Path, monkeypatch, capsys
):
    """timeout, kill and process managers send SIGTERM: it used to kill the command,
    losing the last final and leaving --save-audio's WAV header without its sizes."""
    script = speech_like(16_000)
    sd = FakeSoundDevice(
        DEVICES, script=script, when_done=lambda: signal.raise_signal(signal.SIGTERM)
    )
    monkeypatch.setitem(sys.modules, "sounddevice", sd)
    audio = tmp_path / "audio.wav"
    before = signal.getsignal(signal.SIGTERM)
    assert await run(["mic", "--server", server, "--save-audio", str(audio)]) == 0
    out, err = capsys.readouterr()
    assert "stopping: finishing the last utterance" in err
    assert out.splitlines()[-1].endswith("ch0  w0 w1 w2 w3 w4 w5"), out
    import wave

    with wave.open(str(audio)) as saved:  # the header's sizes were written
        assert saved.getnframes() == len(script)
    assert signal.getsignal(signal.SIGTERM) == before
