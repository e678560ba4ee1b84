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
    BoringSSL does not."""
    return key_kind_pair(folder, "secp256k1")


def key_kind_pair(folder: Path, kind: str) -> tuple[Path, Path]:
    """A self-signed certificate for SERVER_NAME and 127.0.0.1 and its key, of ``kind``:
    "secp256k1", "P-384", "P-521" or "Ed25519" (trustme makes only P-256 and RSA)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519
    from cryptography.x509.oid import NameOID

    curves = {"secp256k1": ec.SECP256K1(), "P-384": ec.SECP384R1(), "P-521": ec.SECP521R1()}
    key = ed25519.Ed25519PrivateKey.generate() if kind == "Ed25519" else None
    key = key or ec.generate_private_key(curves[kind])
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SERVER_NAME)])
    names = [x509.DNSName(SERVER_NAME), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, None if kind == "Ed25519" else hashes.SHA256())
    )
    cert_path, key_path = folder / f"{kind}.crt", folder / f"{kind}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path
