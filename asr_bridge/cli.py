"""``asr-bridge``: flags → BridgeConfig → serve until SIGINT/SIGTERM. No logic lives here."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

TOKEN_ENV = "ASR_BRIDGE_TOKEN"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="asr-bridge",
        description="Serve a web page and a WebSocket endpoint that stream browser microphones "
        "to a streamasr gRPC server, one gRPC stream per browser session.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=8080, help="HTTP/WebSocket port (default 8080)")
    p.add_argument("--server", default="localhost:50051", help="gRPC server address")
    p.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV) or None,
        help=f"require this token from browsers (default: ${TOKEN_ENV}; unset = open)",
    )
    p.add_argument("--ssl-certfile", help="serve HTTPS/WSS (browsers allow the microphone "
                   "only on https or localhost)")  # fmt: skip
    p.add_argument("--ssl-keyfile", help="the certificate's private key")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING")
    return p.parse_args(argv)


async def run(a: argparse.Namespace) -> None:
    from asr_bridge.app import BridgeConfig, start_bridge

    bridge = await start_bridge(
        BridgeConfig(server=a.server, token=a.token),
        host=a.host,
        port=a.port,
        ssl_certfile=a.ssl_certfile,
        ssl_keyfile=a.ssl_keyfile,
    )
    scheme = "https" if a.ssl_certfile else "http"
    host = "localhost" if a.host in ("0.0.0.0", "127.0.0.1", "::") else a.host
    print(
        f"\nasr-bridge is ready: {scheme}://{host}:{bridge.port}/ → gRPC {a.server}"
        + (" (token required)" if a.token else " (no token: open to anyone who can reach it)")
        + "\n",
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
    logging.basicConfig(
        level=a.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    # uvicorn logs each WebSocket's path with its query string, which may hold the token
    logging.getLogger("uvicorn.error").setLevel(max(logging.WARNING, logging.root.level))
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        sys.exit(f"asr-bridge needs {exc.name}: pip install 'streamasr[bridge]'")
    asyncio.run(run(a))
