"""A reject-policy queue: refuses what is past its limits as drop does, never makes a
publisher wait, and is told apart from drop and block when attached to."""

from __future__ import annotations

import pytest

from fqbroker.core.message import Message
from fqbroker.core.queue import Queue
from fqbroker.core.queuespec import Policy, QueueSpec
from fqbroker.errors import QueueError


def frame(payload: bytes) -> bytes:
    return Message(b"ex", b"r", payload).peer_frame()


def test_full_it_refuses_and_never_blocks() -> None:
    queue = Queue(QueueSpec(b"q", policy=Policy.REJECT, backlog=3))
    assert (queue.rejects, queue.blocks) == (True, False)
    frames = [frame(b"%d" % i) for i in range(5)]
    assert queue.offer(frames) == 3
    assert (queue.backlog, queue.dropped_to, queue.is_full) == (3, 2, False)
    assert queue.offer([frame(b"late")]) == 0
    assert queue.take(10) == frames[:3]
    assert queue.offer([frame(b"again")]) == 1  # room again


def test_its_byte_limit_refuses_too() -> None:
    frames = [frame(b"x" * 100) for _ in range(3)]
    limit = len(frames[0]) * 2
    queue = Queue(QueueSpec(b"q", policy=Policy.REJECT, backlog=100, backlog_bytes=limit))
    assert queue.offer(frames) == 2
    assert queue.dropped_to == 1


def test_its_spec_keeps_the_policy() -> None:
    queue = Queue(QueueSpec(b"q", policy=Policy.REJECT, backlog=5))
    assert queue.spec.attributes == "private,reject,backlog=5"
    assert "reject" in repr(queue)


@pytest.mark.parametrize(
    ("have", "ask", "text"),
    [
        (Policy.REJECT, Policy.DROP, "request drop, queue is reject"),
        (Policy.REJECT, Policy.BLOCK, "request block, queue is reject"),
        (Policy.DROP, Policy.REJECT, "request reject, queue is drop"),
        (Policy.BLOCK, Policy.REJECT, "request reject, queue is block"),
        # fqd's own texts stay as they were.
        (Policy.DROP, Policy.BLOCK, "request block, queue is drop"),
        (Policy.BLOCK, Policy.DROP, "request drop, queue is block"),
    ],
)
def test_attached_with_another_policy(have: Policy, ask: Policy, text: str) -> None:
    queue = Queue(QueueSpec(b"q", private=False, policy=have))
    with pytest.raises(QueueError, match=text):
        queue.check_attach(QueueSpec(b"q", private=False, policy=ask))
