"""The reject policy and full disks as a publisher learns of them, with real parts:
router, queues, and a catalog whose disk queues write into a real small tmpfs."""

from __future__ import annotations

from pathlib import Path

from fqbroker.core.message import Message, runs_of
from fqbroker.core.publisher import DISK_FULL, Publisher
from fqbroker.core.queue import Queue
from fqbroker.core.queuespec import Policy, QueueKind, QueueSpec
from fqbroker.core.router import Router
from fqbroker.settings.broker import Settings
from fqbroker.storage.configdb.catalog import Catalog
from fqbroker.storage.configdb.state import ConfigStore
from tests.smalldisk import small_disk


def messages(n: int, exchange: bytes = b"ex", payload: bytes = b"m") -> list[Message]:
    return [Message(exchange, b"r", payload + b"%d" % i) for i in range(n)]


def octets(sent: list[Message]) -> int:
    return sum(len(m.publish_frame()) for m in sent)


async def test_a_confirm_covering_a_rejected_batch_fails(catalog: Catalog) -> None:
    router = catalog.router
    queue = Queue(QueueSpec(b"q", policy=Policy.REJECT, backlog=3))
    router.bind(b"ex", b"prefix:", queue)
    publisher = Publisher(router, catalog.flush_dirty)
    first = messages(2)
    assert publisher.publish(runs_of(first), octets(first))
    second = messages(3)
    assert publisher.publish(runs_of(second), octets(second))  # refused, never waits
    assert len(queue.take(100)) == 3
    # Counted dropped, as a drop-policy queue's, and rejected.
    assert (publisher.stats.routed, publisher.stats.dropped, router.rejected) == (5, 2, 2)
    assert publisher.rejected_from == 4  # the first it refused, not the first of its batch
    assert await publisher.confirm(3) is None
    assert await publisher.confirm(4) == "queue full: q"
    assert await publisher.confirm(5) == "queue full: q"


async def test_a_full_drop_queue_still_confirms(catalog: Catalog) -> None:
    router = catalog.router
    router.bind(b"ex", b"prefix:", Queue(QueueSpec(b"q", policy=Policy.DROP, backlog=1)))
    publisher = Publisher(router, catalog.flush_dirty)
    sent = messages(4)
    assert publisher.publish(runs_of(sent), octets(sent))
    assert publisher.stats.dropped == 3 and router.rejected == 0
    assert await publisher.confirm(4) is None


async def test_beside_other_queues_and_through_programs(catalog: Catalog) -> None:
    """A reject queue among others gets what fits, the others get everything; a binding
    whose program reads the payload (routed one message at a time) refuses likewise."""
    router = catalog.router
    full = Queue(QueueSpec(b"full", policy=Policy.REJECT, backlog=2))
    other = Queue(QueueSpec(b"other"))
    picky = Queue(QueueSpec(b"picky", policy=Policy.REJECT, backlog=1))
    router.bind(b"ex", b"prefix:", full)
    router.bind(b"ex", b"prefix:", other)
    router.bind(b"ex2", b'prefix: payload_prefix("m")', picky)
    publisher = Publisher(router, catalog.flush_dirty)
    sent = messages(3)
    assert publisher.publish(runs_of(sent), octets(sent))
    assert (len(full.take(100)), len(other.take(100))) == (2, 3)
    assert publisher.rejected_from == 3
    assert await publisher.confirm(2) is None
    assert await publisher.confirm(3) == "queue full: full"
    each = Publisher(router, catalog.flush_dirty)
    sent = messages(2, b"ex2")
    assert each.publish(runs_of(sent), octets(sent))
    assert len(picky.take(100)) == 1 and each.rejected_from == 2
    assert await each.confirm(1) is None
    assert await each.confirm(2) == "queue full: picky"


async def test_a_rejected_batch_counted_when_read(catalog: Catalog) -> None:
    """Counted as read before it is published (received()): the number is found as
    well, after a wait on a block-policy queue too."""
    router = catalog.router
    block = Queue(QueueSpec(b"b", policy=Policy.BLOCK, backlog=3))
    reject = Queue(QueueSpec(b"r", policy=Policy.REJECT, backlog=1))
    router.bind(b"ex", b"prefix:", block)
    router.bind(b"ex2", b"prefix:", reject)
    publisher = Publisher(router, catalog.flush_dirty)
    sent = messages(2)
    publisher.received(len(sent), octets(sent))
    assert publisher.publish(runs_of(sent))
    sent = messages(3) + messages(2, b"ex2")
    publisher.received(len(sent), octets(sent))
    assert not publisher.publish(runs_of(sent))  # the block queue is full
    block.take(100)
    await publisher.finish()
    # 6 and 7 went to the reject queue after the wait, and 7 did not fit.
    assert publisher.rejected_from == 7
    assert await publisher.confirm(6) is None
    assert await publisher.confirm(7) == "queue full: r"


async def test_a_full_disk_fails_a_confirm_saying_so(tmp_path: Path) -> None:
    with small_disk(tmp_path / "queues", 256 << 10):
        settings = Settings(config_db=tmp_path / "fqd.sqlite", queue_dir=tmp_path / "queues")
        catalog = Catalog(settings, Router(), ConfigStore(settings.config_db))
        try:
            queue = catalog.attach(
                QueueSpec(b"d", kind=QueueKind.DISK, backlog=0xFFFFFFFF), object()
            )
            catalog.router.bind(b"ex", b"prefix:", queue)
            publisher = Publisher(catalog.router, catalog.flush_dirty)
            for _ in range(100):  # 100 KiB a batch: the disk fills within three
                sent = messages(100, payload=b"x" * 1024)
                publisher.publish(runs_of(sent), octets(sent))
                if publisher.failed_from is not None:
                    break
            assert publisher.failed_from is not None
            assert await publisher.confirm(publisher.handled) == DISK_FULL
        finally:
            catalog.close()
