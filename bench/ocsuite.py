"""The OpenCluster rows of the suite: pipelined set then get of 100-byte values, beside Redis.

Both sides get redis-benchmark's load (``-c 50 -P 16``): fqbroker's listener driven by
bench/ocload.py, Redis without persistence and with the promise of ours (``appendfsync
always`` and ``everysec``); docs/bench.md, "OpenCluster rows", says what each row counts.
"""

from __future__ import annotations

import csv
import os
import random
import shutil
import subprocess
from pathlib import Path

from .harness import Client, FqBroker, Redis, System, cpu_seconds

CONNS = 50
DEPTH = 16
SIZE = 100
COUNT = 600_000  # per phase, at scale 1
PROCS = 2
OPS = ("set", "get")


def _count(scale: float) -> int:
    return max(CONNS * DEPTH, int(COUNT * scale))


def generator_run(system: System, count: int) -> dict[str, float]:
    """bench/ocload.py against ``system``: SET then GET, ops/s and server us per op."""
    tag = random.getrandbits(48)  # this run's keys
    port = {"oc_port": system.oc_port} if isinstance(system, FqBroker) else {}
    clients = [
        Client(
            "ocload", system, module="bench.ocload", conns=CONNS // PROCS, depth=DEPTH,
            count=count // PROCS, size=SIZE, tag=tag, slot=j, **port,
        )
        for j in range(PROCS)
    ]  # fmt: skip
    out: dict[str, float] = {"bad": 0}
    try:
        for c in clients:
            c.ready()
        for op in OPS:
            cpu0 = cpu_seconds(system.pid)
            for c in clients:
                c.go()
            got = [c.collect() for c in clients]
            cpu1 = cpu_seconds(system.pid)
            ops = sum(r["ops"] for r in got)
            seconds = (max(r["end_ns"] for r in got) - min(r["start_ns"] for r in got)) / 1e9
            out[op] = ops / max(1e-9, seconds)
            out[f"{op}_us"] = (cpu1 - cpu0) * 1e6 / max(1, ops)
            for r in got:
                if r["bad"]:
                    out["bad"] += 1
                    print(f"  ! opencluster {op} on {system.name}: {r['error']}", flush=True)
    finally:
        for c in clients:
            c.go()
            c.finish()
    return out


def redis_benchmark(system: Redis, test: str, count: int) -> tuple[float, float]:
    """redis-benchmark's requests/s for ``test`` ("set" or "get"), and the server's us each."""
    command = [
        "redis-benchmark", "-h", "127.0.0.1", "-p", str(system.port), "-c", str(CONNS),
        "-P", str(DEPTH), "-d", str(SIZE), "-t", test, "-n", str(count), "-q", "--csv",
    ]  # fmt: skip
    cpu0 = cpu_seconds(system.pid)
    out = subprocess.run(command, capture_output=True, text=True, timeout=600, check=True)
    cpu1 = cpu_seconds(system.pid)
    rows = [row for row in csv.reader(out.stdout.splitlines()) if row and row[0] != "test"]
    if len(rows) != 1 or rows[0][0] != test.upper():
        raise RuntimeError(f"redis-benchmark said: {out.stdout!r} {out.stderr!r}")
    return float(rows[0][1]), (cpu1 - cpu0) * 1e6 / count


def redis_available() -> str | None:
    why = Redis().available()
    if why is None and shutil.which("redis-benchmark") is None:
        return "skipped: redis-benchmark not installed (Debian's redis-tools)"
    return why


