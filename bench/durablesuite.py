"""The durable rows: confirmed publishes beside RabbitMQ and JetStream, each at its promise.

A publisher keeps ``WINDOW`` messages unconfirmed and a consumer drains the queue while it
runs: fqbroker's disk queue with publisher confirms (bench/fqdurable.py), RabbitMQ's classic
durable queue and quorum queue with persistent messages and publisher confirms
(bench/rabbit.py, bench/amqpload.py), and a JetStream file stream with acknowledged
publishes (bench/jetstream.py, bench/jsload.py). The Figg rows get JetStream beside them
here too: acknowledged publishes with Figg's window, and a replay of the whole stream.
docs/bench.md, "Durable rows", says what each counts and what each peer promises.
"""

from __future__ import annotations

from typing import Any

from .figgsuite import PUBLISH_COUNT, REPLAY_COUNT, timed_replay
from .harness import Client, FqBroker, System, cpu_seconds, finish_all
from .jetstream import JetStream
from .rabbit import RabbitMQ

COUNT = 300_000
SIZE = 100
WINDOW = 1000
FIGG_WINDOW = 256  # the Figg client's, bench/figgload.py
FSYNC = "always"  # fqbroker's disk queue fsyncs every batch before its confirm


def durable_peers() -> tuple[list[System], list[list[str]]]:
    """The durable peers that can run here, and rows for those that cannot."""
    systems: list[System] = []
    notes: list[list[str]] = []
    for peer in (RabbitMQ("classic"), RabbitMQ("quorum"), JetStream()):
        why = peer.available()
        if why is None:
            systems.append(peer)
        else:
            notes.append([f"  {peer.name}", why])
    return systems, notes


def _names(system: System, run: int) -> dict[str, Any]:
    """Where run ``run`` publishes on ``system``, in its generator's options."""
    name = f"d{run}"
    if isinstance(system, FqBroker):
        return {"module": "bench.fqdurable", "topic": name}
    if isinstance(system, RabbitMQ):
        return {"module": system.loadgen, "queue": name, "queue_type": system.queue_type}
    assert isinstance(system, JetStream)
    return {"module": system.loadgen, "stream": name}


def durable_run(system: System, run: int, scale: float) -> dict[str, float]:
    """One run: a consumer draining while a publisher keeps WINDOW unconfirmed; msg/s is
    messages over the time from the first publish to the later of the last confirm and
    the last receipt."""
    count = max(WINDOW, int(COUNT * scale))
    names = _names(system, run)
    sub = Client("sub", system, count=count, size=SIZE, **names)
    pub: Client | None = None
    failed = True
    try:
        sub.ready()
        pub = Client("pub", system, count=count, size=SIZE, window=WINDOW, **names)
        pub.ready()
        cpu0 = cpu_seconds(system.pid)
        sub.go()
        pub.go()
        got = sub.collect()
        sent = pub.collect()
        cpu1 = cpu_seconds(system.pid)
        failed = False
    finally:
        finish_all([sub] + ([pub] if pub else []), failed=failed)
    if got["received"] != count or not got["whole"] or sent["confirmed"] != count:
        print(
            f"  ! {system.name}: {sent['confirmed']} confirmed, {got['received']} of {count}"
            f" received, whole={got['whole']}",
            flush=True,
        )
    end = max(got["last_ns"], sent["end_ns"])
    return {
        "rate": count / ((end - sent["start_ns"]) / 1e9),
        "us": (cpu1 - cpu0) * 1e6 / count,
    }


def js_publish_run(system: System, run: int, scale: float) -> dict[str, float]:
    """JetStream beside "Figg publish": acknowledged publishes with Figg's window, alone."""
    assert isinstance(system, JetStream)
    count = max(FIGG_WINDOW, int(PUBLISH_COUNT * scale))
    cpu0 = cpu_seconds(system.pid)
    sent = _js_publish(system, f"pub-{run}", count, FIGG_WINDOW)
    cpu1 = cpu_seconds(system.pid)
    return {
        "rate": count / ((sent["end_ns"] - sent["start_ns"]) / 1e9),
        "us": (cpu1 - cpu0) * 1e6 / count,
    }


def js_replay_run(system: System, run: int, scale: float) -> dict[str, float]:
    """JetStream beside "Figg replay": a stream filled once, read whole from the start by
    a consumer made at ``go``; msg/s is messages over the time from then to the last."""
    assert isinstance(system, JetStream)
    count = max(200, int(REPLAY_COUNT * scale))
    if run == 0:
        _js_publish(system, "replay", count, WINDOW)  # the server lives through every run
    sub = Client("sub", system, module=system.loadgen, stream="replay", count=count, replay=True)
    return timed_replay(system, sub, count, "jetstream")


def _js_publish(system: JetStream, stream: str, count: int, window: int) -> dict[str, Any]:
    pub = Client(
        "pub", system, module=system.loadgen, stream=stream, count=count, size=SIZE,
        window=window,
    )  # fmt: skip
    failed = True
    try:
        pub.ready()
        pub.go()
        sent = pub.collect()
        failed = False
    finally:
        finish_all([pub], failed=failed)
    return sent


def rate_text(rate: float) -> str:
    """A rate as the table prints it: thousands as "k" from 10,000 on."""
    return f"{rate / 1000:,.0f}k" if rate >= 10_000 else f"{rate:,.0f}"


def peer_row(label: str, ours: dict[str, float], theirs: dict[str, float], note: str) -> list[str]:
    """A row under one of ours: a peer's figures and ours as a ratio of them."""
    ratio = ours["rate"] / theirs["rate"]
    return [
        f"  {label}",
        rate_text(theirs["rate"]),
        f"{theirs['us']:.2f}",
        f"ours {ratio:.2f}x; {note}",
    ]


PROMISES = {
    "rabbitmq classic": "durable queue, persistent messages: confirmed once fsynced",
    "rabbitmq quorum": "quorum queue (one node): confirmed once in its fsynced log",
    "jetstream": "file stream: acknowledged once written, fsynced on a timer (2.9: no setting)",
}
