"""An asyncio fq client: one command socket and one data socket per connection (fq_client.c).

:class:`Client` is the asyncio shell (sockets, tasks, timers, reconnects) around the sans-IO
:class:`~fqbroker.clients.fq.channel.CommandChannel`, importable from here too. Reconnects
follow libfq: a backoff from 16 ms doubling to 1 s with a few ms of jitter, then a new auth
(so a new key) and a new data socket. Where libfq leaves re-binding to the application's
auth callback, this client re-sends every binding the application made, before the
messages published while it was away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from socket import AF_INET
from typing import Self

from fqbroker.clients.fq.channel import (
    Authenticated,
    CommandChannel,
    Name,
    Refused,
    Reply,
    Request,
    as_bytes,
    parse_source,
)
from fqbroker.clients.tls import client_ssl
from fqbroker.core.message import Message, MsgIdCounter
from fqbroker.errors import ClientClosed, ClientError, FqError
from fqbroker.protocols.fq import wire
from fqbroker.protocols.fq.msgdecoder import MessageDecoder

__all__ = ["Authenticated", "Client", "ClientClosed", "ClientError", "CommandChannel"]
__all__ += ["Name", "Refused", "Reply", "parse_source"]

log = logging.getLogger(__name__)

# What every fq tool sets with fq_client_set_backlog (docs/fq-protocol.md §6.2).
DEFAULT_BACKLOG = 10000
INBOX_LIMIT = 10000  # received messages held before we stop reading the data socket
BACKOFF_START = 0.016
BACKOFF_MAX = 1.0
JITTER = 0.004
READ_SIZE = 256 * 1024
GOODBYE_SECONDS = 2.0

# One counter per process, as libfq has: ids stay unique across clients
# (docs/fq-protocol.md §1.11).
_MSGIDS = MsgIdCounter()


class _State(Enum):
    NEW = "new"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


@dataclass(eq=False)
class _Link:
    """One authenticated pair of sockets; a reconnect replaces it as a whole."""

    channel: CommandChannel[asyncio.Future[wire.Frame]]
    cmd_r: asyncio.StreamReader
    cmd_w: asyncio.StreamWriter
    data_r: asyncio.StreamReader
    data_w: asyncio.StreamWriter
    last_heard: float = field(default_factory=time.monotonic)
    ready: bool = False  # bindings restored: publishing goes straight to the socket
    written: int = 0  # messages written on this data socket: what a confirm counts
    confirms: bool | None = None  # whether the broker announced confirms; None: not asked
    tasks: list[asyncio.Task[None]] = field(default_factory=list)  # reader tasks first

    @property
    def data_reader(self) -> asyncio.Task[None]:
        return self.tasks[1]


@dataclass(eq=False)
class _Binding:
    exchange: bytes
    program: bytes
    flags: int
    first_id: int  # what bind() returned; unbind() accepts it after a reconnect too
    route_id: int  # the id on the current connection


class Client:
    """An fq client. ``async with Client(...) as c`` connects and closes."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8765,
        source: Name = "user",
        password: Name = "pass",
        heartbeat_ms: int = 0,
        reconnect: bool = True,
        *,
        backlog: int = DEFAULT_BACKLOG,
        connect_timeout: float = 10.0,
        peer_id: bytes | None = None,
        tls: bool | ssl.SSLContext = False,
        cafile: str | Path | None = None,
        certfile: str | Path | None = None,
        keyfile: str | Path | None = None,
        dedup: bool = False,
    ) -> None:
        if not 0 <= heartbeat_ms <= 0xFFFF:
            raise ValueError("heartbeat_ms is a u16")
        self.host = host
        self.port = port
        self.user, self.queue_field = parse_source(source)
        self.password = as_bytes(password)
        self.heartbeat_ms = heartbeat_ms
        self.reconnect = reconnect
        self.backlog = backlog
        self.connect_timeout = connect_timeout
        # A broker pulling from another opens its data channel in peer mode with its node id
        # (docs/fq-protocol.md §5.2): the upstream then withholds messages that already
        # passed through it.
        if peer_id is not None and len(peer_id) != 4:
            raise ValueError("a peer id is a 4-byte IPv4 address")
        self.peer_id = peer_id
        # Both channels over TLS when ``tls`` (or a CA file) says so; the broker's
        # certificate is checked against the system's CAs or only ``cafile``'s; a client
        # certificate (``certfile``) is presented to a server that asks for one.
        self.ssl = client_ssl(tls, cafile, certfile, keyfile)
        # Ask the broker to drop messages whose ids a queue already took (docs/confirms.md,
        # "Exactly once"): publish the same message with the same id, and it is stored
        # once. Messages published without an id get one of this client's own, unique
        # across processes (a random prefix, then a count).
        self.dedup = dedup
        self._dedup_prefix = os.urandom(8)
        self._dedup_count = 0
        self.connections = 0  # successful connects so far, reconnects included
        self.dropped = 0  # messages refused because the backlog was full
        self._state = _State.NEW
        self._link: _Link | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._bindings: list[_Binding] = []
        self._pending: list[bytes] = []  # published frames not yet handed to a socket
        self._write_handle: asyncio.Handle | None = None
        self._inbox: deque[Message] = deque()
        self._inbox_ready = asyncio.Event()
        self._inbox_room = asyncio.Event()
        self._changed = asyncio.Event()  # replaced on every pulse; see _pulse()

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def connected(self) -> bool:
        return self._link is not None and self._link.ready

    @property
    def closed(self) -> bool:
        return self._state in (_State.CLOSING, _State.CLOSED)

    @property
    def received_backlog(self) -> int:
        """Messages received and not yet taken by ``receive()``."""
        return len(self._inbox)

    async def connect(self) -> None:
        """Connect, authenticate and pair the data socket; ``ClientError`` on refusal."""
        if self._state is not _State.NEW:
            raise RuntimeError("connect() is called once")
        async with asyncio.timeout(self.connect_timeout):
            link = await self._open()
        self._state = _State.OPEN
        self._install(link)
        link.ready = True
        self.connections += 1
        self._write_pending()  # anything published before connect()
        self._pulse()
        self._supervisor = asyncio.create_task(self._supervise(link))

    async def wait_connected(self, newer_than: int = 0) -> int:
        """Wait for a ready connection numbered above ``newer_than``; returns its number."""
        while not (self.connected and self.connections > newer_than):
            if self.closed:
                raise ClientClosed("client is closed")
            await self._changed.wait()
        return self.connections

    # --- commands -------------------------------------------------------------------------

    async def bind(self, exchange: Name, program: Name, flags: int = wire.BindFlags.TRANS) -> int:
        """Bind our queue to ``exchange``; the route id, or ``BIND_ILLEGAL`` on failure.

        The binding is remembered and made again after every reconnect.
        """
        exchange, program = as_bytes(exchange), as_bytes(program)
        reply = await self._request(wire.BindRequest(flags, exchange, program))
        assert isinstance(reply, wire.BindResponse)
        route_id = reply.route_id
        if route_id != wire.BIND_ILLEGAL and not any(
            b.route_id == route_id and b.exchange == exchange for b in self._bindings
        ):
            self._bindings.append(_Binding(exchange, program, flags, route_id, route_id))
        return route_id

    async def unbind(self, exchange: Name, route_id: int) -> bool:
        exchange = as_bytes(exchange)
        binding = self._find_binding(exchange, route_id)
        current = binding.route_id if binding else route_id
        reply = await self._request(wire.UnbindRequest(current, exchange))
        assert isinstance(reply, wire.UnbindResponse)
        if binding is not None:
            self._bindings.remove(binding)
        return reply.route_id != wire.BIND_ILLEGAL

    def _find_binding(self, exchange: bytes, route_id: int) -> _Binding | None:
        mine = [b for b in self._bindings if b.exchange == exchange]
        found = [b for b in mine if b.route_id == route_id]
        found += [b for b in mine if b.first_id == route_id]
        return found[0] if found else None

    async def status(self) -> dict[str, int]:
        """The broker's counters for this client, in fq's order
        (docs/fq-protocol.md §1.6)."""
        reply = await self._request(wire.StatusRequest())
        assert isinstance(reply, wire.Status)
        return reply.as_dict()

    async def confirm(self) -> int:
        """Wait until the broker has routed every message published so far and made it
        durable (docs/confirms.md); returns how many messages the confirm covers.

        Raises ``ClientError`` with the broker's reason when it cannot confirm them, and
        ``ConnectionError`` when the connection was replaced meanwhile: messages written on
        the old one are not covered and should be sent again.
        """
        connection = self.connections
        await self.flush()
        link = self._link
        if link is None or self.connections != connection:
            raise ConnectionError("reconnected: earlier messages are not confirmed")
        if link.confirms is None:
            status = await self._request(wire.StatusRequest(), link)
            assert isinstance(status, wire.Status)
            link.confirms = wire.CONFIRM_STATUS_KEY in status.as_dict()
        if not link.confirms:
            raise ClientError("the broker does not support publisher confirms")
        reply = await self._request(wire.ConfirmRequest(link.written), link)
        if self._link is not link:
            raise ConnectionError("reconnected: earlier messages are not confirmed")
        if isinstance(reply, wire.ConfirmFailed):
            raise ClientError(reply.text)
        assert isinstance(reply, wire.Confirmed)
        return reply.count

    async def _request(self, frame: Request, link: _Link | None = None) -> wire.Frame:
        if self.closed:
            raise ClientClosed("client is closed")
        link = link or self._link
        if link is None:
            raise ConnectionError("not connected")
        future: asyncio.Future[wire.Frame] = asyncio.get_running_loop().create_future()
        link.cmd_w.write(link.channel.request(frame, future))
        return await future

    # --- messages -------------------------------------------------------------------------

    def publish(
        self, exchange: Name, route: Name, payload: bytes, msgid: bytes | None = None
    ) -> bool:
        """Queue one message for the data socket; ``flush()`` waits until it is written.

        While disconnected, up to ``backlog`` messages wait for the next connection; past
        that, messages are dropped: the result is False and ``dropped`` counts them. As
        with libfq, what was already written to a socket that then fails is lost.
        """
        if self.closed:
            raise ClientClosed("client is closed")
        if isinstance(exchange, str):
            exchange = exchange.encode()
        if isinstance(route, str):
            route = route.encode()
        if len(exchange) > wire.MAX_RK_LEN or len(route) > wire.MAX_RK_LEN:
            raise ValueError("exchange and route are at most 127 bytes")
        if msgid is not None and len(msgid) != 16:
            raise ValueError("a message id is 16 bytes")
        if not self.connected and len(self._pending) >= self.backlog:
            self.dropped += 1
            return False
        if msgid is None:
            msgid = self._own_id() if self.dedup else _MSGIDS.next()
        msg = Message(exchange, route, payload, msgid, sender=self.user)
        # A peer channel carries the peer format both ways (docs/fq-protocol.md §5.3: fqd
        # gets this wrong).
        frame = msg.publish_frame() if self.peer_id is None else msg.peer_frame()
        self._pending.append(frame)
        if self.connected and self._write_handle is None:
            # One write per loop iteration, not one per message.
            self._write_handle = asyncio.get_running_loop().call_soon(self._write_pending)
        return True

    def _own_id(self) -> bytes:
        self._dedup_count += 1
        return self._dedup_prefix + self._dedup_count.to_bytes(8, "big")

    def _write_pending(self) -> None:
        self._write_handle = None
        link = self._link
        if self._pending and link is not None and link.ready and not link.data_w.is_closing():
            link.data_w.write(b"".join(self._pending))
            link.written += len(self._pending)
            self._pending.clear()

    async def flush(self) -> None:
        """Wait until every published message is written, reconnecting if need be."""
        while True:
            await self.wait_connected()
            link = self._link
            assert link is not None
            self._write_pending()
            if not self._pending:
                try:
                    await link.data_w.drain()
                    return
                except ConnectionError:
                    pass  # the supervisor notices too and reconnects
            if self._link is link:
                await self._changed.wait()

    async def receive(self) -> Message:
        """The next message from our queue; ``ClientClosed`` once closed and drained."""
        return (await self.receive_many(1))[0]

    async def receive_many(self, limit: int) -> list[Message]:
        """Up to ``limit`` messages, waiting only for the first; ``ClientClosed`` as receive()."""
        inbox = self._inbox
        while not inbox:
            if self.closed:
                raise ClientClosed("client is closed")
            self._inbox_ready.clear()
            await self._inbox_ready.wait()
        batch = [inbox.popleft() for _ in range(min(limit, len(inbox)))]
        if len(inbox) < INBOX_LIMIT:
            self._inbox_room.set()
        return batch

    async def messages(self) -> AsyncIterator[Message]:
        """Every message from our queue until the client is closed."""
        while True:
            try:
                yield await self.receive()
            except ClientClosed:
                return

    # --- closing --------------------------------------------------------------------------

    async def close(self) -> None:
        """Close both sockets; published messages are written first if connected."""
        if self.closed:
            return
        self._state = _State.CLOSING
        self._inbox_room.set()
        if self._supervisor is not None:
            self._supervisor.cancel()
            await asyncio.wait([self._supervisor])
        link = self._link
        if link is not None and link.ready:
            # Half-close the data socket and wait for the broker to close its end: then it
            # has read everything we sent. Closing the command socket first would let the
            # broker end the session, data socket included, with our last messages unread.
            self._write_pending()
            with contextlib.suppress(ConnectionError, RuntimeError):
                if link.data_w.can_write_eof():
                    link.data_w.write_eof()
                    await asyncio.wait([link.data_reader], timeout=GOODBYE_SECONDS)
                else:
                    # TLS has no half-close: its close_notify is the EOF, and closing waits
                    # for the broker's close_notify, sent once it has read up to ours.
                    link.data_w.close()
                    with contextlib.suppress(OSError, TimeoutError):
                        async with asyncio.timeout(GOODBYE_SECONDS):
                            await link.data_w.wait_closed()
        if link is not None:
            await self._teardown(link)
        self._finish()

    def _finish(self) -> None:
        self._state = _State.CLOSED
        self._inbox_ready.set()
        self._pulse()

    def _pulse(self) -> None:
        # Wake everyone waiting on the current event and give later waiters a fresh one.
        self._changed.set()
        self._changed = asyncio.Event()

    # --- connection life cycle ------------------------------------------------------------

    async def _open(self) -> _Link:
        # IPv4 only, as libfq (sockaddr_in): hops carry IPv4 addresses, and "localhost"
        # must not reach a broker over ::1.
        cmd_r, cmd_w = await asyncio.open_connection(
            self.host, self.port, family=AF_INET, ssl=self.ssl
        )
        data_w: asyncio.StreamWriter | None = None
        try:
            channel: CommandChannel[asyncio.Future[wire.Frame]] = CommandChannel()
            cmd_w.write(channel.hello(self.user, self.queue_field, self.password))
            while not isinstance(event := channel.next_event(), Authenticated):
                if isinstance(event, Refused):
                    raise ClientError(event.text)
                if not (chunk := await cmd_r.read(READ_SIZE)):
                    raise ConnectionError("connection closed during auth")
                channel.receive_data(chunk)
            key = event.key
            if self.dedup:
                # Before the data socket opens, so that its every message is covered.
                await self._ask_dedup(channel, cmd_r, cmd_w)
            if self.heartbeat_ms:
                cmd_w.write(wire.encode(wire.HeartbeatRequest(self.heartbeat_ms)))
            data_r, data_w = await asyncio.open_connection(
                self.host, self.port, family=AF_INET, ssl=self.ssl
            )
            if self.peer_id is None:
                data_w.write(wire.encode_hello(wire.Mode.DATA, key))
            else:
                data_w.write(wire.encode_hello(wire.Mode.PEER, key, self.peer_id))
        except BaseException:
            cmd_w.close()
            if data_w is not None:
                data_w.close()
            raise
        return _Link(channel, cmd_r, cmd_w, data_r, data_w)

    @staticmethod
    async def _ask_dedup(
        channel: CommandChannel[asyncio.Future[wire.Frame]],
        cmd_r: asyncio.StreamReader,
        cmd_w: asyncio.StreamWriter,
    ) -> None:
        """Status first: fqd, and a broker without the extension, would end the session on
        a request it does not know."""
        loop = asyncio.get_running_loop()
        for request in (wire.StatusRequest(), wire.DedupRequest()):
            future: asyncio.Future[wire.Frame] = loop.create_future()
            cmd_w.write(channel.request(request, future))
            while not isinstance(event := channel.next_event(), Reply):
                if out := channel.data_to_send():
                    cmd_w.write(out)
                if not (chunk := await cmd_r.read(READ_SIZE)):
                    raise ConnectionError("connection closed before de-duplication was on")
                channel.receive_data(chunk)
            frame = event.frame
            if isinstance(frame, wire.Status) and wire.DEDUP_STATUS_KEY not in frame.as_dict():
                raise ClientError("the broker does not de-duplicate by message id")

    def _install(self, link: _Link) -> None:
        self._link = link
        link.tasks = [
            asyncio.create_task(self._read_commands(link)),
            asyncio.create_task(self._read_messages(link)),
        ]
        if self.heartbeat_ms:
            link.tasks.append(asyncio.create_task(self._heartbeats(link)))

    async def _supervise(self, link: _Link) -> None:
        while True:
            await asyncio.wait(link.tasks, return_when=asyncio.FIRST_COMPLETED)
            await self._teardown(link)
            if not self.reconnect:
                self._finish()
                return
            link = await self._reconnect()

    async def _reconnect(self) -> _Link:
        delay = BACKOFF_START
        while True:
            await asyncio.sleep(delay + random.uniform(-JITTER, JITTER))
            delay = min(delay * 2, BACKOFF_MAX)
            link = None
            try:
                async with asyncio.timeout(self.connect_timeout):
                    link = await self._open()
                    self._install(link)
                    await self._restore(link)
            except (OSError, FqError, TimeoutError) as exc:
                log.info("reconnect to %s:%s failed: %r", self.host, self.port, exc)
                if link is not None:
                    await self._teardown(link)
                continue
            self.connections += 1
            self._pulse()
            log.info("reconnected to %s:%s", self.host, self.port)
            return link

    async def _restore(self, link: _Link) -> None:
        """Re-bind everything (pipelined), then send what was published meanwhile."""
        bindings = list(self._bindings)
        requests = [wire.BindRequest(b.flags, b.exchange, b.program) for b in bindings]
        replies = await asyncio.gather(*(self._request(r, link) for r in requests))
        for binding, reply in zip(bindings, replies, strict=True):
            assert isinstance(reply, wire.BindResponse)
            if reply.route_id == wire.BIND_ILLEGAL:
                log.warning("re-bind of %r %r failed", binding.exchange, binding.program)
            binding.route_id = reply.route_id
        link.ready = True
        self._write_pending()

    async def _teardown(self, link: _Link) -> None:
        if self._link is link:
            self._link = None
            self._pulse()
        try:
            for task in link.tasks:
                task.cancel()
            for result in await asyncio.gather(*link.tasks, return_exceptions=True):
                if isinstance(result, Exception):
                    log.info("connection to %s:%s lost: %r", self.host, self.port, result)
        finally:
            _fail(link.channel, "connection lost")
            link.cmd_w.close()
            link.data_w.close()
            with contextlib.suppress(OSError, TimeoutError):
                async with asyncio.timeout(1):
                    await asyncio.gather(link.cmd_w.wait_closed(), link.data_w.wait_closed())

    async def _read_commands(self, link: _Link) -> None:
        channel = link.channel
        try:
            while True:
                while (event := channel.next_event()) is not None:
                    if isinstance(event, Reply) and not event.token.done():
                        event.token.set_result(event.frame)
                if out := channel.data_to_send():
                    link.cmd_w.write(out)
                chunk = await link.cmd_r.read(READ_SIZE)
                if not chunk:
                    return
                link.last_heard = time.monotonic()
                channel.receive_data(chunk)
        finally:
            _fail(channel, "command connection lost")

    async def _read_messages(self, link: _Link) -> None:
        decoder = MessageDecoder(peer_format=True)
        while chunk := await link.data_r.read(READ_SIZE):
            decoder.feed(chunk)
            self._inbox.extend(decoder.messages())
            self._inbox_ready.set()
            if decoder.error_pending:
                decoder.messages()  # raises: what came before the bad frame is delivered
            # Stop reading while the application lags: the broker's queue takes the strain.
            while len(self._inbox) >= INBOX_LIMIT and self._state is _State.OPEN:
                self._inbox_room.clear()
                await self._inbox_room.wait()

    async def _heartbeats(self, link: _Link) -> None:
        interval = self.heartbeat_ms / 1000
        while True:
            await asyncio.sleep(interval)
            if time.monotonic() - link.last_heard > 3 * interval:
                raise ConnectionError("no heartbeat from the broker")
            link.cmd_w.write(wire.encode(wire.Heartbeat()))


def _fail(channel: CommandChannel[asyncio.Future[wire.Frame]], why: str) -> None:
    for future in channel.abandon():
        if not future.done():
            future.set_exception(ConnectionError(why))
