"""Microphone capture: find an input device, pick a rate it supports, hand its audio to asyncio.

sounddevice (PortAudio) calls our callback on its own thread with each block; the block is
copied and passed to the event loop with ``call_soon_threadsafe``, where it waits in a
bounded queue for the sender. If the network cannot keep up the queue fills, and further
blocks are dropped *and counted* — an audio callback must never wait, and growing without
bound would only turn a slow network into an ever-growing delay.

sounddevice is imported only here, only when needed, and a missing package, a missing
PortAudio library or a missing device each become one plain :class:`MicError` line.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import math
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

#: what the server accepts (it resamples to 16 kHz itself)
MIN_RATE, MAX_RATE = 8_000, 48_000
#: Whisper's own rate, so nothing is resampled anywhere when the device offers it
PREFERRED_RATE = 16_000
COMMON_RATES = (48_000, 44_100, 32_000, 22_050, 24_000, 11_025, 8_000)
#: the floor of the level meter; digital silence would otherwise be -inf
SILENCE_DBFS = -96.0
#: the longest stopping or closing the input device may take: PortAudio's stop waits for
#: the last block's callback (at most a chunk, 5 s at --chunk-ms's limit); a device that
#: stopped sending without an error (an idle pipe or virtual source under ALSA) makes it
#: wait for good, and the command must still end
DEVICE_STOP_TIMEOUT_S = 6.0

logger = logging.getLogger(__name__)


class MicError(Exception):
    """A local problem with audio input, reported as one readable line (exit status 1)."""


def import_sounddevice() -> ModuleType:
    """The sounddevice module, or a MicError saying what to install."""
    try:
        return importlib.import_module("sounddevice")
    except ImportError:
        raise MicError(
            "the microphone needs the sounddevice package: pip install 'streamasr[mic]'"
        ) from None
    except OSError:
        # sounddevice raises OSError("PortAudio library not found") when libportaudio is absent
        raise MicError(
            "the PortAudio library is not installed "
            "(Debian/Ubuntu: apt-get install libportaudio2; macOS: brew install portaudio)"
        ) from None


@dataclass(frozen=True)
class InputDevice:
    index: int
    name: str
    host_api: str
    max_channels: int
    default_rate: int
    is_default: bool = False

    def describe(self) -> str:
        mark = "*" if self.is_default else " "
        return (
            f"{mark} {self.index:>3}  {self.name}  ({self.host_api}, "
            f"{self.max_channels} ch, default {self.default_rate} Hz)"
        )


def _default_input_index(sd: ModuleType) -> int:
    try:
        index = sd.default.device[0]
    except (TypeError, IndexError):
        index = sd.default.device
    if index is None or int(index) < 0:
        try:
            index = sd.query_devices(kind="input")["index"]
        except sd.PortAudioError:
            return -1
    return int(index)


def input_devices(sd: ModuleType) -> list[InputDevice]:
    """Every device with at least one input channel, the default one marked."""
    default = _default_input_index(sd)
    apis = [api["name"] for api in sd.query_hostapis()]
    devices = []
    for index, info in enumerate(sd.query_devices()):
        if info["max_input_channels"] < 1:
            continue
        api = info.get("hostapi", 0)
        devices.append(
            InputDevice(
                index=index,
                name=info["name"],
                host_api=apis[api] if 0 <= api < len(apis) else "?",
                max_channels=int(info["max_input_channels"]),
                default_rate=round(info["default_samplerate"]),
                is_default=index == default,
            )
        )
    return devices


def select_device(devices: list[InputDevice], spec: str | None) -> InputDevice:
    """``spec``: None for the default input, a device index, or part of a device name."""
    if not devices:
        raise MicError("no audio input device found (asr-client mic --list-devices)")
    if spec is None:
        for device in devices:
            if device.is_default:
                return device
        return devices[0]  # PortAudio names no default; any input beats none
    if spec.strip().isdigit():
        index = int(spec)
        for device in devices:
            if device.index == index:
                return device
        raise MicError(f"no input device with index {index} (asr-client mic --list-devices)")
    wanted = spec.casefold()
    exact = [d for d in devices if d.name.casefold() == wanted]
    matches = exact or [d for d in devices if wanted in d.name.casefold()]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise MicError(f"no input device matches {spec!r} (asr-client mic --list-devices)")
    names = ", ".join(f"{d.index}: {d.name}" for d in matches)
    raise MicError(f"{spec!r} matches several input devices ({names}); give the index")


@dataclass(frozen=True)
class CaptureFormat:
    """What we open the device with. The server is always sent int16 mono at ``rate``."""

    device: InputDevice
    rate: int
    channels: int  # 1, or 2 for a device that only records stereo (mixed down to mono)
    chunk_ms: int

    @property
    def blocksize(self) -> int:
        return max(1, self.rate * self.chunk_ms // 1000)


def choose_format(
    sd: ModuleType, device: InputDevice, *, rate: int | None = None, chunk_ms: int = 100
) -> CaptureFormat:
    """16 kHz mono when the device offers it; otherwise the device's own rate (or another
    common one in the server's 8-48 kHz range), declared to the server, which resamples."""
    if rate is not None:
        rates = [rate]
    else:
        rates = [PREFERRED_RATE]
        if MIN_RATE <= device.default_rate <= MAX_RATE:
            rates.append(device.default_rate)
        rates += [r for r in COMMON_RATES if r not in rates]
    channel_options = [1] if device.max_channels < 2 else [1, 2]
    reasons = []
    for channels in channel_options:
        for candidate in rates:
            try:
                sd.check_input_settings(
                    device=device.index, samplerate=candidate, channels=channels, dtype="int16"
                )
            except (sd.PortAudioError, ValueError) as exc:
                reasons.append(f"{candidate} Hz x{channels}: {exc}")
                continue
            return CaptureFormat(device, candidate, channels, chunk_ms)
    tried = "; ".join(reasons[:3])
    raise MicError(f"input device {device.name!r} accepts none of the rates tried ({tried})")