def oc_run(system: System, run: int, scale: float) -> dict[str, float]:
    """One run on ``system``: ours through bench/ocload.py, Redis through redis-benchmark
    (and bench/ocload.py, as ``gen_set`` and ``gen_get``)."""
    count = _count(scale)
    # What the system before wrote and did not sync (a sync=normal journal, an everysec
    # AOF: tens of MB) is written back by the kernel meanwhile, and every fdatasync of
    # this run would wait behind it: each system starts on a clean page cache.
    os.sync()
    if not isinstance(system, Redis):
        return generator_run(system, count)
    result: dict[str, float] = {}
    if system.appendfsync is not None:
        result["set"], result["set_us"] = redis_benchmark(system, "set", count)
        return result
    for op in OPS:
        result[op], result[f"{op}_us"] = redis_benchmark(system, op, count)
    ours = generator_run(system, count)
    result.update(gen_set=ours["set"], gen_get=ours["get"], bad=ours["bad"])
    return result


OC_NORMAL = "fqbroker, sync=normal"
BEFORE = "before"  # suite.BASELINE: the table's column of the baseline tree
BEFORE_NORMAL = "before, sync=normal"


def oc_systems(with_redis: bool, baseline: Path | None = None) -> list[System]:
    """A broker whose store fsyncs each group commit (the default), one with ``sync =
    "normal"``, the same two of the ``baseline`` tree (``--baseline``: the column
    "before"), and Redis when it is a peer of the table and redis-benchmark is here."""
    systems: list[System] = [
        FqBroker(opencluster="full"),
        FqBroker(opencluster="normal", name=OC_NORMAL),
    ]
    if baseline is not None:
        systems += [
            FqBroker(opencluster="full", tree=baseline, name=BEFORE),
            FqBroker(opencluster="normal", tree=baseline, name=BEFORE_NORMAL),
        ]
    if with_redis and redis_available() is None:
        systems += [Redis(), Redis(appendfsync="always"), Redis(appendfsync="everysec")]
    return systems


Figures = dict[str, dict[str, float]]


def oc_rows(res: Figures) -> list[tuple[str, Figures, str]]:
    """(label, {"fqbroker": ..., "redis": ...} in the table's terms, target) per row."""
    redis = res.get("redis")
    shape = f"{CONNS} conns x pipeline {DEPTH}, {SIZE} B"
    rows = []
    for name, before, ops, sync in (
        ("fqbroker", BEFORE, OPS, "full"),
        (OC_NORMAL, BEFORE_NORMAL, ("set",), "normal"),
    ):
        for op in ops:
            row = {"fqbroker": {"rate": res[name][op], "us": res[name][f"{op}_us"]}}
            if before in res:
                row[BEFORE] = {"rate": res[before][op], "us": res[before][f"{op}_us"]}
            if redis is not None:
                row["redis"] = {"rate": redis[op], "us": redis[f"{op}_us"]}
            label = f"OpenCluster {op.upper()}, {shape}" + (f", sync={sync}" if op == "set" else "")
            rows.append((label, row, ">=0.33x Redis" if sync == "full" else ""))
    return rows


def _k(rate: float) -> str:
    return f"{rate / 1000:,.0f}k"


def oc_promise_notes(res: Figures) -> list[list[str]]:
    """Rows: Redis with the promise of ours, each beside our SET of that promise."""
    rows = []
    for fsync, ours, promise in (
        ("always", "fqbroker", "sync=full: an ack fsynced"),
        ("everysec", OC_NORMAL, "sync=normal: an ack survives kill -9"),
    ):
        redis = res.get(f"redis, appendfsync {fsync}")
        if redis is None:
            continue
        ratio = res[ours]["set"] / redis["set"]
        rows.append([
            f"  Redis SET with the promise of {promise} (appendfsync {fsync})",
            _k(redis["set"]), f"{redis['set_us']:.2f}", f"ours {ratio:.2f}x of it",
        ])  # fmt: skip
    return rows


def oc_generator_note(redis: dict[str, float]) -> list[str]:
    """A row: what bench/ocload.py drives against Redis, beside redis-benchmark."""
    return [
        "  the same load (bench/ocload.py) against Redis",
        "",
        "",
        f"{_k(redis['gen_set'])} SET/s, {_k(redis['gen_get'])} GET/s (redis-benchmark:"
        f" {_k(redis['set'])}, {_k(redis['get'])}): what the generator can drive",
    ]
