"""The router's route cache and the joining of runs on different routes (publish_runs).

Whatever the bindings, programs, routes and reads, what each queue receives, in which
order, and every counter must equal routing one message at a time with the cache off
(every route then goes through the programs, message by message), also while bindings
come and go and queues are removed between reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fqbroker.core import exchange as exchange_module
from fqbroker.core.message import Message, Run, runs_of
from fqbroker.core.queue import Queue
from fqbroker.core.queuespec import Policy, QueueSpec
from fqbroker.core.router import ClientStats, Exchange, Router, Sink

EXCHANGES = [b"ex", b"other", b"unbound"]
ROUTES = [b"a.%d" % i for i in range(6)] + [b"b.1", b"b.2", b"c", b""]
PROGRAMS = [
    b"prefix:",
    b"prefix:a",
    b"prefix:a.",
    b"prefix:a.1",
    b"exact:a.2",
    b"exact:c",
    b"prefix:b",
    b'prefix:b route_contains("1")',
    b'prefix:a payload_prefix("x")',
    b'exact:b.2 (route_contains("2") || payload_prefix("y"))',
]
HOPS = bytes([10, 0, 0, 1, 127, 0, 0, 1])

queue_specs = st.lists(
    st.tuples(
        st.sampled_from(list(Policy)),
        st.one_of(st.integers(0, 8), st.just(1000)),  # messages
        st.one_of(st.none(), st.integers(1, 400)),  # bytes (frames are 60 to 70)
    ),
    min_size=1,
    max_size=4,
)
sent = st.tuples(
    st.sampled_from(EXCHANGES), st.sampled_from(ROUTES), st.sampled_from([b"x", b"yy", b"zzzz"])
)
bind = st.tuples(
    st.just("bind"), st.integers(0, 3), st.sampled_from(EXCHANGES[:2]), st.sampled_from(PROGRAMS)
)
# messages, and the sizes of the reads they come in
publish = st.tuples(
    st.just("publish"),
    st.lists(sent, min_size=1, max_size=30),
    st.lists(st.integers(1, 12), min_size=1, max_size=4),
)
ops = st.tuples(
    st.lists(bind, min_size=1, max_size=6),
    st.lists(
        st.one_of(
            publish,
            publish,
            bind,
            st.tuples(st.just("unbind"), st.integers(0, 20)),
            st.tuples(st.just("remove queue"), st.integers(0, 3)),  # a new one in its place
            st.tuples(st.just("take"), st.integers(0, 3), st.integers(1, 10)),
        ),
        min_size=1,
        max_size=12,
    ),
).map(lambda both: both[0] + both[1])


@contextmanager
def cache_off() -> Iterator[None]:
    """Every route looked up anew and routed by its programs, message by message."""
    with mock.patch.object(Exchange, "hits", lambda self, route: None):
        yield


class World:
    """A router and its queues, driven by ops; ``one_by_one``: each message published on
    its own (Router.publish), else in reads of runs (Router.publish_runs)."""

    def __init__(self, specs: list[tuple[Policy, int, int | None]], one_by_one: bool) -> None:
        self.specs = specs
        self.one_by_one = one_by_one
        self.router = Router()
        self.client = ClientStats()
        self.queues = [self._queue(i) for i in range(len(specs))]
        self.received: list[list[bytes]] = [[] for _ in specs]
        self.sent = 0
        self.stops: list[int] = []  # after which messages a block-policy queue was full

    def _queue(self, i: int) -> Queue:
        policy, limit, limit_bytes = self.specs[i]
        return Queue(QueueSpec(b"q%d" % i, policy=policy, backlog=limit, backlog_bytes=limit_bytes))

    def apply(self, op: tuple[Any, ...]) -> tuple[object, ...]:
        kind = op[0]
        router, queues = self.router, self.queues
        if kind == "publish":
            self.publish(op[1], op[2])
        elif kind == "bind":
            router.bind(op[2], op[3], queues[op[1] % len(queues)])
        elif kind == "unbind":
            bindings = sorted(router.bindings(), key=lambda b: b.route_id)
            if bindings:
                b = bindings[op[1] % len(bindings)]
                assert router.unbind(b.exchange.name, b.route_id, b.queue) is b
        elif kind == "remove queue":
            i = op[1] % len(queues)
            router.unbind_queue(queues[i])
            self.received[i] += queues[i].take(1 << 20)
            queues[i] = self._queue(i)
        elif kind == "take":
            i = op[1] % len(queues)
            self.received[i] += queues[i].take(op[2])
        return self.observe()

    def publish(self, messages: list[tuple[bytes, bytes, bytes]], reads: list[int]) -> None:
        msgs = [Message(ex, rt, payload, bytes(16), b"user", HOPS) for ex, rt, payload in messages]
        if self.one_by_one:
            for msg in msgs:
                self.sent += 1
                if self.router.publish(msg, self.client).blocked:
                    self.stops.append(self.sent)
            return
        start = k = 0
        while start < len(msgs):
            size = reads[k % len(reads)]
            k += 1
            runs: list[Run] = runs_of(msgs[start : start + size])
            start += size
            i = 0
            while i < len(runs):
                i, n, blocked = self.router.publish_runs(runs, i, self.client)
                self.sent += n
                if blocked:
                    assert n >= 1
                    assert all(q.is_full for q in blocked)
                    self.stops.append(self.sent)

    def observe(self) -> tuple[object, ...]:
        router = self.router
        exchanges = {
            name: (ex.messages, ex.octets, ex.no_route, ex.routed, ex.dropped)
            for name, ex in router.exchanges.items()
        }
        bindings = sorted(
            (b.route_id, b.exchange.name, b.program.text, self.queues.index(b.queue), b.invocations)
            for b in router.bindings()
        )
        held = [(q.store.peek(1 << 20), q.dropped_to) for q in self.queues]
        return (
            router.aggregate,
            exchanges,
            bindings,
            held,
            [list(r) for r in self.received],
            list(self.stops),
            self.sent,
            self.client,
        )


def run(
    specs: list[tuple[Policy, int, int | None]], steps: list[tuple[Any, ...]], one_by_one: bool
) -> list[str]:
    """What the world looks like after each step (as text: it is a snapshot)."""
    world = World(specs, one_by_one)
    return [repr(world.apply(op)) for op in steps]


@settings(max_examples=400, deadline=None)
@given(queue_specs, ops)
def test_queues_get_what_one_by_one_uncached_routing_gives(
    specs: list[tuple[Policy, int, int | None]], steps: list[tuple[Any, ...]]
) -> None:
    with cache_off():
        expected = run(specs, steps, one_by_one=True)
    assert run(specs, steps, one_by_one=False) == expected
    # And one by one with the cache on (Router.publish is a run of one).
    assert run(specs, steps, one_by_one=True) == expected


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(PROGRAMS), min_size=1, max_size=8),
    st.lists(st.integers(0, 999), max_size=200),
    st.lists(st.integers(1, 64), min_size=1, max_size=4),
)
def test_many_routes_keep_each_queues_order(
    programs: list[bytes], route_numbers: list[int], reads: list[int]
) -> None:
    """1,000 routes, as the bench row: no two messages in a row need share a route."""
    specs: list[tuple[Policy, int, int | None]] = [(Policy.DROP, 1 << 20, None)] * 3
    binds = [("bind", i, b"ex", p) for i, p in enumerate(programs)]
    messages = [(b"ex", b"a.%d" % n, b"x%d" % k) for k, n in enumerate(route_numbers)]
    steps = [*binds, ("publish", messages, reads)]
    with cache_off():
        expected = run(specs, steps, one_by_one=True)
    assert run(specs, steps, one_by_one=False) == expected


class Counting(Sink):
    """Takes everything; counts the offers."""

    name = b"counting"

    def __init__(self) -> None:
        self.offers = 0
        self.frames: list[bytes] = []

    def offer(self, frames: list[bytes], size: int = -1) -> int:
        self.offers += 1
        self.frames += frames
        return len(frames)


def one_read(routes: int, count: int) -> list[Run]:
    return runs_of([Message(b"ex", b"r.%d" % (i % routes), b"%d" % i) for i in range(count)])


def test_routes_that_reach_the_same_bindings_share_one_reach() -> None:
    router = Router()
    router.bind(b"ex", b"prefix:", Counting())
    ex = router.exchanges[b"ex"]
    assert ex.hits(b"r.1") is ex.hits(b"r.2") is ex.hits(b"")
    router.bind(b"ex", b"exact:r.1", Counting())
    assert ex.hits(b"r.1") is not ex.hits(b"r.2")
    assert ex.hits(b"r.2") is ex.hits(b"r.3")


def test_a_read_on_many_routes_is_offered_to_its_queue_once() -> None:
    router = Router()
    sink = Counting()
    router.bind(b"ex", b"prefix:r.", sink)
    runs = one_read(1000, 64)
    assert len(runs) == 64  # every message a run of its own
    assert router.publish_runs(runs, 0, ClientStats()) == (64, 64, [])
    assert sink.offers == 1
    assert sink.frames == [f for run in runs for f in run[2]]
    assert router.exchanges[b"ex"].routed == 64


def test_runs_are_not_changed_by_joining() -> None:
    router = Router()
    router.bind(b"ex", b"prefix:", Counting())
    runs = one_read(3, 9)
    before = [(ex, rt, list(frames), head) for ex, rt, frames, head in runs]
    router.publish_runs(runs, 0, ClientStats())
    assert runs == before


def test_a_bind_reaches_routes_already_cached() -> None:
    router = Router()
    first, second = Counting(), Counting()
    router.bind(b"ex", b"prefix:", first)
    router.publish_runs(one_read(4, 8), 0, ClientStats())
    router.bind(b"ex", b"prefix:r.2", second)
    router.publish_runs(one_read(4, 8), 0, ClientStats())
    assert len(first.frames) == 16
    assert second.frames == [b for b in first.frames[8:] if b"r.2" in b]


def test_unbind_and_queue_removal_forget_cached_routes() -> None:
    router = Router()
    first, second = Counting(), Counting()
    binding = router.bind(b"ex", b"prefix:", first)
    router.bind(b"ex", b"prefix:r.", second)
    router.publish_runs(one_read(4, 8), 0, ClientStats())
    assert router.unbind(b"ex", binding.route_id, first) is binding
    router.publish_runs(one_read(4, 8), 0, ClientStats())
    assert (len(first.frames), len(second.frames)) == (8, 16)
    router.unbind_queue(second)
    router.publish_runs(one_read(4, 8), 0, ClientStats())
    assert (len(first.frames), len(second.frames)) == (8, 16)
    assert router.aggregate.no_route == 8


def test_too_many_routes_start_the_cache_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exchange_module, "MAX_ROUTES_KEPT", 4)
    router = Router()
    sink = Counting()
    router.bind(b"ex", b"prefix:", sink)
    runs = one_read(10, 40)
    router.publish_runs(runs, 0, ClientStats())
    assert sink.frames == [f for run in runs for f in run[2]]
    assert len(router.exchanges[b"ex"].reach_by_route) <= 4


def test_a_sampled_batch_of_joined_runs_is_timed() -> None:
    router = Router()
    router.bind(b"ex", b"prefix:", Counting())
    router.sample = True
    router.publish_runs(one_read(100, 50), 0, ClientStats())
    assert router.sample is False
    assert router.times.messages == 50
    assert sum(router.times.buckets) == 1
    router.publish_runs(one_read(100, 50), 0, ClientStats())  # not sampled
    assert router.times.messages == 50


def test_an_error_midway_still_delivers_what_was_routed_before_it() -> None:
    def boom(msg: Message) -> bool:
        raise RuntimeError("plugin")

    from fqbroker.core.program import RuleRegistry

    registry = RuleRegistry()
    registry.register("boom", "", boom)
    router = Router(registry)
    sink = Counting()
    router.bind(b"ex", b"prefix:r.", sink)
    router.bind(b"ex", b"exact:z boom()", Counting())
    runs = [*one_read(5, 5), *runs_of([Message(b"ex", b"z", b"!")])]
    client = ClientStats()
    with pytest.raises(RuntimeError):
        router.publish_runs(runs, 0, client)
    assert sink.offers == 1
    assert len(sink.frames) == 5
    assert client.routed == 5
