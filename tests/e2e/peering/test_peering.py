"""Peering between real brokers on loopback, each its own process, node id, port and data
directory (docs/fq-protocol.md §5): one-way, two-way, a ring, a full mesh, an upstream
restart, a row removed or changed, an upstream refusing the login or a program, and the
backoff of a lost link."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import os
import signal
import sqlite3
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fqbroker.clients.fq.client import Client
from fqbroker.core.message import Message, hop_addresses
from fqbroker.protocols.fq.wire import BindFlags, Mode
from tests.conftest import TIMEOUT, wait_for
from tests.loopback import LoopbackServer
from tests.procs import Proc

NODES = {"A": "10.254.254.1", "B": "10.254.254.2", "C": "10.254.254.3"}
EXCHANGE = b"peered"


@dataclass
class Node:
    name: str
    state: Path
    proc: Proc
    port: int

    @property
    def node_id(self) -> str:
        return NODES[self.name]

    def add_upstream(
        self,
        upstream: Node,
        *,
        source: str | None = None,
        program: str = "prefix:",
        permanent: bool = False,
    ) -> None:
        """Insert a row into this broker's sqlite upstream table, as an operator would."""
        with contextlib.closing(sqlite3.connect(self.state / "fqd.sqlite")) as db, db:
            db.execute(
                "INSERT INTO upstream (host, port, source, password, exchange, program, "
                "permanent_binding) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    "127.0.0.1",
                    upstream.port,
                    source or f"fqd-peer{self.name.lower()}//mem:drop,private,backlog=-1",
                    "none",
                    EXCHANGE.decode(),
                    program,
                    "true" if permanent else "false",
                ),
            )

    def remove_upstreams(self) -> None:
        with contextlib.closing(sqlite3.connect(self.state / "fqd.sqlite")) as db, db:
            db.execute("DELETE FROM upstream")

    async def stats(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.port}/stats.json"

        def fetch() -> dict[str, Any]:
            with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
                data: dict[str, Any] = json.load(response)
                return data

        return await asyncio.to_thread(fetch)

    async def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        url = f"http://127.0.0.1:{self.port}/metrics"

        def fetch() -> str:
            with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
                return str(response.read().decode())

        text = await asyncio.to_thread(fetch)
        return {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    async def peers_bound(self, count: int) -> list[dict[str, Any]]:
        """Wait until ``count`` upstream links are connected with every binding accepted."""

        async def ready() -> list[dict[str, Any]] | None:
            peers = (await self.stats()).get("peers", [])
            ok = [
                p
                for p in peers
                if p["state"] == "connected" and all(b["route_id"] for b in p["bindings"])
            ]
            return peers if len(ok) == count == len(peers) else None

        return await poll(ready)


async def poll(check: Any, timeout: float = TIMEOUT) -> Any:
    async with asyncio.timeout(timeout):
        while (result := await check()) is None:
            await asyncio.sleep(0.05)
        return result


class Cluster:
    """Brokers started by one test, each with its own node id, port and data directory."""

    def __init__(self, root: Path, procs: list[Proc]) -> None:
        self.root = root
        self.procs = procs

    async def start(self, name: str, *args: str) -> Node:
        state = self.root / name
        state.mkdir(exist_ok=True)
        proc, port = await Proc.start_fqd(state, "-n", NODES[name], *args)
        self.procs.append(proc)
        return Node(name, state, proc, port)

    async def kill(self, node: Node) -> None:
        if node.proc.proc.returncode is None:
            os.kill(node.proc.proc.pid, signal.SIGKILL)
            await node.proc.proc.wait()

    async def restart(self, node: Node) -> None:
        """kill -9 if running, then start again on the same port with the same data."""
        await self.kill(node)
        node.proc, node.port = await Proc.start_fqd(
            node.state, "-n", NODES[node.name], "-p", str(node.port)
        )
        self.procs.append(node.proc)


@pytest.fixture
def cluster(tmp_path: Path, procs: list[Proc]) -> Cluster:
    return Cluster(tmp_path, procs)


async def subscriber(node: Node, name: str = "sub") -> Client:
    client = Client(port=node.port, source=f"{name}/{name}-{node.name}/mem:backlog=-1")
    await client.connect()
    await client.bind(EXCHANGE, b"prefix:")
    return client


async def publish(node: Node, payloads: Iterable[bytes], sender: str = "pub") -> None:
    async with Client(port=node.port, source=sender) as pub:
        for payload in payloads:
            pub.publish(EXCHANGE, b"r." + payload[:8], payload)
        await pub.flush()


async def collect(client: Client, expected: int) -> list[Message]:
    """The next ``expected`` messages the client gets (see until_markers for "and no more")."""
    got: list[Message] = []
    async with asyncio.timeout(TIMEOUT * 3):
        while len(got) < expected:
            got.append(await client.receive())
    return got


async def until_markers(client: Client, markers: dict[bytes, int]) -> list[Message]:
    """What the client gets until it has had each marker as many times as given; the
    markers left out.

    A marker is published last, on the connection that published the messages before it,
    and every path between brokers is first in, first out: once a marker came by every
    path it can take, so did everything published before it, and any copy too many was
    seen. This is what the tests wait on rather than for a quiet moment.
    """
    got: list[Message] = []
    left = collections.Counter(markers)
    async with asyncio.timeout(TIMEOUT * 3):
        while +left:
            msg = await client.receive()
            if msg.payload in markers:
                left[msg.payload] -= 1
                assert left[msg.payload] >= 0, f"{msg.payload!r} came more often than expected"
            else:
                got.append(msg)
    return got


def payloads(tag: str, n: int) -> list[bytes]:
    return [f"{tag}-{i:05d}".encode() for i in range(n)]


def counts(messages: list[Message]) -> collections.Counter[bytes]:
    return collections.Counter(m.payload for m in messages)


async def exchange_messages(node: Node) -> int:
    ex = (await node.stats())["exchanges"].get(EXCHANGE.decode())
    return 0 if ex is None else int(ex["messages"])


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


# --- refusals, changed rows, backoff -------------------------------------------------------


class Switch(LoopbackServer):
    """A loopback relay in front of an upstream that the test turns off and on.

    Off, it accepts each connection and closes it at once, as an upstream whose address
    answers but which is gone; on, it relays to ``target``. Either way it records when
    each command connection (an attempt to log in) arrived, so a test can read the
    sequence of a link's attempts instead of timing it.
    """

    def __init__(self, target: int) -> None:
        super().__init__()
        self.target = target
        self.on = True
        self.attempts: list[float] = []  # loop time of each command connection
        self._arrived = asyncio.Event()

    async def __aexit__(self, *exc: object) -> None:
        self.on = False  # a connection still being accepted is refused, not relayed
        await super().__aexit__(*exc)

    def off(self) -> None:
        """Refuse from now on, and cut what is relayed now."""
        self.on = False
        for writer in self.writers:
            writer.close()
        self.writers.clear()

    async def attempts_reach(self, n: int) -> list[float]:
        async with asyncio.timeout(TIMEOUT * 2):
            while len(self.attempts) < n:
                self._arrived.clear()
                await self._arrived.wait()
        return self.attempts

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            hello = await reader.readexactly(4)
        except (ConnectionError, asyncio.IncompleteReadError):
            writer.close()
            return
        if hello == (Mode.CMD).to_bytes(4, "big"):
            self.attempts.append(asyncio.get_running_loop().time())
            self._arrived.set()
        if not self.on:
            writer.close()
            return
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target)
        up_w.write(hello)
        self.writers |= {writer, up_w}
        self.spawn(self._pump(reader, up_w))
        self.spawn(self._pump(up_r, writer))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while chunk := await reader.read(65536):
                writer.write(chunk)
                await writer.drain()
        writer.close()


