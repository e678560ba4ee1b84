"""asr-bridge's gates and its metrics, with a Python WebSocket client: the Origin check, the
session limit, ``GET /metrics``, and reaching a gRPC server over TLS (and mTLS) with a
bearer token. The TLS server here is a tiny real grpc.aio server with trustme certificates
that answers one final per stream and records the ``authorization`` metadata it got."""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from asr_api.v1 import asr_pb2, asr_pb2_grpc
from asr_client import ConnectionOptions
from tests.helpers import eventually, serve_fake, speech_pcm
from tests.integration.test_bridge import events_until_close, send_pcm, ws_url
from tests.pki import SERVER_NAME
from tests.pki import Pki as CertificateAuthority

pytestmark = pytest.mark.timeout(60)

START = json.dumps({"type": "start", "sample_rate": 16_000})


async def open_session(bridge: Any, **connect_kwargs: Any) -> ClientConnection:
    """A WebSocket whose session is running (``ready`` received)."""
    ws = await connect(ws_url(bridge), **connect_kwargs)
    await ws.send(START)
    assert json.loads(await ws.recv())["type"] == "ready"
    return ws


async def finish(ws: ClientConnection) -> list[dict[str, Any]]:
    await ws.send(json.dumps({"type": "stop"}))
    return await events_until_close(ws)


def scrape(bridge: Any) -> dict[str, float]:
    """GET /metrics as {"name{label=value}": value} (blocking: run it in a thread)."""
    url = f"http://127.0.0.1:{bridge.port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def active(bridge: Any) -> float:
    value = bridge.metrics.registry.get_sample_value("asr_bridge_active_sessions")
    return float(value or 0)


# -- Origin -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("allowed_origins", "origin", "accepted"),
    [
        ((), None, True),  # no Origin: not a browser; the token is what guards it
        ((), "same", True),  # the page the bridge itself served
        ((), "http://127.0.0.1:1", False),  # same host, another port
        ((), "https://same", False),  # the same host:port over https is another origin
        ((), "https://evil.example", False),
        (("https://app.example.org",), "https://app.example.org", True),
        (("https://app.example.org",), "same", False),  # a list replaces same-origin
        (("*",), "https://evil.example", True),
    ],
)
async def test_origin_is_checked_on_the_handshake(
    make_server,  # type: ignore[no-untyped-def]
    make_bridge,
    allowed_origins: tuple[str, ...],
    origin: str | None,
    accepted: bool,
) -> None:
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, allowed_origins=allowed_origins)
    # "same": what a browser sends from the bridge's page; the client's Host header is the
    # real one the URL gives, 127.0.0.1:<port>
    own = f"127.0.0.1:{bridge.port}"
    header = origin and origin.replace("https://same", f"https://{own}")
    header = header and header.replace("same", f"http://{own}")
    if accepted:
        ws = await open_session(bridge, origin=header)
        await finish(ws)
        assert ws.close_code == 1000
    else:
        with pytest.raises(InvalidStatus) as refused:
            await connect(ws_url(bridge), origin=header)  # type: ignore[arg-type]
        assert refused.value.response.status_code == 403
        assert b"origin not allowed" in refused.value.response.body
    metrics = await asyncio.to_thread(scrape, bridge)
    assert metrics["asr_bridge_refusals_total{reason=origin}"] == (0 if accepted else 1)
    assert metrics["asr_bridge_sessions_total"] == (1 if accepted else 0)


# -- the session limit --------------------------------------------------------------------


async def test_sessions_past_the_limit_are_refused_until_one_ends(
    make_server,  # type: ignore[no-untyped-def]
    make_bridge,
) -> None:
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, max_sessions=2)
    first = await open_session(bridge)
    second = await open_session(bridge)
    async with connect(ws_url(bridge)) as third:
        events = await events_until_close(third)
    assert events == [
        {
            "type": "error",
            "code": "RESOURCE_EXHAUSTED",
            "message": "the bridge is at its limit of 2 sessions; try again later",
        }
    ]
    assert third.close_code == 1013  # try again later; the page shows it as an error
    assert (third.close_reason or "").startswith("RESOURCE_EXHAUSTED: the bridge is at its limit")

    await finish(first)
    await eventually(lambda: active(bridge) == 1)
    fourth = await open_session(bridge)  # the freed slot is usable again
    for ws in (second, fourth):
        await finish(ws)
        assert ws.close_code == 1000
    await eventually(lambda: active(bridge) == 0)
    metrics = await asyncio.to_thread(scrape, bridge)
    assert metrics["asr_bridge_sessions_total"] == 3
    assert metrics["asr_bridge_refusals_total{reason=capacity}"] == 1
    assert metrics["asr_bridge_max_sessions"] == 2
    # the gRPC server never saw the refused one
    await eventually(lambda: server.servicer.active == 0)


