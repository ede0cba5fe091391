"""The router's counters and timings (docs/fq-protocol.md §1.6, /metrics).

Outcome counters per publisher (:class:`ClientStats`) and in the aggregate
(:class:`AggregateStats`), what a publish adds to (:class:`Counts`), and the sampled
histogram of routing time (:class:`RouteTimes`). :mod:`fqbroker.core.router` moves them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

__all__ = ["AggregateStats", "ClientStats", "Counts", "RouteTimes"]


class Counts(Protocol):
    """The outcome counters a publish adds to besides the aggregate
    (docs/fq-protocol.md §1.6): a publisher's :class:`ClientStats`, or the
    :class:`PublishResult` of one message."""

    no_exchange: int
    no_route: int
    routed: int
    dropped: int
    size_dropped: int


@dataclass(slots=True)
class ClientStats:
    """A client's counters, in the order of the status reply (docs/fq-protocol.md §1.6)."""

    no_exchange: int = 0
    no_route: int = 0
    routed: int = 0
    dropped: int = 0
    size_dropped: int = 0
    msgs_in: int = 0
    msgs_out: int = 0
    octets_in: int = 0
    octets_out: int = 0
    # Not in fq's status reply (auth = "password" only): messages its user may not
    # publish, dropped before routing (fqbroker/core/permissions.py).
    denied: int = 0


@dataclass(slots=True)
class AggregateStats:
    no_exchange: int = 0
    messages: int = 0
    octets: int = 0
    no_route: int = 0
    routed: int = 0
    dropped: int = 0
    size_dropped: int = 0
    denied: int = 0  # not fqd's: dropped as their publisher may not publish there


class RouteTimes:
    """How long routing takes: a histogram of the time :meth:`Router.publish_runs` spends on
    a batch (the lookups, programs and offers into queues of one read's messages).

    Sampled, so the hot path pays nearly nothing: whoever runs the router sets
    :attr:`Router.sample` every :data:`SAMPLE_SECONDS` (the broker, on a timer), and the
    next batch is timed (two clock reads and a bucket increment); every other batch costs
    one attribute test. A counter or a clock read per batch would cost more than the
    attribute test by a multiple (bench/routing.py ``--sampling``). Bucket ``i`` counts
    batches under ``1024 << i`` ns (about 1 µs, doubling up to half a second), the last
    one everything slower. ``messages`` counts the messages of the timed batches, so
    ``sum_ns / messages`` is the time per message.
    """

    __slots__ = ("buckets", "messages", "sum_ns")

    # ClassVar: read through the class, which compiled (mypyc) code wants declared.
    BUCKETS: ClassVar[int] = 21  # 20 bounds, then +Inf
    SAMPLE_SECONDS: ClassVar[float] = 0.05  # at most 20 timed batches a second

    def __init__(self) -> None:
        self.buckets = [0] * self.BUCKETS
        self.sum_ns = 0
        self.messages = 0

    def observe(self, elapsed_ns: int, messages: int) -> None:
        self.buckets[min((elapsed_ns >> 10).bit_length(), self.BUCKETS - 1)] += 1
        self.sum_ns += elapsed_ns
        self.messages += messages

    @classmethod
    def bounds_seconds(cls) -> list[float]:
        """The upper bound of each bucket but the last, in seconds."""
        return [(1024 << i) / 1e9 for i in range(cls.BUCKETS - 1)]
