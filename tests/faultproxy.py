"""A TCP proxy on 127.0.0.1 that cuts its connections on demand, to test stream resume.

Each client connection is relayed to the upstream; ``cut()`` aborts every open one at
both ends (an RST, as a dropped Wi-Fi or a dead NAT does, not a polite close), and new
connections are relayed again at once. ``upstream`` may be changed between connections,
which is how a test moves clients to another replica.
"""

from __future__ import annotations

import asyncio
import contextlib


class FaultProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.cuts = 0
        self.connections = 0  # relayed to the upstream
        self.accepted = 0  # from clients, relayed or not (the upstream refused)
        #: the pairs black_hole() silenced, held (not by id(): a new pair may be given a
        #: dead one's id, and a new connection was silenced with it, now and then)
        self.holes: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    def black_hole(self) -> int:
        """From now on the open connections relay nothing, and stay open: a host or a
        path that vanished without a reset (a power loss, a partition). New connections
        are relayed as before. How many there were."""
        self.holes |= self._pairs
        return len(self._pairs)

    def cut(self) -> int:
        """Abort every relayed connection now; how many there were."""
        self.cuts += 1
        return self._abort_all()

    def _abort_all(self) -> int:
        pairs = list(self._pairs)
        for a, b in pairs:
            for writer in (a, b):
                writer.transport.abort()
        self._pairs.clear()
        return len(pairs)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._abort_all()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        self.connections += 1
        pair = (writer, up_writer)
        self._pairs.add(pair)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(src, dst, pair))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        try:
            while data := await src.read(65536):
                if pair in self.holes:
                    continue  # swallowed: the other end never hears of it
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._pairs.discard(pair)
            for writer in pair:
                with contextlib.suppress(Exception):
                    writer.transport.abort()
