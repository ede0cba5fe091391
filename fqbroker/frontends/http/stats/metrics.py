"""Prometheus metrics over the broker's own counters (no fqd counterpart).

A :class:`BrokerCollector` reads a :mod:`fqbroker.frontends.http.stats.snapshot` snapshot
at scrape time, so routing keeps bumping plain ints and pays nothing for metrics, and
/metrics always agrees with /stats.json. Naming follows Prometheus conventions: an ``fq_``
prefix, base units (bytes, seconds), ``_total`` on counters, and exchanges, queues and
clients as labels, never in names. docs/http.md lists every metric with its stats.json key.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from fqbroker.core.message import hop_addresses
from fqbroker.core.router import RouteTimes
from fqbroker.frontends.http.host import StatsSource
from fqbroker.frontends.http.stats.frontends import NAME_KEYS
from fqbroker.frontends.http.stats.snapshot import ClientSnapshot, Snapshot, take_snapshot
from fqbroker.settings.broker import Settings
from fqbroker.version import __version__

__all__ = ["BrokerCollector", "MetricsSource", "registry_for", "render_metrics"]


class MetricsSource(StatsSource, Protocol):
    """What a scrape reads: the snapshot's sources, and the settings that bound it."""

    @property
    def settings(self) -> Settings: ...


def _label(name: bytes) -> str:
    # Unlike stats.json (U+FFFD), keep invalid bytes distinct as \xNN: two queues whose
    # names differ only in invalid bytes must not become one duplicated series.
    return name.decode("utf-8", errors="backslashreplace")


class BrokerCollector(Collector):
    """Every broker counter as a metric family, read when Prometheus scrapes.

    One per broker, on a private ``CollectorRegistry`` (:func:`registry_for`): brokers in
    one process (tests start many) never share or collide, and nothing lands in
    prometheus-client's global registry.

    Two things are bounded by settings rather than by the traffic: the ``fq_client_*``
    series, one set per fq connection, are left out while more than
    ``metrics_client_series_max`` clients are connected (``fq_client_series_enabled`` says
    which), so short-lived clients cannot grow a scraper's series without bound; and routing
    time is a histogram, ``fq_route_eval_seconds``, of the batches the router timed (a batch
    every :attr:`~fqbroker.core.router.RouteTimes.SAMPLE_SECONDS` at most: the hot path pays
    two clock reads per timed batch, an attribute test for the others, never a clock per
    message).

    Without ``names`` (a scraper that may not see who is connected, auth.sees_names: the
    read token under ``auth = "password"``) no series is labelled with a user or a client
    address: the ``fq_client_*`` series are left out (``fq_client_series_enabled`` 0), an
    upstream's ``source`` (the user it logs in as) is "", and so is any label a front end
    names ``user`` or ``remote``.
    """

    def __init__(self, broker: MetricsSource, *, names: bool = True) -> None:
        # A weak reference: the registry lives in a map keyed by the broker and must not
        # keep it alive.
        self._broker = weakref.ref(broker)
        self._names = names

    def collect(self) -> Iterable[Metric]:
        broker = self._broker()
        if broker is None:
            return []
        snap = take_snapshot(broker)
        limit = broker.settings.metrics_client_series_max
        per_client = self._names and limit > 0 and snap.command_connections <= limit
        times = broker.router.times
        return [
            *_families(snap, per_client=per_client, names=self._names),
            *_route_times(times.buckets[:], times.sum_ns, times.messages),
        ]


def _families(snap: Snapshot, *, per_client: bool = True, names: bool = True) -> Iterator[Metric]:
    info = InfoMetricFamily("fq_broker", "Broker identity.")
    info.add_metric(
        [],
        {
            "version": snap.version,
            "fqbroker_version": __version__,
            "node_id": hop_addresses(snap.node_id)[0],
        },
    )
    yield info
    yield from _aggregate(snap)
    yield from _exchanges(snap)
    yield from _queues(snap)
    enabled = GaugeMetricFamily(
        "fq_client_series_enabled",
        "1 while the fq_client_* series are exposed (clients <= metrics_client_series_max).",
    )
    enabled.add_metric([], 1 if per_client else 0)
    yield enabled
    if per_client:
        yield from _clients(snap)
    yield from _connections(snap)
    yield from _front_ends(snap)
    yield from _peers(snap, names)
    yield from _limits(snap)
    yield from _memory(snap)
    yield from _disk(snap, names)
    yield from _own(snap, names)


