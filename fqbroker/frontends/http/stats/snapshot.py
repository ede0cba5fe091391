"""A snapshot of the broker's counters, and /stats.json made from it (fqd_config.c).

:func:`take_snapshot` walks the broker's exchanges, bindings, queues and clients once and
copies every number into plain frozen dataclasses (:class:`Snapshot`). Every renderer
reads the same snapshot, so /stats.json, /metrics and /frontends.json can never disagree.
The hot path never touches this module: routing bumps plain ints, and a snapshot is only
taken when someone asks.
"""

from __future__ import annotations

import dataclasses
import json
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from fqbroker.core.queue import Queue
from fqbroker.core.queuespec import UNLIMITED_BYTES
from fqbroker.core.router import AggregateStats, ClientStats
from fqbroker.frontends.http.host import FqClientView, PeerLinkView, StatsSource
from fqbroker.frontends.http.stats.frontends import (
    FrontEndSnapshot,
    Reading,
    front_end_snapshots,
    readings,
    unnamed,
)
from fqbroker.version import FQ_COMPAT_VERSION

__all__ = [
    "ClientSnapshot",
    "DiskSnapshot",
    "ExchangeSnapshot",
    "FileSystemSnapshot",
    "HttpCounters",
    "MemorySnapshot",
    "PeerSnapshot",
    "QueueSnapshot",
    "RouteSnapshot",
    "Snapshot",
    "disk_snapshot",
    "http_counters",
    "render_stats_json",
    "stats_json",
    "take_snapshot",
]


@dataclass(frozen=True, slots=True)
class RouteSnapshot:
    route_id: int
    prefix: bytes
    queue: bytes
    permanent: bool
    invocations: int
    avg_ns: int
    program: bytes


@dataclass(frozen=True, slots=True)
class ExchangeSnapshot:
    name: bytes
    messages: int
    octets: int
    no_route: int
    routed: int
    dropped: int
    routes: tuple[RouteSnapshot, ...]
    denied: int = 0  # not fqd's: published where the publisher may not (auth = "password")


@dataclass(frozen=True, slots=True)
class ClientSnapshot:
    user: bytes
    queue: bytes
    remote_addr: str
    remote_port: int
    mode: str | None  # "client" or "peer" while a data channel is paired, else None
    stats: ClientStats


@dataclass(frozen=True, slots=True)
class QueueSnapshot:
    name: bytes
    private: bool
    kind: str
    policy: str
    permanent: bool
    backlog_limit: int  # signed, as fqd prints it: -1 means unlimited
    backlog: int
    dropped_to: int
    clients: tuple[ClientSnapshot, ...]
    # Disk-queue figures, None for memory queues (or a store that does not offer them).
    disk_bytes: int | None = None
    disk_write_errors: int | None = None
    disk_fsync_errors: int | None = None
    fsyncs: int | None = None
    fsync_seconds_total: float | None = None  # summed over all fsyncs
    fsync_last_seconds: float | None = None  # the latest fsync's duration
    # Records and bytes skipped over damage (docs/disk-format.md, "Recovery").
    corrupt_records: int | None = None
    corrupt_bytes: int | None = None
    # Memory bounds (docs/memory.md): bytes held in memory, and the byte limit.
    held_bytes: int = 0
    limit_bytes: int | None = None  # None: unlimited (a disk queue's files are not counted)
    # Messages of publishers that opted in to de-duplication dropped as repeats.
    duplicates: int = 0


@dataclass(frozen=True, slots=True)
class PeerBindingSnapshot:
    exchange: bytes
    program: bytes
    permanent: bool
    route_id: int | None  # None until the upstream accepted it


@dataclass(frozen=True, slots=True)
class PeerSnapshot:
    """An upstream this broker pulls from (docs/fq-protocol.md §5): where, how it goes, what
    it brought."""

    host: str
    port: int
    source: str
    state: str
    reconnects: int
    looped: int
    duplicates: int
    bindings: tuple[PeerBindingSnapshot, ...]
    stats: ClientStats


