"""Exchanges, bindings and routing, sans I/O (fqd_routemgr.c, fqd_config.c).

Theory of operation
-------------------
An exchange exists from the first successful bind on it and is never deleted while the
broker runs (§2.1). Each binding joins a compiled program to a target queue under a
route id drawn from one global counter (§2.5).

Routing a message looks up candidate bindings by its route, not by scanning every
binding: bindings are indexed by their exact route (``exact:``) or by their prefix
(``prefix:``, a :class:`~fqbroker.core.prefixes.PrefixIndex`: one bisect and a short walk).
The cost is therefore flat in the number of bindings, as with fqd's prefix jump table.

Each queue receives a message at most once: once a queue is a target, its other
bindings are skipped and their ``invocations`` do not move (§2.3). The router then
offers the message to every target. Outcomes are counters, never exceptions: no
exchange, no route, routed (per target, even when then dropped) and dropped, kept per
exchange, in the aggregate and for the publishing client (§1.6, §2.6).

Targets are anything with the small :class:`Target` protocol, so the router knows
nothing of storage, sockets or any wire protocol; every front end publishes through
:meth:`Router.publish` the same way.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fqbroker.core.bindflags import BIND_ILLEGAL, BindFlags
from fqbroker.core.budget import fitting
from fqbroker.core.message import Message, Run, message_from_frame
from fqbroker.core.prefixes import PrefixIndex
from fqbroker.core.program import Program, RuleRegistry, compile_program
from fqbroker.errors import ProgramError

__all__ = [
    "AggregateStats",
    "Binding",
    "ClientStats",
    "Exchange",
    "PublishResult",
    "Router",
    "Target",
]

# avg_ns is a moving average with alpha 1/128, as in fqd (§2.3).
_AVG_SHIFT = 7


class Target(Protocol):
    """What a binding delivers into: a queue, as far as the router cares."""

    def offer(self, frames: list[bytes], size: int = -1) -> int:
        """Take these peer frames in order, up to the tail-drop limit; how many it took.

        ``size``: the frames' bytes, when the caller has counted them (-1: not).
        """
        ...

    blocks: bool
    """Block policy: full, it takes messages still and makes the publisher wait."""

    @property
    def room(self) -> int:
        """Messages it takes before it is full (0 or less: none)."""
        ...

    @property
    def room_bytes(self) -> int:
        """Bytes it takes before it is full: each message while this is over 0."""
        ...

    def takes(self, frames: list[bytes]) -> int:
        """Block policy: how many of ``frames`` it takes before it is full (at least 1)."""
        ...

    @property
    def is_full(self) -> bool:
        """Whether a publisher should wait before sending more (block policy)."""
        ...

    def wait_not_full(self) -> Awaitable[None]:
        """Resolves once the target has room again."""
        ...


@dataclass(slots=True)
class ClientStats:
    """A client's counters, in the order of the status reply (§1.6)."""

    no_exchange: int = 0
    no_route: int = 0
    routed: int = 0
    dropped: int = 0
    size_dropped: int = 0
    msgs_in: int = 0
    msgs_out: int = 0
    octets_in: int = 0
    octets_out: int = 0


@dataclass(slots=True)
class AggregateStats:
    no_exchange: int = 0
    messages: int = 0
    octets: int = 0
    no_route: int = 0
    routed: int = 0
    dropped: int = 0
    size_dropped: int = 0


@dataclass(slots=True, eq=False)
class Binding:
    route_id: int
    exchange: Exchange
    program: Program
    queue: Target
    permanent: bool = False
    peer: bool = False
    invocations: int = 0
    avg_ns: int = 0

    def matches(self, msg: Message) -> bool:
        if self.program.always_true:
            return True
        start = time.perf_counter_ns()
        hit = self.program.evaluate(msg)
        elapsed = time.perf_counter_ns() - start
        self.avg_ns += (elapsed - self.avg_ns) >> _AVG_SHIFT
        return hit


