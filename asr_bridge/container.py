"""Containerized audio (WebM, Ogg, WAV, FLAC, MP3…) decoded to PCM as it arrives.

Deepgram's live API takes a container when the query names no ``encoding``, and that is
how its browser examples stream: a ``MediaRecorder`` hands out WebM/Opus in pieces (the
header, then a cluster every timeslice) and each piece goes out as one message. PyAV
(FFmpeg's demuxers and decoders, a dependency of faster-whisper already) reads a
container from a file object with blocking reads, so demuxing and decoding run on a
thread of their own, which reads what the socket has delivered and waits for more.

Both ends are bounded, so that a server that pushes back still slows the client down:
``feed`` waits while ``MAX_PENDING`` pieces are unread, and the thread waits while
``MAX_PENDING`` decoded blocks are untaken.

Markers (``mark``) come out in order with the audio. MP3 and FLAC are streams of frames
that FFmpeg's demuxer finds with a parser, which holds the last frames until it sees the
next one begin (the MP3 demuxer also reads 1 KiB at a time): a Finalize would come out up
to 100 ms (MP3) or 600 ms (FLAC) before the audio sent ahead of it. Their frames are
parsed here instead (``_ParsedFrames``), and a marker flushes the parser: it comes out
after every whole frame fed before it; a frame the marker cuts in two is lost (its halves
do not decode). In other containers a marker comes out after the audio of every block
that is whole in the bytes fed before it (a MediaRecorder's pieces end on one); the audio
of a block it cuts comes out after it. A marker fed while FFmpeg still probes the start
comes out once it has, before the first audio.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# the server's limits: audio faster than its highest rate is resampled to it
from asr_server.audio.decode import (
    MAX_CHANNELS,
    MAX_RATE_HZ,
    MIN_RATE_HZ,
    unusable_source_rate,
)

if TYPE_CHECKING:
    import av

logger = logging.getLogger(__name__)

#: pieces waiting to be read, and decoded blocks waiting to be taken
MAX_PENDING = 8
#: FFmpeg reads this much at most to recognize the container, and then its streams,
#: before the first packet: its defaults (1 MB, then 5 MB and 5 s) would hold the first
#: words back for seconds, and raw audio sent by mistake would be refused only after
#: half a minute of it
PROBE_BYTES = 32_768
ANALYZE_MICROSECONDS = 500_000
#: decoded audio held back at most before it goes out, in milliseconds
FLUSH_MS = 250
#: formats (FFmpeg's demuxer names) whose frames a parser finds: parsed here, see above
PARSED_FORMATS = frozenset({"mp3", "flac"})
#: markers held while FFmpeg opens the stream, at most
MAX_HELD_MARKERS = 64
#: packets after a marker whose decoding may fail: the pieces of a frame the marker cut
RESYNC_PACKETS = 3


class ContainerError(Exception):
    """Audio that cannot be decoded: not a container FFmpeg knows, no audio in it, or
    damaged data. The message says which, for the client.

    ``cut_short``: the input had ended (``end``) inside the packet FFmpeg refused, which
    ran to its last byte: a client that stopped inside a piece (a fragmented MP4's last
    fragment), rather than damage in data that goes on after it."""

    def __init__(self, message: str, *, cut_short: bool = False) -> None:
        super().__init__(message)
        self.cut_short = cut_short


@dataclass(frozen=True)
class DecodedFormat:
    """What the decoded PCM is: 16-bit little-endian, channels interleaved."""

    sample_rate: int
    channels: int


@dataclass(frozen=True)
class Marker:
    """Something to do once the audio fed before it has come out (a Finalize)."""

    value: object


class _Closed(Exception):
    """The decoder was closed: the thread stops wherever it is."""


Output = DecodedFormat | bytes | Marker | None


class ToFirstFormat:
    """Decoded frames as 16-bit PCM in the first frame's layout and rate (8 to 48 kHz).

    A frame in another layout, rate or sample format (a chained Ogg, an MP3 that changes
    its channel mode) gets a resampler of its own: PyAV's one, made for the first frame,
    passes such frames through unchanged where the first needed no conversion (stereo
    bytes in a mono stream) and refuses them otherwise."""

    def __init__(self) -> None:
        self.format: DecodedFormat | None = None
        self._layout = ""
        self._source: tuple[str, str, int] | None = None  # what the resampler converts
        self._resampler: av.AudioResampler | None = None

    def start(self, frame: av.AudioFrame) -> DecodedFormat:
        """The format of everything out of ``convert``: the first frame's."""
        channels = frame.layout.nb_channels
        if not 1 <= channels <= MAX_CHANNELS:
            raise ContainerError(
                f"the audio has {channels} channels; at most {MAX_CHANNELS} are taken"
            )
        self._layout = frame.layout.name
        # a rate the server does not take is resampled into its range (a 6 kHz file was
        # refused with a message about a config.format the client never sent)
        rate = min(max(_source_rate(frame), MIN_RATE_HZ), MAX_RATE_HZ)
        self.format = DecodedFormat(rate, channels)
        return self.format

    def convert(self, frame: av.AudioFrame) -> list[bytes]:
        assert self.format is not None
        source = (frame.format.name, frame.layout.name, _source_rate(frame))
        out: list[bytes] = []
        if source != self._source:
            import av

            out = self.flush()  # what the last resampler still holds, in order
            # a format conversion only (no delay), unless the rate is outside 8-48 kHz
            self._resampler = av.AudioResampler(
                format="s16", layout=self._layout, rate=self.format.sample_rate
            )
            self._source = source
        assert self._resampler is not None
        return out + [block.to_ndarray().tobytes() for block in self._resampler.resample(frame)]

    def flush(self) -> list[bytes]:
        if self._resampler is None:
            return []
        return [block.to_ndarray().tobytes() for block in self._resampler.resample(None)]