def level_dbfs(block: np.ndarray) -> float:
    """RMS level of int16 samples in dB relative to full scale, floored at SILENCE_DBFS."""
    if block.size == 0:
        return SILENCE_DBFS
    rms = math.sqrt(float(np.mean(np.square(block, dtype=np.float64)))) / 32768.0
    if rms <= 0:
        return SILENCE_DBFS
    return max(SILENCE_DBFS, 20 * math.log10(rms))


def meter_bar(dbfs: float, width: int = 24, floor_db: float = -60.0) -> str:
    """``█████░░░░`` with ``floor_db`` empty and 0 dBFS full; speech usually sits at -40..-10."""
    fraction = min(1.0, max(0.0, (dbfs - floor_db) / -floor_db))
    filled = round(fraction * width)
    return "█" * filled + "░" * (width - filled)


@dataclass(frozen=True)
class Chunk:
    pcm: bytes  # int16 little-endian mono
    dbfs: float


class MicCapture:
    """An open input stream whose audio is iterated as :class:`Chunk` objects.

    ``async with MicCapture(sd, fmt) as mic: async for chunk in mic: ...``; ``await
    mic.stop()`` stops the device, and the iteration ends after the chunks already
    captured. ``dropped`` counts chunks lost because the queue was full, ``overflows``
    blocks PortAudio itself reported as overrun.
    """

    def __init__(
        self,
        sd: ModuleType,
        fmt: CaptureFormat,
        *,
        max_queue_s: float = 10.0,
        on_chunk: Callable[[Chunk], None] | None = None,
    ) -> None:
        self._sd = sd
        self.format = fmt
        self._limit = max(1, math.ceil(max_queue_s * 1000 / fmt.chunk_ms))
        self._queue: asyncio.Queue[Chunk | None] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._on_chunk = on_chunk
        self._stream: Any = None
        self._stopping = False
        self._device_stopped: asyncio.Future[None] | None = None  # PortAudio's stop returned
        self._ended = False
        self.dropped = 0
        self.overflows = 0
        self.error: str | None = None

    # -- PortAudio's thread ----------------------------------------------------------------

    def _callback(self, indata: np.ndarray, frames: int, time: object, status: Any) -> None:
        mono = indata[:, 0] if indata.shape[1] == 1 else indata.mean(axis=1).astype(np.int16)
        chunk = Chunk(mono.astype("<i2", copy=False).tobytes(), level_dbfs(mono))
        overflow = bool(status and status.input_overflow)
        with contextlib.suppress(RuntimeError):  # the loop has closed (a device left stuck)
            self._loop.call_soon_threadsafe(self._put, chunk, overflow)

    def _finished(self) -> None:
        # called when the stream becomes inactive, by our stop() or by the device going
        # away; a device left stuck may call it once the command's loop has closed
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._end)

    # -- the event loop ----------------------------------------------------------------------

    def _put(self, chunk: Chunk, overflow: bool) -> None:
        if self._queue.qsize() >= self._limit:
            self.dropped += 1
        else:
            self._queue.put_nowait(chunk)
        self.overflows += overflow
        if self._on_chunk is not None:
            self._on_chunk(chunk)

    def _end(self) -> None:
        if self._ended:
            return
        self._ended = True
        if not self._stopping:
            self.error = f"the input device {self.format.device.name!r} stopped delivering audio"
        self._queue.put_nowait(None)

    async def start(self) -> None:
        sd, fmt = self._sd, self.format
        try:
            self._stream = sd.InputStream(
                device=fmt.device.index,
                samplerate=fmt.rate,
                channels=fmt.channels,
                dtype="int16",
                blocksize=fmt.blocksize,
                callback=self._callback,
                finished_callback=self._finished,
            )
            self._stream.start()
        except (sd.PortAudioError, ValueError) as exc:
            raise MicError(f"cannot open input device {fmt.device.name!r}: {exc}") from None

    async def stop(self) -> None:
        """Stop recording; blocks already captured are still delivered, then iteration ends."""
        if self._stream is None or self._stopping:
            return
        self._stopping = True
        # stop() waits for the last callback to return, which can take a block's duration
        self._device_stopped = in_daemon_thread(self._stream.stop)
        try:
            # (asyncio.timeout, not wait_for, which on 3.11 may drop a second Ctrl-C's cancel)
            async with asyncio.timeout(DEVICE_STOP_TIMEOUT_S):
                await asyncio.shield(self._device_stopped)
        except TimeoutError:
            logger.warning(
                "the input device %r did not stop within %g s; leaving it",
                self.format.device.name,
                DEVICE_STOP_TIMEOUT_S,
            )
        # PortAudio calls finished_callback on stop too; this covers a backend that does not
        self._end()

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    async def __aiter__(self) -> AsyncIterator[Chunk]:
        while (chunk := await self._queue.get()) is not None:
            yield chunk

    async def __aenter__(self) -> MicCapture:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._stream is None:
            return
        stream = self._stream
        try:
            await self.stop()
        finally:
            # also when the command is cancelled (a second Ctrl-C) while stopping: never
            # on the event loop (a stuck device would block it, and the signal handlers
            # with it, for good), and not at all while stopping has not returned
            self._stream = None
            stopped = self._device_stopped
            if stopped is not None and stopped.done():
                closed = in_daemon_thread(stream.close)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(DEVICE_STOP_TIMEOUT_S):
                        await asyncio.shield(closed)
            else:
                _stuck_devices.add(self.format.device.name)


#: input devices whose stop never returned: a thread is still blocked in PortAudio
_stuck_devices: set[str] = set()


def devices_left_stuck() -> bool:
    """Was an input device left stuck? The process must then end without the
    interpreter's usual exit: sounddevice's exit handler stops the stream again (and
    blocks as the stop did), and tearing down around the blocked thread crashed."""
    return bool(_stuck_devices)


def in_daemon_thread(call: Callable[[], object]) -> asyncio.Future[None]:
    """Run the blocking ``call`` in a daemon thread; the future is done when it returns.
    Not asyncio's executor: asyncio.run waits for its threads at the end, so one stuck in
    PortAudio would keep the command from ever exiting; a daemon thread does not."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def finished() -> None:
        if not done.done():
            done.set_result(None)

    def run() -> None:
        try:
            call()
        except Exception:  # a PortAudio error while stopping or closing: done all the same
            logger.debug("the input device's %s failed", call.__name__, exc_info=True)
        finally:
            with contextlib.suppress(RuntimeError):  # the loop has closed meanwhile
                loop.call_soon_threadsafe(finished)

    threading.Thread(target=run, name="mic-device", daemon=True).start()
    return done
