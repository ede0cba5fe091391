"""An asyncio fyrehose client: subscribe with gap recovery, publish with confirmation
(docs/fyrehose-client.md).

:class:`FyrehoseClient` is the asyncio shell around the sans-IO
:class:`~fqbroker.clients.fyrehose.machine.FyrehoseMachine`: one unconnected datagram
endpoint (DELIVERs come from the broker and from journaling clients alike, and a journal
answers FORWARDs to any address) and one timer task that calls the machine's ``tick`` when
it asks to be. UDP cannot push back, so what the application has not taken waits in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import deque
from typing import Self

from fqbroker.clients.fyrehose.machine import (
    Address,
    Confirmed,
    Delivered,
    FyrehoseMachine,
    Lost,
    Stats,
)
from fqbroker.errors import FyrehoseClosed

__all__ = ["CONNECT_TIMEOUT", "DEFAULT_PORT", "Delivered", "FyrehoseClient", "FyrehoseClosed"]

log = logging.getLogger(__name__)

DEFAULT_PORT = 2323  # the seed's example port; the broker's listener has no default
CONNECT_TIMEOUT = 5.0
RECEIVE_BUFFER = 8 << 20  # asked for; the kernel caps it at net.core.rmem_max


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, client: FyrehoseClient) -> None:
        self.client = client

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self.client._received(data, (str(addr[0]), int(addr[1])))

    def error_received(self, exc: Exception) -> None:
        # An ICMP error for something we sent (a journal answering a requester that went
        # away, say): UDP carries on, and the machine's timers retry what matters.
        log.debug("fyrehose: %r", exc)


class FyrehoseClient:
    """A fyrehose client; make one with :meth:`connect`, end it with :meth:`close`."""

    def __init__(self, machine: FyrehoseMachine) -> None:
        self.machine = machine
        self._transport: asyncio.DatagramTransport | None = None
        self._inbox: deque[Delivered] = deque()
        self._ready = asyncio.Event()
        self._wake = asyncio.Event()
        self._acked = asyncio.Event()
        self._sleeping_until = 0.0
        self._futures: dict[int, asyncio.Future[int | None]] = {}
        self._timer: asyncio.Task[None] | None = None
        self._closed = False
        self.local_address: tuple[str, int] = ("0.0.0.0", 0)

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        *,
        subscribe: bool = True,
        journal_messages: int = 0,
        start: int | None = None,
        local_addr: tuple[str, int] = ("127.0.0.1", 0),
        gap_seconds: float = 10.0,
        publish_timeout: float = 2.0,
        connect_timeout: float = CONNECT_TIMEOUT,
    ) -> FyrehoseClient:
        """Bind ``local_addr``, send KEEPALIVE and wait for the broker's KEEPALIVE-ACK
        (``TimeoutError`` after ``connect_timeout``: UDP has no other sign of a broker).
        ``OSError`` if the name does not resolve or the address cannot be bound."""
        loop = asyncio.get_running_loop()
        # IPv4 only: fyrehose addresses are 4 bytes.
        infos = await loop.getaddrinfo(host, port, family=socket.AF_INET, type=socket.SOCK_DGRAM)
        broker: Address = (str(infos[0][4][0]), int(infos[0][4][1]))
        machine = FyrehoseMachine(
            broker,
            now=time.monotonic(),
            subscribe=subscribe,
            journal_messages=journal_messages,
            start=start,
            gap_seconds=gap_seconds,
            publish_timeout=publish_timeout,
        )
        client = cls(machine)
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _Protocol(client), local_addr=local_addr, family=socket.AF_INET
        )
        client._transport = transport
        sock = transport.get_extra_info("socket")
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        name = transport.get_extra_info("sockname")
        client.local_address = (str(name[0]), int(name[1]))
        client._timer = asyncio.create_task(client._run_timers())
        try:
            async with asyncio.timeout(connect_timeout):
                await client._acked.wait()
        except BaseException:
            await client.close()
            raise
        return client

    # --- receiving ------------------------------------------------------------------------

    async def next(self) -> Delivered:
        """The next message of the stream, in order and once; ``FyrehoseClosed`` once
        closed. A range given up on is skipped and listed in :attr:`lost`."""
        while not self._inbox:
            if self._closed:
                raise FyrehoseClosed()
            self._ready.clear()
            await self._ready.wait()
        if self._closed:
            raise FyrehoseClosed()
        return self._inbox.popleft()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Delivered:
        """As :meth:`next`; iteration ends when the client is closed."""
        try:
            return await self.next()
        except FyrehoseClosed:
            raise StopAsyncIteration from None

    @property
    def lost(self) -> list[tuple[int, int]]:
        """The ranges given up on (inclusive), in stream order."""
        return self.machine.lost

    @property
    def stats(self) -> Stats:
        return self.machine.stats

    @property
    def backlog(self) -> int:
        """Messages received and not taken by the application yet."""
        return len(self._inbox)

    # --- publishing -----------------------------------------------------------------------

    def publish_nowait(self, data: bytes) -> asyncio.Future[int | None]:
        """Send ``data`` now; the future is its sequence once it came back in the stream
        (None at once for a client that does not subscribe: it cannot see it). It is sent
        again every ``publish_timeout`` until then (at least once)."""
        if self._closed:
            raise FyrehoseClosed()
        publish_id = self.machine.publish(bytes(data), time.monotonic())
        future: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self._futures[publish_id] = future
        self._pump()
        return future

    async def publish(self, data: bytes) -> int | None:
        """:meth:`publish_nowait` and wait for the result."""
        return await self.publish_nowait(data)

    # --- closing --------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop: tell the broker (a NOSUBSCRIBE KEEPALIVE, so it stops sending now), close
        the socket; waiting publishes and readers get ``FyrehoseClosed``."""
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            await asyncio.wait([self._timer])
        transport = self._transport
        if transport is not None and not transport.is_closing():
            if self.machine.subscribe:
                self.machine.goodbye()
            self._send()
            transport.close()
        for future in self._futures.values():
            if not future.done():
                future.set_exception(FyrehoseClosed())
                future.exception()  # retrieved: nobody may be waiting for it
        self._futures.clear()
        self._inbox.clear()
        self._ready.set()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- the machine ----------------------------------------------------------------------

    def _received(self, data: bytes, source: Address) -> None:
        if self._closed:
            return
        acks = self.machine.stats.acks
        self.machine.receive(data, source, time.monotonic())
        if self.machine.stats.acks != acks:
            self._acked.set()
        self._pump()

    def _pump(self) -> None:
        """Hand out the machine's events and datagrams; wake the timer if it must run
        sooner than it planned (a new gap, a publish)."""
        machine = self.machine
        while (event := machine.next_event()) is not None:
            if isinstance(event, Delivered):
                self._inbox.append(event)
                self._ready.set()
            elif isinstance(event, Confirmed):
                future = self._futures.pop(event.publish_id, None)
                if future is not None and not future.done():
                    future.set_result(event.seq)
            elif isinstance(event, Lost):
                log.info("fyrehose: gave up on messages %d to %d", event.from_seq, event.to_seq)
        self._send()
        if machine.next_tick() < self._sleeping_until:
            self._wake.set()

    def _send(self) -> None:
        transport = self._transport
        out = self.machine.datagrams_to_send()
        if transport is None or transport.is_closing():
            return
        for datagram, address in out:
            transport.sendto(datagram, address)

    async def _run_timers(self) -> None:
        machine = self.machine
        while True:
            delay = machine.next_tick() - time.monotonic()
            if delay > 0:
                self._sleeping_until = time.monotonic() + delay
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
                self._sleeping_until = 0.0
            machine.tick(time.monotonic())
            self._pump()
