"""``asr-server``: flags → Settings → app.serve(). No logic lives here."""

from __future__ import annotations

import argparse
import asyncio
import sys

from asr_server.log import configure_logging
from asr_server.settings import DEFAULT_METRICS_PORT, DEFAULT_PORT, Settings


def parse_args(argv: list[str] | None = None) -> Settings:
    p = argparse.ArgumentParser(
        prog="asr-server",
        description="Real-time streaming speech recognition over gRPC. Every flag also has an "
        "environment variable (ASR_HOST, ASR_PORT, ASR_ENGINE__MODEL, ...).",
    )
    p.add_argument("--host", help="address to bind (default 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--port", type=int, help=f"gRPC port (default {DEFAULT_PORT})")
    p.add_argument(
        "--metrics-port",
        type=int,
        help=f"Prometheus port (default {DEFAULT_METRICS_PORT}; 0 = off)",
    )
    p.add_argument(
        "--model", help="tiny.en (default, embedded), base, small, a directory or hub id"
    )
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="inference device")
    p.add_argument("--compute-type", help="CTranslate2 compute type (default: auto)")
    p.add_argument("--max-streams", type=int, help="concurrent stream limit")
    p.add_argument("--vad", choices=["webrtc", "silero"], help="voice activity detector")
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING")
    a = p.parse_args(argv)
    # Flags become init arguments, which pydantic-settings deep-merges over the environment;
    # --model/--device/--compute-type land on the flat shortcut fields of Settings.
    overrides: dict[str, object] = {
        k: v for k, v in vars(a).items() if v is not None and k != "vad"
    }
    if a.vad:
        overrides["vad"] = {"backend": a.vad}
    return Settings(**overrides)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> None:
    settings = parse_args(argv)
    configure_logging(settings.log_level)
    from asr_server.app import RunningServer, serve

    def announce(running: RunningServer) -> None:
        host = "localhost" if settings.host in ("0.0.0.0", "127.0.0.1", "::") else settings.host
        print(
            f"\nstreamasr is ready: model {settings.engine.model}, gRPC on {settings.host}:"
            f"{running.port}"
            + (
                f", metrics on http://{host}:{running.metrics_port}/metrics"
                if running.metrics_port
                else ""
            )
            + f"\n  try:  asr-client file audio_samples/<file> --server {host}:{running.port}\n",
            file=sys.stderr,
            flush=True,
        )

    try:
        asyncio.run(serve(settings, on_ready=announce))
    except KeyboardInterrupt:
        pass
