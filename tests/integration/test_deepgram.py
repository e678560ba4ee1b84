"""Deepgram's live API on asr-bridge (``/v1/listen``).

The official ``deepgram-sdk``, unmodified, against the bridge and the real tiny.en model on
recorded speech; and a plain WebSocket client against the fake engine for every refusal.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import threading
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from asr_client.scoring import wer
from asr_server.audio.g711 import mulaw_encode
from asr_server.engine.base import DecodeKind, DecodeRequest, Hypothesis
from asr_server.engine.fake import FakeEngine
from tests.helpers import (
    corpus,
    encode_container,
    eventually,
    first_channel,
    read_pcm16,
    serve_fake,
    speech_pcm,
    tone,
)
from tests.integration.test_bridge import (
    client_of_a_stalled_server,
    events_until_close,
    send_until_closed,
)

pytestmark = pytest.mark.timeout(120)

TOKEN = "dg-s3cret"
RECORDING = "libri_1089-134686-0000"  # 10.4 s of read speech, 16 kHz mono


def listen_url(bridge: Any, query: str) -> str:
    return f"ws://127.0.0.1:{bridge.port}/v1/listen?{query}"


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Token {token}"}


# -- the official SDK, the real model ----------------------------------------------------


def sdk_client(port: int, key: str = TOKEN) -> Any:
    """The official SDK's async client, pointed at the bridge on ``port``: the only two
    things a Deepgram user changes are the base URL and the key."""
    from deepgram import AsyncDeepgramClient
    from deepgram.environment import DeepgramClientEnvironment

    environment = DeepgramClientEnvironment(
        base=f"http://127.0.0.1:{port}",
        production=f"ws://127.0.0.1:{port}",
        agent=f"ws://127.0.0.1:{port}",
        agent_rest=f"http://127.0.0.1:{port}",
    )
    return AsyncDeepgramClient(api_key=key, environment=environment)


async def handshake_refused(url: str, token: str) -> tuple[int, dict[str, Any], Any]:
    """Connect to ``url`` expecting the handshake to be refused: status, JSON body, headers."""
    with pytest.raises(InvalidStatus) as refused:
        async with connect(url, additional_headers=auth(token)):
            pass
    response = refused.value.response
    return response.status_code, json.loads(response.body), response.headers


async def sdk_transcribe(port: int, audio: bytes, chunk: int, seconds_per_chunk: float, **query):  # type: ignore[no-untyped-def]
    """Stream ``audio`` through the official SDK at about 4× real time, CloseStream, and
    return every message the SDK parsed, in order."""
    client = sdk_client(port)
    received: list[Any] = []
    async with client.listen.v1.connect(model="nova-3", **query) as socket:

        async def send() -> None:
            for i in range(0, len(audio), chunk):
                await socket.send_media(audio[i : i + chunk])
                await asyncio.sleep(seconds_per_chunk / 4)
            await socket.send_keep_alive()
            await socket.send_close_stream()

        sender = asyncio.create_task(send())
        async for message in socket:
            received.append(message)
        await sender
    return received


def check_sequence(received: list[Any], reference: str, *, interim: bool) -> None:
    kinds = [type(m).__name__ for m in received]
    assert kinds[-1] == "ListenV1Metadata", kinds
    assert "ListenV1SpeechStarted" in kinds
    finals = [m for m in received if type(m).__name__ == "ListenV1Results" and m.is_final]
    assert finals and any(m.speech_final for m in finals), kinds
    if interim:
        assert any(type(m).__name__ == "ListenV1Results" and not m.is_final for m in received)
    ends = [i for i, k in enumerate(kinds) if k == "ListenV1UtteranceEnd"]
    assert ends, kinds
    first_speech_final = next(i for i, m in enumerate(received) if m in finals and m.speech_final)
    assert ends[0] > first_speech_final  # UtteranceEnd follows the utterance's last words
    for m in finals:
        assert m.channel_index == [0, 1]
        alternative = m.channel.alternatives[0]
        # Whisper's words are what its aligner made of the text (pieces such as "-mutton"),
        # so they are checked against the transcript, not joined into it
        assert alternative.words
        assert all(w.punctuated_word in alternative.transcript for w in alternative.words)
        assert all(w.word == w.word.lower() for w in alternative.words)
        assert all(m.start - 0.5 <= w.start <= w.end for w in alternative.words)
        assert alternative.transcript[0].isupper()  # punctuate=true: Whisper's cased text
    hypothesis = " ".join(m.channel.alternatives[0].transcript for m in finals)
    assert wer([reference], [hypothesis]) <= 0.15, hypothesis
    metadata = received[-1]
    assert metadata.request_id == finals[0].metadata.request_id
    assert metadata.channels == 1


@pytest.mark.model
@pytest.mark.timeout(300)
async def test_official_sdk_transcribes_linear16(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    server = await make_server()  # the real tiny.en model
    bridge = await make_bridge(server.port, token=TOKEN)
    rec = corpus()[RECORDING]
    pcm, rate = read_pcm16(rec.path)
    assert rate == 16_000
    audio = pcm[:, 0].astype("<i2").tobytes() + bytes(2 * rate)  # 1 s of silence after
    received = await sdk_transcribe(
        bridge.port,
        audio,
        chunk=3_200,  # 100 ms, cut at an odd byte count on purpose below
        seconds_per_chunk=0.1,
        encoding="linear16",
        sample_rate=16_000,
        interim_results="true",
        utterance_end_ms=1000,
        vad_events="true",
        punctuate="true",
    )
    check_sequence(received, rec.transcript, interim=True)
    assert received[-1].duration == pytest.approx(len(audio) / 32_000, abs=0.01)
    await eventually(lambda: server.servicer.active == 0)


@pytest.mark.model
@pytest.mark.timeout(300)
async def test_official_sdk_transcribes_8khz_mulaw(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    server = await make_server()
    bridge = await make_bridge(server.port, token=TOKEN)
    rec = corpus()[RECORDING]
    narrow = first_channel(rec.path, 8_000)
    telephone = (np.clip(narrow, -1, 1) * 32767).astype(np.int16)
    audio = mulaw_encode(telephone) + mulaw_encode(np.zeros(8_000, dtype=np.int16))
    received = await sdk_transcribe(
        bridge.port,
        audio,
        chunk=777,  # any cut: the bridge needs no frame alignment from the client
        seconds_per_chunk=777 / 8_000,
        encoding="mulaw",
        sample_rate=8_000,
        utterance_end_ms=1000,
        vad_events="true",
        punctuate="true",
        endpointing=300,
    )
    check_sequence(received, rec.transcript, interim=False)
    await eventually(lambda: server.servicer.active == 0)


@pytest.mark.model
@pytest.mark.timeout(300)
async def test_webm_opus_from_a_browser_style_client(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    """Deepgram's browser examples, over the wire: the key as the subprotocols
    ``["token", key]``, no query at all, and MediaRecorder's WebM/Opus in quarter-second
    pieces; a Finalize after the speech, then CloseStream."""
    server = await make_server()  # the real tiny.en model
    bridge = await make_bridge(server.port, token=TOKEN)
    rec = corpus()[RECORDING]
    pcm, rate = read_pcm16(rec.path)
    webm = encode_container(pcm[:, :1], rate, "webm", "libopus")
    seconds = len(pcm) / rate
    piece = len(webm) * 0.25 // seconds  # a quarter second each, as start(250) hands out
    url = f"ws://127.0.0.1:{bridge.port}/v1/listen"
    async with connect(url, subprotocols=["token", TOKEN]) as ws:  # type: ignore[list-item]
        assert ws.subprotocol == "token"  # a browser insists on one it offered
        for i in range(0, len(webm), int(piece)):
            await ws.send(webm[i : i + int(piece)])
            await asyncio.sleep(0.25 / 4)
        await ws.send(json.dumps({"type": "Finalize"}))
        await ws.send(json.dumps({"type": "CloseStream"}))
        messages = await events_until_close(ws)
    assert ws.close_code == 1000
    finals = [m for m in messages if m["type"] == "Results" and m["is_final"]]
    hypothesis = " ".join(f["channel"]["alternatives"][0]["transcript"] for f in finals)
    assert wer([rec.transcript], [hypothesis]) <= 0.15, hypothesis
    assert finals[-1]["from_finalize"]  # the Finalize came after all the speech
    assert all(f["channel_index"] == [0, 1] for f in finals)
    assert finals[-1]["start"] + finals[-1]["duration"] <= seconds + 0.1
    metadata = messages[-1]
    assert metadata["type"] == "Metadata" and metadata["channels"] == 1
    assert metadata["duration"] == pytest.approx(seconds, abs=0.05)  # the decoded audio
    assert metadata["sha256"] == hashlib.sha256(webm).hexdigest()  # of the bytes received
    await eventually(lambda: server.servicer.active == 0)


@pytest.mark.model
@pytest.mark.timeout(300)
async def test_official_sdk_streams_an_ogg_opus_file_as_opus(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    """``encoding=opus`` (Opus in Ogg, as Deepgram names it), stereo, ``multichannel``:
    each channel its own transcript, the rate and channels read from the file."""
    server = await make_server()
    bridge = await make_bridge(server.port, token=TOKEN)
    rec = corpus()[RECORDING]
    pcm, rate = read_pcm16(rec.path)
    # the recording on channel 1 only, after a second: channel 0 hears a quiet line
    speech = np.concatenate([np.zeros((rate, 1), np.int16), pcm[:, :1]])
    stereo = np.concatenate([np.zeros_like(speech), speech], axis=1)
    ogg = encode_container(stereo, rate, "ogg", "libopus")
    received = await sdk_transcribe(
        bridge.port,
        ogg,
        chunk=4_000,
        seconds_per_chunk=4_000 / len(ogg) * len(stereo) / rate,
        encoding="opus",
        multichannel="true",
        punctuate="true",
    )
    kinds = [type(m).__name__ for m in received]
    assert kinds[-1] == "ListenV1Metadata", kinds
    assert received[-1].channels == 2
    finals = [m for m in received if type(m).__name__ == "ListenV1Results" and m.is_final]
    heard = [m for m in finals if m.channel.alternatives[0].transcript]
    assert heard and all(m.channel_index == [1, 2] for m in heard)
    hypothesis = " ".join(m.channel.alternatives[0].transcript for m in heard)
    assert wer([rec.transcript], [hypothesis]) <= 0.15, hypothesis
    await eventually(lambda: server.servicer.active == 0)


async def test_audio_that_is_no_container_is_a_data_error(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    """Raw PCM sent without ``encoding``: FFmpeg recognizes no container in it, and the
    client is told why (Deepgram's Error, then close 1008 DATA-0000); no stream was opened."""
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=TOKEN)
    url = f"ws://127.0.0.1:{bridge.port}/v1/listen"
    async with connect(url, additional_headers=auth()) as ws:
        pcm = speech_pcm(2.0).tobytes()
        for i in range(0, len(pcm), 3_200):
            await ws.send(pcm[i : i + 3_200])
        messages = await events_until_close(ws)
    assert ws.close_code == 1008 and ws.close_reason.startswith("DATA-0000")
    assert [m["type"] for m in messages] == ["Error"]
    assert "encoding and sample_rate" in messages[0]["description"]
    assert server.servicer.active == 0
    assert json.loads(await asyncio.to_thread(_get, bridge.port, "/healthz"))["sessions"] == 0


