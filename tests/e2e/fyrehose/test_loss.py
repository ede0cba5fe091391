"""The loss acceptance test of the fyrehose backbone.

Subscribers sit behind a lossy relay written here: per client, a socket the client talks to
and a socket toward the broker (the broker's subscriber is that upstream socket, since the
client's KEEPALIVE names 0.0.0.0). The relay drops 5 % of datagrams each way with a seeded
``random.Random`` and holds some others back for a few milliseconds, so they arrive out of
order. Every subscriber must still receive every message of the run exactly once and in
order: from the broker's retained window in the first case, and with the window made tiny,
through journaling subscribers answering the broker's FORWARDs in the second.

The publisher is a direct client that PUSHes and waits for each message's echo, with a
bounded number in flight, and does not run ahead of the slowest subscriber by more than
``LEAD`` messages: everything runs on one event loop, and unpaced UDP on loopback only
overflows receive buffers (which the clients would recover from, but the run would measure
buffer overflow rather than the relay's loss).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import socket
from collections.abc import AsyncIterator
from typing import Any

from fqbroker.clients.fyrehose.client import Delivered, FyrehoseClient
from fqbroker.frontends.fyrehose.backbone import Backbone
from fqbroker.frontends.fyrehose.settings import Fyrehose
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import running

LOSS = 0.05
DELAY = 0.05  # the share of datagrams held back (reordered)
MAX_DELAY = 0.02
IN_FLIGHT = 64  # publishes not yet echoed: the broker's receive buffer is not ours to size
LEAD = 4000  # how far the publisher may run ahead of the slowest subscriber
BUFFER = 8 << 20
DEADLINE = 120.0  # a bound on each wait, never a speed assertion


Address = tuple[str, int]


class _Side(asyncio.DatagramProtocol):
    def __init__(self, relay: LossyRelay, upstream: bool) -> None:
        self.relay = relay
        self.upstream = upstream

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER)

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        if self.upstream:
            self.relay.from_broker(data)
        else:
            self.relay.from_client(data, (str(addr[0]), int(addr[1])))


class LossyRelay:
    """One client's path to the broker, losing ``LOSS`` of datagrams each way."""

    def __init__(self, broker: Address, rng: random.Random) -> None:
        self.broker = broker
        self.rng = rng
        self.client: Address | None = None
        self.front: asyncio.DatagramTransport | None = None  # the client's side
        self.back: asyncio.DatagramTransport | None = None  # the broker's side
        self.passed = [0, 0]  # toward the broker, toward the client
        self.dropped = [0, 0]
        self.delayed = [0, 0]

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.front, _ = await loop.create_datagram_endpoint(
            lambda: _Side(self, False), local_addr=("127.0.0.1", 0)
        )
        self.back, _ = await loop.create_datagram_endpoint(
            lambda: _Side(self, True), local_addr=("127.0.0.1", 0)
        )

    @property
    def address(self) -> Address:
        assert self.front is not None
        host, port = self.front.get_extra_info("sockname")[:2]
        return str(host), int(port)

    def from_client(self, data: bytes, source: Address) -> None:
        self.client = source
        assert self.back is not None
        self._pass(0, self.back, data, self.broker)

    def from_broker(self, data: bytes) -> None:
        # The broker's DELIVERs, ACKs and answers, and journaling clients' DELIVERs.
        if self.client is not None:
            assert self.front is not None
            self._pass(1, self.front, data, self.client)

    def _pass(self, way: int, out: asyncio.DatagramTransport, data: bytes, to: Address) -> None:
        draw = self.rng.random()
        if draw < LOSS:
            self.dropped[way] += 1
            return
        self.passed[way] += 1
        if draw < LOSS + DELAY:
            self.delayed[way] += 1
            asyncio.get_running_loop().call_later(
                self.rng.uniform(0.001, MAX_DELAY), self._send, out, data, to
            )
        else:
            out.sendto(data, to)

    @staticmethod
    def _send(out: asyncio.DatagramTransport, data: bytes, to: Address) -> None:
        if not out.is_closing():
            out.sendto(data, to)

    def close(self) -> None:
        for side in (self.front, self.back):
            if side is not None:
                side.close()


@contextlib.asynccontextmanager
async def backbone(settings: Settings, **values: Any) -> AsyncIterator[tuple[Broker, Backbone]]:
    settings.set_section(dataclasses.replace(Fyrehose(), listen="127.0.0.1:0", **values))
    async with running(settings) as broker:
        state = broker.front_ends["fyrehose"].state
        assert isinstance(state, Backbone)
        yield broker, state


def fyrehose_address(broker: Broker) -> Address:
    address = broker.front_ends["fyrehose"].address
    assert address is not None
    return str(address[0]), int(address[1])


