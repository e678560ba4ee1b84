"""Real certificates made at test time (trustme): a CA, server and client certificates."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme

SERVER_NAME = "localhost"  # the name clients check; the certificate also holds 127.0.0.1


@dataclass
class Pki:
    """One certificate authority whose files live in ``folder``."""

    folder: Path
    name: str = "ca"

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.ca = trustme.CA()
        self.ca_file = self.folder / f"{self.name}.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))

    def issue(
        self, stem: str, *identities: str, common_name: str | None = None
    ) -> tuple[Path, Path]:
        """(certificate chain, private key) files for ``identities``."""
        leaf = self.ca.issue_cert(*identities, common_name=common_name)
        cert, key = self.folder / f"{stem}.crt", self.folder / f"{stem}.key"
        cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
        key.write_bytes(leaf.private_key_pem.bytes())
        return cert, key

    def server(self, stem: str = "server") -> tuple[Path, Path]:
        return self.issue(stem, SERVER_NAME, "127.0.0.1")

    def client(self, name: str) -> tuple[Path, Path]:
        return self.issue(f"client-{name}", f"{name}.clients.test", common_name=name)


def secp256k1_pair(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate and key on secp256k1: OpenSSL takes the pair, gRPC's
    BoringSSL does not (it takes RSA, ECDSA P-256/P-384/P-521 and Ed25519 keys)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256K1())
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SERVER_NAME)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "secp256k1.crt", folder / "secp256k1.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path