def _disk(snap: Snapshot, names: bool = True) -> Iterator[Metric]:
    """The disk alarm (docs/reliability.md, "Disk alarm"): a file system's path only to
    who may see names (the redacted fields' rule); its index tells them apart."""
    disk = snap.disk
    if disk is None:
        return
    alarm = GaugeMetricFamily(
        "fq_disk_alarm",
        "1 while a file system the broker writes to has less free space than disk_free_limit.",
    )
    alarm.add_metric([], 1 if disk.raised else 0)
    yield alarm
    refusals = CounterMetricFamily(
        "fq_disk_alarm_refusals", "Writes refused while the disk alarm was set."
    )
    refusals.add_metric([], disk.refusals)
    yield refusals
    labels = ["filesystem", "path"]
    free = GaugeMetricFamily(
        "fq_disk_free_bytes", "Free space of a file system the broker writes to.", labels=labels
    )
    limit = GaugeMetricFamily(
        "fq_disk_free_limit_bytes", "disk_free_limit on that file system.", labels=labels
    )
    for i, fs in enumerate(disk.filesystems):
        shown = [str(i), fs.path if names else ""]
        free.add_metric(shown, fs.free_bytes)
        limit.add_metric(shown, fs.limit_bytes)
    yield free
    yield limit


def _own(snap: Snapshot, names: bool = True) -> Iterator[Metric]:
    """The families each front end declares of its own, while it has a reading."""
    for r in snap.readings:
        if r.value is None:
            continue  # its listener is off: none of its families at all
        for spec in r.counters.metrics:
            family_of = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
            family = family_of(spec.name, spec.help, labels=list(spec.labels))
            value = spec.read(r.value)
            if isinstance(value, int | float):
                family.add_metric([], value)
            else:
                hide = [] if names else [i for i, k in enumerate(spec.labels) if k in NAME_KEYS]
                for labels, series in value:
                    shown = list(labels)
                    for i in hide:
                        shown[i] = ""
                    family.add_metric(shown, series)
            yield family


def _memory(snap: Snapshot) -> Iterator[Metric]:
    """The broker-wide memory budget and each queue's bytes (docs/memory.md)."""
    mem = snap.memory
    if mem is not None:
        for name, value, doc in (
            ("fq_memory_used_bytes", mem.used, "Bytes held for publishers: queues, reads."),
            ("fq_memory_limit_bytes", mem.limit, "The broker-wide memory budget."),
            ("fq_memory_waiting_publishers", mem.waiting, "Publishers waiting for budget."),
        ):
            gauge = GaugeMetricFamily(name, doc)
            gauge.add_metric([], value)
            yield gauge
        paused = CounterMetricFamily(
            "fq_memory_pauses", "Times a publisher was paused for the memory budget."
        )
        paused.add_metric([], mem.paused)
        yield paused
    held = GaugeMetricFamily(
        "fq_queue_held_bytes", "Bytes the queue holds in memory.", labels=["queue"]
    )
    limit = GaugeMetricFamily(
        "fq_queue_limit_bytes",
        "The queue's backlog limit in bytes; +Inf when unlimited.",
        labels=["queue"],
    )
    for q in snap.queues:
        held.add_metric([_label(q.name)], q.held_bytes)
        limit.add_metric([_label(q.name)], float("inf") if q.limit_bytes is None else q.limit_bytes)
    yield held
    yield limit


def _aggregate(snap: Snapshot) -> Iterator[Metric]:
    agg = snap.aggregate
    for name, value, doc in (
        ("fq_messages", agg.messages, "Messages published, to any exchange or none."),
        ("fq_payload_bytes", agg.octets, "Payload bytes of all published messages."),
        ("fq_routed", agg.routed, "Deliveries to queues (one per target queue)."),
        ("fq_dropped", agg.dropped, "Deliveries refused by a full drop-policy queue."),
        ("fq_no_route", agg.no_route, "Messages no binding matched (includes no_exchange)."),
        ("fq_no_exchange", agg.no_exchange, "Messages sent to an exchange nobody bound."),
        ("fq_size_dropped", agg.size_dropped, "Messages refused as over the size limit."),
        ("fq_denied", agg.denied, "Messages dropped: their user may not publish there."),
    ):
        counter = CounterMetricFamily(name, doc)
        counter.add_metric([], value)
        yield counter


