"""De-duplication by message id: the window (time, count, repeats, taking back) and a
queue that drops repeats only while an opted-in publisher's batch is routed."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from fqbroker.core import dedup
from fqbroker.core.dedup import DedupLimits, Window, dedup_key
from fqbroker.core.message import Message
from fqbroker.core.queue import Queue
from fqbroker.core.queuespec import Policy, QueueSpec

SECOND = 1_000_000


def frame(n: int, sender: bytes = b"spark", payload: bytes = b"x") -> bytes:
    return Message(b"ex", b"r", payload, n.to_bytes(16, "big"), sender).peer_frame()


@pytest.fixture
def opted_in() -> Iterator[DedupLimits]:
    limits = DedupLimits(seconds=120, ids=1000)
    dedup.enter(limits)
    try:
        yield limits
    finally:
        dedup.leave()


def test_the_key_is_the_id_and_the_sender() -> None:
    assert dedup_key(frame(7)) == (7).to_bytes(16, "big") + b"\x05spark"
    assert dedup_key(frame(7, b"bob")) != dedup_key(frame(7))
    assert dedup_key(frame(7, payload=b"other")) == dedup_key(frame(7))


def test_a_repeat_is_dropped_and_counted() -> None:
    window = Window(DedupLimits())
    assert window.fresh([frame(1), frame(2)], 0) == [frame(1), frame(2)]
    kept = window.fresh([frame(2), frame(3), frame(1)], SECOND)
    assert (kept, window.duplicates) == ([frame(3)], 2)


def test_a_repeat_within_one_batch_is_dropped() -> None:
    window = Window(DedupLimits())
    kept = window.fresh([frame(1), frame(1), frame(2)], 0)
    assert (kept, window.duplicates) == ([frame(1), frame(2)], 1)


def test_the_same_id_from_another_sender_is_not_a_repeat() -> None:
    window = Window(DedupLimits())
    window.fresh([frame(1)], 0)
    assert window.fresh([frame(1, b"bob")], 0) == [frame(1, b"bob")]


def test_ids_are_forgotten_after_the_window_time() -> None:
    window = Window(DedupLimits(seconds=2))
    window.fresh([frame(1)], 0)
    window.fresh([frame(2)], SECOND)
    assert window.fresh([frame(1), frame(2)], 2 * SECOND - 1) == []
    # Its first acceptance counts: the repeat above did not extend it.
    assert window.fresh([frame(1), frame(2)], 2 * SECOND) == [frame(1)]
    assert len(window) == 2


def test_only_the_newest_ids_are_kept() -> None:
    window = Window(DedupLimits(ids=3))
    window.fresh([frame(i) for i in range(5)], 0)
    window.expire(0)
    assert len(window) == 3
    assert window.fresh([frame(i) for i in range(5)], 0) == [frame(0), frame(1)]


def test_forgotten_ids_get_in_again() -> None:
    window = Window(DedupLimits(ids=10))
    window.fresh([frame(1), frame(2), frame(3)], 0)
    window.forget([frame(2), frame(3)])
    assert window.fresh([frame(1), frame(2), frame(3)], 0) == [frame(2), frame(3)]
    assert len(window) == 3


def test_a_queue_drops_repeats_only_in_the_scope(opted_in: DedupLimits) -> None:
    queue = Queue(QueueSpec(b"q", backlog=100))
    assert queue.offer([frame(1), frame(2)]) == 2
    assert queue.offer([frame(2), frame(3), frame(1)]) == 3  # repeats count as taken
    assert queue.backlog == 3
    assert queue.duplicates == 2
    dedup.leave()
    # A publisher that did not opt in: its ids are never looked at, nor remembered.
    assert queue.offer([frame(1), frame(9)]) == 2
    assert queue.backlog == 5
    dedup.enter(opted_in)
    assert queue.offer([frame(9)]) == 1
    assert queue.backlog == 6


def test_a_queue_without_opted_in_publishers_has_no_window() -> None:
    queue = Queue(QueueSpec(b"q", backlog=100))
    queue.offer([frame(1), frame(1)])
    assert (queue.window, queue.duplicates, queue.backlog) == (None, 0, 2)


def test_what_a_full_queue_refused_gets_in_when_sent_again(opted_in: DedupLimits) -> None:
    queue = Queue(QueueSpec(b"q", policy=Policy.REJECT, backlog=2))
    assert queue.offer([frame(1)]) == 1
    # 1 is a repeat; 2 fits; 3 is refused: the first refused is at index 2.
    assert queue.offer([frame(1), frame(2), frame(3)]) == 2
    assert queue.take(10) == [frame(1), frame(2)]
    assert queue.offer([frame(1), frame(2), frame(3)]) == 3
    assert queue.take(10) == [frame(3)]
    assert queue.duplicates == 3


def test_the_scope_is_this_threads_only(opted_in: DedupLimits) -> None:
    # Brokers embedded on two threads: one routing an opted-in batch must not make the
    # other's publishers de-duplicated.
    queue = Queue(QueueSpec(b"q", backlog=100))
    took: list[int] = []
    other = threading.Thread(target=lambda: took.append(queue.offer([frame(1), frame(1)])))
    other.start()
    other.join()
    assert (took, queue.backlog, queue.window) == ([2], 2, None)
    assert queue.offer([frame(1), frame(1)]) == 2
    assert (queue.backlog, queue.duplicates) == (3, 1)
