"""``make fuzz``: generated and mutated frames through every front end of one broker.

``python -m bench.fuzz [--frames 1000000] [--seed N] [--workers 8] [--check-every 10000]
[--setting KEY=VALUE] [--fqd-arg ARG] [--json FILE]``

Concurrent workers open sessions on the front ends of bench/frontends.py's table, each
with a seed of its own, while each front end's round trip must keep succeeding and the
broker's log, RSS and descriptors are watched; findings are replayed by seed after the
run. docs/reliability.md, "make fuzz", has the checks.
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
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fqbroker.settings.broker import Settings

from .child import (
    Broker,
    Sample,
    add_run_options,
    broker_from,
    count_tracebacks,
    fd_kinds,
    http_reply,
    print_verdict,
    run_main,
    run_parser,
    tcp_sockets,
)
from .frontends import FRONT_ENDS, NOTES, Conn, FrontEnd, Target
from .harness import rss_bytes

MiB = 1 << 20
# What the broker's own working set (code, sockets, caches) may add to its memory budget.
RSS_OVER_BUDGET = 256 * MiB
SESSION_FRAMES = (1, 5, 20, 100, 300, 1000)
MUTATION_RATES = (0.0, 0.002, 0.01, 0.05, 0.3)
OPENING_MUTATION = 0.08
CHUNK = 32
SUSPECT_WINDOW = 3.0
MAX_REPLAYS = 300
EOF_SECONDS = 5.0


@dataclass
class Finding:
    signature: str
    count: int = 0
    first_at: float = 0.0
    suspects: list[tuple[str, int]] = field(default_factory=list)  # (front end, seed)
    reproduced: dict[str, Any] | None = None


@dataclass
class Fuzz:
    broker: Broker
    target: Target
    frames_wanted: int
    check_every: int
    seed: int
    rng: random.Random
    front_ends: list[FrontEnd]
    frames: int = 0
    mutated: int = 0
    by_front_end: Counter[str] = field(default_factory=Counter)
    sessions: Counter[str] = field(default_factory=Counter)
    closed_by_broker: Counter[str] = field(default_factory=Counter)
    open_failed: Counter[str] = field(default_factory=Counter)
    undrained: Counter[str] = field(default_factory=Counter)
    undrained_seeds: list[tuple[str, int]] = field(default_factory=list)
    round_trips: Counter[str] = field(default_factory=Counter)
    round_trip_failures: list[str] = field(default_factory=list)
    checks: int = 0
    samples: list[tuple[int, Sample]] = field(default_factory=list)
    rss_peak: int = 0  # the broker's VmHWM at the end: a peak between samples counts too
    deaths: list[int | None] = field(default_factory=list)
    findings: dict[str, Finding] = field(default_factory=dict)
    recent: deque[tuple[float, str, int]] = field(default_factory=lambda: deque(maxlen=5000))
    active: dict[int, tuple[str, int]] = field(default_factory=dict)
    next_check: int = 0
    pending_checks: int = 0
    check_due: asyncio.Event = field(default_factory=asyncio.Event)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    log_seen: int = 0
    fd_change: dict[str, int] = field(default_factory=dict)
    sockets_left: list[str] = field(default_factory=list)
    queues_left: dict[str, Any] = field(default_factory=dict)
    ports: dict[int, tuple[str, int]] = field(default_factory=dict)  # local port: session
    t0: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.next_check = self.check_every
        self.gate.set()

    # --- sessions -------------------------------------------------------------------------

    def counted(self, fe: FrontEnd, n: int) -> None:
        self.frames += n
        self.by_front_end[fe.name] += n
        while self.frames >= self.next_check:
            self.next_check += self.check_every
            self.pending_checks += 1
            self.check_due.set()
            if self.pending_checks > 1:
                self.gate.clear()

    async def session(self, fe: FrontEnd, seed: int, count: bool = True) -> Conn | None:
        """One session, every choice from ``seed``; with ``count`` False, a quiet replay."""
        rng = random.Random(seed)
        mutate_opening = rng.random() < OPENING_MUTATION
        try:
            conn = await fe.open(self.target, rng, mutate_opening)
        except (ConnectionError, OSError, TimeoutError, EOFError):
            if count:
                self.open_failed[fe.name] += 1
            return None
        try:
            n = rng.choice(SESSION_FRAMES)
            rate = rng.choice(MUTATION_RATES)
            chunk: list[bytes] = []
            bad = 0
            for i in range(n):
                frame = fe.frame(rng)
                if rng.random() < rate:
                    frame = fe.mutate(rng, frame)
                    bad += 1
                chunk.append(frame)
                if bad or len(chunk) >= CHUNK or i == n - 1:
                    if count and not self.gate.is_set():
                        await self.gate.wait()
                    if not await conn.send_frames(chunk):
                        if count:
                            self.closed_by_broker[fe.name] += 1
                        break
                    if count:
                        self.counted(fe, len(chunk))
                        self.mutated += bad
                    chunk, bad = [], 0
            else:
                if conn.closed_by_peer and count:
                    self.closed_by_broker[fe.name] += 1
        finally:
            if count:
                self.ports[conn.local_port] = (fe.name, seed)
                for held in conn.holds:
                    self.ports[held.local_port] = (fe.name + " (its command socket)", seed)
            # Half-close and wait for the broker's end: then it has read every frame sent
            # (or closed the session on one of them), and no byte is lost to a reset.
            await conn.close(wait_eof=EOF_SECONDS)
            if count and not conn.datagrams and not conn.closed_by_peer:
                self.undrained[fe.name] += 1
                if len(self.undrained_seeds) < 10:
                    self.undrained_seeds.append((fe.name, seed))
        return conn

    async def worker(self, wid: int, deadline: float) -> None:
        weights = [fe.weight for fe in self.front_ends]
        while self.frames < self.frames_wanted and time.monotonic() < deadline:
            fe = self.rng.choices(self.front_ends, weights)[0]
            seed = self.rng.getrandbits(63)
            self.active[wid] = (fe.name, seed)
            self.sessions[fe.name] += 1
            await self.session(fe, seed)
            del self.active[wid]
            self.recent.append((time.monotonic(), fe.name, seed))

    # --- checks ---------------------------------------------------------------------------

    async def round_trip_all(self) -> None:
        async def one(fe: FrontEnd) -> None:
            try:
                async with asyncio.timeout(20):
                    await fe.round_trip(self.target)
                self.round_trips[fe.name] += 1
            except Exception as exc:  # every failure is a finding, whatever it is
                self.round_trip_failures.append(
                    f"{fe.name} at {self.frames} frames: {type(exc).__name__}: {exc}"
                )

        await asyncio.gather(*(one(fe) for fe in self.front_ends))

    def sample(self) -> None:
        with contextlib.suppress(OSError, AssertionError, RuntimeError):
            self.samples.append((self.frames, self.broker.sample(self.t0)))

    async def ensure_alive(self) -> None:
        if not self.broker.alive():
            assert self.broker.proc is not None
            self.deaths.append(self.broker.proc.returncode)
            await asyncio.to_thread(self.broker.start)

    async def checker(self) -> None:
        while True:
            await self.check_due.wait()
            self.check_due.clear()
            while self.pending_checks:
                await self.ensure_alive()
                await self.round_trip_all()
                self.sample()
                self.checks += 1
                self.pending_checks -= 1
                if self.pending_checks <= 1:
                    self.gate.set()
            if self.done.is_set():
                return

    def scan_log(self) -> None:
        text = self.broker.log_text()
        fresh = text[self.log_seen :]
        # Only whole tracebacks: stop at the last line break.
        cut = fresh.rfind("\n") + 1
        self.log_seen += cut
        now = time.monotonic()
        for signature, n in count_tracebacks(fresh[:cut]).items():
            finding = self.findings.get(signature)
            if finding is None:
                finding = self.findings[signature] = Finding(signature, first_at=now - self.t0)
                suspects = list(self.active.values())
                suspects += [(name, seed) for t, name, seed in reversed(self.recent)
                             if t >= now - SUSPECT_WINDOW]  # fmt: skip
                finding.suspects = suspects[:MAX_REPLAYS]
            finding.count += n

    async def log_watcher(self) -> None:
        while not self.done.is_set():
            self.scan_log()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.done.wait(), 0.25)
        self.scan_log()

    # --- findings -------------------------------------------------------------------------

    async def reproduce(self, finding: Finding, out: Path) -> None:
        by_name = {fe.name: fe for fe in self.front_ends}
        for name, seed in finding.suspects:
            await self.ensure_alive()
            before = count_tracebacks(self.broker.log_text()).get(finding.signature, 0)
            conn = await self.session(by_name[name], seed, count=False)
            await asyncio.sleep(0.05)  # the broker logs as it closes the session
            after = count_tracebacks(self.broker.log_text()).get(finding.signature, 0)
            if after > before:
                sent = bytes(conn.sent) if conn is not None else b""
                path = out / f"{name}-{seed}.bin"
                await asyncio.to_thread(_write, path, sent)
                finding.reproduced = {
                    "front_end": name,
                    "seed": seed,
                    "bytes": len(sent),
                    "head_hex": sent[:64].hex(),
                    "tail_hex": sent[-128:].hex(),
                    "file": str(path),
                }
                return


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    NOTES.clear()
    print(f"fuzz: seed {seed}, {args.frames:,} frames, {args.workers} workers", flush=True)
    state = Path(args.state)
    shutil.rmtree(state, ignore_errors=True)
    broker = broker_from(args, state)
    await asyncio.to_thread(broker.start)
    target = await Target.of("127.0.0.1", broker.port)
    chosen = [fe for fe in FRONT_ENDS if not args.front_end or fe.name in args.front_end]
    fuzz = Fuzz(broker, target, args.frames, args.check_every, seed, random.Random(seed),
                chosen)  # fmt: skip
    try:
        await fuzz.round_trip_all()  # the broker's warm state: every front end used once
        fuzz.sample()
        fd_before = fuzz.samples[-1][1].fds
        kinds_before = fd_kinds(broker.pid)
        started = time.monotonic()
        deadline = started + args.max_seconds
        checker = asyncio.create_task(fuzz.checker())
        watcher = asyncio.create_task(fuzz.log_watcher())
        reporter = asyncio.create_task(_progress(fuzz))
        await asyncio.gather(*(fuzz.worker(w, deadline) for w in range(args.workers)))
        seconds = time.monotonic() - started
        fuzz.done.set()
        fuzz.pending_checks += 1  # a last round, after every session closed
        fuzz.check_due.set()
        await checker
        await watcher
        reporter.cancel()
        settled = await _settle(fuzz, fd_before, args.settle_seconds)
        kinds_after = fd_kinds(broker.pid)
        if settled.fds > fd_before:
            fuzz.queues_left = await _queues(target)
            for sock in tcp_sockets(broker.pid):
                session = fuzz.ports.get(int(sock.split()[2]))
                fuzz.sockets_left.append(f"{sock} {session or ''}")
        fuzz.fd_change = {
            k: kinds_after.get(k, 0) - kinds_before.get(k, 0)
            for k in sorted(set(kinds_before) | set(kinds_after))
            if kinds_after.get(k, 0) != kinds_before.get(k, 0)
        }
        for finding in list(fuzz.findings.values())[:4]:
            await fuzz.reproduce(finding, state.parent / "fuzz-findings")
        fuzz.scan_log()
        fuzz.rss_peak = rss_bytes(broker.pid, "VmHWM")
        return report(fuzz, args, seconds, fd_before, settled)
    finally:
        status = await asyncio.to_thread(broker.stop)
        if status not in (0, None):
            print(f"fuzz: the broker exited with {status} on SIGTERM", flush=True)


async def _queues(target: Target) -> dict[str, Any]:
    """The broker's queues from /stats.json, without their client lists."""
    reader, writer = await asyncio.open_connection(target.host, target.fq_port)
    try:
        writer.write(b"GET /stats.json HTTP/1.1\r\nHost: fz\r\n\r\n")
        _, body = await asyncio.wait_for(http_reply(reader), 20)
    finally:
        writer.close()
    queues = json.loads(body)["queues"]
    return {
        name: {**{k: v for k, v in q.items() if k != "clients"}, "clients": len(q["clients"])}
        for name, q in queues.items()
    }