def _exchanges(snap: Snapshot) -> Iterator[Metric]:
    labels = ["exchange"]
    families = {
        "messages": CounterMetricFamily(
            "fq_exchange_messages", "Messages published to the exchange.", labels=labels
        ),
        "octets": CounterMetricFamily(
            "fq_exchange_payload_bytes", "Payload bytes published to the exchange.", labels=labels
        ),
        "routed": CounterMetricFamily(
            "fq_exchange_routed", "Deliveries to queues from the exchange.", labels=labels
        ),
        "dropped": CounterMetricFamily(
            "fq_exchange_dropped", "Deliveries refused by full drop queues.", labels=labels
        ),
        "no_route": CounterMetricFamily(
            "fq_exchange_no_route", "Messages no binding on the exchange matched.", labels=labels
        ),
        "denied": CounterMetricFamily(
            "fq_exchange_denied",
            "Messages dropped: their user may not publish here.",
            labels=labels,
        ),
    }
    route_labels = ["exchange", "route_id", "queue"]
    invocations = CounterMetricFamily(
        "fq_route_invocations", "Times the binding's program was run.", labels=route_labels
    )
    avg = GaugeMetricFamily(
        "fq_route_eval_avg_seconds",
        "Moving average (alpha 1/128) of the time the binding's program takes.",
        labels=route_labels,
    )
    for ex in snap.exchanges:
        name = _label(ex.name)
        for key, family in families.items():
            family.add_metric([name], getattr(ex, key))
        for r in ex.routes:
            route = [name, str(r.route_id), _label(r.queue)]
            invocations.add_metric(route, r.invocations)
            avg.add_metric(route, r.avg_ns / 1e9)
    yield from families.values()
    yield invocations
    yield avg


def _queues(snap: Snapshot) -> Iterator[Metric]:
    labels = ["queue"]
    info = InfoMetricFamily(
        "fq_queue", "Queue type, sharing, policy and permanence.", labels=labels
    )
    backlog = GaugeMetricFamily(
        "fq_queue_backlog_messages", "Messages waiting in the queue.", labels=labels
    )
    limit = GaugeMetricFamily(
        "fq_queue_limit_messages",
        "Backlog limit; +Inf when unlimited (backlog_limit -1).",
        labels=labels,
    )
    dropped = CounterMetricFamily(
        "fq_queue_dropped", "Messages the queue refused (dropped_to).", labels=labels
    )
    clients = GaugeMetricFamily("fq_queue_clients", "Clients attached.", labels=labels)
    disk = GaugeMetricFamily(
        "fq_queue_disk_bytes", "Bytes the disk queue keeps on disk.", labels=labels
    )
    write_errors = CounterMetricFamily(
        "fq_queue_disk_write_errors", "Failed writes to the disk queue.", labels=labels
    )
    fsync_errors = CounterMetricFamily(
        "fq_queue_disk_fsync_errors",
        "Failed fsyncs of the disk queue; each fails the confirms waiting on it.",
        labels=labels,
    )
    fsync = SummaryMetricFamily(
        "fq_queue_fsync_seconds", "Time spent in fsync by the disk queue.", labels=labels
    )
    fsync_last = GaugeMetricFamily(
        "fq_queue_fsync_last_seconds", "Duration of the disk queue's latest fsync.", labels=labels
    )
    corrupt_records = CounterMetricFamily(
        "fq_queue_corrupt_records",
        "Records of the disk queue skipped over damage since it was opened.",
        labels=labels,
    )
    corrupt_bytes = CounterMetricFamily(
        "fq_queue_corrupt_bytes",
        "Damaged bytes of the disk queue skipped (and copied aside) since it was opened.",
        labels=labels,
    )
    for q in snap.queues:
        name = [_label(q.name)]
        info.add_metric(
            name,
            {
                "type": q.kind,
                "sharing": "private" if q.private else "public",
                "policy": q.policy,
                "permanent": "true" if q.permanent else "false",
            },
        )
        backlog.add_metric(name, q.backlog)
        limit.add_metric(name, math.inf if q.backlog_limit < 0 else q.backlog_limit)
        dropped.add_metric(name, q.dropped_to)
        clients.add_metric(name, len(q.clients))
        if q.disk_bytes is not None:
            disk.add_metric(name, q.disk_bytes)
        if q.disk_write_errors is not None:
            write_errors.add_metric(name, q.disk_write_errors)
        if q.disk_fsync_errors is not None:
            fsync_errors.add_metric(name, q.disk_fsync_errors)
        if q.fsyncs is not None and q.fsync_seconds_total is not None:
            fsync.add_metric(name, count_value=q.fsyncs, sum_value=q.fsync_seconds_total)
        if q.fsync_last_seconds is not None:
            fsync_last.add_metric(name, q.fsync_last_seconds)
        if q.corrupt_records is not None:
            corrupt_records.add_metric(name, q.corrupt_records)
        if q.corrupt_bytes is not None:
            corrupt_bytes.add_metric(name, q.corrupt_bytes)
    yield from (info, backlog, limit, dropped, clients)
    # Disk families appear once some queue reports them, not as empty stubs.
    families = (disk, write_errors, fsync_errors, fsync, fsync_last)
    yield from (m for m in (corrupt_records, corrupt_bytes) if m.samples)
    yield from (m for m in families if m.samples)


