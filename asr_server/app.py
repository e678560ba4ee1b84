"""Builds and runs the gRPC server: servicer, health, reflection, metrics, signals, drain.

Start-up order matters for operators: the port and the health service come up
first (NOT_SERVING), the model loads in a worker thread, then health flips to
SERVING. On SIGTERM/SIGINT health goes NOT_SERVING, the port stops taking new
connections and calls (gRPC's GOAWAY: clients reconnect elsewhere), and open streams
are told to move (GoingAway) and get ``drain_timeout_s`` to finish; a second signal
ends them at once. On SIGHUP the
TLS certificate and the token file are re-read (they are also re-read when the
files change: the certificate at the next handshake, the token file within a second).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from asr_api.v1 import asr_pb2
from asr_server.engine.base import Engine
from asr_server.engine.factory import check_engine, create_engine
from asr_server.engine.models import ModelLoadError
from asr_server.engine.scheduler import EngineScheduler
from asr_server.metrics import Metrics
from asr_server.session import SessionServices
from asr_server.settings import Settings, listen_address
from asr_server.transport.admission import Admission
from asr_server.transport.auth import CHECK_INTERVAL_S, TokenRegistry
from asr_server.transport.decoding import add_recognizer_to_server
from asr_server.transport.interceptors import Authenticator, AuthInterceptor, HealthCheckOnly
from asr_server.transport.servicer import RecognizerServicer, drain_cut_after
from asr_server.transport.tls import CertificateFiles, ReloadingServerCredentials
from asr_server.vad.base import SpeechCheck, VoiceDetector
from asr_server.vad.silero import load_silero, silero_hears_speech
from asr_server.vad.turn import TurnDetection, TurnModelError, load_turn_detection

logger = logging.getLogger(__name__)

SERVICE_NAME = asr_pb2.DESCRIPTOR.services_by_name["Recognizer"].full_name
#: the health port's message limit: a health request or answer is a service name and a status
HEALTH_MESSAGE_BYTES = 4096
#: how long a second signal lets the open streams' statuses go out before the server stops
HURRY_STATUS_S = 0.5
#: how long handlers gRPC's stop left behind get to end once cancelled
LEFT_BEHIND_S = 2.0
#: how long the tasks still running when serve() is done get to end before asyncio.run
#: cancels them (gRPC's per-call tasks need one turn of the loop)
LEFTOVER_TASKS_S = 1.0


class StartupError(Exception):
    """The server cannot start as configured (a port in use); the message says why."""


def _bind(server: grpc.aio.Server, address: str, credentials=None) -> int:  # type: ignore[no-untyped-def]
    """The port ``server`` listens on at ``address``; StartupError if it cannot."""
    try:
        port = (
            server.add_secure_port(address, credentials)
            if credentials is not None
            else server.add_insecure_port(address)
        )
    except RuntimeError:  # grpc's "Failed to bind to address ...", the reason only logged
        raise StartupError(_not_bound(address, credentials is not None)) from None
    if port == 0:
        raise StartupError(_not_bound(address, credentials is not None))
    return port


#: what _why_not_bound says when the operating system sees nothing wrong with the address
_NO_REASON_FOUND = "is the port in use?"


def _not_bound(address: str, tls: bool) -> str:
    reason = _why_not_bound(address)
    if tls and reason == _NO_REASON_FOUND:
        # the address is free: gRPC refused the certificate or key itself. Its BoringSSL
        # takes fewer key types than the OpenSSL that checked the pair (e.g. no Brainpool
        # curves, no secp256k1, no Ed448)
        return (
            f"cannot listen on {address}: gRPC could not use the TLS certificate and key "
            "(gRPC's TLS works with RSA, ECDSA P-256 and P-384 keys; its log line above "
            "says more)"
        )
    return f"cannot listen on {address}: {reason}"


def _why_not_bound(address: str) -> str:
    """Why gRPC could not bind ``address`` (``host:port``, IPv6 in brackets), asked of the
    operating system: grpc's error says only that it failed, its log line says why."""
    host, _, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    try:
        found = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        return f"no such address ({host}: {exc.args[-1]})"
    for family, kind, proto, _, where in found:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.bind(where)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"the port is in use ({exc.strerror})"
            if exc.errno == errno.EADDRNOTAVAIL:
                return f"{host} is not an address of this machine ({exc.strerror})"
            return exc.strerror or str(exc)
    return _NO_REASON_FOUND  # free again by now, or in use in a way a probe misses


