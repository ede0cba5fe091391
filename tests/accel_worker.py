"""A child process for tests/test_accel.py: it runs the compiled modules, or their pure
sources with ``FQBROKER_PURE=1``, over inputs read as JSON lines on stdin and writes
what came out, one JSON line per input. The test feeds two of these the same bytes and
compares the answers: same frames out for the same bytes in.

Bytes travel as hex; an exception becomes ``["error", type name, message]``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fqbroker
from fqbroker.core.queue import Queue
from fqbroker.core.queuespec import Policy, QueueSpec
from fqbroker.core.router import ClientStats, Router
from fqbroker.frontends.opencluster.machine import Limits, Machine
from fqbroker.protocols.fq.msgdecoder import MessageDecoder
from fqbroker.protocols.opencluster import wire as ocwire
from fqbroker.storage.kv.store import KVStore

SENDER = b"user"
HOPS = bytes([10, 0, 0, 1])


def _hex(value: Any) -> Any:
    """Bytes as hex, all the way down; other values as they are."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, list | tuple):
        return [_hex(v) for v in value]
    if isinstance(value, dict):
        return {k: _hex(v) for k, v in value.items()}
    return value


def _guard(step: Callable[..., Any], *args: Any) -> Any:
    try:
        return step(*args)
    except Exception as exc:
        return ["error", type(exc).__name__, str(exc)]


def fq(chunks: list[bytes], peer: bool, max_payload: int) -> list[Any]:
    """A data channel's decoder fed ``chunks``: after each, what runs() (publisher
    format) or messages() (peer format) returns, and the counters the reader reads."""
    decoder = MessageDecoder(peer_format=peer, max_payload=max_payload)
    out = []
    for chunk in chunks:
        decoder.feed(chunk)
        if peer:
            got = _guard(
                lambda: [
                    [m.exchange, m.route, m.payload, m.msgid, m.sender, m.hops, m.peer_frame()]
                    for m in decoder.messages()
                ]
            )
        else:
            got = _guard(lambda: decoder.runs(SENDER, HOPS))
        out.append([got, decoder.octets, decoder.oversized, decoder.in_flight])
    return out


def route(binds: list[tuple[bytes, bytes, int]], frames: bytes, backlog: int) -> list[Any]:
    """Bindings (exchange, program, queue number) and a data channel's bytes, decoded and
    published as the data path does: what each queue holds, the router's counters."""
    router = Router()
    queues = [Queue(QueueSpec(b"q%d" % i, policy=Policy.DROP, backlog=backlog)) for i in range(4)]
    bound = [_guard(router.try_bind, ex, prog, queues[q], 0) for ex, prog, q in binds]
    decoder = MessageDecoder(peer_format=False)
    decoder.feed(frames)
    runs = _guard(lambda: decoder.runs(SENDER, HOPS))
    client = ClientStats()
    published = []
    if isinstance(runs, list):
        i = 0
        while i < len(runs):
            i, n, _ = router.publish_runs(runs, i, client)
            published.append(n)
    a = router.aggregate
    return [
        bound,
        published,
        [q.take(1 << 30) for q in queues],
        [a.messages, a.octets, a.routed, a.dropped, a.no_route, a.no_exchange],
        [client.routed, client.dropped, client.no_route, client.no_exchange, client.msgs_in],
    ]


