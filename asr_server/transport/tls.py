"""TLS and mTLS server credentials whose certificate files can be replaced while serving.

grpc's dynamic server credentials ask a fetcher for the certificate configuration at every
new TLS handshake. The fetcher here answers from memory: it hands over a configuration only
after ``reload()`` (on SIGHUP) or a change of the files (time, size or inode) has produced one
that parsed and whose key matches its certificate. A missing or bad file on reload therefore
keeps the old credentials (and is logged once per change), and open connections are never
touched: only new handshakes see a new certificate.
"""

from __future__ import annotations

import logging
import os
import re
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc

from asr_server.transport.cert_keys import GRPC_UNUSABLE, leaf_key_kind
from asr_server.transport.file_stamp import FileStamp, file_stamp, stamp_or_missing

logger = logging.getLogger(__name__)


class CertificateError(ValueError):
    """A certificate, key or CA file that cannot be used; the message names the file."""


@dataclass(frozen=True)
class CertificateFiles:
    cert: Path
    key: Path
    client_ca: Path | None = None  # set: clients must present a certificate it signed

    def named(self) -> tuple[tuple[str, Path], ...]:
        """(what the file is, its path) for each file, as error messages name them."""
        named = (("certificate", self.cert), ("private key", self.key))
        return named + ((("client CA", self.client_ca),) if self.client_ca else ())


_Stamp = tuple[FileStamp, ...]


@dataclass(frozen=True)
class _Loaded:
    cert: bytes
    key: bytes
    client_ca: bytes | None
    stamp: _Stamp  # the files' stamps before they were read


def load_certificates(files: CertificateFiles) -> _Loaded:
    """Read and check the files; raises CertificateError saying which file is wrong."""
    stamp = _stamp(files)
    cert = _read(files.cert, "certificate")
    key = _read(files.key, "private key")
    client_ca = _read(files.client_ca, "client CA") if files.client_ca else None
    _check_pair(cert, key, files)
    if files.client_ca is not None and client_ca is not None:
        client_ca = _client_ca_certificates(client_ca, files.client_ca)
    _check_clients_can_connect(cert, files)
    _check_grpc_takes(cert, key, client_ca, files)
    return _Loaded(cert, key, client_ca, stamp)


class ReloadingServerCredentials:
    """Server credentials for ``CertificateFiles``, re-read on ``reload()`` or a file change."""

    def __init__(
        self, files: CertificateFiles, *, on_reload: Callable[[bool], None] | None = None
    ) -> None:
        self.files = files
        self._on_reload = on_reload
        self._lock = threading.Lock()  # the fetcher runs on grpc's threads
        self._current = load_certificates(files)  # start-up: a bad file is fatal
        self._pending: _Loaded | None = None
        self._failed_stamp: _Stamp | None = None
        self.reloads = 0

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            _configuration(self._current),
            self._fetch,
            require_client_authentication=self.files.client_ca is not None,
        )

    def reload(self) -> bool:
        """Re-read the files now (SIGHUP); True if new credentials will be used."""
        with self._lock:
            return self._try_load(force=True)

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        with self._lock:
            self._try_load(force=False)
            pending, self._pending = self._pending, None
        return _configuration(pending) if pending is not None else None

    def _try_load(self, *, force: bool) -> bool:
        stamp = tuple(stamp_or_missing(path) for _, path in self.files.named())
        if not force and (stamp == self._current.stamp or stamp == self._failed_stamp):
            return False
        try:
            loaded = load_certificates(self.files)
        except (CertificateError, OSError) as exc:
            if force or stamp != self._failed_stamp:
                logger.error("TLS reload failed, keeping the current certificate: %s", exc)
            self._failed_stamp = stamp
            self._notify(False)
            return False
        self._current = self._pending = loaded
        self._failed_stamp = None
        self.reloads += 1
        self._notify(True)
        logger.info("TLS certificate reloaded from %s", self.files.cert)
        return True

    def _notify(self, ok: bool) -> None:
        if self._on_reload is not None:
            self._on_reload(ok)


def _configuration(loaded: _Loaded) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration(
        [(loaded.key, loaded.cert)], root_certificates=loaded.client_ca
    )


def _stamp(files: CertificateFiles) -> _Stamp:
    return tuple(_file_stamp(path, what) for what, path in files.named())


def _file_stamp(path: Path, what: str) -> FileStamp:
    try:
        return file_stamp(path)
    except OSError as exc:
        raise _unreadable(path, what, exc) from None


