"""Which kind of public key a PEM certificate holds, read from its DER (no crypto library).

gRPC's TLS (BoringSSL, with gRPC's default signature algorithms) serves a certificate whose
key no client on gRPC's C core (Python's, C++'s grpc: asr-client, the bridge) can verify a
handshake with: Ed25519 and ECDSA P-521. The server
builds and binds with it, and every client's handshake then fails with
NO_COMMON_SIGNATURE_ALGORITHMS. The key's kind is in the certificate's
SubjectPublicKeyInfo; this reads only that far into the certificate.
"""

from __future__ import annotations

import base64
import re

#: the first certificate, as OpenSSL and BoringSSL find it: also under the old "X509
#: CERTIFICATE" label, or OpenSSL's "TRUSTED CERTIFICATE" (its DER starts the same)
_PEM_CERTIFICATE = re.compile(
    rb"-----BEGIN ((?:X509 |TRUSTED )?CERTIFICATE)-----\s*(.+?)\s*-----END \1-----",
    re.DOTALL,
)
_SEQUENCE, _OID, _CONTEXT_0 = 0x30, 0x06, 0xA0

#: algorithm (and, for EC keys, curve) OIDs as DER content bytes
_KINDS = {
    bytes.fromhex("2a864886f70d010101"): "RSA",
    bytes.fromhex("2a864886f70d01010a"): "RSA-PSS",
    bytes.fromhex("2b6570"): "Ed25519",
    bytes.fromhex("2b6571"): "Ed448",
}
_EC_PUBLIC_KEY = bytes.fromhex("2a8648ce3d0201")
_CURVES = {
    bytes.fromhex("2a8648ce3d030107"): "ECDSA P-256",
    bytes.fromhex("2b81040022"): "ECDSA P-384",
    bytes.fromhex("2b81040023"): "ECDSA P-521",
    bytes.fromhex("2b8104000a"): "ECDSA secp256k1",
}

#: kinds gRPC serves and its C core's clients cannot complete a handshake with (grpcio 1.85);
#: secp256k1, Ed448 and Brainpool keys gRPC does not serve at all (tls._check_grpc_takes)
GRPC_UNUSABLE = frozenset({"Ed25519", "ECDSA P-521"})


def leaf_key_kind(pem: bytes) -> str | None:
    """The key kind of the first certificate in ``pem`` ("RSA", "ECDSA P-256", "Ed25519",
    ...), or None where it is not one of those named here or the DER cannot be read."""
    match = _PEM_CERTIFICATE.search(pem)
    if match is None:
        return None
    try:
        der = base64.b64decode(b"".join(match.group(2).split()), validate=True)
        return _spki_kind(der)
    except (ValueError, IndexError):
        return None


def _spki_kind(der: bytes) -> str | None:
    certificate = _content(der, 0, _SEQUENCE)
    tbs = _content(*certificate, _SEQUENCE)
    position = tbs[1]
    if tbs[0][position] == _CONTEXT_0:  # [0] version
        position = _next(tbs[0], position)
    for _ in range(5):  # serial number, signature algorithm, issuer, validity, subject
        position = _next(tbs[0], position)
    spki = _content(tbs[0], position, _SEQUENCE)
    algorithm = _content(*spki, _SEQUENCE)
    oid_at = algorithm[1]
    oid = _value(algorithm[0], oid_at, _OID)
    if oid == _EC_PUBLIC_KEY:
        curve_at = _next(algorithm[0], oid_at)
        return _CURVES.get(_value(algorithm[0], curve_at, _OID))
    return _KINDS.get(oid)


def _header(data: bytes, at: int) -> tuple[int, int, int]:
    """(tag, where the content starts, its length) of the DER element at ``at``."""
    tag, first = data[at], data[at + 1]
    if first < 0x80:
        return tag, at + 2, first
    count = first & 0x7F
    if not 1 <= count <= 4:
        raise ValueError("unsupported DER length")
    length = int.from_bytes(data[at + 2 : at + 2 + count], "big")
    return tag, at + 2 + count, length


def _content(data: bytes, at: int, tag: int) -> tuple[bytes, int]:
    """The element at ``at`` (of ``tag``) as (its content, 0), to read inside it."""
    found, start, length = _header(data, at)
    if found != tag or start + length > len(data):
        raise ValueError("unexpected DER element")
    return data[start : start + length], 0


def _value(data: bytes, at: int, tag: int) -> bytes:
    return _content(data, at, tag)[0]


def _next(data: bytes, at: int) -> int:
    _, start, length = _header(data, at)
    return start + length