@dataclass(slots=True, eq=False)
class Exchange:
    name: bytes
    messages: int = 0
    octets: int = 0
    no_route: int = 0
    routed: int = 0
    dropped: int = 0
    bindings: dict[int, Binding] = field(default_factory=dict)
    # (id of the target queue, program text) -> binding: finds a duplicate bind in O(1).
    _by_owner: dict[tuple[int, bytes], Binding] = field(default_factory=dict)
    _by_exact: dict[bytes, list[Binding]] = field(default_factory=dict)
    _by_prefix: PrefixIndex[Binding] = field(default_factory=PrefixIndex)
    # route -> the bindings a message on it reaches, when no program looks past the route
    # (None when one does); cleared whenever a binding comes or goes.
    _hits: dict[bytes, list[Binding] | None] = field(default_factory=dict)

    def add(self, binding: Binding) -> None:
        self._hits.clear()
        self.bindings[binding.route_id] = binding
        program = binding.program
        self._by_owner[id(binding.queue), program.text] = binding
        if program.exact:
            self._by_exact.setdefault(program.prefix, []).append(binding)
        else:
            self._by_prefix.add(program.prefix, binding)

    def remove(self, binding: Binding) -> None:
        self._hits.clear()
        del self.bindings[binding.route_id]
        program = binding.program
        del self._by_owner[id(binding.queue), program.text]
        if not program.exact:
            self._by_prefix.remove(program.prefix, binding)
            return
        bucket = self._by_exact[program.prefix]
        bucket.remove(binding)
        if not bucket:
            del self._by_exact[program.prefix]

    def find(self, queue: Target, text: bytes) -> Binding | None:
        return self._by_owner.get((id(queue), text))

    def hits(self, route: bytes) -> list[Binding] | None:
        """The bindings ``route`` reaches when that depends on the route alone, else None.

        Memoised per route: with only ``prefix:``/``exact:`` rules (``always_true``
        programs) the answer is the first binding of each distinct queue among the
        candidates, exactly what :meth:`Router.route` would pick one by one.
        """
        try:
            return self._hits[route]
        except KeyError:
            pass
        found: list[Binding] | None = []
        for bucket in self.candidates(route):
            for binding in bucket:
                if not binding.program.always_true:
                    found = None
                    break
                queue = binding.queue
                if not any(b.queue is queue for b in found):  # type: ignore[union-attr]
                    found.append(binding)  # type: ignore[union-attr]
            if found is None:
                break
        if len(self._hits) >= 65536:
            self._hits.clear()
        self._hits[route] = found
        return found

    def candidates(self, route: bytes) -> list[list[Binding]]:
        """Bindings whose prefix or exact route matches ``route``; programs not yet run."""
        found = self._by_prefix.matching(route)
        exact = self._by_exact.get(route)
        if exact:
            found.append(exact)
        return found


def _gather_into(gathered: dict[Target, list[Any]], hits: list[Binding] | None) -> bool:
    """Give each target of ``hits`` its slot; False if the run cannot be gathered.

    A run can be when its targets follow from its route alone and none of them blocks
    (a block-policy queue stops its publisher at an exact message).
    """
    if hits is None:
        return False
    for binding in hits:
        queue = binding.queue
        if queue not in gathered:
            if queue.blocks:
                return False
            gathered[queue] = [queue.room, queue.room_bytes, [], 0]
    return True


@dataclass(slots=True)
class PublishResult:
    routed: int = 0
    dropped: int = 0
    no_route: int = 0
    no_exchange: int = 0
    # Block-policy targets now full: the publisher should wait on them before sending more.
    blocked: list[Target] = field(default_factory=list)


