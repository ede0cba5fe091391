"""The OpenCluster key/value store in a stats snapshot: /stats.json's ``"opencluster"`` key
and the ``fq_opencluster_*`` metric families.

An fqbroker extension (fqd has no key/value store): /stats.json gains an ``"opencluster"``
object only while the OpenCluster listener runs (``--opencluster`` or ``[opencluster]
listen``), so fq's keys and shape are unchanged otherwise, as with ``"fyrehose"``
(fyrehosestats.py)::

    "opencluster": {"keys", "bytes", "sets", "gets", "hits", "misses", "expired",
                    "commits", "failed_commits", "sets_per_second", "gets_per_second"}

``keys`` and ``bytes`` (names + values) are what the store holds now; the rest count since
the listener started. ``hits + misses == gets``; ``sets / commits`` is the mean group-commit
batch. The two rates are per second over the stats interval, computed as topicstats.py
computes ``publish_rate``: between this snapshot and the last one taken at least
:data:`~fqbroker.frontends.http.topicstats.RATE_WINDOW` seconds before it, shared by every
reader (/stats.json, /metrics and the web UI), 0 until the store has been sampled twice.
docs/opencluster.md says what each counter means.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from typing import Any, Final

from fqbroker.frontends.http.host import KVStoreView, StatsSource, front_end_state
from fqbroker.frontends.http.topicstats import RATE_WINDOW

__all__ = ["KVSnapshot", "kv_json", "store_of", "take_kv"]

NAME: Final = "opencluster"  # the front end's name in the table (fqbroker.server.frontends)


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
class _Rate:
    at: float
    count: int
    rate: float = 0.0

    def sample(self, count: int, now: float) -> float:
        if count < self.count:  # a new store (the listener started again): start over
            self.at, self.count, self.rate = now, count, 0.0
        elif now - self.at >= RATE_WINDOW:
            self.rate = (count - self.count) / (now - self.at)
            self.at, self.count = now, count
        return self.rate


@dataclass(slots=True)
class _Rates:
    store: int  # id() of the store sampled: a different one starts the rates over
    sets: _Rate
    gets: _Rate


# Keyed by the broker, as topicstats.py does, so the rates go with it.
_rates: weakref.WeakKeyDictionary[StatsSource, _Rates] = weakref.WeakKeyDictionary()


def store_of(broker: StatsSource) -> KVStoreView | None:
    """The running store of ``broker``; None when the OpenCluster listener is off."""
    state = front_end_state(broker, NAME)
    return state if isinstance(state, KVStoreView) else None


def take_kv(broker: StatsSource) -> KVSnapshot | None:
    """The store's numbers; None when the broker runs no OpenCluster listener."""
    store = store_of(broker)
    if store is None:
        return None
    now = time.monotonic()
    sets, gets = store.sets, store.gets
    rates = _rates.get(broker)
    if rates is None or rates.store != id(store):
        rates = _rates[broker] = _Rates(id(store), _Rate(now, sets), _Rate(now, gets))
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


def kv_json(s: KVSnapshot) -> dict[str, Any]:
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
