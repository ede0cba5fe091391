"""The scenario suite: fqbroker against the Python-hop ceiling, Redis and NATS, one table.

Every throughput figure is the median of ``--runs`` interleaved runs, each system a fresh
server per scenario, driven by load generators in processes of their own under the same
flow control (docs/bench.md says what msg/s and us/msg count).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .durablesuite import (
    FSYNC,
    PROMISES,
    SIZE,
    WINDOW,
    durable_peers,
    durable_run,
    js_publish_run,
    js_replay_run,
    peer_row,
    rate_text,
)
from .figgsuite import FANOUT_SUBS, fanout_run, publish_run, publish_run_4, replay_run
from .flame import Flame
from .fyrehosesuite import LOSS, SUBS, fyrehose_run, lossy_run
from .harness import (
    Client,
    FqBroker,
    Nats,
    Redis,
    Relay,
    System,
    build_of,
    cpu_seconds,
    credit_file,
    finish_all,
    stop_all,
    version,
)
from .memsuite import IDLE_TARGET, MEMORY_TARGET, idle_row, memory_row
from .ocsuite import oc_generator_note, oc_promise_notes, oc_rows, oc_run, oc_systems

# No byte limit (docs/memory.md): the flows measure speed, not where a backlog is cut.
QUEUE = "mem:backlog=4000000,backlog_bytes=0"


@dataclass
class Flow:
    pubs: int
    subs: int
    size: int
    count: int  # per publisher
    label: str
    queue: str = QUEUE
    routes: int = 1  # > 1: each message on the next route, fq systems only


FLOWS = {
    "1to1-100": Flow(1, 1, 100, 600_000, "1 to 1, 100 B"),
    "1to1-4k": Flow(1, 1, 4096, 120_000, "1 to 1, 4 KiB"),
    "1to1-128k": Flow(1, 1, 128 * 1024, 5_000, "1 to 1, 128 KiB"),
    # fqbroker routes consecutive messages on one route together; here none are.
    "1to1-routes": Flow(1, 1, 100, 300_000, "1 to 1, 100 B, 1,000 routes", routes=1000),
    "fanout": Flow(1, 8, 100, 150_000, "fan-out 1 to 8, 100 B"),
    "fanin": Flow(8, 1, 100, 75_000, "fan-in 8 to 1, 100 B"),
}
DISK_POLICIES = ("never", "interval", "always")


@dataclass
class Config:
    runs: int = 3
    scale: float = 1.0
    peers: bool = True
    latency_seconds: float = 3.0
    backlog: int = 1_000_000
    idle_clients: int = 5_000
    idle_seconds: float = 5.0
    # Another fqbroker tree (e.g. a worktree of the commit before a change), run as the
    # first peer column, BASELINE, in the same interleaved runs.
    baseline: Path | None = None
    # A folder for py-spy flame graphs of fqbroker in the last run of each flow (--flame),
    # with C frames (--native).
    flame: Path | None = None
    native: bool = False


BASELINE = "before"


Row = list[str]


def brokers(cfg: Config, fsync: str = "interval") -> list[FqBroker]:
    """This tree's broker and, with a baseline, the baseline tree's."""
    ours = [FqBroker(fsync)]
    if cfg.baseline is not None:
        ours.append(FqBroker(fsync, tree=cfg.baseline, name=BASELINE))
    return ours


def peers_of(cfg: Config) -> tuple[list[System], list[Row]]:
    """The peer systems that can run here, and table rows for those that cannot."""
    systems: list[System] = [*brokers(cfg)[1:]]
    notes: list[Row] = []
    for peer in [Relay("uvloop"), *([Redis(), Nats()] if cfg.peers else [])]:
        why = peer.available()
        if why is None:
            systems.append(peer)
        else:
            notes.append([peer.name, why])
    notes.append(["fqd 0.13.12", "not measured: not packaged in Debian (its 'fq' is another tool)"])
    return systems, notes


def _window(size: int) -> int:
    return max(64, min(50_000, (16 << 20) // size))


def flow_run(
    system: System,
    flow: Flow,
    run: int,
    scale: float,
    tail: bool = False,
    flame: Path | None = None,
    native: bool = False,
) -> dict[str, float]:
    """One run of a flow: rate, us per delivery and, with ``tail``, one more message's latency.

    The tail message is sent once everything before it was delivered, so its latency shows
    whether a lone message waits (fqd's jlog held such tails for seconds). With ``flame``, a
    py-spy flame graph of the server from go to the last delivery, written there.
    """
    topic = f"t{run}"
    count = max(1, int(flow.count * scale))
    credit = credit_file()
    common: dict[str, Any] = {"topic": topic, "size": flow.size, "queue_type": flow.queue}
    subs = [
        Client("sub", system, count=count * flow.pubs + tail, credit=credit, slot=j, **common)
        for j in range(flow.subs)
    ]
    pubs: list[Client] = []
    recorder: Flame | None = None
    failed = True
    try:
        for s in subs:
            s.ready()
        pubs = [
            Client(
                "pub",
                system,
                count=count,
                credit=credit,
                window=_window(flow.size),
                subs=flow.subs,
                pubs=flow.pubs,
                ident=i,
                tail=tail,
                routes=flow.routes,
                **common,
            )
            for i in range(flow.pubs)
        ]
        for p in pubs:
            p.ready()
        if flame is not None:
            recorder = Flame(system.pid, flame, native=native)
        cpu0 = cpu_seconds(system.pid)
        for p in pubs:
            p.go()
        got = [s.collect() for s in subs]
        cpu1 = cpu_seconds(system.pid)
        if recorder is not None:
            recorder.finish()
        sent = [p.collect() for p in pubs]
        failed = False
    finally:
        if recorder is not None:
            recorder.stop()
        finish_all(pubs + subs, failed=failed)
        os.unlink(credit)
    delivered = sum(r["received"] for r in got) - tail * flow.subs
    expected = count * flow.pubs * flow.subs
    if delivered != expected or not all(r["whole"] for r in got):
        print(f"  ! {system.name}: {delivered} of {expected} delivered", flush=True)
    last = max(r["last_ns"] for r in got)
    if tail:
        elapsed = (max(r["tail_ns"] for r in sent) - min(r["start_ns"] for r in sent)) / 1e9
        tail_ms = (last - max(r["tail_ns"] for r in sent)) / 1e6
    else:
        elapsed = (last - min(r["start_ns"] for r in sent)) / 1e9
        tail_ms = 0.0
    return {
        "rate": delivered / elapsed,
        "us": (cpu1 - cpu0) * 1e6 / max(1, delivered),
        "tail_ms": tail_ms,
        "lost": expected - delivered,
    }


def interleaved(
    systems: Sequence[System], runs: int, one: Callable[[System, int], dict[str, float]]
) -> dict[str, dict[str, float]]:
    """Median of each figure per system over ``runs`` interleaved runs."""
    samples: dict[str, list[dict[str, float]]] = {s.name: [] for s in systems}
    try:
        for system in systems:
            system.start()
        for run in range(runs):
            for system in systems:
                samples[system.name].append(one(system, run))
    finally:
        for system in systems:
            system.stop()
    return {
        name: {key: statistics.median(r[key] for r in rs) for key in rs[0]}
        for name, rs in samples.items()
    }


# --- formatting ------------------------------------------------------------------------------


def _ratio(ours: float, theirs: float | None) -> str:
    return f"{ours / theirs:.2f}x" if theirs else "-"


class Table:
    def __init__(self, peers: Sequence[str]) -> None:
        self.peers = list(peers)
        self.head = ["scenario", "fqbroker", "us/msg"]
        for p in self.peers:
            self.head += [p, "us/msg"]
        self.head += [f"vs {p}" for p in self.peers] + ["target"]
        self.rows: list[Row] = []
        self.notes: list[str] = []

    def add(self, row: Row, target: str = "") -> None:
        """A row with fqbroker figures only: a note may span the peer columns."""
        row = row + [""] * (len(self.head) - 1 - len(row)) + [target]
        self.rows.append(row)
        print("  " + " | ".join(c for c in row if c), flush=True)

    def flow(self, label: str, res: dict[str, dict[str, float]], target: str) -> None:
        ours = res["fqbroker"]
        row = [label, rate_text(ours["rate"]), f"{ours['us']:.2f}"]
        for p in self.peers:
            r = res.get(p)
            row += [rate_text(r["rate"]), f"{r['us']:.2f}"] if r else ["-", "-"]
        for p in self.peers:
            r = res.get(p)
            row.append(_ratio(ours["rate"], r["rate"] if r else None))
        self.rows.append([*row, target])
        print("  " + " | ".join([*row, target]), flush=True)

    def render(self) -> str:
        widths = [max(len(r[i]) for r in [self.head, *self.rows]) for i in range(len(self.head))]
        lines = [" | ".join(c.ljust(w) for c, w in zip(self.head, widths, strict=True))]
        lines.append("-+-".join("-" * w for w in widths))
        for r in self.rows:
            lines.append(" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
        return "\n".join(lines + self.notes)


# --- scenarios -------------------------------------------------------------------------------

TARGETS = {
    "1to1-100": ">=300k, <=3 us",
    "fanout": ">=500k deliveries/s",
}


def scenario_flow(name: str, cfg: Config, table: Table) -> None:
    flow = FLOWS[name]
    systems, _ = peers_of(cfg)
    if flow.routes > 1:
        systems = [s for s in systems if s.proto == "fq"]  # Redis and NATS have no routes

    def one(system: System, run: int) -> dict[str, float]:
        last = system.name == "fqbroker" and run == cfg.runs - 1
        svg = f"{name}-native.svg" if cfg.native else f"{name}.svg"
        flame = cfg.flame / svg if cfg.flame is not None and last else None
        return flow_run(system, flow, run, cfg.scale, flame=flame, native=cfg.native)

    res = interleaved([FqBroker(), *systems], cfg.runs, one)
    table.flow(flow.label, res, TARGETS.get(name, ""))


def scenario_disk(cfg: Config, table: Table) -> None:
    for policy in DISK_POLICIES:
        flow = Flow(1, 1, 100, 300_000, f"disk queue, fsync={policy}", "disk:backlog=4000000")
        res = interleaved(
            brokers(cfg, policy),
            cfg.runs,
            lambda s, run, flow=flow: flow_run(s, flow, run, cfg.scale, tail=True),
        )
        r = res["fqbroker"]
        target = ">=150k, last <=20 ms" if policy == "interval" else ""
        tail = f"then one more message: delivered in {r['tail_ms']:.1f} ms"
        row = [flow.label, rate_text(r["rate"]), f"{r['us']:.2f}"]
        before = res.get(BASELINE)
        if before is None:
            row.append(tail)
        else:  # its own columns and ratio; the tail note names both
            tail += f" ({BASELINE}: {before['tail_ms']:.1f} ms)"
            row += [rate_text(before["rate"]), f"{before['us']:.2f}", tail]
            vs_before = len(table.head) - 1 - len(table.peers) + table.peers.index(BASELINE)
            row += [""] * (vs_before - len(row)) + [_ratio(r["rate"], before["rate"])]
        table.add(row, target)


def latency_run(system: System, run: int, cfg: Config) -> list[int]:
    rate = 10_000
    common: dict[str, Any] = {"topic": f"l{run}", "size": 100, "queue_type": QUEUE}
    sub = Client(
        "latsub", system, count=int(rate * cfg.latency_seconds), idle_timeout=1.0, **common
    )
    pub: Client | None = None
    failed = True
    try:
        sub.ready()
        pub = Client("latpub", system, rate=rate, seconds=cfg.latency_seconds, **common)
        pub.ready()
        pub.go()
        lat: list[int] = sub.collect()["lat_ns"]
        failed = False
    finally:
        finish_all([sub] + ([pub] if pub else []), failed=failed)
    return lat


def _pct(sorted_ns: list[int], p: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(len(sorted_ns) * p))] / 1e6


def scenario_latency(cfg: Config, table: Table) -> None:
    peers, _ = peers_of(cfg)
    systems = [FqBroker(), *peers]
    pooled: dict[str, list[int]] = {s.name: [] for s in systems}
    cpu: dict[str, list[float]] = {s.name: [] for s in systems}

    def one(system: System, run: int) -> dict[str, float]:
        c0 = cpu_seconds(system.pid)
        lat = latency_run(system, run, cfg)
        cpu[system.name].append((cpu_seconds(system.pid) - c0) * 1e6 / max(1, len(lat)))
        pooled[system.name] += lat
        return {"n": len(lat)}

    interleaved(systems, cfg.runs, one)
    cells = {}
    for name, lat in pooled.items():
        lat.sort()
        cells[name] = (
            f"{_pct(lat, 0.5):.2f}/{_pct(lat, 0.99):.2f}/{_pct(lat, 0.999):.2f} ms"
            if lat
            else "no data"
        )
    row = ["latency @10k msg/s p50/p99/p99.9", cells["fqbroker"]]
    row.append(f"{statistics.median(cpu['fqbroker']):.2f}")
    for p in table.peers:
        row += [cells.get(p, "-"), f"{statistics.median(cpu[p]):.2f}" if cpu.get(p) else "-"]
    table.add(row, "p50 <0.5 ms, p99 <2 ms")


def scenario_memory(cfg: Config, table: Table) -> None:
    n = max(1000, int(cfg.backlog * min(1.0, cfg.scale * 10)))
    for broker in brokers(cfg):
        table.add(memory_row(broker, n), MEMORY_TARGET)


def scenario_idle(cfg: Config, table: Table) -> None:
    clients = max(10, int(cfg.idle_clients * min(1.0, cfg.scale * 10)))
    for broker in brokers(cfg):
        table.add(idle_row(broker, clients, cfg.idle_seconds), IDLE_TARGET)


LJ_BATCH = 2048
LJ_SIZE = 300
LJ_EVENTS = 100 * LJ_BATCH  # per run, at scale 1: ~2 s at the target


def lumberjack_run(broker: System, run: int, scale: float) -> dict[str, float]:
    """One run: a Beats-like shipper (bench/ljload.py) sends compressed batches of 2,048
    300-byte JSON events to the Lumberjack listener, two batches in flight; one fq
    subscriber bound to the exchange ``logging`` counts the deliveries. Events/s is delivered
    events over the time from the first send to the last receipt."""
    assert isinstance(broker, FqBroker) and broker.lumberjack
    batches = max(2, int(LJ_EVENTS * scale) // LJ_BATCH)
    count = batches * LJ_BATCH
    # Each run its own queue: the previous run's subscriber must not see this run's events.
    sub = Client(
        "sub", broker, topic="logging", count=count, size=LJ_SIZE, queue_type=QUEUE, slot=run
    )
    pub: Client | None = None
    failed = True
    try:
        sub.ready()
        pub = Client(
            "ljpub",
            broker,
            module="bench.ljload",
            lj_port=broker.lj_port,
            count=count,
            size=LJ_SIZE,
            batch=LJ_BATCH,
        )
        pub.ready()
        cpu0 = cpu_seconds(broker.pid)
        pub.go()
        got = sub.collect()
        cpu1 = cpu_seconds(broker.pid)
        sent = pub.collect()
        failed = False
    finally:
        finish_all([sub] + ([pub] if pub else []), failed=failed)
    delivered = got["received"]
    if delivered != count or not got["whole"]:
        print(f"  ! lumberjack: {delivered} of {count} delivered", flush=True)
    return {
        "rate": delivered / ((got["last_ns"] - sent["start_ns"]) / 1e9),
        "us": (cpu1 - cpu0) * 1e6 / max(1, delivered),
        "keepalives": sent["keepalives"],
    }


def scenario_lumberjack(cfg: Config, table: Table) -> None:
    res = interleaved(
        [FqBroker(lumberjack=True)],
        cfg.runs,
        lambda s, run: lumberjack_run(s, run, cfg.scale),
    )
    r = res["fqbroker"]
    table.add(
        [
            "Lumberjack ingest, 300 B JSON, compressed batches of 2,048",
            f"{rate_text(r['rate'])} ev/s",
            f"{r['us']:.2f}",
            "events delivered to an fq consumer; us: broker CPU per event",
        ],
        ">=100k ev/s",
    )


FIGG_ROWS = [
    # An ACK waits for the fsync. Topics default to fsync "always" (back-to-back group
    # commits); "interval" holds a window of 256 to 256 messages per 5 ms, and "never"
    # shows what the broker's CPU allows (docs/figg-protocol.md, Speed).
    ("Figg publish with acknowledgements (window 256), 100 B", publish_run, "always", ">=150k"),
    ("Figg publish, window 256, fsync=interval (5 ms)", publish_run, "interval", ""),
    ("Figg publish, window 256, fsync=never", publish_run, "never", ""),
    ("Figg publish, 4 connections of window 256", publish_run_4, "always", ""),
    ("Figg replay of 1,000,000 retained 100-byte messages", replay_run, "always", ">=400k"),
    (f"Figg live fan-out to {FANOUT_SUBS} subscribers, 100 B", fanout_run, "always", ""),
]


JETSTREAM_BESIDE = {
    publish_run: (js_publish_run, f"JetStream acknowledged publish, window 256, {SIZE} B"),
    replay_run: (js_replay_run, "JetStream replay of the whole stream by a new consumer"),
}


def scenario_figg(cfg: Config, table: Table) -> None:
    """The rows of bench/figgsuite.py, one broker with a Figg listener for each; JetStream
    in the same runs beside the acknowledged publish and the replay, when it is here."""
    jetstream = [s for s in durable_peers()[0] if s.name == "jetstream"] if cfg.peers else []
    for label, one, fsync, target in FIGG_ROWS:
        beside = JETSTREAM_BESIDE.get(one) if fsync == "always" and jetstream else None
        systems: list[System] = [FqBroker(fsync, figg=True)]
        if cfg.baseline is not None:
            systems.append(FqBroker(fsync, figg=True, tree=cfg.baseline, name=BASELINE))
        if beside is not None:
            systems.append(type(jetstream[0])())

        def each(s: System, run: int, one: Any = one, beside: Any = beside) -> dict[str, float]:
            figures: dict[str, float] = (one if isinstance(s, FqBroker) else beside[0])(
                s, run, cfg.scale
            )
            return figures

        res = interleaved(systems, cfg.runs, each)
        r = res["fqbroker"]
        unit = "dlv/s" if one is fanout_run else "msg/s"
        table.add([label, f"{rate_text(r['rate'])} {unit}", f"{r['us']:.2f}"], target)
        if BASELINE in res:
            table.add(peer_row(BASELINE, r, res[BASELINE], "the baseline tree"))
        if beside is not None:
            label = f"{beside[1]} ({version(systems[-1])})"
            table.add(peer_row(label, r, res["jetstream"], PROMISES["jetstream"]))


def scenario_durable(cfg: Config, table: Table) -> None:
    """Confirmed durable publish 1 to 1 (bench/durablesuite.py), each durable peer that is
    here in the same interleaved runs, a row under ours each."""
    peers, missing = durable_peers() if cfg.peers else ([], [])
    res = interleaved(
        [*brokers(cfg, FSYNC), *peers], cfg.runs, lambda s, run: durable_run(s, run, cfg.scale)
    )
    r = res["fqbroker"]
    label = f"confirmed durable publish 1 to 1, {SIZE} B, window {WINDOW:,}"
    promise = f"disk queue, fsync={FSYNC}: confirmed once fsynced"
    table.add([label, rate_text(r["rate"]), f"{r['us']:.2f}", promise], DURABLE_TARGET)
    if BASELINE in res:
        table.add(peer_row(BASELINE, r, res[BASELINE], "the baseline tree"))
    for p in peers:
        table.add(peer_row(f"{p.name} {version(p)}", r, res[p.name], PROMISES[p.name]))
    for note in missing:
        table.add(note)


DURABLE_TARGET = ">=2x best RabbitMQ, >=1.0x JetStream"


def scenario_fyrehose(cfg: Config, table: Table) -> None:
    """The rows of bench/fyrehosesuite.py, a broker with a fyrehose listener for each."""
    res = interleaved(
        [FqBroker(fyrehose=True)], cfg.runs, lambda s, run: fyrehose_run(s, run, cfg.scale)
    )
    r = res["fqbroker"]
    lost = f"lost on loopback: {r['lost']:,.0f} of {r['expected']:,.0f}"
    label = f"fyrehose PUSH to DELIVER, {SUBS} subscribers, 100 B"
    table.add([label, f"{rate_text(r['rate'])} dlv/s", f"{r['us']:.2f}", lost])
    res = interleaved(
        [FqBroker(fyrehose=True)], cfg.runs, lambda s, run: lossy_run(s, run, cfg.scale)
    )
    r = res["fqbroker"]
    note = (
        f"recovered {r['share']:.1%} of {r['missing']:,.0f} lost; gap to fill"
        f" p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms"
    )
    label = f"fyrehose, {LOSS:.0%} loss each way, gaps REQUESTed"
    table.add([label, f"{rate_text(r['rate'])} dlv/s", f"{r['us']:.2f}", note])


def scenario_opencluster(cfg: Config, table: Table) -> None:
    """The rows of bench/ocsuite.py, Redis beside them when it is a peer of the table."""
    systems = oc_systems(with_redis="redis" in table.peers, baseline=cfg.baseline)
    res = interleaved(systems, cfg.runs, lambda s, run: oc_run(s, run, cfg.scale))
    for label, row, target in oc_rows(res):
        table.flow(label, row, target)
    if "redis" in res:
        table.add(oc_generator_note(res["redis"]))
    for note in oc_promise_notes(res):
        table.add(note)


SCENARIOS = [
    *FLOWS, "disk", "durable", "latency", "memory", "idle", "lumberjack", "figg", "fyrehose",
    "opencluster",
]  # fmt: skip


def run(names: Sequence[str], cfg: Config) -> str:
    peers, notes = peers_of(cfg)
    table = Table([p.name for p in peers])
    # Every row's fqbroker is this build (the baseline's column, that one's): a pure
    # Python install measures far slower than a compiled one.
    build = build_of()
    print(
        f"fqbroker bench: {cfg.runs} interleaved runs per figure, median; fqbroker {build};"
        " peers: " + ", ".join(f"{p.name} {version(p)}".strip() for p in peers),
        flush=True,
    )
    notes.append(["fqbroker", f"{build} (fqd --version)"])
    if cfg.baseline is not None:
        built = build_of(cfg.baseline)
        notes.append([BASELINE, f"fqbroker from {cfg.baseline}, in the same runs; {built}"])
    try:
        _run(names, cfg, table)
    finally:
        stop_all()  # what a failure midway left running (nothing when every run ended well)
    table.notes += ["", *(f"{n}: {why}" for n, why in notes)]
    table.notes.append(
        "us/msg: server CPU (user+sys) per delivered message. vs X: fqbroker msg/s over X's."
    )
    return table.render()


def _run(names: Sequence[str], cfg: Config, table: Table) -> None:
    rows: dict[str, Callable[[Config, Table], None]] = {
        "disk": scenario_disk,
        "durable": scenario_durable,
        "latency": scenario_latency,
        "memory": scenario_memory,
        "idle": scenario_idle,
        "lumberjack": scenario_lumberjack,
        "figg": scenario_figg,
        "fyrehose": scenario_fyrehose,
        "opencluster": scenario_opencluster,
    }
    for name in names:
        if name in FLOWS:
            scenario_flow(name, cfg, table)
        else:
            rows[name](cfg, table)
