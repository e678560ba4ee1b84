"""Read audio files into 16-bit PCM frames at their own rate and channel count, and cut chunks.

The client sends LINEAR16 at the file's native rate with ``channels=N`` and lets the
server resample and recognize each channel, so what the server hears is exactly what is in
the file. Only a rate the server does not take (asr_server.audio.decode's MIN_RATE_HZ to
MAX_RATE_HZ) is resampled here first.
"""

from __future__ import annotations

import contextlib
import logging
import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asr_server.audio.decode import MAX_RATE_HZ, MIN_RATE_HZ, SAMPLE_RATE

logger = logging.getLogger(__name__)


class AudioFileError(Exception):
    """The file is missing or in a format neither soundfile nor PyAV can decode."""


#: the largest audio message a server takes by default (its
#: ``streaming.max_audio_message_bytes``)
MAX_AUDIO_MESSAGE_BYTES = 1 << 20
#: channels correlated at least this much carry the same signal: one recording, not a call
SAME_SIGNAL_CORRELATION = 0.8
#: the largest delay between the channels of one recording that still counts as the same
#: signal: a spaced microphone pair puts up to about 1.5 ms (50 cm) between its channels
MAX_CHANNEL_LAG_S = 0.005
#: the channels are compared in windows of this long (at most CORRELATION_BLOCK_FRAMES) ...
CORRELATION_WINDOW_S = 2.0
#: ... and at most this many of them, spread over the file: two minutes of audio say
#: whether the channels are alike as well as an hour does, at a fraction of the cost
MAX_CORRELATION_WINDOWS = 60
#: the most frames one window holds (memory: about 5 float64 copies of one channel's)
CORRELATION_BLOCK_FRAMES = 1 << 20


#: a channel whose loudest 30 ms frame is quieter than this is quiet for the server's
#: voice detector, which raises a channel under -28 dBFS only gradually and by at most
#: 10 dB (asr_server/vad/level.py): its first words, or all of it, may be missed (a
#: recording at -40 lost its first 3 s, one at -59 every word; read speech at -29, three
#: of the shared corpus's 76 recordings, is heard whole)
QUIET_LEVEL_DB = -35.0
#: where ``--normalize`` brings a channel's loudest frame: a recording made at a good level
NORMAL_LEVEL_DB = -12.0
#: and the highest sample it lets that make (-1 dBFS)
MAX_SAMPLE_AFTER_RAISE = 29_204


