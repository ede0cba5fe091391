"""The data path routes runs of frames; it must count and deliver exactly as one by one."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fqbroker.core.message import Message
from fqbroker.core.queue import Queue
from fqbroker.core.queuespec import Policy, QueueSpec
from fqbroker.core.router import ClientStats, Router
from fqbroker.protocols.fq.msgdecoder import MessageDecoder

PROGRAMS = [b"prefix:", b"prefix:a", b"exact:a.1", b'prefix:a payload_prefix("x")']
ROUTES = [b"a.1", b"a.2", b"b"]
EXCHANGES = [b"ex", b"other", b"unbound"]

queue_specs = st.lists(
    st.tuples(st.sampled_from(list(Policy)), st.integers(0, 6)), min_size=1, max_size=3
)
bindings = st.lists(
    st.tuples(st.integers(0, 2), st.sampled_from(EXCHANGES[:2]), st.sampled_from(PROGRAMS)),
    max_size=6,
)
messages = st.lists(
    st.tuples(st.sampled_from(EXCHANGES), st.sampled_from(ROUTES), st.sampled_from([b"x", b"yy"])),
    max_size=25,
)


def setup(
    specs: list[tuple[Policy, int]], binds: list[tuple[int, bytes, bytes]]
) -> tuple[Router, list[Queue]]:
    router = Router()
    queues = [
        Queue(QueueSpec(b"q%d" % i, policy=policy, backlog=limit))
        for i, (policy, limit) in enumerate(specs)
    ]
    for index, exchange, program in binds:
        router.bind(exchange, program, queues[index % len(queues)])
    return router, queues


def counters(router: Router, queues: list[Queue], client: ClientStats) -> tuple[object, ...]:
    exchanges = {
        name: (ex.messages, ex.octets, ex.no_route, ex.routed, ex.dropped)
        for name, ex in router.exchanges.items()
    }
    invocations = sorted((b.route_id, b.invocations) for b in router.bindings())
    contents = [(q.store.take(1000), q.dropped_to) for q in queues]
    return router.aggregate, exchanges, invocations, contents, client


@settings(max_examples=300, deadline=None)
@given(queue_specs, bindings, messages)
def test_runs_route_as_messages_one_by_one(
    specs: list[tuple[Policy, int]],
    binds: list[tuple[int, bytes, bytes]],
    sent: list[tuple[bytes, bytes, bytes]],
) -> None:
    wire_bytes = b"".join(
        Message(ex, rt, payload, bytes(16)).publish_frame() for ex, rt, payload in sent
    )
    hops = bytes([10, 0, 0, 1, 127, 0, 0, 1])

    # One by one, as HTTP and peers publish; a block-policy stop is honoured per message.
    router, queues = setup(specs, binds)
    one = ClientStats()
    one_stops = []
    for i, (ex, rt, payload) in enumerate(sent, 1):
        if router.publish(Message(ex, rt, payload, bytes(16), b"user", hops), one).blocked:
            one_stops.append(i)

    # As the data channel does: decoded runs, each published until it is done.
    decoder = MessageDecoder(peer_format=False)
    decoder.feed(wire_bytes)
    runs_router, runs_queues = setup(specs, binds)
    batched = ClientStats()
    stops = []
    done = 0
    runs = decoder.runs(b"user", hops)
    i = 0
    while i < len(runs):
        i, n, blocked = runs_router.publish_runs(runs, i, batched)
        done += n
        if blocked:
            assert n >= 1
            stops.append(done)
            assert all(q.is_full for q in blocked)
    assert done == len(sent)
    assert decoder.octets == len(wire_bytes)
    # The publisher waits after exactly the messages that left a queue full.
    assert stops == one_stops
    assert counters(runs_router, runs_queues, batched) == counters(router, queues, one)
