"""The OpenCluster key/value store's counters: /stats.json's ``"opencluster"`` key, the
``fq_opencluster_*`` metric families and the web UI's OpenCluster panel.

An fqbroker extension (fqd has no key/value store), present only while the listener runs
(``--opencluster`` or ``[opencluster] listen``), so fq's keys and shape are unchanged
otherwise. docs/opencluster.md, "What operators see", says what each counter means.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from fqbroker.frontends.kit import panel as ui
from fqbroker.frontends.kit.component import Counters, LiveFrontEnd, Metric, Rate

__all__ = ["COUNTERS", "KVSnapshot", "KVStoreView"]


@runtime_checkable
class KVStoreView(Protocol):
    """The store (fqbroker.storage.kv.store.KVStore) as its stats see it.

    ``LiveFrontEnd.state`` holds it while the listener runs; that attribute is ``object``,
    so it is checked against this Protocol at run time. Every counter counts since the
    store opened.
    """

    @property
    def keys(self) -> int: ...  # keys held
    @property
    def bytes(self) -> int: ...  # names + values held
    @property
    def sets(self) -> int: ...
    @property
    def gets(self) -> int: ...
    @property
    def hits(self) -> int: ...
    @property
    def misses(self) -> int: ...
    @property
    def expired(self) -> int: ...
    @property
    def commits(self) -> int: ...  # group commits: sets / commits is the batch size
    @property
    def failed_commits(self) -> int: ...


@dataclass(frozen=True, slots=True)
class KVSnapshot:
    keys: int
    bytes: int
    sets: int
    gets: int
    hits: int
    misses: int
    expired: int
    commits: int
    failed_commits: int
    sets_per_second: float
    gets_per_second: float


@dataclass(slots=True)
class _Rates:
    store: int  # id() of the store sampled: a different one starts the rates over
    sets: Rate
    gets: Rate


# Keyed by the host (the broker), so the rates go with it.
_rates: weakref.WeakKeyDictionary[object, _Rates] = weakref.WeakKeyDictionary()


def take(host: object, live: LiveFrontEnd) -> KVSnapshot | None:
    """The store's numbers; None when the listener is off."""
    store = live.state
    if not isinstance(store, KVStoreView):
        return None
    now = time.monotonic()
    sets, gets = store.sets, store.gets
    rates = _rates.get(host)
    if rates is None or rates.store != id(store):
        rates = _rates[host] = _Rates(id(store), Rate(now, sets), Rate(now, gets))
    return KVSnapshot(
        keys=store.keys,
        bytes=store.bytes,
        sets=sets,
        gets=gets,
        hits=store.hits,
        misses=store.misses,
        expired=store.expired,
        commits=store.commits,
        failed_commits=store.failed_commits,
        sets_per_second=rates.sets.sample(sets, now),
        gets_per_second=rates.gets.sample(gets, now),
    )


def stats_json(s: KVSnapshot) -> dict[str, Any]:
    """The ``"opencluster"`` section of /stats.json::

        "opencluster": {"keys", "bytes", "sets", "gets", "hits", "misses", "expired",
                        "commits", "failed_commits", "sets_per_second", "gets_per_second"}

    ``keys`` and ``bytes`` (names + values) are what the store holds now; the rest count since
    the listener started. ``hits + misses == gets``; ``sets / commits`` is the mean group-commit
    batch. The two rates are per second over the stats interval (:class:`Rate`), shared by
    every reader (/stats.json, /metrics and the web UI), 0 until the store has been sampled
    twice.
    """
    return {
        "keys": s.keys,
        "bytes": s.bytes,
        "sets": s.sets,
        "gets": s.gets,
        "hits": s.hits,
        "misses": s.misses,
        "expired": s.expired,
        "commits": s.commits,
        "failed_commits": s.failed_commits,
        "sets_per_second": round(s.sets_per_second, 3),
        "gets_per_second": round(s.gets_per_second, 3),
    }


# fmt: off
METRICS: tuple[Metric[KVSnapshot], ...] = (
    Metric("fq_opencluster_keys", "gauge", "Keys the key/value store holds.", lambda s: s.keys),
    Metric("fq_opencluster_bytes", "gauge", "Bytes of names and values it holds.",
           lambda s: s.bytes),
    Metric("fq_opencluster_sets", "counter", "set_int and set_string commands answered.",
           lambda s: s.sets),
    Metric("fq_opencluster_gets", "counter", "get_int and get_string commands answered.",
           lambda s: s.gets),
    Metric("fq_opencluster_hits", "counter", "Gets answered with a value.", lambda s: s.hits),
    Metric("fq_opencluster_misses", "counter",
           "Gets answered fail: no such key, or it expired.", lambda s: s.misses),
    Metric("fq_opencluster_expired", "counter", "Keys removed because their expiry passed.",
           lambda s: s.expired),
    Metric("fq_opencluster_commits", "counter",
           "Group commits written to the journal (each holds a batch of sets).",
           lambda s: s.commits),
    Metric("fq_opencluster_failed_commits", "counter",
           "Group commits that failed (their sets were answered failinfo, not stored).",
           lambda s: s.failed_commits),
)
# fmt: on


def panel(kv: KVSnapshot) -> ui.Json:
    """Keys and bytes, set and get rates (the broker's own, so the panel, /stats.json and
    a scrape agree), the hit ratio, expiries and commits."""
    answered = kv.hits + kv.misses
    ratio = kv.hits / answered if answered else None
    failed = kv.failed_commits
    commits: ui.Parts = [ui.n(kv.commits), " commits"]
    if failed:
        commits += [" · ", ui.n(failed), " failed"]
    summary: ui.Text = (
        [ui.n(failed), " failed commits"] if failed else [ui.n(kv.bytes, "bytes"), " stored"]
    )
    return {
        "count": ui.count([ui.n(kv.keys)], "opencluster-key-count"),
        "summary": {"text": summary, "state": "warn" if failed else "ok"},
        "tiles": [
            ui.tile(
                "keys",
                ui.cell("keys", [ui.n(kv.keys)], value=kv.keys),
                ui.cell("bytes", [ui.n(kv.bytes, "bytes")], value=kv.bytes),
            ),
            ui.tile(
                "sets",
                _rate("sets-rate", kv.sets_per_second),
                ui.cell("sets", [ui.n(kv.sets), " sets"], value=kv.sets),
            ),
            ui.tile(
                "gets",
                _rate("gets-rate", kv.gets_per_second),
                ui.cell("gets", [ui.n(kv.gets), " gets"], value=kv.gets),
            ),
            ui.tile(
                "hit ratio",
                ui.cell(
                    "hit-ratio",
                    "\u2013" if ratio is None else [ui.n(ratio, "percent")],
                    value="" if ratio is None else ratio,
                ),
                ui.cell(
                    "hits",
                    [
                        *ui.plural(kv.hits, "hit", "hits"),
                        " · ",
                        *ui.plural(kv.misses, "miss", "misses"),
                    ],
                ),
            ),
            ui.tile(
                "expired",
                ui.cell("expired", [ui.n(kv.expired)], value=kv.expired),
                ui.cell("commits", commits, cls="warn" if failed else ""),
                warn=True,
            ),
        ],
    }


def _rate(field: str, per_second: float) -> ui.Json:
    shown = round(per_second, 3)  # as /stats.json shows it
    return ui.cell(field, [ui.n(shown, "rate"), "/s"], value=shown, cls="accent")


COUNTERS: Counters[Any, KVSnapshot] = Counters(
    read=take,
    metrics=METRICS,
    key="opencluster",
    json=stats_json,
    title="OpenCluster",
    panel=panel,
)
