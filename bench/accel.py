"""What the compiled accelerator buys: CPU per message of the hot loops, compiled against
pure Python (fqbroker/accel.py), A/B in child processes taking turns.

    python -m bench.accel [--rounds 5] [fq fq-routes oc]

Each child measures one implementation and prints ns per message of process CPU; the
parent alternates them and prints the medians and their ratio. docs/bench.md says what
each scenario runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCENARIOS = ("fq", "fq-routes", "oc")
READ = 65536


def _fq(routes: int, messages: int = 100_000, repeats: int = 5) -> float:
    from fqbroker.core.frames import encode_publish
    from fqbroker.core.queue import Queue
    from fqbroker.core.queuespec import QueueSpec
    from fqbroker.core.router import ClientStats, Router
    from fqbroker.protocols.fq.msgdecoder import MessageDecoder

    router = Router()
    queue = Queue(QueueSpec(b"q", backlog=1 << 30), default_bytes=1 << 40)
    names = [b"r.%04d." % i for i in range(routes)]
    for name in names:
        router.bind(b"ex", b'prefix:"' + name + b'"', queue, 0)
    payload = b"x" * 100
    data = b"".join(
        encode_publish(b"ex", names[i % routes] + b"tail", bytes(16), payload)
        for i in range(messages)
    )
    reads = [data[i : i + READ] for i in range(0, len(data), READ)]
    client = ClientStats()
    sender, hops = b"user", bytes(4)
    best = float("inf")
    for _ in range(repeats):
        decoder = MessageDecoder(peer_format=False)
        got = 0
        start = time.process_time_ns()
        for chunk in reads:
            decoder.feed(chunk)
            runs = decoder.runs(sender, hops)
            i = 0
            while i < len(runs):
                i, _, full = router.publish_runs(runs, i, client)
                assert not full
            got += queue.take_out(1 << 30)[0]
        elapsed = time.process_time_ns() - start
        assert got == messages, got
        best = min(best, elapsed / messages)
    return best


def _oc(sets: int = 50_000, repeats: int = 5) -> float:
    from fqbroker.frontends.opencluster.machine import Limits, Machine
    from fqbroker.protocols.opencluster import wire
    from fqbroker.storage.kv.store import KVStore

    async def run(path: Path) -> float:
        store = KVStore(path / "kv.sqlite3", sync="normal")
        try:
            machine = Machine(store, Limits(64, 1024, 1 << 20, 1 << 30))
            machine.receive(wire.hello(0))
            frames = [wire.set_string(i, b"key%06d" % (i % 10_000), b"v" * 32) for i in range(sets)]
            reads = [b"".join(frames[i : i + 400]) for i in range(0, sets, 400)]
            best = float("inf")
            for _ in range(repeats):
                start = time.process_time_ns()
                for chunk in reads:
                    machine.receive(chunk)
                    batch = machine.waiting
                    while batch is not None:
                        if not batch.done:
                            done = asyncio.Event()
                            batch.waiters.append(done.set)
                            await done.wait()
                        machine.committed()
                        batch = machine.waiting
                best = min(best, (time.process_time_ns() - start) / sets)
            return best
        finally:
            await store.close()

    with tempfile.TemporaryDirectory() as tmp:
        return asyncio.run(run(Path(tmp)))


def child(scenario: str) -> None:
    import fqbroker

    ns = {"fq": lambda: _fq(1), "fq-routes": lambda: _fq(1000), "oc": _oc}[scenario]()
    print(json.dumps({"accelerated": fqbroker.ACCELERATED, "ns": ns}))


def _spawn(scenario: str, pure: bool) -> tuple[bool, float]:
    env = {**os.environ, "FQBROKER_PURE": "1" if pure else "0"}
    done = subprocess.run(
        [sys.executable, "-m", "bench.accel", "--child", scenario],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return bool(result["accelerated"]), float(result["ns"])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.accel", description=__doc__)
    parser.add_argument("scenarios", nargs="*", default=list(SCENARIOS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    for scenario in args.scenarios:
        pure: list[float] = []
        compiled: list[float] = []
        for _ in range(args.rounds):
            pure.append(_spawn(scenario, True)[1])
            accelerated, ns = _spawn(scenario, False)
            if not accelerated:
                sys.exit("the accelerator is not built (make accel): nothing to compare")
            compiled.append(ns)
        p, c = statistics.median(pure), statistics.median(compiled)
        print(
            f"{scenario:10} pure {p:7.0f} ns/msg  compiled {c:7.0f} ns/msg  "
            f"pure/compiled {p / c:4.2f}x  (medians of {args.rounds}; "
            f"pure {min(pure):.0f}-{max(pure):.0f}, "
            f"compiled {min(compiled):.0f}-{max(compiled):.0f})"
        )


if __name__ == "__main__":
    main()
