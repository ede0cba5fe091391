"""Routing cost per message against the number of bindings on one exchange.

Each binding has its own prefix (all distinct, as the issue asks) and its own queue; each
message matches exactly one binding, so the work per message is the lookup, one program
and one offer. Two prefix shapes are measured: same-length prefixes (one probe) and
prefixes of many lengths (one probe per distinct length, at most 128).
Prints the median over several runs and the ratio to the 1-binding figure.
"""

from __future__ import annotations

import statistics
import time

from fqbroker.core.message import Message
from fqbroker.core.router import Router

MESSAGES = 20_000
RUNS = 7


class Sink:
    """A target that accepts everything: the benchmark measures routing, not storage."""

    is_full = False
    blocks = False
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


def ns_per_message(bindings: int, varied: bool) -> float:
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
    samples = []
    for _ in range(RUNS):
        start = time.perf_counter_ns()
        for msg in messages:
            publish(msg)
        samples.append((time.perf_counter_ns() - start) / MESSAGES)
    assert router.aggregate.no_route == 0
    return statistics.median(samples)


def main() -> None:
    for varied in (False, True):
        shape = "prefixes of many lengths" if varied else "same-length prefixes"
        base = None
        for n in (1, 100, 10_000):
            ns = ns_per_message(n, varied)
            base = base or ns
            print(f"  {shape:26} {n:>6} bindings: {ns:8.0f} ns/message  ({ns / base:4.2f}x)")


if __name__ == "__main__":
    main()