# (metric name, ClientStats field, help): the status counters of docs/fq-protocol.md §1.6,
# in base units.
_CLIENT_COUNTERS = (
    ("fq_client_in_messages", "msgs_in", "Messages the client published (msgs_in)."),
    ("fq_client_in_bytes", "octets_in", "Wire bytes of the messages it published."),
    ("fq_client_out_messages", "msgs_out", "Messages delivered to the client (msgs_out)."),
    ("fq_client_out_bytes", "octets_out", "Wire bytes delivered to the client."),
    ("fq_client_routed", "routed", "Deliveries of the client's messages to queues."),
    ("fq_client_dropped", "dropped", "Of those, refused by full drop queues."),
    ("fq_client_no_route", "no_route", "The client's messages no binding matched."),
    ("fq_client_no_exchange", "no_exchange", "The client's messages to unknown exchanges."),
    ("fq_client_size_dropped", "size_dropped", "The client's messages over the size limit."),
    ("fq_client_denied", "denied", "The client's messages where its user may not publish."),
)


def _clients(snap: Snapshot) -> Iterator[Metric]:
    # "client" (address:port) keeps two connections of one user on one queue apart.
    labels = ["user", "queue", "client"]
    families = [
        (field, CounterMetricFamily(name, doc, labels=labels))
        for name, field, doc in _CLIENT_COUNTERS
    ]
    for q in snap.queues:
        for c in q.clients:
            values = _client_labels(c)
            for field, family in families:
                family.add_metric(values, getattr(c.stats, field))
    for _, family in families:
        yield family


def _route_times(buckets: list[int], sum_ns: int, messages: int) -> Iterator[Metric]:
    cumulative = 0
    rows: list[tuple[str, float]] = []
    for bound, count in zip([*RouteTimes.bounds_seconds(), math.inf], buckets, strict=True):
        cumulative += count
        rows.append(("+Inf" if bound == math.inf else repr(bound), cumulative))
    histogram = HistogramMetricFamily(
        "fq_route_eval_seconds",
        "Time the router took for a batch of published messages (lookups, programs and "
        "offers into queues); a sample of the batches (at most 20 a second), see "
        "fq_route_eval_messages.",
        buckets=rows,
        sum_value=sum_ns / 1e9,
    )
    yield histogram
    sampled = CounterMetricFamily(
        "fq_route_eval_messages",
        "Messages in the batches fq_route_eval_seconds timed: its _sum over this is the "
        "routing time per message.",
    )
    sampled.add_metric([], messages)
    yield sampled


def _client_labels(c: ClientSnapshot) -> list[str]:
    return [_label(c.user), _label(c.queue), f"{c.remote_addr}:{c.remote_port}"]


def _connections(snap: Snapshot) -> Iterator[Metric]:
    conns = GaugeMetricFamily(
        "fq_connections",
        "Open connections by kind: authenticated command channels, paired data channels "
        "(client or peer mode), and HTTP.",
        labels=["kind"],
    )
    conns.add_metric(["command"], snap.command_connections)
    conns.add_metric(["data"], snap.data_connections)
    conns.add_metric(["peer"], snap.peer_connections)
    conns.add_metric(["http"], snap.http.open_connections)
    yield conns
    accepted = CounterMetricFamily("fq_http_connections", "HTTP connections accepted.")
    accepted.add_metric([], snap.http.accepted)
    yield accepted
    responses = CounterMetricFamily(
        "fq_http_responses", "HTTP responses sent, by status code.", labels=["code"]
    )
    for code, count in sorted(snap.http.responses.items()):
        responses.add_metric([str(code)], count)
    yield responses


