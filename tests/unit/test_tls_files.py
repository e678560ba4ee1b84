"""Reading and checking the TLS files (asr_server/transport/tls.py): every file that cannot
be used is a CertificateError naming it, at start-up and on reload."""

from __future__ import annotations

import logging
import os
import ssl
import tempfile
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from asr_server.transport.tls import (
    CertificateError,
    CertificateFiles,
    ReloadingServerCredentials,
    load_certificates,
)
from tests.pki import Pki


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path / "pki")


@pytest.mark.parametrize("missing", ["cert", "key", "client_ca"])
def test_a_missing_file_is_a_certificate_error_naming_it(
    pki: Pki, tmp_path: Path, missing: str
) -> None:
    cert, key = pki.server()
    files = {"cert": cert, "key": key, "client_ca": pki.ca_file}
    files[missing] = tmp_path / "nope.pem"
    with pytest.raises(CertificateError, match=f"cannot read the TLS .* {tmp_path}/nope.pem"):
        load_certificates(CertificateFiles(**files))


def encrypt_key(key: Path) -> None:
    """Protect the key with a pass-phrase, in place (as ``openssl pkey -aes256`` would)."""
    private = serialization.load_pem_private_key(key.read_bytes(), password=None)
    key.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )


def test_an_encrypted_key_is_refused_without_asking_for_its_pass_phrase(pki: Pki) -> None:
    # OpenSSL would prompt on the terminal: the start hung there, or without a terminal
    # failed with a traceback (OSError: Invalid argument)
    cert, key = pki.server()
    encrypt_key(key)
    with pytest.raises(CertificateError, match=f"private key {key} is encrypted"):
        load_certificates(CertificateFiles(cert, key))


