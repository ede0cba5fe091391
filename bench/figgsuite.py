"""The Figg rows of the suite: publish with acknowledgements, replay, live fan-out.

Each run drives a broker with a Figg listener through bench/figgload.py processes;
docs/bench.md, "Figg rows", says what each row counts.
"""

from __future__ import annotations

from .harness import Client, FqBroker, System, cpu_seconds, finish_all

SIZE = 100
PUBLISH_COUNT = 300_000
REPLAY_COUNT = 1_000_000
FANOUT_SUBS = 8
FANOUT_COUNT = 50_000


def _count(base: int, scale: float) -> int:
    return max(200, int(base * scale))


def _publish(broker: FqBroker, topic: str, count: int, pubs: int = 1) -> dict[str, float]:
    """``pubs`` connections publish ``count`` messages each to ``topic``, all at once: the
    earliest start and the latest end."""
    started: list[Client] = []
    failed = True
    try:
        for _ in range(pubs):
            started.append(_publisher(broker, topic, count))
        for pub in started:
            pub.ready()
        for pub in started:
            pub.go()
        results = [pub.collect() for pub in started]
        failed = False
    finally:
        finish_all(started, failed=failed)
    return {
        "start_ns": min(r["start_ns"] for r in results),
        "end_ns": max(r["end_ns"] for r in results),
    }


def _publisher(broker: FqBroker, topic: str, count: int) -> Client:
    return Client(
        "figgpub", broker, module="bench.figgload", figg_port=broker.figg_port, topic=topic,
        count=count, size=SIZE,
    )  # fmt: skip


def _subscriber(broker: FqBroker, topic: str, count: int, offset: int | None = None) -> Client:
    options = {} if offset is None else {"offset": offset}
    return Client(
        "figgsub", broker, module="bench.figgload", figg_port=broker.figg_port, topic=topic,
        count=count, **options,
    )  # fmt: skip


def publish_run(broker: System, run: int, scale: float, pubs: int = 1) -> dict[str, float]:
    assert isinstance(broker, FqBroker) and broker.figg
    count = _count(PUBLISH_COUNT // pubs, scale)
    cpu0 = cpu_seconds(broker.pid)
    res = _publish(broker, f"pub-{run}", count, pubs)
    cpu1 = cpu_seconds(broker.pid)
    return {
        "rate": count * pubs / ((res["end_ns"] - res["start_ns"]) / 1e9),
        "us": (cpu1 - cpu0) * 1e6 / (count * pubs),
    }


def publish_run_4(broker: System, run: int, scale: float) -> dict[str, float]:
    """Four connections: each has its own window, so four fsync waits overlap."""
    return publish_run(broker, run, scale, pubs=4)


def replay_run(broker: System, run: int, scale: float) -> dict[str, float]:
    assert isinstance(broker, FqBroker) and broker.figg
    count = _count(REPLAY_COUNT, scale)
    if run == 0:
        _publish(broker, "replay", count)  # the broker lives through every run
    return timed_replay(broker, _subscriber(broker, "replay", count, offset=0), count, "figg")


def timed_replay(system: System, sub: Client, count: int, name: str) -> dict[str, float]:
    """A replay by ``sub``, timed from its ``go`` (it starts reading then) to its last
    message: msg/s, and the server's CPU a message over that time."""
    failed = True
    try:
        sub.ready()
        cpu0 = cpu_seconds(system.pid)
        sub.go()
        got = sub.collect()
        cpu1 = cpu_seconds(system.pid)
        failed = False
    finally:
        finish_all([sub], failed=failed)
    if got["received"] != count or not got["whole"]:
        print(f"  ! {name} replay: {got['received']} of {count}, whole={got['whole']}", flush=True)
    return {
        "rate": got["received"] / ((got["last_ns"] - got["start_ns"]) / 1e9),
        "us": (cpu1 - cpu0) * 1e6 / max(1, got["received"]),
    }


def fanout_run(broker: System, run: int, scale: float) -> dict[str, float]:
    assert isinstance(broker, FqBroker) and broker.figg
    count = _count(FANOUT_COUNT, scale)
    topic = f"fan-{run}"
    subs = [_subscriber(broker, topic, count) for _ in range(FANOUT_SUBS)]
    pub: Client | None = None
    failed = True
    try:
        for sub in subs:
            sub.ready()
        pub = _publisher(broker, topic, count)
        pub.ready()
        for sub in subs:
            sub.go()  # they read from here on; the publisher starts the clock
        cpu0 = cpu_seconds(broker.pid)
        pub.go()
        got = [sub.collect() for sub in subs]
        cpu1 = cpu_seconds(broker.pid)
        sent = pub.collect()
        failed = False
    finally:
        finish_all(subs + ([pub] if pub else []), failed=failed)
    delivered = sum(g["received"] for g in got)
    if delivered != count * FANOUT_SUBS or not all(g["whole"] for g in got):
        print(f"  ! figg fan-out: {delivered} of {count * FANOUT_SUBS} delivered", flush=True)
    last = max(g["last_ns"] for g in got)
    return {
        "rate": delivered / ((last - sent["start_ns"]) / 1e9),
        "us": (cpu1 - cpu0) * 1e6 / max(1, delivered),
    }
