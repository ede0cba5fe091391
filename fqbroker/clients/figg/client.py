"""An asyncio Figg client: publish with ACKs, subscribe with resume (docs/figg-client.md).

:class:`FiggClient` is the asyncio shell around the sans-IO
:class:`~fqbroker.clients.figg.machine.FiggMachine`: the socket, one reader and one timer
task per connection, and a supervisor that reconnects with backoff whenever the connection
is lost, the broker sends garbage or two PINGs go unanswered. A broker that goes away is
logged, never raised; past ``inbox_limit`` received messages the client stops reading, so
a slow consumer costs the broker a full socket buffer, not this process unbounded memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from socket import AF_INET
from typing import Self

from fqbroker.clients.figg.machine import WINDOW, Acked, Backoff, FiggMachine, Message, as_topic
from fqbroker.clients.tls import client_ssl
from fqbroker.errors import ClientClosed, FqError

__all__ = ["DEFAULT_PORT", "FiggClient", "Message", "Subscription"]

log = logging.getLogger(__name__)

DEFAULT_PORT = 8119
INBOX_LIMIT = 10_000
READ_SIZE = 256 * 1024


@dataclass(eq=False)
class _Link:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class Subscription:
    """The messages of one topic, as an async iterator; it ends when the application
    unsubscribes or the client is closed."""

    def __init__(self, client: FiggClient, topic: bytes) -> None:
        self.client = client
        self.topic = topic
        self.ended = False
        self._queue: deque[Message] = deque()
        self._ready = asyncio.Event()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Message:
        queue = self._queue
        while not queue:
            if self.ended:
                raise StopAsyncIteration
            self._ready.clear()
            await self._ready.wait()
        msg = queue.popleft()
        self.client._taken()
        return msg

    @property
    def backlog(self) -> int:
        return len(self._queue)

    async def aclose(self) -> None:
        await self.client.unsubscribe(self.topic)

    def _put(self, msg: Message) -> None:
        self._queue.append(msg)
        self._ready.set()

    def _end(self) -> int:
        """No more messages; returns how many were left unread (dropped)."""
        self.ended = True
        self._ready.set()
        left = len(self._queue)
        self._queue.clear()
        return left


class FiggClient:
    """A Figg client. ``async with FiggClient(...) as c`` connects and closes."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        *,
        window: int = WINDOW,
        ping_interval: float = 2.0,
        missed_pings: int = 2,
        connect_timeout: float = 10.0,
        backoff: Backoff | None = None,
        inbox_limit: int = INBOX_LIMIT,
        tls: bool | ssl.SSLContext = False,
        cafile: str | Path | None = None,
        certfile: str | Path | None = None,
        keyfile: str | Path | None = None,
    ) -> None:
        self.host = host
        self.port = port
        # A listener with tls_cert set; a client certificate is the login under auth =
        # "password" (its subject CN the user).
        self.ssl = client_ssl(tls, cafile, certfile, keyfile)
        self.connect_timeout = connect_timeout
        self.backoff = backoff or Backoff()
        self.inbox_limit = inbox_limit
        self.machine = FiggMachine(window, ping_interval, missed_pings)
        self.connections = 0  # successful connects so far, reconnects included
        self._opened = False
        self._closed = False
        self._link: _Link | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._subs: dict[bytes, Subscription] = {}
        self._inbox = 0  # messages in every subscription's queue
        self._room = asyncio.Event()
        self._changed = asyncio.Event()  # replaced on every pulse; see _pulse()
        self._write_handle: asyncio.Handle | None = None

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def connected(self) -> bool:
        return self._link is not None

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def local_address(self) -> tuple[str, int] | None:
        """(host, port) of our end of the current connection; None while disconnected."""
        if self._link is None:
            return None
        address: tuple[str, int] = self._link.writer.get_extra_info("sockname")
        return address

    async def connect(self) -> None:
        """Open the first connection (``OSError``/``TimeoutError`` if that fails); later
        losses reconnect by themselves until ``close()``."""
        if self._opened:
            raise RuntimeError("connect() is called once")
        self._opened = True
        link = await self._open()
        self._supervisor = asyncio.create_task(self._supervise(link))

    async def wait_connected(self, newer_than: int = 0) -> int:
        """Wait for a connection numbered above ``newer_than``; returns its number."""
        while not (self.connected and self.connections > newer_than):
            if self._closed:
                raise ClientClosed("client is closed")
            await self._changed.wait()
        return self.connections

    # --- publishing -----------------------------------------------------------------------

    async def publish(self, topic: bytes | str, data: bytes) -> int:
        """Publish one message; waits while the window is full. Returns its seq number."""
        name = as_topic(topic)
        machine = self.machine
        while machine.window_full:
            if self._closed:
                raise ClientClosed("client is closed")
            await self._changed.wait()
        if self._closed:
            raise ClientClosed("client is closed")
        seq = machine.publish(name, data)
        self._schedule_write()
        return seq

    async def flush(self) -> None:
        """Wait until every publish so far is acknowledged, across reconnects."""
        machine = self.machine
        while machine.in_flight:
            if self._closed:
                raise ClientClosed("client is closed")
            await self._changed.wait()

    @property
    def in_flight(self) -> int:
        return self.machine.in_flight

    # --- subscribing ----------------------------------------------------------------------

    def subscribe(self, topic: bytes | str, offset: int | None = None) -> Subscription:
        """Attach to ``topic`` from ``offset`` (the messages after it; 0 is the start of the
        topic) or, with None, from the messages published from now on. Iterate the result."""
        if self._closed:
            raise ClientClosed("client is closed")
        name = as_topic(topic)
        self.machine.subscribe(name, offset)
        sub = self._subs[name] = Subscription(self, name)
        self._schedule_write()
        return sub

    async def unsubscribe(self, topic: bytes | str) -> None:
        """DETACH (without waiting for DETACHED) and end the topic's iterator."""
        name = as_topic(topic)
        sub = self._subs.pop(name, None)
        if sub is None:
            return
        self.machine.unsubscribe(name)
        self._inbox -= sub._end()
        self._room_check()
        self._write_now()

    def _taken(self) -> None:
        self._inbox -= 1
        self._room_check()

    def _room_check(self) -> None:
        if self._inbox < self.inbox_limit:
            self._room.set()

    # --- closing --------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the connection; unacknowledged publishes are abandoned (``flush()`` first)."""
        if self._closed:
            return
        self._closed = True
        self._room.set()
        if self._supervisor is not None:
            self._supervisor.cancel()
            await asyncio.wait([self._supervisor])
        if self._link is not None:
            await self._teardown(self._link)
        for sub in self._subs.values():
            sub._end()
        self._subs.clear()
        self._inbox = 0
        self._pulse()

    def _pulse(self) -> None:
        # Wake everyone waiting on the current event and give later waiters a fresh one.
        self._changed.set()
        self._changed = asyncio.Event()

    # --- the connection -------------------------------------------------------------------

    async def _open(self) -> _Link:
        # IPv4, as the fq client: "localhost" must not reach a broker over ::1.
        async with asyncio.timeout(self.connect_timeout):
            reader, writer = await asyncio.open_connection(
                self.host, self.port, family=AF_INET, ssl=self.ssl
            )
        link = _Link(reader, writer)
        self._link = link
        self.connections += 1
        self.machine.connection_made(time.monotonic())
        self._write_now()
        link.tasks = [
            asyncio.create_task(self._read(link)),
            asyncio.create_task(self._ping(link)),
        ]
        self._pulse()
        return link

    async def _supervise(self, link: _Link) -> None:
        while True:
            await asyncio.wait(link.tasks, return_when=asyncio.FIRST_COMPLETED)
            await self._teardown(link)
            link = await self._reconnect()

    async def _reconnect(self) -> _Link:
        while True:
            await asyncio.sleep(self.backoff.next())
            try:
                link = await self._open()
            except (OSError, TimeoutError) as exc:
                log.info("figg: reconnect to %s:%s failed: %r", self.host, self.port, exc)
                continue
            log.info("figg: reconnected to %s:%s", self.host, self.port)
            self.backoff.reset()  # the next loss starts from the shortest delay again
            return link

    async def _teardown(self, link: _Link) -> None:
        if self._link is link:
            self._link = None
            self.machine.connection_lost()
            self._pulse()
        for task in link.tasks:
            task.cancel()
        for result in await asyncio.gather(*link.tasks, return_exceptions=True):
            if isinstance(result, Exception):
                log.info("figg: connection to %s:%s lost: %r", self.host, self.port, result)
        link.writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(1):
                await link.writer.wait_closed()

    def _schedule_write(self) -> None:
        # One write per loop iteration, not one per publish.
        if self._link is not None and self._write_handle is None:
            self._write_handle = asyncio.get_running_loop().call_soon(self._write_now)

    def _write_now(self) -> None:
        self._write_handle = None
        link = self._link
        # A connection that is going (its teardown is on the way) gets nothing more:
        # asyncio warns about writes to a lost socket, and a reconnect re-sends it all.
        if (
            link is not None
            and not link.writer.is_closing()
            and (out := self.machine.data_to_send())
        ):
            link.writer.write(out)

    async def _read(self, link: _Link) -> None:
        machine = self.machine
        subs = self._subs
        while chunk := await link.reader.read(READ_SIZE):
            machine.receive_data(chunk)
            acked = False
            try:
                while (event := machine.next_event()) is not None:
                    if isinstance(event, Message):
                        if (sub := subs.get(event.topic)) is not None:
                            sub._put(event)
                            self._inbox += 1
                    elif isinstance(event, Acked):
                        acked = True
            except FqError as exc:
                log.warning("figg: bad frame from %s:%s: %s", self.host, self.port, exc)
                return
            finally:
                if acked:
                    self._pulse()
            # Stop reading while the application lags: the broker holds the rest.
            while self._inbox >= self.inbox_limit and not self._closed:
                self._room.clear()
                await self._room.wait()
                machine.heard()  # our own stall is no sign of a dead broker
        log.info("figg: %s:%s closed the connection", self.host, self.port)

    async def _ping(self, link: _Link) -> None:
        machine = self.machine
        while True:
            await asyncio.sleep(max(0.0, machine.next_tick() - time.monotonic()))
            if self._inbox >= self.inbox_limit:
                # Not reading: no PONG can arrive, and that is on us, not the broker.
                machine.heard()
            if not machine.tick(time.monotonic()):
                log.warning("figg: no answer to PINGs from %s:%s", self.host, self.port)
                return
            self._write_now()
