"""Routing and bookkeeping (docs/fq-protocol.md §2.1, §2.3, §2.5, §2.6), sans I/O."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fqbroker.core.message import Message
from fqbroker.core.prefixes import PrefixIndex
from fqbroker.core.program import RuleRegistry
from fqbroker.core.router import ClientStats, Router
from fqbroker.errors import ProgramError
from fqbroker.protocols.fq import wire


class Box:
    """A target queue as the router sees it, with an optional limit (tail drop)."""

    def __init__(self, limit: int = 1 << 30) -> None:
        self.items: list[bytes] = []
        self.limit = limit

    def offer(self, frames: list[bytes], size: int = -1) -> int:
        taken = frames[: max(0, self.limit - len(self.items))]
        self.items += taken
        return len(taken)

    blocks = False
    rejects = False
    name = b"box"

    @property
    def room(self) -> int:
        return self.limit - len(self.items)

    room_bytes = 1 << 62

    def takes(self, frames: list[bytes]) -> int:
        return len(frames)

    @property
    def is_full(self) -> bool:
        return False

    async def wait_not_full(self) -> None:
        return None


def msg(route: bytes, payload: bytes = b"p", exchange: bytes = b"ex") -> Message:
    return Message(exchange, route, payload)


# docs/fq-protocol.md §2.3's examples, through the router's index.
MATCHING = [
    (b"prefix:fo", b"fo", True),
    (b"prefix:fo", b"foo", True),
    (b"prefix:fo", b"foo.bar", True),
    (b"prefix:fo", b"fox", True),
    (b"prefix:fo", b"f", False),
    (b"exact:fo", b"fo", True),
    (b"exact:fo", b"foo", False),
    (b'prefix:"foo"', b"foo", True),
    (b'prefix:"foo"', b"foo.bar", True),
    (b'prefix:"a."', b"a", False),
    (b"prefix:", b"", True),
    (b"prefix:", b"anything", True),
    (b"exact:", b"", True),
    (b"exact:", b"x", False),
    (b'prefix:x (route_contains("a") && payload_prefix("b"))', b"xa", False),
    (b'prefix:x (route_contains("a") || payload_prefix("p"))', b"xz", True),
]


@pytest.mark.parametrize(("program", "route", "hit"), MATCHING)
def test_matching_examples(program: bytes, route: bytes, hit: bool) -> None:
    router, box = Router(), Box()
    router.bind(b"ex", program, box)
    router.publish(msg(route))
    assert bool(box.items) is hit


def test_route_ids_are_global_and_start_at_1() -> None:
    router, a, b = Router(), Box(), Box()
    assert router.try_bind(b"e1", b"prefix:a", a) == 1
    assert router.try_bind(b"e2", b"prefix:a", a) == 2  # same program, other exchange
    assert router.try_bind(b"e1", b"prefix:a", a) == 1  # duplicate: the existing id
    assert router.try_bind(b"e1", b"prefix:a", b) == 3  # same program, other queue
    assert router.try_bind(b"e1", b"bogus", a) == wire.BIND_ILLEGAL
    assert router.try_bind(b"e1", b"prefix:b", a) == 4


def test_route_ids_skip_bind_illegal() -> None:
    router = Router()
    router._last_route_id = 0xFFFFFFFE - 1
    assert router.try_bind(b"e", b"prefix:a", Box()) == 0xFFFFFFFE
    assert router.try_bind(b"e", b"prefix:b", Box()) == 1


def test_bind_failure_raises_program_error_for_callers_that_want_it() -> None:
    with pytest.raises(ProgramError):
        Router().bind(b"e", b"prefix:x (true())", Box())


def test_unbind_removes_only_the_callers_own_rules() -> None:
    router, mine, theirs = Router(), Box(), Box()
    rid = router.try_bind(b"ex", b"prefix:", theirs)
    assert router.unbind(b"ex", rid, mine) is None
    assert router.unbind(b"nope", rid, theirs) is None
    assert router.unbind(b"ex", 999, theirs) is None
    assert router.unbind(b"ex", rid, theirs) is not None
    assert router.unbind(b"ex", rid, theirs) is None  # already gone
    assert b"ex" in router.exchanges  # exchanges are never deleted


@pytest.mark.parametrize(
    ("flags", "permanent"), [(0, False), (0x0100, False), (0x0110, True), (0x0111, True)]
)
def test_bind_flags(flags: int, permanent: bool) -> None:
    router = Router()
    binding = router.bind(b"ex", b"prefix:", Box(), flags)
    assert binding.permanent is permanent
    assert binding.peer is bool(flags & 1)


def test_rebinding_changes_permanence() -> None:
    router, box = Router(), Box()
    binding = router.bind(b"ex", b"prefix:", box, 0x0110)
    assert router.bind(b"ex", b"prefix:", box, 0) is binding and binding.permanent
    router.bind(b"ex", b"prefix:", box, 0x0100)
    assert not binding.permanent


def test_each_queue_gets_a_message_once_and_skipped_rules_do_not_count() -> None:
    router, box, other = Router(), Box(), Box()
    first = router.bind(b"ex", b"prefix:a", box)
    second = router.bind(b"ex", b"prefix:ab", box)
    third = router.bind(b"ex", b"prefix:", other)
    result = router.publish(msg(b"abc"))
    assert result.routed == 2
    assert len(box.items) == 1 and len(other.items) == 1
    assert sorted([first.invocations, second.invocations]) == [0, 1]
    assert third.invocations == 1


def test_counters_no_exchange_no_route_routed_dropped() -> None:
    router, box = Router(), Box(limit=1)
    router.bind(b"ex", b"exact:hit", box)
    client = ClientStats()
    router.publish(msg(b"hit", b"12345"), client)
    router.publish(msg(b"hit", b"123"), client)  # routed, then dropped: queue full
    router.publish(msg(b"miss"), client)
    router.publish(msg(b"x", exchange=b"none"), client)
    assert (client.no_exchange, client.no_route, client.routed, client.dropped) == (1, 2, 2, 1)
    ex = router.exchanges[b"ex"]
    assert (ex.messages, ex.octets, ex.no_route, ex.routed, ex.dropped) == (3, 9, 1, 2, 1)
    agg = router.aggregate
    assert (agg.messages, agg.octets, agg.no_exchange, agg.no_route) == (4, 10, 1, 2)
    assert (agg.routed, agg.dropped) == (2, 1)


def test_unbind_queue_removes_every_binding_into_it() -> None:
    router, box, other = Router(), Box(), Box()
    router.bind(b"a", b"prefix:", box)
    router.bind(b"b", b"exact:x", box)
    router.bind(b"b", b"prefix:", other)
    assert len(router.unbind_queue(box)) == 2
    assert [b.queue for b in router.bindings()] == [other]
    router.publish(msg(b"x", exchange=b"b"))
    assert not box.items and len(other.items) == 1


def test_both_sides_of_or_are_evaluated() -> None:
    calls: list[bytes] = []
    registry = RuleRegistry()
    registry.register("mark", "s", lambda m, tag: calls.append(tag) or True)
    router, box = Router(registry), Box()
    router.bind(b"ex", b'prefix: (mark("a") || mark("b"))', box)
    router.publish(msg(b"r"))
    assert calls == [b"a", b"b"]


def test_avg_ns_moves_for_rules_with_a_program() -> None:
    router = Router()
    binding = router.bind(b"ex", b'prefix: route_contains("r")', Box())
    for _ in range(50):
        router.publish(msg(b"route"))
    assert binding.invocations == 50
    assert binding.avg_ns > 0


def test_routing_does_not_scan_unrelated_bindings() -> None:
    router, target = Router(), Box()
    others = [Box() for _ in range(2000)]
    for i, box in enumerate(others):
        router.bind(b"ex", b'prefix:"svc.%d."' % i, box)
    router.bind(b"ex", b'prefix:"zzz."', target)
    router.publish(msg(b"zzz.1"))
    touched = [b for b in router.bindings() if b.invocations]
    assert [b.queue for b in touched] == [target]


# --- the prefix index against a brute-force oracle ---------------------------------------

prefix_st = st.binary(max_size=6, min_size=0).map(lambda b: bytes(x % 4 + 97 for x in b))


@given(
    ops=st.lists(st.tuples(st.booleans(), prefix_st), max_size=60),
    routes=st.lists(prefix_st, min_size=1, max_size=10),
)
def test_prefix_index_matches_brute_force(
    ops: list[tuple[bool, bytes]], routes: list[bytes]
) -> None:
    index: PrefixIndex[bytes] = PrefixIndex()
    present: dict[bytes, int] = {}
    for add, prefix in ops:
        if add:
            index.add(prefix, prefix)
            present[prefix] = present.get(prefix, 0) + 1
        elif present.get(prefix):
            index.remove(prefix, prefix)
            present[prefix] -= 1
            if not present[prefix]:
                del present[prefix]
    for route in routes:
        got = [p for bucket in index.matching(route) for p in bucket]
        want = sorted(
            (p for p, n in present.items() for _ in range(n) if route.startswith(p)),
            key=len,
            reverse=True,
        )
        assert got == want
