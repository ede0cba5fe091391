"""The Publisher every front end publishes through, with real parts: router, queues, a
catalog whose disk queue writes into tmp_path."""

from __future__ import annotations

import asyncio

from fqbroker.core.message import Message, runs_of
from fqbroker.core.permissions import Permissions
from fqbroker.core.publisher import Publisher
from fqbroker.core.queue import Queue
from fqbroker.core.queuespec import Policy, QueueKind, QueueSpec
from fqbroker.storage.configdb.catalog import Catalog


def messages(n: int, exchange: bytes = b"ex") -> list[Message]:
    return [Message(exchange, b"r", b"m%d" % i) for i in range(n)]


def test_counts_outcomes_in_its_stats_and_the_aggregate(catalog: Catalog) -> None:
    router = catalog.router
    queue = Queue(QueueSpec(b"q", backlog=3))
    router.bind(b"ex", b"prefix:", queue)
    publisher = Publisher(router, catalog.flush_dirty)
    runs = runs_of(messages(5) + messages(2, b"nowhere"))
    octets = sum(len(m.publish_frame()) for m in messages(5) + messages(2, b"nowhere"))
    assert publisher.publish(runs, octets)
    stats = publisher.stats
    assert (stats.routed, stats.dropped, stats.no_route, stats.no_exchange) == (5, 2, 2, 2)
    assert (stats.msgs_in, publisher.handled) == (7, 7)
    agg = router.aggregate
    assert (agg.messages, agg.routed, agg.dropped, agg.no_exchange) == (7, 5, 2, 2)
    publisher.size_dropped(4)
    assert stats.size_dropped == agg.size_dropped == 4


def test_received_counts_what_was_read_before_publishing(catalog: Catalog) -> None:
    publisher = Publisher(catalog.router, catalog.flush_dirty)
    publisher.received(3, 120)
    assert publisher.publish(runs_of(messages(2)))  # one of the three looped, say
    stats = publisher.stats
    assert (publisher.handled, stats.msgs_in, stats.octets_in, stats.no_exchange) == (3, 3, 120, 2)


async def test_a_full_block_queue_stops_the_batch_and_it_carries_on(catalog: Catalog) -> None:
    router = catalog.router
    queue = Queue(QueueSpec(b"q", policy=Policy.BLOCK, backlog=4))
    router.bind(b"ex", b"prefix:", queue)
    publisher = Publisher(router, catalog.flush_dirty)
    sent = messages(10)
    assert not publisher.publish(runs_of(sent), 10 * len(sent[0].publish_frame()))
    assert publisher.blocked == [queue]
    assert publisher.handled == 4  # the message that fills it goes in
    got: list[bytes] = []
    while True:
        got += queue.take(100)
        await publisher.wait_for_room()
        if publisher.carry_on():
            break
    got += queue.take(100)
    assert len(got) == 10 and publisher.handled == 10
    assert publisher.stats.octets_in == 10 * len(sent[0].publish_frame())
    assert queue.dropped_to == 0


async def test_publish_all_waits_for_room(catalog: Catalog) -> None:
    router = catalog.router
    queue = Queue(QueueSpec(b"q", policy=Policy.BLOCK, backlog=2))
    router.bind(b"ex", b"prefix:", queue)
    publisher = Publisher(router, catalog.flush_dirty)
    task = asyncio.ensure_future(publisher.publish_all(runs_of(messages(7))))
    got: list[bytes] = []
    while not task.done():
        await asyncio.sleep(0)
        got += queue.take(1)
    await task
    assert len(got + queue.take(100)) == 7


async def test_disk_writes_are_flushed_recorded_and_confirmed(catalog: Catalog) -> None:
    queue = catalog.attach(QueueSpec(b"d", kind=QueueKind.DISK), object())
    catalog.router.bind(b"ex", b"prefix:", queue)
    publisher = Publisher(catalog.router, catalog.flush_dirty)
    assert publisher.publish(runs_of(messages(3)), 0)
    assert not catalog.dirty  # written before the batch was done
    assert publisher.written is not None
    ((store, seq),) = publisher.written.items()
    assert seq == store.written_seq
    assert await publisher.confirm(3) is None
    assert publisher.failed_from is None


async def test_confirm_waits_for_messages_and_learns_of_a_close(catalog: Catalog) -> None:
    publisher = Publisher(catalog.router, catalog.flush_dirty)
    early = asyncio.ensure_future(publisher.confirm(2))
    late = asyncio.ensure_future(publisher.confirm(5))
    await asyncio.sleep(0)
    assert not early.done()
    publisher.publish(runs_of(messages(2)), 0)
    assert await early is None
    assert not late.done()
    publisher.close()
    assert await late == "data channel closed"
    assert await publisher.confirm(2) is None  # what it had stays confirmed