def _front_ends(snap: Snapshot) -> Iterator[Metric]:
    """Every front end of the table alike, whatever protocol it speaks."""
    labels = ["frontend"]
    info = InfoMetricFamily("fq_frontend", "How a front end is reached, and where.", labels=labels)
    families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
        "open": GaugeMetricFamily(
            "fq_frontend_connections", "Connections the front end has open.", labels=labels
        ),
        "accepted": CounterMetricFamily(
            "fq_frontend_accepted", "Connections the front end was given.", labels=labels
        ),
        "refused": CounterMetricFamily(
            "fq_frontend_refused",
            "Connections to the front end refused by a connection limit.",
            labels=labels,
        ),
        "bytes_in": CounterMetricFamily(
            "fq_frontend_received_bytes", "Bytes the front end read.", labels=labels
        ),
        "bytes_out": CounterMetricFamily(
            "fq_frontend_sent_bytes", "Bytes the front end wrote.", labels=labels
        ),
        "datagrams": CounterMetricFamily(
            "fq_frontend_datagrams", "Datagrams the front end received.", labels=labels
        ),
    }
    for fe in snap.front_ends:
        address = "" if fe.host is None else f"{fe.host}:{fe.port}"
        info.add_metric([fe.name], {"transport": fe.transport, "address": address})
        for key, family in families.items():
            value = getattr(fe.counters, key)
            if value is not None:  # a counter the front end does not keep is no sample
                family.add_metric([fe.name], value)
    yield info
    yield from (m for m in families.values() if m.samples)


def _limits(snap: Snapshot) -> Iterator[Metric]:
    bad = CounterMetricFamily(
        "fq_bad_input",
        "Connections closed for bad input, by front end (docs/limits.md).",
        labels=["frontend"],
    )
    for kind, count in snap.bad_input:
        bad.add_metric([kind], count)
    yield bad
    refused = CounterMetricFamily(
        "fq_refused", "Work refused by a limit, by reason (docs/limits.md).", labels=["reason"]
    )
    for reason, count in snap.refused:
        refused.add_metric([reason], count)
    yield refused


def _peers(snap: Snapshot, names: bool = True) -> Iterator[Metric]:
    labels = ["peer", "source"]
    up = GaugeMetricFamily(
        "fq_peer_up", "1 while the connection to an upstream broker is up.", labels=labels
    )
    reconnects = CounterMetricFamily(
        "fq_peer_reconnects", "Times the upstream connection was made again.", labels=labels
    )
    received = CounterMetricFamily(
        "fq_peer_messages_received", "Messages received from the upstream.", labels=labels
    )
    looped = CounterMetricFamily(
        "fq_peer_messages_looped",
        "Received messages dropped because they had passed through this broker.",
        labels=labels,
    )
    duplicates = CounterMetricFamily(
        "fq_peer_messages_duplicate",
        "Received messages dropped as repeats (peer_dedupe).",
        labels=labels,
    )
    bindings = GaugeMetricFamily(
        "fq_peer_bindings", "Exchanges pulled from the upstream, bound or not.", labels=labels
    )
    seen: set[tuple[str, str]] = set()
    for p in snap.peers:
        peer = f"{p.host}:{p.port}"
        source = p.source if names else ""
        while (peer, source) in seen:  # two links to one upstream, as two users
            source += "*"
        seen.add((peer, source))
        values = [peer, source]
        up.add_metric(values, 1 if p.state == "connected" else 0)
        reconnects.add_metric(values, p.reconnects)
        received.add_metric(values, p.stats.msgs_in)
        looped.add_metric(values, p.looped)
        duplicates.add_metric(values, p.duplicates)
        bindings.add_metric(values, len(p.bindings))
    yield from (up, reconnects, received, looped, duplicates, bindings)


_registries: weakref.WeakKeyDictionary[MetricsSource, dict[bool, CollectorRegistry]] = (
    weakref.WeakKeyDictionary()
)


def registry_for(broker: MetricsSource, *, names: bool = True) -> CollectorRegistry:
    """The broker's own registry: its collector plus this process's standard metrics.

    Two per broker, made on first use: one naming users and clients, one not
    (:class:`BrokerCollector`)."""
    pair = _registries.get(broker)
    if pair is None:
        pair = _registries[broker] = {}
    registry = pair.get(names)
    if registry is None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(BrokerCollector(broker, names=names))
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        pair[names] = registry
    return registry


def render_metrics(
    broker: MetricsSource, accept: str = "", *, names: bool = True
) -> tuple[bytes, str]:
    """The /metrics body and its content type, in the format the scraper asked for."""
    encoder, content_type = choose_encoder(accept)
    return encoder(registry_for(broker, names=names)), content_type
