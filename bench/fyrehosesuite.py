"""The fyrehose rows of the suite: PUSH to DELIVER for 4 subscribers, without and with loss.

Each run drives a broker with a fyrehose listener through bench/fyrehoseload.py processes:
4 subscribers, one publisher never more than 256 ahead of the slowest. With loss, each
subscriber drops datagrams both ways and REQUESTs its gaps (docs/bench.md, "fyrehose rows").
"""

from __future__ import annotations

import os
import random

from .harness import Client, FqBroker, System, cpu_seconds, credit_file, finish_all

SUBS = 4
SIZE = 100
COUNT = 200_000
LOSSY_COUNT = 100_000
LOSS = 0.05
WINDOW = 64  # PUSHes ahead of the slowest subscriber: what the broker's receive buffer holds


def _count(base: int, scale: float) -> int:
    return max(200, int(base * scale))


def _client(role: str, broker: FqBroker, **options: object) -> Client:
    return Client(role, broker, module="bench.fyrehoseload", fh_port=broker.fh_port, **options)


def fyrehose_run(broker: System, run: int, scale: float, loss: float = 0.0) -> dict[str, float]:
    """One run: 4 subscribers (with ``loss``, each behind its lossy link), one publisher."""
    assert isinstance(broker, FqBroker) and broker.fyrehose
    count = _count(LOSSY_COUNT if loss else COUNT, scale)
    tag = random.getrandbits(62)  # this run's messages, told from every other run's
    credit = credit_file()
    common: dict[str, object] = {"count": count, "tag": tag, "credit": credit}
    subs = [
        _client("fhsub", broker, slot=j, loss=loss, seed=run * SUBS + j, **common)
        for j in range(SUBS)
    ]
    pub: Client | None = None
    failed = True
    try:
        for sub in subs:
            sub.ready()
        pub = _client("fhpub", broker, size=SIZE, subs=SUBS, window=WINDOW, **common)
        pub.ready()
        for sub in subs:
            sub.go()
        cpu0 = cpu_seconds(broker.pid)
        pub.go()
        got = [sub.collect() for sub in subs]
        cpu1 = cpu_seconds(broker.pid)
        sent = pub.collect()
        failed = False
    finally:
        finish_all(subs + ([pub] if pub else []), failed=failed)
        os.unlink(credit)
    delivered = sum(g["received"] for g in got)
    expected = count * SUBS
    last = max(g["last_ns"] for g in got)
    result = {
        "rate": delivered / max(1e-9, (last - sent["start_ns"]) / 1e9),
        "us": (cpu1 - cpu0) * 1e6 / max(1, delivered),
        "lost": expected - delivered,
        "expected": expected,
        "shifted": sum(g["shifted"] for g in got),
    }
    if loss:
        missing = sum(g["missing"] for g in got)
        fills = sorted(us for g in got for us in g["fill_us"])
        result.update(
            missing=missing,
            recovered=sum(g["recovered"] for g in got),
            share=sum(g["recovered"] for g in got) / missing if missing else 1.0,
            p50_ms=fills[len(fills) // 2] / 1000 if fills else 0.0,
            p99_ms=fills[min(len(fills) - 1, len(fills) * 99 // 100)] / 1000 if fills else 0.0,
            requests=sum(g["requests"] for g in got),
        )
    if result["lost"] or result["shifted"]:
        what = "recovered" if loss else "delivered"
        print(
            f"  ! fyrehose{' lossy' if loss else ''}: {delivered} of {expected} {what},"
            f" {result['shifted']} sequences shifted",
            flush=True,
        )
    return result


def lossy_run(broker: System, run: int, scale: float) -> dict[str, float]:
    return fyrehose_run(broker, run, scale, LOSS)
