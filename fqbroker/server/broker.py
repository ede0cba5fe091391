"""The broker: one listening port, sessions told apart by their first 4 bytes.

This is fqd_listener.c plus the client and queue registry of fqd_config.c. A connection
says what it is in its first 4 bytes (:func:`fqbroker.frontends.fq.wire.sniff`): command and data
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
from typing import Any, cast

from fqbroker.config import Settings, resolve_node_id
from fqbroker.core.message import MsgIdCounter
from fqbroker.core.program import RuleRegistry, default_registry
from fqbroker.core.publisher import Publisher
from fqbroker.core.queue import Queue
from fqbroker.core.queuespec import QueueSpec
from fqbroker.core.router import ClientStats, Router
from fqbroker.frontends.fq import wire
from fqbroker.frontends.fq.command import LINGER_SECONDS, CommandSession
from fqbroker.frontends.fq.data import DataSession
from fqbroker.frontends.fq.peering import Peering
from fqbroker.server.connections import peer_address
from fqbroker.server.heartbeats import HeartbeatClock
from fqbroker.server.limits import Limits, install_exception_handler, raised_in_package
from fqbroker.storage.catalog import Catalog
from fqbroker.storage.state import ConfigStore

__all__ = ["Broker"]

log = logging.getLogger(__name__)

STOP_SECONDS = 5.0  # how long stop() waits for connections to flush and close

# The answer to an HTTP request over a connection limit (docs/limits.md).
SERVICE_UNAVAILABLE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"content-length: 34\r\nconnection: close\r\n\r\n"
    b'{"error": "too many connections"}\n'
)

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
        self.limits = Limits(self.settings, self.queues)
        log.info("Established %d exchanges, %d queues, %d bindings", *self.established)
        self.clients: dict[bytes, CommandSession] = {}
        self.msgids = MsgIdCounter()
        self.http_handler: HttpHandler | None = _serve_http
        self._server: asyncio.Server | None = None
        # Every open connection, to close at stop, with its source address when the
        # per-address limit needs it; a dict is smaller than a set.
        self._connections: dict[asyncio.Transport, str] = {}
        self._http_tasks: set[asyncio.Task[None]] = set()
        self._all_closed: asyncio.Event | None = None
        self._stopped = False
        self.heartbeats = HeartbeatClock()
        self.port = 0
        self.peering = Peering(
            self.settings, self.node_id, self.catalog.config.upstreams, self.make_publisher
        )
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
        loop = asyncio.get_running_loop()
        install_exception_handler(loop, self.limits, self._is_ours)
        self._server = await loop.create_server(
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
        if self._stopped:
            return
        self._stopped = True
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

    def opened(self, transport: asyncio.Transport) -> str | None:
        """Count a new connection; the limit it is over (docs/limits.md), or None."""
        address = peer_address(transport)[0] if self.limits.max_per_address > 0 else ""
        self._connections[transport] = address
        return self.limits.connection_opened(address)

    def closed(self, transport: asyncio.Transport) -> None:
        address = self._connections.pop(transport, None)
        if address is not None:
            self.limits.connection_closed(address)
        if not self._connections and self._all_closed is not None:
            self._all_closed.set()

    def _is_ours(self, context: dict[str, Any]) -> bool:
        """Whether an error asyncio reports came from this broker's connections or code."""
        if getattr(context.get("protocol"), "broker", None) is self:
            return True
        sock = context.get("socket")
        if sock is not None and self._server is not None:
            with contextlib.suppress(OSError):
                return sock.fileno() in {s.fileno() for s in self._server.sockets}
        exc = context.get("exception")
        return isinstance(exc, BaseException) and raised_in_package(exc)

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
        except Exception as exc:
            self.limits.bug(exc, "HTTP connection")
            writer.close()

    async def linger_close(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Send what is queued, then close without a reset.

        Closing with unread input makes the kernel send RST, which can destroy the error
        frame before the client reads it (§1.8). So: flush, half-close, and discard input
        for a moment so the client sees the frame and then a clean end of stream.
        """
        # OSError, not only ConnectionError: write_eof on a socket the peer reset
        # fails with ENOTCONN.
        with contextlib.suppress(OSError, TimeoutError):
            await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
            async with asyncio.timeout(LINGER_SECONDS):
                while await reader.read(65536):
                    pass
        writer.close()

    # --- clients and queues ---------------------------------------------------------------

    def attach(self, spec: QueueSpec, client: CommandSession) -> Queue:
        """The client's queue, found or created, within the user's limits (docs/limits.md)."""
        counted = self.limits.admit_queue(spec, client.user)
        queue = self.catalog.attach(spec, client)
        if counted:
            self.limits.charge(client.user, queue)
        return queue

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

    def make_publisher(self, stats: ClientStats | None = None) -> Publisher:
        """A publisher into this broker's router, for one connection or link."""
        return Publisher(self.router, self.catalog.flush_dirty, stats)

    def bind(self, exchange: bytes, program: bytes, queue: Queue, flags: int) -> int:
        return self.catalog.bind(exchange, program, queue, flags)

    def unbind(self, exchange: bytes, route_id: int, queue: Queue) -> bool:
        return self.catalog.unbind(exchange, route_id, queue)


async def _serve_http(
    broker: Broker, first4: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    # h11 and the HTTP front end are loaded by the first HTTP request, not by every broker.
    from fqbroker.frontends.http import endpoints

    await endpoints.serve(broker, first4, reader, writer)


class _Sniffer(asyncio.Protocol):
    """A new connection until its first 4 bytes say what it is (§1.2)."""

    __slots__ = ("broker", "buffer", "refused", "timer", "transport")

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.buffer: bytes | None = b""
        self.refused: str | None = None  # the limit this connection is over
        self.timer: asyncio.TimerHandle | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        self.refused = self.broker.opened(transport)
        # One over a limit gets a moment to say what it is, for the right answer.
        wait = LINGER_SECONDS if self.refused else self.broker.settings.idle_sniff_timeout
        self.timer = asyncio.get_running_loop().call_later(wait, transport.close)

    def data_received(self, data: bytes) -> None:
        if self.buffer is None:
            return  # refused: what follows is read and thrown away until the close
        self.buffer += data
        if len(self.buffer) < 4:
            return
        assert self.timer is not None and self.transport is not None
        self.timer.cancel()
        first4, rest = self.buffer[:4], self.buffer[4:]
        if self.refused:
            self.buffer = None
            self.timer = _refuse(self.broker, self.transport, first4, self.refused)
            return
        _hand_over(self.broker, self.transport, first4, rest)

    def eof_received(self) -> bool:
        return False  # closed before saying what it is

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.transport is not None:
            self.broker.closed(self.transport)


def _refuse(
    broker: Broker, transport: asyncio.Transport, first4: bytes, reason: str
) -> asyncio.TimerHandle:
    """Turn away a connection over a limit: a 503 for HTTP, a close for fq (§1.9's way
    with unknown input). The HTTP answer lingers a moment so a reset cannot destroy it."""
    address, port = peer_address(transport)
    if wire.sniff(first4) == "http":
        from fqbroker.frontends.http.stats import http_counters

        http_counters(broker).responses[503] += 1
        transport.write(SERVICE_UNAVAILABLE)
        with contextlib.suppress(OSError):
            transport.write_eof()
    else:
        transport.close()
    broker.limits.refuse(reason, "refusing connection from %s:%d: over %s", address, port, reason)
    return asyncio.get_running_loop().call_later(LINGER_SECONDS, transport.close)


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
        broker.limits.bad("preamble", "closing connection with unknown preamble %s", first4.hex())
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
        self.broker = broker  # what the exception handler asks a protocol for
        self._conn: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._conn = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._conn is not None:
            self.broker.closed(self._conn)
            self._conn = None