async def test_a_container_stream_takes_commands_before_its_audio(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    """KeepAlive and Finalize before the first bytes, then the audio: the Finalize ended
    nothing and is answered so (an empty final), as on a raw stream; and a stream closed
    before it sent any audio ends cleanly, with nothing decoded."""
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=TOKEN)
    webm = encode_container(speech_pcm(2.0), 16_000, "webm", "libopus")
    url = f"ws://127.0.0.1:{bridge.port}/v1/listen"
    async with connect(url, additional_headers=auth()) as ws:
        await ws.send(json.dumps({"type": "KeepAlive"}))
        await ws.send(json.dumps({"type": "Finalize"}))
        await ws.send(webm)
        await ws.send(json.dumps({"type": "CloseStream"}))
        messages = await events_until_close(ws)
    assert ws.close_code == 1000
    finals = [m for m in messages if m["type"] == "Results" and m["is_final"]]
    assert [f["channel"]["alternatives"][0]["transcript"] for f in finals] == [
        "",
        "w0 w1 w2 w3 w4 w5 w6 w7",
    ]
    assert finals[0]["from_finalize"] and not finals[1]["from_finalize"]
    assert messages[-1]["type"] == "Metadata"
    assert messages[-1]["duration"] == pytest.approx(2.7, abs=0.03)  # 2 s + 0.7 s of silence
    async with connect(url, additional_headers=auth()) as ws:
        await ws.send(json.dumps({"type": "CloseStream"}))
        messages = await events_until_close(ws)
    assert ws.close_code == 1000
    assert [m["type"] for m in messages] == ["Metadata"] and messages[0]["duration"] == 0
    await eventually(lambda: server.servicer.active == 0)


