"""The OpenCluster listener's per-set CPU, in process, without sockets.

    python -m bench.ocmicro [--rounds 2000] [--conns 50] [--depth 16] [--repeats 5] [--sync normal]

Real machines and a real store fed pre-encoded reads of set frames: the loop's work of the
SET row less the sockets. Prints ns per set, best and median of the repeats; how to run an
A/B of two trees is in docs/bench.md, "OpenCluster per set".
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import statistics
import tempfile
import time
from pathlib import Path

from fqbroker.frontends.opencluster.machine import Limits, Machine
from fqbroker.protocols.opencluster import wire
from fqbroker.storage.kv.store import KVStore

LIMITS = Limits(1024, 1 << 20, (1 << 20) + 1088, 1024)


def chunk(conn: int, depth: int, size: int) -> bytes:
    names = [b"oc.micro.%d.%d" % (conn, i) for i in range(depth)]
    return b"".join(
        wire.set_string(i, n, (n + b"=").ljust(size, b"v")[:size]) for i, n in enumerate(names)
    )


async def one(rounds: int, conns: int, depth: int, size: int, sync: str) -> tuple[float, float]:
    """(wall ns, CPU ns) per set of one pass."""
    with tempfile.TemporaryDirectory() as tmp:
        store = KVStore(Path(tmp) / "kv.sqlite3", sync=sync, fold_bytes=1 << 40)
        machines = [Machine(store, LIMITS) for _ in range(conns)]
        for m in machines:
            m.receive(wire.hello(0))
        reads = [chunk(c, depth, size) for c in range(conns)]
        expect = depth * wire.HEADER_SIZE
        work = list(zip(machines, reads, strict=True))
        wall0, cpu0 = time.perf_counter_ns(), time.process_time_ns()
        for _ in range(rounds):
            for m, data in work:
                m.receive(data)
            store._commit()
            batch = machines[0].waiting
            if batch is not None and not batch.done:
                done = asyncio.Event()
                batch.waiters.append(done.set)
                await done.wait()
            for m in machines:
                if len(m.committed()) != expect:
                    raise RuntimeError("a round's acks are not all there")
        wall1, cpu1 = time.perf_counter_ns(), time.process_time_ns()
        await store.close()
    sets = rounds * conns * depth
    return (wall1 - wall0) / sets, (cpu1 - cpu0) / sets


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.ocmicro")
    p.add_argument("--rounds", type=int, default=2000)
    p.add_argument("--conns", type=int, default=50)
    p.add_argument("--depth", type=int, default=16)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--sync", default="normal", choices=["normal", "full"])
    p.add_argument("--profile", action="store_true")
    a = p.parse_args(argv)

    def run() -> tuple[float, float]:
        return asyncio.run(one(a.rounds, a.conns, a.depth, a.size, a.sync))

    if a.profile:
        profile = cProfile.Profile()
        profile.runcall(run)
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        return
    runs = [run() for _ in range(a.repeats)]
    walls, cpus = [r[0] for r in runs], [r[1] for r in runs]
    print(
        json.dumps(
            {
                "wall_ns_best": round(min(walls)),
                "wall_ns_median": round(statistics.median(walls)),
                "cpu_ns_best": round(min(cpus)),
                "cpu_ns_median": round(statistics.median(cpus)),
                "sync": a.sync,
            }
        )
    )


if __name__ == "__main__":
    main()