def _source_rate(frame: av.AudioFrame) -> int:
    """The frame's rate, if one a recording can have: a WAV header saying 1 Hz had each
    second of audio resampled to 8,000 (the server worked through 14,400 s of audio for 32
    KB sent, and the client read that its stream ran too long)."""
    if unusable := unusable_source_rate(frame.sample_rate):
        raise ContainerError(f"the audio says {unusable}")
    return int(frame.sample_rate)


class ContainerDecoder:
    """One stream's container, fed piece by piece on the event loop, decoded on a thread.

    ``get`` returns, in order: the ``DecodedFormat`` (once, before the first audio), PCM
    blocks and markers, then None once ``end`` was called and everything is decoded. It
    raises ``ContainerError`` for audio FFmpeg cannot read, once the audio decoded before
    it has come out. ``close`` stops the thread; call it when the session ends, however
    it ends."""

    def __init__(self, name: str = "") -> None:
        self._loop = asyncio.get_running_loop()
        self._inbox: asyncio.Queue[bytes | Marker | None] = asyncio.Queue(MAX_PENDING)
        self._outbox: asyncio.Queue[Output | ContainerError] = asyncio.Queue(MAX_PENDING)
        self._closed = threading.Event()
        self._stopped = threading.Event()  # the thread has ended
        self._ended = False
        self._buffer = memoryview(b"")
        self._at_end = False  # the thread has read the end
        self._read_bytes = 0  # handed to FFmpeg
        self._held: list[bytes] = []  # decoded, not yet out (the thread's)
        self._held_bytes = 0
        self._flush_bytes = 0
        # what the thread took from the inbox while FFmpeg opens the stream (None after)
        self._recording: list[bytes | Marker] | None = []
        self._held_markers = 0
        self._thread = threading.Thread(target=self._run, name=f"decode-{name}", daemon=True)
        self._thread.start()

    # -- the event loop's side -------------------------------------------------------------

    async def feed(self, data: bytes) -> None:
        """Hand over the next piece of the container; waits while the thread is behind.
        Once decoding has stopped (an error, waiting in ``get``) pieces are dropped."""
        if self._ended:
            raise RuntimeError("feed after end")
        if not self._stopped.is_set():
            await self._inbox.put(data)

    async def mark(self, value: object) -> None:
        if not self._stopped.is_set():
            await self._inbox.put(Marker(value))

    async def end(self) -> None:
        """No more pieces: what is left is decoded, then ``get`` returns None."""
        if not self._ended:
            self._ended = True
            if not self._stopped.is_set():
                await self._inbox.put(None)

    async def get(self) -> Output:
        item = await self._outbox.get()
        if isinstance(item, ContainerError):
            raise item
        return item

    def close(self) -> None:
        """Stop the thread (it may be waiting on either queue) and drop what is queued."""
        self._closed.set()
        _empty(self._inbox)
        _empty(self._outbox)

    # -- the thread's side -----------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._decode()
            self._call(self._outbox.put(None))
        except _Closed:
            pass
        except ContainerError as exc:
            self._report(exc)
        except Exception as exc:  # anything unforeseen: FFmpeg's errors are handled below
            logger.exception("container decoding failed")
            self._report(ContainerError(f"the audio could not be decoded: {exc}"))
        finally:
            self._stopped.set()
            # nothing reads the pieces any more: free a feeder waiting for room
            with contextlib.suppress(RuntimeError):  # (the loop is closed)
                self._loop.call_soon_threadsafe(_empty, self._inbox)

    def _report(self, error: ContainerError) -> None:
        try:
            self._flush()  # what was decoded before the error goes out before it
            self._call(self._outbox.put(error))
        except _Closed:
            pass

    def _decode(self) -> None:
        import av  # FFmpeg's libraries: loaded only by sessions that send containers

        if not self._fill():
            self._release_recording()
            return  # ended before any audio: nothing to decode, and nothing wrong
        try:
            container = av.open(
                _Reader(self),
                mode="r",
                options={
                    "formatprobesize": str(PROBE_BYTES),
                    "probesize": str(PROBE_BYTES),
                    "analyzeduration": str(ANALYZE_MICROSECONDS),
                    # a live stream's WAV header cannot know the stream's length (writers
                    # put 0, the first piece's or any): read on to the end, not to its word
                    "ignore_length": "1",
                },
            )
        except av.FFmpegError as exc:
            raise ContainerError(
                "audio sent without an encoding must be in a container (WebM, Ogg, WAV, "
                f"FLAC, MP3…), and this is not one FFmpeg recognizes ({exc.strerror}); "
                "raw audio needs encoding and sample_rate in the query, and a container "
                "must be sent from its start (MediaRecorder's first piece holds the header)"
            ) from None
        with container:
            audio = next((s for s in container.streams if s.type == "audio"), None)
            if audio is None:
                raise ContainerError("the container holds no audio stream")
            converter = ToFirstFormat()
            if container.format.name in PARSED_FORMATS:
                self._decode_parsed(container, audio, converter)
            else:
                self._release_recording()
                for frame in self._frames(container, audio):
                    self._decoded(converter, frame)
            for pcm in converter.flush():
                self._hold(pcm)
            self._flush()

    def _decoded(self, converter: ToFirstFormat, frame: av.AudioFrame) -> None:
        if converter.format is None:
            decoded = converter.start(frame)
            self._call(self._outbox.put(decoded))
            self._flush_bytes = decoded.sample_rate * decoded.channels * 2 * FLUSH_MS // 1000
        for pcm in converter.convert(frame):
            self._hold(pcm)

    def _decode_parsed(self, container: Any, audio: Any, converter: ToFirstFormat) -> None:
        """MP3 or FLAC: the first frame as FFmpeg's demuxer reads it (an MP3's first one
        carries how many samples the encoder put before the audio, for the decoder to drop),
        then every frame after it parsed here, from the bytes the demuxer read onwards."""
        packets = (p for p in _packets(container, audio) if p.size)
        first = next(packets, None)
        if first is None or first.pos < 0:  # (no frame, or FFmpeg cannot say where)
            self._release_recording()
            for packet in itertools.chain([first] if first else [], packets):
                for frame in _decode_packet(audio.codec_context, packet):
                    self._decoded(converter, frame)
            return
        frames = _ParsedFrames(audio.codec_context)
        for frame in frames.first(first):
            self._decoded(converter, frame)
        skip = first.pos + first.size  # the container's start and the first frame
        recorded, self._recording = self._recording or [], None
        self._buffer = memoryview(b"")  # (read from the recording instead)
        for item in itertools.chain(recorded, self._items()):
            if isinstance(item, Marker):
                for frame in frames.flush():
                    self._decoded(converter, frame)
                self._flush()
                self._call(self._outbox.put(item))
                continue
            if skip:
                item, skip = item[skip:], max(0, skip - len(item))
            for frame in frames.feed(item):
                self._decoded(converter, frame)
        for frame in frames.flush():
            self._decoded(converter, frame)

    def _items(self) -> Iterator[bytes | Marker]:
        """What arrives, pieces and markers, until the end; what is decoded goes out
        before waiting for more."""
        while not self._at_end:
            self._flush()
            item = self._call(self._inbox.get())
            if item is None:
                self._at_end = True
                return
            yield item

    def _release_recording(self) -> None:
        """FFmpeg has opened the stream and reads it itself: the markers that came while
        it probed go out now (before the first audio)."""
        recorded, self._recording = self._recording or [], None
        for item in recorded:
            if isinstance(item, Marker):
                self._call(self._outbox.put(item))

    def _hold(self, pcm: bytes) -> None:
        """Decoded audio goes out in blocks of what one piece gave (an Opus frame is 20 ms:
        one hop to the event loop each would cost more than decoding it), at the latest
        when FFmpeg needs more input, or once ``FLUSH_MS`` of it is held."""
        self._held.append(pcm)
        self._held_bytes += len(pcm)
        if self._held_bytes >= self._flush_bytes:
            self._flush()

    def _flush(self) -> None:
        if self._held:
            block = b"".join(self._held)
            self._held.clear()
            self._held_bytes = 0
            self._call(self._outbox.put(block))

    def _read(self, size: int) -> bytes:
        """FFmpeg's read: what has arrived (at most ``size`` bytes), waiting while nothing
        has; b"" at the end."""
        if not self._fill():
            return b""
        chunk, self._buffer = self._buffer[:size], self._buffer[size:]
        self._read_bytes += len(chunk)
        return bytes(chunk)

    def _fill(self) -> bool:
        """Wait until there are bytes to read (True) or the end (False). Markers met on the
        way go out at once: after the audio of everything read before them."""
        while not self._buffer:
            if self._at_end:
                return False  # (FFmpeg may ask again after the end)
            self._flush()  # everything decoded so far goes out before we wait for more
            item = self._call(self._inbox.get())
            if item is None:
                self._at_end = True
                return False
            if isinstance(item, Marker):
                if self._recording and self._held_markers < MAX_HELD_MARKERS:
                    self._recording.append(item)  # after audio: waits until the stream opens
                    self._held_markers += 1
                else:  # (a client sending commands only meets the session's own limit)
                    self._call(self._outbox.put(item))
                continue
            if self._recording is not None:
                self._recording.append(item)
            self._buffer = memoryview(item)
        return True

    def _frames(self, container: Any, stream: Any) -> Iterator[Any]:
        """The stream's decoded frames; data FFmpeg refuses is a ContainerError, which says
        whether the end cut the packet refused short."""
        import av

        packet, decoding = None, False
        try:
            for packet in container.demux(stream):
                decoding = True
                yield from packet.decode()
                decoding = False
        except av.FFmpegError as exc:
            # FFmpeg may have read the end ahead of a damaged packet (while probing a short
            # stream): the packet must reach it. Where a reading error lies is not known.
            cut_short = decoding and self._at_end and _end_of(packet) >= self._read_bytes
            raise ContainerError(
                f"the audio could not be decoded ({exc.strerror})", cut_short=cut_short
            ) from None

    def _call(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Run a queue operation on the event loop and wait for it, giving up when closed."""
        if self._closed.is_set():
            coroutine.close()
            raise _Closed
        try:
            future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        except RuntimeError:  # the loop is closed
            coroutine.close()
            raise _Closed from None
        while True:
            try:
                return future.result(timeout=0.2)
            except concurrent.futures.TimeoutError:
                if self._closed.is_set():
                    future.cancel()
                    raise _Closed from None
            except concurrent.futures.CancelledError:
                raise _Closed from None


def _empty(queue: asyncio.Queue[Any]) -> None:
    while not queue.empty():
        queue.get_nowait()


class _Reader:
    """The file object FFmpeg reads from: ``read`` only, so it is not seekable (a stream
    that needs seeking, like an MP4 with its index at the end, is refused)."""

    def __init__(self, decoder: ContainerDecoder) -> None:
        self._decoder = decoder

    def read(self, size: int) -> bytes:
        try:
            return self._decoder._read(size)
        except _Closed:
            # the end, to FFmpeg (an exception raised through it would be printed and
            # dropped); the thread stops at its next step
            return b""


class _ParsedFrames:
    """An MP3's or FLAC's frames parsed from its bytes (FFmpeg's parser, with PyAV's
    ``CodecContext.parse``) and decoded. ``flush`` takes every whole frame out of the
    parser, which then starts afresh (a flushed FLAC parser must not be fed again)."""

    def __init__(self, decoder: Any) -> None:
        self._decoder = decoder
        self._parser: Any = None
        # after a flush the bytes may start inside a frame: the parser takes what comes
        # before the next frame for frames, which do not decode
        self._resync_packets = 0

    def first(self, packet: Any) -> list[Any]:
        return _decode_packet(self._decoder, packet)

    def feed(self, data: bytes) -> list[Any]:
        if not data:
            return []  # (no bytes is a flush to the parser)
        if self._parser is None:
            import av

            self._parser = av.CodecContext.create(self._decoder.name, "r")
        return self._decode(self._parser.parse(data))

    def flush(self) -> list[Any]:
        """The frames the parser holds: the last may be cut short (a marker in the middle
        of a frame, or the end of what was sent), and its error is no client's fault."""
        if self._parser is None:
            return []
        packets = []
        while more := self._parser.parse(None):  # one packet a call
            packets += more
        self._parser = None
        frames = self._decode(packets, tolerate=True)
        self._resync_packets = RESYNC_PACKETS
        return frames

    def _decode(self, packets: list[Any], tolerate: bool = False) -> list[Any]:
        import av

        frames: list[Any] = []
        for packet in packets:
            resyncing, self._resync_packets = self._resync_packets > 0, self._resync_packets - 1
            try:
                frames += self._decoder.decode(packet)
            except av.FFmpegError as exc:
                if not (tolerate or resyncing):
                    raise ContainerError(
                        f"the audio could not be decoded ({exc.strerror})"
                    ) from None
                logger.debug("a frame cut by a marker or the end was dropped: %s", exc)
        return frames


def _decode_packet(decoder: Any, packet: Any) -> list[Any]:
    import av

    try:
        return list(decoder.decode(packet))
    except av.FFmpegError as exc:
        raise ContainerError(f"the audio could not be decoded ({exc.strerror})") from None


def _packets(container: Any, stream: Any) -> Iterator[Any]:
    """The stream's packets; damaged data is a ContainerError."""
    import av

    try:
        yield from container.demux(stream)
    except av.FFmpegError as exc:
        raise ContainerError(f"the audio could not be read ({exc.strerror})") from None


def _end_of(packet: Any) -> int:
    """Where a packet's bytes end in the stream; -1 where FFmpeg cannot say."""
    return -1 if packet is None or packet.pos is None else packet.pos + packet.size