def routing(ops: list[list[Any]]) -> list[Any]:
    """A router through a sequence of ``ops``: ``["bind", ex, program, queue, flags]``,
    ``["unbind", ex, the index of a bind op, queue]``, ``["read", frames, sample]`` (a data
    channel's bytes decoded and published as the data path does; a block-policy queue
    left full is drained before publishing goes on, as its consumer would) and
    ``["take", queue]``. Answers each op, then every queue's deliveries in order, every
    counter: the aggregate's, the client's, each exchange's and binding's, the timings'."""
    router = Router()
    specs = [
        QueueSpec(b"q0", policy=Policy.DROP, backlog=1000),
        QueueSpec(b"q1", policy=Policy.DROP, backlog=3),
        QueueSpec(b"q2", policy=Policy.DROP, backlog=1000, backlog_bytes=400),
        QueueSpec(b"q3", policy=Policy.BLOCK, backlog=4),
        QueueSpec(b"q4", policy=Policy.BLOCK, backlog=1000, backlog_bytes=300),
    ]
    queues = [Queue(spec) for spec in specs]
    delivered: list[list[bytes]] = [[] for _ in queues]
    client = ClientStats()
    answers: list[Any] = []
    for op in ops:
        if op[0] == "bind":
            answers.append(_guard(router.try_bind, op[1], op[2], queues[op[3]], op[4]))
        elif op[0] == "unbind":
            route_id = answers[op[2]] if op[2] < len(answers) else 0
            unbound = router.unbind(op[1], route_id if isinstance(route_id, int) else 0,
                                    queues[op[3]])  # fmt: skip
            answers.append(None if unbound is None else unbound.route_id)
        elif op[0] == "take":
            delivered[op[1]] += queues[op[1]].take(2)
            answers.append(len(delivered[op[1]]))
        else:
            decoder = MessageDecoder(peer_format=False)
            decoder.feed(op[1])
            runs = decoder.runs(SENDER, HOPS)
            router.sample = op[2]
            steps = []
            i = 0
            while i < len(runs):
                i, n, blocked = router.publish_runs(runs, i, client)
                full = [queues.index(q) for q in blocked]  # type: ignore[arg-type]
                steps.append([i, n, full])
                for k in full:
                    delivered[k] += queues[k].take(1 << 30)
            answers.append(steps)
    for k, queue in enumerate(queues):
        delivered[k] += queue.take(1 << 30)
    a = router.aggregate
    times = router.times
    return [
        answers,
        delivered,
        [a.messages, a.octets, a.routed, a.dropped, a.no_route, a.no_exchange, a.size_dropped],
        [client.routed, client.dropped, client.no_route, client.no_exchange, client.msgs_in],
        [
            [name, ex.messages, ex.octets, ex.routed, ex.dropped, ex.no_route, ex.denied]
            for name, ex in router.exchanges.items()
        ],
        [[b.route_id, b.invocations, b.permanent, b.peer] for b in router.bindings()],
        [sum(times.buckets), times.messages, router.sample],
    ]


def opencluster(chunks: list[bytes], limits: list[int]) -> list[Any]:
    """A connection's machine fed ``chunks`` over a real store: each receive's answer,
    and what committed() answers as each batch it waits on is done."""

    async def run(path: Path) -> list[Any]:
        store = KVStore(path / "kv.sqlite3", sync="normal")
        try:
            machine = Machine(store, Limits(*limits))
            out: list[Any] = []
            for chunk in chunks:
                out.append(_guard(machine.receive, chunk))
                while (batch := machine.waiting) is not None:
                    if not batch.done:
                        done = asyncio.Event()
                        batch.waiters.append(done.set)
                        await done.wait()
                    out.append(_guard(machine.committed))
                out.append([machine.inflight, machine.finished, str(machine.error)])
            out.append([store.sets, store.gets, store.hits, store.misses])
            return out
        finally:
            await store.close()

    with tempfile.TemporaryDirectory() as tmp:
        return asyncio.run(run(Path(tmp)))


def ocframes(chunks: list[bytes], max_payload: int, limit: int) -> list[Any]:
    decoder = ocwire.FrameDecoder(max_payload)
    out = []
    for chunk in chunks:
        decoder.receive_data(chunk)
        frames: list[tuple[int, int, int, bytes]] = []
        out.append([_guard(decoder.take, frames, limit), frames, decoder.buffered])
    return out


def main() -> None:
    print(json.dumps({"accelerated": fqbroker.ACCELERATED}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        kind = request["kind"]
        chunks = [bytes.fromhex(c) for c in request.get("chunks", [])]
        if kind == "fq":
            answer = fq(chunks, request["peer"], request["max_payload"])
        elif kind == "route":
            binds = [(bytes.fromhex(e), bytes.fromhex(p), q) for e, p, q in request["binds"]]
            answer = route(binds, bytes.fromhex(request["frames"]), request["backlog"])
        elif kind == "routing":
            ops = [
                [op[0], *(bytes.fromhex(x) if isinstance(x, str) else x for x in op[1:])]
                for op in request["ops"]
            ]
            answer = routing(ops)
        elif kind == "opencluster":
            answer = opencluster(chunks, request["limits"])
        elif kind == "ocframes":
            answer = ocframes(chunks, request["max_payload"], request["limit"])
        else:
            raise SystemExit(f"unknown kind {kind!r}")
        print(json.dumps(_hex(answer)), flush=True)


if __name__ == "__main__":
    main()
