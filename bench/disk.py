"""Disk-queue throughput for each fsync policy, and the tail latency of a burst.

Then the cost of one checkpoint update and of reading a backlog back from the file, in
process (docs/bench.md, "Disk queues"). This is where those costs are watched; tests
assert no timings.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from fqbroker.clients.fq.client import Client
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from fqbroker.storage.segments.log import SegmentLog

BURST = 20_000
RUNS = 5
PAYLOAD = b"x" * 100


async def one_run(policy: str, state: Path) -> tuple[float, float, float]:
    settings = Settings(
        port=0, node_id="10.0.0.1", config_db=state / "db", queue_dir=state / "q", fsync=policy
    )
    async with Broker(settings) as broker:
        consumer = Client(port=broker.port, source="c/benchq/disk:backlog=-1")
        await consumer.connect()
        await consumer.bind(b"bench", b"prefix:")
        publisher = Client(port=broker.port, source="p")
        await publisher.connect()
        start = time.perf_counter()
        for i in range(BURST - 1):
            publisher.publish(b"bench", b"r", PAYLOAD)
            if i % 1000 == 999:
                await publisher.flush()
        received = 0
        while received < BURST - 1:
            await consumer.receive()
            received += 1
        last_sent = time.perf_counter()
        publisher.publish(b"bench", b"r", b"last")
        await publisher.flush()
        await consumer.receive()
        tail = time.perf_counter() - last_sent
        end = time.perf_counter()
        await publisher.confirm()
        confirm = time.perf_counter() - end
        await publisher.close()
        await consumer.close()
    return BURST / (end - start), confirm, tail


async def main_async() -> None:
    for policy in ("never", "interval", "always"):
        rates, confirms, tails = [], [], []
        for _ in range(RUNS):
            with tempfile.TemporaryDirectory(dir="var") as tmp:
                rate, confirm, tail = await one_run(policy, Path(tmp))
            rates.append(rate)
            confirms.append(confirm)
            tails.append(tail)
        print(
            f"  fsync={policy:8} {statistics.median(rates):9.0f} msg/s"
            f"   confirm after burst {statistics.median(confirms) * 1000:6.2f} ms"
            f"   tail latency {statistics.median(tails) * 1000:6.2f} ms"
            f" (max {max(tails) * 1000:.2f} ms)"
        )


def checkpoint_updates() -> None:
    for total, name_bytes in ((1, 2), (10, 20), (1000, 20), (1000, 200)):
        with tempfile.TemporaryDirectory(dir="var") as tmp:
            log = SegmentLog(Path(tmp) / "q")
            log.append([b"x"] * 100_000)
            for i in range(total - 1):
                log.set_checkpoint(f"{i:05d}".ljust(name_bytes, "-"), 1)
            for durable, calls in ((False, 2000), (True, 50)):
                best = min(_time_updates(log, calls, durable) for _ in range(RUNS))
                print(
                    f"  set_checkpoint: {total:4} checkpoint(s), names of {name_bytes:3} bytes,"
                    f" durable={durable!s:5} {best * 1e6:8.1f} us"
                )
            log.close()


def _time_updates(log: SegmentLog, calls: int, durable: bool) -> float:
    start = time.perf_counter()
    for i in range(calls):
        log.set_checkpoint("fq", 1 + i % 50_000, durable=durable)
    return (time.perf_counter() - start) / calls


def read_back() -> None:
    for size in (100, 4000):
        count = 20_000_000 // (size + 16)
        with tempfile.TemporaryDirectory(dir="var") as tmp:
            log = SegmentLog(Path(tmp) / "q")
            log.append([b"x" * size] * count)
            best = min(_time_reads(log) for _ in range(RUNS)) / count
            print(f"  read back {count} records of {size:4} bytes: {best * 1e9:6.0f} ns/record")
            log.close()


def _time_reads(log: SegmentLog) -> float:
    start, seq = time.perf_counter(), log.first_seq
    while records := log.read(seq, 1000):
        seq = records[-1][0] + 1
    return time.perf_counter() - start


def main() -> None:
    # Under ./var, not /tmp: /tmp may be tmpfs, where fsync costs nothing.
    Path("var").mkdir(exist_ok=True)
    asyncio.run(main_async())
    checkpoint_updates()
    read_back()


if __name__ == "__main__":
    main()
