"""Bad input, widened: every kind of malformed or hostile request gets its documented status,
never UNKNOWN, a hang or a crash, and leaves the server serving with no session state behind.

The basic kinds (missing config, config twice, a bad rate, an oversized audio message …) are
in test_grpc_contract.py; these go down to the bytes: raw messages through a generic call,
protobuf wire tricks, fuzzing with hypothesis, metadata, sockets cut mid-message.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import re
import tracemalloc

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asr_api.v1 import asr_pb2
from asr_client import AsrClient, RecognitionStream, StreamClosedError, audio_config
from asr_server.app import RunningServer
from tests.helpers import eventually, final_text, serve_fake, speech_pcm, stream_audio, tone

pytestmark = pytest.mark.timeout(120)

STREAM = "/asr.v1.Recognizer/StreamingRecognize"
UNARY = "/asr.v1.Recognizer/Recognize"
Code = grpc.StatusCode
#: what a client may get for anything it sends: never UNKNOWN, never INTERNAL
DOCUMENTED = {Code.OK, Code.INVALID_ARGUMENT, Code.FAILED_PRECONDITION}
#: a session's tasks are named after its call id: s12-reader, r3-channel-0, s4-writer …
SESSION_TASK = re.compile(r"^[sr]\d+-")
MAX_U32 = 2**32 - 1


# -- wire helpers -----------------------------------------------------------------------------


def req(**fields: object) -> bytes:
    return asr_pb2.StreamingRecognizeRequest(**fields).SerializeToString()  # type: ignore[arg-type]


def config(**fields: object) -> bytes:
    return req(config=audio_config(**fields))  # type: ignore[arg-type]


def audio(data: bytes) -> bytes:
    return req(audio=data)


def control(action: int) -> bytes:
    return req(control=asr_pb2.Control(action=action))  # type: ignore[arg-type]


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int32 enums go on the wire as 10-byte varints
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def field(number: int, wire_type: int, payload: bytes) -> bytes:
    """One protobuf field; ``payload`` already encoded for its wire type except length."""
    key = varint(number << 3 | wire_type)
    return key + (varint(len(payload)) + payload if wire_type == 2 else payload)


def with_string(name: str, raw: bytes) -> bytes:
    """A config whose string field ``name`` holds ``raw``, bytes protobuf would not write."""
    marker = "\u2603" * 3  # a placeholder that occurs nowhere else in the message
    fields: dict[str, object] = {name: [marker] if name == "hotwords" else marker}
    good = config(**fields)
    encoded = marker.encode()
    assert good.count(encoded) == 1 and len(raw) == len(encoded)  # lengths stay valid
    return good.replace(encoded, raw)


async def outcome(
    port: int,
    messages: list[bytes],
    *,
    method: str = STREAM,
    metadata: tuple[tuple[str, str | bytes], ...] | None = None,
    deadline_s: float = 20,
) -> tuple[grpc.StatusCode, str]:
    """Write raw request bytes on a generic call, half-close, drain: (status, details)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream(method, request_serializer=None, response_deserializer=None)(
            metadata=metadata, timeout=deadline_s
        )
        # Wrapped for its status bookkeeping only: a write in flight as the server ends the
        # call makes grpc-python report "Internal error from Core" instead of the server's
        # status (grpc/grpc#36066); RecognitionStream keeps the status that really arrived.
        stream = RecognitionStream(call, asr_pb2.StreamingConfig())
        for message in messages:
            try:
                await call.write(message)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                break  # the server has already answered
        try:
            await call.done_writing()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass
        try:
            async for _ in stream:
                pass
        except StreamClosedError as err:
            return err.code, err.details
        return Code.OK, ""


