"""The broker: one listening port, sessions told apart by their first 4 bytes.

This is fqd_listener.c plus the client and queue registry of fqd_config.c. A connection
says what it is in its first 4 bytes (:func:`fqbroker.wire.sniff`): command and data
channels get a session each, HTTP goes to the HTTP front end, anything else is closed at
once. The :class:`Broker` owns the router, the queues and the key registry; sessions
call into it and it never calls into a socket.

Sessions are protocols on the connection's transport, not tasks: an idle client costs
its two transports and two small objects, so a broker holds tens of thousands of them.
HTTP, rare and short, keeps its streams and a task per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import cast

from . import wire
from .catalog import Catalog
from .command import LINGER_SECONDS, CommandSession
from .config import Settings, resolve_node_id
from .data import DataSession
from .heartbeats import HeartbeatClock
from .message import MsgIdCounter
from .peering import Peering
from .program import RuleRegistry, default_registry
from .queue import Queue
from .queuespec import QueueSpec
from .router import Router
from .state import ConfigStore

__all__ = ["Broker"]

log = logging.getLogger(__name__)

STOP_SECONDS = 5.0  # how long stop() waits for connections to flush and close

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
        self.budget = self.catalog.budget  # memory held for publishers (docs/memory.md)
        self.established = self.catalog.restore()
        log.info("Established %d exchanges, %d queues, %d bindings", *self.established)
        self.clients: dict[bytes, CommandSession] = {}
        self.msgids = MsgIdCounter()
        self.http_handler: HttpHandler | None = _serve_http
        self._server: asyncio.Server | None = None
        # Every open connection, to close at stop; a dict is smaller than a set.
        self._connections: dict[asyncio.Transport, None] = {}
        self._http_tasks: set[asyncio.Task[None]] = set()
        self._all_closed: asyncio.Event | None = None
        self.heartbeats = HeartbeatClock()
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
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Sniffer(self),
            host=self.settings.bind,
            port=self.settings.port,
            reuse_address=True,
            backlog=128,
        )
        for sock in self._server.sockets:
            # Accepted sockets inherit these (Linux): no per-connection call, and none of
            # the socket objects uvloop would build and keep for it.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("Listening on port: %d", self.port)
        self.peering.start()

    async def stop(self) -> None:
        await self.peering.stop()
        if self._server is not None:
            self._server.close()
        for session in list(self.clients.values()):
            session.close()
        for task in list(self._http_tasks):
            task.cancel()
        if self._http_tasks:
            await asyncio.wait(self._http_tasks, timeout=5)
        await self._close_connections()
        if self._server is not None:
            await self._server.wait_closed()
        self.heartbeats.close()
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

    def opened(self, transport: asyncio.Transport) -> None:
        self._connections[transport] = None

    def closed(self, transport: asyncio.Transport) -> None:
        self._connections.pop(transport, None)
        if not self._connections and self._all_closed is not None:
            self._all_closed.set()

    async def _close_connections(self) -> None:
        """Close every connection and wait for the sessions to end, before queues close.

        A session still running when the catalog closes could publish into closed queues.
        """
        if not self._connections:
            return
        self._all_closed = asyncio.Event()
        for transport in list(self._connections):
            transport.close()
        try:
            async with asyncio.timeout(STOP_SECONDS):
                await self._all_closed.wait()
        except TimeoutError:
            for transport in list(self._connections):
                transport.abort()  # a client that does not read what is still queued

    def serve_http(
        self, transport: asyncio.Transport, first4: bytes, rest: bytes, handler: HttpHandler
    ) -> None:
        """Put the connection on streams, with what was read already, for the HTTP task."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(loop=loop)
        protocol = _HttpProtocol(self, reader, loop=loop)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        if rest:
            reader.feed_data(rest)
        task = loop.create_task(self._http(handler, first4, reader, writer))
        self._http_tasks.add(task)
        task.add_done_callback(self._http_tasks.discard)

    async def _http(
        self,
        handler: HttpHandler,
        first4: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        try:
            await handler(self, first4, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            writer.close()
        except asyncio.CancelledError:
            # The broker is stopping. Ending quietly matters: whoever looks at this task's
            # result would log a cancelled one as an error.
            writer.close()
        except Exception:
            log.exception("connection handler failed")
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


async def _serve_http(
    broker: Broker, first4: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    # h11 and the HTTP front end are loaded by the first HTTP request, not by every broker.
    from . import http

    await http.serve(broker, first4, reader, writer)


class _Sniffer(asyncio.Protocol):
    """A new connection until its first 4 bytes say what it is (§1.2)."""

    __slots__ = ("broker", "buffer", "timer", "transport")

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.buffer = b""
        self.timer: asyncio.TimerHandle | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        self.broker.opened(transport)
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.broker.settings.idle_sniff_timeout, transport.close)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) < 4:
            return
        assert self.timer is not None and self.transport is not None
        self.timer.cancel()
        first4, rest = self.buffer[:4], self.buffer[4:]
        _hand_over(self.broker, self.transport, first4, rest)

    def eof_received(self) -> bool:
        return False  # closed before saying what it is

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.transport is not None:
            self.broker.closed(self.transport)


def _hand_over(broker: Broker, transport: asyncio.Transport, first4: bytes, rest: bytes) -> None:
    mode = wire.sniff(first4)
    session: CommandSession | DataSession
    if mode is wire.Mode.CMD:
        session = CommandSession(broker, transport)
    elif mode in (wire.Mode.DATA, wire.Mode.PEER, wire.Mode.OLD_PEER):
        assert isinstance(mode, wire.Mode)
        session = DataSession(broker, mode, transport)
    elif mode == "http" and broker.http_handler is not None:
        broker.serve_http(transport, first4, rest, broker.http_handler)
        return
    else:
        log.info("closing connection with unknown preamble %s", first4.hex())
        transport.close()
        return
    transport.set_protocol(session)
    if rest:
        session.data_received(rest)


class _HttpProtocol(asyncio.StreamReaderProtocol):
    def __init__(
        self, broker: Broker, reader: asyncio.StreamReader, loop: asyncio.AbstractEventLoop
    ) -> None:
        super().__init__(reader, loop=loop)
        self._broker = broker
        self._conn: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._conn = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._conn is not None:
            self._broker.closed(self._conn)
            self._conn = None