async def test_container_finalize_channel_checked_once_decoded(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    """Stereo WebM with ``multichannel``: a Finalize of channel 1 sent with the audio,
    before FFmpeg has said how many channels there are, is taken (and answered); one of a
    channel the audio lacks is refused when the decoder reaches it, and the stream goes on."""
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=TOKEN)
    mono = speech_pcm(1.0)[:16_000]  # speech with no silence after: only a Finalize ends it
    webm = encode_container(
        np.concatenate([np.zeros_like(mono), mono], axis=1), 16_000, "webm", "libopus"
    )
    url = f"ws://127.0.0.1:{bridge.port}/v1/listen?multichannel=true"
    async with connect(url, additional_headers=auth()) as ws:
        await ws.send(webm)
        await ws.send(json.dumps({"type": "Finalize", "channel": 2}))
        await ws.send(json.dumps({"type": "Finalize", "channel": 1}))
        await ws.send(json.dumps({"type": "CloseStream"}))
        messages = await events_until_close(ws)
    assert ws.close_code == 1000
    (error,) = [m for m in messages if m["type"] == "Error"]
    assert "channel 2 does not exist (2 here)" in error["description"]
    finals = [m for m in messages if m["type"] == "Results" and m["is_final"]]
    assert [(f["channel_index"], f["from_finalize"]) for f in finals] == [([1, 2], True)]
    assert finals[0]["channel"]["alternatives"][0]["transcript"] == "w0 w1 w2 w3"
    await eventually(lambda: server.servicer.active == 0)