async def _settle(fuzz: Fuzz, fd_before: int, seconds: float) -> Sample:
    """The broker's sample once it has closed every fuzzing session. A session the fuzzer
    half-closed in the middle of an HTTP body is held until the broker's idle timeout
    (``idle_sniff_timeout``, 30 s), so the wait is bounded by more than that."""
    for _ in range(int(seconds * 10)):
        fuzz.sample()
        if fuzz.samples[-1][1].fds <= fd_before:
            break
        await asyncio.sleep(0.1)
    return fuzz.samples[-1][1]


async def _progress(fuzz: Fuzz) -> None:
    while True:
        await asyncio.sleep(30)
        rate = fuzz.frames / max(1e-9, time.monotonic() - fuzz.t0)
        rss = fuzz.samples[-1][1].rss // MiB if fuzz.samples else 0
        print(
            f"fuzz: {fuzz.frames:,} frames ({rate:,.0f}/s), {sum(fuzz.sessions.values()):,}"
            f" sessions, {fuzz.checks} checks, rss {rss} MiB,"
            f" {sum(f.count for f in fuzz.findings.values())} tracebacks",
            flush=True,
        )


def report(
    fuzz: Fuzz, args: argparse.Namespace, seconds: float, fd_before: int, end: Sample
) -> dict[str, Any]:
    failures: list[str] = []
    warm_at = max(args.check_every, args.frames // 10)
    warm = next((s for n, s in fuzz.samples if n >= warm_at), fuzz.samples[0][1])
    rss_limit = max(warm.rss * 1.25, warm.rss + args.rss_slack_mib * MiB)
    if end.rss > rss_limit:
        failures.append(f"RSS not flat: {warm.rss // MiB} MiB at warm-up, {end.rss // MiB} at end")
    if end.fds > fd_before + 4:
        failures.append(f"descriptors not flat: {fd_before} before, {end.fds} after")
    # The broker holds at most its memory budget for publishers (docs/memory.md); a peak
    # past it by more than its own working set means something is held outside it.
    budget = int(dict(args.setting).get("memory_budget", Settings().memory_budget))
    rss_max = max(fuzz.rss_peak, *(s.rss for _, s in fuzz.samples))
    if budget and rss_max > budget + RSS_OVER_BUDGET:
        failures.append(f"RSS peaked at {rss_max // MiB} MiB, over the {budget // MiB} MiB budget")
    if fuzz.frames < args.frames:
        failures.append(f"only {fuzz.frames} of {args.frames} frames in {args.max_seconds} s")
    if fuzz.round_trip_failures:
        failures.append(f"{len(fuzz.round_trip_failures)} round trips failed")
    if fuzz.deaths:
        failures.append(f"the broker died {len(fuzz.deaths)} times: {fuzz.deaths}")
    if fuzz.findings:
        failures.append(f"{sum(f.count for f in fuzz.findings.values())} tracebacks logged")
    for note, n in NOTES.items():
        failures.append(f"{n} x {note}")
    expected = fuzz.frames // args.check_every
    if fuzz.checks < expected:
        failures.append(f"{fuzz.checks} rounds of round trips, {expected} expected")
    fds = [s.fds for _, s in fuzz.samples]
    return {
        "seed": fuzz.seed,
        "frames": fuzz.frames,
        "mutated": fuzz.mutated,
        "seconds": round(seconds, 1),
        "frames_per_second": round(fuzz.frames / max(seconds, 1e-9)),
        "by_front_end": dict(fuzz.by_front_end),
        "sessions": dict(fuzz.sessions),
        "closed_by_broker": dict(fuzz.closed_by_broker),
        "open_failed": dict(fuzz.open_failed),
        "undrained": dict(fuzz.undrained),
        "undrained_seeds": fuzz.undrained_seeds,
        "round_trip_rounds": fuzz.checks,
        "round_trips": dict(fuzz.round_trips),
        "round_trip_failures": fuzz.round_trip_failures[:20],
        "rss_warm": warm.rss,
        "rss_end": end.rss,
        "rss_max": max(fuzz.rss_peak, *(s.rss for _, s in fuzz.samples)),
        "fds_before": fd_before,
        "fds_max": max(fds),
        "fds_end": end.fds,
        "fd_change": fuzz.fd_change,
        "sockets_left": fuzz.sockets_left,
        "queues_left": fuzz.queues_left,
        "log_lines": fuzz.broker.log_text().count("\n"),
        "broker_deaths": fuzz.deaths,
        "notes": dict(NOTES),
        "findings": [
            {
                "signature": f.signature,
                "count": f.count,
                "first_at": round(f.first_at, 1),
                "reproduced": f.reproduced,
            }
            for f in fuzz.findings.values()
        ],
        "failures": failures,
    }


def print_summary(r: dict[str, Any]) -> None:
    sessions = sum(r["sessions"].values())
    print(
        f"fuzz: seed {r['seed']}: {r['frames']:,} frames ({r['mutated']:,} mutated) in"
        f" {r['seconds']} s, {r['frames_per_second']:,}/s, {sessions:,} sessions"
    )
    for name, frames in r["by_front_end"].items():
        print(
            f"  {name}: {frames:,} frames, {r['sessions'].get(name, 0):,} sessions,"
            f" {r['closed_by_broker'].get(name, 0):,} closed by the broker,"
            f" {r['open_failed'].get(name, 0):,} refused at opening,"
            f" {r['undrained'].get(name, 0):,} not closed by the broker after EOF,"
            f" {r['round_trips'].get(name, 0)} round trips"
        )
    print(f"  {r['round_trip_rounds']} rounds of round trips, failures: {r['round_trip_failures']}")
    print(
        f"  RSS {r['rss_warm'] // MiB} MiB after warm-up, {r['rss_end'] // MiB} at end,"
        f" {r['rss_max'] // MiB} max; fds {r['fds_before']} before, {r['fds_max']} max,"
        f" {r['fds_end']} at end; {r['log_lines']:,} log lines"
    )
    if r["fd_change"]:
        print(f"  descriptors gained or lost: {r['fd_change']}")
    if r["sockets_left"]:
        print(f"  the broker's TCP sockets after settling: {r['sockets_left']}")
        print(f"  its queues then: {r['queues_left']}")
    for note, n in r["notes"].items():
        print(f"  finding: {n} x {note}")
    for f in r["findings"]:
        print(f"  finding: {f['count']} x {f['signature']} (first at {f['first_at']} s)")
        if f["reproduced"]:
            rep = f["reproduced"]
            print(f"    reproduced by {rep['front_end']} seed {rep['seed']}: {rep['file']}")
            print(f"    head {rep['head_hex']}")
            print(f"    tail {rep['tail_hex']}")
        else:
            print("    not reproduced by replaying the sessions around it")
    print_verdict("fuzz", r["failures"])


def parser() -> argparse.ArgumentParser:
    p = run_parser("fuzz", __doc__)
    p.add_argument("--frames", type=int, default=1_000_000)
    p.add_argument("--seed", type=int)
    names = [fe.name for fe in FRONT_ENDS]
    p.add_argument("--front-end", action="append", choices=names, help="only these (repeat)")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--check-every", type=int, default=10_000)
    p.add_argument("--max-seconds", type=float, default=3600.0)
    p.add_argument("--settle-seconds", type=float, default=45.0)
    p.add_argument(
        "--rss-slack-mib",
        type=int,
        default=32,
        help="RSS may grow this much (or 25%%) after warm-up before it counts as not flat",
    )
    add_run_options(p, "fuzz")
    return p


def main(argv: list[str] | None = None) -> int:
    return run_main(parser(), run, print_summary, argv)


if __name__ == "__main__":
    sys.exit(main())