def grpc_options(settings: Settings) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        ("grpc.max_send_message_length", settings.max_message_bytes),
        # No bandwidth-delay probing: it grows each stream's HTTP/2 window to megabytes,
        # which would let a client park far more audio in transit than the buffer cap.
        ("grpc.http2.bdp_probe", 0),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        # a port another server holds is an error, not a port two servers share (grpc's
        # default on Linux lets the second bind it and take some of the first's calls)
        ("grpc.so_reuseport", 0),
        # HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS: one connection cannot open thousands of
        # calls at once (with the pending-call limit, a bound on calls that sent nothing)
        ("grpc.max_concurrent_streams", settings.max_concurrent_streams_per_connection),
    ]


@dataclass
class Credentials:
    """What the server checks callers with; built once at start-up, re-read on SIGHUP."""

    tls: ReloadingServerCredentials | None
    tokens: TokenRegistry | None

    @classmethod
    def from_settings(cls, settings: Settings, metrics: Metrics) -> Credentials:
        """Raises CertificateError / TokenFileError naming the file that cannot be used."""
        tls = None
        if settings.tls_cert is not None and settings.tls_key is not None:
            files = CertificateFiles(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
            tls = ReloadingServerCredentials(files, on_reload=_counter(metrics, "tls"))
        tokens = None
        if settings.auth_tokens is not None:
            tokens = TokenRegistry(settings.auth_tokens, on_reload=_counter(metrics, "tokens"))
        return cls(tls, tokens)

    def reload(self) -> None:
        if self.tls is not None:
            self.tls.reload()
        if self.tokens is not None:
            self.tokens.reload()


def _counter(metrics: Metrics, file: str) -> Callable[[bool], None]:
    metrics.watch_reloads(file)

    def count(ok: bool) -> None:
        metrics.credential_reloads.labels(file, "ok" if ok else "failed").inc()

    return count


@dataclass
class RunningServer:
    server: grpc.aio.Server
    port: int
    metrics_port: int | None
    servicer: RecognizerServicer
    health: health.aio.HealthServicer
    metrics: Metrics
    ready: asyncio.Event
    credentials: Credentials
    health_port: int | None = None
    _health_server: grpc.aio.Server | None = None
    _scheduler: EngineScheduler | None = None
    _loader: asyncio.Task[None] | None = None
    _metrics_http: object | None = None
    _interceptor: AuthInterceptor | None = None
    _token_watch: asyncio.Task[None] | None = None

    async def drain_and_stop(self, timeout_s: float) -> None:
        """Graceful shutdown: refuse new streams, tell open ones to move (GoingAway), give
        them ``timeout_s`` to finish or leave, then stop."""
        told = self.servicer.going_away(timeout_s)
        await self.health.enter_graceful_shutdown()
        logger.info("draining: %d open stream(s) told to move, up to %.0f s", told, timeout_s)
        ending = asyncio.create_task(self._end_lasting_calls_once_streams_leave())
        cutting = asyncio.create_task(self._end_streams_at_the_deadline(timeout_s))
        try:
            await self.server.stop(grace=timeout_s)
        finally:
            ending.cancel()
            cutting.cancel()
        await self._end_handlers_left_behind()
        await self.close()

    async def _end_handlers_left_behind(self) -> None:
        """gRPC's graceful stop returns once its core holds no call, which can be before the
        handlers of those calls have ended: a resuming client cancels its old call as it
        moves, and that call's handler may not have seen it yet. Once stopped, the server
        can send nothing: such a handler's next read failed with "Server already stopped",
        counted and logged as an unexpected server error (INTERNAL, with tracebacks), or
        asyncio.run cut it short as the process ended. They are ended (their clients have
        left) and awaited, while the services they use are still open."""
        if left := self.servicer.end_calls_left_behind():
            await asyncio.wait(left, timeout=LEFT_BEHIND_S)

    async def _end_streams_at_the_deadline(self, timeout_s: float) -> None:
        """Streams still open just before the drain's deadline (when their GoingAway said)
        end with UNAVAILABLE and a reason, before gRPC's stop cancels them (which the server
        counted as streams their clients had left, and clients read as "Cancelling all
        calls"). A drain of 0 leaves them to gRPC: no time to send a reason."""
        if timeout_s <= 0:
            return
        await asyncio.sleep(drain_cut_after(timeout_s))
        if ended := self.servicer.end_open_calls(
            f"the server is shutting down and its drain of {timeout_s:g} s is over; resume "
            "the stream on another replica"
        ):
            logger.warning("drain deadline: ended %d call(s) still open", ended)

    async def _end_lasting_calls_once_streams_leave(self) -> None:
        """gRPC's graceful stop waits for every call: a health Watch or a reflection call,
        which last as long as their client likes, held the drain for its whole time
        though every stream had left. They end once the streams have (a Watch has had
        its NOT_SERVING by then)."""
        while self.servicer.active:  # noqa: ASYNC110 - admission keeps a count, no event
            await asyncio.sleep(0.05)
        if self._interceptor is not None and (ended := self._interceptor.end_lasting_calls()):
            logger.info("drained: ended %d health Watch or reflection call(s)", ended)

    async def hurry(self) -> None:
        """End now (a second signal): the open streams end with UNAVAILABLE and a reason,
        and closing waits for no engine call under way. (gRPC's own stop cancelled them:
        counted as streams their clients had left, CANCELLED, and their clients read
        "Cancelling all calls".)"""
        if self._scheduler is not None:
            self._scheduler.abandon()
        self.servicer.end_open_calls(
            "the server was told to stop at once, during its drain; resume the stream on "
            "another replica"
        )
        # their statuses go out as their handlers end: a moment, not a wait for any engine
        deadline = asyncio.get_running_loop().time() + HURRY_STATUS_S
        while self.servicer.active and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        await self.server.stop(grace=None)

    async def close(self) -> None:
        if self._loader is not None and not self._loader.done():
            self._loader.cancel()
        if self._token_watch is not None:
            self._token_watch.cancel()
        await self.server.stop(grace=None)
        if self._health_server is not None:
            await self._health_server.stop(grace=None)
        if self._scheduler is not None:
            await self._scheduler.close()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()  # type: ignore[attr-defined]
            self._metrics_http.server_close()  # type: ignore[attr-defined]  # its socket


async def start_server(
    settings: Settings,
    *,
    engine_factory: Callable[[Settings], Engine] = create_engine,
    metrics: Metrics | None = None,
    vad_factory: Callable[[], VoiceDetector] | None = None,
) -> RunningServer:
    """Bind, start serving health, and load the model in the background."""
    metrics = metrics or Metrics()
    metrics.max_streams.set(settings.max_streams)
    credentials = Credentials.from_settings(settings, metrics)
    authenticator = Authenticator(credentials.tokens, mtls=settings.tls_client_ca is not None)
    interceptor = AuthInterceptor(authenticator, metrics)
    server = grpc.aio.server(options=grpc_options(settings), interceptors=[interceptor])
    servicer = RecognizerServicer(
        None,
        admission=Admission(settings, metrics),
        model_name=settings.engine.model,
        languages=None,
    )
    add_recognizer_to_server(servicer, server)  # tolerant request parsing, see decoding.py
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    await _report_health(health_servicer, health_pb2.HealthCheckResponse.NOT_SERVING)
    if settings.reflection:
        reflection.enable_server_reflection(
            (
                SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            server,
        )
    address = listen_address(settings.host, settings.port)
    port = _bind(
        server, address, credentials.tls.credentials() if credentials.tls is not None else None
    )
    metrics_http = None
    metrics_port = None
    if settings.metrics_port:
        from prometheus_client import start_http_server

        try:
            metrics_http, _thread = start_http_server(
                settings.metrics_port, addr=settings.host, registry=metrics.registry
            )
        except OSError as exc:
            raise StartupError(
                "cannot serve metrics on "
                f"{listen_address(settings.host, settings.metrics_port)}: {exc}"
            ) from None
        metrics_port = metrics_http.server_port
    await server.start()
    try:
        health_server, health_port = await _start_health_server(settings, health_servicer)
    except StartupError:
        await server.stop(None)
        if metrics_http is not None:  # (its port stayed bound in an embedding process)
            metrics_http.shutdown()
            metrics_http.server_close()
        raise

    running = RunningServer(
        server,
        port,
        metrics_port,
        servicer,
        health_servicer,
        metrics,
        asyncio.Event(),
        credentials,
        health_port=health_port,
        _health_server=health_server,
        _metrics_http=metrics_http,
        _interceptor=interceptor,
    )

    async def load() -> None:
        try:  # first: a configured turn model that is not there fails the start at once
            turn, turn_unavailable = await asyncio.to_thread(_load_turn_detection, settings)
        except TurnModelError as exc:
            logger.error("%s", exc)
            raise
        try:
            engine = await asyncio.to_thread(engine_factory, settings)
            check_engine(engine)
        except ModelLoadError as exc:  # says which package and file: no traceback
            logger.error("model %r failed to load: %s", settings.engine.model, exc)
            raise
        except Exception:
            logger.exception("model %r failed to load", settings.engine.model)
            raise

        def engine_stuck() -> None:
            # an orchestrator's probe now takes the replica out (and restarts it); the
            # streams whose call is stuck have failed, and others may still be served
            report = asyncio.create_task(
                _report_health(health_servicer, health_pb2.HealthCheckResponse.NOT_SERVING)
            )
            stuck_reports.add(report)
            report.add_done_callback(stuck_reports.discard)

        stuck_reports: set[asyncio.Task[None]] = set()
        scheduler = EngineScheduler(
            engine,
            metrics,
            workers=engine.workers,
            max_batch_size=engine.max_batch_size,
            batch_wait_s=settings.engine.batch_wait_ms / 1000,
            partial_workers=settings.engine.partial_workers,
            call_timeout_s=settings.engine.call_timeout_s,
            on_stuck=engine_stuck,
        )
        await scheduler.start()
        running._scheduler = scheduler
        servicer.model_name = engine.name
        servicer.languages = engine.capabilities.languages
        speech_check = await asyncio.to_thread(_load_speech_check)
        servicer.services = SessionServices(
            settings, scheduler, metrics, vad_factory, turn, turn_unavailable, speech_check
        )
        metrics.model_loaded.set(1)
        await _report_health(health_servicer, health_pb2.HealthCheckResponse.SERVING)
        running.ready.set()
        logger.info("ready: serving %s on port %d", engine.name, port)

    running._loader = asyncio.create_task(load(), name="model-loader")
    if credentials.tokens is not None:
        running._token_watch = asyncio.create_task(
            _watch_token_file(credentials.tokens), name="token-file-watch"
        )
    return running


async def _watch_token_file(tokens: TokenRegistry) -> None:
    """An edited token file takes effect within a second though no call comes: the file
    was looked at only when a call presented a token, so on a quiet server a revoked
    client's open streams went on until somebody else called."""
    while True:
        await asyncio.sleep(CHECK_INTERVAL_S)
        await asyncio.to_thread(tokens.check_for_change)  # (file I/O: off the loop)


async def _report_health(
    health_servicer: health.aio.HealthServicer,
    status: health_pb2.HealthCheckResponse.ServingStatus.ValueType,
) -> None:
    """``status`` for the whole server ("") and for the recognizer service alike."""
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, status)


def _load_turn_detection(settings: Settings) -> tuple[TurnDetection | None, str]:
    """The semantic end-of-turn model if it is installed (SEMANTIC streams need it).

    Not installed where it is looked for by default: SEMANTIC streams are refused and the
    server serves the rest. A path the operator gave that does not load is a mistake in
    the configuration: the server does not start (TurnModelError)."""
    try:
        turn = load_turn_detection(settings)
    except TurnModelError as exc:
        if settings.turn.model_path is not None:
            raise
        logger.info("SEMANTIC endpointing is off: %s", exc)
        return None, str(exc)
    kernels = (
        "exact u8u8 int8 kernels: no VNNI known on this CPU"
        if turn.model.exact_int8_kernels
        else "onnxruntime's default int8 kernels"
    )
    logger.info("SEMANTIC endpointing is on (%s; %s)", turn.model.path, kernels)
    return turn, ""


def _load_speech_check() -> SpeechCheck | None:
    """Silero as a second opinion (see the channel): on short sounds in pauses (set-aside
    finals), and on an utterance whose carried final has no new words (a noise, which
    then gets no final). Loaded now so that no stream waits for it; without it those
    finals are decoded again, as before."""
    try:
        load_silero()
    except Exception as exc:  # (onnxruntime comes with faster-whisper; a broken install)
        logger.warning("Silero is unavailable, every sound counts as speech: %s", exc)
        return None
    return silero_hears_speech


async def _start_health_server(
    settings: Settings, health_servicer: health.aio.HealthServicer
) -> tuple[grpc.aio.Server | None, int | None]:
    """The plaintext health-only port, for probes that cannot do TLS; it serves nothing else,
    so it exposes no audio and needs no credentials."""
    if not settings.health_port:
        return None, None
    # the main port's limits, and messages no larger than a health request needs: nothing
    # on this port asks for credentials
    small_messages = {
        "grpc.max_receive_message_length": HEALTH_MESSAGE_BYTES,
        "grpc.max_send_message_length": HEALTH_MESSAGE_BYTES,
    }
    options = [(key, small_messages.get(key, value)) for key, value in grpc_options(settings)]
    server = grpc.aio.server(options=options, interceptors=[HealthCheckOnly()])
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = _bind(server, listen_address(settings.host, settings.health_port))
    await server.start()
    return server, port


async def serve(
    settings: Settings, on_ready: Callable[[RunningServer], None] | None = None
) -> None:
    """Run until SIGTERM/SIGINT, then drain."""
    before = asyncio.all_tasks()  # (others' tasks, if serve() is not alone on the loop)
    running = await start_server(settings)
    # the first SIGTERM or Ctrl-C drains; a second cuts the drain short (the operator
    # wants out now). One handler counts them: with a second handler set once the first
    # had been seen, a signal in between was taken for the first again, and ignored.
    stop, hurry = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        (hurry if stop.is_set() else stop).set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    # off the loop: reading and checking certificates is file I/O
    loop.add_signal_handler(
        signal.SIGHUP, lambda: loop.run_in_executor(None, running.credentials.reload)
    )
    ready = asyncio.create_task(running.ready.wait())
    stopping = asyncio.create_task(stop.wait())
    assert running._loader is not None
    done, _ = await asyncio.wait(
        {ready, stopping, running._loader}, return_when=asyncio.FIRST_COMPLETED
    )
    if running._loader in done and running._loader.exception() is not None:
        stopping.cancel()
        ready.cancel()
        await running.close()
        raise SystemExit(f"model failed to load: {running._loader.exception()}")
    if ready in done and on_ready is not None:
        on_ready(running)
    await stopping
    ready.cancel()
    drain = asyncio.create_task(running.drain_and_stop(settings.drain_timeout_s))
    hurried = asyncio.create_task(hurry.wait())
    await asyncio.wait({drain, hurried}, return_when=asyncio.FIRST_COMPLETED)
    if not drain.done():
        logger.warning("a second signal: ending the %d open stream(s) now", running.servicer.active)
        await running.hurry()
    await drain
    hurried.cancel()
    # gRPC's task for each call (it waits for the call's close) needs a turn of the loop
    # after the stop to end; asyncio.run cancelled those still pending as it closed the
    # loop, and gRPC printed a bare CancelledError traceback for one now and then
    if ours := asyncio.all_tasks() - before:
        await asyncio.wait(ours, timeout=LEFTOVER_TASKS_S)
