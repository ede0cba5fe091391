"""Routing cost per message against the number of bindings on one exchange.

Each binding has its own prefix and queue, and each message matches exactly one binding,
for prefixes of one length and of many, one message at a time and as the data path
publishes runs. ``--many-routes`` and ``--sampling`` measure route joining and the
routing-time histogram (docs/bench.md, "Routing").
"""

from __future__ import annotations

import statistics
import sys
import time

from fqbroker.core.message import Message, runs_of
from fqbroker.core.router import ClientStats, Router, RouteTimes

MESSAGES = 20_000
RUNS = 7
READ = 64  # messages per read on the data path


class Sink:
    """A target that accepts everything: the benchmark measures routing, not storage."""

    is_full = False
    blocks = False
    rejects = False
    name = b"sink"
    room = 1 << 62
    room_bytes = 1 << 62

    def __init__(self) -> None:
        self.count = 0

    def offer(self, frames: list[bytes], size: int = -1) -> int:
        self.count += len(frames)
        return len(frames)

    def takes(self, frames: list[bytes]) -> int:
        return len(frames)

    async def wait_not_full(self) -> None:
        return None


def _prefixes(n: int, varied: bool) -> list[bytes]:
    if not varied:
        return [b"svc.%06d." % i for i in range(n)]
    # Lengths from 5 to 60: many distinct lengths, every prefix distinct.
    return [(b"p%d." % i) + b"x" * (i % 50) for i in range(n)]


def ns_per_message(bindings: int, varied: bool, reads: bool = False) -> float:
    router = Router()
    prefixes = _prefixes(bindings, varied)
    for prefix in prefixes:
        router.bind(b"ex", b'prefix:"' + prefix + b'"', Sink(), 0)
    step = max(1, bindings // 97)
    messages = [
        Message(b"ex", prefixes[(i * step) % bindings] + b"tail.route", b"payload")
        for i in range(MESSAGES)
    ]
    publish = router.publish
    publish_runs = router.publish_runs
    client = ClientStats()
    batches = [runs_of(messages[i : i + READ]) for i in range(0, MESSAGES, READ)]
    samples = []
    for _ in range(RUNS):
        if reads:
            # The decoder makes new runs for each read; copying the list stands for that.
            start = time.perf_counter_ns()
            for runs in batches:
                publish_runs(list(runs), 0, client)
        else:
            start = time.perf_counter_ns()
            for msg in messages:
                publish(msg)
        samples.append((time.perf_counter_ns() - start) / MESSAGES)
    assert router.aggregate.no_route == 0
    return statistics.median(samples)


def sampling() -> None:
    router = Router()
    router.bind(b"ex", b'prefix:"a."', Sink(), 0)
    msg = Message(b"ex", b"a.b", b"payload")
    publish = router.publish
    best: dict[bool, float] = {}

    def publish_timed(msg: Message) -> None:
        router.sample = True
        publish(msg)

    for _ in range(RUNS):  # interleaved, so a busy moment hits both alike
        for timed in (False, True):
            run = publish_timed if timed else publish
            for _ in range(5):
                start = time.perf_counter_ns()
                for _ in range(5000):
                    run(msg)
                ns = (time.perf_counter_ns() - start) / 5000
                best[timed] = min(best.get(timed, ns), ns)
    print(
        f"  Router.publish, one message a batch: {best[False]:.0f} ns untimed, "
        f"{best[True]:.0f} ns timed (at most {1 / RouteTimes.SAMPLE_SECONDS:.0f} a second)"
    )


def many_routes() -> None:
    """The data path's reads when no two messages in a row share a route (the bench row
    "1 to 1, 100 B, 1,000 routes"): each message a run of its own, all into the same
    queue(s), against the same reads on one route. Thread CPU time, so a busy box
    (other processes on the cores) does not count; median of RUNS."""
    for queues in (1, 8):
        for routes in (1, 1000):
            router = Router()
            for _ in range(queues):
                router.bind(b"ex", b"prefix:", Sink())
            messages = [
                Message(b"ex", b"r.%d" % (i % routes), b"x" * 100, bytes(16), b"user")
                for i in range(MESSAGES)
            ]
            batches = [runs_of(messages[i : i + READ]) for i in range(0, MESSAGES, READ)]
            client = ClientStats()
            samples = []
            for _ in range(RUNS):
                start = time.thread_time_ns()
                for runs in batches:
                    router.publish_runs(list(runs), 0, client)
                samples.append((time.thread_time_ns() - start) / MESSAGES)
            print(
                f"  reads of {READ}, {routes:>4} route(s) into {queues} queue(s): "
                f"{statistics.median(samples):6.0f} ns/message"
            )


def main() -> None:
    if "--sampling" in sys.argv[1:]:
        sampling()
        return
    if "--many-routes" in sys.argv[1:]:
        many_routes()
        return
    for reads in (False, True):
        how = f"reads of {READ}" if reads else "one at a time"
        for varied in (False, True):
            shape = "prefixes of many lengths" if varied else "same-length prefixes"
            base = None
            for n in (1, 100, 10_000):
                ns = ns_per_message(n, varied, reads)
                base = base or ns
                print(
                    f"  {how:13} {shape:26} {n:>6} bindings: {ns:8.0f} ns/message"
                    f"  ({ns / base:4.2f}x)"
                )


if __name__ == "__main__":
    main()
