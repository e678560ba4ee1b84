"""Reading and checking the TLS files (asr_server/transport/tls.py): every file that cannot
be used is a CertificateError naming it, at start-up and on reload."""

from __future__ import annotations

from pathlib import Path

import pytest

from asr_server.transport.tls import CertificateError, CertificateFiles, load_certificates
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
