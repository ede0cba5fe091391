"""``make storm``: many connections at once, then a storm of reconnecting clients.

``python -m bench.storm [--connections 10000] [--clients 500] [--seconds 60]
[--setting KEY=VALUE] [--fqd-arg ARG] [--json FILE]``

One broker child holds ``--connections`` connections while every front end's round trip
must succeed, then ``--clients`` clients connect, bind, publish and disconnect for
``--seconds``. docs/reliability.md, "make storm", has the checks; a broker's connection
limits must be raised for the run with ``--setting``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fqbroker.clients.fq.client import Client
from fqbroker.protocols.fq import wire

from .child import (
    Broker,
    Sample,
    add_run_options,
    broker_from,
    print_verdict,
    raise_nofile,
    run_main,
    run_parser,
    tcp_sockets,
)
from .frontends import FRONT_ENDS, NOTES, Conn, Target, auth_key, connect_tcp

MiB = 1 << 20
OPENING_AT_ONCE = 200
ROUND_TRIP_EVERY = 5.0


@dataclass
class Storm:
    broker: Broker
    target: Target
    t0: float = field(default_factory=time.monotonic)
    samples: dict[str, Sample] = field(default_factory=dict)
    round_trips: Counter[str] = field(default_factory=Counter)
    round_trip_failures: list[str] = field(default_factory=list)
    opened: int = 0
    open_failed: Counter[str] = field(default_factory=Counter)
    closed_early: int = 0
    open_seconds: float = 0.0
    cycles: int = 0
    cycle_errors: Counter[str] = field(default_factory=Counter)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def sample(self, name: str) -> Sample:
        self.samples[name] = self.broker.sample(self.t0)
        return self.samples[name]

    async def round_trip_all(self, when: str) -> None:
        async def one(name: str, trip: Any) -> None:
            try:
                async with asyncio.timeout(30):
                    await trip(self.target)
                self.round_trips[name] += 1
            except Exception as exc:  # every failure is a finding, whatever it is
                self.round_trip_failures.append(f"{name} {when}: {type(exc).__name__}: {exc}")

        await asyncio.gather(*(one(fe.name, fe.round_trip) for fe in FRONT_ENDS))

    # --- phase 1 --------------------------------------------------------------------------

    async def open_pair(self, i: int, gate: asyncio.Semaphore) -> Conn | None:
        async with gate:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.target.host, self.target.fq_port), 30
                )
                auth = wire.AuthPlain(b"s%d" % i, b"h%d\x00mem:private,drop,backlog=100" % i, b"")
                writer.write(wire.encode_hello(wire.Mode.CMD, b"")[:4] + wire.encode(auth))
                key = await auth_key(reader, 30)
                command = Conn(reader, writer)
                data = await connect_tcp(self.target.host, self.target.fq_port)
                data.holds.append(command)
                if not await data.send(wire.encode_hello(wire.Mode.DATA, key)):
                    raise ConnectionError("closed at the data hello")
            except (ConnectionError, OSError, TimeoutError) as exc:
                self.open_failed[type(exc).__name__ + ": " + str(exc)[:60]] += 1
                return None
            self.opened += 2
            return data

    async def hold(self, connections: int, seconds: float) -> None:
        gate = asyncio.Semaphore(OPENING_AT_ONCE)
        start = time.monotonic()
        pairs = await asyncio.gather(*(self.open_pair(i, gate) for i in range(connections // 2)))
        self.open_seconds = time.monotonic() - start
        held = [p for p in pairs if p is not None]
        self.sample("held")
        await self.round_trip_all("while holding")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)
        self.sample("held, end")
        self.closed_early = sum(1 for p in held for c in (p, *p.holds) if c.closed_by_peer)
        for i in range(0, len(held), 500):
            await asyncio.gather(*(p.close() for p in held[i : i + 500]))

    # --- phase 2 --------------------------------------------------------------------------

    async def reconnecting(self, i: int, deadline: float) -> None:
        exchange, route = b"storm.r", b"c%d.x" % i
        while time.monotonic() < deadline:
            client = Client(
                self.target.host, self.target.fq_port, source=f"r{i}/rq{i}/mem:private",
                reconnect=False, connect_timeout=30,
            )  # fmt: skip
            try:
                await client.connect()
                if await client.bind(exchange, b'prefix:"c%d."' % i) == wire.BIND_ILLEGAL:
                    self.cycle_errors["bind refused"] += 1
                client.publish(exchange, route, b"storm %d" % self.cycles)
                await client.close()
                self.cycles += 1
            except Exception as exc:  # counted by kind; the storm goes on
                self.cycle_errors[f"{type(exc).__name__}: {str(exc)[:60]}"] += 1
                with contextlib.suppress(Exception):
                    await client.close()

    async def checker(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), ROUND_TRIP_EVERY)
            await self.round_trip_all("during the reconnect storm")
            with contextlib.suppress(OSError, RuntimeError):
                s = self.broker.sample(self.t0)
                peak = self.samples.get("storm peak")
                if peak is None or s.rss > peak.rss:
                    self.samples["storm peak"] = s

    async def reconnect_storm(self, clients: int, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        await asyncio.gather(
            self.checker(deadline), *(self.reconnecting(i, deadline) for i in range(clients))
        )


async def settle(storm: Storm, fds: int, seconds: float) -> Sample:
    for _ in range(int(seconds * 10)):
        s = storm.broker.sample(storm.t0)
        if s.fds <= fds:
            break
        await asyncio.sleep(0.1)
    return s


async def run(args: argparse.Namespace) -> dict[str, Any]:
    limit = raise_nofile()
    NOTES.clear()
    print(
        f"storm: {args.connections:,} connections held, then {args.clients} clients"
        f" reconnecting for {args.seconds} s (descriptor limit {limit})",
        flush=True,
    )
    state = Path(args.state)
    shutil.rmtree(state, ignore_errors=True)
    broker = broker_from(args, state)
    await asyncio.to_thread(broker.start)
    storm = Storm(broker, await Target.of("127.0.0.1", broker.port))  # own ports too
    try:
        await storm.round_trip_all("before")
        base = storm.sample("baseline")
        await storm.hold(args.connections, args.hold_seconds)
        after_hold = await settle(storm, base.fds, args.settle_seconds)
        storm.samples["after hold"] = after_hold
        await storm.reconnect_storm(args.clients, args.seconds)
        await storm.round_trip_all("after")
        end = await settle(storm, base.fds, args.settle_seconds)
        storm.samples["end"] = end
        left = tcp_sockets(broker.pid) if end.fds > base.fds + 4 else []
        alive = broker.alive()
        tracebacks = broker.tracebacks()
    finally:
        status = await asyncio.to_thread(broker.stop)
    return report(storm, args, alive, status, tracebacks, left)


def report(
    storm: Storm,
    args: argparse.Namespace,
    alive: bool,
    status: int | None,
    tracebacks: dict[str, int],
    left: list[str],
) -> dict[str, Any]:
    s = storm.samples
    base, end = s["baseline"], s["end"]
    peak = max((v.rss for v in s.values()), default=0)
    rss_limit = max(base.rss + 32 * MiB, base.rss + (peak - base.rss) / 3)
    failures = []
    if storm.opened < args.connections:
        failures.append(f"{storm.opened} of {args.connections} connections opened")
    if storm.closed_early:
        failures.append(f"{storm.closed_early} held connections closed by the broker")
    if storm.round_trip_failures:
        failures.append(f"{len(storm.round_trip_failures)} round trips failed")
    if storm.cycle_errors:
        failures.append(f"reconnecting clients failed: {dict(storm.cycle_errors)}")
    if not alive:
        failures.append("the broker died")
    if tracebacks:
        failures.append(f"tracebacks in the broker's log: {tracebacks}")
    if end.fds > base.fds + 4:
        failures.append(f"descriptors not back: {base.fds} before, {end.fds} after")
    if end.rss > rss_limit:
        failures.append(f"RSS not back: {base.rss // MiB} MiB before, {end.rss // MiB} after")
    for note, n in NOTES.items():
        failures.append(f"{n} x {note}")
    return {
        "connections": args.connections,
        "opened": storm.opened,
        "open_seconds": round(storm.open_seconds, 1),
        "open_failed": dict(storm.open_failed),
        "closed_early": storm.closed_early,
        "clients": args.clients,
        "seconds": args.seconds,
        "cycles": storm.cycles,
        "cycles_per_second": round(storm.cycles / args.seconds),
        "cycle_errors": dict(storm.cycle_errors),
        "round_trips": dict(storm.round_trips),
        "round_trip_failures": storm.round_trip_failures[:20],
        "samples": {k: {"rss": v.rss, "fds": v.fds} for k, v in s.items()},
        "sockets_left": left,
        "notes": dict(NOTES),
        "tracebacks": tracebacks,
        "exit_status": status,
        "failures": failures,
    }


def print_summary(r: dict[str, Any]) -> None:
    print(
        f"storm: held {r['opened']:,} of {r['connections']:,} connections (opened in"
        f" {r['open_seconds']} s), {r['closed_early']} closed early, failed {r['open_failed']}"
    )
    print(
        f"  {r['clients']} clients reconnecting for {r['seconds']} s: {r['cycles']:,} cycles"
        f" ({r['cycles_per_second']}/s), errors {r['cycle_errors']}"
    )
    print(f"  round trips {r['round_trips']}, failures {r['round_trip_failures']}")
    for name, v in r["samples"].items():
        print(f"  {name}: RSS {v['rss'] // MiB} MiB, {v['fds']:,} fds")
    if r["sockets_left"]:
        print(f"  sockets left: {r['sockets_left'][:20]}")
    if r["notes"]:
        print(f"  findings {r['notes']}")
    print(f"  broker exit {r['exit_status']}, tracebacks {r['tracebacks']}")
    print_verdict("storm", r["failures"])


def parser() -> argparse.ArgumentParser:
    p = run_parser("storm", __doc__)
    p.add_argument("--connections", type=int, default=10_000)
    p.add_argument("--hold-seconds", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=500)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--settle-seconds", type=float, default=45.0)
    add_run_options(p, "storm")
    return p


def main(argv: list[str] | None = None) -> int:
    return run_main(parser(), run, print_summary, argv)


if __name__ == "__main__":
    sys.exit(main())