async def test_one_client_address_cannot_take_every_session(
    make_server,  # type: ignore[no-untyped-def]
    make_bridge,
) -> None:
    """Everyone with the bridge's token (or anyone, without one) could open every session
    and hold it without audio (the bridge keeps its streams alive), refusing all others:
    a limit per client address now, behind a trusted proxy the address it forwards."""
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, max_sessions=5, max_sessions_per_client=2)
    held = [await open_session(bridge) for _ in range(2)]
    async with connect(ws_url(bridge)) as third:
        events = await events_until_close(third)
    assert [(e["code"], e["message"]) for e in events] == [
        (
            "RESOURCE_EXHAUSTED",
            "this address has 2 sessions open, the bridge's limit per client; "
            "close one or try again later",
        )
    ]
    assert third.close_code == 1013
    # another browser, behind a proxy on this host (trusted by default): its own limit
    other = await open_session(bridge, additional_headers={"X-Forwarded-For": "203.0.113.9"})
    await finish(held.pop())
    await eventually(lambda: active(bridge) == 2)
    again = await open_session(bridge)  # the address's freed session is usable again
    for ws in (*held, other, again):
        await finish(ws)
        assert ws.close_code == 1000
    metrics = await asyncio.to_thread(scrape, bridge)
    assert metrics["asr_bridge_refusals_total{reason=client_limit}"] == 1
    assert metrics["asr_bridge_refusals_total{reason=capacity}"] == 0


# -- metrics ------------------------------------------------------------------------------


async def test_metrics_count_sessions_refusals_audio_and_lag(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server)
    bridge = await make_bridge(server.port, token="s3cret", max_sessions=1)
    with pytest.raises(InvalidStatus):
        await connect(ws_url(bridge), origin="https://evil.example")  # type: ignore[arg-type]
    async with connect(ws_url(bridge)) as no_token:
        await events_until_close(no_token)
    assert no_token.close_code == 4401
    ws = await open_session(bridge, subprotocols=["streamasr.v1", "bearer.s3cret"])
    assert active(bridge) == 1
    async with connect(ws_url(bridge, "?token=s3cret")) as over:
        await events_until_close(over)
    assert over.close_code == 1013
    pcm = speech_pcm(2.0).tobytes()
    await send_pcm(ws, pcm)
    events = await finish(ws)
    assert [e["type"] for e in events][-1] == "closed"
    responses = sum(1 for e in events if "lag_s" in e)
    await eventually(lambda: active(bridge) == 0)

    m = await asyncio.to_thread(scrape, bridge)
    assert m["asr_bridge_active_sessions"] == 0
    assert m["asr_bridge_sessions_total"] == 1
    refusals = {k: v for k, v in m.items() if k.startswith("asr_bridge_refusals_total")}
    assert refusals == {
        "asr_bridge_refusals_total{reason=origin}": 1,
        "asr_bridge_refusals_total{reason=token}": 1,
        "asr_bridge_refusals_total{reason=capacity}": 1,
        "asr_bridge_refusals_total{reason=client_limit}": 0,
        "asr_bridge_refusals_total{reason=server_unavailable}": 0,
        "asr_bridge_refusals_total{reason=server_auth}": 0,
        "asr_bridge_refusals_total{reason=server_capacity}": 0,
    }
    assert m["asr_bridge_audio_received_bytes_total"] == len(pcm)
    # one lag observation per server response (the events with lag_s, plus any the
    # streamasr shape does not show, such as progress-only responses)
    assert m["asr_bridge_server_lag_seconds_count"] >= responses > 0
    assert not any(k.startswith("asr_bridge_session_errors_total{") for k in m)


async def test_server_errors_are_counted_by_status(make_server, make_bridge) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server, max_streams=1)
    bridge = await make_bridge(server.port)
    first = await open_session(bridge)
    await send_pcm(first, speech_pcm(0.5).tobytes())
    await eventually(lambda: server.servicer.active == 1)
    async with connect(ws_url(bridge)) as second:
        await second.send(START)
        await events_until_close(second)
    await finish(first)
    m = await asyncio.to_thread(scrape, bridge)
    assert m["asr_bridge_session_errors_total{code=RESOURCE_EXHAUSTED}"] == 1
    assert m["asr_bridge_refusals_total{reason=server_capacity}"] == 1


# -- reaching a TLS server with a token ---------------------------------------------------

SERVER_TOKEN = "server-s3cret"


