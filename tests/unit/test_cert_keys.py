"""The key kind read from a certificate's DER, against certificates made by real tools."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme

from asr_server.transport.cert_keys import leaf_key_kind
from tests.pki import key_kind_pair


@pytest.mark.parametrize(
    ("key_type", "kind"), [(trustme.KeyType.RSA, "RSA"), (trustme.KeyType.ECDSA, "ECDSA P-256")]
)
def test_trustme_leaves_chains_first(key_type: trustme.KeyType, kind: str) -> None:
    leaf = trustme.CA(key_type=key_type).issue_cert("localhost", key_type=key_type)
    chain = b"".join(blob.bytes() for blob in leaf.cert_chain_pems)  # leaf, then its CA
    assert leaf_key_kind(chain) == kind


@pytest.mark.parametrize("kind", ["P-384", "P-521", "Ed25519", "secp256k1"])
def test_other_kinds(tmp_path: Path, kind: str) -> None:
    cert, _ = key_kind_pair(tmp_path, kind)
    assert leaf_key_kind(cert.read_bytes()) == (kind if kind == "Ed25519" else f"ECDSA {kind}")


@pytest.mark.parametrize("label", [b"X509 CERTIFICATE", b"TRUSTED CERTIFICATE"])
def test_older_labels_are_read_as_openssl_reads_them(tmp_path: Path, label: bytes) -> None:
    """An Ed25519 leaf under "X509 CERTIFICATE" was passed by (or, before its CA's
    certificate, read as the CA's RSA), and the server started with it."""
    leaf, _ = key_kind_pair(tmp_path, "Ed25519")
    relabelled = leaf.read_bytes().replace(b"CERTIFICATE", label)
    ca = trustme.CA(key_type=trustme.KeyType.RSA).cert_pem.bytes()
    assert leaf_key_kind(relabelled) == "Ed25519"
    assert leaf_key_kind(relabelled + ca) == "Ed25519"


def test_what_is_no_certificate_has_no_kind() -> None:
    assert leaf_key_kind(b"not PEM") is None
    assert leaf_key_kind(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----") is None
    truncated = b"-----BEGIN CERTIFICATE-----\nMIIBkTCB+6ADAgECAgEB\n-----END CERTIFICATE-----"
    assert leaf_key_kind(truncated) is None