class Reader:
    """Takes ``total`` messages from a client as the application would."""

    def __init__(self, client: FyrehoseClient, total: int) -> None:
        self.client = client
        self.total = total
        self.got: list[Delivered] = []
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while len(self.got) < self.total:
            self.got.append(await self.client.next())


async def publish_paced(
    publisher: FyrehoseClient, readers: list[Reader], total: int
) -> dict[int, bytes]:
    """PUSH ``total`` distinct messages; the sequence each one got, from its echo."""
    waiting: set[asyncio.Future[int | None]] = set()
    futures: list[tuple[bytes, asyncio.Future[int | None]]] = []
    async with asyncio.timeout(DEADLINE):
        for i in range(total):
            while len(waiting) >= IN_FLIGHT:
                _, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            while i - min(len(r.got) for r in readers) > LEAD:
                await asyncio.sleep(0.005)
            data = b"message %d" % i
            future = publisher.publish_nowait(data)
            futures.append((data, future))
            waiting.add(future)
        if waiting:
            await asyncio.wait(waiting)
    sequences: dict[int, bytes] = {}
    for data, future in futures:
        seq = future.result()
        assert seq is not None and seq not in sequences
        sequences[seq] = data
    return sequences


async def run(
    broker: Broker, total: int, lossy: int, *, journaling: int = 0, seed: int = 17
) -> tuple[list[LossyRelay], list[Reader], list[FyrehoseClient], FyrehoseClient]:
    """``lossy`` subscribers behind relays, ``journaling`` direct ones with a journal of the
    whole run, a publisher; returns once every subscriber has read ``total`` messages."""
    host, port = fyrehose_address(broker)
    rng = random.Random(seed)
    relays: list[LossyRelay] = []
    clients: list[FyrehoseClient] = []
    try:
        for _ in range(lossy):
            relay = LossyRelay((host, port), random.Random(rng.random()))
            relays.append(relay)
            await relay.start()
            relay_host, relay_port = relay.address
            clients.append(await FyrehoseClient.connect(relay_host, relay_port, start=1))
        journals = [
            await FyrehoseClient.connect(host, port, start=1, journal_messages=total)
            for _ in range(journaling)
        ]
        clients += journals
        publisher = await FyrehoseClient.connect(host, port, start=1, publish_timeout=5.0)
        clients.append(publisher)
        readers = [Reader(c, total) for c in clients]
        sequences = await publish_paced(publisher, readers, total)
        async with asyncio.timeout(DEADLINE):
            await asyncio.gather(*(r.task for r in readers))
        # The publisher's own stream is the truth to compare with. A re-sent PUSH whose
        # first copy got through is in it twice (at least once): then the run's messages
        # reach past ``total`` and only the first ``total`` are compared.
        stream = readers[-1].got
        assert [m.seq for m in stream[:total]] == list(range(1, total + 1))
        for seq, data in sequences.items():
            assert seq > total or stream[seq - 1] == Delivered(seq, data)
        if publisher.stats.resent == 0:  # the usual case: then the run is exactly the stream
            assert sorted(sequences) == list(range(1, total + 1))
        for reader in readers:
            assert reader.got == stream[:total]  # every one, exactly once, in order
            assert reader.client.lost == []
        return relays, readers[:-1], journals, publisher
    finally:
        for client in clients:
            await client.close()
        for relay in relays:
            relay.close()


async def test_subscribers_behind_a_lossy_relay_get_all_100000_from_the_window(
    settings: Settings,
) -> None:
    total = 100_000
    async with backbone(settings) as (broker, state):
        relays, readers, _, publisher = await run(broker, total, lossy=3)
        assert state.sequence == total or publisher.stats.resent > 0
        # The relay really lost and reordered datagrams both ways, and the broker's window
        # made up for it with nothing left over.
        for relay in relays:
            to_broker, to_client = relay.dropped
            assert to_broker > 0 and to_client > 0.03 * total and min(relay.delayed) > 0
        assert state.served > 0
        assert state.unserved == 0 and state.forwarded == 0
        assert all(r.client.stats.recovered > 0 for r in readers)


async def test_with_a_tiny_window_journals_answer_the_forwards(settings: Settings) -> None:
    total = 20_000
    async with backbone(settings, window_messages=64) as (broker, state):
        _, readers, journals, publisher = await run(broker, total, lossy=2, journaling=2)
        assert state.sequence == total or publisher.stats.resent > 0
        assert state.forwarded > 0
        assert sum(j.stats.forwards_answered for j in journals) > 0
        assert all(r.client.stats.recovered > 0 for r in readers[:2])
