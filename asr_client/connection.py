"""How a client reaches a server: target, TLS (with an optional client certificate), token.

One object serves every caller (``AsrClient``, each ``asr-client`` command, the load tool,
the bridge, the benchmarks and the tests), so TLS and authentication are set up in one place.
The token travels as ``authorization: Bearer <token>`` call metadata, so it also works over a
plaintext channel to a TLS-terminating proxy; grpc's own access-token credentials would
refuse that.
"""

from __future__ import annotations

import argparse
import math
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

from asr_server.transport.cert_keys import GRPC_UNUSABLE, leaf_key_kind

DEFAULT_TARGET = "localhost:50051"
#: environment variable the commands read a token from when ``--token`` is not given
TOKEN_ENV = "ASR_TOKEN"


class ConnectionConfigError(ValueError):
    """A connection option that cannot work (unreadable file, half a key pair)."""


@dataclass(frozen=True)
class ConnectionOptions:
    target: str = DEFAULT_TARGET
    #: TLS to the server; implied by ``ca_file``, ``cert_file``, ``key_file`` or ``server_name``
    tls: bool = False
    #: PEM bundle of CAs to trust (default: the system's roots)
    ca_file: Path | None = None
    #: PEM client certificate and key, for servers that require mTLS
    cert_file: Path | None = None
    key_file: Path | None = None
    #: bearer token sent with every call
    token: str | None = None
    #: how long to wait for the server to answer before giving up
    connect_timeout_s: float = 10.0
    #: TLS name to check instead of the target's host (a proxy, an IP address)
    server_name: str | None = None

    @property
    def uses_tls(self) -> bool:
        # a TLS name alone means TLS too: it was dropped, and the token went in plaintext
        tls_only = (self.ca_file, self.cert_file, self.key_file, self.server_name)
        return self.tls or any(p is not None for p in tls_only)

    def credentials(self) -> grpc.ChannelCredentials | None:
        """Channel credentials, or None for plaintext."""
        if not self.uses_tls:
            return None
        if (self.cert_file is None) != (self.key_file is None):
            raise ConnectionConfigError("a client certificate needs both --cert and --key")
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file, "CA bundle"),
            private_key=_read(self.key_file, "client key"),
            certificate_chain=_read(self.cert_file, "client certificate"),
        )
        self._check_pem()
        return credentials

    def _check_pem(self) -> None:
        """grpc takes any bytes here and fails only in the handshake, where its reason
        reaches its log and the caller sees a connection that never becomes ready: a CA
        bundle that is no PEM, or a key that is not the certificate's, is told now."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        if self.ca_file is not None:
            try:
                context.load_verify_locations(cafile=str(self.ca_file))
            except ssl.SSLError as exc:
                raise ConnectionConfigError(
                    f"the CA bundle {self.ca_file} holds no PEM certificate ({exc.reason})"
                ) from None
        if self.cert_file is not None and self.key_file is not None:
            try:
                context.load_cert_chain(str(self.cert_file), str(self.key_file))
            except ssl.SSLError as exc:
                raise ConnectionConfigError(
                    f"the client certificate {self.cert_file} and key {self.key_file} are not "
                    f"a PEM certificate and its private key ({exc.reason})"
                ) from None
            # OpenSSL takes these kinds; gRPC's TLS then offers no signature algorithm
            # for them and the handshake fails (NO_COMMON_SIGNATURE_ALGORITHMS)
            kind = leaf_key_kind(self.cert_file.read_bytes())
            if kind in GRPC_UNUSABLE:
                raise ConnectionConfigError(
                    f"the client certificate {self.cert_file} has an {kind} key, which "
                    "gRPC's TLS cannot complete a handshake with: use an RSA, ECDSA P-256 "
                    "or P-384 key"
                )

    def call_metadata(self) -> tuple[tuple[str, str], ...]:
        """The token's header. Whitespace around it (a token read from a file ends in a
        newline) is dropped; one that a header cannot carry is refused here, readably:
        grpc said only "Invalid metadata", or worse, on each call."""
        token = (self.token or "").strip()
        if not token:
            return ()
        if not all(" " <= c <= "~" for c in token):
            raise ConnectionConfigError(
                "the token holds a character a header cannot carry (a line break, a "
                "control or a non-ASCII character)"
            )
        return (("authorization", f"Bearer {token}"),)

    def channel(self, options: list[tuple[str, object]]) -> grpc.aio.Channel:
        """A new channel to ``target`` with these channel arguments."""
        if not address_in(self.target).strip():
            # grpc takes it, never connects, and its channel's shutdown then hangs
            raise ConnectionConfigError(
                f"no server address in {self.target!r}: give HOST:PORT (--server)"
            )
        options = list(options)
        if self.server_name:
            options.append(("grpc.ssl_target_name_override", self.server_name))
        credentials = self.credentials()
        if credentials is None:
            return grpc.aio.insecure_channel(self.target, options=options)
        return grpc.aio.secure_channel(self.target, credentials, options=options)

    def describe(self) -> str:
        """For messages: ``tls://host:port`` or ``host:port``."""
        return f"tls://{self.target}" if self.uses_tls else self.target


