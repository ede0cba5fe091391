"""The front ends of the table in a stats snapshot: /frontends.json, and each front end's
own counters.

Every front end is listed alike (an fqbroker extension: fq's keys in /stats.json never see
it): how it is reached, its connection counters and connections, whatever protocol it
speaks. One that counts more declares it (``FrontEnd.counters``); a :class:`Reading` of it,
taken once per snapshot, is what /stats.json shows under its key
(:mod:`fqbroker.frontends.http.stats.snapshot`), what /metrics shows as the families it declares
(:mod:`fqbroker.frontends.http.stats.metrics`) and, here, its metrics and its web UI panel, which
the page draws from the JSON alone (:mod:`fqbroker.frontends.kit.panel`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fqbroker.frontends.http.host import StatsSource
from fqbroker.frontends.kit.component import (
    ConnectionView,
    Counters,
    FrontEndCounters,
    LiveFrontEnd,
)
from fqbroker.frontends.kit.panel import cell, n, tile

__all__ = [
    "FrontEndSnapshot",
    "Reading",
    "front_end_snapshots",
    "front_ends_json",
    "metrics_json",
    "panel_json",
    "readings",
    "render_front_ends_json",
    "unnamed",
]


@dataclass(frozen=True, slots=True)
class FrontEndSnapshot:
    """A front end of the table: how it is reached, where, and what it counted.

    ``connections`` is filled only for /frontends.json: a scrape needs the counts only.
    """

    name: str
    transport: str  # "main" (the shared port), "tcp", "tls" or "udp"
    host: str | None
    port: int | None
    summary: str
    counters: FrontEndCounters
    connections: tuple[ConnectionView, ...] | None = None


@dataclass(frozen=True, slots=True)
class Reading:
    """What one front end counts of its own (``FrontEnd.counters``), read once for every
    renderer; ``value`` is None while it has nothing to show (its listener off)."""

    front_end: str
    counters: Counters[Any, Any]
    value: object

    @property
    def key(self) -> str:
        """Its /stats.json key, and its web UI panel's id."""
        return self.counters.key or self.front_end


def readings(broker: StatsSource) -> tuple[Reading, ...]:
    """A reading of each front end that declares counters of its own."""
    out = []
    for live in broker.front_ends.values():
        if live.spec.counters is not None:
            counters = live.spec.counters()
            out.append(Reading(live.name, counters, counters.read(broker, live)))
    return tuple(out)


def front_end_snapshots(
    broker: StatsSource, *, connections: bool = False
) -> tuple[FrontEndSnapshot, ...]:
    return tuple(_front_end_snapshot(live, connections) for live in broker.front_ends.values())


def _front_end_snapshot(live: LiveFrontEnd, connections: bool) -> FrontEndSnapshot:
    host, port = live.address if live.address is not None else (None, None)
    return FrontEndSnapshot(
        name=live.name,
        transport=live.transport,
        host=host,
        port=port,
        summary=live.spec.summary,
        counters=dataclasses.replace(live.counters),
        connections=tuple(live.views()) if connections else None,
    )


_FRONT_END_COUNTERS = tuple(f.name for f in dataclasses.fields(FrontEndCounters))


def front_ends_json(
    front_ends: tuple[FrontEndSnapshot, ...], own: tuple[Reading, ...] = (), *, names: bool = True
) -> dict[str, Any]:
    """``{"frontends": [...]}``: each front end of the table, in the table's order.

    Counters a front end does not keep (None) are left out rather than shown as 0. One
    that declares counters of its own also has ``metrics`` (its families, with their
    series, while it has a reading) and ``panel``: the web UI's panel of them, drawn from
    this JSON alone (fqbroker.frontends.kit.panel), ``{"id", "title", "hidden": true}`` while
    there is nothing to show.

    Without ``names`` (a reader who may not see who is connected, auth.sees_names) every
    connection's address is "" and port 0, a ``user`` fact is "", and the front ends' own
    JSON goes through :func:`unnamed`: same keys, same counts.
    """
    by_name = {r.front_end: r for r in own}
    # Who is connected, for unnamed() to find in the panels' texts: a panel need not say
    # which of its words is an address.
    known = set() if names else _known_names(front_ends, own)
    out = []
    for fe in front_ends:
        entry: dict[str, Any] = {
            "name": fe.name,
            "transport": fe.transport,
            "host": fe.host,
            "port": fe.port,
            "summary": fe.summary,
        }
        for key in _FRONT_END_COUNTERS:
            value = getattr(fe.counters, key)
            if value is not None:
                entry[key] = value
        entry["connections"] = [
            {"remote_addr": c.remote_addr, "remote_port": c.remote_port, **dict(c.facts)}
            if names
            else {
                "remote_addr": "",
                "remote_port": 0,
                **{k: "" if k in NAME_KEYS else v for k, v in c.facts},
            }
            for c in fe.connections or ()
        ]
        reading = by_name.get(fe.name)
        if reading is not None:
            if reading.value is not None:
                metrics = metrics_json(reading)
                entry["metrics"] = metrics if names else unnamed(metrics, known)
            panel = panel_json(reading)
            entry["panel"] = panel if names else unnamed(panel, known)
        out.append(entry)
    return {"frontends": out}


