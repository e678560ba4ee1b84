"""``asr-server``: flags → Settings → app.serve(); ``asr-server token NAME`` makes a token.

No logic lives here.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

from pydantic import ValidationError
from pydantic_settings import SettingsError

from asr_server.log import configure_logging
from asr_server.settings import (
    DEFAULT_METRICS_PORT,
    DEFAULT_PORT,
    ModelCacheSettings,
    Settings,
    expand_home,
    listen_address,
    unknown_variables,
)


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
    p.add_argument("--log-level", help="DEBUG, INFO (default), WARNING, ERROR, CRITICAL")
    sec = p.add_argument_group(
        "exposure", "TLS, authentication and limits (docs/security.md); env ASR_<NAME>"
    )
    sec.add_argument("--tls-cert", type=Path, metavar="PEM", help="certificate chain: serve TLS")
    sec.add_argument("--tls-key", type=Path, metavar="PEM", help="private key of --tls-cert")
    sec.add_argument(
        "--tls-client-ca", type=Path, metavar="PEM", help="require client certificates (mTLS)"
    )
    sec.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="allow plaintext on a non-loopback address (a TLS proxy in front)",
    )
    sec.add_argument(
        "--auth-tokens",
        type=Path,
        metavar="FILE",
        help="token file, NAME:SHA256_HEX a line (make lines with: asr-server token NAME)",
    )
    sec.add_argument(
        "--no-reflection",
        dest="reflection",
        action="store_false",
        default=None,
        help="do not serve gRPC reflection",
    )
    sec.add_argument("--max-streams-per-client", type=int, metavar="N", help="0 = no limit")
    sec.add_argument("--config-timeout-s", type=float, metavar="S", help="default 10")
    sec.add_argument("--idle-timeout-s", type=float, metavar="S", help="default 60")
    sec.add_argument(
        "--health-port", type=int, metavar="PORT", help="plaintext health-only port (0 = off)"
    )
    a = p.parse_args(argv)
    # Flags become init arguments, which pydantic-settings deep-merges over the environment;
    # --model/--device/--compute-type land on the flat shortcut fields of Settings.
    overrides: dict[str, object] = {
        k: v for k, v in vars(a).items() if v is not None and k != "vad"
    }
    if a.vad:
        overrides["vad"] = {"backend": a.vad}
    return Settings(**overrides)  # type: ignore[arg-type]


def token_command(argv: list[str]) -> None:
    """``asr-server token NAME``: print a new token and the line for the token file."""
    from asr_server.transport.auth import TokenFileError, new_token

    p = argparse.ArgumentParser(
        prog="asr-server token",
        description="Make a bearer token for a client. The token goes to the client (keep it "
        "secret; asr-client --token or ASR_TOKEN); the line goes into the --auth-tokens file, "
        "which holds only its SHA-256.",
    )
    p.add_argument("name", help="the client's name (letters, digits, . _ @ -)")
    a = p.parse_args(argv)
    try:
        token, line = new_token(a.name)
    except TokenFileError as exc:
        p.error(str(exc))
    print(f"token for {a.name} (give it to the client; it is not stored anywhere):")
    print(f"  {token}")
    print("line for the --auth-tokens file:")
    print(f"  {line}")


def turn_model_command(argv: list[str]) -> None:
    """``asr-server turn-model``: install the semantic end-of-turn model (needs the package
    index once; the server itself never goes online)."""
    from asr_server.vad.turn import PACKAGE, PACKAGE_VERSION, TurnModelError, install_model

    parser = argparse.ArgumentParser(
        prog="asr-server turn-model",
        description=f"Fetch Smart Turn v3.2 from the pinned {PACKAGE}=={PACKAGE_VERSION} wheel "
        "(no dependencies, nothing imported), check it and put it in the model cache, for "
        "SEMANTIC endpointing.",
    )
    parser.add_argument(
        "--cache-dir",
        type=_home_expanded,
        help="default: ASR_CACHE_DIR, else ASR_ENGINE__CACHE_DIR, else ~/.cache/streamasr",
    )
    a = parser.parse_args(argv)
    try:
        path = install_model(a.cache_dir or ModelCacheSettings().path)
    except (TurnModelError, subprocess.CalledProcessError, OSError, SettingsError) as exc:
        print(f"asr-server turn-model: error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    print(f"semantic end-of-turn model ready: {path}")


def client_command() -> str:
    """How to run ``asr-client`` from here: its name where the shell finds this install's,
    else its path (``.venv/bin/asr-client`` after ``scripts/serve.sh``, whose venv is not
    on PATH), so the hint the server prints can be pasted as it is."""
    script = Path(sys.executable).parent / "asr-client"
    found = shutil.which("asr-client")
    if not script.exists() or (found and Path(found).resolve() == script.resolve()):
        return "asr-client"
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)


def sample_file() -> str:
    """A recording to try: the checkout's JFK sample when the server runs from there."""
    jfk = Path("audio_samples") / "jfk.flac"
    return str(jfk) if jfk.is_file() else "<audio file>"