class Router:
    """All exchanges and bindings of one broker."""

    def __init__(self, registry: RuleRegistry | None = None) -> None:
        self.exchanges: dict[bytes, Exchange] = {}
        self.aggregate = AggregateStats()
        self.registry = registry
        self._last_route_id = 0

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
        binding, with its permanence changed as ``flags`` say (§2.5).
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
        """Remove the caller's own binding; None when nothing matched (§2.5)."""
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

    def route(self, msg: Message) -> list[Target]:
        """The queues ``msg`` goes to, each once; counts messages, octets and misses."""
        agg = self.aggregate
        agg.messages += 1
        agg.octets += len(msg.payload)
        ex = self.exchanges.get(msg.exchange)
        if ex is None:
            agg.no_exchange += 1
            agg.no_route += 1
            return []
        ex.messages += 1
        ex.octets += len(msg.payload)
        hits = ex.hits(msg.route)
        if hits is not None:
            targets: list[Target] = []
            for binding in hits:
                binding.invocations += 1
                targets.append(binding.queue)
        else:
            targets = self._route_by_programs(ex, msg)
        if not targets:
            ex.no_route += 1
            agg.no_route += 1
        return targets

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
        self, runs: list[Run], start: int, client: ClientStats
    ) -> tuple[int, int, list[Target]]:
        """Publish ``runs[start:]``: the data path, a read's (or a batch's) worth at a time.

        Each run is routed once. What drop-policy queues get is gathered per queue and
        offered in one call at the end, their room counted while gathering, so the same
        messages are dropped as one by one. A run that reaches a block-policy queue, or
        needs programs run, goes through :meth:`_publish_run` after what was gathered.
        Returns the index to go on from, the messages published and the block-policy
        targets now full (publish again after waiting on them); when a run was published
        in part, ``runs[index]`` is replaced by its rest.
        """
        exchanges = self.exchanges
        # queue -> [room left, bytes left, frames, their bytes]
        gathered: dict[Target, list[Any]] = {}
        messages = octets = routed = dropped = no_route = no_exchange = 0
        published = 0
        i = start
        try:
            while i < len(runs):
                exchange, route, frames, head = runs[i]
                n = len(frames)
                ex = exchanges.get(exchange)
                hits = None if ex is None else ex.hits(route)
                if ex is not None and not _gather_into(gathered, hits):
                    # Exactly as one by one, so everything gathered goes first.
                    self._offer_gathered(gathered)
                    gathered = {}
                    done, blocked = self._publish_run(ex, hits, frames, head, client)
                    published += done
                    if done < n:
                        runs[i] = (exchange, route, frames[done:], head)
                    else:
                        i += 1
                    if blocked:
                        return i, published, blocked
                    continue
                i += 1
                published += n
                raw = sum(map(len, frames)) if n > 1 else len(frames[0])
                size = raw - n * head
                messages += n
                octets += size
                if ex is None:
                    no_exchange += n
                    no_route += n
                    continue
                ex.messages += n
                ex.octets += size
                if not hits:
                    ex.no_route += n
                    no_route += n
                    continue
                lost = 0
                for binding in hits:
                    binding.invocations += n
                    slot = gathered[binding.queue]
                    slot[2] += frames
                    slot[3] += raw
                    room = slot[0]
                    slot[0] = room - n
                    room_bytes = slot[1]
                    slot[1] = room_bytes - raw
                    if room < n or room_bytes < raw:
                        lost += n - max(min(room, fitting(frames, room_bytes)), 0)
                ex.routed += n * len(hits)
                routed += n * len(hits)
                if lost:
                    ex.dropped += lost
                    dropped += lost
            return i, published, []
        finally:
            self._offer_gathered(gathered)
            agg = self.aggregate
            agg.messages += messages
            agg.octets += octets
            agg.no_exchange += no_exchange
            agg.no_route += no_route
            agg.routed += routed
            agg.dropped += dropped
            client.no_exchange += no_exchange
            client.no_route += no_route
            client.routed += routed
            client.dropped += dropped

    @staticmethod
    def _offer_gathered(gathered: dict[Target, list[Any]]) -> None:
        for queue, (_, _, frames, size) in gathered.items():
            if frames:
                queue.offer(frames, size)

    def _publish_run(
        self,
        ex: Exchange,
        hits: list[Binding] | None,
        frames: list[bytes],
        head: int,
        client: ClientStats,
    ) -> tuple[int, list[Target]]:
        """A run with programs to run or a block-policy target, published exactly.

        Stops after the first message that leaves a block-policy target full: returns
        how many frames were published and those targets, for the publisher to wait on.
        """
        if hits is None:
            return self._publish_each(frames, client)
        n = len(frames)
        for binding in hits:
            queue = binding.queue
            if queue.blocks:
                n = min(n, queue.takes(frames))  # it takes the message that fills it
        batch = frames if n == len(frames) else frames[:n]
        octets = sum(map(len, batch)) - n * head
        agg = self.aggregate
        agg.messages += n
        agg.octets += octets
        ex.messages += n
        ex.octets += octets
        dropped = 0
        blocked: list[Target] = []
        for binding in hits:
            binding.invocations += n
            queue = binding.queue
            dropped += n - queue.offer(batch)
            if queue.is_full:
                blocked.append(queue)
        routed = n * len(hits)
        ex.routed += routed
        agg.routed += routed
        client.routed += routed
        if dropped:
            ex.dropped += dropped
            agg.dropped += dropped
            client.dropped += dropped
        return n, blocked

    def _publish_each(self, frames: list[bytes], client: ClientStats) -> tuple[int, list[Target]]:
        """A run whose targets depend on more than its route: one message at a time."""
        for i, frame in enumerate(frames, 1):
            result = self._offer(message_from_frame(frame), frame, client)
            if result.blocked:
                return i, result.blocked
        return len(frames), []

    def publish(self, msg: Message, client: ClientStats | None = None) -> PublishResult:
        """Route ``msg`` and offer it to every target, keeping every counter of §1.6/§2.6."""
        return self._offer(msg, msg.peer_frame(), client)

    def _offer(self, msg: Message, frame: bytes, client: ClientStats | None) -> PublishResult:
        targets = self.route(msg)
        result = PublishResult()
        if not targets:
            result.no_route = 1
            if msg.exchange not in self.exchanges:
                result.no_exchange = 1
        one = [frame]
        for queue in targets:
            if not queue.offer(one):
                result.dropped += 1
            elif queue.is_full:
                result.blocked.append(queue)
        result.routed = len(targets)
        agg = self.aggregate
        agg.routed += result.routed
        agg.dropped += result.dropped
        ex = self.exchanges.get(msg.exchange)
        if ex is not None:
            ex.routed += result.routed
            ex.dropped += result.dropped
        if client is not None:
            client.no_exchange += result.no_exchange
            client.no_route += result.no_route
            client.routed += result.routed
            client.dropped += result.dropped
        return result
