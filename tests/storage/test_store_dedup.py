"""A disk queue's de-duplication window: opted-in records tagged in the log, the window
read back from the log's tail when first needed (so it survives a restart), and ids of
writes that failed taken back."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path

import pytest

from fqbroker.core import dedup
from fqbroker.core.dedup import DedupLimits, dedup_key, now_us
from fqbroker.core.message import Message
from fqbroker.core.queue import Queue
from fqbroker.core.queuespec import QueueKind, QueueSpec
from fqbroker.storage.segments.log import SegmentLog
from fqbroker.storage.store import RECORD_ONCE, RECORD_V1, DiskStore, encode_records

SECOND = 1_000_000
LIMITS = DedupLimits(seconds=120, ids=1000)


def frame(n: int, sender: bytes = b"spark") -> bytes:
    return Message(b"ex", b"r", b"m%d" % n, n.to_bytes(16, "big"), sender).peer_frame()


def disk_queue(path: Path, segment_bytes: int = 64 << 20) -> Queue:
    store = DiskStore(SegmentLog(path, segment_bytes=segment_bytes))
    return Queue(QueueSpec(b"q", kind=QueueKind.DISK, backlog=1 << 30), store)


@pytest.fixture
def opted_in() -> Iterator[None]:
    dedup.enter(LIMITS)
    try:
        yield
    finally:
        dedup.leave()


def flush(queue: Queue) -> None:
    store = queue.store
    assert isinstance(store, DiskStore)
    store.flush()


async def test_opted_in_records_are_tagged(tmp_path: Path, opted_in: None) -> None:
    queue = disk_queue(tmp_path / "q")
    queue.offer([frame(1), frame(2)])
    dedup.leave()
    queue.offer([frame(3)])
    flush(queue)
    store = queue.store
    assert isinstance(store, DiskStore)
    tags = [record[0] for _, record in store.log.read(1, 10)]
    assert tags == [RECORD_ONCE, RECORD_ONCE, RECORD_V1]
    queue.close(destroy=False)


async def test_the_window_survives_a_restart(tmp_path: Path, opted_in: None) -> None:
    queue = disk_queue(tmp_path / "q", segment_bytes=300)  # a few records a segment
    for i in range(1, 21):
        queue.offer([frame(i)])
        flush(queue)
    dedup.leave()
    queue.offer([frame(21)])  # not opted in: not remembered
    flush(queue)
    queue.close(destroy=False)
    dedup.enter(LIMITS)
    again = disk_queue(tmp_path / "q", segment_bytes=300)
    store = again.store
    assert isinstance(store, DiskStore)
    assert len(store.log.segment_firsts()) > 3
    assert again.offer([frame(i) for i in range(1, 23)]) == 22
    assert again.duplicates == 20
    flush(again)
    assert again.backlog == 21 + 2  # 21 and 22 went in
    again.close(destroy=False)


async def test_the_rebuilt_window_keeps_only_its_time_and_count(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path / "q", segment_bytes=400)
    now = now_us()
    old = [frame(i) for i in range(5)]
    new = [frame(i) for i in range(5, 10)]
    log.append(encode_records(old, now - 200 * SECOND, [(0, 5)]))
    log.append(encode_records(new, now - SECOND, [(0, 5)]))
    store = DiskStore(log)
    window = store.open_window(DedupLimits(seconds=120, ids=3))
    assert set(window.ids) == {dedup_key(f) for f in new[-3:]}
    window = store.open_window(DedupLimits(seconds=120, ids=100))
    assert set(window.ids) == {dedup_key(f) for f in new}
    store.close(destroy=False)


async def test_a_failed_write_takes_its_ids_back(tmp_path: Path, opted_in: None) -> None:
    queue = disk_queue(tmp_path / "q")
    store = queue.store
    assert isinstance(store, DiskStore)
    queue.offer([frame(1)])
    flush(queue)

    def full(records: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    append = store.log.append
    store.log.append = full  # type: ignore[method-assign]
    queue.offer([frame(2), frame(3)])
    with pytest.raises(OSError):
        store.flush()
    store.log.append = append  # type: ignore[method-assign]
    # Sent again, 2 and 3 get in: they were never stored. 1 was.
    assert queue.offer([frame(1), frame(2), frame(3)]) == 3
    flush(queue)
    assert (queue.backlog, queue.duplicates) == (3, 1)
    queue.close(destroy=False)
