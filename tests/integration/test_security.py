"""Exposure: TLS and mTLS with live certificate rotation, bearer tokens, per-client quotas,
config and idle timeouts — against real servers on port 0 with real certificates.

The fake engine stands in for the model (tests/integration/test_security_real.py runs the
real tiny.en over TLS and a token); grpc's TLS is never mocked.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from asr_client import AsrClient, ConnectionOptions, StreamClosedError, audio_config
from asr_client.connection import ConnectionConfigError
from asr_server.log import FORMAT, StreamIdFilter
from asr_server.transport.auth import hash_token, new_token
from tests.helpers import (
    eventually,
    final_text,
    sample,
    serve_fake,
    speech_pcm,
    status_of,
    stream_audio,
)
from tests.pki import SERVER_NAME, Pki, key_kind_pair, secp256k1_pair

EXPECTED = "w0 w1 w2 w3"  # what the fake engine hears in speech_pcm()

#: how long a client that must not get through waits for its connection: a handshake here
#: takes milliseconds, and each such wait is a second of the suite
REFUSED_WITHIN_S = 1.0


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path / "pki")


def tls_client(port: int, pki: Pki, **options: object) -> ConnectionOptions:
    settings: dict[str, object] = {"connect_timeout_s": 5.0, **options}
    return ConnectionOptions(
        f"127.0.0.1:{port}",
        ca_file=pki.ca_file,
        server_name=SERVER_NAME,
        **settings,  # type: ignore[arg-type]
    )


def token_file(folder: Path, *names: str) -> tuple[Path, dict[str, str]]:
    tokens, lines = {}, ["# clients of this test"]
    for name in names:
        tokens[name], line = new_token(name)
        lines.append(line)
    path = folder / "tokens"
    path.write_text("\n".join(lines) + "\n")
    return path, tokens


async def call_status(options: ConnectionOptions, config: bool = True) -> grpc.StatusCode:
    """Open a stream (optionally sending a config), read until it ends; the status code."""
    async with AsrClient(options) as client:
        stream = client.stream(audio_config())
        try:
            if config:
                await stream.open()
            async for _ in stream:
                pass
        except StreamClosedError as exc:
            return exc.code
        finally:
            stream.cancel()
    return grpc.StatusCode.OK


# -- TLS ----------------------------------------------------------------------------------


async def test_tls_transcribes_and_refuses_plaintext_clients(make_server, pki) -> None:  # type: ignore[no-untyped-def]
    cert, key = pki.server()
    server = await serve_fake(make_server, tls_cert=cert, tls_key=key)
    received = await stream_audio(tls_client(server.port, pki), speech_pcm(), 16_000, speed=None)
    assert final_text(received) == EXPECTED

    plaintext = ConnectionOptions(f"127.0.0.1:{server.port}", connect_timeout_s=REFUSED_WITHIN_S)
    async with AsrClient(plaintext) as client:
        with pytest.raises(TimeoutError):
            await client.wait_ready()
    # a client that trusts another CA does not get through either
    other = Pki(pki.folder / "other", "other-ca")
    async with AsrClient(
        tls_client(server.port, other, connect_timeout_s=REFUSED_WITHIN_S)
    ) as client:
        with pytest.raises(TimeoutError):
            await client.wait_ready()
    assert server.servicer.active == 0


async def test_certificate_rotation_keeps_open_streams_and_serves_the_new_one(  # type: ignore[no-untyped-def]
    make_server, pki, tmp_path
) -> None:
    cert, key = pki.server()
    server = await serve_fake(make_server, tls_cert=cert, tls_key=key)
    new_ca = Pki(tmp_path / "new", "new-ca")
    async with AsrClient(tls_client(server.port, pki)) as old_client:
        async with old_client.stream(audio_config()) as open_stream:
            await open_stream.send_audio(speech_pcm()[:8000].tobytes())
            await eventually(lambda: server.servicer.active == 1)

            # the files are replaced in place, as cert-manager or certbot do
            new_cert, new_key = new_ca.server("rotated")
            cert.write_bytes(new_cert.read_bytes())
            key.write_bytes(new_key.read_bytes())
            assert server.credentials.tls is not None
            assert await asyncio.to_thread(server.credentials.tls.reload)

            # new connections get the new certificate: trusted by the new CA only
            received = await stream_audio(
                tls_client(server.port, new_ca), speech_pcm(), 16_000, speed=None
            )
            assert final_text(received) == EXPECTED
            async with AsrClient(
                tls_client(server.port, pki, connect_timeout_s=REFUSED_WITHIN_S)
            ) as stale:
                with pytest.raises(TimeoutError):
                    await stale.wait_ready()

            # the stream opened before the rotation goes on, on its old connection
            await open_stream.send_audio(speech_pcm()[8000:].tobytes())
            await open_stream.end()
            finals = [e.result.text async for e in open_stream if e.result.is_final]
    assert finals == [EXPECTED]
    assert sample(server, "asr_credential_reloads_total", file="tls", outcome="ok") == 1


async def test_a_changed_certificate_file_is_picked_up_without_a_signal(  # type: ignore[no-untyped-def]
    make_server, pki, tmp_path
) -> None:
    cert, key = pki.server()
    server = await serve_fake(make_server, tls_cert=cert, tls_key=key)
    new_ca = Pki(tmp_path / "new", "new-ca")
    new_cert, new_key = new_ca.server("rotated")
    cert.write_bytes(new_cert.read_bytes())
    key.write_bytes(new_key.read_bytes())
    os.utime(cert, ns=(1, 1))  # a distinct modification time even on a coarse clock
    # the next handshake notices the change
    received = await stream_audio(tls_client(server.port, new_ca), speech_pcm(), 16_000, speed=None)
    assert final_text(received) == EXPECTED


async def test_a_bad_certificate_on_reload_keeps_the_old_one(
    make_server, pki, caplog, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    cert, key = pki.server()
    server = await serve_fake(make_server, tls_cert=cert, tls_key=key)
    _, other_key = pki.issue("mismatch", SERVER_NAME)
    key.write_bytes(other_key.read_bytes())  # a key that is not the certificate's
    assert server.credentials.tls is not None
    with caplog.at_level(logging.ERROR):
        assert not await asyncio.to_thread(server.credentials.tls.reload)
    assert "keeping the current certificate" in caplog.text
    assert "do not form a usable pair" in caplog.text
    cert.write_text("not a certificate")
    assert not await asyncio.to_thread(server.credentials.tls.reload)
    assert "is not PEM" in caplog.text
    # a pair OpenSSL takes and gRPC's BoringSSL does not: gRPC would keep the old
    # certificate while the reload said it was done
    odd_cert, odd_key = secp256k1_pair(tmp_path)
    cert.write_bytes(odd_cert.read_bytes())
    key.write_bytes(odd_key.read_bytes())
    assert not await asyncio.to_thread(server.credentials.tls.reload)
    assert f"gRPC cannot use the TLS certificate {cert}" in caplog.text
    # one gRPC serves and no gRPC client can connect to: the rotation counted "ok"
    ed_cert, ed_key = key_kind_pair(tmp_path, "Ed25519")
    cert.write_bytes(ed_cert.read_bytes())
    key.write_bytes(ed_key.read_bytes())
    assert not await asyncio.to_thread(server.credentials.tls.reload)
    assert f"the TLS certificate {cert} has an Ed25519 key" in caplog.text
    received = await stream_audio(tls_client(server.port, pki), speech_pcm(), 16_000, speed=None)
    assert final_text(received) == EXPECTED
    assert sample(server, "asr_credential_reloads_total", file="tls", outcome="failed") == 4
    assert sample(server, "asr_credential_reloads_total", file="tls", outcome="ok") == 0


@pytest.mark.parametrize("kind", ["Ed25519", "P-521"])
async def test_a_key_no_grpc_client_can_connect_with_is_refused_at_start(
    make_server, tmp_path, kind
) -> None:  # type: ignore[no-untyped-def]
    """gRPC serves these keys and its C core's clients offer no signature algorithm for
    them: the server said it was ready and every such client's handshake failed ("no
    answer")."""
    from asr_server.transport.tls import CertificateError

    cert, key = key_kind_pair(tmp_path, kind)
    with pytest.raises(CertificateError) as err:
        await serve_fake(make_server, tls_cert=cert, tls_key=key)
    named = "ECDSA P-521" if kind == "P-521" else kind
    assert str(err.value) == (
        f"the TLS certificate {cert} has an {named} key, which clients on gRPC's C core"
        " (asr-client, the bridge, Python's and C++'s grpc) cannot complete a handshake"
        " with: use an RSA, ECDSA P-256 or P-384 key"
    )


