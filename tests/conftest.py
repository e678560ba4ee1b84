"""Fixtures: in-process servers on 127.0.0.1 port 0, stopped by the test."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Callable
from types import FrameType
from typing import Any

import pytest

from asr_server.app import RunningServer, start_server
from asr_server.engine.fake import FakeEngine
from asr_server.settings import Settings
from tests import background
from tests.helpers import running_server

ServerFactory = Callable[..., Any]


def pytest_configure(config: pytest.Config) -> None:
    # a SIGTERM (a CI job cancelled) ends the run as Ctrl-C does, with the fixtures'
    # teardowns, which stop the servers, proxies and replicas they started: SIGTERM's
    # default left them all running
    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def pytest_collection_finish(session: pytest.Session) -> None:
    # the long, idle scenarios of the collected tests wait while the others run
    if not session.config.option.collectonly:
        background.start_for(session.items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    background.stop_all()


@pytest.fixture
async def server() -> AsyncIterator[str]:
    """The address of an in-process server on the fake engine, for client-side tests."""
    running = await start_server(
        Settings(host="127.0.0.1", port=0, metrics_port=0), engine_factory=lambda s: FakeEngine()
    )
    try:
        await running.ready.wait()
        yield f"127.0.0.1:{running.port}"
    finally:
        await running.close()


@pytest.fixture
async def make_server() -> AsyncIterator[ServerFactory]:
    """``await make_server(engine_factory=..., **settings)``; every server is closed after."""
    servers: list[RunningServer] = []

    async def factory(*args: Any, **kwargs: Any) -> RunningServer:
        server = await running_server(*args, **kwargs)
        servers.append(server)
        return server

    yield factory
    for server in servers:
        await server.close()


@pytest.fixture
async def make_bridge() -> AsyncIterator[Callable[..., Any]]:
    """``await make_bridge(grpc_port, token=...)``: an asr-bridge on 127.0.0.1 port 0.

    Instead of a port, ``ConnectionOptions(...)`` reaches a server with TLS or a token.
    """
    from asr_bridge.app import BridgeConfig, RunningBridge, start_bridge
    from asr_client import ConnectionOptions

    bridges: list[RunningBridge] = []

    async def factory(server: int | ConnectionOptions, **config: Any) -> RunningBridge:
        if isinstance(server, int):
            server = ConnectionOptions(f"127.0.0.1:{server}")
        bridge = await start_bridge(BridgeConfig(server=server, **config), host="127.0.0.1", port=0)
        bridges.append(bridge)
        return bridge

    yield factory
    for bridge in bridges:
        await bridge.close()
