"""A publisher's data session on its read path, without a socket: a read decoded whole is
published, and what it reserves of the memory budget afterwards (nothing while it holds
nothing, unless the budget is spent: then reading waits, as MemoryBudget.resize says)."""

from __future__ import annotations

from typing import Any

from bench.fqpath import _Host, _owner
from fqbroker.core.budget import MemoryBudget
from fqbroker.core.message import Message
from fqbroker.core.queue import Queue
from fqbroker.core.queuespec import QueueSpec
from fqbroker.core.router import Router
from fqbroker.frontends.fq.data import DataSession
from fqbroker.protocols.fq import wire


class _Transport:
    def __init__(self) -> None:
        self.paused = 0

    def pause_reading(self) -> None:
        self.paused += 1

    def resume_reading(self) -> None:
        self.paused -= 1

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("192.0.2.7", 5000) if name == "peername" else default

    def is_closing(self) -> bool:
        return False


def _publisher(budget: MemoryBudget) -> tuple[DataSession, _Transport, Queue]:
    router = Router()
    queue = Queue(QueueSpec(b"q", backlog=1000, backlog_bytes=0))
    router.bind(b"ex", b"prefix:", queue)
    transport = _Transport()
    session = DataSession(_Host(router, budget), wire.Mode.DATA, transport)  # type: ignore[arg-type]
    session.owner = _owner(b"pub", None)
    session.channel.paired(b"pub", wire.NO_PEER)
    return session, transport, queue


async def test_a_read_decoded_whole_reserves_nothing_and_reads_on() -> None:
    budget = MemoryBudget(1 << 20)
    session, transport, queue = _publisher(budget)
    msgs = [Message(b"ex", b"r", b"m%d" % i) for i in range(10)]
    session.data_received(b"".join(m.publish_frame() for m in msgs))
    assert queue.backlog == 10
    assert transport.paused == 0
    assert session._in is not None and session._in.share.held == 0
    # A partial frame is held, and reserved for.
    session.data_received(msgs[0].publish_frame()[:7])
    assert queue.backlog == 10 and session._in.share.held > 0
    session.data_received(msgs[0].publish_frame()[7:])
    assert queue.backlog == 11 and session._in.share.held == 0 and transport.paused == 0


async def test_a_read_decoded_whole_waits_while_the_budget_is_spent() -> None:
    budget = MemoryBudget(1 << 20)
    session, transport, queue = _publisher(budget)
    budget.used = budget.limit + 1  # spent by others
    session.data_received(Message(b"ex", b"r", b"x").publish_frame())
    assert queue.backlog == 1  # what was read is published
    assert transport.paused == 1  # and reading waits for the budget
    assert session._in is not None and session._in.waiting is not None
    session._in.waiting.cancel()
