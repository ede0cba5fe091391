"""The memory rows of the table: RSS per queued message, and RSS with many idle connections.

Both read the broker's VmRSS from /proc. The idle row also says how much of it is
anonymous memory (the heap: objects, buffers) and how much file pages (the interpreter's
and the shared libraries' code, counted in RSS once touched though other processes share
them), which is what bounds it.
"""

from __future__ import annotations

import json
import time
import urllib.request

from .harness import Client, FqBroker, System, cpu_seconds, finish_all, rss_bytes

# The targets: at most 150 B per queued 100-byte message; 10,000 idle connections (the
# 5,000 clients of the row, each a command and a data connection) under 40 MB.
MEMORY_TARGET = "<=150 B/msg"
IDLE_TARGET = "<40 MB, heartbeats on time"

Row = list[str]


def _backlog(port: int, queue: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats.json", timeout=10) as reply:
        stats = json.load(reply)
    return int(stats["queues"].get(queue, {}).get("backlog", 0))


def _labelled(label: str, broker: System) -> str:
    return label if broker.name == "fqbroker" else f"{label} ({broker.name})"


def memory_row(broker: FqBroker, n: int) -> Row:
    """RSS growth per message with a backlog of ``n`` 100-byte messages."""
    clients: list[Client] = []
    failed = True
    try:
        broker.start()
        clients.append(hold := Client("hold", broker, topic="m", backlog=2 * n))
        hold.ready()
        time.sleep(0.3)
        before = rss_bytes(broker.pid)
        clients.insert(0, pub := Client("pub", broker, topic="m", count=n, size=100))
        pub.ready()
        pub.go()
        pub.collect()
        deadline = time.monotonic() + 120
        while _backlog(broker.port, "hold") < n and time.monotonic() < deadline:
            time.sleep(0.2)
        after = rss_bytes(broker.pid)
        failed = False
    finally:
        finish_all(clients, failed=failed)
        broker.stop()
    per = (after - before) / n
    return [
        _labelled(f"memory, {n:,} queued 100 B msgs", broker),
        f"{per:.0f} B/msg",
        "",
        f"RSS {before / 2**20:.0f} -> {after / 2**20:.0f} MiB",
    ]


def _ms(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:.0f}"


def idle_row(broker: FqBroker, clients: int, seconds: float) -> Row:
    """``clients`` fq clients connected and answering heartbeats for ``seconds``."""
    idle: Client | None = None
    failed = True
    try:
        broker.start()
        base = rss_bytes(broker.pid)
        base_anon = rss_bytes(broker.pid, "RssAnon")
        idle = Client("idle", broker, clients=clients, hb_ms=1000, seconds=seconds)
        idle.ready()
        loaded = rss_bytes(broker.pid)
        c0 = cpu_seconds(broker.pid)
        idle.go()
        res = idle.collect()
        cpu = cpu_seconds(broker.pid) - c0
        loaded = max(loaded, rss_bytes(broker.pid))
        anon = rss_bytes(broker.pid, "RssAnon")
        file = rss_bytes(broker.pid, "RssFile")
        failed = False
    finally:
        finish_all([idle] if idle else [], failed=failed)
        broker.stop()
    late = res["max_late_ns"]
    return [
        _labelled(f"idle: {res['connections']:,} connections, heartbeat 1 s", broker),
        f"RSS {loaded / 2**20:.1f} MiB",
        "",
        f"(empty {base / 2**20:.1f} MiB; {(loaded - base) / res['connections'] / 1024:.1f}"
        f" KiB/conn; anonymous {anon / 2**20:.1f} MiB (empty {base_anon / 2**20:.1f}),"
        f" file pages {file / 2**20:.1f} MiB; CPU {cpu / seconds * 100:.0f}%;"
        f" heartbeat gaps over 1 s: p50 {_ms(res['p50_late_ns'])},"
        f" p99 {_ms(res['p99_late_ns'])}, max {_ms(late)} ms; closed {res['closed']})",
    ]