def assert_never_sooner(attempts: list[float], since: float, waits: list[float]) -> None:
    """Each attempt came no sooner after ``since`` than the waits before it allow.

    ``attempts`` are when this process saw them, never before they happened, and
    ``since`` was taken before anything could attempt: a slow machine only makes them
    later. So this fails for a backoff that is too fast, never for a loaded machine.
    """
    earliest = list(itertools.accumulate(waits))
    seen = [t - since for t in attempts[: len(waits)]]
    assert len(seen) == len(waits)
    assert all(s >= e for s, e in zip(seen, earliest, strict=True)), (seen, earliest)


def update_upstreams(node: Node, assignments: str, *params: object) -> None:
    """UPDATE every row of the node's upstream table, as an operator would."""
    with contextlib.closing(sqlite3.connect(node.state / "fqd.sqlite")) as db, db:
        db.execute(f"UPDATE upstream SET {assignments}", params)


async def peers_where(node: Node, condition: Any) -> list[dict[str, Any]]:
    """Wait until ``condition`` holds on the node's /stats.json peers list."""

    async def check() -> list[dict[str, Any]] | None:
        peers = (await node.stats()).get("peers", [])
        return peers if condition(peers) else None

    result: list[dict[str, Any]] = await poll(check)
    return result


async def routes_on(node: Node) -> list[dict[str, Any]]:
    exchange = (await node.stats())["exchanges"].get(EXCHANGE.decode(), {})
    return list(exchange.get("routes", {}).values())


