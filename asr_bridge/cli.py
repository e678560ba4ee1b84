"""``asr-bridge``: flags → BridgeConfig → serve until SIGINT/SIGTERM. No logic lives here."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING

from asr_client.connection import (
    ConnectionConfigError,
    ConnectionOptions,
    int_between,
    user_path,
)
from asr_server.log import LOG_LEVELS

if TYPE_CHECKING:
    from asr_bridge.app import BridgeConfig

# Browsers → bridge and bridge → server each have their own token: never the same variable.
TOKEN_ENV = "ASR_BRIDGE_TOKEN"  # what browsers must present to the bridge
SERVER_TOKEN_ENV = "ASR_BRIDGE_SERVER_TOKEN"  # what the bridge presents to the gRPC server
ENV_PREFIX = "ASR_BRIDGE_"


def _env(name: str) -> str | None:
    """``$ASR_BRIDGE_<name>``; empty counts as unset."""
    return os.environ.get(ENV_PREFIX + name) or None


def _env_flag(name: str) -> bool:
    return (_env(name) or "").strip().lower() in ("1", "true", "yes", "on")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"want a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="asr-bridge",
        description="Serve a web page and a WebSocket endpoint that stream browser microphones "
        "to a streamasr gRPC server, one gRPC stream per browser session. A flag that names an "
        "environment variable can be set by it instead (the flag wins).",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 for all)")
    p.add_argument(
        "--port",
        type=int_between(0, 65_535),
        default=8080,
        help="HTTP/WebSocket port (default 8080; 0: any free port)",
    )
    p.add_argument(
        "--ssl-certfile",
        type=user_path,
        help="serve HTTPS/WSS (browsers allow the microphone only on https or localhost); "
        "with --ssl-keyfile",
    )
    p.add_argument("--ssl-keyfile", type=user_path, help="the certificate's private key")
    p.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default="INFO",
        help=", ".join(LOG_LEVELS) + " (default INFO)",
    )

    b = p.add_argument_group("browsers → bridge")
    b.add_argument(
        "--token",
        default=_env("TOKEN"),
        help=f"the token BROWSERS must present to this bridge (${TOKEN_ENV}; unset = open)",
    )
    b.add_argument(
        "--allowed-origin",
        action="append",
        metavar="URL",
        help="a page origin allowed to open WebSockets, like https://app.example.org; "
        "repeatable; * = any (default: $ASR_BRIDGE_ALLOWED_ORIGINS, comma-separated, "
        "else only the bridge's own page)",
    )
    b.add_argument(
        "--no-resume",
        dest="resume",
        action="store_false",
        help="end a session when its gRPC stream breaks instead of resuming it on a new call",
    )
    b.add_argument(
        "--max-sessions",
        type=_positive_int,
        default=_env("MAX_SESSIONS") or "100",
        metavar="N",
        help="browser sessions at once; more are refused with RESOURCE_EXHAUSTED "
        "($ASR_BRIDGE_MAX_SESSIONS, default 100)",
    )
    b.add_argument(
        "--max-sessions-per-client",
        type=int_between(0, 1_000_000),
        default=_env("MAX_SESSIONS_PER_CLIENT") or "0",
        metavar="N",
        help="sessions at once from one client address, so that one browser or script "
        "cannot take them all; more are refused with RESOURCE_EXHAUSTED "
        "($ASR_BRIDGE_MAX_SESSIONS_PER_CLIENT, default 0 = no limit)",
    )
    b.add_argument(
        "--forwarded-allow-ips",
        default=_env("FORWARDED_ALLOW_IPS"),
        metavar="IPS",
        help="proxies whose X-Forwarded-For gives the client's address, comma-separated "
        "addresses or networks ($ASR_BRIDGE_FORWARDED_ALLOW_IPS, default 127.0.0.1: "
        "behind a proxy elsewhere every browser has the proxy's address)",
    )

    g = p.add_argument_group("bridge → gRPC server")
    g.add_argument(
        "--server",
        default=_env("SERVER") or "localhost:50051",
        metavar="HOST:PORT",
        help="the gRPC server ($ASR_BRIDGE_SERVER, default localhost:50051)",
    )
    g.add_argument(
        "--server-tls",
        action="store_true",
        default=_env_flag("SERVER_TLS"),
        help="connect to the server with TLS, trusting the system CAs ($ASR_BRIDGE_SERVER_TLS=1)",
    )
    g.add_argument(
        "--server-ca",
        type=user_path,
        default=_env("SERVER_CA"),
        metavar="PEM",
        help="CA bundle to trust for the server; implies --server-tls ($ASR_BRIDGE_SERVER_CA)",
    )
    g.add_argument(
        "--server-cert",
        type=user_path,
        default=_env("SERVER_CERT"),
        metavar="PEM",
        help="the bridge's client certificate, for a server that requires mTLS "
        "($ASR_BRIDGE_SERVER_CERT)",
    )
    g.add_argument(
        "--server-key",
        type=user_path,
        default=_env("SERVER_KEY"),
        metavar="PEM",
        help="that certificate's private key ($ASR_BRIDGE_SERVER_KEY)",
    )
    g.add_argument(
        "--server-token",
        default=_env("SERVER_TOKEN"),
        metavar="TOKEN",
        help="bearer token the BRIDGE presents to the server; prefer the variable, flags show "
        f"in ps (${SERVER_TOKEN_ENV})",
    )
    g.add_argument(
        "--server-tls-name",
        default=_env("SERVER_TLS_NAME"),
        metavar="NAME",
        help="name to check in the server's certificate instead of the --server host; "
        "implies --server-tls ($ASR_BRIDGE_SERVER_TLS_NAME)",
    )
    a = p.parse_args(argv)
    if (a.server_cert is None) != (a.server_key is None):
        p.error("--server-cert and --server-key go together")
    _check_tls_files(p, a)
    if a.token is not None:
        # a token from a secret (a file, a variable set from one) often ends in a newline,
        # which no browser sends: every one would be refused
        a.token = a.token.strip()
        if not a.token:
            p.error(f"--token (${TOKEN_ENV}) is empty: give a token, or unset it for no token")
    if a.allowed_origin is None:
        a.allowed_origin = [
            o.strip() for o in (_env("ALLOWED_ORIGINS") or "").split(",") if o.strip()
        ]
    return a


def _check_tls_files(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """The bridge's own certificate and key: both or neither, and readable, said before
    anything starts (a missing one was a traceback, or uvicorn's bare AssertionError)."""
    if (a.ssl_certfile is None) != (a.ssl_keyfile is None):
        p.error("--ssl-certfile and --ssl-keyfile go together")
    for flag, path in (("--ssl-certfile", a.ssl_certfile), ("--ssl-keyfile", a.ssl_keyfile)):
        if path is None:
            continue
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            p.error(f"{flag} {path}: {exc.strerror or exc}")


def bridge_config(a: argparse.Namespace) -> BridgeConfig:
    from asr_bridge.app import BridgeConfig

    return BridgeConfig(
        server=ConnectionOptions(
            target=a.server,
            tls=a.server_tls,
            ca_file=a.server_ca,
            cert_file=a.server_cert,
            key_file=a.server_key,
            # secrets mounted as files often end in a newline
            token=(a.server_token or "").strip() or None,
            server_name=a.server_tls_name,
        ),
        token=a.token,
        allowed_origins=tuple(a.allowed_origin),
        max_sessions=a.max_sessions,
        max_sessions_per_client=a.max_sessions_per_client,
        forwarded_allow_ips=a.forwarded_allow_ips,
        resume=a.resume,
    )


async def run(a: argparse.Namespace) -> None:
    from asr_bridge.app import TLSConfigError, start_bridge
    from asr_bridge.origin import OriginConfigError

    config = bridge_config(a)
    try:
        bridge = await start_bridge(
            config,
            host=a.host,
            port=a.port,
            ssl_certfile=a.ssl_certfile,
            ssl_keyfile=a.ssl_keyfile,
        )
    except (ConnectionConfigError, OriginConfigError) as exc:
        sys.exit(f"asr-bridge: {exc}")
    except TLSConfigError as exc:  # a flag's file, as argparse would say it
        print(f"asr-bridge: error: {exc}", file=sys.stderr)
        sys.exit(2)
    scheme = "https" if a.ssl_certfile else "http"
    host = "localhost" if a.host in ("0.0.0.0", "127.0.0.1", "::") else a.host
    origins = ", ".join(config.allowed_origins) or "same origin"
    print(
        f"\nasr-bridge is ready: {scheme}://{host}:{bridge.port}/ → gRPC "
        + config.server.describe()
        + (" with a token" if config.server.token else "")
        + (" (browsers: token required" if a.token else " (browsers: no token needed")
        + f"; origins: {origins}; up to {a.max_sessions} sessions)\n",
        file=sys.stderr,
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await bridge.close()


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    logging.basicConfig(level=a.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # uvicorn logs each WebSocket's path with its query string, which may hold the token
    logging.getLogger("uvicorn.error").setLevel(max(logging.WARNING, logging.root.level))
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        sys.exit(
            f"asr-bridge needs {exc.name}: pip install -e '.[bridge]' in a checkout "
            "(scripts/serve.sh's .venv has it), or pip install 'streamasr[bridge]'"
        )
    asyncio.run(run(a))
