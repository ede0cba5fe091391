"""The latency row's burst in one process: one read of ten 100-byte messages in, written out.

``python -m bench.burst [--msgs N] [--bursts N] [--repeat N] [--hot]`` reports the time from
a publisher's read to the consumer's write, per burst, and this process's CPU per burst,
through real sessions, a real router and a real socket, with the caches thrashed between
bursts unless ``--hot`` (docs/bench.md). Run it with ``PYTHONPATH`` at two trees for an A/B.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import struct
import time
from typing import Any

from bench.fqpath import EXCHANGE, ROUTE, _consumer, _Host, _owner, _Transport
from fqbroker.core.queue import Queue
from fqbroker.core.queuespec import QueueSpec
from fqbroker.core.router import Router
from fqbroker.frontends.fq.data import DataSession
from fqbroker.protocols.fq import wire

# What a millisecond of the kernel and the other processes leave in the caches: the
# per-core L2 (1 MiB here) and more is overwritten between bursts, the L3 kept.
_THRASH = bytearray(2 << 20)
_FILL = (bytes(len(_THRASH)), b"\1" * len(_THRASH))


def _read(msgs: int) -> bytes:
    frame = b"".join(
        (bytes((len(EXCHANGE),)), EXCHANGE, bytes((len(ROUTE),)), ROUTE, bytes(16),
         struct.pack(">I", 100), bytes(100))
    )  # fmt: skip
    return frame * msgs


class _Timed:
    """A transport whose writes note when they returned."""

    def __init__(self, transport: asyncio.BaseTransport, written: list[int]) -> None:
        self._transport: Any = transport
        self._written = written

    def write(self, data: bytes) -> None:
        self._transport.write(data)
        self._written.append(time.perf_counter_ns())

    def writelines(self, data: list[bytes]) -> None:
        self._transport.writelines(data)
        self._written.append(time.perf_counter_ns())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


async def _run(read: bytes, bursts: int, hot: bool) -> tuple[float, float, float]:
    router = Router()
    queue = Queue(QueueSpec(b"q", backlog=10_000_000, backlog_bytes=0))
    router.bind(EXCHANGE, b"prefix:", queue)
    host = _Host(router)
    consumer, pid = await _consumer(host, queue)
    transport = consumer.transport
    publisher = DataSession(host, wire.Mode.DATA, _Transport())  # type: ignore[arg-type]
    publisher.owner = _owner(b"pub", None)
    publisher.channel.paired(b"pub", wire.NO_PEER)

    # The write goes out in transport.write: time to it, by wrapping the consumer's.
    written: list[int] = []
    consumer.transport = _Timed(transport, written)  # type: ignore[assignment]
    times = []
    cpu = 0.0
    for i in range(bursts + 50):
        if not hot:
            _THRASH[:] = _FILL[i & 1]
        await asyncio.sleep(0)
        c0 = time.process_time()
        t0 = time.perf_counter_ns()
        publisher.data_received(read)
        while not written:  # noqa: ASYNC110 (a bench: waits one loop turn)
            await asyncio.sleep(0)
        t1 = written.pop()
        c1 = time.process_time()
        if i >= 50:  # warmed up
            times.append(t1 - t0)
            cpu += c1 - c0
    transport.close()
    await asyncio.sleep(0.01)
    os.waitpid(pid, 0)  # noqa: ASYNC222 (the child exits at EOF, at once)
    times.sort()
    return times[len(times) // 2] / 1e3, times[len(times) * 99 // 100] / 1e3, cpu / bursts * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--msgs", type=int, default=10)
    parser.add_argument("--bursts", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--hot", action="store_true")
    args = parser.parse_args()
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ModuleNotFoundError:
        runner = asyncio.Runner()
    read = _read(args.msgs)
    results = []
    with runner:
        for _ in range(args.repeat):
            results.append(runner.run(_run(read, args.bursts, args.hot)))
    p50s, p99s, cpus = zip(*results, strict=True)
    print(
        f"{args.msgs} msgs a burst ({'hot' if args.hot else 'cold'}): read to write us "
        f"p50 best {min(p50s):.1f} median {statistics.median(p50s):.1f}, "
        f"p99 best {min(p99s):.1f} median {statistics.median(p99s):.1f}; "
        f"CPU us/burst median {statistics.median(cpus):.1f}"
    )


if __name__ == "__main__":
    main()
