"""The fq data path in one process: a publisher's reads in, a consumer's socket out.

``python -m bench.fqpath [--size N] [--count N] [--repeat N]`` reports this process's CPU
per message for decode, route, queue and write through real sessions, a real router and a
real socket, without the bench's other processes (docs/bench.md). Run it with
``PYTHONPATH`` at two trees for an A/B of the same load.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import struct
import time
from types import SimpleNamespace
from typing import Any

from fqbroker.core.budget import MemoryBudget
from fqbroker.core.publisher import Publisher
from fqbroker.core.queue import Queue
from fqbroker.core.queuespec import QueueSpec
from fqbroker.core.router import ClientStats, Router
from fqbroker.frontends.fq.data import DataSession
from fqbroker.protocols.fq import wire

READ = 256_000  # what uvloop reads at most at a time
EXCHANGE, ROUTE = b"bench", b"r.k"


class _Host:
    node_id = bytes((10, 0, 0, 1))

    def __init__(self, router: Router, budget: MemoryBudget | None = None) -> None:
        self.router = router
        self.settings = SimpleNamespace(max_message_size=1 << 28, partial_message_seconds=30.0)
        self.budget = MemoryBudget(1 << 34) if budget is None else budget
        self.limits = SimpleNamespace(bad=print, log=SimpleNamespace(log=print))
        self.clients: dict[bytes, Any] = {}

    def closed(self, transport: object) -> None:
        pass

    def make_publisher(self, stats: Any = None, permissions: Any = None) -> Publisher:
        return Publisher(self.router, lambda: ((), 0, 0), stats, permissions=permissions)


class _Transport:
    """A publisher's transport: nothing is written to it; reading is never paused here."""

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 5000) if name == "peername" else default

    def is_closing(self) -> bool:
        return False


def _owner(user: bytes, queue: Queue | None) -> Any:
    return SimpleNamespace(
        user=user, queue=queue, stats=ClientStats(), permissions=None, pretty=user.decode(),
        data=None, paired=lambda data: None, dedup=False,
    )  # fmt: skip


async def _consumer(host: _Host, queue: Queue) -> tuple[DataSession, int]:
    """A data session consuming ``queue`` onto a real socket, drained by a forked child
    (which exits at EOF: close the session's transport, then wait for the pid)."""
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ours.close()
        while theirs.recv(1 << 20):
            pass
        os._exit(0)
    theirs.close()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
    consumer = DataSession(host, wire.Mode.DATA, transport)  # type: ignore[arg-type]
    transport.set_protocol(consumer)
    consumer.owner = _owner(b"sub", queue)
    consumer.channel.paired(b"sub", wire.NO_PEER)
    consumer.queue_ready()
    return consumer, pid


def _frames(size: int, count: int) -> list[bytes]:
    payload = (b"0123456789abcdef" * (size // 16 + 1))[:size]
    frame = b"".join(
        (bytes((len(EXCHANGE),)), EXCHANGE, bytes((len(ROUTE),)), ROUTE, bytes(16),
         struct.pack(">I", size), payload)
    )  # fmt: skip
    stream = frame * count
    return [stream[i : i + READ] for i in range(0, len(stream), READ)]


async def _run(size: int, count: int, reads: list[bytes], pubs: int) -> float:
    router = Router()
    queue = Queue(QueueSpec(b"q", backlog=10_000_000, backlog_bytes=0))
    router.bind(EXCHANGE, b"prefix:", queue)
    host = _Host(router)
    consumer, pid = await _consumer(host, queue)
    transport, sub = consumer.transport, consumer.owner

    publishers = []
    for _ in range(pubs):
        publisher = DataSession(host, wire.Mode.DATA, _Transport())  # type: ignore[arg-type]
        publisher.owner = _owner(b"pub", None)
        publisher.channel.paired(b"pub", wire.NO_PEER)
        publishers.append(publisher)

    start = time.process_time()
    window = 16 << 20  # bytes in flight at most, as the bench's publishers keep it
    for data in reads:
        for publisher in publishers:  # fan-in: each sends the same reads, in turn
            publisher.data_received(data)
        await asyncio.sleep(0)
        while queue.store.held_bytes > window:  # noqa: ASYNC110 (a bench: polls, as the bench's)
            await asyncio.sleep(0.0002)
    while sub.stats.msgs_out < count * pubs:  # noqa: ASYNC110 (a bench: no event to wait on)
        await asyncio.sleep(0.0005)
    cpu = time.process_time() - start
    transport.close()
    await asyncio.sleep(0.01)
    os.waitpid(pid, 0)  # noqa: ASYNC222 (the child exits at EOF, at once)
    return cpu / (count * pubs) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--pubs", type=int, default=1, help="publishers (fan-in)")
    args = parser.parse_args()
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ModuleNotFoundError:
        runner = asyncio.Runner()
    reads = _frames(args.size, args.count)
    results = []
    with runner:
        for _ in range(args.repeat):
            results.append(runner.run(_run(args.size, args.count, reads, args.pubs)))
    print(
        f"size {args.size}, {args.pubs} to 1: us/msg best {min(results):.3f} median "
        f"{statistics.median(results):.3f} ({', '.join(f'{r:.3f}' for r in results)})"
    )


if __name__ == "__main__":
    main()