async def test_a_container_cut_short_at_its_end_is_transcribed(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    """A fragmented MP4 (Safari's MediaRecorder) whose client stopped inside a fragment,
    then CloseStream: what was decoded is transcribed and the stream ends as usual (an
    error in data the client went on sending past is still refused)."""
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=TOKEN)
    fragmented = {"movflags": "frag_keyframe+empty_moov", "frag_duration": "250000"}
    mp4 = encode_container(speech_pcm(1.0), 16_000, "mp4", "aac", options=fragmented)
    url = f"ws://127.0.0.1:{bridge.port}/v1/listen"
    async with connect(url, additional_headers=auth()) as ws:
        await ws.send(mp4[: int(len(mp4) * 0.8)])
        await ws.send(json.dumps({"type": "CloseStream"}))
        messages = await events_until_close(ws)
    assert ws.close_code == 1000, messages
    finals = [m for m in messages if m["type"] == "Results" and m["is_final"]]
    assert finals and finals[-1]["channel"]["alternatives"][0]["transcript"].startswith("w0")
    assert messages[-1]["type"] == "Metadata"
    await eventually(lambda: server.servicer.active == 0)


async def test_damaged_container_data_is_refused_even_when_the_close_follows(  # type: ignore[no-untyped-def]
    make_server, make_bridge
) -> None:
    """Only a cut-short last packet is taken for the end: data damaged inside the file,
    sent whole and at once followed by CloseStream, is refused (1008), not silently
    transcribed up to the damage."""
    from tests.unit.test_container import damaged, fragmented_mp4

    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=TOKEN)
    data, packets = fragmented_mp4()
    url = f"ws://127.0.0.1:{bridge.port}/v1/listen"
    async with connect(url, additional_headers=auth()) as ws:
        await ws.send(damaged(data, packets[len(packets) // 3]))
        await ws.send(json.dumps({"type": "CloseStream"}))
        messages = await events_until_close(ws)
    assert ws.close_code == 1008, messages
    assert messages[-1]["type"] == "Error" and "could not be decoded" in messages[-1]["description"]
    await eventually(lambda: server.servicer.active == 0)


class _FinalsHearNoWords(FakeEngine):
    """Its finals reject what its interims read as a word: a cough Whisper's no-speech
    filter drops (the server's NO_WORDS)."""

    def _hear(self, req: DecodeRequest) -> Hypothesis:
        if req.kind == DecodeKind.FINAL:
            return Hypothesis("", req.language or "en", rejected=True)
        return super()._hear(req)


async def test_a_noise_after_an_interim_gets_an_empty_final(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    """The interim is superseded by a final, empty, ``speech_final`` as the speech ended:
    a client waiting for the end of what it heard stops waiting."""
    server = await serve_fake(make_server, _FinalsHearNoWords())
    bridge = await make_bridge(server.port, token=TOKEN)
    query = f"{GOOD}&interim_results=true&vad_events=true&utterance_end_ms=1000"
    noise = speech_pcm(0.5).tobytes()
    noise, pause = noise[:16_000], noise[16_000:]
    async with connect(listen_url(bridge, query), additional_headers=auth()) as ws:
        for i in range(0, len(noise), 3_200):
            await ws.send(noise[i : i + 3_200])
        # a tenth of a second of the pause: until a partial has words, the next is asked
        # only once more audio has come (under load the first may hear too little)
        await ws.send(pause[:3_200])
        messages: list[dict[str, Any]] = []
        while not any(m["type"] == "Results" for m in messages):  # the interim
            messages.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
        await ws.send(pause[3_200:])
        await ws.send(json.dumps({"type": "CloseStream"}))
        messages += await events_until_close(ws)
    results = [m for m in messages if m["type"] == "Results"]
    assert not results[0]["is_final"], messages
    # how many words the interim has depends on how much audio it heard (load)
    assert results[0]["channel"]["alternatives"][0]["transcript"].startswith("w0"), messages
    last = results[-1]
    assert last["is_final"] and last["speech_final"], messages
    assert last["channel"]["alternatives"][0]["transcript"] == ""
    assert [m["type"] for m in messages][-1] == "Metadata"
    assert "UtteranceEnd" not in [m["type"] for m in messages]  # no word was final
    await eventually(lambda: server.servicer.active == 0)


async def test_linear32_from_web_audio(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    """32-bit float samples, as an AudioWorklet hands them out, mono and stereo mixed."""
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=TOKEN)
    floats = (speech_pcm(1.0)[:, 0] / 32768).astype("<f4")
    for channels, audio in ((1, floats), (2, np.stack([floats, floats * 0.5], axis=1))):
        query = f"encoding=linear32&sample_rate=16000&channels={channels}"
        async with connect(listen_url(bridge, query), additional_headers=auth()) as ws:
            await ws.send(audio.tobytes())
            await ws.send(json.dumps({"type": "CloseStream"}))
            messages = await events_until_close(ws)
        finals = [m for m in messages if m["type"] == "Results" and m["is_final"]]
        assert [f["channel"]["alternatives"][0]["transcript"] for f in finals] == ["w0 w1 w2 w3"]
        assert messages[-1]["duration"] == pytest.approx(1.7, abs=0.01)
    async with connect(listen_url(bridge, query), additional_headers=auth()) as ws:
        await ws.send(np.full(3_200, np.inf, dtype="<f4").tobytes())  # not audio
        messages = await events_until_close(ws)
    assert ws.close_code == 1008 and "NaN or infinity" in messages[0]["description"]
    await eventually(lambda: server.servicer.active == 0)


@pytest.mark.parametrize("container", [False, True])
async def test_keep_alive_holds_the_stream_through_a_pause(  # type: ignore[no-untyped-def]
    make_server, make_bridge, container: bool
) -> None:
    """KeepAlive, as Deepgram's clients send it while their audio pauses (an agent muting
    the microphone while it speaks), keeps the server's stream open past its idle timeout
    (1.5 s here), and adds no audio: the second utterance starts where the audio resumed."""
    server = await serve_fake(make_server, idle_timeout_s=1.5)
    bridge = await make_bridge(server.port, token=TOKEN)
    tone = speech_pcm(1.0)  # 1 s of tone, 0.7 s of silence
    audio = np.concatenate([tone, tone])
    data = encode_container(audio, 16_000, "webm", "libopus") if container else audio.tobytes()
    query = "" if container else GOOD
    async with connect(listen_url(bridge, query), additional_headers=auth()) as ws:
        await ws.send(data[: len(data) // 2])
        for _ in range(8):  # 4 s: well past the idle timeout
            await asyncio.sleep(0.5)
            await ws.send(json.dumps({"type": "KeepAlive"}))
        await ws.send(data[len(data) // 2 :])
        await ws.send(json.dumps({"type": "CloseStream"}))
        messages = await events_until_close(ws)
    assert ws.close_code == 1000, ws.close_reason
    finals = [m for m in messages if m["type"] == "Results" and m["is_final"]]
    assert [f["channel"]["alternatives"][0]["transcript"] for f in finals] == ["w0 w1 w2 w3"] * 2
    assert finals[1]["start"] == pytest.approx(1.7, abs=0.25)  # no pause added
    assert messages[-1]["duration"] == pytest.approx(3.4, abs=0.05)
    await eventually(lambda: server.servicer.active == 0)


async def test_a_pause_without_keep_alive_ends_the_stream(make_server, make_bridge, caplog) -> None:  # type: ignore[no-untyped-def]
    """Without KeepAlive the server's idle timeout ends the stream (as Deepgram closes a
    socket that sends nothing for 10 s): an Error saying why and 1011, the slot freed, and
    nothing left behind in the server (its abandoned read is not an unretrieved error)."""
    server = await serve_fake(make_server, idle_timeout_s=0.5)
    bridge = await make_bridge(server.port, token=TOKEN)
    async with connect(listen_url(bridge, GOOD), additional_headers=auth()) as ws:
        await ws.send(speech_pcm(1.0).tobytes())
        messages = await events_until_close(ws)
    assert ws.close_code == 1011
    errors = [m for m in messages if m["type"] == "Error"]
    assert len(errors) == 1 and "KEEPALIVE" in errors[0]["description"]
    await eventually(lambda: server.servicer.active == 0)
    await server.close()  # grpc lets go of the abandoned read's task
    gc.collect()  # an unretrieved task exception is logged when its task is collected
    assert "never retrieved" not in caplog.text


async def test_a_container_client_leaving_midway_frees_everything(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=TOKEN)
    webm = encode_container(speech_pcm(2.0), 16_000, "webm", "libopus")
    url = f"ws://127.0.0.1:{bridge.port}/v1/listen?interim_results=true"
    async with connect(url, additional_headers=auth()) as ws:
        await ws.send(webm[: len(webm) // 2])
        await eventually(lambda: server.servicer.active == 1)  # decoded, and streaming
    await eventually(lambda: server.servicer.active == 0)
    # the session's decoder thread is gone (ContainerDecoder names them decode-<session>)
    await eventually(lambda: not [t for t in threading.enumerate() if t.name.startswith("decode-")])
    assert json.loads(await asyncio.to_thread(_get, bridge.port, "/healthz"))["sessions"] == 0


@pytest.mark.parametrize("sent", ["nothing", "a header", "keepalives, then the audio"])
async def test_a_container_silent_before_its_audio_is_known_is_ended(  # type: ignore[no-untyped-def]
    make_server, make_bridge, monkeypatch, sent: str
) -> None:
    """Until FFmpeg has said what a container's audio is, no gRPC stream is open, so the
    server's idle timeout cannot end a silent client: one that sent nothing, or the start
    of a file and then paused, held its session (and a place under the bridge's limit)
    for ever. It now gets Deepgram's NET-0001 and 1011; KeepAlive holds it."""
    from asr_bridge.deepgram_session import ContainerRelay

    monkeypatch.setattr(ContainerRelay, "identify_idle_s", 1.0)
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=TOKEN)
    webm = encode_container(speech_pcm(1.0), 16_000, "webm", "libopus")
    url = f"ws://127.0.0.1:{bridge.port}/v1/listen"
    async with connect(url, additional_headers=auth()) as ws:
        if sent == "a header":
            await ws.send(webm[:100])
        if sent.startswith("keepalives"):
            for _ in range(6):  # 1.5 s: past the window, a message every 0.25 s
                await ws.send(json.dumps({"type": "KeepAlive"}))
                await asyncio.sleep(0.25)
            await ws.send(webm)
            await ws.send(json.dumps({"type": "CloseStream"}))
        messages = await asyncio.wait_for(events_until_close(ws), 10)
    if sent.startswith("keepalives"):
        assert ws.close_code == 1000
        finals = [m for m in messages if m["type"] == "Results" and m["is_final"]]
        assert [f["channel"]["alternatives"][0]["transcript"] for f in finals] == ["w0 w1 w2 w3"]
    else:
        assert ws.close_code == 1011
        assert ws.close_reason.startswith("NET-0001: no audio the bridge could start a stream")
        errors = [m for m in messages if m["type"] == "Error"]
        assert len(errors) == 1 and errors[0]["variant"] == "NET-0001", errors
    await eventually(lambda: not [t for t in threading.enumerate() if t.name.startswith("decode-")])
    assert json.loads(await asyncio.to_thread(_get, bridge.port, "/healthz"))["sessions"] == 0


async def test_official_sdk_reports_a_wrong_key_as_401(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    from deepgram.core.api_error import ApiError

    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=TOKEN)
    client = sdk_client(bridge.port, key="wrong")
    with pytest.raises(ApiError) as refused:
        async with client.listen.v1.connect(model="nova-3", encoding="linear16", sample_rate=16000):
            pass
    assert refused.value.status_code == 401
    assert server.servicer.active == 0


# -- the protocol, with a plain WebSocket client and the fake engine ---------------------


GOOD = "encoding=linear16&sample_rate=16000"


@pytest.mark.parametrize(
    ("query", "token", "status", "phrase"),
    [
        ("encoding=speex&sample_rate=16000", TOKEN, 400, "encoding 'speex' is not supported"),
        ("encoding=linear16", TOKEN, 400, "sample_rate is required with encoding"),
        ("encoding=linear16&sample_rate=4000", TOKEN, 400, "sample_rate must be an integer"),
        ("encoding=linear16&sample_rate=fast", TOKEN, 400, "sample_rate must be an integer"),
        (f"{GOOD}&interim_results=yes", TOKEN, 400, "interim_results must be true or false"),
        (f"{GOOD}&diarize=true", TOKEN, 400, "diarize is not supported"),
        (f"{GOOD}&colour=blue", TOKEN, 400, "unknown query parameter 'colour'"),
        ("encoding=" + "x" * 50, TOKEN, 400, "encoding 'xxxxxxxxxx"),  # cut, with a "…"
        (GOOD, "wrong", 401, "Invalid credentials."),
    ],
)
async def test_refusals_are_http_errors_on_the_handshake(
    make_server,  # type: ignore[no-untyped-def]
    make_bridge,
    query: str,
    token: str,
    status: int,
    phrase: str,
) -> None:
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=TOKEN)
    code, body, headers = await handshake_refused(listen_url(bridge, query), token)
    assert code == status
    assert phrase in body["err_msg"]
    assert body["request_id"] == headers["dg-request-id"]
    assert phrase in headers["dg-error"]
    assert server.servicer.active == 0
    # the refused sockets gave their slot back
    assert json.loads(await asyncio.to_thread(_get, bridge.port, "/healthz"))["sessions"] == 0


def _get(port: int, path: str) -> bytes:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return r.read()  # type: ignore[no-any-return]


async def test_bad_text_messages_get_an_error_and_lose_nothing(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=TOKEN)
    query = f"{GOOD}&vad_events=true&utterance_end_ms=1000&interim_results=true"
    async with connect(listen_url(bridge, query), additional_headers=auth()) as ws:
        assert ws.response.headers["dg-request-id"]
        pcm = speech_pcm(2.0).tobytes()
        await ws.send(pcm[: len(pcm) // 2 + 1])  # an odd cut: the bridge holds the half sample
        await ws.send("{not json")
        await ws.send(json.dumps({"type": "Transcribe"}))
        await ws.send(json.dumps({"type": "Configure", "keyterms": ["streamasr"]}))
        await ws.send(json.dumps({"type": "KeepAlive"}))
        await ws.send(pcm[len(pcm) // 2 + 1 :])
        await ws.send(json.dumps({"type": "CloseStream"}))
        messages = await events_until_close(ws)
    assert ws.close_code == 1000
    kinds = [m["type"] for m in messages]
    errors = [m for m in messages if m["type"] == "Error"]
    assert [e["variant"] for e in errors] == ["SchemaError", "SchemaError"]
    assert errors[0]["message"] == "{not json"
    assert "unknown message type 'Transcribe'" in errors[1]["description"]
    assert "ConfigureFailure" in kinds
    assert kinds[-1] == "Metadata"
    assert messages[-1]["duration"] == pytest.approx(len(pcm) / 32_000, abs=0.001)
    finals = [m for m in messages if m["type"] == "Results" and m["is_final"]]
    assert [f["channel"]["alternatives"][0]["transcript"] for f in finals] == [
        "w0 w1 w2 w3 w4 w5 w6 w7"
    ]
    assert finals[0]["speech_final"] and not finals[0]["from_finalize"]
    assert kinds.index("SpeechStarted") < kinds.index("Results") < kinds.index("UtteranceEnd")
    await eventually(lambda: server.servicer.active == 0)


async def test_finalize_ends_the_utterance_and_keeps_the_stream(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=TOKEN)
    tone = speech_pcm(1.0)[:16_000].tobytes()  # speech with no silence after it
    async with connect(listen_url(bridge, GOOD), additional_headers=auth()) as ws:
        await ws.send(tone)
        await ws.send(json.dumps({"type": "Finalize"}))
        final = None
        while final is None:
            m = json.loads(await asyncio.wait_for(ws.recv(), 30))
            if m["type"] == "Results" and m["is_final"]:
                final = m
        assert final["from_finalize"] is True
        await ws.send(tone)
        await ws.send(json.dumps({"type": "CloseStream"}))
        rest = await events_until_close(ws)
    assert [m["type"] for m in rest][-1] == "Metadata"
    assert any(m["type"] == "Results" and m["is_final"] for m in rest)
    await eventually(lambda: server.servicer.active == 0)


async def test_every_finalize_is_answered_once_and_in_order(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    """pipecat sends Finalize at every stop of its VAD, also after a noise the server did
    not take for speech: that one gets an empty ``from_finalize`` final (as Deepgram's
    answer with nothing new), the speech after it is no answer to it, and the real
    Finalize later gets the final it ended. All sent at once, far faster than real time:
    the server's acknowledgements, not timing, pair each Finalize with its answer."""
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=TOKEN)
    quiet = np.zeros(16_000, np.int16).tobytes()
    tone = speech_pcm(1.0)[:16_000].tobytes()
    async with connect(listen_url(bridge, GOOD), additional_headers=auth()) as ws:
        await ws.send(quiet)
        await ws.send(json.dumps({"type": "Finalize"}))  # nothing to finalize
        await ws.send(quiet + tone + quiet)  # speech, ended by the server's endpointing
        await ws.send(tone)
        await ws.send(json.dumps({"type": "Finalize", "channel": 1}))  # no such channel
        await ws.send(json.dumps({"type": "Finalize", "channel": 0}))  # ends this one
        await ws.send(json.dumps({"type": "CloseStream"}))
        messages = await events_until_close(ws)
    finals = [
        (m["channel"]["alternatives"][0]["transcript"], m["from_finalize"])
        for m in messages
        if m["type"] == "Results" and m["is_final"]
    ]
    assert finals == [("", True), ("w0 w1 w2 w3", False), ("w0 w1 w2 w3", True)], messages
    (error,) = [m for m in messages if m["type"] == "Error"]
    assert "channel 1 does not exist" in error["description"]
    await eventually(lambda: server.servicer.active == 0)


async def test_official_sdk_reads_each_finalize_answer(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    """What pipecat's DeepgramSTTService does: the SDK's ``send_finalize`` at each stop of
    its VAD, and ``from_finalize`` read from the SDK's parsed results: the final the
    Finalize ended, then an empty answer to one sent in silence."""
    from deepgram.listen.v1.types import ListenV1Finalize

    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=TOKEN)
    tone = speech_pcm(1.0)[:16_000].tobytes()
    received: list[Any] = []
    async with sdk_client(bridge.port).listen.v1.connect(
        model="nova-3", encoding="linear16", sample_rate=16_000
    ) as socket:
        await socket.send_media(tone)
        await socket.send_finalize(ListenV1Finalize(type="Finalize"))
        await socket.send_media(bytes(16_000))
        await socket.send_finalize()
        await socket.send_close_stream()
        async for message in socket:
            received.append(message)
    finals = [m for m in received if type(m).__name__ == "ListenV1Results" and m.is_final]
    assert [(m.channel.alternatives[0].transcript, m.from_finalize) for m in finals] == [
        ("w0 w1 w2 w3", True),
        ("", True),
    ]
    await eventually(lambda: server.servicer.active == 0)


async def test_stereo_without_multichannel_is_one_transcript(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=TOKEN)
    mono = speech_pcm(1.0)
    silent = np.zeros_like(mono)
    stereo = np.concatenate([mono, silent], axis=1).astype("<i2").tobytes()
    for multichannel, channels in (("false", {(0, 1)}), ("true", {(0, 2), (1, 2)})):
        query = f"{GOOD}&channels=2&multichannel={multichannel}&vad_events=true"
        async with connect(listen_url(bridge, query), additional_headers=auth()) as ws:
            await ws.send(stereo)
            await ws.send(json.dumps({"type": "CloseStream"}))
            messages = await events_until_close(ws)
        results = [m for m in messages if m["type"] == "Results"]
        assert results, messages
        if multichannel == "false":
            assert {tuple(m["channel_index"]) for m in results} == channels
            assert messages[-1]["channels"] == 1
        else:  # the silent channel has nothing to say, but is counted
            assert {tuple(m["channel_index"]) for m in results} <= channels
            assert messages[-1]["channels"] == 2
    await eventually(lambda: server.servicer.active == 0)


async def test_client_leaving_mid_stream_frees_the_grpc_stream(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=TOKEN)
    async with connect(listen_url(bridge, GOOD), additional_headers=auth()) as ws:
        await ws.send(speech_pcm(0.5).tobytes())
        await eventually(lambda: server.servicer.active == 1)
    await eventually(lambda: server.servicer.active == 0)
    assert json.loads(await asyncio.to_thread(_get, bridge.port, "/healthz"))["sessions"] == 0


async def test_server_refusal_mid_handshake_is_an_error_and_1011(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token=TOKEN)
    # the bridge passes the language on; the fake server refuses it: a gRPC error
    query = f"{GOOD}&language=xx"
    async with connect(listen_url(bridge, query), additional_headers=auth()) as ws:
        await ws.send(speech_pcm(0.2).tobytes())
        messages = await events_until_close(ws)
    assert [m["type"] for m in messages] == ["Error"]
    assert "INVALID_ARGUMENT" in messages[0]["description"]
    assert ws.close_code == 1008
    assert ws.close_reason.startswith("DATA-0000")
    await eventually(lambda: server.servicer.active == 0)


async def test_a_server_that_falls_behind_ends_the_session_with_1013(
    make_server, make_bridge, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """/v1/listen, as /ws: a server that takes no audio for the write deadline ends the
    session with an Error saying so and close 1013, not the keepalive's reasonless 1011."""
    bridge, gate = await client_of_a_stalled_server(make_server, make_bridge, monkeypatch)
    speech = (tone(0.05) * 32767).astype("<i2").tobytes()
    url = listen_url(bridge, "encoding=linear16&sample_rate=16000")
    try:
        async with connect(url) as ws:
            sender = asyncio.create_task(send_until_closed(ws, speech))
            messages = await asyncio.wait_for(events_until_close(ws), 10)
            await sender
    finally:
        gate.set()
    assert ws.close_code == 1013, (ws.close_code, ws.close_reason)
    assert messages[-1]["type"] == "Error", messages[-1]
    assert "the server fell behind" in messages[-1]["description"]
