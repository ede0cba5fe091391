"""Real brokers for the peering tests, each its own process with its own node id, port and
data directory: start, kill -9 and restart them, add and remove rows of their upstream
tables as an operator would, read their /stats.json and /metrics, and publish and collect
messages, waiting on markers rather than for a quiet moment.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import sqlite3
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from fqbroker.clients.fq.client import Client
from fqbroker.core.message import Message
from tests.conftest import TIMEOUT
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