def test_one_message_goes_the_same_way_as_runs(catalog: Catalog) -> None:
    router = catalog.router
    box = Queue(QueueSpec(b"q", backlog=1))
    router.bind(b"ex", b"prefix:", box)
    result = router.publish(Message(b"ex", b"r", b"a"))
    assert (result.routed, result.dropped, result.blocked) == (1, 0, [])
    result = router.publish(Message(b"ex", b"r", b"b"))
    assert (result.routed, result.dropped) == (1, 1)
    result = router.publish(Message(b"none", b"r", b"c"))
    assert (result.no_route, result.no_exchange) == (1, 1)
    assert (router.aggregate.routed, router.aggregate.dropped) == (2, 1)


# --- permissions (auth = "password"): runs its user may not publish are denied -------------


def test_denied_runs_are_dropped_unrouted_and_counted(catalog: Catalog) -> None:
    router = catalog.router
    allowed, secret = Queue(QueueSpec(b"qa")), Queue(QueueSpec(b"qs"))
    router.bind(b"logs.a", b"prefix:", allowed)
    router.bind(b"secret", b"prefix:", secret)
    rights = Permissions.from_rules([("publish", "logs.*", True)])
    publisher = Publisher(router, catalog.flush_dirty, permissions=rights)
    sent = messages(2, b"logs.a") + messages(3, b"secret") + messages(1, b"logs.a")
    sent += messages(4, b"nobody-bound")
    octets = sum(len(m.publish_frame()) for m in sent)
    assert publisher.publish(runs_of(sent), octets)
    assert len(allowed.take(100)) == 3 and secret.take(100) == []
    stats = publisher.stats
    # Denied messages were read (msgs_in, octets_in) and handled, never routed.
    assert (stats.denied, stats.routed, stats.msgs_in, stats.octets_in) == (7, 3, 10, octets)
    assert publisher.handled == 10
    agg = router.aggregate
    assert (agg.denied, agg.messages, agg.routed, agg.no_exchange) == (7, 3, 3, 0)
    # The exchange counts them when it exists; a name nobody bound creates none.
    assert router.exchanges[b"secret"].denied == 3
    assert router.exchanges[b"secret"].messages == 0
    assert b"nobody-bound" not in router.exchanges
    assert publisher.denied_from == 3  # the first denied message's number


async def test_a_confirm_covering_a_denied_message_fails(catalog: Catalog) -> None:
    rights = Permissions.from_rules([("publish", "ok", True)])
    publisher = Publisher(catalog.router, catalog.flush_dirty, permissions=rights)
    sent = messages(2, b"ok") + messages(1, b"no") + messages(2, b"ok")
    assert publisher.publish(runs_of(sent), sum(len(m.publish_frame()) for m in sent))
    assert await publisher.confirm(2) is None  # before the denied one: fine
    assert await publisher.confirm(3) == "publish denied"
    assert await publisher.confirm(5) == "publish denied"


async def test_denied_runs_between_a_full_block_queue(catalog: Catalog) -> None:
    """A denied run after a blocked one is dropped once the batch carries on, and the
    message numbers stay those of the batch (a confirm before it still succeeds)."""
    router = catalog.router
    queue = Queue(QueueSpec(b"q", policy=Policy.BLOCK, backlog=4))
    router.bind(b"ex", b"prefix:", queue)
    router.bind(b"ex2", b"prefix:", queue)
    rights = Permissions.from_rules([("publish", "ex*", True), ("publish", "ex2", False)])
    publisher = Publisher(router, catalog.flush_dirty, permissions=rights)
    sent = messages(6) + messages(2, b"ex2") + messages(3)
    assert not publisher.publish(runs_of(sent), sum(len(m.publish_frame()) for m in sent))
    assert publisher.handled == 4 and publisher.stats.denied == 0
    got: list[bytes] = []
    while True:
        got += queue.take(100)
        await publisher.wait_for_room()
        if publisher.carry_on():
            break
    got += queue.take(100)
    assert len(got) == 9 and publisher.handled == 11
    assert publisher.stats.denied == 2 and publisher.denied_from == 7
    assert publisher.stats.octets_in == sum(len(m.publish_frame()) for m in sent)
    assert await publisher.confirm(6) is None
    assert await publisher.confirm(7) == "publish denied"


def test_all_permissions_publish_everything(catalog: Catalog) -> None:
    router = catalog.router
    queue = Queue(QueueSpec(b"q"))
    router.bind(b"ex", b"prefix:", queue)
    admin = Permissions.from_rules([("admin", "*", True)])
    for rights in (Permissions.ALL, admin):
        publisher = Publisher(router, catalog.flush_dirty, permissions=rights)
        assert publisher.publish(runs_of(messages(3)), 30)
        assert publisher.stats.denied == 0 and publisher.denied_from is None
    assert len(queue.take(100)) == 6