async def test_a_p384_key_serves_grpc_clients(make_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The kinds the refusal names are the ones that fail: P-384, beside trustme's P-256."""
    cert, key = key_kind_pair(tmp_path, "P-384")
    server = await serve_fake(make_server, tls_cert=cert, tls_key=key)
    options = ConnectionOptions(
        f"127.0.0.1:{server.port}", ca_file=cert, server_name=SERVER_NAME, connect_timeout_s=5.0
    )
    received = await stream_audio(options, speech_pcm(), 16_000, speed=None)
    assert final_text(received) == EXPECTED


# -- mTLS ---------------------------------------------------------------------------------


async def test_mtls_requires_a_client_certificate_from_the_ca(make_server, pki, caplog) -> None:  # type: ignore[no-untyped-def]
    cert, key = pki.server()
    clients = Pki(pki.folder / "clients", "client-ca")
    # the bundle as `openssl x509 -text` writes it: names in UTF-8 above the PEM
    with_text = "Certificate:\n    Subject: O=Zürich Süd, CN=client-ca\n"
    clients.ca_file.write_bytes(with_text.encode() + clients.ca_file.read_bytes())
    server = await serve_fake(
        make_server, tls_cert=cert, tls_key=key, tls_client_ca=clients.ca_file
    )
    # the certificate's subject is the identity: in the log lines and a metrics label
    call_records = await streamed_with(clients.client("alice"), server, pki, caplog)
    assert call_records and all(r.client == "alice" for r in call_records)  # type: ignore[attr-defined]
    assert sample(server, "asr_client_streams_total", client="alice") == 1

    # no client certificate, or one from another CA: the handshake fails
    mallory_cert, mallory_key = Pki(pki.folder / "rogue", "rogue-ca").client("mallory")
    for options in (
        tls_client(server.port, pki, connect_timeout_s=REFUSED_WITHIN_S),
        tls_client(
            server.port,
            pki,
            cert_file=mallory_cert,
            key_file=mallory_key,
            connect_timeout_s=REFUSED_WITHIN_S,
        ),
    ):
        async with AsrClient(options) as client:
            with pytest.raises(TimeoutError):
                await client.wait_ready()
    assert sample(server, "asr_client_streams_total", client="mallory") is None


async def test_a_certificate_name_with_a_line_break_writes_no_log_line_of_its_own(
    make_server, pki, caplog
) -> None:  # type: ignore[no-untyped-def]
    """The certificate's subject is in every log line of its calls: a CN holding a line
    break wrote a forged line of its own into the server's log."""
    cert, key = pki.server()
    clients = Pki(pki.folder / "clients", "client-ca")
    server = await serve_fake(
        make_server, tls_cert=cert, tls_key=key, tls_client_ca=clients.ca_file
    )
    forged = "m]\n2030-01-01 00:00:00,000 ERROR asr_server [- -] forged\r\x1b[2K"
    pair = clients.issue("forger", "forger.clients.test", common_name=forged)
    caplog.handler.setFormatter(logging.Formatter(FORMAT))
    call_records = await streamed_with(pair, server, pki, caplog)
    lines = caplog.text.splitlines()
    assert lines and not [line for line in lines if "forged" in line and "[s" not in line]
    escaped = "m]\\n2030-01-01 00:00:00,000 ERROR asr_server [- -] forged\\r\\x1b[2K"
    assert call_records and all(r.client == escaped for r in call_records)  # type: ignore[attr-defined]


async def streamed_with(
    client_pair: tuple[Path, Path], server, pki: Pki, caplog
) -> list[logging.LogRecord]:  # type: ignore[no-untyped-def]
    """Stream speech with the client certificate and key ``client_pair``: the log records
    of the call (its final checked)."""
    cert, key = client_pair
    caplog.handler.addFilter(StreamIdFilter())
    with caplog.at_level(logging.INFO):
        received = await stream_audio(
            tls_client(server.port, pki, cert_file=cert, key_file=key),
            speech_pcm(),
            16_000,
            speed=None,
        )
    assert final_text(received) == EXPECTED
    return [r for r in caplog.records if getattr(r, "stream_id", "-") != "-"]


@pytest.mark.parametrize("kind", ["P-384", "Ed25519", "P-521"])
async def test_a_client_key_no_grpc_client_can_sign_with_is_told_before_connecting(
    make_server, pki, tmp_path, kind
) -> None:  # type: ignore[no-untyped-def]
    """A client certificate with an Ed25519 or P-521 key: the handshake failed and the
    client said only that the server did not answer. It is told before any connection; a
    P-384 key, the largest that works, streams."""
    cert, key = pki.server()
    client_cert, client_key = key_kind_pair(tmp_path, kind)  # self-signed: its own CA
    server = await serve_fake(make_server, tls_cert=cert, tls_key=key, tls_client_ca=client_cert)
    options = tls_client(server.port, pki, cert_file=client_cert, key_file=client_key)
    if kind == "P-384":
        received = await stream_audio(options, speech_pcm(), 16_000, speed=None)
        assert final_text(received) == EXPECTED
        return
    named = "ECDSA P-521" if kind == "P-521" else kind
    with pytest.raises(ConnectionConfigError) as err:
        await stream_audio(options, speech_pcm(), 16_000, speed=None)
    assert str(err.value) == (
        f"the client certificate {client_cert} has an {named} key, which gRPC's TLS cannot"
        " complete a handshake with: use an RSA, ECDSA P-256 or P-384 key"
    )


# -- tokens -------------------------------------------------------------------------------


async def test_tokens_refuse_before_reading_and_admit_with_a_name(make_server, pki) -> None:  # type: ignore[no-untyped-def]
    cert, key = pki.server()
    tokens_path, tokens = token_file(pki.folder, "alice", "bob")
    server = await serve_fake(make_server, tls_cert=cert, tls_key=key, auth_tokens=tokens_path)

    # no token: refused without sending (or the server reading) anything at all
    assert await call_status(tls_client(server.port, pki), config=False) == (
        grpc.StatusCode.UNAUTHENTICATED
    )
    async with AsrClient(tls_client(server.port, pki)) as client:
        with pytest.raises(StreamClosedError) as err:
            async with client.stream(audio_config()) as stream:
                async for _ in stream:
                    pass
    assert "authorization: Bearer" in err.value.details
    wrong = tls_client(server.port, pki, token=tokens["alice"] + "x")
    with pytest.raises(StreamClosedError) as err:
        await stream_audio(wrong, speech_pcm(), 16_000, speed=None)
    assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert err.value.details == "invalid token"
    async with AsrClient(wrong) as client:  # the unary call is guarded the same way
        with pytest.raises(StreamClosedError) as err:
            await client.recognize(speech_pcm().tobytes(), audio_config())
    assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert sample(server, "asr_auth_failures_total", reason="missing_token") == 2
    assert sample(server, "asr_auth_failures_total", reason="wrong_token") == 2
    assert sample(server, "asr_audio_received_seconds_total") == 0
    assert sample(server, "asr_client_streams_total", client="alice") is None

    good = tls_client(server.port, pki, token=tokens["alice"])
    received = await stream_audio(good, speech_pcm(), 16_000, speed=None)
    assert final_text(received) == EXPECTED
    assert sample(server, "asr_client_streams_total", client="alice") == 1


async def test_a_token_that_is_not_utf8_is_refused_and_never_logged(
    make_server, tmp_path, caplog
) -> None:  # type: ignore[no-untyped-def]
    """grpc logged such a header's raw value (a mistyped token) at ERROR with a
    traceback, two or three times per call."""
    from asr_server.log import quiet_grpc_records
    from tests.rapid_reset import status_with_raw_header

    quiet_grpc_records()  # as configure_logging does in the server
    tokens_path, _ = token_file(tmp_path, "alice")
    server = await serve_fake(make_server, auth_tokens=tokens_path)
    with caplog.at_level(logging.INFO):
        status = await asyncio.to_thread(
            status_with_raw_header, server.port, b"authorization", b"Bearer s3cr\xe9t-\xff"
        )
    assert status == str(grpc.StatusCode.UNAUTHENTICATED.value[0])
    assert sample(server, "asr_auth_failures_total", reason="wrong_token") == 1
    assert "refused a call from 127.0.0.1: invalid token" in caplog.text
    assert "s3cr" not in caplog.text and "Invalid encoding" not in caplog.text, caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def test_token_file_is_reloaded_and_a_bad_one_keeps_the_old(make_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    tokens_path, tokens = token_file(tmp_path, "alice")
    server = await serve_fake(make_server, auth_tokens=tokens_path)
    port = server.port

    def as_(token: str) -> ConnectionOptions:
        return ConnectionOptions(f"127.0.0.1:{port}", token=token)

    carol, carol_line = new_token("carol")
    assert await call_status(as_(carol)) == grpc.StatusCode.UNAUTHENTICATED
    tokens_path.write_text(tokens_path.read_text() + carol_line + "\n")
    assert server.credentials.tokens is not None
    assert server.credentials.tokens.reload()
    assert final_text(await stream_audio(as_(carol), speech_pcm(), 16_000, speed=None))

    tokens_path.write_text("carol:not-a-hash\n")  # broken: alice and carol keep working
    assert not server.credentials.tokens.reload()
    assert final_text(await stream_audio(as_(tokens["alice"]), speech_pcm(), 16_000, speed=None))

    tokens_path.write_text(f"alice:{hash_token(tokens['alice'])}\n")  # carol revoked
    assert server.credentials.tokens.reload()
    assert await call_status(as_(carol)) == grpc.StatusCode.UNAUTHENTICATED
    assert sample(server, "asr_credential_reloads_total", file="tokens", outcome="failed") == 1


async def test_a_revoked_token_ends_its_open_calls_and_no_others(  # type: ignore[no-untyped-def]
    make_server, tmp_path, caplog
) -> None:
    """Deleting a client's line ended only its new calls: an open stream (up to four
    hours) and a health Watch ran on. Now every open call of the revoked token ends with
    UNAUTHENTICATED; another client's stream goes on to its final, and so does a stream
    made with the new token a client's line was given."""
    caplog.set_level("INFO", logger="asr_server.transport.servicer")
    tokens_path, tokens = token_file(tmp_path, "alice", "bob")
    server = await serve_fake(make_server, auth_tokens=tokens_path)

    def as_(name: str) -> ConnectionOptions:
        return ConnectionOptions(f"127.0.0.1:{server.port}", token=tokens[name])

    pcm = speech_pcm()
    async with (
        AsrClient(as_("alice")) as alice,
        AsrClient(as_("bob")) as bob,
        grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        watch = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=""),
            metadata=(("authorization", f"Bearer {tokens['alice']}"),),
        )
        await watch.read()  # its first status: the call is open
        alices = await alice.stream(audio_config()).open()
        bobs = await bob.stream(audio_config()).open()
        await alices.send_audio(pcm[:8000].tobytes())
        await bobs.send_audio(pcm[:8000].tobytes())
        await eventually(lambda: server.servicer.active == 2)

        tokens_path.write_text(f"bob:{hash_token(tokens['bob'])}\n")  # alice revoked
        assert server.credentials.tokens is not None
        assert await asyncio.to_thread(server.credentials.tokens.reload)  # as SIGHUP does

        with pytest.raises(StreamClosedError) as err:
            async for _ in alices:
                pass
        assert (err.value.code, err.value.details) == (
            grpc.StatusCode.UNAUTHENTICATED,
            "token revoked",
        )
        with pytest.raises(grpc.aio.AioRpcError) as watch_err:
            while True:
                await watch.read()
        assert watch_err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        await eventually(lambda: server.servicer.active == 1)

        await bobs.send_audio(pcm[8000:].tobytes())
        await bobs.end()
        finals = [e.result.text async for e in bobs if e.result.is_final]
        assert finals == [EXPECTED]

        # bob's line gets a new token: his old token's stream ends, and a stream with the
        # new one goes on (the server looks at the file every second, and when a call
        # presents a token, at most once a second)
        old_stream = await bob.stream(audio_config()).open()
        await old_stream.send_audio(pcm[:8000].tobytes())
        await eventually(lambda: server.servicer.active == 1)
        tokens["bob"], line = new_token("bob")
        tokens_path.write_text(line + "\n")
        os.utime(tokens_path, ns=(1, 1))  # a distinct stamp even on a coarse clock
        await asyncio.sleep(1.1)
        async with AsrClient(as_("bob")) as new_bob:
            new_stream = await new_bob.stream(audio_config()).open()
            await new_stream.send_audio(pcm[:8000].tobytes())
            with pytest.raises(StreamClosedError) as err:
                async for _ in old_stream:
                    pass
            assert err.value.details == "token revoked"
            await new_stream.send_audio(pcm[8000:].tobytes())
            await new_stream.end()
            finals = [e.result.text async for e in new_stream if e.result.is_final]
        assert finals == [EXPECTED]
    assert await call_status(as_("alice")) == grpc.StatusCode.UNAUTHENTICATED
    await eventually(lambda: server.servicer.active == 0)
    # counted as what they were told, not as streams their clients left, and as errors
    # (the dashboard's panels and the stream-error alert read those), each logged so
    assert sample(server, "asr_streams_total", code="UNAUTHENTICATED") == 2
    assert sample(server, "asr_streams_total", code="CANCELLED") == 0
    assert sample(server, "asr_stream_errors_total", code="UNAUTHENTICATED") == 2
    ended = "UNAUTHENTICATED: token revoked"
    revoked = [r for r in caplog.records if r.getMessage().endswith(ended)]
    assert [r.getMessage().split()[1] for r in revoked] == ["s1", "s3"], revoked


async def test_an_edit_revokes_open_streams_on_a_quiet_server(make_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The file was looked at only when a call presented a token: a revoked client's open
    stream ran on (up to four hours) until somebody else called. Now no other call is
    made, and the stream ends within seconds of the edit."""
    tokens_path, tokens = token_file(tmp_path, "alice", "bob")
    server = await serve_fake(make_server, auth_tokens=tokens_path)
    pcm = speech_pcm()
    async with AsrClient(
        ConnectionOptions(f"127.0.0.1:{server.port}", token=tokens["alice"])
    ) as alice:
        stream = await alice.stream(audio_config()).open()
        await stream.send_audio(pcm[:8000].tobytes())
        await eventually(lambda: server.servicer.active == 1)
        tokens_path.write_text(f"bob:{hash_token(tokens['bob'])}\n")  # alice revoked
        os.utime(tokens_path, ns=(1, 1))  # a distinct stamp even on a coarse clock
        with pytest.raises(StreamClosedError) as err:
            async with asyncio.timeout(5):
                async for _ in stream:
                    pass
        assert (err.value.code, err.value.details) == (
            grpc.StatusCode.UNAUTHENTICATED,
            "token revoked",
        )


async def test_health_stays_open_and_reflection_needs_a_token_or_is_off(  # type: ignore[no-untyped-def]
    make_server, tmp_path
) -> None:
    tokens_path, tokens = token_file(tmp_path, "ops")
    with_reflection = await serve_fake(make_server, auth_tokens=tokens_path)
    without = await serve_fake(make_server, auth_tokens=tokens_path, reflection=False)
    listing = reflection_pb2.ServerReflectionRequest(list_services="")

    async def reflect(port: int, token: str | None) -> grpc.StatusCode:
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
                iter([listing]), metadata=metadata
            )
            try:
                async for _ in call:
                    pass
            except grpc.aio.AioRpcError as exc:
                return exc.code()
            return grpc.StatusCode.OK

    for server in (with_reflection, without):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="asr.v1.Recognizer")
            )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    assert await reflect(with_reflection.port, None) == grpc.StatusCode.UNAUTHENTICATED
    assert await reflect(with_reflection.port, tokens["ops"]) == grpc.StatusCode.OK
    assert await reflect(without.port, tokens["ops"]) == grpc.StatusCode.UNIMPLEMENTED


# -- quotas and timeouts ------------------------------------------------------------------


async def test_per_client_limit_names_the_client_and_spares_others(make_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    tokens_path, tokens = token_file(tmp_path, "alice", "bob")
    server = await serve_fake(
        make_server, auth_tokens=tokens_path, max_streams_per_client=2, max_streams=10
    )
    alice = ConnectionOptions(f"127.0.0.1:{server.port}", token=tokens["alice"])
    bob = ConnectionOptions(f"127.0.0.1:{server.port}", token=tokens["bob"])
    async with AsrClient(alice, retry=False) as client:  # count one refusal, not 5 attempts
        streams = [await client.stream(audio_config()).open() for _ in range(2)]
        await eventually(lambda: server.servicer.active == 2)
        with pytest.raises(StreamClosedError) as err:
            async with client.stream(audio_config()) as third:
                async for _ in third:
                    pass
        assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "client alice is at its limit of 2" in err.value.details
        # another client is not affected
        assert final_text(await stream_audio(bob, speech_pcm(), 16_000, speed=None)) == EXPECTED
        for stream in streams:
            stream.cancel()
    await eventually(lambda: server.servicer.active == 0)
    assert sample(server, "asr_refused_streams_total", reason="client_limit") == 1
    assert sample(server, "asr_client_active_streams", client="alice") == 0


async def test_an_ipv6_caller_is_named_by_its_address(make_server) -> None:  # type: ignore[no-untyped-def]
    """grpc reports IPv6 peers percent-encoded (``ipv6:%5B::1%5D:PORT``)."""
    try:
        server = await serve_fake(make_server, host="::1", max_streams_per_client=1)
    except Exception as exc:  # no IPv6 loopback here
        pytest.skip(f"cannot serve on ::1: {exc}")
    async with AsrClient(f"[::1]:{server.port}", retry=False, resume=None) as client:
        first = await client.stream(audio_config()).open()
        await eventually(lambda: server.servicer.active == 1)
        with pytest.raises(StreamClosedError) as err:
            async with client.stream(audio_config()) as second:
                async for _ in second:
                    pass
        first.cancel()
    assert "client ip:::1 is at its limit of 1" in err.value.details


async def test_streams_without_a_config_cannot_lock_out_a_real_caller(make_server) -> None:  # type: ignore[no-untyped-def]
    """8 connections that open a stream and never send a config, under --max-streams 8."""
    server = await serve_fake(make_server, max_streams=8, config_timeout_s=1.0)
    options = ConnectionOptions(f"127.0.0.1:{server.port}")
    squatters = [AsrClient(options) for _ in range(8)]
    calls = [client.stream(audio_config()) for client in squatters]
    try:
        # each squatter's call reaches the server (a read starts the RPC) and sends nothing
        readers = [asyncio.create_task(status_of(call)) for call in calls]
        await eventually(lambda: server.servicer.admission.pending == 8)
        # a legitimate stream is served at once: seats go to configured streams only
        received = await stream_audio(server.port, speech_pcm(), 16_000, speed=None)
        assert final_text(received) == EXPECTED
        assert server.servicer.admission.pending == 8
        # and the squatters are ended by the config timeout with a clear status
        statuses = await asyncio.wait_for(asyncio.gather(*readers), 10)
    finally:
        for client in squatters:
            await client.close()
    assert {code for code, _ in statuses} == {grpc.StatusCode.DEADLINE_EXCEEDED}
    assert all("no config within 1 s" in details for _, details in statuses)
    assert sample(server, "asr_stream_timeouts_total", kind="config") == 8
    assert server.servicer.active == 0


async def test_a_recognize_call_that_never_sends_its_request_is_pending_and_timed_out(
    make_server,
) -> None:  # type: ignore[no-untyped-def]
    """Recognize reads its one message once admitted: a call that sends nothing holds a
    pending slot (bounded, never a seat) until the idle timeout ends it."""
    server = await serve_fake(
        make_server, max_pending_streams=2, max_pending_streams_per_client=2, idle_timeout_s=1.0
    )
    never = asyncio.Event()

    async def nothing():  # type: ignore[no-untyped-def]
        await never.wait()
        yield b""  # pragma: no cover

    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        method = channel.stream_unary(
            "/asr.v1.Recognizer/Recognize", request_serializer=None, response_deserializer=None
        )
        silent = [method(nothing()) for _ in range(2)]
        await eventually(lambda: server.servicer.admission.pending == 2)
        # the pending limit holds for them as for streams without a config
        refused = AsrClient(f"127.0.0.1:{server.port}", retry=False, resume=None)
        try:
            code, details = await status_of(refused.stream(audio_config()))
        finally:
            await refused.close()
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        for call in silent:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await asyncio.wait_for(call, 10)
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "no RecognizeRequest within 1 s" in (err.value.details() or "")
        never.set()
    assert sample(server, "asr_stream_timeouts_total", kind="request") == 2
    await eventually(lambda: server.servicer.active == 0)


async def test_pending_streams_are_bounded(make_server) -> None:  # type: ignore[no-untyped-def]
    # one client may fill the whole pool here: the pool's own limit is under test
    server = await serve_fake(
        make_server, max_pending_streams=3, max_pending_streams_per_client=3, config_timeout_s=30
    )
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        calls = [client.stream(audio_config()) for _ in range(3)]
        readers = [asyncio.create_task(status_of(call)) for call in calls]
        await eventually(lambda: server.servicer.admission.pending == 3)
        code, details = await status_of(client.stream(audio_config()))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "waiting to send their config" in details
        for call in calls:
            call.cancel()
        await asyncio.gather(*readers, return_exceptions=True)  # cancelled by us
    await eventually(lambda: server.servicer.active == 0)


async def test_an_idle_stream_is_ended_but_silence_keeps_one_alive(make_server) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server, idle_timeout_s=0.5)
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        idle = await client.stream(audio_config()).open()
        code, details = await asyncio.wait_for(status_of(idle), 5)
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "no message for 0.5 s" in details

        # 1.5 s of silence in 0.1 s messages, 0.1 s apart: three idle timeouts long
        async with client.stream(audio_config()) as talking:
            for _ in range(15):
                await talking.send_audio(bytes(3200))
                await asyncio.sleep(0.1)
            await talking.send_audio(speech_pcm().tobytes())
            await talking.end()
            texts = [e.result.text async for e in talking if e.result.is_final]
    assert texts == [EXPECTED]
    assert sample(server, "asr_stream_timeouts_total", kind="idle") == 1


async def test_keepalives_hold_a_stream_through_a_pause_and_add_no_audio(make_server) -> None:  # type: ignore[no-untyped-def]
    server = await serve_fake(make_server, idle_timeout_s=0.5)
    async with AsrClient(f"127.0.0.1:{server.port}") as client:
        async with client.stream(audio_config()) as paused:
            await paused.send_audio(speech_pcm().tobytes())
            for _ in range(15):  # 1.5 s without audio: three idle timeouts long
                await paused.keep_alive()
                await asyncio.sleep(0.1)
            await paused.send_audio(speech_pcm().tobytes())
            await paused.end()
            finals = [e.result async for e in paused if e.result.is_final]
    assert [f.text for f in finals] == [EXPECTED, EXPECTED]
    seconds = len(speech_pcm()) / 16_000
    # right after the first (the detector starts a little before the onset): no pause added
    assert finals[1].start_s == pytest.approx(seconds, abs=0.25)