@dataclass
class TinyRecognizer(asr_pb2_grpc.RecognizerServicer):
    """Checks the bearer token, then answers one final saying how much audio it got."""

    seen_authorization: list[str | None] = field(default_factory=list)

    async def StreamingRecognize(self, request_iterator: Any, context: Any) -> None:
        metadata = dict(context.invocation_metadata())
        self.seen_authorization.append(metadata.get("authorization"))
        if metadata.get("authorization") != f"Bearer {SERVER_TOKEN}":
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token")
        audio = 0
        while (request := await context.read()) is not grpc.aio.EOF:
            audio += len(request.audio)
        await context.write(
            asr_pb2.StreamingRecognizeResponse(
                result=asr_pb2.Result(is_final=True, text=f"{audio} bytes over TLS"),
                progress=asr_pb2.Progress(lag_s=0.25),
            )
        )


@dataclass
class Pki:
    ca: Path
    other_ca: Path  # a CA that did not sign the server's certificate
    client_cert: Path
    client_key: Path


@pytest.fixture
async def tls_server(tmp_path: Path) -> AsyncIterator[tuple[int, TinyRecognizer, Pki]]:
    """A grpc.aio server with TLS that requires a client certificate signed by its CA."""
    ca = CertificateAuthority(tmp_path / "ca")
    server_cert, server_key = ca.server()
    client_cert, client_key = ca.client("asr-bridge")
    other = CertificateAuthority(tmp_path / "other", "other-ca")
    pki = Pki(ca.ca_file, other.ca_file, client_cert, client_key)
    credentials = grpc.ssl_server_credentials(
        [(server_key.read_bytes(), server_cert.read_bytes())],
        root_certificates=ca.ca_file.read_bytes(),
        require_client_auth=True,
    )
    servicer = TinyRecognizer()
    server = grpc.aio.server()
    asr_pb2_grpc.add_RecognizerServicer_to_server(servicer, server)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    try:
        yield port, servicer, pki
    finally:
        await server.stop(None)


async def test_reaches_a_tls_server_with_a_client_cert_and_a_bearer_token(
    make_bridge,  # type: ignore[no-untyped-def]
    tls_server: tuple[int, TinyRecognizer, Pki],
) -> None:
    port, servicer, pki = tls_server
    options = ConnectionOptions(
        f"127.0.0.1:{port}",
        ca_file=pki.ca,
        cert_file=pki.client_cert,
        key_file=pki.client_key,
        token=SERVER_TOKEN,
    )
    bridge = await make_bridge(options)
    ws = await open_session(bridge)
    await ws.send(b"\0\0" * 800)
    events = await finish(ws)
    assert [e["type"] for e in events] == ["final", "closed"], events
    assert events[0]["text"] == "1600 bytes over TLS"
    assert ws.close_code == 1000
    assert servicer.seen_authorization == [f"Bearer {SERVER_TOKEN}"]


async def bridge_with_a_wrong_server_token(  # type: ignore[no-untyped-def]
    make_bridge, tls_server: tuple[int, TinyRecognizer, Pki]
) -> tuple[Any, TinyRecognizer]:
    """A bridge whose client certificate is good and whose token the server refuses."""
    port, servicer, pki = tls_server
    options = ConnectionOptions(
        f"127.0.0.1:{port}",
        ca_file=pki.ca,
        cert_file=pki.client_cert,
        key_file=pki.client_key,
        token="wrong",
    )
    return await make_bridge(options), servicer


async def test_a_wrong_server_token_is_a_readable_error_not_the_browsers_fault(
    make_bridge,  # type: ignore[no-untyped-def]
    tls_server: tuple[int, TinyRecognizer, Pki],
    caplog: pytest.LogCaptureFixture,
) -> None:
    bridge, servicer = await bridge_with_a_wrong_server_token(make_bridge, tls_server)
    async with connect(ws_url(bridge)) as ws:
        await ws.send(START)
        events = await events_until_close(ws)
    error = events[-1]
    assert error["type"] == "error" and error["code"] == "UNAUTHENTICATED", events
    assert error["message"] == (
        "the recognition server refused the bridge's credentials: missing or wrong token"
    )
    assert ws.close_code == 1011  # not 4401: the browser's own token (none here) was fine
    assert servicer.seen_authorization == ["Bearer wrong"]
    assert any(
        r.levelno == logging.WARNING and "refused the bridge's credentials" in r.getMessage()
        for r in caplog.records
    )
    m = await asyncio.to_thread(scrape, bridge)
    assert m["asr_bridge_refusals_total{reason=server_auth}"] == 1
    assert m["asr_bridge_session_errors_total{code=UNAUTHENTICATED}"] == 1


