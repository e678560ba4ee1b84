"""``asr-client``: stream an audio file or a microphone to a streamasr server, or transcribe
a file in one call (``asr-client mic`` lives in ``mic_session``, imported only when used).

Exit status: 0 done, 1 a local problem (unreadable file, no server at the address),
2 the server ended the call with an error (or a usage error, as argparse does),
130 interrupted, 141 the reader of the output went away (``| head -1``). ``run(argv)``
is the whole command as a coroutine so tests can drive it in-process; ``main()`` is the
console-script entry point.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO

from asr_api.v1 import asr_pb2
from asr_client.api import (
    AsrClient,
    AudioStream,
    StreamClosedError,
    audio_config,
    recognize_request_size,
)
from asr_client.audio_files import (
    QUIET_LEVEL_DB,
    AudioFileError,
    PcmAudio,
    load_audio,
    rate_for_server,
)
from asr_client.connection import (
    ConnectionConfigError,
    add_connection_arguments,
    connection_from_args,
    int_between,
    optional_user_path,
    positive_float,
    user_path,
)
from asr_client.load.command import add_parser as add_load_parser
from asr_client.load.command import load_command
from asr_client.render import (
    JsonLines,
    Renderer,
    event_record,
    event_type,
    final_line,
    make_renderer,
    result_record,
    words_line,
)
from asr_client.resume import (
    OutageInfo,
    ResumeInfo,
    ResumePolicy,
    outage_notice,
    outage_record,
    resume_notice,
    resume_record,
)
from asr_client.signals import calling_on
from asr_server.audio.decode import (
    MAX_CHANNELS,
    MAX_RATE_HZ,
    MIN_RATE_HZ,
    unusable_source_rate,
)

DEFAULT_SERVER = "localhost:50051"
#: what AsrClient allows in one message by default; the server's default is the same
MAX_RECOGNIZE_BYTES = 64 << 20


class ClientError(Exception):
    """A problem on this side (exit status 1), reported as one readable line."""


class UsageError(ClientError):
    """Options that cannot work with this input (exit status 2, as argparse's errors)."""


# -- argument parsing ---------------------------------------------------------------------


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 < value <= 1.0:  # NaN fails too
        raise argparse.ArgumentTypeError(f"must be a number above 0 and at most 1, not {text!r}")
    return value


def _language_list(text: str) -> tuple[str, ...]:
    codes = tuple(c.strip().lower() for c in text.split(",") if c.strip())
    if not codes:
        raise argparse.ArgumentTypeError("give language codes separated by commas, e.g. de,fr")
    return codes


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asr-client", description="Send audio files or a microphone to a streamasr server."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    path = argparse.ArgumentParser(add_help=False)
    path.add_argument(
        "path", type=user_path, metavar="PATH", help="audio file (WAV, FLAC, OGG, MP3, ...)"
    )
    common = argparse.ArgumentParser(add_help=False)
    add_connection_arguments(common, default_target=DEFAULT_SERVER)
    common.add_argument("--language", default="", help="language code such as en (default: detect)")
    common.add_argument(
        "--languages",
        type=_language_list,
        default=(),
        metavar="CODES",
        help="detect only among these, e.g. de,fr,it (default: any the model knows)",
    )
    common.add_argument(
        "--word-timestamps", action="store_true", help="per-word times on final results"
    )
    files = argparse.ArgumentParser(add_help=False)
    files.add_argument(
        "--channels",
        choices=("auto", "mix", "separate"),
        default="auto",
        help="a file with several channels: auto (default) mixes them when they carry the "
        "same signal, as a plain stereo recording does, and keeps them apart otherwise, as "
        "a call recorded agent/customer; mix or separate decide it",
    )
    files.add_argument(
        "--normalize",
        action="store_true",
        help="raise each channel so its loudest moment is at a normal recording level "
        "(never clipping) before sending: for a quiet recording, whose speech the server's "
        "voice detector may otherwise not hear",
    )

    streaming = argparse.ArgumentParser(add_help=False)
    streaming.add_argument(
        "--chunk-ms",
        type=int_between(10, 5000, "ms"),
        default=100,
        metavar="MS",
        help="audio per message (100; a message holds at most 1 MiB, as a server takes)",
    )
    streaming.add_argument(
        "--no-interim", action="store_true", help="finals only, no partial results"
    )
    streaming.add_argument(
        "--silence-ms",
        type=int_between(100, 10_000, "ms", or_zero=True),
        default=0,
        metavar="MS",
        help="silence that ends an utterance (100-10000; 0: the server's)",
    )
    streaming.add_argument(
        "--endpointing",
        choices=("silence", "semantic"),
        default="silence",
        help="semantic: a turn model ends utterances when the speaker is done and holds them "
        "open over mid-sentence pauses (the server needs `asr-server turn-model` once)",
    )
    streaming.add_argument(
        "--turn-threshold",
        type=_probability,
        default=0.0,
        metavar="P",
        help="semantic: how sure the turn model must be to end a turn (server default 0.7 "
        "at its second ask; 1 = never: turns end at the longest pause or a finalize)",
    )
    streaming.add_argument(
        "--eager",
        action="store_true",
        help="eager finals: the final's text as soon as a pause begins, withdrawn "
        "(speech_resumed) if the speaker goes on",
    )
    streaming.add_argument(
        "--hotword",
        action="append",
        default=[],
        metavar="W",
        help="word or phrase to favour (repeatable)",
    )
    streaming.add_argument(
        "--prompt", default="", metavar="TEXT", help="preceding context for the model"
    )
    streaming.add_argument(
        "--json-out",
        type=os.path.expanduser,  # a str: "-" is stdout
        metavar="FILE",
        help="write every event as a JSON line ('-' = stdout)",
    )
    streaming.add_argument("--quiet", action="store_true", help="no transcript and no summary")
    streaming.add_argument(
        "--verbose", action="store_true", help="outside a terminal, print partials and events too"
    )

    f = sub.add_parser(
        "file",
        parents=[path, common, files, streaming],
        help="stream a file in real time (or faster) and show results as they arrive",
    )
    pace = f.add_mutually_exclusive_group()
    pace.add_argument(
        "--speed",
        type=positive_float,
        default=1.0,
        metavar="N",
        help="playback speed: 1 = real time (default), 2 = twice as fast",
    )
    pace.add_argument(
        "--fast",
        action="store_true",
        help="send as fast as the server's backpressure allows (with --endpointing semantic "
        "turns still end where they would live: audio sent ahead of a pause's turn-model "
        "answer is heard no sooner than it would have come)",
    )
    r = sub.add_parser(
        "recognize", parents=[path, common, files], help="transcribe a whole file in one call"
    )
    r.add_argument("--json", action="store_true", help="print the response as one JSON object")
    add_load_parser(sub, common)

    m = sub.add_parser(
        "mic",
        parents=[common, streaming],
        help="stream a microphone and show the transcript live (Ctrl-C to stop)",
    )
    m.add_argument(
        "--list-devices", action="store_true", help="list the audio input devices and exit"
    )
    m.add_argument(
        "--device",
        metavar="DEV",
        help="input device: index or part of its name (default: the default input)",
    )
    m.add_argument(
        "--rate",
        type=int_between(8000, 48000, "Hz"),
        metavar="HZ",
        help="record at this rate (default: 16000 if the device offers it, else its own rate)",
    )
    m.add_argument(
        "--save-audio",
        type=optional_user_path,
        metavar="FILE",
        help="also write the recording (WAV or FLAC)",
    )
    m.add_argument(
        "--save-transcript",
        type=optional_user_path,
        metavar="FILE",
        help="also write the final results",
    )
    return parser


# -- the commands -------------------------------------------------------------------------


@dataclass
class StreamStats:
    audio_sent_s: float = 0.0
    wall_s: float = 0.0
    finals: int = 0
    resumes: int = 0


@dataclass
class StreamNotices:
    """What the commands tell of a stream's outages and resumes (``on_outage`` and
    ``on_resume``): a line for the person (``say``) and a record in --json-out, as each
    comes; resumes are counted in ``stats``, and ``reconnecting`` is told whether the
    stream is between a break and its resume (mic's status line)."""

    say: Callable[[str], None]
    json_out: JsonLines | None
    stats: StreamStats
    reconnecting: Callable[[bool], None] = lambda _: None

    def outage(self, info: OutageInfo) -> None:
        # told at once: the transcript stalls until the stream resumes (a stream no server
        # has taken yet is not reconnecting: no resume will come to say it is back)
        self.reconnecting(info.started)
        if self.json_out is not None:
            self.json_out.write(outage_record(info, recv_time=time.time()))
        self.say(outage_notice(info))

    def resumed(self, info: ResumeInfo) -> None:
        self.reconnecting(False)
        self.stats.resumes = info.count
        if self.json_out is not None:
            self.json_out.write(resume_record(info, recv_time=time.time()))
        self.say(resume_notice(info))


def open_client(args: argparse.Namespace) -> AsrClient:
    """A client for the connection options on the command line (``--server``, ``--tls``...)."""
    try:
        return AsrClient(connection_from_args(args), resume=ResumePolicy() if args.resume else None)
    except ConnectionConfigError as exc:
        raise ClientError(str(exc)) from None


async def connect(client: AsrClient, args: argparse.Namespace) -> None:
    try:
        await client.wait_ready(args.connect_timeout)
    except TimeoutError:
        hint = (
            " (is asr-server running there, and does it speak TLS as --tls says? does --ca "
            "trust its certificate, and does it ask for a client certificate, --cert/--key?)"
            if client.connection.uses_tls
            else " (is asr-server running there? add --tls if it serves TLS)"
        )
        raise ClientError(
            f"cannot connect to {args.server}: no answer within {args.connect_timeout:g} s{hint}"
        ) from None


async def send_paced(
    stream: AudioStream,
    audio: PcmAudio,
    *,
    chunk_ms: int,
    speed: float | None,
    t0: float,
    stats: StreamStats,
) -> None:
    """Send ``audio`` in chunks, each once the audio before it would have been heard
    (``t0 + frames sent/rate/speed``; ``speed=None``: no waiting)."""
    frame_bytes = 2 * audio.channels
    sent_frames = 0
    try:
        for chunk in audio.chunks(chunk_ms):
            if speed is not None:
                # an absolute schedule: a late wake-up shortens the next wait instead of
                # accumulating, so long files stay in real time. By frames sent, not
                # i*chunk_ms: a chunk is a whole number of frames, often not chunk_ms
                # (220 of 22050 Hz's 220.5 per 10 ms), and the difference adds up
                delay = t0 + sent_frames / audio.sample_rate_hz / speed - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            await stream.send_audio(chunk)
            sent_frames += len(chunk) // frame_bytes
            stats.audio_sent_s = sent_frames / audio.sample_rate_hz
        await stream.end()
    except StreamClosedError:
        return  # the call is over; the receiver reports the server's status


async def receive(
    stream: AudioStream,
    *,
    t0: float,
    renderer: Renderer,
    json_out: JsonLines | None,
    stats: StreamStats,
) -> None:
    async for response in stream:
        t = time.monotonic() - t0
        if json_out is not None:
            json_out.write(event_record(response, recv_time=time.time(), t=round(t, 4)))
        renderer.event(response)
        if event_type(response) == "final":
            stats.finals += 1


async def stream_file(
    client: AsrClient,
    config: asr_pb2.StreamingConfig,
    audio: PcmAudio,
    *,
    chunk_ms: int,
    speed: float | None,
    renderer: Renderer,
    json_out: JsonLines | None,
) -> StreamStats:
    """Send from one task and receive in another, so backpressure on sending never delays
    showing results; returns once the server has ended the stream after our half-close."""
    stats = StreamStats()
    notices = StreamNotices(lambda line: print(line, file=sys.stderr), json_out, stats)
    async with client.stream(config, on_resume=notices.resumed, on_outage=notices.outage) as stream:
        t0 = time.monotonic()
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(
                    send_paced(stream, audio, chunk_ms=chunk_ms, speed=speed, t0=t0, stats=stats),
                    name="send-audio",
                )
                tasks.create_task(
                    receive(stream, t0=t0, renderer=renderer, json_out=json_out, stats=stats),
                    name="receive-events",
                )
        except BaseExceptionGroup as group:
            # the sender swallows StreamClosedError, so a lone error is the usual case:
            # raise it as itself so callers can catch StreamClosedError
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
        stats.wall_s = time.monotonic() - t0
    return stats


def open_json_out(
    path: str | None, stdout: IO[str], stack: contextlib.ExitStack
) -> JsonLines | None:
    """``--json-out``: None, ``-`` for stdout, or a file closed with ``stack``."""
    if not path:
        return None
    if path == "-":
        return JsonLines(stdout)
    try:
        out = stack.enter_context(open(path, "w", encoding="utf-8"))  # noqa: ASYNC230
    except OSError as exc:
        raise ClientError(f"cannot write {path}: {exc.strerror}") from None
    return JsonLines(out)


def streaming_config(
    args: argparse.Namespace, *, sample_rate_hz: int, channels: int
) -> asr_pb2.StreamingConfig:
    """The stream config the common and streaming options ask for."""
    return audio_config(
        sample_rate_hz=sample_rate_hz,
        channels=channels,
        language=args.language,
        languages=args.languages,
        interim_results=not args.no_interim,
        silence_ms=args.silence_ms,
        endpointing=args.endpointing,
        eager_finals=args.eager,
        turn_threshold=args.turn_threshold,
        hotwords=args.hotword,
        initial_prompt=args.prompt,
        word_timestamps=args.word_timestamps,
    )


def _channels_as_asked(audio: PcmAudio, args: argparse.Namespace, stderr: IO[str]) -> PcmAudio:
    """The file's channels mixed to one, or kept apart, as ``--channels`` says."""
    if audio.channels == 1 or args.channels == "separate":
        return audio
    if args.channels == "mix":
        return audio.mixed()
    if audio.channels_alike():
        if not getattr(args, "quiet", False):
            apart = (
                " (--channels separate keeps them apart)" if audio.channels <= MAX_CHANNELS else ""
            )
            print(
                f"the {audio.channels} channels carry the same signal: transcribing them as "
                f"one{apart}",
                file=stderr,
            )
        return audio.mixed()
    return audio


def _level_as_asked(audio: PcmAudio, args: argparse.Namespace, stderr: IO[str]) -> PcmAudio:
    """The file raised to a normal level with ``--normalize``; without it, a recording too
    quiet for the server's voice detector is sent as it is, and the user told so (its
    speech, or its first words, may come back as nothing)."""
    told = not getattr(args, "quiet", False)
    if args.normalize:
        audio, gains = audio.raised()
        if told and any(gains):
            raised = ", ".join(f"{g:.0f} dB" for g in gains)
            print(f"--normalize: raised by {raised}", file=stderr)
        return audio
    # each channel on its own, as the server hears them (a call's quiet customer beside
    # a loud agent); a silent one (all zeros) is not quiet speech
    levels = audio.loudest_frame_db()
    quiet = [(ch, db) for ch, db in enumerate(levels) if -math.inf < db < QUIET_LEVEL_DB]
    if told and quiet:
        dbfs = _and([f"{db:.0f}" for _, db in quiet]) + " dBFS"
        if len(levels) == 1:
            what = f"the recording is quiet (its loudest moment at {dbfs}): the server may "
            what += "not hear some or all of its speech; --normalize raises it first"
        elif len(quiet) == 1:
            what = f"channel {quiet[0][0]} is quiet (its loudest moment at {dbfs}): the "
            what += "server may not hear some or all of its speech; --normalize raises it first"
        else:
            what = f"channels {_and([str(ch) for ch, _ in quiet])} are quiet (their loudest "
            what += f"moments at {dbfs}): the server may not hear some or all of their "
            what += "speech; --normalize raises them first"
        print(what, file=stderr)
    return audio


def _and(items: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _audio_for_the_server(args: argparse.Namespace, stderr: IO[str]) -> PcmAudio:
    """The file's audio as the server can take it, found out before connecting: its
    channels as ``--channels`` says, at most MAX_CHANNELS, at a rate it takes."""
    audio = _channels_as_asked(load_audio(args.path), args, stderr)
    if audio.channels > MAX_CHANNELS:
        raise UsageError(
            f"{args.path} has {audio.channels} channels, more than the server takes "
            f"({MAX_CHANNELS}): --channels mix sends them mixed to one"
        )
    audio = _level_as_asked(audio, args, stderr)  # (no level advice for a file refused)
    if unusable := unusable_source_rate(audio.sample_rate_hz):  # (resampled up: 16,000 each)
        raise AudioFileError(f"{args.path}: {unusable}")
    rate = rate_for_server(audio.sample_rate_hz)
    if rate != audio.sample_rate_hz:
        if not getattr(args, "quiet", False):
            print(
                f"the server takes {MIN_RATE_HZ}-{MAX_RATE_HZ} Hz: resampling from "
                f"{audio.sample_rate_hz} Hz to {rate} Hz",
                file=stderr,
            )
        audio = audio.resampled(rate)
    return audio


async def _file_command(args: argparse.Namespace, stdout: IO[str], stderr: IO[str]) -> int:
    audio = _audio_for_the_server(args, stderr)
    config = streaming_config(args, sample_rate_hz=audio.sample_rate_hz, channels=audio.channels)
    with contextlib.ExitStack() as stack:
        json_out = open_json_out(args.json_out, stdout, stack)
        # JSON on stdout must stay parseable, so the transcript is not printed there too
        quiet = args.quiet or args.json_out == "-"
        async with open_client(args) as client:
            await connect(client, args)
            with make_renderer(stdout, quiet=quiet, verbose=args.verbose) as renderer:
                stats = await stream_file(
                    client,
                    config,
                    audio,
                    chunk_ms=args.chunk_ms,
                    speed=None if args.fast else args.speed,
                    renderer=renderer,
                    json_out=json_out,
                )
    if not args.quiet:
        pace = stats.audio_sent_s / stats.wall_s if stats.wall_s > 0 else 0.0
        print(
            f"sent {stats.audio_sent_s:.1f} s of audio in {stats.wall_s:.1f} s "
            f"({pace:.1f}x real time); {stats.finals} final result(s)"
            + (f"; the stream resumed {stats.resumes} time(s)" if stats.resumes else ""),
            file=stderr,
        )
    return 0


async def _recognize_command(args: argparse.Namespace, stdout: IO[str], stderr: IO[str]) -> int:
    audio = _audio_for_the_server(args, stderr)
    data = audio.to_bytes()
    config = audio_config(
        sample_rate_hz=audio.sample_rate_hz,
        channels=audio.channels,
        language=args.language,
        languages=args.languages,
        interim_results=False,
        word_timestamps=args.word_timestamps,
    )
    # the whole request, config and framing too: a file just under the limit as PCM was
    # refused by grpc itself, an unreadable error with the server's exit status
    size = recognize_request_size(config, len(data))
    if size > MAX_RECOGNIZE_BYTES:
        raise ClientError(
            f"{args.path} is {size / (1 << 20):.1f} MiB as a request, more than one call may "
            f"carry ({MAX_RECOGNIZE_BYTES >> 20} MiB); stream it instead: asr-client file --fast"
        )
    async with open_client(args) as client:
        await connect(client, args)
        response = await client.recognize(data, config)
    if args.json:
        document = {
            "duration_s": round(response.duration_s, 3),
            "results": [result_record(r) for r in response.results],
        }
        print(json.dumps(document, ensure_ascii=False, indent=2), file=stdout)
    else:
        for result in response.results:
            print(final_line(result), file=stdout)
            if result.words:
                print(words_line(result), file=stdout)
    return 0


async def run(argv: Sequence[str] | None = None) -> int:
    """The whole command; returns the exit status. Output goes to the current sys.stdout/stderr."""
    args = build_parser().parse_args(argv)
    stdout, stderr = sys.stdout, sys.stderr
    with _terminated_as_cancelled() as terminated:
        try:
            code = await _command(args, stdout, stderr)
        except asyncio.CancelledError:
            if not terminated():
                raise
            code = 143
    if terminated():  # (also where the cancellation was turned into an error on the way)
        print("terminated", file=stderr)
        return 143
    return code


@contextlib.contextmanager
def _terminated_as_cancelled() -> Iterator[Callable[[], bool]]:
    """SIGTERM (timeout, kill, a process manager) cancels the command, as Ctrl-C does:
    every ``async with`` closes on the way out (the terminal gets its cursor back, the
    call is cancelled). mic replaces this with its own handler, which stops recording
    gracefully. Yields: did SIGTERM come?"""
    task = asyncio.current_task()
    came = False

    def on_sigterm() -> None:
        nonlocal came
        came = True
        if task is not None:
            task.cancel()

    # (the caller's own handler, a program's that runs the command, is back after it)
    with calling_on([signal.SIGTERM], on_sigterm):
        yield lambda: came


async def _command(args: argparse.Namespace, stdout: IO[str], stderr: IO[str]) -> int:
    try:
        if args.command == "mic":
            from asr_client.mic import MicError
            from asr_client.mic_session import mic_command

            try:
                return await mic_command(args, stdout, stderr)
            except MicError as exc:
                raise ClientError(str(exc)) from None
        command = {"file": _file_command, "recognize": _recognize_command, "load": load_command}
        return await command[args.command](args, stdout, stderr)
    except StreamClosedError as exc:
        print(f"error: {exc.code.name}: {exc.details}", file=stderr)
        return 2
    except UsageError as exc:
        print(f"error: {exc}", file=stderr)
        return 2
    except (ClientError, AudioFileError) as exc:
        print(f"error: {exc}", file=stderr)
        return 1


def main(argv: Sequence[str] | None = None) -> None:
    try:
        # asyncio.run turns Ctrl-C into cancellation of run(), so every ``async with``
        # above cancels its call and closes its channel before we get here
        code = asyncio.run(run(argv))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    except BrokenPipeError:
        # the reader of stdout went away (``| head -1``); the call was cancelled on the
        # way out. End quietly with 128 + SIGPIPE, as cat or grep killed by SIGPIPE do, so
        # that ``set -o pipefail`` does not take a cut-short transcript for a whole one.
        # stdout at /dev/null: the flush at exit would fail again (Python's "Note on SIGPIPE")
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 141
    mic = sys.modules.get("asr_client.mic")
    if mic is not None and mic.devices_left_stuck():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # see devices_left_stuck
    sys.exit(code)
