"""What permissions cost the data path: a publisher's ns per message with and without them.

Four publishers into a router whose one binding takes everything: ``none`` (no
permissions), ``ALL``, ``allowed`` and ``denied`` (docs/bench.md, "Permissions"). Prints
the median over interleaved runs and the ratio to ``none``.
"""

from __future__ import annotations

import statistics
import time

from fqbroker.core.message import Message, Run, runs_of
from fqbroker.core.permissions import Permissions
from fqbroker.core.publisher import DurableStore, Publisher
from fqbroker.core.router import Router

from .routing import Sink

MESSAGES = 64_000
RUNS = 15
READ = 64  # messages per read
RUN = 8  # messages in a row on one exchange


def _no_disk() -> tuple[list[DurableStore], int, int]:
    return [], 0, 0


def _publisher(permissions: Permissions | None) -> tuple[Publisher, list[list[Run]]]:
    router = Router()
    router.bind(b"logs.web", b"prefix:", Sink(), 0)
    router.bind(b"logs.app", b"prefix:", Sink(), 0)
    messages = [
        Message(b"logs.web" if (i // RUN) % 2 else b"logs.app", b"r", b"payload")
        for i in range(MESSAGES)
    ]
    batches = [runs_of(messages[i : i + READ]) for i in range(0, MESSAGES, READ)]
    return Publisher(router, _no_disk, permissions=permissions), batches


def _ns_per_message(publisher: Publisher, batches: list[list[Run]]) -> float:
    start = time.perf_counter_ns()
    for runs in batches:
        publisher.publish(list(runs), 0)  # the decoder makes new runs for each read
    return (time.perf_counter_ns() - start) / MESSAGES


def main() -> None:
    cases: list[tuple[str, Permissions | None]] = [
        ("none", None),
        ("ALL", Permissions.ALL),
        ("allowed", Permissions.from_rules([("publish", "logs.*", True)])),
        ("denied", Permissions.from_rules([("publish", "metrics.*", True)])),
    ]
    setups = [(name, *_publisher(permissions)) for name, permissions in cases]
    samples: dict[str, list[float]] = {name: [] for name, _ in cases}
    # Interleaved, so a neighbour's load on a shared machine falls on every case alike.
    for _ in range(RUNS):
        for name, publisher, batches in setups:
            samples[name].append(_ns_per_message(publisher, batches))
    base = statistics.median(samples["none"])
    for name, _ in cases:
        ns = statistics.median(samples[name])
        print(f"  {name:8} {ns:8.0f} ns/message  ({ns / base:4.2f}x)")


if __name__ == "__main__":
    main()