async def test_an_upstream_refusing_auth_is_retried_with_backoff_until_the_row_is_fixed(
    cluster: Cluster, tmp_path: Path
) -> None:
    a = await cluster.start("A")
    b = await cluster.start("B", "--config", str(fast_poll(tmp_path)))
    async with Switch(a.port) as switch:
        upstream = Node("A", a.state, a.proc, switch.port)  # B reaches A through the switch
        since = asyncio.get_running_loop().time()
        b.add_upstream(upstream, source="fqd-peerb/from-a/mem:bogus")
        # A answers every attempt "invalid queue param: bogus"; B keeps asking, ever slower:
        # PeerLink._connect tries at once, then waits 50 ms doubling, each x0.8..1.2.
        attempts = await switch.attempts_reach(6)
        assert_never_sooner(attempts, since, [0.0] + [0.8 * 0.05 * 2**i for i in range(5)])
        (peer,) = (await b.stats())["peers"]
        assert (peer["state"], peer["reconnects"], peer["bindings"][0]["route_id"]) == (
            "connecting",
            0,
            None,
        )
        assert [c for q in (await a.stats())["queues"].values() for c in q["clients"]] == []

        # The operator fixes the row: the link moves to the new source and pulls.
        update_upstreams(b, "source = ?", "fqd-peerb/from-a/mem:backlog=-1")
        (peer,) = await b.peers_bound(1)
        assert peer["source"] == "fqd-peerb/from-a/mem:backlog=-1"
        sub_b = await subscriber(b)
        await publish(a, [b"after the fix"])
        assert [m.payload for m in await collect(sub_b, 1)] == [b"after the fix"]
        await sub_b.close()


async def test_a_program_the_upstream_refuses_leaves_the_other_rows_working(
    cluster: Cluster, tmp_path: Path
) -> None:
    a = await cluster.start("A")
    b = await cluster.start("B", "--config", str(fast_poll(tmp_path)))
    b.add_upstream(a, program='prefix:"r.ok."')
    b.add_upstream(a, program="nonsense")  # does not compile on A: bind-illegal
    await stderr_line_containing(b.proc, "bind of b'peered' b'nonsense' refused")

    def one_bound_one_refused(peers: list[dict[str, Any]]) -> bool:
        if len(peers) != 1 or peers[0]["state"] != "connected":
            return False
        ids = {b["program"]: b["route_id"] for b in peers[0]["bindings"]}
        return (
            ids.keys() == {'prefix:"r.ok."', "nonsense"}
            and ids["nonsense"] is None
            and (ids['prefix:"r.ok."'] is not None)
        )

    await peers_where(b, one_bound_one_refused)
    assert [r["program"] for r in await routes_on(a)] == ['prefix:"r.ok."']
    sub_b = await subscriber(b)
    await publish(a, [b"ok.1"])
    assert [m.payload for m in await collect(sub_b, 1)] == [b"ok.1"]

    # Fixing the refused row binds it, on the same connection.
    update_upstreams(b, "program = ? WHERE program = ?", 'prefix:"r.late."', "nonsense")
    await b.peers_bound(1)
    (peer,) = (await b.stats())["peers"]
    assert peer["reconnects"] == 0 and len(peer["bindings"]) == 2
    await publish(a, [b"late.1"])
    assert [m.payload for m in await collect(sub_b, 1)] == [b"late.1"]
    await sub_b.close()


