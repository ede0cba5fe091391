"""The broker: one listening port, sessions told apart by their first 4 bytes.

This is fqd_listener.c plus the client and queue registry of fqd_config.c. A connection
says what it is in its first 4 bytes (:func:`fqbroker.wire.sniff`): command and data
channels get a session each, HTTP goes to the HTTP front end, anything else is closed at
once. The :class:`Broker` owns the router, the queues and the key registry; sessions
call into it and it never calls into a socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable

from . import http, wire
from .catalog import Catalog
from .command import CommandSession
from .config import Settings, resolve_node_id
from .data import DataSession
from .message import MsgIdCounter
from .peering import Peering
from .program import RuleRegistry, default_registry
from .queue import Queue
from .queuespec import QueueSpec
from .router import Router
from .state import ConfigStore

__all__ = ["Broker"]

log = logging.getLogger(__name__)

LINGER_SECONDS = 1.0

HttpHandler = Callable[
    ["Broker", bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]
]


class Broker:
    """One fq broker: router, queues, clients and the listening socket."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self.node_id = resolve_node_id(self.settings.node_id)
        self.router = Router(self._rule_registry())
        log.info("Opening configdb %s", self.settings.config_db)
        self.catalog = Catalog(self.settings, self.router, ConfigStore(self.settings.config_db))
        self.queues: dict[bytes, Queue] = self.catalog.queues
        self.established = self.catalog.restore()
        log.info("Established %d exchanges, %d queues, %d bindings", *self.established)
        self.clients: dict[bytes, CommandSession] = {}
        self.msgids = MsgIdCounter()
        self.http_handler: HttpHandler | None = http.serve
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.port = 0
        self.peering = Peering(self)
        # Set by HTTP /shutdown; whoever runs the broker (fqd's main) waits on it and stops.
        self.shutdown_requested = asyncio.Event()

    def _rule_registry(self) -> RuleRegistry:
        if not self.settings.modules:
            return default_registry()
        # -m modules are this broker's own, so brokers in one process never see each
        # other's functions.
        registry = RuleRegistry()
        registry.load_entry_points()
        for module in self.settings.modules:
            registry.load_module(module)
        return registry

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._accept,
            host=self.settings.bind,
            port=self.settings.port,
            reuse_address=True,
            backlog=128,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("Listening on port: %d", self.port)
        self.peering.start()

    async def stop(self) -> None:
        await self.peering.stop()
        if self._server is not None:
            self._server.close()
        for session in list(self.clients.values()):
            session.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(self._connections, timeout=5)
        if self._server is not None:
            await self._server.wait_closed()
        self.catalog.close()

    async def __aenter__(self) -> Broker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def serve_forever(self) -> None:
        assert self._server is not None
        await self._server.serve_forever()

    # --- connections ----------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        try:
            await self._dispatch(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            writer.close()
        except asyncio.CancelledError:
            # The broker is stopping. Ending quietly matters: asyncio's stream callback
            # asks this task for its exception and would log a cancelled one as an error.
            writer.close()
        except Exception:
            log.exception("connection handler failed")
            writer.close()
        finally:
            self._connections.discard(task)

    async def _dispatch(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with asyncio.timeout(self.settings.idle_sniff_timeout):
            first4 = await reader.readexactly(4)
        mode = wire.sniff(first4)
        if mode is wire.Mode.CMD:
            await CommandSession(self, reader, writer).run()
        elif mode in (wire.Mode.DATA, wire.Mode.PEER, wire.Mode.OLD_PEER):
            await DataSession(self, mode, reader, writer).run()
        elif mode == "http" and self.http_handler is not None:
            await self.http_handler(self, first4, reader, writer)
        else:
            log.info("closing connection with unknown preamble %s", first4.hex())
            writer.close()

    async def linger_close(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Send what is queued, then close without a reset.

        Closing with unread input makes the kernel send RST, which can destroy the error
        frame before the client reads it (§1.8). So: flush, half-close, and discard input
        for a moment so the client sees the frame and then a clean end of stream.
        """
        with contextlib.suppress(ConnectionError, TimeoutError):
            await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
            async with asyncio.timeout(LINGER_SECONDS):
                while await reader.read(65536):
                    pass
        writer.close()

    # --- clients and queues ---------------------------------------------------------------

    def attach(self, spec: QueueSpec, client: CommandSession) -> Queue:
        return self.catalog.attach(spec, client)

    def register(self, client: CommandSession) -> bytes:
        """Issue a fresh client key and file the client under it."""
        while True:
            key = os.urandom(wire.KEY_LEN)
            if key not in self.clients:
                self.clients[key] = client
                return key

    def deregister(self, client: CommandSession) -> None:
        """A command session ended: drop its key and data channel, maybe its queue."""
        if client.key and self.clients.get(client.key) is client:
            del self.clients[client.key]
        if client.data is not None:
            client.data.drain_then_close(LINGER_SECONDS)
        if client.queue is not None:
            self.catalog.detach(client.queue, client)

    def bind(self, exchange: bytes, program: bytes, queue: Queue, flags: int) -> int:
        return self.catalog.bind(exchange, program, queue, flags)

    def unbind(self, exchange: bytes, route_id: int, queue: Queue) -> bool:
        return self.catalog.unbind(exchange, route_id, queue)
