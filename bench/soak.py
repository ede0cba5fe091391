"""``make soak``: mixed load over every front end while the broker is killed and restarted.

``python -m bench.soak [--minutes 30] [--seed N] [--setting KEY=VALUE] [--fqd-arg ARG]``

Durable publishers (fq, peer mode, /submit) confirm into a permanent disk queue, a memory
queue has its own publisher and consumer, and the broker gets SIGKILL every few minutes.
At the end nothing confirmed may be lost or reordered, and the broker's RSS must be flat
in each incarnation (:func:`flat`). docs/reliability.md, "make soak", has the checks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fqbroker.clients.fq.client import Client, ClientClosed, ClientError

from .child import (
    Broker,
    Sample,
    add_run_options,
    broker_from,
    http_reply,
    print_verdict,
    run_main,
    run_parser,
)

DISK_SOURCE = "soak/soakdisk/disk:permanent,backlog=-1,public"
MEM_SOURCE = "soak/soakmem/mem:public,drop,backlog=1000000"
PERM = 0x0110
# After a crash a disk queue delivers again at most the batch that was in flight to its
# consumer (fqbroker/storage/store.py; the batch is BATCH in fqbroker/frontends/fq/data.py).
REDELIVERY_BATCH = 1024
MiB = 1 << 20
PAD_SIZES = (16, 200, 1000, 8000, 64 * 1024)
PAD_WEIGHTS = (40, 30, 20, 9, 1)


@dataclass
class Ledger:
    """What one publisher sent and what the consumers saw of it."""

    name: str
    durable: bool
    sent: int = 0  # highest sequence number written
    confirmed: int = 0  # 1..confirmed are confirmed (or acknowledged with a 200)
    seen: bytearray = field(default_factory=bytearray)  # arrivals per seq, saturating
    high: int = 0  # highest seq that has arrived
    received: int = 0
    out_of_order: int = 0
    resent: int = 0
    again: bytearray = field(default_factory=bytearray)  # 1 where a seq was sent again
    confirms: int = 0
    refused: Counter[str] = field(default_factory=Counter)

    def arrived(self, seq: int) -> None:
        self.received += 1
        if seq >= len(self.seen):
            self.seen.extend(bytes(max(seq + 1 - len(self.seen), len(self.seen))))
        if self.seen[seq] == 0 and seq < self.high:
            self.out_of_order += 1
        self.seen[seq] = min(self.seen[seq] + 1, 255)
        self.high = max(self.high, seq)

    def count(self, seq: int) -> int:
        return self.seen[seq] if seq < len(self.seen) else 0

    def lost(self) -> int:
        return sum(1 for s in range(1, self.confirmed + 1) if self.count(s) == 0)

    def duplicates(self) -> int:
        return sum(c - 1 for c in self.seen if c > 1)

    def mark_resent(self, first: int, last: int) -> None:
        """Seqs ``first..last`` go out again: a publisher's own duplicates, allowed."""
        if last >= len(self.again):
            self.again.extend(bytes(max(last + 1 - len(self.again), len(self.again))))
        self.again[first : last + 1] = b"\x01" * (last + 1 - first)
        self.resent += last + 1 - first

    def redelivered(self) -> int:
        """Duplicates of messages sent once: the broker's own redeliveries."""
        again = self.again
        return sum(
            c - 1 for s, c in enumerate(self.seen) if c > 1 and not (s < len(again) and again[s])
        )

    def distinct(self) -> int:
        return sum(1 for c in self.seen if c)

    def summary(self) -> dict[str, Any]:
        return {
            "durable": self.durable,
            "sent": self.sent,
            "resent": self.resent,
            "confirmed": self.confirmed,
            "confirms": self.confirms,
            "received": self.received,
            "distinct": self.distinct(),
            "lost": self.lost() if self.durable else None,
            "duplicates": self.duplicates(),
            "redelivered": self.redelivered(),
            "out_of_order": self.out_of_order,
            "refused": dict(self.refused),
        }