@dataclass(frozen=True)
class PcmAudio:
    """Interleaved signed 16-bit samples, shape ``(frames, channels)``."""

    frames: np.ndarray
    sample_rate_hz: int

    @property
    def channels(self) -> int:
        return int(self.frames.shape[1])

    @property
    def duration_s(self) -> float:
        return len(self.frames) / self.sample_rate_hz

    def mixed(self) -> PcmAudio:
        """One channel: the mean of all of them, each channel that carries the first's
        signal upside down (a wiring slip, a balanced line's other leg) turned over first:
        averaged as it is, it would cancel the first to silence."""
        if self.channels == 1:
            return self
        polarity = np.where(self._similarity_to_first() <= -SAME_SIGNAL_CORRELATION, -1, 1)
        mean = (self.frames.astype(np.int32) * polarity).mean(axis=1, keepdims=True)
        return PcmAudio(np.round(mean).astype(np.int16), self.sample_rate_hz)

    def channels_alike(self, threshold: float = SAME_SIGNAL_CORRELATION) -> bool:
        """Do all channels carry the same signal (a plain stereo recording of one scene:
        correlation at least ``threshold`` with the first, or at most ``-threshold`` for a
        channel wired with its polarity reversed, at the best lag within MAX_CHANNEL_LAG_S,
        since spaced microphones hear a sound at slightly different times)? A call
        recorded agent/customer on two channels does not: each hears mostly its own side."""
        return bool(np.all(np.abs(self._similarity_to_first()) >= threshold))

    def _similarity_to_first(self) -> np.ndarray:
        """Per channel, its correlation with the first at the lag within MAX_CHANNEL_LAG_S
        where it is strongest, with its sign: 1 the same signal, -1 the same upside down,
        0 unrelated. Silence is like silence (1) and like nothing else (0)."""
        if self.channels == 1:
            return np.ones(1)
        lags = max(1, round(MAX_CHANNEL_LAG_S * self.sample_rate_hz))
        windows = self._correlation_windows()
        # window by window, in two passes (the means, then the centred sums): a float64
        # copy of a whole hour of 48 kHz stereo would be gigabytes
        count = sum(len(self.frames[w]) for w in windows)
        mean = sum(self.frames[w].sum(axis=0, dtype=np.float64) for w in windows) / count
        squares = np.zeros(self.channels)
        with_first = np.zeros((self.channels, 2 * lags + 1))  # lags -lags..lags
        for w in windows:
            first = self.frames[w, 0].astype(np.float64) - mean[0]
            # a power of two: a window is 2 s, so even doubled it is small
            size = 1 << (len(first) + lags - 1).bit_length()
            spectrum = np.conj(np.fft.rfft(first, size))
            squares[0] += first @ first
            for c in range(1, self.channels):
                x = self.frames[w, c].astype(np.float64) - mean[c]
                squares[c] += x @ x
                # sum over n of first[n] * x[n + lag], for every lag at once
                circular = np.fft.irfft(spectrum * np.fft.rfft(x, size), size)
                with_first[c] += np.concatenate([circular[-lags:], circular[: lags + 1]])
        energy = np.sqrt(squares)
        similarity = np.ones(self.channels)
        for c in range(1, self.channels):
            if energy[0] == 0 or energy[c] == 0:
                similarity[c] = float(energy[0] == energy[c])
                continue
            strongest = with_first[c][np.argmax(np.abs(with_first[c]))]
            similarity[c] = strongest / (energy[0] * energy[c])
        return similarity

    def _correlation_windows(self) -> list[slice]:
        """The stretches of the file whose channels are compared: all of it in windows,
        or MAX_CORRELATION_WINDOWS of them evenly spread over a long file."""
        frames = len(self.frames)
        size = max(
            1, min(CORRELATION_BLOCK_FRAMES, round(CORRELATION_WINDOW_S * self.sample_rate_hz))
        )
        starts = list(range(0, frames, size))
        if len(starts) > MAX_CORRELATION_WINDOWS:
            spread = np.linspace(0, frames - size, MAX_CORRELATION_WINDOWS)
            starts = [int(start) for start in spread]
        return [slice(start, start + size) for start in starts]

    def resampled(self, rate_hz: int) -> PcmAudio:
        """At ``rate_hz`` (soxr, its default high quality)."""
        import soxr

        if rate_hz == self.sample_rate_hz:
            return self
        frames = soxr.resample(np.ascontiguousarray(self.frames), self.sample_rate_hz, rate_hz)
        return PcmAudio(np.asarray(frames, np.int16).reshape(-1, self.channels), rate_hz)

    def loudest_frame_db(self) -> list[float]:
        """Per channel, the RMS of its loudest 30 ms frame, in dB relative to full scale
        (the level the server's voice detector judges a channel by; -inf: all zeros)."""
        frame = max(1, self.sample_rate_hz * 30 // 1000)
        whole = len(self.frames) // frame * frame or len(self.frames)
        levels = []
        for channel in self.frames[:whole].T:
            blocks = channel.astype(np.float64).reshape(-1, min(frame, len(channel)) or 1)
            rms = float(np.sqrt((blocks**2).mean(axis=1)).max(initial=0.0)) / 32768
            levels.append(20 * math.log10(rms) if rms > 0 else -math.inf)
        return levels

    def raised(self) -> tuple[PcmAudio, list[float]]:
        """Each channel raised so that its loudest 30 ms frame is at ``NORMAL_LEVEL_DB``,
        never so far that a sample clips, and never lowered; with the gain of each (dB)."""
        gains = []
        peaks = np.abs(self.frames.astype(np.int32)).max(axis=0, initial=0)
        for level, peak in zip(self.loudest_frame_db(), peaks, strict=True):
            if not math.isfinite(level) or peak == 0:
                gains.append(0.0)
                continue
            headroom = 20 * math.log10(MAX_SAMPLE_AFTER_RAISE / int(peak))
            gains.append(max(0.0, min(NORMAL_LEVEL_DB - level, headroom)))
        scale = np.array([10 ** (g / 20) for g in gains])
        frames = np.clip(np.round(self.frames * scale), -32768, 32767).astype(np.int16)
        return PcmAudio(frames, self.sample_rate_hz), gains

    def to_bytes(self) -> bytes:
        """LINEAR16 little-endian, interleaved: the wire format of a ``LINEAR16`` stream."""
        return np.ascontiguousarray(self.frames, dtype="<i2").tobytes()

    def chunks(self, chunk_ms: int, max_bytes: int = MAX_AUDIO_MESSAGE_BYTES) -> Iterator[bytes]:
        """LINEAR16 chunks of ``chunk_ms`` each (the last one may be shorter), but never
        more than ``max_bytes`` of whole frames: a long chunk of many channels (5 s of
        4 channels at 44.1 kHz is 1.7 MB) goes as several messages, which the server takes."""
        step = max(1, self.sample_rate_hz * chunk_ms // 1000)
        step = max(1, min(step, max_bytes // (2 * self.channels)))
        for start in range(0, len(self.frames), step):
            block = self.frames[start : start + step]
            yield np.ascontiguousarray(block, dtype="<i2").tobytes()


def rate_for_server(rate_hz: int) -> int:
    """The rate to send audio recorded at ``rate_hz``: its own where the server takes it;
    48 kHz from above (nothing a recognizer uses is lost); 16 kHz from below (Whisper's)."""
    if rate_hz > MAX_RATE_HZ:
        return MAX_RATE_HZ
    if rate_hz < MIN_RATE_HZ:
        return SAMPLE_RATE
    return rate_hz


def load_audio(path: str | Path) -> PcmAudio:
    """Decode ``path`` (WAV, FLAC, OGG, MP3 … ) into int16 frames at its native rate."""
    path = Path(path)
    if not path.is_file():
        if path.is_dir():
            raise AudioFileError(f"{path}: is a directory, not an audio file")
        if path.exists():  # a FIFO or a device: reading it could block or never end
            raise AudioFileError(f"{path}: not a regular file")
        raise AudioFileError(f"{path}: no such file")
    try:
        kind = _soundfile_format(path)
        if kind == "MP3":
            with contextlib.suppress(Exception):  # no PyAV, or it cannot: libsndfile's turn
                return _load_pyav(path)
        if kind == "OGG":
            return _load_ogg_links(path)
        return _load_soundfile(path)
    except AudioFileError as empty:
        # no frames: an empty file, or a WAV whose header sizes were never written (its
        # recorder was killed), which libsndfile reads as empty and ffmpeg reads whole.
        # Said once if PyAV finds nothing either, not once per decoder.
        try:
            return _load_pyav(path)
        except Exception:
            raise empty from None
    except Exception as sf_error:  # soundfile raises several unrelated types for "can't read"
        try:
            return _load_pyav(path)
        except ImportError:
            raise AudioFileError(
                f"{path}: cannot decode ({sf_error}); for more formats install PyAV "
                "(pip install av)"
            ) from None
        except Exception as av_error:
            raise AudioFileError(
                f"{path}: not a readable audio file (soundfile: {sf_error}; PyAV: {av_error})"
            ) from None


# Files joined end to end, which libsndfile reads only the first part of, silently:
#  - MP3s joined with ``cat``: it stops at the first one's sample count. They are read
#    with FFmpeg (PyAV), sample-exact for MP3 (its gapless trimming included).
#  - A chained Ogg (links, each a stream of its own, one after the other: Icecast
#    records them so, and ``cat`` makes one). It is read link by link, each with
#    libsndfile, not FFmpeg: FFmpeg decodes every Opus file at 48 kHz and puts the
#    channels of a 3+ channel Vorbis file in its own order, and ends Vorbis files a few
#    hundred samples off their stated length.


def _soundfile_format(path: Path) -> str | None:
    import soundfile

    try:
        return str(soundfile.info(str(path)).format)
    except Exception:  # not a format libsndfile knows: the fallbacks decide
        return None


def _load_ogg_links(path: Path) -> PcmAudio:
    """An Ogg file, each link of a chained one decoded on its own, in the first link's
    rate and channels (a later link in others is resampled, or mixed and spread)."""
    import io

    import soundfile

    links = ogg_links(path.read_bytes())  # one, for most files: read from these bytes too
    first, rate = soundfile.read(io.BytesIO(links[0]), dtype="float32", always_2d=True)
    parts = [first]
    for link in links[1:]:
        data, link_rate = soundfile.read(io.BytesIO(link), dtype="float32", always_2d=True)
        if data.shape[1] != first.shape[1]:
            data = np.repeat(data.mean(axis=1, keepdims=True), first.shape[1], axis=1)
        if link_rate != rate:
            import soxr

            data = np.asarray(soxr.resample(data, link_rate, rate), np.float32).reshape(
                -1, first.shape[1]
            )
        parts.append(data)
    return _checked(path, to_int16(np.concatenate(parts)), int(rate))


#: an Ogg page header: capture pattern, version, header type, granule position, stream
#: serial number, page sequence number, CRC, number of segments (RFC 3533)
_OGG_PAGE = struct.Struct("<4sBBqIIIB")
_OGG_BEGINS_STREAM = 0x02


def ogg_links(data: bytes) -> list[bytes]:
    """The links of a chained Ogg file (each a whole Ogg stream): it is cut where a page
    begins a stream after pages of another. One link (``[data]``) where the file is not
    chained, or its pages cannot be walked (libsndfile then reads it as it can)."""
    cuts, at, in_stream = [0], 0, False
    while at < len(data):
        if len(data) - at < _OGG_PAGE.size:
            return [data]
        magic, _, kind, _, _, _, _, segments = _OGG_PAGE.unpack_from(data, at)
        table = data[at + _OGG_PAGE.size : at + _OGG_PAGE.size + segments]
        if magic != b"OggS" or len(table) != segments:
            return [data]
        if kind & _OGG_BEGINS_STREAM:
            if in_stream:
                cuts.append(at)
            in_stream = False
        else:
            in_stream = True
        at += _OGG_PAGE.size + segments + sum(table)
    return [data[a:b] for a, b in zip(cuts, [*cuts[1:], len(data)], strict=True)]


def _load_soundfile(path: Path) -> PcmAudio:
    import soundfile

    # Read as float and scale here: asking libsndfile for int16 truncates float files
    # (0.5 becomes 0) instead of scaling them. float32 holds every int16 value exactly.
    data, rate = soundfile.read(path, dtype="float32", always_2d=True)
    return _checked(path, to_int16(data), int(rate))


#: rows (frames) converted at a time: each step of the conversion of a whole file made a
#: float copy of it, and a 30-minute 44.1 kHz stereo file peaked at 2.4 GB (8x its int16)
_CONVERT_ROWS = 1 << 16


def to_int16(samples: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1] to int16, rounded, with full scale clipped rather than
    wrapped; a NaN (a float file's broken sample) is silence, an infinity full scale.
    Converted a block at a time: besides the result, memory for one block."""
    out = np.empty(samples.shape, np.int16)
    for start in range(0, len(samples), _CONVERT_ROWS):
        rows = slice(start, start + _CONVERT_ROWS)
        block = np.nan_to_num(samples[rows], nan=0.0, posinf=1.0, neginf=-1.0)  # a copy
        block *= 32768.0
        np.rint(block, out=block)
        out[rows] = np.clip(block, -32768, 32767, out=block)
    return out


def _load_pyav(path: Path) -> PcmAudio:
    import av

    with av.open(str(path)) as container:
        if not container.streams.audio:
            raise AudioFileError("no audio stream")
        stream = container.streams.audio[0]
        channels = stream.codec_context.channels
        rate = stream.codec_context.sample_rate
        layout = stream.codec_context.layout
        parts: list[np.ndarray] = []

        def converted_by(resampler: av.AudioResampler, frame: av.AudioFrame | None) -> None:
            for converted in resampler.resample(frame):
                parts.append(converted.to_ndarray().reshape(-1, channels))

        # packed s16 at the first frame's rate and layout: a format change only, unless
        # the file changes its rate or layout part way (joined recordings, a chained Ogg):
        # a resampler takes one input format, so each new one gets its own, and its
        # audio comes out in the first one's
        resampler, heard = None, None
        frames = _DecodedFrames(container, stream)
        for frame in frames:
            if resampler is None or heard != (frame.format.name, frame.layout.name, frame.rate):
                if resampler is not None:
                    converted_by(resampler, None)  # flush what it buffered
                heard = (frame.format.name, frame.layout.name, frame.rate)
                resampler = av.AudioResampler(format="s16", layout=layout, rate=rate)
            converted_by(resampler, frame)
        if resampler is not None:
            converted_by(resampler, None)
    if frames.skipped:
        # said, as FFmpeg says it: a damaged file's gaps are not silently closed up
        logger.warning(
            "%s: %d packet(s) the decoder could not read were skipped (a joined file's"
            " header is one; more means the file is damaged)",
            path,
            frames.skipped,
        )
    data = np.concatenate(parts) if parts else np.zeros((0, channels), dtype=np.int16)
    return _checked(path, data.astype(np.int16, copy=False), int(rate))


class _DecodedFrames:
    """A stream's decoded frames, past packets the decoder refuses (counted in
    ``skipped``): where files were joined, the second one's header (an MP3's Xing frame)
    sits among the audio, as FFmpeg's own command line skips it."""

    def __init__(self, container, stream) -> None:  # type: ignore[no-untyped-def]
        self.container, self.stream = container, stream
        self.skipped = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        import av

        for packet in self.container.demux(self.stream):
            try:
                yield from packet.decode()
            except av.error.InvalidDataError:
                self.skipped += 1


def _checked(path: Path, data: np.ndarray, rate: int) -> PcmAudio:
    if data.ndim != 2 or data.shape[1] == 0:
        raise AudioFileError(f"{path}: no audio channels")
    if len(data) == 0:
        raise AudioFileError(f"{path}: the file holds no audio")
    return PcmAudio(data, rate)
