"""The client's TLS files are checked when its channel is made: grpc takes any bytes and
fails only in the handshake, where the reason reaches its log and the command said only
"no answer within 10 s"."""

from __future__ import annotations

from pathlib import Path

import pytest

from asr_client.connection import ConnectionConfigError, ConnectionOptions
from tests.pki import Pki


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path / "pki")


def test_good_files_make_credentials(pki: Pki) -> None:
    cert, key = pki.client("alice")
    options = ConnectionOptions("localhost:1", ca_file=pki.ca_file, cert_file=cert, key_file=key)
    assert options.credentials() is not None


def test_the_error_is_the_packages_own(tmp_path: Path) -> None:
    """What AsrClient raises for its connection settings can be caught by its public name
    (it was importable only from asr_client.connection)."""
    import asr_client

    (tmp_path / "empty.pem").write_text("")
    with pytest.raises(asr_client.ConnectionConfigError, match="holds no PEM"):
        asr_client.AsrClient(ConnectionOptions("localhost:1", ca_file=tmp_path / "empty.pem"))


def test_a_ca_bundle_that_is_no_pem_is_told(pki: Pki, tmp_path: Path) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text("not a certificate\n")
    with pytest.raises(ConnectionConfigError, match=f"the CA bundle {bundle} holds no PEM"):
        ConnectionOptions("localhost:1", ca_file=bundle).credentials()


def test_a_key_that_is_not_the_certificates_is_told(pki: Pki) -> None:
    cert, _ = pki.client("alice")
    _, other_key = pki.client("bob")
    with pytest.raises(ConnectionConfigError, match="are not a PEM certificate and its private"):
        ConnectionOptions(
            "localhost:1", ca_file=pki.ca_file, cert_file=cert, key_file=other_key
        ).credentials()