def render_front_ends_json(broker: StatsSource, *, names: bool = True) -> bytes:
    snapshots = front_end_snapshots(broker, connections=True)
    body = json.dumps(front_ends_json(snapshots, readings(broker), names=names))
    return body.encode("utf-8") + b"\n"


# Keys whose values say who is connected, from where: the fq sessions' "user", a
# connection's "remote_addr", the Figg and fyrehose subscribers' "remote" ("ADDR:PORT").
NAME_KEYS = frozenset({"user", "remote", "remote_addr"})
_ADDRESS_KEYS = frozenset({"remote", "remote_addr"})
HIDDEN = "(hidden)"


def _known_names(front_ends: tuple[FrontEndSnapshot, ...], own: tuple[Reading, ...]) -> set[str]:
    known: set[str] = set()
    for fe in front_ends:
        for c in fe.connections or ():
            if c.remote_addr:
                known.add(f"[{c.remote_addr}]:{c.remote_port}")
                known.add(f"{c.remote_addr}:{c.remote_port}")
    for r in own:
        if r.value is not None and r.counters.json is not None:
            _collect(r.counters.json(r.value), known, set())
    return known


def _collect(value: Any, addresses: set[str], users: set[str]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, str) and v and k in NAME_KEYS:
                (addresses if k in _ADDRESS_KEYS else users).add(v)
            else:
                _collect(v, addresses, users)
    elif isinstance(value, list | tuple):
        for v in value:
            _collect(v, addresses, users)


def unnamed(doc: Any, known: Iterable[str] = ()) -> Any:
    """``doc`` (a front end's own JSON: its /stats.json section, metrics or panel) with
    the user names and addresses left out.

    Front ends declare their JSON themselves, so this knows no front end: a string under
    one of :data:`NAME_KEYS` becomes "", and wherever else that address or name appears
    (a panel's chip text says "ADDR:PORT · 3 behind") it becomes "(hidden)", as does each
    of the ``known`` addresses. Keys, lists and numbers stay, so the web UI draws the same
    panels with the same counts.
    """
    addresses: set[str] = set(known)
    users: set[str] = set()

    def scrub(value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            return {k: scrub(v, k) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [scrub(v) for v in value]
        if isinstance(value, str):
            if key in NAME_KEYS or value in users:
                return "" if key in NAME_KEYS else HIDDEN
            for address in found:
                value = value.replace(address, HIDDEN)
        return value

    _collect(doc, addresses, users)
    # Longest first, so "10.0.0.1:5000" goes before a "10.0.0.1" that is part of it.
    found = sorted(addresses, key=len, reverse=True)
    return scrub(doc)


def metrics_json(r: Reading) -> list[dict[str, Any]]:
    """The families a front end declares, as /metrics has them, with their series."""
    out = []
    for spec in r.counters.metrics:
        value = spec.read(r.value)
        series: list[dict[str, Any]]
        if isinstance(value, int | float):
            series = [{"labels": {}, "value": value}]
        else:
            series = [
                {"labels": dict(zip(spec.labels, v, strict=True)), "value": x} for v, x in value
            ]
        out.append({"name": spec.name, "kind": spec.kind, "help": spec.help, "series": series})
    return out


def panel_json(r: Reading) -> dict[str, Any]:
    """Its web UI panel: what ``Counters.panel`` makes of the reading, or one tile per
    family without labels when the front end draws none of its own."""
    head: dict[str, Any] = {"id": r.key, "title": r.counters.title or r.front_end}
    body: Mapping[str, object] | None = None
    if r.value is not None:
        draw = r.counters.panel
        body = draw(r.value) if draw is not None else _tiles(r)
    return {**head, **body} if body is not None else {**head, "hidden": True}


def _tiles(r: Reading) -> dict[str, Any] | None:
    tiles = []
    for spec in r.counters.metrics:
        value = spec.read(r.value)
        if not spec.labels and isinstance(value, int | float):
            short = spec.name.removeprefix(f"fq_{r.key}_")
            tiles.append(tile(short, cell(short, [n(value)], value=value)))
    return {"tiles": tiles} if tiles else None