def _read(path: Path, what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise _unreadable(path, what, exc) from None
    if b"-----BEGIN" not in data:
        raise CertificateError(f"TLS {what} {path} is not PEM")
    return data


def _unreadable(path: Path, what: str, exc: OSError) -> CertificateError:
    """A file that is missing or may not be read: stat and read fail alike."""
    return CertificateError(f"cannot read the TLS {what} {path}: {exc.strerror}")


_PEM_CERTIFICATE = re.compile(rb"-----BEGIN ((?:X509 )?CERTIFICATE)-----.*?-----END \1-----", re.S)


def _client_ca_certificates(bundle: bytes, path: Path) -> bytes:
    """The bundle's certificates, checked, without the text around them.

    A bundle may carry each certificate's decoded text (``openssl x509 -text``), in UTF-8
    where names are not ASCII. OpenSSL skips it, but ``cadata`` takes ASCII only; the
    certificates alone are checked, and grpc gets what was checked.
    """
    certificates = b"\n".join(m.group(0) for m in _PEM_CERTIFICATE.finditer(bundle))
    try:
        if not certificates:
            raise ValueError("no certificate in it")
        ssl.create_default_context(cadata=certificates.decode("ascii"))
    except (ssl.SSLError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise CertificateError(f"client CA {path} is not a PEM bundle: {exc}") from None
    return certificates + b"\n"


def _check_pair(cert: bytes, key: bytes, files: CertificateFiles) -> None:
    """Let OpenSSL parse both and check the key belongs to the certificate.

    ``load_cert_chain`` takes paths only, and must check the bytes just read (which grpc
    gets), not whatever the paths hold by now. They go through anonymous files in memory,
    never through a file on disk: a temporary file put the key on the node's disk (a pod's
    /tmp is an emptyDir there, while the key came from a tmpfs Secret), and a killed
    process left it behind.
    """
    try:
        if _memory_files_work():
            with _memory_file(cert) as cert_path, _memory_file(key) as key_path:
                _load_pair(cert_path, key_path)
        else:
            _check_pair_in_place(cert, key, files)
    except _EncryptedKey:
        raise CertificateError(
            f"TLS private key {files.key} is encrypted (pass-phrase protected keys are not "
            "supported): decrypt it, e.g. openssl pkey -in KEY -out PLAIN_KEY"
        ) from None
    except ssl.SSLError as exc:
        raise CertificateError(
            f"TLS certificate {files.cert} and key {files.key} do not form a usable pair "
            f"({exc.reason or exc})"
        ) from None


def _check_clients_can_connect(cert: bytes, files: CertificateFiles) -> None:
    """gRPC serves an Ed25519 or P-521 key (the probe below binds with it), but its C
    core's clients offer no signature algorithm for them: the server said it was ready, a
    rotation to such a key counted "ok", and every client then failed its handshake
    (NO_COMMON_SIGNATURE_ALGORITHMS in the server's log, "no answer" at the client)."""
    kind = leaf_key_kind(cert)
    if kind in GRPC_UNUSABLE:
        raise CertificateError(
            f"the TLS certificate {files.cert} has an {kind} key, which clients on gRPC's C "
            "core (asr-client, the bridge, Python's and C++'s grpc) cannot complete a "
            "handshake with: use an RSA, ECDSA P-256 or P-384 key"
        )


def _check_grpc_takes(
    cert: bytes, key: bytes, client_ca: bytes | None, files: CertificateFiles
) -> None:
    """Let gRPC's own TLS library build a server from the files: its BoringSSL takes
    fewer key types than the OpenSSL that checked the pair (no Brainpool curves, no
    secp256k1, no Ed448). At start-up the bind failed with no reason given; on a reload
    gRPC kept the old certificate while the reload was reported done. The probe binds
    an ephemeral loopback port for a few milliseconds and never starts serving."""
    from concurrent.futures import ThreadPoolExecutor

    credentials = grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )
    with ThreadPoolExecutor(1) as pool:
        probe = grpc.server(pool)
        try:
            taken = probe.add_secure_port("127.0.0.1:0", credentials) != 0
        except RuntimeError:  # "Failed to bind": the reason is only in grpc's log
            taken = False
        finally:
            probe.stop(None)
    if not taken:
        raise CertificateError(
            f"gRPC cannot use the TLS certificate {files.cert} and key {files.key}, which "
            "OpenSSL accepts: gRPC's TLS works with RSA, ECDSA P-256 and P-384 keys (its "
            "log line above says more)"
        )


def _load_pair(cert_path: str | Path, key_path: str | Path) -> None:
    ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(
        cert_path, key_path, password=_refuse_pass_phrase
    )


def _memory_files_work() -> bool:
    return hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")


@contextmanager
def _memory_file(data: bytes) -> Iterator[str]:
    """A path that reads as ``data``: a Linux memfd, which no directory names and which
    is gone once closed, opened again through /proc."""
    fd = os.memfd_create("asr-tls", os.MFD_CLOEXEC)
    try:
        with open(fd, "wb", closefd=False) as file:
            file.write(data)
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _check_pair_in_place(cert: bytes, key: bytes, files: CertificateFiles) -> None:
    """Without memory files (not Linux): OpenSSL reads the files themselves. A rotation may
    have replaced them since they were read, so the check holds for the bytes read only if
    the files still hold them afterwards; if not, a reload keeps the old credentials and
    takes the new files at the next check (their stamp has changed)."""
    _load_pair(files.cert, files.key)
    if _read(files.cert, "certificate") != cert or _read(files.key, "private key") != key:
        raise CertificateError(
            f"TLS certificate {files.cert} or key {files.key} changed while being checked"
        )


class _EncryptedKey(Exception):
    """OpenSSL asked for the key's pass-phrase."""


def _refuse_pass_phrase() -> bytes:
    # Without a callback OpenSSL prompts on the terminal: the start would hang there (or,
    # with no terminal, fail with OSError), and a reload would block every TLS handshake
    # while it holds the credentials' lock. There is no pass-phrase to give.
    raise _EncryptedKey
