"""``asr-client mic``: stream a microphone to the server and show the transcript as it grows.

One task sends what :class:`~asr_client.mic.MicCapture` records, another shows the events
(``cli.receive``, the same renderers as ``asr-client file`` plus a level/speech line). The
first Ctrl-C stops recording and half-closes the stream, so the server finalizes the
utterance in progress and its final is shown (and saved) before the command exits 0; a
second Ctrl-C quits at once (exit 130).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
from rich.text import Text

from asr_api.v1 import asr_pb2
from asr_client.api import AsrClient, AudioStream, StreamClosedError
from asr_client.cli import (
    ClientError,
    StreamNotices,
    StreamStats,
    connect,
    open_client,
    open_json_out,
    receive,
    streaming_config,
)
from asr_client.mic import (
    SILENCE_DBFS,
    CaptureFormat,
    Chunk,
    MicCapture,
    MicError,
    choose_format,
    import_sounddevice,
    input_devices,
    meter_bar,
    select_device,
)
from asr_client.render import LiveRenderer, Renderer, Tee, event_type, final_line, make_renderer
from asr_client.resume import ResumePolicy
from asr_client.signals import calling_on


class MicStatus(Renderer):
    """The live line under the transcript: input level, whether the server hears speech,
    and audio dropped because the network is not keeping up."""

    def __init__(self) -> None:
        self.dbfs = SILENCE_DBFS
        self.speaking: set[int] = set()
        self.dropped = 0
        self.stopping = False
        self.reconnecting = False  # the stream's call broke and it is resuming

    def event(self, response: asr_pb2.StreamingRecognizeResponse) -> None:
        kind = event_type(response)
        if kind == "speech_started":
            self.speaking.add(response.speech_event.channel)
        elif kind == "speech_ended":
            self.speaking.discard(response.speech_event.channel)

    def line(self) -> Text:
        speaking = bool(self.speaking)
        line = Text.assemble(
            ("mic ", "bold"),
            (meter_bar(self.dbfs), "green" if speaking else "cyan"),
            f" {self.dbfs:4.0f} dBFS  ",
            ("● speech", "bold red") if speaking else ("○ listening", "dim"),
        )
        if self.dropped:
            line.append(f"  {self.dropped} dropped", style="yellow")
        if self.reconnecting:
            line.append("  reconnecting", style="bold yellow")
        if self.stopping:
            line.append("  stopping", style="dim")
        return line


class TranscriptFile(Renderer):
    """``--save-transcript``: one line per final, flushed so an abort keeps what was said."""

    def __init__(self, out: IO[str]) -> None:
        self._out = out

    def event(self, response: asr_pb2.StreamingRecognizeResponse) -> None:
        if event_type(response) == "final":
            self._out.write(final_line(response.result) + "\n")
            self._out.flush()


#: what stops a recording as Ctrl-C does: SIGTERM is how timeout, kill and process
#: managers ask, and a recording cut off by it lost its last final and left --save-audio
#: without its header's sizes (a WAV that Python's wave module refuses)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def on_interrupt(callback: Callable[[], None]) -> Iterator[None]:
    """Call ``callback`` on Ctrl-C or SIGTERM instead of cancelling the command."""
    # (not in the main thread, Ctrl-C keeps its usual meaning; the handlers from before,
    # the command's own or a calling program's, are back after it)
    with calling_on(STOP_SIGNALS, callback):
        yield


def list_devices(stdout: IO[str]) -> int:
    sd = import_sounddevice()
    devices = _input_devices(sd)
    if not devices:
        raise MicError("no audio input device found")
    for device in devices:
        print(device.describe(), file=stdout)
    return 0


def _input_devices(sd: Any) -> list[Any]:
    try:
        return input_devices(sd)
    except sd.PortAudioError as exc:
        raise MicError(f"cannot list audio devices: {exc}") from None


async def send_mic(
    stream: AudioStream,
    capture: MicCapture,
    *,
    stats: StreamStats,
    audio_file: Any | None,
    stop: asyncio.Event,
) -> None:
    """Send every captured chunk; once capture ends, half-close so the server finalizes."""
    rate = capture.format.rate
    try:
        async for chunk in capture:
            if audio_file is not None:
                audio_file.write(np.frombuffer(chunk.pcm, dtype="<i2"))
            await stream.send_audio(chunk.pcm)
            stats.audio_sent_s += len(chunk.pcm) / 2 / rate
        stop.set()  # the device may have ended on its own
        await stream.end()
    except StreamClosedError:
        return  # the receiver reports the server's status


async def _stop_on(stop: asyncio.Event, capture: MicCapture) -> None:
    await stop.wait()
    await capture.stop()


async def mic_command(args: argparse.Namespace, stdout: IO[str], stderr: IO[str]) -> int:
    if args.list_devices:
        return list_devices(stdout)
    sd = import_sounddevice()
    device = select_device(_input_devices(sd), args.device)
    fmt = choose_format(sd, device, rate=args.rate, chunk_ms=args.chunk_ms)
    # the server resamples, so the device rate is declared as is
    config = streaming_config(args, sample_rate_hz=fmt.rate, channels=1)
    with contextlib.ExitStack() as files:
        json_out = open_json_out(args.json_out, stdout, files)
        renderers: list[Renderer] = []
        if args.save_transcript:
            renderers.append(TranscriptFile(_open(files, args.save_transcript)))
        audio_file = _open_audio(files, args.save_audio, fmt) if args.save_audio else None
        async with open_client(args) as client:
            await connect(client, args)
            code = await _record(
                client, config, fmt, sd, args, stdout, stderr, renderers, json_out, audio_file
            )
    return code


async def _record(
    client: AsrClient,
    config: asr_pb2.StreamingConfig,
    fmt: CaptureFormat,
    sd: Any,
    args: argparse.Namespace,
    stdout: IO[str],
    stderr: IO[str],
    renderers: list[Renderer],
    json_out: Any,
    audio_file: Any,
) -> int:
    quiet = args.quiet or args.json_out == "-"
    status = MicStatus()
    view = make_renderer(stdout, quiet=quiet, verbose=args.verbose, footer=status.line)
    live = view if isinstance(view, LiveRenderer) else None
    stats = StreamStats()
    stop = asyncio.Event()
    task = asyncio.current_task()
    aborted = False
    resume_window_s = (client.resume or ResumePolicy()).give_up_after_s

    def note(message: str) -> None:
        if live is not None:
            live.note(message)
        elif not args.quiet:
            print(message, file=stderr, flush=True)

    def on_chunk(chunk: Chunk) -> None:
        status.dbfs = chunk.dbfs
        if capture.dropped > status.dropped:
            if status.dropped == 0:
                note("the network is not keeping up: audio is being dropped (counted)")
            status.dropped = capture.dropped
        if live is not None:
            live.refresh()

    def on_ctrl_c() -> None:
        nonlocal aborted
        if not stop.is_set():
            status.stopping = True
            if status.reconnecting:  # the last utterance waits for a server to take it
                note(
                    "stopping: the last utterance is finished once the stream resumes "
                    f"(within {resume_window_s:g} s of the break; Ctrl-C again to quit now)"
                )
            else:
                note("stopping: finishing the last utterance (Ctrl-C again to quit now)")
            stop.set()
        elif task is not None:
            aborted = True
            task.cancel()

    renderer = Tee(*renderers, status, view)
    capture = MicCapture(sd, fmt, on_chunk=on_chunk)
    try:
        with on_interrupt(on_ctrl_c), renderer:
            # a dropped network resumes the stream: nothing is lost; said on the screen
            # and, as `asr-client file` does, in --json-out
            def reconnecting(now: bool) -> None:
                status.reconnecting = now

            notices = StreamNotices(note, json_out, stats, reconnecting)
            async with (
                client.stream(
                    config, on_resume=notices.resumed, on_outage=notices.outage
                ) as stream,
                capture,
            ):
                t0 = time.monotonic()
                d = fmt.device
                note(
                    f"listening on {d.index}: {d.name} ({d.host_api}), {fmt.rate} Hz, "
                    f"{fmt.chunk_ms} ms chunks; Ctrl-C to stop"
                )
                async with asyncio.TaskGroup() as tasks:
                    tasks.create_task(
                        send_mic(stream, capture, stats=stats, audio_file=audio_file, stop=stop),
                        name="send-audio",
                    )
                    tasks.create_task(_stop_on(stop, capture), name="stop-capture")
                    tasks.create_task(
                        receive(stream, t0=t0, renderer=renderer, json_out=json_out, stats=stats),
                        name="receive-events",
                    )
                stats.wall_s = time.monotonic() - t0
    except asyncio.CancelledError:
        if aborted and task is not None and task.uncancel() == 0:
            print("interrupted", file=stderr)
            return 130
        raise
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
    if capture.error:
        raise MicError(capture.error)
    if not args.quiet:
        summary = f"recorded {stats.audio_sent_s:.1f} s; {stats.finals} final result(s)"
        if capture.dropped:
            lost = capture.dropped * fmt.chunk_ms / 1000
            summary += f"; {capture.dropped} chunk(s) ({lost:.1f} s) dropped: network too slow"
        if capture.overflows:
            summary += f"; the device overran {capture.overflows} time(s)"
        if stats.resumes:
            summary += f"; the stream resumed {stats.resumes} time(s)"
        print(summary, file=stderr)
    return 0


def _open(files: contextlib.ExitStack, path: Path) -> IO[str]:
    try:
        return files.enter_context(open(path, "w", encoding="utf-8"))  # noqa: ASYNC230
    except OSError as exc:
        raise ClientError(f"cannot write {path}: {exc.strerror}") from None


def _open_audio(files: contextlib.ExitStack, path: Path, fmt: CaptureFormat) -> Any:
    import soundfile

    try:
        return files.enter_context(
            soundfile.SoundFile(path, "w", samplerate=fmt.rate, channels=1, subtype="PCM_16")
        )
    except (OSError, RuntimeError, TypeError, ValueError) as exc:
        raise ClientError(f"cannot write {path}: {exc}") from None