async def test_a_wrong_server_token_on_the_realtime_route_is_not_the_clients_fault(
    make_bridge,  # type: ignore[no-untyped-def]
    tls_server: tuple[int, TinyRecognizer, Pki],
) -> None:
    """As on /ws: the server refusing the bridge's credentials closes 1011, not 4401 (a
    client would ask its user for a key they got right)."""
    import base64

    bridge, _ = await bridge_with_a_wrong_server_token(make_bridge, tls_server)
    url = f"ws://127.0.0.1:{bridge.port}/v1/realtime?intent=transcription"
    async with connect(url, additional_headers={"Authorization": "Bearer any"}) as ws:
        audio = base64.b64encode(bytes(4800)).decode()
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
        events = []
        with pytest.raises(ConnectionClosed):
            while True:
                events.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
    (error,) = [e for e in events if e["type"] == "error"]
    assert error["error"]["type"] == "server_error"
    assert "refused the bridge's credentials" in error["error"]["message"], error
    assert ws.close_code == 1011


@pytest.mark.parametrize(
    "route",
    [
        "/v1/listen?encoding=linear16&sample_rate=16000",
        "/v2/listen?model=flux-general-en&encoding=linear16&sample_rate=16000",
        "/v1/realtime?intent=transcription",
    ],
)
async def test_every_route_counts_the_servers_refusal_of_the_bridge(
    make_bridge,  # type: ignore[no-untyped-def]
    tls_server: tuple[int, TinyRecognizer, Pki],
    route: str,
) -> None:
    """The operator's alert on asr_bridge_refusals_total{reason="server_auth"} (deploy/
    README.md) must fire for Deepgram, Flux and OpenAI clients too, not for /ws alone."""
    import base64

    bridge, _ = await bridge_with_a_wrong_server_token(make_bridge, tls_server)
    url = f"ws://127.0.0.1:{bridge.port}{route}"
    async with connect(url, additional_headers={"Authorization": "Bearer any"}) as ws:
        if "realtime" in route:
            audio = base64.b64encode(bytes(4800)).decode()
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
        else:
            await ws.send(bytes(3200))
        with pytest.raises(ConnectionClosed):
            while True:
                await asyncio.wait_for(ws.recv(), 10)
    assert ws.close_code == 1011
    m = await asyncio.to_thread(scrape, bridge)
    assert m["asr_bridge_refusals_total{reason=server_auth}"] == 1
    assert m["asr_bridge_session_errors_total{code=UNAUTHENTICATED}"] == 1


async def test_the_wrong_ca_fails_readably_as_unavailable(
    make_bridge,  # type: ignore[no-untyped-def]
    tls_server: tuple[int, TinyRecognizer, Pki],
) -> None:
    port, servicer, pki = tls_server
    options = ConnectionOptions(f"127.0.0.1:{port}", ca_file=pki.other_ca, token=SERVER_TOKEN)
    bridge = await make_bridge(options)
    async with connect(ws_url(bridge)) as ws:
        await ws.send(START)
        events = await events_until_close(ws)
    error = events[-1]
    assert error["type"] == "error" and error["code"] == "UNAVAILABLE", events
    assert "handshake" in error["message"].lower() or "certificate" in error["message"].lower()
    assert ws.close_code == 1013
    assert servicer.seen_authorization == []  # the token never left over a channel it distrusts
    m = await asyncio.to_thread(scrape, bridge)
    assert m["asr_bridge_refusals_total{reason=server_unavailable}"] == 1


async def test_unreadable_server_credentials_fail_at_start(make_bridge, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from asr_client.connection import ConnectionConfigError

    with pytest.raises(ConnectionConfigError, match="CA bundle"):
        await make_bridge(ConnectionOptions("127.0.0.1:1", ca_file=tmp_path / "missing.pem"))


async def test_bridge_reaches_the_real_server_over_tls_with_a_token(  # type: ignore[no-untyped-def]
    make_server, make_bridge, tmp_path: Path
) -> None:
    """End to end: browser WebSocket → bridge → asr-server with TLS and --auth-tokens."""
    from asr_server.transport.auth import new_token

    pki = CertificateAuthority(tmp_path / "server-pki")
    cert, key = pki.server()
    token, line = new_token("web-bridge")
    tokens = tmp_path / "tokens"
    tokens.write_text(line + "\n")
    server = await serve_fake(make_server, tls_cert=cert, tls_key=key, auth_tokens=tokens)
    options = ConnectionOptions(
        f"127.0.0.1:{server.port}", ca_file=pki.ca_file, server_name=SERVER_NAME, token=token
    )
    bridge = await make_bridge(options)
    ws = await open_session(bridge)
    await send_pcm(ws, speech_pcm().tobytes())
    events = await finish(ws)
    assert [e["text"] for e in events if e["type"] == "final"] == ["w0 w1 w2 w3"]
    samples = server.metrics.registry.get_sample_value
    assert samples("asr_client_streams_total", {"client": "web-bridge"}) == 1