@dataclass
class Soak:
    broker: Broker
    rng: random.Random
    rate: float
    batch: int
    ledgers: dict[bytes, Ledger] = field(default_factory=dict)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    up: asyncio.Event = field(default_factory=asyncio.Event)
    kills: int = 0
    reconnects: Counter[str] = field(default_factory=Counter)
    stats_ok: int = 0
    stats_failed: int = 0
    samples: list[list[Sample]] = field(default_factory=list)
    findings: Counter[str] = field(default_factory=Counter)
    arrival: asyncio.Event = field(default_factory=asyncio.Event)
    t0: float = field(default_factory=time.monotonic)

    @property
    def port(self) -> int:
        return self.broker.port

    def ledger(self, name: str, durable: bool) -> Ledger:
        led = Ledger(name, durable)
        self.ledgers[name.encode()] = led
        return led

    def payload(self, name: str, seq: int) -> bytes:
        pad = self.rng.choices(PAD_SIZES, PAD_WEIGHTS)[0]
        return b"%s %d " % (name.encode(), seq) + b"x" * pad

    def record(self, payload: bytes) -> None:
        name, _, rest = payload.partition(b" ")
        led = self.ledgers.get(name)
        if led is None:
            self.findings["a message no publisher sent"] += 1
            return
        led.arrived(int(rest.split(b" ", 1)[0]))
        self.arrival.set()

    async def pace(self, started: float, messages: int, rate: float | None = None) -> None:
        """Sleep so that ``messages`` since ``started`` keep to ``rate`` (the publishers')."""
        ahead = started + messages / (rate or self.rate) - time.monotonic()
        if ahead > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), ahead)

    # --- durable publishers over the fq protocol -------------------------------------------

    async def durable_publisher(self, name: str, peer_id: bytes | None) -> None:
        led = self.ledger(name, durable=True)
        while not self.stop.is_set():
            await self.up.wait()
            client = Client(port=self.port, source=name, reconnect=False, peer_id=peer_id)
            first = True
            try:
                async with asyncio.timeout(20):
                    await client.connect()
                started, published = time.monotonic(), 0
                while not self.stop.is_set():
                    start = led.confirmed + 1
                    end = start + self.batch - 1
                    if led.sent >= start:
                        led.mark_resent(start, min(led.sent, end))
                    for seq in range(start, end + 1):
                        client.publish(b"soak.disk", name.encode(), self.payload(name, seq))
                    led.sent = max(led.sent, end)
                    async with asyncio.timeout(30):
                        await client.confirm()
                    led.confirms += 1
                    led.confirmed = end
                    first = False
                    published += self.batch
                    await self.pace(started, published)
            except ClientClosed:
                self.reconnects[name] += 1  # the connection died: not a refusal
            except ClientError as exc:
                led.refused[exc.text] += 1
                what = "first confirm on a connection" if first else "confirm"
                self.findings[f"{what} refused: {exc.text}"] += 1
            except (ConnectionError, OSError, TimeoutError, EOFError):
                self.reconnects[name] += 1
            finally:
                await close_quietly(client)
            if not self.stop.is_set():
                await asyncio.sleep(0.05 + self.rng.random() * 0.2)

    # --- HTTP /submit ---------------------------------------------------------------------

    async def http_publisher(self, name: str) -> None:
        led = self.ledger(name, durable=True)
        started, published = time.monotonic(), 0
        rate = max(1.0, self.rate / 4)
        while not self.stop.is_set():
            await self.up.wait()
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", self.port), 10
                )
            except (OSError, TimeoutError):
                self.reconnects[name] += 1
                await asyncio.sleep(0.1)
                continue
            try:
                while not self.stop.is_set():
                    seq = led.confirmed + 1
                    if led.sent >= seq:
                        led.mark_resent(seq, seq)
                    led.sent = max(led.sent, seq)
                    body = self.payload(name, seq)
                    head = (
                        f"POST /submit HTTP/1.1\r\nHost: soak\r\nX-Fq-Exchange: soak.http\r\n"
                        f"X-Fq-Route: {name}\r\nContent-Length: {len(body)}\r\n\r\n"
                    )
                    writer.write(head.encode() + body)
                    status, reply = await asyncio.wait_for(http_reply(reader), 30)
                    if status != 200:
                        led.refused[f"{status} {reply[:80]!r}"] += 1
                        self.findings[f"/submit answered {status}"] += 1
                        break
                    if json.loads(reply).get("routed", 0) < 1:
                        self.findings["/submit not routed to the disk queue"] += 1
                    led.confirms += 1
                    led.confirmed = seq
                    published += 1
                    await self.pace(started, published, rate)
            except (ConnectionError, OSError, TimeoutError, EOFError, ValueError):
                self.reconnects[name] += 1
            finally:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()

    async def stats_poller(self) -> None:
        while not self.stop.is_set():
            await self.up.wait()
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", self.port), 10
                )
                try:
                    writer.write(b"GET /stats.json HTTP/1.1\r\nHost: soak\r\n\r\n")
                    status, body = await asyncio.wait_for(http_reply(reader), 20)
                    json.loads(body)
                    if status == 200:
                        self.stats_ok += 1
                    else:
                        self.stats_failed += 1
                finally:
                    writer.close()
            except (ConnectionError, OSError, TimeoutError, EOFError, ValueError):
                # Only a failure while the broker was up counts.
                if self.broker.alive() and self.up.is_set():
                    self.stats_failed += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), 5)

    # --- memory queue traffic -------------------------------------------------------------

    async def mem_publisher(self, name: str) -> None:
        led = self.ledger(name, durable=False)
        while not self.stop.is_set():
            await self.up.wait()
            client = Client(port=self.port, source=name, reconnect=False)
            try:
                async with asyncio.timeout(20):
                    await client.connect()
                started, published = time.monotonic(), 0
                while not self.stop.is_set():
                    for _ in range(self.batch):
                        led.sent += 1
                        client.publish(b"soak.mem", b"m", self.payload(name, led.sent))
                    async with asyncio.timeout(30):
                        await client.flush()
                    published += self.batch
                    await self.pace(started, published)
            except (ConnectionError, OSError, TimeoutError, EOFError, ClientError):
                self.reconnects[name] += 1
            finally:
                await close_quietly(client)
            if not self.stop.is_set():
                await asyncio.sleep(0.05)

    # --- consumers ------------------------------------------------------------------------

    async def consumer(self, source: str, exchanges: list[bytes], flags: int, done: asyncio.Event):
        name = source.split("/")[1]
        while not done.is_set():
            await self.up.wait()
            client = Client(port=self.port, source=source, reconnect=False)
            try:
                async with asyncio.timeout(20):
                    await client.connect()
                    for exchange in exchanges:
                        await client.bind(exchange, b"prefix:", flags)
                while not done.is_set():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(0.5):
                            for msg in await client.receive_many(4096):
                                self.record(msg.payload)
            except (ConnectionError, OSError, TimeoutError, EOFError, ClientError):
                self.reconnects[name] += 1
            finally:
                await close_quietly(client)
            if not done.is_set():
                await asyncio.sleep(0.1)

    # --- the broker's life ----------------------------------------------------------------

    async def killer(self, kill_min: float, kill_max: float) -> None:
        while True:
            wait = self.rng.uniform(kill_min, kill_max)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), wait)
                return
            self.up.clear()
            self.broker.kill9()
            self.kills += 1
            await asyncio.sleep(self.rng.uniform(0.0, 2.0))
            await asyncio.to_thread(self.broker.start)
            self.samples.append([])
            self.up.set()

    async def sampler(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(OSError, RuntimeError, AssertionError):
                if self.up.is_set() and self.samples:
                    self.samples[-1].append(self.broker.sample(self.t0))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), 5)

    def drained(self) -> bool:
        return all(led.lost() == 0 for led in self.ledgers.values() if led.durable)


