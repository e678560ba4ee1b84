"""Reading and checking the TLS files (asr_server/transport/tls.py): every file that cannot
be used is a CertificateError naming it, at start-up and on reload."""

from __future__ import annotations

import logging
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
