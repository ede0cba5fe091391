"""Peering between real brokers on loopback, each its own process, node id, port and data
directory (docs/fq-protocol.md §5): one-way, two-way, a ring, a full mesh, an upstream
restart, a downstream outage, a row removed, and a publisher on a peer channel.
Refusals, changed rows and backoff are in test_peering_refusals.py."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import sqlite3
from pathlib import Path

from fqbroker.clients.fq.client import Client
from fqbroker.core.message import hop_addresses
from fqbroker.protocols.fq.wire import BindFlags
from tests.conftest import wait_for
from tests.e2e.peering.cluster import (
    EXCHANGE,
    NODES,
    Cluster,
    Node,
    collect,
    counts,
    exchange_messages,
    payloads,
    poll,
    publish,
    subscriber,
    until_markers,
)

# --- one-way and two-way -------------------------------------------------------------------


async def test_one_way_keeps_sender_and_stacks_hops(cluster: Cluster, tmp_path: Path) -> None:
    a = await cluster.start("A")
    # B's upstream comes from the TOML file this time; the others use the sqlite table.
    conf = tmp_path / "b.toml"
    conf.write_text(
        f'[fqd]\npeer_poll_seconds = 0.2\n\n[[upstream]]\nhost = "127.0.0.1"\nport = {a.port}\n'
        f'source = "fqd-peerb//mem:drop,private,backlog=4096"\npassword = "none"\n'
        f'exchange = "{EXCHANGE.decode()}"\nprogram = "prefix:"\n'
    )
    b = await cluster.start("B", "--config", str(conf))
    (peer,) = await b.peers_bound(1)
    assert (peer["mode"], peer["port"], peer["reconnects"]) == ("peer", a.port, 0)
    upstream_side = [c for q in (await a.stats())["queues"].values() for c in q["clients"]]
    assert [c["mode"] for c in upstream_side if c["user"] == "fqd-peerb"] == ["peer"]

    sub_b = await subscriber(b)
    await publish(a, [b"hello", b"end"], sender="pubA")
    (msg,) = await until_markers(sub_b, {b"end": 1})
    assert (msg.payload, msg.sender, msg.exchange) == (b"hello", b"pubA", EXCHANGE)
    assert hop_addresses(msg.hops) == [NODES["B"], NODES["A"], "127.0.0.1"]
    await sub_b.close()

    labels = {"peer": f"127.0.0.1:{a.port}", "source": "fqd-peerb//mem:drop,private,backlog=4096"}
    samples = await b.metrics()
    assert samples[("fq_peer_up", frozenset(labels.items()))] == 1
    assert samples[("fq_peer_reconnects_total", frozenset(labels.items()))] == 0
    received = samples[("fq_peer_messages_received_total", frozenset(labels.items()))]
    assert received == 2  # hello and the marker


async def test_two_way_delivers_each_message_once_everywhere(cluster: Cluster) -> None:
    a = await cluster.start("A")
    b = await cluster.start("B")
    a.add_upstream(b)
    b.add_upstream(a)
    await a.peers_bound(1)
    await b.peers_bound(1)
    sub_a, sub_b = await subscriber(a), await subscriber(b)
    sent = payloads("a", 500) + payloads("b", 500)
    await asyncio.gather(publish(a, [*sent[:500], b"end-a"]), publish(b, [*sent[500:], b"end-b"]))
    for sub in (sub_a, sub_b):
        got = counts(await until_markers(sub, {b"end-a": 1, b"end-b": 1}))
        assert got == collections.Counter(sent)
        await sub.close()
    stats = {n.name: (await n.stats())["peers"][0] for n in (a, b)}
    # The upstream never sends a peer what already went through it
    # (docs/fq-protocol.md §5.3, done right).
    assert stats["A"]["looped"] == stats["B"]["looped"] == 0


# --- ring and mesh ---------------------------------------------------------------------------


async def test_ring_of_three_delivers_exactly_once(cluster: Cluster) -> None:
    a, b, c = [await cluster.start(n) for n in "ABC"]
    b.add_upstream(a)
    c.add_upstream(b)
    a.add_upstream(c)
    for node in (a, b, c):
        await node.peers_bound(1)
    subs = [await subscriber(n) for n in (a, b, c)]
    sent = payloads("a", 3334) + payloads("b", 3333) + payloads("c", 3333)
    assert len(sent) == 10_000
    ends = {b"end-a": 1, b"end-b": 1, b"end-c": 1}
    await asyncio.gather(
        publish(a, [*sent[:3334], b"end-a"]),
        publish(b, [*sent[3334:6667], b"end-b"]),
        publish(c, [*sent[6667:], b"end-c"]),
    )
    for sub in subs:
        got = counts(await until_markers(sub, ends))
        assert got == collections.Counter(sent), "every message exactly once"
        await sub.close()
    # No message circulates: each exchange saw each message (markers too) once.
    for node in (a, b, c):
        assert await exchange_messages(node) == 10_003


async def mesh(cluster: Cluster, *args: str) -> list[Node]:
    nodes = [await cluster.start(n, *args) for n in "ABC"]
    for node in nodes:
        for other in nodes:
            if other is not node:
                node.add_upstream(other)
    for node in nodes:
        await node.peers_bound(2)
    return nodes


async def test_full_mesh_does_not_circulate_and_delivers_a_second_copy(
    cluster: Cluster,
) -> None:
    a, b, c = await mesh(cluster)
    subs = [await subscriber(n) for n in (a, b, c)]
    sent = payloads("a", 1000)
    await publish(a, [*sent, b"end-a"])
    # As with fqd: A's own subscriber once; B and C once directly, once by the other path.
    expected = {"A": 1, "B": 2, "C": 2}
    for node, sub in zip((a, b, c), subs, strict=True):
        got = counts(await until_markers(sub, {b"end-a": expected[node.name]}))
        assert got == collections.Counter({p: expected[node.name] for p in sent}), node.name
        await sub.close()
    # Every copy has arrived by every path (the markers did): nothing goes round again.
    assert [await exchange_messages(n) for n in (a, b, c)] == [1001, 2002, 2002]


async def test_full_mesh_with_dedupe_delivers_once(cluster: Cluster, tmp_path: Path) -> None:
    conf = tmp_path / "dedupe.toml"
    conf.write_text("[fqd]\npeer_dedupe = 100000\n")
    a, b, c = await mesh(cluster, "--config", str(conf))
    subs = [await subscriber(n) for n in (a, b, c)]
    sent = payloads("a", 500) + payloads("b", 500)
    await asyncio.gather(publish(a, [*sent[:500], b"end-a"]), publish(b, [*sent[500:], b"end-b"]))
    for sub in subs:
        got = counts(await until_markers(sub, {b"end-a": 1, b"end-b": 1}))
        assert got == collections.Counter(sent)
        await sub.close()

    # Each message (markers too) reaches each broker that did not publish it directly, and
    # through the third broker unless that broker took the relayed copy first: then its
    # hop is on it, and the third broker does not send it back. So 1 or 2 second copies
    # per message are dropped as duplicates, by which path won (under load the relay can),
    # and none went into an exchange. Done once the count has settled.
    total = len(sent) + 2
    seen: list[int] = []

    async def all_second_copies_dropped() -> bool | None:
        stats = [await node.stats() for node in (a, b, c)]
        duplicates = sum(p["duplicates"] for s in stats for p in s["peers"])
        assert duplicates <= 2 * total
        seen.append(duplicates)
        if duplicates == 2 * total or (duplicates >= total and seen[-10:] == [duplicates] * 10):
            return True
        return None

    await poll(all_second_copies_dropped)
    assert [await exchange_messages(n) for n in (a, b, c)] == [1002, 1002, 1002]


# --- failures and configuration changes --------------------------------------------------------


async def test_upstream_restart_reconnects_and_loses_nothing(cluster: Cluster) -> None:
    a = await cluster.start("A")
    b = await cluster.start("B")
    b.add_upstream(a, source="fqd-peerb/from-a/disk:permanent,backlog=-1", permanent=True)
    await b.peers_bound(1)
    sub_b = await subscriber(b)
    await publish(a, payloads("before", 200))
    received = await collect(sub_b, 200)

    await cluster.restart(a)  # same port, same data: the permanent queue comes back
    # Published before B is back: waits in A's permanent queue.
    await publish(a, payloads("outage", 200))
    (peer,) = await b.peers_bound(1)
    assert peer["reconnects"] >= 1
    await publish(a, [*payloads("after", 200), b"end"])
    # A redelivers what it sent before its crash (at least once): copies are allowed.
    received += await until_markers(sub_b, {b"end": 1})
    await sub_b.close()
    want = payloads("before", 200) + payloads("outage", 200) + payloads("after", 200)
    assert set(counts(received)) == set(want), "nothing lost"


async def test_downstream_outage_loses_nothing(cluster: Cluster) -> None:
    """B is down while A's publishers go on: A's permanent queue keeps it all for B."""
    a = await cluster.start("A")
    b = await cluster.start("B")
    b.add_upstream(a, source="fqd-peerb/to-b/disk:permanent,backlog=-1", permanent=True)
    await b.peers_bound(1)
    # B's own subscriber queue is permanent too, so B holds what arrives before it is back.
    source = "sub/sub-B/disk:permanent,backlog=-1"
    async with Client(port=b.port, source=source) as sub:
        await sub.bind(EXCHANGE, b"prefix:", BindFlags.PERM)
    await publish(a, payloads("up", 100))

    async def held_by_b() -> bool | None:
        return (await b.stats())["queues"]["sub-B"]["backlog"] == 100 or None

    # fq has no consumer acknowledgements: what is in flight to B when it dies is gone.
    await poll(held_by_b)
    await cluster.kill(b)
    await publish(a, [*payloads("down", 300), b"end"])
    await cluster.restart(b)
    async with Client(port=b.port, source=source) as sub:
        received = await until_markers(sub, {b"end": 1})
    assert counts(received) == collections.Counter(payloads("up", 100) + payloads("down", 300))


async def test_removing_the_row_unbinds_and_disconnects(cluster: Cluster) -> None:
    a = await cluster.start("A")
    b = await cluster.start("B")
    b.add_upstream(a, source="fqd-peerb/from-a/mem:backlog=-1", permanent=True)
    b.add_upstream(a, source="fqd-peerb/from-a/mem:backlog=-1", program='prefix:"x."')
    (peer,) = await b.peers_bound(1)
    assert len(peer["bindings"]) == 2

    async def routes_on_a() -> int:
        exchange = (await a.stats())["exchanges"].get(EXCHANGE.decode(), {})
        return len(exchange.get("routes", {}))

    assert await routes_on_a() == 2
    b.remove_upstreams()

    async def gone() -> bool | None:
        a_stats, b_stats = await a.stats(), await b.stats()
        peers_on_a = [c for q in a_stats["queues"].values() for c in q["clients"]]
        if "peers" in b_stats or peers_on_a or await routes_on_a():
            return None
        return True

    await poll(gone, timeout=5)
    # The permanent binding went from A's configuration too: a restart does not revive it.
    with contextlib.closing(sqlite3.connect(a.state / "fqd.sqlite")) as db:
        assert db.execute("SELECT COUNT(*) FROM binding").fetchone() == (0,)


async def test_a_peer_channel_publisher_is_parsed_in_peer_format(cluster: Cluster) -> None:
    """A client that publishes on a peer channel sends sender and hops
    (docs/fq-protocol.md §5.3)."""
    a = await cluster.start("A")
    sub = await subscriber(a)
    async with Client(port=a.port, source="relay", peer_id=bytes([10, 9, 9, 9])) as relay:
        relay.publish(EXCHANGE, b"r", b"via a peer channel")
        await relay.flush()
        await wait_for(lambda: sub.received_backlog == 1)
    msg = await sub.receive()
    assert (msg.payload, msg.sender) == (b"via a peer channel", b"relay")
    assert hop_addresses(msg.hops) == [NODES["A"]]
    await sub.close()