async def close_quietly(client: Client) -> None:
    """Close within 5 s, whatever became of the connection: the broker may have been killed."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(5):
            await client.close()


def flat(samples: list[Sample], warmup: float = 30.0) -> tuple[bool, int, int]:
    """RSS is flat in one incarnation when its last sample is within 25% or 32 MiB (whichever
    is larger) of the first sample taken ``warmup`` seconds after it started."""
    if not samples:
        return True, 0, 0
    start = samples[0].at
    warm = next((s for s in samples if s.at - start >= warmup), None)
    if warm is None:
        return True, samples[0].rss, samples[-1].rss
    last = samples[-1]
    return last.rss <= max(warm.rss * 1.25, warm.rss + 32 * MiB), warm.rss, last.rss


async def run(args: argparse.Namespace) -> dict[str, Any]:
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    print(f"soak: seed {seed}, {args.minutes} min", flush=True)
    state = Path(args.state)
    shutil.rmtree(state, ignore_errors=True)
    broker = broker_from(args, state)
    soak = Soak(broker, random.Random(seed), args.rate, args.batch)
    await asyncio.to_thread(broker.start)
    try:
        status, drain_seconds = await drive(soak, args)
    except BaseException:
        broker.kill9()  # no broker outlives a harness that failed or was interrupted
        raise
    return report(soak, seed, args, status, drain_seconds)


async def drive(soak: Soak, args: argparse.Namespace) -> tuple[int | None, float]:
    """The load, the kills, the drain and the final stop: (exit status, drain seconds)."""
    broker = soak.broker
    soak.samples.append([])
    soak.up.set()
    # The disk queue and its permanent bindings exist before anything is published: a
    # confirmed message that matched no binding is confirmed too, and would look lost.
    async with Client(port=broker.port, source=DISK_SOURCE, reconnect=False) as setup:
        for exchange in (b"soak.disk", b"soak.http"):
            await setup.bind(exchange, b"prefix:", PERM)
    consumers_done = asyncio.Event()
    tasks = [
        asyncio.create_task(soak.durable_publisher("fq0", None)),
        asyncio.create_task(soak.durable_publisher("fq1", None)),
        asyncio.create_task(soak.durable_publisher("peer0", bytes([10, 9, 9, 9]))),
        asyncio.create_task(soak.http_publisher("http0")),
        asyncio.create_task(soak.mem_publisher("mem0")),
        asyncio.create_task(soak.stats_poller()),
        asyncio.create_task(soak.sampler()),
        asyncio.create_task(soak.killer(args.kill_min, args.kill_max)),
    ]
    consumers = [
        asyncio.create_task(
            soak.consumer(DISK_SOURCE, [b"soak.disk", b"soak.http"], PERM, consumers_done)
        ),
        asyncio.create_task(soak.consumer(MEM_SOURCE, [b"soak.mem"], 0x0100, consumers_done)),
    ]
    end = time.monotonic() + args.minutes * 60
    next_report = time.monotonic() + 60
    while time.monotonic() < end:
        await asyncio.sleep(min(5.0, max(0.0, end - time.monotonic())))
        if time.monotonic() >= next_report:
            next_report += 60
            print(progress(soak), flush=True)
    soak.stop.set()
    await asyncio.gather(*tasks)
    soak.up.set()
    # Drain: every confirmed message should arrive; bounded wait.
    drain_start = time.monotonic()
    while not soak.drained() and time.monotonic() - drain_start < args.drain_seconds:
        soak.arrival.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(soak.arrival.wait(), 1.0)
    drain_seconds = time.monotonic() - drain_start
    # A little longer, so late duplicates are counted too.
    await asyncio.sleep(2)
    consumers_done.set()
    await asyncio.gather(*consumers)
    with contextlib.suppress(OSError, RuntimeError, AssertionError):
        soak.samples[-1].append(broker.sample(soak.t0))
    status = await asyncio.to_thread(broker.stop)
    return status, drain_seconds


def progress(soak: Soak) -> str:
    t = time.monotonic() - soak.t0
    parts = [f"{t / 60:5.1f} min", f"kills {soak.kills}"]
    for name, led in soak.ledgers.items():
        parts.append(f"{name.decode()} {led.confirmed if led.durable else led.sent}/{led.received}")
    rss = soak.samples[-1][-1].rss // MiB if soak.samples and soak.samples[-1] else 0
    parts.append(f"rss {rss} MiB")
    return "soak: " + ", ".join(parts)


def report(
    soak: Soak, seed: int, args: argparse.Namespace, status: int | None, drain: float
) -> dict[str, Any]:
    failures: list[str] = []
    ledgers = {name.decode(): led.summary() for name, led in soak.ledgers.items()}
    for name, led in soak.ledgers.items():
        if led.durable and led.lost():
            failures.append(f"{name.decode()}: {led.lost()} confirmed messages lost")
        if led.out_of_order:
            failures.append(f"{name.decode()}: {led.out_of_order} arrived out of order")
        if not led.durable and led.duplicates():
            failures.append(f"{name.decode()}: {led.duplicates()} duplicates from a memory queue")
        if led.received == 0:
            failures.append(f"{name.decode()}: nothing arrived")
    redelivered = sum(led.redelivered() for led in soak.ledgers.values() if led.durable)
    if redelivered > REDELIVERY_BATCH * soak.broker.starts:
        failures.append(
            f"{redelivered} duplicates of messages sent once: more than a delivery batch"
            f" ({REDELIVERY_BATCH}) per broker start ({soak.broker.starts})"
        )
    incarnations = []
    for i, samples in enumerate(soak.samples):
        ok, warm, last = flat(samples)
        incarnations.append({"warm_rss": warm, "last_rss": last, "flat": ok})
        if not ok:
            failures.append(f"RSS not flat in incarnation {i + 1}: {warm // MiB} -> {last // MiB}")
    tracebacks = soak.broker.tracebacks()
    if tracebacks:
        failures.append(f"tracebacks in the broker's log: {tracebacks}")
    if status not in (0, None):
        failures.append(f"the broker exited with {status} on SIGTERM")
    if soak.stats_failed:
        failures.append(f"/stats.json failed {soak.stats_failed} times while the broker was up")
    all_rss = [s.rss for samples in soak.samples for s in samples]
    result = {
        "seed": seed,
        "minutes": args.minutes,
        "kills": soak.kills,
        "starts": soak.broker.starts,
        "drain_seconds": round(drain, 1),
        "redelivered": redelivered,
        "ledgers": ledgers,
        "reconnects": dict(soak.reconnects),
        "stats_ok": soak.stats_ok,
        "stats_failed": soak.stats_failed,
        "rss_min": min(all_rss, default=0),
        "rss_max": max(all_rss, default=0),
        "incarnations": incarnations,
        "findings": dict(soak.findings),
        "tracebacks": tracebacks,
        "exit_status": status,
        "failures": failures,
    }
    return result


def print_summary(result: dict[str, Any]) -> None:
    print(f"soak: seed {result['seed']}, {result['minutes']} min, {result['kills']} kills")
    for name, led in result["ledgers"].items():
        print(f"  {name}: " + ", ".join(f"{k} {v}" for k, v in led.items()))
    print(
        f"  redelivered by the broker (duplicates of messages sent once): {result['redelivered']}"
    )
    print(f"  reconnects {result['reconnects']}")
    print(f"  /stats.json ok {result['stats_ok']}, failed {result['stats_failed']}")
    print(f"  RSS {result['rss_min'] // MiB}..{result['rss_max'] // MiB} MiB over the run")
    for i, inc in enumerate(result["incarnations"]):
        print(
            f"  incarnation {i + 1}: RSS {inc['warm_rss'] // MiB} -> {inc['last_rss'] // MiB} MiB"
            f" {'flat' if inc['flat'] else 'NOT FLAT'}"
        )
    print(f"  findings {result['findings']}")
    print(f"  drained in {result['drain_seconds']} s, broker exit {result['exit_status']}")
    print_verdict("soak", result["failures"])


def parser() -> argparse.ArgumentParser:
    p = run_parser("soak", __doc__)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--rate", type=float, default=200.0, help="messages/s per fq publisher")
    p.add_argument("--batch", type=int, default=50, help="messages per confirm")
    p.add_argument("--kill-min", type=float, default=120.0, help="seconds between kills, min")
    p.add_argument("--kill-max", type=float, default=240.0, help="seconds between kills, max")
    p.add_argument("--drain-seconds", type=float, default=300.0)
    add_run_options(p, "soak")
    return p


def main(argv: list[str] | None = None) -> int:
    return run_main(parser(), run, print_summary, argv)


if __name__ == "__main__":
    sys.exit(main())