def test_an_encrypted_key_on_reload_keeps_the_old_credentials(
    pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    cert, key = pki.server()
    credentials = ReloadingServerCredentials(CertificateFiles(cert, key))
    before = key.read_bytes()
    encrypt_key(key)
    with caplog.at_level(logging.ERROR, logger="asr_server.transport.tls"):
        assert not credentials.reload()
    assert f"private key {key} is encrypted (pass-phrase protected keys are not supported)" in (
        caplog.text
    )
    assert credentials._current.key == before


def test_the_pair_check_writes_no_key_to_disk(
    pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # /tmp of a pod is node disk (emptyDir): a key from a tmpfs Secret must not land there
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    cert, key = pki.server()
    handed: list[os.stat_result] = []
    load_cert_chain = ssl.SSLContext.load_cert_chain

    def spy(self: ssl.SSLContext, certfile: str, keyfile: str, password: object = None) -> None:
        handed.append(os.stat(keyfile))
        load_cert_chain(self, certfile, keyfile, password)  # type: ignore[arg-type]

    monkeypatch.setattr(ssl.SSLContext, "load_cert_chain", spy)
    load_certificates(CertificateFiles(cert, key))
    _, other_key = pki.server("other")
    with pytest.raises(CertificateError, match="do not form a usable pair"):
        load_certificates(CertificateFiles(cert, other_key))
    assert list(temp.iterdir()) == []
    for seen in handed:  # a file in memory that no directory names, or the key file itself
        assert seen.st_nlink == 0 or os.path.samestat(seen, os.stat(key)), seen


def test_without_memory_files_the_pair_is_checked_in_place(
    pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(os, "memfd_create")  # as on macOS
    cert, key = pki.server()
    load_certificates(CertificateFiles(cert, key))
    _, other_key = pki.server("other")
    with pytest.raises(CertificateError, match="do not form a usable pair"):
        load_certificates(CertificateFiles(cert, other_key))
    # a rotation between reading and checking: the check was not of the bytes read
    load_cert_chain = ssl.SSLContext.load_cert_chain

    def rotate_meanwhile(self: ssl.SSLContext, *args: object, **kwargs: object) -> None:
        load_cert_chain(self, *args, **kwargs)  # type: ignore[arg-type]
        pki.server()

    monkeypatch.setattr(ssl.SSLContext, "load_cert_chain", rotate_meanwhile)
    with pytest.raises(CertificateError, match="changed while being checked"):
        load_certificates(CertificateFiles(cert, key))


def test_a_client_ca_bundle_with_utf8_text_is_taken(pki: Pki, tmp_path: Path) -> None:
    # `openssl x509 -text` puts the decoded certificate, names in UTF-8, above its PEM
    cert, key = pki.server()
    bundle = tmp_path / "ca-with-text.pem"
    text = "Certificate:\n    Subject: O=Zürich Süd, CN=Ŝtreamasr Ĉlients\n"
    bundle.write_bytes(text.encode() + pki.ca_file.read_bytes())
    loaded = load_certificates(CertificateFiles(cert, key, bundle))
    assert loaded.client_ca is not None and pki.ca_file.read_bytes().strip() in loaded.client_ca


@pytest.mark.parametrize(
    "content",
    [
        b"Subject: O=Z\xc3\xbcrich\n",
        b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
        b"\xff\xfe-----BEGIN CERTIFICATE-----\n\xc3\xbc\n-----END CERTIFICATE-----\n",
    ],
    ids=["no-certificate", "not-a-certificate", "not-text"],
)
def test_a_client_ca_bundle_without_a_certificate_is_refused(
    pki: Pki, tmp_path: Path, content: bytes
) -> None:
    cert, key = pki.server()
    bundle = tmp_path / "ca.pem"
    bundle.write_bytes(content)
    with pytest.raises(CertificateError, match=f"client CA {bundle} is not"):
        load_certificates(CertificateFiles(cert, key, bundle))


@pytest.mark.parametrize("how", ["in place", "renamed over"])
def test_new_files_are_taken_though_their_time_stays(pki: Pki, tmp_path: Path, how: str) -> None:
    # on a file system whose timestamps are a second apart, writes within the same second
    # leave the modification time alone: a rewrite read half-way must be read again
    cert, key = pki.server()
    credentials = ReloadingServerCredentials(CertificateFiles(cert, key))
    new_cert, new_key = pki.server("new")
    mtime = os.stat(cert).st_mtime_ns + 1_000_000_000
    half_way = b"" if how == "in place" else b"-----BEGIN" + b"x" * (new_cert.stat().st_size - 10)
    for path, data in ((key, new_key.read_bytes()), (cert, half_way)):
        path.write_bytes(data)
        os.utime(path, ns=(mtime, mtime))
    assert credentials._fetch() is None  # refused: the old credentials stay
    if how == "in place":
        cert.write_bytes(new_cert.read_bytes())
    else:
        os.utime(new_cert, ns=(mtime, mtime))
        new_cert.replace(cert)
    os.utime(cert, ns=(mtime, mtime))
    assert credentials._fetch() is not None
    assert credentials.reloads == 1 and credentials._current.cert == cert.read_bytes()


@pytest.mark.parametrize("deleted", ["cert", "key"])
def test_a_deleted_file_is_a_failed_reload_once_and_read_when_back(
    pki: Pki, caplog: pytest.LogCaptureFixture, deleted: str
) -> None:
    cert, key = pki.server()
    outcomes: list[bool] = []
    credentials = ReloadingServerCredentials(CertificateFiles(cert, key), on_reload=outcomes.append)
    before = credentials._current
    path, what = (cert, "certificate") if deleted == "cert" else (key, "private key")
    path.unlink()
    with caplog.at_level(logging.ERROR, logger="asr_server.transport.tls"):
        for _ in range(3):  # one error and one failed reload, not one per handshake
            assert credentials._fetch() is None  # the current certificate stays
    assert outcomes == [False] and credentials._current is before
    assert caplog.text.count(f"cannot read the TLS {what} {path}") == 1
    new_cert, new_key = pki.server("new")
    cert.write_bytes(new_cert.read_bytes())
    key.write_bytes(new_key.read_bytes())
    assert credentials._fetch() is not None
    assert credentials._current.cert == new_cert.read_bytes()
    path.unlink()  # after a reload that was taken, too
    assert credentials._fetch() is None
    assert outcomes == [False, True, False]