async def test_a_modified_row_moves_the_link_to_its_new_program_and_upstream(
    cluster: Cluster, tmp_path: Path
) -> None:
    a = await cluster.start("A")
    c = await cluster.start("C")
    b = await cluster.start("B", "--config", str(fast_poll(tmp_path)))
    b.add_upstream(a, program='prefix:"r.x."')
    await b.peers_bound(1)
    sub_b = await subscriber(b)
    await publish(a, [b"x.1"])
    assert [m.payload for m in await collect(sub_b, 1)] == [b"x.1"]

    # A new program: unbound and bound again on A, on the same connection.
    update_upstreams(b, "program = ?", 'prefix:"r.y."')

    async def rebound() -> bool | None:
        return [r["program"] for r in await routes_on(a)] == ['prefix:"r.y."'] or None

    await poll(rebound)
    (peer,) = await b.peers_bound(1)
    assert peer["bindings"][0]["program"] == 'prefix:"r.y."' and peer["reconnects"] == 0
    await publish(a, [b"x.2", b"y.2"])  # in order on one path: x.2 would come first
    assert [m.payload for m in await collect(sub_b, 1)] == [b"y.2"]

    # A new port: the link to A goes (its binding with it), one to C takes its place.
    update_upstreams(b, "port = ?", c.port)

    async def moved() -> bool | None:
        peers = (await b.stats()).get("peers", [])
        on_a = [cl for q in (await a.stats())["queues"].values() for cl in q["clients"]]
        if [p["port"] for p in peers] != [c.port] or on_a or await routes_on(a):
            return None
        return True

    await poll(moved)
    await b.peers_bound(1)
    await publish(c, [b"y.3"])
    assert [m.payload for m in await collect(sub_b, 1)] == [b"y.3"]
    await sub_b.close()


async def test_a_lost_upstream_is_retried_with_growing_delays_and_reconnects(
    cluster: Cluster, tmp_path: Path
) -> None:
    a = await cluster.start("A")
    b = await cluster.start("B", "--config", str(fast_poll(tmp_path)))
    async with Switch(a.port) as switch:
        b.add_upstream(Node("A", a.state, a.proc, switch.port))
        await b.peers_bound(1)
        sub_b = await subscriber(b)
        await publish(a, [b"before"])
        assert [m.payload for m in await collect(sub_b, 1)] == [b"before"]

        first = len(switch.attempts)
        since = asyncio.get_running_loop().time()
        switch.off()  # the upstream is gone: B's link reconnects (fqbroker.clients.fq.client)
        attempts = (await switch.attempts_reach(first + 7))[first:]
        # The client's backoff waits before each attempt: 16 ms doubling to 1 s, +-4 ms.
        waits = [min(0.016 * 2**i, 1.0) - 0.004 for i in range(7)]
        assert_never_sooner(attempts, since, waits)  # seven attempts take 2 s at least
        (peer,) = (await b.stats())["peers"]
        assert peer["state"] == "reconnecting"

        switch.on = True  # back: the next attempt gets through and binds again
        (peer,) = await peers_where(
            b, lambda p: len(p) == 1 and p[0]["state"] == "connected" and p[0]["reconnects"]
        )
        await b.peers_bound(1)
        await publish(a, [b"after"])
        assert [m.payload for m in await collect(sub_b, 1)] == [b"after"]
        await sub_b.close()


async def stderr_line_containing(proc: Proc, text: str) -> str:
    async with asyncio.timeout(TIMEOUT):
        return await proc.wait_stderr(text, anywhere=True)


def fast_poll(tmp_path: Path) -> Path:
    conf = tmp_path / "fast-poll.toml"
    conf.write_text("[fqd]\npeer_poll_seconds = 0.1\n")
    return conf
