"""Exchanges, bindings and routing, sans I/O (fqd_routemgr.c, fqd_config.c).

Each exchange indexes its bindings and remembers what a route reaches
(:mod:`fqbroker.core.exchange`), so routing costs the same however many bindings and
routes there are (docs/fq-protocol.md §2.3 has the rules and how they are kept).
Outcomes are counters, never exceptions. There is one way in,
:meth:`Router.publish_runs`, which every front end reaches through a
:class:`~fqbroker.core.publisher.Publisher`, and one place counters move,
:meth:`Router.count`; targets are anything with the :class:`Target` protocol.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from fqbroker.core.bindflags import BIND_ILLEGAL, BindFlags
from fqbroker.core.budget import fitting
from fqbroker.core.dedup import DedupLimits
from fqbroker.core.exchange import Binding, Exchange, Reach
from fqbroker.core.message import Message, Run, message_from_frame
from fqbroker.core.program import RuleRegistry, compile_program
from fqbroker.core.queue import Queue
from fqbroker.core.routestats import AggregateStats, ClientStats, Counts, RouteTimes
from fqbroker.core.targets import Sink, Target
from fqbroker.errors import ProgramError

__all__ = [
    "AggregateStats",
    "Binding",
    "ClientStats",
    "Counts",
    "Exchange",
    "PublishResult",
    "RouteTimes",
    "Router",
    "Sink",
    "Target",
]

perf_counter_ns = time.perf_counter_ns

_UNKNOWN: Final = Reach([], False)  # a route not looked up yet
_NO_GROUP: Final = Reach([], False)  # publish_runs has no joined runs waiting

_NOWHERE = Exchange(b"")  # publish_runs' exchange of no joined runs: never counted on
_NO_FRAMES: list[bytes] = []  # never added to


def _gather(
    gathered: dict[Target, list[Any]], hits: list[Binding], frames: list[bytes], n: int, raw: int
) -> int:
    """Gather ``n`` messages (``frames``, ``raw`` bytes) for each binding of ``hits``
    (none of which blocks); returns how many of them the queues will drop.

    Each queue's room is read when it is first gathered for, then used up by every
    message gathered for it, in order: the drops counted add up over runs exactly as one
    by one (a message is dropped once no room is left before it).
    """
    dropped = 0
    for binding in hits:
        binding.invocations += n
        queue = binding.queue
        slot = gathered.get(queue)
        if slot is None:
            slot = gathered[queue] = [queue.room, queue.room_bytes, [], 0]
        # Typed locals: compiled, the counts are C integers between the list's items.
        waiting: list[bytes] = slot[2]
        waiting += frames
        gathered_raw: int = slot[3]
        slot[3] = gathered_raw + raw
        room: int = slot[0]
        slot[0] = room - n
        room_bytes: int = slot[1]
        slot[1] = room_bytes - raw
        if room < n or room_bytes < raw:
            dropped += n - max(min(room, fitting(frames, room_bytes)), 0)
    return dropped


# What reject-policy queues refused of a run: the first queue that did, the copies
# refused by all of them, and the index in the run of the first message refused.
Refused = tuple[Target, int, int]


def _one_more(refused: Refused, copies: int, at: int = -1) -> Refused:
    first = refused[2] if at < 0 else min(refused[2], at)
    return (refused[0], refused[1] + copies, first)


def _settle_group(
    ex: Exchange,
    hits: list[Binding],
    frames: list[bytes],
    heads: int,
    gathered: dict[Target, list[Any]] | None,
) -> tuple[int, int, int, int]:
    """Count a group of joined runs on ``ex`` and gather it for its bindings' queues, or
    offer it to them at once when ``gathered`` is None (nothing else is waiting to go
    first). Returns its messages, payload bytes, routed and dropped; with no binding,
    all its messages are ``no_route``, counted on ``ex`` here and by the caller."""
    n = len(frames)
    raw = sum(map(len, frames)) if n != 1 else len(frames[0])
    size = raw - heads
    ex.messages += n
    ex.octets += size
    if not hits:
        ex.no_route += n
        return n, size, 0, 0
    if gathered is not None:
        dropped = _gather(gathered, hits, frames, n, raw)
    else:
        dropped = 0
        for binding in hits:
            binding.invocations += n
            target = binding.queue
            if isinstance(target, Queue):
                # A direct call of the compiled method, not one through the protocol
                # (a Python-level call with its arguments parsed: a burst's every queue).
                dropped += n - target.offer(frames, raw)
            else:
                dropped += n - target.offer(frames, raw)
    routed = n * len(hits)
    ex.routed += routed
    if dropped:
        ex.dropped += dropped
    return n, size, routed, dropped


@dataclass(slots=True)
class PublishResult:
    routed: int = 0
    dropped: int = 0
    no_route: int = 0
    no_exchange: int = 0
    size_dropped: int = 0  # never, for a message already decoded; there for Counts
    # Block-policy targets now full: the publisher should wait on them before sending more.
    blocked: Sequence[Target] = ()


class Router:
    """All exchanges and bindings of one broker."""

    def __init__(self, registry: RuleRegistry | None = None) -> None:
        self.exchanges: dict[bytes, Exchange] = {}
        self.aggregate = AggregateStats()
        self.registry = registry
        self.times = RouteTimes()
        self.sample = False  # time the next batch (RouteTimes)
        self._last_route_id = 0
        # Copies refused by full reject-policy queues (counted dropped too); of the last
        # publish_runs call that refused one, the first queue that did and how many
        # messages that call published before the first refused one. A publisher compares
        # the count before and after its call to learn which of its messages was refused.
        self.rejected = 0
        self.rejected_by = b""
        self.rejected_after = 0
        # How long and how many ids each queue remembers for publishers that opted in to
        # de-duplication (core/dedup.py); the broker sets it from its settings.
        self.dedup = DedupLimits()

    # --- bindings -------------------------------------------------------------------------

    def _next_route_id(self) -> int:
        route_id = self._last_route_id + 1
        if route_id >= BIND_ILLEGAL:  # ids run 1 .. 0xfffffffe, then wrap
            route_id = 1
        self._last_route_id = route_id
        return route_id

    def bind(self, exchange: bytes, program: bytes, queue: Target, flags: int = 0) -> Binding:
        """Bind ``program`` on ``exchange`` to ``queue``; raises ProgramError if it won't compile.

        Binding the same program to the same queue and exchange again returns the existing
        binding, with its permanence changed as ``flags`` say (docs/fq-protocol.md §2.5).
        """
        compiled = compile_program(program, self.registry)
        ex = self.exchanges.get(exchange)
        if ex is None:
            ex = self.exchanges[exchange] = Exchange(exchange)
        binding = ex.find(queue, compiled.text)
        if binding is None:
            binding = Binding(self._next_route_id(), ex, compiled, queue)
            ex.add(binding)
        if flags & BindFlags.PEER:
            binding.peer = True
        if flags & BindFlags.PERM == BindFlags.PERM:
            binding.permanent = True
        elif flags & BindFlags.PERM == BindFlags.TRANS:
            binding.permanent = False
        return binding

    def try_bind(self, exchange: bytes, program: bytes, queue: Target, flags: int = 0) -> int:
        """``bind`` as the wire answers it: the route id, or BIND_ILLEGAL."""
        try:
            return self.bind(exchange, program, queue, flags).route_id
        except ProgramError:
            return BIND_ILLEGAL

    def unbind(self, exchange: bytes, route_id: int, queue: Target) -> Binding | None:
        """Remove the caller's own binding; None when nothing matched
        (docs/fq-protocol.md §2.5)."""
        ex = self.exchanges.get(exchange)
        if ex is None:
            return None
        binding = ex.bindings.get(route_id)
        if binding is None or binding.queue is not queue:
            return None
        ex.remove(binding)
        return binding

    def unbind_queue(self, queue: Target) -> list[Binding]:
        """Remove every binding into ``queue`` (its queue is going away)."""
        removed = []
        for ex in self.exchanges.values():
            for binding in [b for b in ex.bindings.values() if b.queue is queue]:
                ex.remove(binding)
                removed.append(binding)
        return removed

    def bindings(self) -> Iterable[Binding]:
        for ex in self.exchanges.values():
            yield from ex.bindings.values()

    # --- routing --------------------------------------------------------------------------

    @staticmethod
    def _route_by_programs(ex: Exchange, msg: Message) -> list[Target]:
        targets: list[Target] = []
        for bucket in ex.candidates(msg.route):
            for binding in bucket:
                queue = binding.queue
                # Identity, not equality: a queue is a target once however many rules match.
                if any(t is queue for t in targets):
                    continue
                binding.invocations += 1
                if binding.matches(msg):
                    targets.append(queue)
        return targets

    def publish_runs(
        self, runs: list[Run], start: int, client: Counts
    ) -> tuple[int, int, list[Target]]:
        """Publish ``runs[start:]``: every front end's way in, a read's (or a batch's) worth
        at a time (:class:`~fqbroker.core.publisher.Publisher` calls it).

        Each run is routed once. What drop-policy queues get is gathered per queue and
        offered in one call at the end, their room counted while gathering, so the same
        messages are dropped as one by one. Consecutive runs whose routes reach the very
        same bindings (one shared Reach: :meth:`Exchange.hits`) are joined first and
        gathered as one, so many routes into few queues cost a run a few lookups, not a
        walk over its targets; each queue still gets its messages in the order sent. A run
        that reaches a block- or reject-policy queue, or needs programs run, is published
        exactly after what was gathered, and stops after the message that leaves a
        block-policy queue full; what reject-policy queues refuse is counted in
        :attr:`rejected`.

        Returns the index to go on from, the messages published and the block-policy
        targets now full (publish again after waiting on them); when a run was published
        in part, ``runs[index]`` is replaced by its rest. Counters move here only: each
        run's on its exchange, the batch's in the aggregate and on ``client`` at the end.
        """
        exchanges = self.exchanges
        # queue -> [room left, bytes left, frames, their bytes]
        gathered: dict[Target, list[Any]] = {}
        messages = octets = routed = dropped = no_route = no_exchange = 0
        # The joined runs not gathered yet: their Reach (_NO_GROUP: none), exchange,
        # frames (a run's own list until a second run joins) and the bytes of their heads
        # (frame bytes less these are payload bytes): what else is counted is counted
        # once a group is whole, as little as possible done per run.
        group = _NO_GROUP
        group_ex = _NOWHERE
        group_frames = _NO_FRAMES
        joined = False
        group_heads = 0
        # The exchange of the run before, and its routes' reach: runs on many routes of one
        # exchange compare a name rather than look the exchange up each.
        ex = _NOWHERE
        last_name = None
        reached = _NOWHERE.reach_by_route
        timed = perf_counter_ns() if self.sample else 0  # RouteTimes: a sampled batch
        refusals = self.rejected  # what reject-policy queues refused before this call
        i = start
        end = len(runs)  # runs[i] may be replaced by its rest, never added to
        try:
            while i < end:
                exchange, route, frames, head = runs[i]
                n = len(frames)
                if exchange != last_name:
                    found = exchanges.get(exchange)
                    if found is None:
                        i += 1
                        messages += n
                        octets += (sum(map(len, frames)) if n > 1 else len(frames[0])) - n * head
                        no_exchange += n
                        no_route += n
                        continue
                    ex = found
                    last_name = exchange
                    reached = ex.reach_by_route  # the same dict for good: forget() clears it
                reach = reached.get(route, _UNKNOWN)
                if reach is group:
                    # The same bindings as the run before: joined to it.
                    i += 1
                    if joined:
                        group_frames += frames
                    else:
                        group_frames = group_frames + frames  # not the first run's list
                        joined = True
                    group_heads += n * head
                    continue
                if reach is _UNKNOWN:
                    reach = ex.hits(route)
                    if reach is group:
                        continue  # joined as above, next time round
                if group is not _NO_GROUP:
                    hits = group.hits
                    group = _NO_GROUP  # never gathered twice, even on an error
                    group_n, group_size, run_routed, run_dropped = _settle_group(
                        group_ex, hits, group_frames, group_heads, gathered
                    )
                    messages += group_n
                    octets += group_size
                    routed += run_routed
                    dropped += run_dropped
                    if not hits:
                        no_route += group_n
                if reach is not None and not reach.blocks:
                    i += 1
                    group = reach
                    group_ex = ex
                    group_frames = frames
                    joined = False
                    group_heads = n * head
                    continue
                # Exactly as one by one, so everything gathered goes first.
                self._offer_gathered(gathered)
                gathered = {}
                if reach is None:
                    n, size, run_routed, run_dropped, run_no_route, blocked, refused = (
                        self._publish_each(ex, frames, head)
                    )
                else:
                    n, size, run_routed, run_dropped, blocked, refused = _publish_exactly(
                        reach.hits, frames, head
                    )
                    run_no_route = 0
                if refused is not None:
                    if self.rejected == refusals:  # the call's first: where it was
                        self.rejected_by = refused[0].name
                        self.rejected_after = messages + refused[2]
                    self.rejected += refused[1]
                if n < len(frames):
                    runs[i] = (exchange, route, frames[n:], head)
                else:
                    i += 1
                ex.messages += n
                ex.octets += size
                messages += n
                octets += size
                ex.routed += run_routed
                routed += run_routed
                ex.dropped += run_dropped
                dropped += run_dropped
                ex.no_route += run_no_route
                no_route += run_no_route
                if blocked:
                    return i, messages, blocked
            # The last runs are gathered (or offered) on the way out.
            return i, messages + (len(group_frames) if group is not _NO_GROUP else 0), []
        finally:
            if group is not _NO_GROUP:
                hits = group.hits
                # Nothing else gathered (a read on one route, say): offered as it is.
                group_n, group_size, run_routed, run_dropped = _settle_group(
                    group_ex, hits, group_frames, group_heads, gathered if gathered else None
                )
                messages += group_n
                octets += group_size
                routed += run_routed
                dropped += run_dropped
                if not hits:
                    no_route += group_n
            if gathered:
                self._offer_gathered(gathered)
            self.count(client, messages, octets, no_exchange, no_route, routed, dropped)
            if timed:
                self.sample = False
                self.times.observe(perf_counter_ns() - timed, messages)

    def count(
        self,
        client: Counts,
        messages: int = 0,
        octets: int = 0,
        no_exchange: int = 0,
        no_route: int = 0,
        routed: int = 0,
        dropped: int = 0,
        size_dropped: int = 0,
    ) -> None:
        """Add outcomes to the aggregate and to the publisher's counters: the one place
        they join, for routing and for what is lost before it (too large to take) or
        after it (a failed disk write). Once per batch, never per message."""
        agg = self.aggregate
        agg.messages += messages
        agg.octets += octets
        # Most batches move few of these: a test is cheaper than adding nothing.
        if routed:
            agg.routed += routed
            client.routed += routed
        if dropped:
            agg.dropped += dropped
            client.dropped += dropped
        if no_route:
            agg.no_route += no_route
            client.no_route += no_route
            if no_exchange:
                agg.no_exchange += no_exchange
                client.no_exchange += no_exchange
        if size_dropped:
            agg.size_dropped += size_dropped
            client.size_dropped += size_dropped

    def count_denied(self, client: ClientStats, exchange: bytes, n: int) -> None:
        """Messages dropped unrouted as their publisher may not publish on ``exchange``
        (fqbroker/core/permissions.py). The exchange counts them only if it exists: a
        publisher inventing names must not create exchanges."""
        client.denied += n
        self.aggregate.denied += n
        ex = self.exchanges.get(exchange)
        if ex is not None:
            ex.denied += n

    @staticmethod
    def _offer_gathered(gathered: dict[Target, list[Any]]) -> None:
        for queue, slot in gathered.items():
            frames: list[bytes] = slot[2]
            if frames:
                size: int = slot[3]
                queue.offer(frames, size)

    def _publish_each(
        self, ex: Exchange, frames: list[bytes], head: int
    ) -> tuple[int, int, int, int, int, list[Target], Refused | None]:
        """A run whose targets depend on more than its route: one message at a time.

        Stops after the first message that leaves a block-policy target full. Returns the
        frames published, their payload bytes, routed, dropped, no_route, those targets,
        and what reject-policy queues refused (as :func:`_publish_exactly`).
        """
        routed = dropped = no_route = 0
        blocked: list[Target] = []
        refused: Refused | None = None
        n = 0
        for frame in frames:
            n += 1
            targets = self._route_by_programs(ex, message_from_frame(frame))
            if not targets:
                no_route += 1
                continue
            one = [frame]
            for queue in targets:
                if not queue.offer(one):
                    dropped += 1
                    if queue.rejects:
                        refused = (queue, 1, n - 1) if refused is None else _one_more(refused, 1)
                elif queue.is_full:
                    blocked.append(queue)
            routed += len(targets)
            if blocked:
                break
        size = sum(map(len, frames[:n] if n < len(frames) else frames)) - n * head
        return n, size, routed, dropped, no_route, blocked, refused

    def publish(self, msg: Message, client: ClientStats | None = None) -> PublishResult:
        """Publish one message, as a run of one, and say what became of it
        (docs/fq-protocol.md §1.6/§2.6)."""
        frame = msg.peer_frame()
        runs: list[Run] = [(msg.exchange, msg.route, [frame], len(frame) - len(msg.payload))]
        if client is None:
            result = PublishResult()
            result.blocked = self.publish_runs(runs, 0, result)[2]
            return result
        before = (client.routed, client.dropped, client.no_route, client.no_exchange)
        blocked = self.publish_runs(runs, 0, client)[2]
        return PublishResult(
            client.routed - before[0],
            client.dropped - before[1],
            client.no_route - before[2],
            client.no_exchange - before[3],
            blocked=blocked,
        )


def _publish_exactly(
    hits: list[Binding], frames: list[bytes], head: int
) -> tuple[int, int, int, int, list[Target], Refused | None]:
    """A run with a block- or reject-policy target, whose targets follow from its route.

    Stops after the first message that leaves a block-policy target full. Returns the
    frames published, their payload bytes, routed, dropped, those targets, and what
    reject-policy queues refused: None, or the first such queue and the copies refused.
    """
    n = len(frames)
    for binding in hits:
        queue = binding.queue
        if queue.blocks:
            n = min(n, queue.takes(frames))  # it takes the message that fills it
    batch = frames if n == len(frames) else frames[:n]
    size = sum(map(len, batch)) - n * head
    dropped = 0
    blocked: list[Target] = []
    refused: Refused | None = None
    for binding in hits:
        binding.invocations += n
        queue = binding.queue
        took = queue.offer(batch)
        lost = n - took
        dropped += lost
        if lost and queue.rejects:
            # A queue takes what fits and refuses the rest: the first refused is at took.
            refused = (queue, lost, took) if refused is None else _one_more(refused, lost, took)
        if queue.is_full:
            blocked.append(queue)
    return n, size, n * len(hits), dropped, blocked, refused
