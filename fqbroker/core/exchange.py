"""An exchange's bindings and what each route reaches, sans I/O (fqd_routemgr.c).

Bindings are indexed by exact route and by prefix, and the bindings a route reaches are
remembered per route until a binding comes or goes, so a lookup costs the same however
many bindings and routes there are (docs/fq-protocol.md §2.3). The bookkeeping of
:mod:`fqbroker.core.router`, apart from its publishing: compiled with it (docs/accel.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import final

from fqbroker.core.message import Message
from fqbroker.core.prefixes import PrefixIndex
from fqbroker.core.program import Program
from fqbroker.core.targets import Target

__all__ = ["MAX_ROUTES_KEPT", "Binding", "Exchange", "Reach"]

# Routes whose reach an exchange remembers; past it, it starts again (a stream of new
# route names costs a lookup each, never unbounded memory).
MAX_ROUTES_KEPT = 65536

# avg_ns is a moving average with alpha 1/128, as in fqd (docs/fq-protocol.md §2.3).
_AVG_SHIFT = 7


@final
class Reach:
    """The bindings a route reaches, and whether any of their queues blocks or rejects
    (``blocks``: its runs are published exactly, never gathered).

    A class, not a tuple: publish_runs tells reaches apart by identity, and compiled
    (mypyc) code keeps a fixed-length tuple unboxed, boxing it afresh for each ``is``, so
    a tuple would never be itself again there (docs/accel.md).
    """

    __slots__ = ("blocks", "hits")

    def __init__(self, hits: list[Binding], blocks: bool) -> None:
        self.hits = hits
        self.blocks = blocks


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
    denied: int = 0  # not fqd's: refused to a publisher without the right (not in messages)
    bindings: dict[int, Binding] = field(default_factory=dict)
    # (id of the target queue, program text) -> binding: finds a duplicate bind in O(1).
    _by_owner: dict[tuple[int, bytes], Binding] = field(default_factory=dict)
    _by_exact: dict[bytes, list[Binding]] = field(default_factory=dict)
    _by_prefix: PrefixIndex[Binding] = field(default_factory=PrefixIndex)
    # route -> the bindings a message on it reaches and whether one of them blocks, when
    # no program looks past the route (None when one does); cleared whenever a binding
    # comes or goes.
    reach_by_route: dict[bytes, Reach | None] = field(default_factory=dict)
    # One Reach object per distinct list of bindings, shared by every route that reaches
    # them: publish_runs then tells by identity that consecutive runs on different
    # routes go to the same bindings, and joins them (many routes, few targets).
    _reaches: dict[tuple[Binding, ...], Reach] = field(default_factory=dict)

    def forget(self) -> None:
        """Drop what routes were found to reach: a binding came or went. Cleared, never
        replaced: publish_runs holds on to the dict."""
        self.reach_by_route.clear()
        self._reaches.clear()

    def add(self, binding: Binding) -> None:
        self.forget()
        self.bindings[binding.route_id] = binding
        program = binding.program
        self._by_owner[id(binding.queue), program.text] = binding
        if program.exact:
            self._by_exact.setdefault(program.prefix, []).append(binding)
        else:
            self._by_prefix.add(program.prefix, binding)

    def remove(self, binding: Binding) -> None:
        self.forget()
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

    def hits(self, route: bytes) -> Reach | None:
        """The bindings ``route`` reaches when that depends on the route alone, else None.

        Memoised per route: with only ``prefix:``/``exact:`` rules (``always_true``
        programs) the answer is the first binding of each distinct queue among the
        candidates, exactly what routing by programs would pick one by one, and whether
        any of their queues blocks (a queue's policy never changes). Routes that reach the
        same bindings get the same Reach object (see ``_reaches``).
        """
        try:
            return self.reach_by_route[route]
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
        if len(self.reach_by_route) >= MAX_ROUTES_KEPT:
            self.forget()
        reach = None
        if found is not None:
            key = tuple(found)
            reach = self._reaches.get(key)
            if reach is None:
                # A reject queue too is published to exactly, run by run, so that the
                # publisher learns which batch it refused (Router.publish_runs).
                exact = any(b.queue.blocks or b.queue.rejects for b in found)
                reach = self._reaches[key] = Reach(found, exact)
        self.reach_by_route[route] = reach
        return reach

    def candidates(self, route: bytes) -> list[list[Binding]]:
        """Bindings whose prefix or exact route matches ``route``; programs not yet run."""
        found = self._by_prefix.matching(route)
        exact = self._by_exact.get(route)
        if exact:
            found.append(exact)
        return found
