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
