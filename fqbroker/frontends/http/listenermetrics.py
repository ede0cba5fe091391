"""The metric families of listeners with state of their own: fyrehose and OpenCluster.

Split out of :mod:`fqbroker.frontends.http.metrics`, which yields them after its own; each
function yields nothing while its listener is off (its snapshot is None).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fqbroker.frontends.http.fyrehosestats import FyrehoseSnapshot
from fqbroker.frontends.http.kvstats import KVSnapshot

__all__ = ["fyrehose_families", "opencluster_families"]


# (metric name without _total, FyrehoseSnapshot field, help): the backbone's counters.
_FYREHOSE_COUNTERS = (
    ("fq_fyrehose_pushed", "pushed", "PUSH datagrams published on the fyrehose exchange."),
    (
        "fq_fyrehose_sequenced",
        "sequenced",
        "Messages given a sequence number since start (PUSHes and fq publishes).",
    ),
    ("fq_fyrehose_delivered", "delivered", "DELIVER datagrams sent to live subscribers."),
    ("fq_fyrehose_keepalives", "keepalives", "KEEPALIVE datagrams received."),
    ("fq_fyrehose_requests", "requests", "REQUEST datagrams received."),
    ("fq_fyrehose_served", "served", "Messages re-sent from the retained window for REQUESTs."),
    ("fq_fyrehose_forwarded", "forwarded", "FORWARD datagrams sent to journaling subscribers."),
    (
        "fq_fyrehose_unserved",
        "unserved",
        "Requested messages older than the window with no journaling subscriber to ask.",
    ),
)


def fyrehose_families(f: FyrehoseSnapshot | None) -> Iterator[Metric]:
    if f is None:
        return  # no fyrehose listener: no fyrehose families at all
    for name, value, doc in (
        (
            "fq_fyrehose_sequence",
            f.sequence,
            "The last sequence number given (it continues across restarts).",
        ),
        (
            "fq_fyrehose_first_retained",
            f.first_retained,
            "The oldest sequence number in the retained window (0: empty).",
        ),
        ("fq_fyrehose_retained_messages", f.retained_messages, "Messages the window holds."),
        ("fq_fyrehose_retained_bytes", f.retained_bytes, "Data bytes the window holds."),
        ("fq_fyrehose_subscribers", len(f.subscribers), "Live subscribers (KEEPALIVE < 5 s)."),
    ):
        gauge = GaugeMetricFamily(name, doc)
        gauge.add_metric([], value)
        yield gauge
    for name, field, doc in _FYREHOSE_COUNTERS:
        counter = CounterMetricFamily(name, doc)
        counter.add_metric([], getattr(f, field))
        yield counter
    dropped = CounterMetricFamily(
        "fq_fyrehose_dropped",
        "Datagrams or messages the backbone dropped, by reason (docs/fyrehose.md).",
        labels=["reason"],
    )
    for reason, count in f.dropped:
        dropped.add_metric([reason], count)
    yield dropped


# (metric name without _total, KVSnapshot field, help): the key/value store's counters.
_OPENCLUSTER_COUNTERS = (
    ("fq_opencluster_sets", "sets", "set_int and set_string commands answered."),
    ("fq_opencluster_gets", "gets", "get_int and get_string commands answered."),
    ("fq_opencluster_hits", "hits", "Gets answered with a value."),
    ("fq_opencluster_misses", "misses", "Gets answered fail: no such key, or it expired."),
    ("fq_opencluster_expired", "expired", "Keys removed because their expiry passed."),
    (
        "fq_opencluster_commits",
        "commits",
        "Group commits written to the journal (each holds a batch of sets).",
    ),
    (
        "fq_opencluster_failed_commits",
        "failed_commits",
        "Group commits that failed (their sets were answered failinfo, not stored).",
    ),
)


def opencluster_families(kv: KVSnapshot | None) -> Iterator[Metric]:
    if kv is None:
        return  # no OpenCluster listener: no opencluster families at all
    keys = GaugeMetricFamily("fq_opencluster_keys", "Keys the key/value store holds.")
    keys.add_metric([], kv.keys)
    yield keys
    size = GaugeMetricFamily("fq_opencluster_bytes", "Bytes of names and values it holds.")
    size.add_metric([], kv.bytes)
    yield size
    for name, field, doc in _OPENCLUSTER_COUNTERS:
        counter = CounterMetricFamily(name, doc)
        counter.add_metric([], getattr(kv, field))
        yield counter
