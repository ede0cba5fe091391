"""Peering between real brokers on loopback when things go wrong: an upstream refusing the
login or a program, a row of the upstream table changed under a running link, and the
backoff of a lost link (through a relay the test switches off and on)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sqlite3
from pathlib import Path
from typing import Any

from fqbroker.protocols.fq.wire import Mode
from tests.conftest import TIMEOUT
from tests.e2e.peering.cluster import (
    EXCHANGE,
    Cluster,
    Node,
    collect,
    poll,
    publish,
    subscriber,
)
from tests.loopback import LoopbackServer
from tests.procs import Proc


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
