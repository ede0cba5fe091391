"""The replay row: ``fyrehose sub --start 1`` reading N retained messages of an idle stream.

``python -m bench.fyrehosereplay [--count N] [--runs R] [--tree PATH]`` starts a broker with
a fyrehose listener, PUSHes N 100-byte messages, then times the console script
``fyrehose sub --start 1 --count N`` from its start to its exit (the process start is in the
time: about a third of a second) and reports msg/s, the median of the runs. With ``--tree``
the broker and the console script import fqbroker from that checkout (a before/after); the
publisher is this tree's. Nothing else is published meanwhile: the whole replay comes from
REQUESTs, none from the live stream. ``--live RATE`` publishes RATE messages a second
meanwhile: the replay then comes through gap recovery (the live stream is ahead of it).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.harness import ENV, ROOT, FqBroker, env_for, spawn, stop_process
from fqbroker.clients.fyrehose.client import FyrehoseClient

SIZE = 100


async def _fill(port: int, count: int) -> None:
    async with await FyrehoseClient.connect("127.0.0.1", port, subscribe=False) as pub:
        for i in range(count):
            pub.publish_nowait(b"%08d" % i + bytes(SIZE - 8))
            if i % 64 == 63:
                await asyncio.sleep(0.001)  # the broker's receive buffer is not endless
    await asyncio.sleep(0.5)


def _live(port: int, rate: int, stop: threading.Event) -> None:
    """Publish ``rate`` messages a second until ``stop`` (in a thread of its own)."""

    async def run() -> None:
        async with await FyrehoseClient.connect("127.0.0.1", port, subscribe=False) as pub:
            while not stop.is_set():
                pub.publish_nowait(b"live")
                await asyncio.sleep(1 / rate)

    asyncio.run(run())


def _replay(port: int, count: int, tree: Path | None, timeout: float) -> float:
    """Seconds for the console script to print ``count`` messages from sequence 1."""
    args = [
        sys.executable, "-m", "fqbroker.cli.fyrehose", "--port", str(port),
        "sub", "--start", "1", "--count", str(count),
    ]  # fmt: skip
    began = time.monotonic()
    proc = spawn(
        args,
        cwd=tree or ROOT,  # ``-m`` puts the working directory first on the path
        env=ENV if tree is None else env_for(tree),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        stop_process(proc)
    took = time.monotonic() - began
    lines = out.count(b"\n")
    if lines != count:
        raise SystemExit(f"replay printed {lines} lines of {count}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tree", type=Path, help="a checkout to measure instead")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--live", type=int, default=0, help="live messages a second meanwhile")
    args = parser.parse_args()
    broker = FqBroker(fyrehose=True, tree=args.tree)
    broker.start()
    stop = threading.Event()
    live = threading.Thread(target=_live, args=(broker.fh_port, args.live, stop))
    try:
        asyncio.run(_fill(broker.fh_port, args.count))
        if args.live:
            live.start()
        times = [
            _replay(broker.fh_port, args.count, args.tree, args.timeout) for _ in range(args.runs)
        ]
    finally:
        stop.set()
        if live.is_alive():
            live.join()
        broker.stop()
    median = statistics.median(times)
    runs = ", ".join(f"{t:.2f}" for t in times)
    print(
        f"fyrehose sub --start replay of {args.count:,} messages"
        f"{f' (live: {args.live}/s)' if args.live else ''}: "
        f"{args.count / median:,.0f} msg/s ({median:.2f} s; runs {runs})"
    )


if __name__ == "__main__":
    main()