async def recognize(
    port: int, payload: bytes, *, metadata: tuple[tuple[str, str], ...] | None = None
) -> tuple[grpc.StatusCode, str, bytes]:
    """One raw unary Recognize: (status, details, serialized response)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        method = channel.unary_unary(UNARY, request_serializer=None, response_deserializer=None)
        try:
            reply = await method(payload, metadata=metadata, timeout=30)
        except grpc.aio.AioRpcError as err:
            return err.code(), err.details() or "", b""
        return Code.OK, "", reply


def session_tasks() -> list[str]:
    return [t.get_name() for t in asyncio.all_tasks() if SESSION_TASK.match(t.get_name())]


async def assert_clean(server: RunningServer) -> None:
    """No call left open, no session task left running, no audio left buffered."""
    await eventually(lambda: server.servicer.active == 0 and not session_tasks())
    assert server.metrics.active_streams._value.get() == 0
    assert server.metrics.buffered_audio._value.get() == 0.0
    assert server.metrics.stream_errors.labels("INTERNAL")._value.get() == 0


async def assert_serving(server: RunningServer) -> None:
    """Clean, and a well-formed stream still gets its transcript from the fake engine."""
    await assert_clean(server)
    received = await stream_audio(server.port, speech_pcm(), 16_000, speed=None)
    assert final_text(received) == "w0 w1 w2 w3"
    await assert_clean(server)


@pytest.fixture
async def server(make_server) -> RunningServer:  # type: ignore[no-untyped-def]
    return await serve_fake(make_server)  # type: ignore[no-any-return]


# -- the table: one stream of raw messages, the one status it must get ------------------------

CONFIG = config()
SECOND = bytes(3200)  # 100 ms of 16 kHz LINEAR16 silence
STEREO16 = config(channels=2)
FLOAT = config(encoding="FLOAT32")


def floats(*values: float) -> bytes:
    return np.array(values, dtype="<f4").tobytes()


CASES = [
    # bytes that are no StreamingRecognizeRequest at all
    ("random bytes", [b"\xff\xfe\xfd\xfc\x00\x01"], Code.INVALID_ARGUMENT, "not a valid"),
    ("truncated config", [CONFIG[:-3]], Code.INVALID_ARGUMENT, "not a valid"),
    ("garbage after config", [CONFIG, b"\x12\xff\xff\xff"], Code.INVALID_ARGUMENT, "not a valid"),
    ("length past the end", [CONFIG, b"\x12\x7f" + bytes(10)], Code.INVALID_ARGUMENT, "valid"),
    ("invalid tag 0", [b"\x00\x00"], Code.INVALID_ARGUMENT, "not a valid"),
    (
        "bad UTF-8 language",
        [with_string("language", b"\xff\xfe\xfd" * 3)],
        Code.INVALID_ARGUMENT,
        "UTF-8",
    ),
    (
        "bad UTF-8 hotword",
        [with_string("hotwords", b"\xc3\x28" * 4 + b"x")],
        Code.INVALID_ARGUMENT,
        "UTF-8",
    ),
    (
        "bad UTF-8 prompt",
        [with_string("initial_prompt", b"\xed\xa0\x80" * 3)],
        Code.INVALID_ARGUMENT,
        "UTF-8",
    ),
    (
        "bad UTF-8 model",
        [with_string("model", b"\xf8\x88\x80\x80\x80" + b"xxxx")],
        Code.INVALID_ARGUMENT,
        "UTF-8",
    ),
    # unknown groups nested past protobuf's recursion limit
    (
        "nested 5000 groups",
        [b"\xfb\x07" * 5000 + b"\xfc\x07" * 5000],
        Code.INVALID_ARGUMENT,
        "not a valid",
    ),
    # protobuf wire semantics the server must live with
    ("empty message first", [b""], Code.FAILED_PRECONDITION, "empty request"),
    ("only an unknown field", [field(99, 0, varint(7))], Code.FAILED_PRECONDITION, "empty request"),
    (
        "unknown fields everywhere",
        [CONFIG + field(99, 2, b"junk") + field(1, 2, field(77, 0, b"\x01")), audio(SECOND)],
        Code.OK,
        "",
    ),
    ("empty message after config", [CONFIG, b""], Code.INVALID_ARGUMENT, "empty request"),
    (
        "config then audio in one message",
        [CONFIG + audio(SECOND)],
        Code.FAILED_PRECONDITION,
        "got audio",
    ),
    ("audio then config in one message", [audio(SECOND) + CONFIG, audio(SECOND)], Code.OK, ""),
    (
        "config field twice, merged",
        [config(language="en") + config(word_timestamps=True)],
        Code.OK,
        "",
    ),
    (
        "control before config",
        [control(asr_pb2.Control.FINALIZE)],
        Code.FAILED_PRECONDITION,
        "got control",
    ),
    ("control action 7", [CONFIG, control(7)], Code.INVALID_ARGUMENT, "FINALIZE"),
    ("control action -1", [CONFIG, control(-1)], Code.INVALID_ARGUMENT, "FINALIZE"),
    (
        "finalize of channel 1 in a mono stream",
        [CONFIG, req(control=asr_pb2.Control(action=asr_pb2.Control.FINALIZE, channel=1))],
        Code.INVALID_ARGUMENT,
        "control.channel 1 does not exist",
    ),
    (
        "config after control",
        [CONFIG, control(1), CONFIG],
        Code.FAILED_PRECONDITION,
        "already sent",
    ),
    # config fields out of range
    (
        "encoding 99",
        [
            req(
                config=asr_pb2.StreamingConfig(
                    format=asr_pb2.AudioFormat(encoding=99, sample_rate_hz=16000)
                )
            )
        ],
        Code.INVALID_ARGUMENT,
        "encoding 99",
    ),
    (
        "encoding -5",
        [
            req(
                config=asr_pb2.StreamingConfig(
                    format=asr_pb2.AudioFormat(encoding=-5, sample_rate_hz=16000)
                )
            )
        ],
        Code.INVALID_ARGUMENT,
        "encoding -5",
    ),
    ("rate 2^32-1", [config(sample_rate_hz=MAX_U32)], Code.INVALID_ARGUMENT, "sample_rate_hz"),
    ("rate 0", [config(sample_rate_hz=0)], Code.INVALID_ARGUMENT, "sample_rate_hz"),
    ("channels 2^32-1", [config(channels=MAX_U32)], Code.INVALID_ARGUMENT, "channels"),
    ("silence 2^32-1 ms", [config(silence_ms=MAX_U32)], Code.INVALID_ARGUMENT, "silence_ms"),
    (
        "utterance 2^32-1 ms",
        [config(max_utterance_ms=MAX_U32)],
        Code.INVALID_ARGUMENT,
        "max_utterance_ms",
    ),
    (
        "update before config",
        [req(update=asr_pb2.StreamingUpdate(turn_threshold=0.5))],
        Code.FAILED_PRECONDITION,
        "the first message must be a config, got update",
    ),
    (
        "update threshold 2",
        [CONFIG, req(update=asr_pb2.StreamingUpdate(turn_threshold=2.0))],
        Code.INVALID_ARGUMENT,
        "update.turn_threshold 2 is out of range 0-1",
    ),
    (
        "update silence 50 ms",
        [CONFIG, req(update=asr_pb2.StreamingUpdate(silence_ms=50))],
        Code.INVALID_ARGUMENT,
        "update.silence_ms 50 is out of range 100-10000",
    ),
    (
        "update hotwords without replace",
        [CONFIG, req(update=asr_pb2.StreamingUpdate(hotwords=["acme"]))],
        Code.INVALID_ARGUMENT,
        "without replace_hotwords",
    ),
    (
        "update with 5000 hotwords",
        [CONFIG, req(update=asr_pb2.StreamingUpdate(replace_hotwords=True, hotwords=["a"] * 5000))],
        Code.INVALID_ARGUMENT,
        "update.hotwords has 5000 entries",
    ),
    (
        "turn threshold 2",
        [config(endpointing="semantic", turn_threshold=2.0)],
        Code.INVALID_ARGUMENT,
        "turn_threshold 2 is out of range 0-1",
    ),
    (
        "turn threshold NaN",
        [config(endpointing="semantic", turn_threshold=float("nan"))],
        Code.INVALID_ARGUMENT,
        "turn_threshold nan is out of range",
    ),
    (
        "eager threshold at the first ask's",
        [config(endpointing="semantic", eager_finals=True, eager_threshold=0.99)],
        Code.INVALID_ARGUMENT,
        "eager_threshold 0.99 must be below the turn model's first threshold (0.98)",
    ),
    (
        "eager threshold at a phone line's first ask",
        [
            config(
                endpointing="semantic",
                eager_finals=True,
                eager_threshold=0.995,
                encoding="MULAW",
                sample_rate_hz=8000,
            )
        ],
        Code.INVALID_ARGUMENT,
        "eager_threshold 0.995 must be below the turn model's first threshold (0.99)",
    ),
    ("language with NUL", [config(language="en\x00")], Code.INVALID_ARGUMENT, "language"),
    (
        "1 MB prompt",
        [config(initial_prompt="p" * (1 << 20)), audio(SECOND)],
        Code.INVALID_ARGUMENT,
        "initial_prompt has 1048576",
    ),
    (
        "1 MB language, quoted short",
        [config(language="x" * (1 << 20))],
        Code.INVALID_ARGUMENT,
        "(1048576 characters)",
    ),
    (
        "1 MB model name, quoted short",
        [config(model="m" * (1 << 20))],
        Code.INVALID_ARGUMENT,
        "(1048576 characters)",
    ),
    (
        "5000 hotwords",
        [config(hotwords=["acme"] * 5000)],
        Code.INVALID_ARGUMENT,
        "hotwords has 5000",
    ),
    (
        "100 kB hotword",
        [config(hotwords=["ok", "h" * 100_000])],
        Code.INVALID_ARGUMENT,
        "hotwords[1]",
    ),
    # audio that does not fit the declared format (LINEAR16 odd bytes: test_grpc_contract)
    (
        "FLOAT32 not a multiple of 4",
        [FLOAT, audio(bytes(6))],
        Code.INVALID_ARGUMENT,
        "whole number",
    ),
    (
        "stereo LINEAR16 half a frame",
        [STEREO16, audio(bytes(3202))],
        Code.INVALID_ARGUMENT,
        "4-byte frames",
    ),
    (
        "stereo MULAW odd bytes",
        [config(encoding="MULAW", sample_rate_hz=8000, channels=2), audio(bytes(161))],
        Code.INVALID_ARGUMENT,
        "2-byte frames",
    ),
    (
        "8-channel FLOAT32 misaligned",
        [config(encoding="FLOAT32", channels=8), audio(bytes(32 * 10 + 4))],
        Code.INVALID_ARGUMENT,
        "32-byte frames",
    ),
    # FLOAT32 that is no number: rejected, not sanitised. NaN or infinity in float audio means
    # a broken pipeline upstream (a division by zero in a gain stage, an uninitialised
    # buffer); zeroing it would hide the bug behind a plausible transcript of damaged audio,
    # and the samples around it are suspect too. Out-of-range finite values are another
    # matter: test_float32_beyond_full_scale_is_clipped.
    (
        "FLOAT32 NaN",
        [FLOAT, audio(floats(0.1, float("nan"), 0.1, 0.0))],
        Code.INVALID_ARGUMENT,
        "NaN",
    ),
    ("FLOAT32 +Inf", [FLOAT, audio(floats(float("inf")))], Code.INVALID_ARGUMENT, "infinity"),
    (
        "FLOAT32 -Inf after good audio",
        [FLOAT, audio(tone(0.5).astype("<f4").tobytes()), audio(floats(0.0, float("-inf")))],
        Code.INVALID_ARGUMENT,
        "infinity",
    ),
    (
        "FLOAT32 signalling NaN bits",
        [FLOAT, audio(b"\x01\x00\x80\x7f")],
        Code.INVALID_ARGUMENT,
        "NaN",
    ),
    # empty audio messages are allowed: nothing to decode, nothing breaks
    ("200 empty audio messages", [CONFIG] + [audio(b"")] * 200, Code.OK, ""),
]


@pytest.mark.parametrize(
    ("messages", "code", "phrase"),
    [pytest.param(m, c, p, id=name) for name, m, c, p in CASES],
)
async def test_raw_stream_gets_its_status(server, messages, code, phrase) -> None:  # type: ignore[no-untyped-def]
    got, details = await outcome(server.port, messages)
    assert got == code, details
    assert phrase in details
    # statuses travel in HTTP/2 trailers: echoing a client's megabyte back would not arrive
    assert len(details) < 500
    await assert_serving(server)


# -- FLOAT32 beyond full scale ------------------------------------------------------------------


async def test_float32_beyond_full_scale_is_clipped(server) -> None:  # type: ignore[no-untyped-def]
    """Finite floats past ±1 are clipped, not rejected: a mix that peaks at 1.02 is ordinary,
    and even int16-range floats (a common client slip) are loud audio, not a broken stream.
    The stream must neither fail nor be poisoned: a normal utterance after it is heard."""
    loud = np.concatenate([tone(1.0) * 1e30, np.zeros(11_200, np.float32)])
    normal = np.concatenate([tone(1.0), np.zeros(11_200, np.float32)])
    edges = floats(3.4e38, -3.4e38, 1e-45, -0.0)  # the largest finite, a subnormal, -0
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        async with client.stream(audio_config(encoding="FLOAT32", interim_results=False)) as s:
            await s.send_audio(loud.astype("<f4").tobytes())
            await s.send_audio(edges)
            await s.send_audio(normal.astype("<f4").tobytes())
            await s.end()
            texts = [e.result.text async for e in s if e.HasField("result")]
    assert texts == ["w0 w1 w2 w3", "w0 w1 w2 w3"]
    await assert_serving(server)


# -- a config with every field at its limit -----------------------------------------------------


async def test_config_at_every_limit_is_served(server) -> None:  # type: ignore[no-untyped-def]
    limits = server.servicer.services.settings.streaming
    cfg = audio_config(
        encoding="FLOAT32",
        sample_rate_hz=48_000,
        channels=8,
        language=" EN ",
        silence_ms=10_000,
        max_utterance_ms=28_000,
        hotwords=["h" * limits.max_hotword_chars] * limits.max_hotwords,
        initial_prompt="p" * limits.max_prompt_chars,
        word_timestamps=True,
        model="fake",
    )
    one_s = np.repeat(tone(1.0, sr=48_000)[:, None], 8, axis=1).astype("<f4").tobytes()
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        async with client.stream(cfg) as stream:
            for i in range(0, len(one_s), 1 << 20):  # within max_audio_message_bytes
                await stream.send_audio(one_s[i : i + (1 << 20)])
            await stream.end()
            finals = [e.result async for e in stream if e.HasField("result") and e.result.is_final]
    assert sorted(f.channel for f in finals) == list(range(8))
    assert {f.text for f in finals} == {"w0 w1 w2 w3"} and all(len(f.words) == 4 for f in finals)
    await assert_serving(server)


# -- Recognize (unary) ------------------------------------------------------------------------


def unary(audio_bytes: bytes = b"", **cfg: object) -> bytes:
    return asr_pb2.RecognizeRequest(
        config=audio_config(**cfg),  # type: ignore[arg-type]
        audio=audio_bytes,
    ).SerializeToString()


GOOD_UNARY = unary(speech_pcm().tobytes())

UNARY_CASES = [
    ("random bytes", b"\xff\xfe\xfd\xfc", Code.INVALID_ARGUMENT, "not a valid RecognizeRequest"),
    ("truncated", GOOD_UNARY[:-7], Code.INVALID_ARGUMENT, "not a valid"),
    (
        "bad UTF-8",
        GOOD_UNARY.replace(b"LINEAR16", b"x") + field(1, 2, b"\x12\x02\xff\xfe"),
        Code.INVALID_ARGUMENT,
        "UTF-8",
    ),
    (
        "no config",
        asr_pb2.RecognizeRequest(audio=bytes(320)).SerializeToString(),
        Code.INVALID_ARGUMENT,
        "format",
    ),
    ("empty request", b"", Code.INVALID_ARGUMENT, "format"),
    ("odd bytes", unary(bytes(32_001)), Code.INVALID_ARGUMENT, "whole number"),
    (
        "FLOAT32 NaN",
        unary(floats(0.0, float("nan")), encoding="FLOAT32"),
        Code.INVALID_ARGUMENT,
        "NaN",
    ),
    (
        "1 MB prompt",
        unary(bytes(320), initial_prompt="p" * (1 << 20)),
        Code.INVALID_ARGUMENT,
        "initial_prompt",
    ),
    (
        "encoding 99",
        asr_pb2.RecognizeRequest(
            config=asr_pb2.StreamingConfig(
                format=asr_pb2.AudioFormat(encoding=99, sample_rate_hz=8000)
            )
        ).SerializeToString(),
        Code.INVALID_ARGUMENT,
        "encoding 99",
    ),
    ("empty audio", unary(b""), Code.OK, ""),
]


@pytest.mark.parametrize(
    ("payload", "code", "phrase"),
    [pytest.param(m, c, p, id=name) for name, m, c, p in UNARY_CASES],
)
async def test_recognize_gets_its_status(server, payload, code, phrase) -> None:  # type: ignore[no-untyped-def]
    got, details, _ = await recognize(server.port, payload)
    assert got == code, details
    assert phrase in details
    await assert_serving(server)


async def test_recognize_without_a_message_is_answered_at_once(server) -> None:  # type: ignore[no-untyped-def]
    # a raw call that half-closes without sending anything: grpc.aio alone never answered it
    got, details = await outcome(server.port, [], method=UNARY, deadline_s=60)
    assert got == Code.INVALID_ARGUMENT and "none was sent" in details
    await assert_serving(server)


async def test_recognize_at_the_top_of_the_format_range(server) -> None:  # type: ignore[no-untyped-def]
    # 48 kHz 8-channel FLOAT32: 1.5 MB a second, more than one streaming message may hold
    pcm = np.concatenate([tone(1.0, sr=48_000), np.zeros(33_600, np.float32)])
    data = np.repeat(pcm[:, None], 8, axis=1).astype("<f4").tobytes()
    got, details, reply = await recognize(
        server.port, unary(data, encoding="FLOAT32", sample_rate_hz=48_000, channels=8)
    )
    assert got == Code.OK, details
    response = asr_pb2.RecognizeResponse.FromString(reply)
    assert [r.text for r in response.results] == ["w0 w1 w2 w3"] * 8
    await assert_serving(server)


async def test_recognize_over_the_grpc_limit_is_resource_exhausted(make_server) -> None:  # type: ignore[no-untyped-def]
    # (audio messages up to half the limit: the limit must hold the largest one allowed)
    server = await serve_fake(
        make_server, max_message_bytes=1 << 20, streaming={"max_audio_message_bytes": 512 << 10}
    )
    got, details, _ = await recognize(server.port, unary(bytes(2 << 20)))
    assert got == Code.RESOURCE_EXHAUSTED, details
    await assert_serving(server)


async def test_too_long_is_out_of_range_on_both_methods(make_server) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server, streaming={"max_stream_duration_s": 1.0})
    got, details, _ = await recognize(server.port, unary(bytes(64_000)))
    assert got == Code.OUT_OF_RANGE, details
    got, details = await outcome(server.port, [CONFIG] + [audio(bytes(32_000))] * 3)
    assert got == Code.OUT_OF_RANGE, details
    await assert_clean(server)


# -- metadata, methods, half-close, deadlines, cut connections ---------------------------------


@pytest.mark.parametrize(
    ("metadata", "code"),
    [
        # grpc core refuses headers past its hard limit (16 KiB) before any handler runs;
        # RESOURCE_EXHAUSTED is grpc's own, documented answer, and it is not UNKNOWN
        pytest.param((("x-big", "a" * (1 << 20)),), Code.RESOURCE_EXHAUSTED, id="1 MB header"),
        pytest.param(
            tuple((f"x-h{i}", "v" * 50) for i in range(2000)),
            Code.RESOURCE_EXHAUSTED,
            id="2000 headers",
        ),
        pytest.param(
            (("x-junk-bin", bytes(range(256)) * 8), ("x-text", "ascii " * 100)),
            Code.OK,
            id="binary and long headers under the limit",
        ),
    ],
)
async def test_metadata(server, metadata, code) -> None:  # type: ignore[no-untyped-def]
    got, details = await outcome(server.port, [CONFIG, audio(SECOND)], metadata=metadata)
    assert got == code, details
    got, details, _ = await recognize(server.port, GOOD_UNARY, metadata=metadata)
    assert got == code, details
    await assert_serving(server)


async def test_unknown_method_is_unimplemented(server) -> None:  # type: ignore[no-untyped-def]
    got, _ = await outcome(server.port, [CONFIG], method="/asr.v1.Recognizer/Transcribe")
    assert got == Code.UNIMPLEMENTED
    got, _ = await outcome(server.port, [CONFIG], method="/asr.v2.Recognizer/StreamingRecognize")
    assert got == Code.UNIMPLEMENTED
    await assert_serving(server)


async def test_audio_after_half_close_is_refused_locally(server) -> None:  # type: ignore[no-untyped-def]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = channel.stream_stream(STREAM, request_serializer=None, response_deserializer=None)()
        await call.write(CONFIG)
        await call.write(audio(speech_pcm().tobytes()))
        await call.done_writing()
        with pytest.raises(asyncio.InvalidStateError, match="half closed"):
            await call.write(audio(SECOND))
        await call.done_writing()  # twice is harmless
        responses = [asr_pb2.StreamingRecognizeResponse.FromString(r) async for r in call]
        assert await call.code() == Code.OK
    finals = [r.result.text for r in responses if r.HasField("result") and r.result.is_final]
    assert finals == ["w0 w1 w2 w3"]
    await assert_serving(server)


async def test_client_deadline_mid_stream(server) -> None:  # type: ignore[no-untyped-def]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = channel.stream_stream(STREAM, request_serializer=None, response_deserializer=None)(
            timeout=0.5
        )
        await call.write(CONFIG)
        await call.write(audio(speech_pcm().tobytes()))
        # no half-close: the stream stays open until the deadline
        assert await call.code() == Code.DEADLINE_EXCEEDED
    await assert_serving(server)


def h2_frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return (
        len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload
    )


def hpack_literal(name: str, value: str) -> bytes:
    """A header as an HPACK literal without indexing, no Huffman (names and values < 127)."""
    return b"\x00" + bytes([len(name)]) + name.encode() + bytes([len(value)]) + value.encode()


@pytest.mark.parametrize("ending", ["reset", "half-close mid-message"])
async def test_connection_cut_mid_message(server, ending) -> None:  # type: ignore[no-untyped-def]
    """A hand-made HTTP/2 client sends a config and part of an audio message, then goes."""
    headers = b"".join(
        hpack_literal(n, v)
        for n, v in [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", STREAM),
            (":authority", f"127.0.0.1:{server.port}"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
    )
    grpc_message = b"\x00" + len(CONFIG).to_bytes(4, "big") + CONFIG
    partial = b"\x00" + (100_000).to_bytes(4, "big") + audio(bytes(100_000))[:5000]
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2_frame(4, 0, 0, b""))
        writer.write(h2_frame(1, 0x4, 1, headers) + h2_frame(0, 0, 1, grpc_message))
        await writer.drain()
        await eventually(lambda: server.servicer.active == 1)  # the config was taken
        end_stream = 0x1 if ending == "half-close mid-message" else 0
        writer.write(h2_frame(0, end_stream, 1, partial))
        await writer.drain()
        if ending == "reset":
            writer.transport.abort()
        else:
            # grpc core never hands the servicer a truncated message: the read sees the
            # end of the stream and the call finishes; nothing may be left behind either way
            await eventually(lambda: server.servicer.active == 0)
    finally:
        writer.close()
    await assert_serving(server)


# -- fuzzing: every field of every request, and raw bytes ---------------------------------------


def u32(*typical: int) -> st.SearchStrategy[int]:
    """Values a validator cares about, and anything a uint32 can hold."""
    return st.one_of(st.sampled_from(typical), st.integers(0, MAX_U32))


def enum(*typical: int) -> st.SearchStrategy[int]:
    """Known values, and any int32: proto3 enums are open, unknown numbers arrive as is."""
    return st.one_of(st.sampled_from(typical), st.integers(-(2**31), 2**31 - 1))


FORMATS = st.builds(
    asr_pb2.AudioFormat,
    encoding=enum(0, 1, 2, 3, 4),
    sample_rate_hz=u32(0, 7999, 8000, 16_000, 44_100, 48_000, 48_001),
    channels=u32(0, 1, 2, 8, 9),
)
CONFIGS = st.builds(
    asr_pb2.StreamingConfig,
    format=st.one_of(st.none(), FORMATS),
    language=st.one_of(st.sampled_from(["", "en", " EN ", "de", "auto"]), st.text(max_size=12)),
    interim_results=st.booleans(),
    endpointing=st.one_of(
        st.none(),
        st.builds(
            asr_pb2.EndpointingConfig,
            silence_ms=u32(0, 99, 100, 500, 10_000, 10_001),
            max_utterance_ms=u32(0, 1999, 2000, 28_000, 28_001),
        ),
    ),
    hotwords=st.one_of(
        st.lists(st.text(max_size=10), max_size=6),
        st.sampled_from([["h" * 100], ["h" * 101], ["w"] * 500, ["w"] * 501]),
    ),
    initial_prompt=st.one_of(st.text(max_size=20), st.sampled_from(["p" * 2000, "p" * 2001])),
    word_timestamps=st.booleans(),
    model=st.one_of(st.sampled_from(["", "fake", "tiny.en"]), st.text(max_size=10)),
)
AUDIO = st.one_of(
    st.binary(max_size=48),
    st.sampled_from([b"", bytes(3200), speech_pcm(0.3).tobytes(), floats(float("nan"))]),
)
REQUESTS = st.one_of(
    CONFIGS.map(lambda c: asr_pb2.StreamingRecognizeRequest(config=c)),
    AUDIO.map(lambda a: asr_pb2.StreamingRecognizeRequest(audio=a)),
    enum(0, 1).map(
        lambda a: asr_pb2.StreamingRecognizeRequest(control=asr_pb2.Control(action=a))  # type: ignore[arg-type]
    ),
    st.just(asr_pb2.StreamingRecognizeRequest()),
)
FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,  # the same examples on every run: CI stays deterministic
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ
@given(
    first=st.one_of(CONFIGS.map(lambda c: asr_pb2.StreamingRecognizeRequest(config=c)), REQUESTS),
    rest=st.lists(REQUESTS, max_size=5),
)
async def test_fuzzed_streams_end_in_a_documented_status(server, first, rest) -> None:  # type: ignore[no-untyped-def]
    messages = [m.SerializeToString() for m in (first, *rest)]
    got, details = await outcome(server.port, messages)
    assert got in DOCUMENTED, (got, details)
    if first.WhichOneof("request") != "config":
        assert got == Code.FAILED_PRECONDITION, details
    await assert_clean(server)


@FUZZ
@given(config_first=st.booleans(), messages=st.lists(st.binary(max_size=64), max_size=5))
async def test_random_bytes_end_in_a_documented_status(server, config_first, messages) -> None:  # type: ignore[no-untyped-def]
    got, details = await outcome(server.port, [CONFIG] * config_first + messages)
    assert got in DOCUMENTED, (got, details)
    got, details, _ = await recognize(server.port, b"".join(messages))
    assert got in DOCUMENTED, (got, details)
    await assert_clean(server)


@FUZZ
@given(config=st.one_of(st.none(), CONFIGS), data=AUDIO)
async def test_fuzzed_recognize_ends_in_a_documented_status(server, config, data) -> None:  # type: ignore[no-untyped-def]
    payload = asr_pb2.RecognizeRequest(config=config, audio=data).SerializeToString()
    got, details, _ = await recognize(server.port, payload)
    assert got in DOCUMENTED, (got, details)
    await assert_clean(server)


async def test_zz_after_everything_a_good_stream_is_heard(server) -> None:  # type: ignore[no-untyped-def]
    """Each test checks its own server; this one documents the promise for the module."""
    await assert_serving(server)


async def test_bad_calls_leave_no_memory_behind(server, caplog) -> None:  # type: ignore[no-untyped-def]
    """Hundreds of failing calls cost the server no Python memory that stays: nothing per
    call is kept (sessions, tasks, metric labels, error records)."""
    caplog.set_level(logging.WARNING)  # pytest keeps every log record it captures
    kinds = [m for _, m, c, _ in CASES if c != Code.OK and len(b"".join(m)) < 100_000]

    async def burst(n: int) -> None:
        for i in range(n):
            await outcome(server.port, kinds[i % len(kinds)])

    # What is traced after each of three equal bursts. Its level is set by what the last
    # few calls still hold for a moment (grpc keeps finished calls' state briefly; a session's
    # utterance buffer alone is 80 KiB) and wanders by a few hundred KiB; a session kept per
    # call would add megabytes a burst.
    await burst(2 * len(kinds))  # warm-up: lazily built objects, caches, free lists
    tracemalloc.start()
    try:
        sizes = []
        for _ in range(3):
            await burst(5 * len(kinds))
            gc.collect()
            sizes.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    print(f"traced after each burst: {[f'{s / 1024:.0f} KiB' for s in sizes]}")
    assert sizes[2] - sizes[0] < 2 << 20, sizes
    await assert_serving(server)