@dataclass(slots=True)
class HttpCounters:
    """What the HTTP front end counts for one broker (it owns no state of its own)."""

    open_connections: int = 0
    accepted: int = 0
    responses: Counter[int] = field(default_factory=Counter)  # by status code


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One reading of every counter of the broker, taken at once.

    Two renderers read it:

    * :func:`stats_json` builds fqd's ``/stats.json`` object with its exact key names and
      order (docs/fq-protocol.md §4.2);
    * :class:`fqbroker.frontends.http.stats.metrics.BrokerCollector` turns it into metric
      families;

    and :mod:`fqbroker.frontends.http.stats.frontends` builds ``/frontends.json`` from the
    front ends of the table.

    A front end that counts more than its connections declares it (``FrontEnd.counters``):
    the snapshot holds one reading of each
    (:class:`~fqbroker.frontends.http.stats.frontends.Reading`), shown under the key it
    names, so nothing here names a protocol. Names stay ``bytes`` in the snapshot; each
    renderer decides how to show them as text.
    """

    version: str
    node_id: bytes
    exchanges: tuple[ExchangeSnapshot, ...]
    aggregate: AggregateStats
    queues: tuple[QueueSnapshot, ...]
    command_connections: int
    data_connections: int
    peer_connections: int
    http: HttpCounters
    peers: tuple[PeerSnapshot, ...] = ()
    # Limits (docs/limits.md): closes for bad input by front end, refusals by reason.
    bad_input: tuple[tuple[str, int], ...] = ()
    refused: tuple[tuple[str, int], ...] = ()
    memory: MemorySnapshot | None = None  # the broker-wide budget (docs/memory.md)
    front_ends: tuple[FrontEndSnapshot, ...] = ()
    readings: tuple[Reading, ...] = ()  # the front ends' own counters, in the table's order
    disk: DiskSnapshot | None = None  # the disk alarm


@dataclass(frozen=True, slots=True)
class FileSystemSnapshot:
    """A file system the broker writes to, as the disk alarm last saw it."""

    path: str  # the first directory watched on it
    free_bytes: int
    total_bytes: int
    limit_bytes: int


@dataclass(frozen=True, slots=True)
class DiskSnapshot:
    """The disk alarm (docs/reliability.md, "Disk alarm")."""

    raised: bool
    refusals: int  # writes refused while raised
    filesystems: tuple[FileSystemSnapshot, ...]

    def json(self, *, names: bool = True) -> dict[str, Any]:
        """What /node.json shows; without ``names`` the paths are "" (as its others)."""
        return {
            "raised": self.raised,
            "refusals": self.refusals,
            "filesystems": [
                {
                    "path": fs.path if names else "",
                    "free_bytes": fs.free_bytes,
                    "total_bytes": fs.total_bytes,
                    "limit_bytes": fs.limit_bytes,
                    "alarm": fs.free_bytes < fs.limit_bytes,
                }
                for fs in self.filesystems
            ],
        }


def disk_snapshot(broker: StatsSource) -> DiskSnapshot:
    alarm = broker.disk_alarm
    return DiskSnapshot(
        raised=alarm.raised,
        refusals=alarm.refusals,
        filesystems=tuple(
            FileSystemSnapshot(str(r.path), r.free, r.total, limit) for r, limit in alarm.readings()
        ),
    )


@dataclass(frozen=True, slots=True)
class MemorySnapshot:
    used: int
    limit: int
    paused: int  # times a publisher waited for the budget
    waiting: int  # publishers waiting now


_http: weakref.WeakKeyDictionary[StatsSource, HttpCounters] = weakref.WeakKeyDictionary()


def http_counters(broker: StatsSource) -> HttpCounters:
    """The HTTP counters of ``broker``, created on first use and gone with the broker."""
    counters = _http.get(broker)
    if counters is None:
        counters = _http[broker] = HttpCounters()
    return counters


def take_snapshot(broker: StatsSource) -> Snapshot:
    exchanges = tuple(
        ExchangeSnapshot(
            name=ex.name,
            messages=ex.messages,
            octets=ex.octets,
            no_route=ex.no_route,
            routed=ex.routed,
            dropped=ex.dropped,
            routes=tuple(
                RouteSnapshot(
                    route_id=b.route_id,
                    prefix=b.program.prefix,
                    # The router only knows its targets as Target; ours are all Queues.
                    queue=getattr(b.queue, "name", b""),
                    permanent=b.permanent,
                    invocations=b.invocations,
                    avg_ns=b.avg_ns,
                    program=b.program.text,
                )
                for b in ex.bindings.values()
            ),
            denied=ex.denied,
        )
        for ex in broker.router.exchanges.values()
    )
    data = peers = 0
    for session in broker.clients.values():
        if session.data is not None:
            if session.data.is_peer:
                peers += 1
            else:
                data += 1
    http = http_counters(broker)
    return Snapshot(
        version=FQ_COMPAT_VERSION,
        node_id=broker.node_id,
        exchanges=exchanges,
        aggregate=dataclasses.replace(broker.router.aggregate),
        queues=tuple(_queue_snapshot(q) for q in broker.queues.values()),
        command_connections=len(broker.clients),
        data_connections=data,
        peer_connections=peers,
        http=HttpCounters(http.open_connections, http.accepted, Counter(http.responses)),
        peers=tuple(_peer_snapshot(link) for link in broker.peering.links.values()),
        bad_input=tuple(sorted(broker.limits.bad_input.items())),
        refused=tuple(sorted(broker.limits.refused.items())),
        memory=MemorySnapshot(
            broker.budget.used, broker.budget.limit, broker.budget.paused, broker.budget.waiting
        ),
        front_ends=front_end_snapshots(broker),
        readings=readings(broker),
        disk=disk_snapshot(broker),
    )


def _peer_snapshot(link: PeerLinkView) -> PeerSnapshot:
    return PeerSnapshot(
        host=link.address.host,
        port=link.address.port,
        source=link.address.source,
        state=str(link.state),
        reconnects=link.reconnects,
        looped=link.looped,
        duplicates=link.duplicates,
        bindings=tuple(
            PeerBindingSnapshot(b.exchange, b.program, b.permanent, link.bound.get(b))
            for b in sorted(link.wanted, key=lambda b: (b.exchange, b.program, b.permanent))
        ),
        stats=dataclasses.replace(link.stats),
    )


def _queue_snapshot(queue: Queue) -> QueueSnapshot:
    # Read by name, not through the Store protocol: only disk stores have these, and
    # each figure shows up in the metrics as soon as a store offers it.
    store = getattr(queue, "store", None)
    return QueueSnapshot(
        name=queue.name,
        private=queue.private,
        kind=str(queue.kind),
        policy=str(queue.policy),
        permanent=queue.permanent,
        backlog_limit=queue.backlog_limit,
        backlog=queue.backlog,
        dropped_to=queue.dropped_to,
        clients=tuple(_client_snapshot(c, queue.name) for c in queue.clients),
        disk_bytes=_optional_int(store, "size_bytes"),
        disk_write_errors=_optional_int(store, "write_errors"),
        disk_fsync_errors=_optional_int(store, "fsync_errors"),
        fsyncs=_optional_int(store, "fsyncs"),
        fsync_seconds_total=_optional_float(store, "fsync_seconds_total"),
        fsync_last_seconds=_optional_float(store, "fsync_seconds"),
        corrupt_records=_optional_int(store, "corrupt_records"),
        corrupt_bytes=_optional_int(store, "corrupt_bytes"),
        held_bytes=_optional_int(store, "held_bytes") or 0,
        limit_bytes=None if queue.limit_bytes >= UNLIMITED_BYTES else queue.limit_bytes,
        duplicates=_optional_int(queue, "duplicates") or 0,
    )


def _optional_int(obj: object, name: str) -> int | None:
    value = getattr(obj, name, None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _optional_float(obj: object, name: str) -> float | None:
    value = getattr(obj, name, None)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _client_snapshot(client: object, queue: bytes) -> ClientSnapshot:
    session: FqClientView = client  # type: ignore[assignment]  # Queue.clients is list[object]
    data = session.data
    mode = None if data is None else ("peer" if data.is_peer else "client")
    return ClientSnapshot(
        user=session.user,
        queue=queue,
        remote_addr=session.remote_addr,
        remote_port=session.remote_port,
        mode=mode,
        stats=dataclasses.replace(session.stats),
    )


# --- /stats.json -----------------------------------------------------------------------------


def _text(name: bytes) -> str:
    # fqd writes names raw and unescaped, so a quote breaks its JSON
    # (docs/fq-protocol.md §4.2). Names are bytes on the wire; we show them as UTF-8,
    # invalid bytes as U+FFFD, and let the JSON encoder escape them.
    return name.decode("utf-8", errors="replace")


# fq's status counters; ``denied`` (permissions, not fqd's) is shown only when nonzero,
# so a broker under auth = "none" answers exactly fqd's shape.
_CLIENT_COUNTERS = tuple(f.name for f in dataclasses.fields(ClientStats) if f.name != "denied")


def stats_json(snap: Snapshot, *, names: bool = True) -> dict[str, Any]:
    """fqd's /stats.json object: same keys, same order, same types
    (docs/fq-protocol.md §4.2).

    Without ``names`` (a reader who may not see who is connected, auth.sees_names) a
    client's ``user`` and ``remote_addr`` are "" and its ``remote_port`` "0", an upstream's
    ``source`` (the user it logs in as) is "", and the front
    ends' sections go through :func:`~fqbroker.frontends.http.stats.frontends.unnamed`:
    the same document with the same counts, nobody named.
    """
    exchanges: dict[str, Any] = {}
    for ex in snap.exchanges:
        exchanges[_text(ex.name)] = {
            "messages": ex.messages,
            "octets": ex.octets,
            "no_route": ex.no_route,
            "routed": ex.routed,
            "dropped": ex.dropped,
            "routes": {
                str(r.route_id): {
                    "route_id": r.route_id,
                    "prefix": _text(r.prefix),
                    "queue": _text(r.queue),
                    "permanent": r.permanent,
                    "invocations": r.invocations,
                    "avg_ns": r.avg_ns,
                    "program": _text(r.program),
                }
                for r in ex.routes
            },
        }
        if ex.denied:
            exchanges[_text(ex.name)]["denied"] = ex.denied
    agg = snap.aggregate
    # Written last, so an exchange really named "_aggregate" cannot hide the totals.
    exchanges["_aggregate"] = {
        "no_exchange": agg.no_exchange,
        "messages": agg.messages,
        "octets": agg.octets,
        "no_route": agg.no_route,
        "routed": agg.routed,
        "dropped": agg.dropped,
        "size_dropped": agg.size_dropped,
    }
    if agg.denied:
        exchanges["_aggregate"]["denied"] = agg.denied
    queues: dict[str, Any] = {}
    for q in snap.queues:
        queues[_text(q.name)] = {
            "private": q.private,
            "type": q.kind,
            "policy": q.policy,
            "backlog_limit": q.backlog_limit,
            "backlog": q.backlog,
            "dropped_to": q.dropped_to,
            "clients": [_client_json(c, names) for c in q.clients],
        }
        if q.duplicates:  # only where a publisher opted in: fq's keys are unchanged
            queues[_text(q.name)]["duplicates"] = q.duplicates
    out: dict[str, Any] = {"version": snap.version, "exchanges": exchanges, "queues": queues}
    if snap.peers:
        # Not in fqd, which shows its upstreams nowhere; only present when there are some,
        # so a broker without peers answers exactly fqd's shape.
        out["peers"] = [_peer_json(p, names) for p in snap.peers]
    for r in snap.readings:
        # Extensions too, each present only while its front end has something to show
        # (its listener runs), so fq's shape is unchanged otherwise.
        if r.value is not None and r.counters.json is not None:
            section = r.counters.json(r.value)
            out[r.key] = section if names else unnamed(section)
    return out


def _peer_json(p: PeerSnapshot, names: bool = True) -> dict[str, Any]:
    return {
        "mode": "peer",
        "host": p.host,
        "port": p.port,
        "source": p.source if names else "",  # the user it logs in upstream as
        "state": p.state,
        "reconnects": p.reconnects,
        "bindings": [
            {
                "exchange": _text(b.exchange),
                "program": _text(b.program),
                "permanent": b.permanent,
                "route_id": b.route_id,
            }
            for b in p.bindings
        ],
        **{k: getattr(p.stats, k) for k in _CLIENT_COUNTERS},
        **({"denied": p.stats.denied} if p.stats.denied else {}),
        "looped": p.looped,
        "duplicates": p.duplicates,
    }


def _client_json(c: ClientSnapshot, names: bool = True) -> dict[str, str]:
    # fqd prints the port and every counter as JSON strings; clients of fqd parse them so.
    out = {
        "user": _text(c.user) if names else "",
        "remote_addr": c.remote_addr if names else "",
        "remote_port": str(c.remote_port) if names else "0",
    }
    if c.mode is not None:
        out["mode"] = c.mode
        out.update((k, str(getattr(c.stats, k))) for k in _CLIENT_COUNTERS)
        if c.stats.denied:
            out["denied"] = str(c.stats.denied)
    return out


def render_stats_json(broker: StatsSource, *, names: bool = True) -> bytes:
    """The /stats.json body: UTF-8 JSON, non-ASCII kept as is (fqd writes raw bytes)."""
    body = json.dumps(stats_json(take_snapshot(broker), names=names), ensure_ascii=False)
    return body.encode("utf-8") + b"\n"