def ready_banner(settings: Settings, model_name: str, port: int, metrics_port: int | None) -> str:
    """What the server prints once it serves: where, how it is secured, and a client
    command that connects as it is (with the flags its security asks for)."""
    # an address that listens on every interface is reached here as localhost; ::1 is
    # not: the metrics server bound to it does not answer an IPv4 localhost
    local = "localhost" if settings.host in ("0.0.0.0", "127.0.0.1", "::") else settings.host
    security = ", ".join(
        what
        for what, on in (
            ("TLS", settings.tls),
            ("client certificates", settings.tls_client_ca is not None),
            ("tokens", settings.auth_tokens is not None),
        )
        if on
    )
    client_flags = (
        (" --tls [--ca CA.pem]" if settings.tls else "")
        + (" --cert CLIENT.pem --key CLIENT-KEY.pem" if settings.tls_client_ca else "")
        + (" --token $ASR_TOKEN" if settings.auth_tokens is not None else "")
    )
    return (
        f"\nstreamasr is ready: model {model_name}, gRPC on "
        f"{listen_address(settings.host, port)}"
        + (f" ({security})" if security else "")
        + (
            f", metrics on http://{listen_address(local, metrics_port)}/metrics"
            if metrics_port
            else ""
        )
        + f"\n  try:  {client_command()} file {sample_file()}"
        + f" --server {listen_address(local, port)}{client_flags}\n"
    )


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["token"]:
        token_command(args[1:])
        return
    if args[:1] == ["turn-model"]:
        turn_model_command(args[1:])
        return
    errors, warnings = unknown_variables(os.environ)
    for line in errors:
        print(f"asr-server: error: {line}", file=sys.stderr)
    if errors:
        raise SystemExit(2)
    for line in warnings:
        print(f"asr-server: warning: {line}", file=sys.stderr)
    try:
        settings = parse_args(args)
    except ValidationError as exc:
        for error in exc.errors():
            where = ".".join(str(x) for x in error["loc"])
            message = error["msg"].removeprefix("Value error, ")
            print(f"asr-server: error: {where + ': ' if where else ''}{message}", file=sys.stderr)
        raise SystemExit(2) from None
    except SettingsError as exc:  # a variable that cannot be parsed (ASR_ENGINE=notjson)
        cause = f" ({exc.__cause__})" if exc.__cause__ else ""
        print(f"asr-server: error: {exc}{cause}", file=sys.stderr)
        raise SystemExit(2) from None
    configure_logging(settings.log_level)
    from asr_server.app import RunningServer, StartupError, serve
    from asr_server.transport.auth import TokenFileError
    from asr_server.transport.tls import CertificateError

    def announce(running: RunningServer) -> None:
        # the engine's own name: the fake backend ignores settings.engine.model
        banner = ready_banner(
            settings, running.servicer.model_name, running.port, running.metrics_port
        )
        print(banner, file=sys.stderr, flush=True)

    try:
        asyncio.run(serve(settings, on_ready=announce))
    except KeyboardInterrupt:
        pass
    except (CertificateError, TokenFileError) as exc:
        print(f"asr-server: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except StartupError as exc:
        print(f"asr-server: error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    from asr_server.engine.scheduler import engine_calls_left_running

    if engine_calls_left_running():
        # the interpreter's exit would join the engine's threads and so wait on the stuck
        # call for good. The streams are gone and the logs written: end here.
        logging.shutdown()
        sys.stderr.flush()
        os._exit(0)


def _home_expanded(text: str) -> Path:
    # as the settings do: no shell expands "~" after "=" (--cache-dir=~/models), and the
    # model went to a folder named "~" where the server, reading ASR_CACHE_DIR, never looks
    try:
        return expand_home(Path(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
