"""Public queues share fairly at light load (docs/queues.md): a burst published while the
consumers are idle is split between them, not handed whole to the first one in line."""

from __future__ import annotations

import asyncio

from fqbroker.clients.fq.client import Client
from fqbroker.core.message import Message
from fqbroker.server.broker import Broker
from tests.conftest import open_session, wait_for


async def drain(client: Client, got: list[Message]) -> None:
    while True:
        got.append(await client.receive())


async def split(broker: Broker, consumers: int, messages: int) -> list[list[Message]]:
    """Publish ``messages`` in one burst to a public queue with ``consumers`` idle
    consumers; what each consumer received."""
    source = "worker/fair/mem:public"
    clients = [Client(port=broker.port, source=source) for _ in range(consumers)]
    publisher = Client(port=broker.port, source="publisher")
    got: list[list[Message]] = [[] for _ in clients]
    tasks: list[asyncio.Task[None]] = []
    try:
        for client in clients:
            await client.connect()
        await clients[0].bind("fair", "prefix:")
        queue = broker.queues[b"fair"]
        tasks = [asyncio.create_task(drain(c, g)) for c, g in zip(clients, got, strict=True)]
        # Idle: every consumer's data channel waits on the queue.
        await wait_for(lambda: len(queue._getters) == consumers)
        await publisher.connect()
        for i in range(messages):
            publisher.publish("fair", "job", b"%d" % i)
        await publisher.flush()
        await wait_for(lambda: sum(map(len, got)) == messages)
        await asyncio.sleep(0.05)  # nothing more arrives: each message went to one consumer
        assert sum(map(len, got)) == messages
        return got
    finally:
        for task in tasks:
            task.cancel()
        for client in [*clients, publisher]:
            await client.close()


async def test_ten_messages_two_idle_consumers_split_evenly(broker: Broker) -> None:
    got = await split(broker, 2, 10)
    assert sorted(len(g) for g in got) == [5, 5], [len(g) for g in got]
    assert sorted(int(m.payload) for g in got for m in g) == list(range(10))


async def test_a_burst_is_spread_over_every_idle_consumer(broker: Broker) -> None:
    got = await split(broker, 4, 10)
    assert sorted(len(g) for g in got) == [2, 2, 3, 3], [len(g) for g in got]


async def test_fewer_messages_than_consumers_go_one_each(broker: Broker) -> None:
    got = await split(broker, 3, 2)
    assert sorted(len(g) for g in got) == [0, 1, 1], [len(g) for g in got]


async def test_one_consumer_still_takes_a_burst_at_once(broker: Broker) -> None:
    got = await split(broker, 1, 1000)
    assert [len(g) for g in got] == [1000]
    assert [int(m.payload) for m in got[0]] == list(range(1000))  # in order


async def test_a_consumer_that_stops_reading_leaves_the_rest_to_the_others(
    broker: Broker,
) -> None:
    """One consumer never reads its data socket: once its socket is full, what it cannot
    take goes to the other consumer rather than wait for it."""
    stuck = await open_session(broker.port, b"worker", b"stuck\x00mem:public,backlog=-1")
    reader = Client(port=broker.port, source="worker/stuck/mem:public,backlog=-1")
    publisher = Client(port=broker.port, source="publisher")
    got: list[Message] = []
    task: asyncio.Task[None] | None = None
    try:
        await reader.connect()
        await reader.bind("stuck", "prefix:")
        queue = broker.queues[b"stuck"]
        await wait_for(lambda: len(queue._getters) == 2)
        task = asyncio.create_task(drain(reader, got))
        await publisher.connect()
        payload = b"x" * 65536
        n = 400  # 26 MB: far more than the stuck consumer's socket buffers hold
        for i in range(n):
            publisher.publish("stuck", "job", payload[:-8] + b"%08d" % i)
        await publisher.flush()
        written = broker.clients[stuck.key].stats  # what went into the stuck one's socket
        await wait_for(lambda: queue.backlog == 0 and len(got) + written.msgs_out == n)
        assert got
    finally:
        if task is not None:
            task.cancel()
        await stuck.close()
        for client in (reader, publisher):
            await client.close()
