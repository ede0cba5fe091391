"""A server of the tests' own on a loopback port the kernel picks: the base of their relays
and scripted fakes of a broker or an HTTP server."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Self


class LoopbackServer:
    """An async context manager listening on 127.0.0.1 at ``port``; :meth:`handle` serves
    each connection. On exit it stops listening, closes the connections kept in
    ``writers``, cancels the tasks started with :meth:`spawn` and waits for them all, so a
    test leaves nothing running behind it."""

    def __init__(self) -> None:
        self.port = 0
        self.writers: set[asyncio.StreamWriter] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self.writers:
            writer.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` until it ends or the server is left."""
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