#: target schemes grpc resolves itself; any other target is a DNS name (``dns:///target``)
_SCHEMES = ("dns", "ipv4", "ipv6", "unix", "unix-abstract", "vsock")


def address_in(target: str) -> str:
    """What ``target`` names past its scheme and authority (``dns://8.8.8.8/host:1``)."""
    scheme, colon, rest = target.partition(":")
    if not colon or scheme not in _SCHEMES:
        return target
    return rest[2:].partition("/")[2] if rest.startswith("//") else rest


def token_from_env(explicit: str | None) -> str | None:
    """``--token`` when given, else ``$ASR_TOKEN``; empty means none."""
    token = explicit if explicit is not None else os.environ.get(TOKEN_ENV)
    return token.strip() or None if token else None


def _read(path: Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConnectionConfigError(f"cannot read the {what} {path}: {exc.strerror}") from None


def add_connection_arguments(parser: argparse.ArgumentParser, *, default_target: str) -> None:
    """``--server --tls --ca --cert --key --token --connect-timeout`` on a command's parser."""
    g = parser.add_argument_group("connection")
    g.add_argument("--server", default=default_target, help=f"HOST:PORT (default {default_target})")
    g.add_argument("--tls", action="store_true", help="connect with TLS (system CAs by default)")
    g.add_argument("--ca", type=user_path, metavar="PEM", help="CA bundle to trust (implies --tls)")
    g.add_argument("--cert", type=user_path, metavar="PEM", help="client certificate for mTLS")
    g.add_argument("--key", type=user_path, metavar="PEM", help="client certificate's private key")
    g.add_argument("--token", metavar="TOKEN", help=f"bearer token (default: ${TOKEN_ENV}, if set)")
    g.add_argument(
        "--no-resume",
        dest="resume",
        action="store_false",
        help="fail when the connection breaks instead of resuming the stream on a new call",
    )
    g.add_argument(
        "--connect-timeout",
        type=positive_float,
        default=10.0,
        metavar="S",
        help="seconds to wait for the server to answer (default 10)",
    )


def connection_from_args(args: argparse.Namespace) -> ConnectionOptions:
    return ConnectionOptions(
        target=args.server,
        tls=args.tls,
        ca_file=args.ca,
        cert_file=args.cert,
        key_file=args.key,
        token=token_from_env(args.token),
        connect_timeout_s=args.connect_timeout,
    )


def user_path(text: str) -> Path:
    """argparse type: a path, with a leading ``~`` or ``~user`` expanded. A shell does that
    only for a separate word: not after ``--ca=``, nor in a systemd unit, a Kubernetes
    ``args:`` list or an env file, where ``~/ca.pem`` would be looked for in a folder named
    ``~``. An unknown ``~user`` stays as written, so the error that follows names it."""
    return Path(os.path.expanduser(text))


def optional_user_path(text: str) -> Path | None:
    """argparse type: ``user_path``, or None for an empty value, which a wrapper passing
    ``--save-transcript "$OUT"`` with OUT unset means as "none" (``Path("")`` is ".")."""
    return user_path(text) if text else None


def int_between(low: int, high: int, unit: str = "", *, or_zero: bool = False):  # type: ignore[no-untyped-def]
    """argparse type: a whole number from ``low`` to ``high`` (in ``unit``), or 0 if
    ``or_zero`` (a flag whose 0 means the server's default)."""
    unit = f" {unit}" if unit else ""
    zero = "0 or " if or_zero else ""

    def parse(text: str) -> int:
        # ArgumentTypeError, not int's ValueError: argparse would name this function
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not (low <= value <= high or (or_zero and value == 0)):
            raise argparse.ArgumentTypeError(f"must be {zero}{low} to {high}{unit}, got {text}")
        return value

    return parse


def _number(text: str) -> float:
    # ArgumentTypeError, not float's ValueError: argparse would name the type function
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def positive_float(text: str) -> float:
    """argparse type: a number greater than 0."""
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
    return value


def seconds_at_least(least: float):  # type: ignore[no-untyped-def]
    """argparse type: a finite number of seconds, at least ``least``."""

    def parse(text: str) -> float:
        value = _number(text)
        if not (math.isfinite(value) and value >= least):
            raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= {least:g}")
        return value

    return parse
