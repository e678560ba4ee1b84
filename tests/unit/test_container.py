"""asr_bridge.container: containers decoded as they arrive, from real recordings encoded
with FFmpeg at test time (what a browser's MediaRecorder or a file upload sends)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import wave

import numpy as np
import pytest
import soxr

from asr_bridge.container import (
    MAX_PENDING,
    ContainerDecoder,
    ContainerError,
    DecodedFormat,
    Marker,
)
from tests.helpers import corpus, encode_container, read_pcm16

pytestmark = pytest.mark.timeout(60)

RECORDING = "libri_1089-134686-0000"  # 10.4 s of read speech, 16 kHz mono
FRAGMENTED_MP4 = {"movflags": "frag_keyframe+empty_moov+default_base_moof"}


def speech() -> tuple[np.ndarray, int]:
    pcm, rate = read_pcm16(corpus()[RECORDING].path)
    return pcm[:, :1], rate


def split(data: bytes, piece: int) -> list[bytes]:
    return [data[i : i + piece] for i in range(0, len(data), piece)]


async def decode(
    data: bytes,
    piece: int = 4_000,
    mark_at: float | None = None,
    mark_after_byte: int | None = None,
) -> tuple[DecodedFormat | None, np.ndarray, float | None]:
    """Feed ``data`` in pieces (a marker after the fraction ``mark_at`` of them, or after
    its first ``mark_after_byte`` bytes), take everything out: the format, the PCM
    (frames × channels) and the seconds of audio that came out before the marker."""
    decoder = ContainerDecoder("test")
    if mark_after_byte is None:
        pieces = split(data, piece)
        mark_before = None if mark_at is None else int(len(pieces) * mark_at)
    else:
        pieces = split(data[:mark_after_byte], piece)
        mark_before = len(pieces)
        pieces += split(data[mark_after_byte:], piece)

    async def feed() -> None:
        for n, chunk in enumerate(pieces):
            if n == mark_before:
                await decoder.mark("here")
            await decoder.feed(chunk)
        await decoder.end()

    feeder = asyncio.create_task(feed())
    fmt: DecodedFormat | None = None
    blocks: list[bytes] = []
    marked_at = None
    try:
        while (item := await decoder.get()) is not None:
            if isinstance(item, DecodedFormat):
                assert fmt is None and not blocks  # once, before any audio
                fmt = item
            elif isinstance(item, Marker):
                assert fmt is not None and item.value == "here"
                marked_at = sum(map(len, blocks)) / 2 / fmt.channels / fmt.sample_rate
            else:
                blocks.append(item)
        await feeder
    finally:
        feeder.cancel()
        decoder.close()
    channels = fmt.channels if fmt else 1
    pcm = np.frombuffer(b"".join(blocks), dtype="<i2").reshape(-1, channels)
    return fmt, pcm, marked_at


def envelope(x: np.ndarray, rate: int) -> np.ndarray:
    """RMS in 20 ms frames: what survives a lossy codec of the waveform's shape."""
    hop = rate // 50
    frames = x[: len(x) // hop * hop].astype(np.float64).reshape(-1, hop)
    return np.sqrt((frames**2).mean(axis=1))


@pytest.mark.parametrize(
    ("fmt", "codec", "options"),
    [
        ("webm", "libopus", None),  # Chrome's and Firefox's MediaRecorder
        ("ogg", "libopus", None),  # Firefox's, and Deepgram's encoding=opus
        ("mp4", "aac", FRAGMENTED_MP4),  # Safari's MediaRecorder writes fragmented MP4
        ("wav", "pcm_s16le", None),
        ("flac", "flac", None),
        ("mp3", "libmp3lame", None),
    ],
)
async def test_each_container_decodes_to_the_audio_it_holds(
    fmt: str, codec: str, options: dict[str, str] | None
) -> None:
    pcm, rate = speech()
    data = encode_container(pcm, rate, fmt, codec, options=options)
    decoded_format, decoded, _ = await decode(data)
    assert decoded_format == DecodedFormat(48_000, 1)
    seconds = len(pcm) / rate
    assert len(decoded) / 48_000 == pytest.approx(seconds, abs=0.06)
    # the same speech: its loudness contour, aligned, matches the recording's
    back = soxr.resample(decoded[:, 0].astype(np.float32), 48_000, rate)
    ours, theirs = envelope(pcm[:, 0], rate), envelope(back, rate)
    n = min(len(ours), len(theirs))
    best = max(
        np.corrcoef(ours[max(0, -s) : n - max(0, s)], theirs[max(0, s) : n - max(0, -s)])[0, 1]
        for s in range(-3, 4)  # codec delays of up to 60 ms
    )
    assert best > 0.95, best


@pytest.mark.parametrize(("fmt", "codec"), [("wav", "pcm_s16le"), ("flac", "flac")])
async def test_lossless_containers_give_back_every_sample(fmt: str, codec: str) -> None:
    pcm, rate = speech()
    data = encode_container(pcm, rate, fmt, codec, out_rate=rate)
    decoded_format, decoded, _ = await decode(data, piece=1_234)
    assert decoded_format == DecodedFormat(rate, 1)
    np.testing.assert_array_equal(decoded, pcm)


@pytest.mark.parametrize(("out_rate", "server_rate"), [(6_000, 8_000), (96_000, 48_000)])
async def test_a_rate_outside_the_servers_range_is_resampled_into_it(
    out_rate: int, server_rate: int
) -> None:
    """A 6 kHz WAV went to the server as a 6 kHz stream, and the client read a refusal
    of a ``config.format`` it never sent; 96 kHz was resampled, 6 kHz now is too."""
    pcm, rate = speech()
    data = encode_container(pcm, rate, "wav", "pcm_s16le", out_rate=out_rate)
    decoded_format, decoded, _ = await decode(data)
    assert decoded_format == DecodedFormat(server_rate, 1)
    assert len(decoded) / server_rate == pytest.approx(len(pcm) / rate, abs=0.02)


def wav_saying(rate: int, pcm: np.ndarray) -> bytes:
    """A WAV of ``pcm`` whose header says ``rate``."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.astype("<i2").tobytes())
    return out.getvalue()


async def test_a_live_wav_is_decoded_past_the_length_its_header_gives() -> None:
    """A live stream's WAV header cannot know how long the stream will be: one written
    with the first second's length (or any length) had everything after it dropped."""
    pcm, rate = speech()
    data = wav_saying(rate, pcm[:rate])  # the header says 1 s …
    _, decoded, _ = await decode(data + pcm[rate:].astype("<i2").tobytes())  # … 10.4 s follow
    assert len(decoded) == len(pcm)
    assert np.array_equal(decoded[:, 0], pcm[:, 0])


@pytest.mark.parametrize("rate", [1, 100, 3_999])
async def test_a_header_saying_a_rate_no_recording_has_is_refused(rate: int) -> None:
    """A WAV header saying 1 Hz was taken at its word and resampled up to 8 kHz: 32 KB
    sent made 14,400 s of audio for the server to work through."""
    pcm, _ = speech()
    with pytest.raises(ContainerError, match=f"its sample rate is {rate} Hz; rates below 4000"):
        await decode(wav_saying(rate, pcm[:16_000]))


async def test_the_lowest_rate_taken_is_resampled_up() -> None:
    pcm, _ = speech()
    decoded_format, decoded, _ = await decode(wav_saying(4_000, pcm[:8_000]))
    assert decoded_format == DecodedFormat(8_000, 1)
    assert len(decoded) == pytest.approx(16_000, abs=64)  # 2 s, as the header says


async def test_stereo_keeps_its_channels() -> None:
    pcm, rate = speech()
    stereo = np.concatenate([pcm, pcm // 2], axis=1)  # the second channel at half level
    decoded_format, decoded, _ = await decode(encode_container(stereo, rate, "webm", "libopus"))
    assert decoded_format == DecodedFormat(48_000, 2)
    level = np.sqrt((decoded.astype(np.float64) ** 2).mean(axis=0))
    assert level[1] / level[0] == pytest.approx(0.5, abs=0.05)


async def test_a_marker_comes_out_after_the_audio_fed_before_it() -> None:
    """A Finalize applies to the audio sent before it: in WebM (what browsers send) every
    block of Opus is whole in the bytes before the marker but the last one cut by it."""
    pcm, rate = speech()
    data = encode_container(pcm, rate, "webm", "libopus")
    _, decoded, marked_at = await decode(data, piece=2_000, mark_at=0.5)
    # the audio in the bytes before the marker: those bytes decoded alone
    before = -(-len(data) // 2_000) // 2 * 2_000
    _, alone, _ = await decode(data[:before], piece=2_000)
    assert 1.0 < len(alone) / 48_000 < len(decoded) / 48_000 - 1.0  # (a real cut)
    assert marked_at == pytest.approx(len(alone) / 48_000, abs=0.021)  # an Opus frame


def frame_ends(data: bytes) -> list[int]:
    """Where each of the stream's frames ends, in bytes, as FFmpeg's demuxer finds them."""
    import io

    import av

    with av.open(io.BytesIO(data)) as container:
        return [p.pos + p.size for p in container.demux(container.streams.audio[0]) if p.size]


@pytest.mark.parametrize(("fmt", "codec"), [("mp3", "libmp3lame"), ("flac", "flac")])
async def test_a_marker_comes_out_after_every_frame_fed_before_it(fmt: str, codec: str) -> None:
    """MP3 and FLAC: FFmpeg's parser held back the frames before a Finalize (up to 100 ms
    of MP3, 600 ms of FLAC) until more came, so they were heard after it, in the next
    utterance. Every frame fed before the marker now comes out before it."""
    pcm, rate = speech()
    data = encode_container(pcm, rate, fmt, codec)
    ends = frame_ends(data)
    cut = ends[len(ends) // 2]  # a Finalize in the middle, between two frames
    _, decoded, marked_at = await decode(data, piece=2_000, mark_after_byte=cut)
    _, alone, _ = await decode(data[:cut], piece=2_000)  # those frames decoded alone
    assert 4.0 < len(alone) / 48_000 < len(decoded) / 48_000 - 4.0  # (a real cut)
    assert marked_at == pytest.approx(len(alone) / 48_000, abs=1e-6)
    assert len(decoded) / 48_000 == pytest.approx(len(pcm) / rate, abs=0.06)


@pytest.mark.parametrize(("fmt", "codec"), [("mp3", "libmp3lame"), ("flac", "flac")])
async def test_a_marker_inside_a_frame_costs_that_frame_only(fmt: str, codec: str) -> None:
    """A marker that cuts a frame in two: the frames before it come out before it, that
    frame (whose halves cannot be decoded) is dropped, and decoding goes on after it."""
    pcm, rate = speech()
    data = encode_container(pcm, rate, fmt, codec)
    ends = frame_ends(data)
    cut = ends[len(ends) // 2] + 37
    _, decoded, marked_at = await decode(data, piece=2_000, mark_after_byte=cut)
    _, alone, _ = await decode(data[: ends[len(ends) // 2]], piece=2_000)
    frame_s = len(decoded) / 48_000 / len(ends)
    assert marked_at is not None
    # (MP3's decoder makes what it can of the frame's first part)
    assert len(alone) / 48_000 <= marked_at <= len(alone) / 48_000 + frame_s + 0.001
    assert len(decoded) / 48_000 > len(pcm) / rate - 3 * frame_s  # that frame, and a resync


def fragmented_mp4() -> tuple[bytes, list[tuple[int, int]]]:
    """6 s of speech as Safari's MediaRecorder writes it (a fragment a second), and where
    each of its AAC packets lies (offset, size)."""
    import io

    import av

    pcm, rate = speech()
    options = {**FRAGMENTED_MP4, "frag_duration": "1000000"}
    data = encode_container(pcm[: rate * 6], rate, "mp4", "aac", options=options)
    with av.open(io.BytesIO(data), "r") as container:
        audio = container.streams.audio[0]
        packets = [(p.pos, p.size) for p in container.demux(audio) if p.size and p.pos is not None]
    return data, packets


def damaged(data: bytes, packet: tuple[int, int]) -> bytes:
    """``data`` with that packet's bytes garbled: AAC's decoder refuses them."""
    pos, size = packet
    return data[:pos] + bytes(i % 256 for i in range(size)) + data[pos + size :]


def samples_before_the_error(data: bytes) -> int:
    """What FFmpeg itself decodes (at 48 kHz) of ``data`` read as a stream, up to its error."""
    import io

    import av

    class Stream:  # (read only: not seekable, as the bridge reads it)
        def __init__(self) -> None:
            self._data = io.BytesIO(data)

        def read(self, size: int) -> bytes:
            return self._data.read(size)

    samples = 0
    with av.open(Stream(), "r") as container, contextlib.suppress(av.FFmpegError):
        for frame in container.decode(container.streams.audio[0]):
            samples += frame.samples
    return samples


async def decode_to_error(data: bytes, piece: int) -> tuple[int, ContainerError | None]:
    """Feed ``data`` then end: the samples that came out, and the error after them."""
    decoder = ContainerDecoder("test")

    async def feed() -> None:
        for chunk in split(data, piece):
            await decoder.feed(chunk)
        await decoder.end()

    feeder = asyncio.create_task(feed())
    samples = 0
    try:
        while (item := await decoder.get()) is not None:
            if isinstance(item, bytes):
                samples += len(item) // 2
        return samples, None
    except ContainerError as exc:
        return samples, exc
    finally:
        await feeder
        decoder.close()


AAC_FRAME = 1024  # samples


async def test_the_audio_decoded_before_an_error_comes_out_before_it() -> None:
    """A packet FFmpeg refuses in the middle, the whole file sent at once: the audio
    decoded before it and held back to go out in a block (up to 250 ms) was dropped."""
    data, packets = fragmented_mp4()
    bad = damaged(data, packets[len(packets) // 3])
    expected = samples_before_the_error(bad)
    samples, error = await decode_to_error(bad, piece=len(bad))
    assert error is not None and not error.cut_short  # (damage, not the end)
    assert 1.5 * 48_000 < expected < len(packets) * AAC_FRAME / 2
    assert expected - AAC_FRAME <= samples <= expected


async def test_a_container_cut_short_at_its_end_says_so() -> None:
    """A client that stopped inside the last fragment (then CloseStream): the error says
    the input ended inside the packet refused, and everything before it came out. Damage
    in the last fragment of a whole file is not taken for that."""
    data, packets = fragmented_mp4()
    pos, size = packets[-20]
    cut = data[: pos + size // 2]
    samples, error = await decode_to_error(cut, piece=4_000)
    assert error is not None and error.cut_short
    expected = samples_before_the_error(cut)
    assert expected > 5 * 48_000
    assert expected - AAC_FRAME <= samples <= expected
    # the same packet garbled in the whole file, sent at once, then the end
    _, error = await decode_to_error(damaged(data, (pos, size)), piece=len(data))
    assert error is not None and not error.cut_short


async def test_raw_audio_without_an_encoding_is_refused_with_the_reason() -> None:
    pcm, _ = speech()
    with pytest.raises(ContainerError, match="encoding and sample_rate"):
        await decode(pcm.tobytes()[:64_000])


async def test_a_container_without_its_start_is_refused_with_the_reason() -> None:
    """A page that starts its MediaRecorder before the socket is open loses the first
    piece, which holds the WebM header."""
    pcm, rate = speech()
    webm = encode_container(pcm, rate, "webm", "libopus")
    with pytest.raises(ContainerError, match="first piece holds the header"):
        await decode(webm[len(webm) // 4 :])


async def test_a_container_that_needs_seeking_is_refused() -> None:
    """An MP4 whose index comes after its audio cannot be read as it arrives."""
    pcm, rate = speech()
    with pytest.raises(ContainerError, match="could not be decoded"):
        await decode(encode_container(pcm, rate, "mp4", "aac"))


async def test_a_stream_closed_before_any_audio_ends_without_error() -> None:
    assert await decode(b"") == (None, pytest.approx(np.zeros((0, 1))), None)


async def test_feeding_waits_while_nobody_takes_the_audio() -> None:
    """Backpressure: a client cannot pile up audio in the bridge when the server is slow."""
    pcm, rate = speech()
    data = encode_container(pcm, rate, "wav", "pcm_s16le", out_rate=rate)
    pieces = [data[i : i + 1_000] for i in range(0, len(data), 1_000)]
    decoder = ContainerDecoder("test")
    try:
        accepted = 0
        for chunk in pieces:
            try:
                await asyncio.wait_for(decoder.feed(chunk), timeout=0.5)
            except TimeoutError:
                break
            accepted += 1
        # the pieces queued, the decoded blocks waiting to be taken (4 KB each here), and
        # FFmpeg's own buffers (32 KB to read, 32 KB to recognize the container): about
        # 100 KB, not the whole recording (334 KB)
        assert MAX_PENDING <= accepted <= 120, accepted
        assert await decoder.get() == DecodedFormat(rate, 1)

        async def take_everything() -> None:
            while await decoder.get() is not None:
                pass

        taker = asyncio.create_task(take_everything())
        for chunk in pieces[accepted:]:  # taken: moving again, to the end
            await asyncio.wait_for(decoder.feed(chunk), timeout=5)
        await decoder.end()
        await asyncio.wait_for(taker, timeout=5)
    finally:
        decoder.close()


@pytest.mark.parametrize("waiting_on", ["input", "output"])
async def test_close_stops_the_thread_wherever_it_waits(waiting_on: str) -> None:
    pcm, rate = speech()
    data = encode_container(pcm, rate, "wav", "pcm_s16le")
    decoder = ContainerDecoder("test")
    if waiting_on == "input":
        await decoder.feed(data[:3_000])  # the header and a little: it waits for more
    else:  # feed until the decoded audio nobody takes holds it up
        with pytest.raises(TimeoutError):
            for i in range(0, len(data), 10_000):
                await asyncio.wait_for(decoder.feed(data[i : i + 10_000]), timeout=0.5)
    await asyncio.sleep(0.3)
    assert decoder._thread.is_alive()
    decoder.close()
    await asyncio.to_thread(decoder._thread.join, 2)
    assert not decoder._thread.is_alive()


def test_a_change_of_layout_or_rate_mid_stream_is_converted_to_the_first() -> None:
    """A chained Ogg or an MP3 that changes its channel mode: PyAV's resampler, made for
    the first frame, passed a stereo frame into a mono stream unchanged (twice the bytes,
    the samples interleaved) and refused a float one."""
    import av

    from asr_bridge.container import DecodedFormat, ToFirstFormat

    tone = (np.sin(np.arange(1600) * 0.2) * 8000).astype(np.int16)

    def frame(samples: np.ndarray, layout: str, rate: int, fmt: str = "s16") -> av.AudioFrame:
        f = av.AudioFrame.from_ndarray(samples, format=fmt, layout=layout)
        f.sample_rate = rate
        return f

    converter = ToFirstFormat()
    mono = frame(tone.reshape(1, -1), "mono", 16_000)
    assert converter.start(mono) == DecodedFormat(16_000, 1)
    out = converter.convert(mono)
    stereo = frame(np.stack([tone, tone]).T.reshape(1, -1), "stereo", 16_000)
    out += converter.convert(stereo)
    planar = frame(np.stack([tone, tone]).astype(np.float32) / 32768, "stereo", 8_000, "fltp")
    out += converter.convert(planar)
    out += converter.flush()
    pcm = np.frombuffer(b"".join(out), np.int16)
    # 0.1 s mono + 0.1 s stereo (as mono) + 0.2 s at 16 kHz of the 8 kHz one
    assert abs(pcm.size - (1600 + 1600 + 3200)) <= 64, pcm.size
    # the stereo frame came out as the tone, not interleaved pairs
    np.testing.assert_allclose(pcm[1600:3200], tone, atol=2)
