"""The fyrehose backbone's counters: /stats.json's ``"fyrehose"`` key, the
``fq_fyrehose_*`` metric families and the web UI's Fyrehose panel.

An fqbroker extension (fqd has no fyrehose), present only while the listener runs
(``--fyrehose`` or ``[fyrehose] listen``), so fq's keys and shape are unchanged otherwise.
docs/fyrehose.md, "Counters", says what each counter means.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from fqbroker.frontends.kit import panel as ui
from fqbroker.frontends.kit.component import Counters, LiveFrontEnd, Metric, Series

__all__ = ["COUNTERS", "FyrehoseSnapshot", "FyrehoseSubscriberSnapshot", "FyrehoseView"]


class FyrehoseSubscriberView(Protocol):
    """A live subscriber (fqbroker.frontends.fyrehose.backbone.Subscriber)."""

    @property
    def addr(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def journaling(self) -> bool: ...  # without NOJOURNAL: may be sent a FORWARD
    @property
    def expires_in(self) -> float: ...  # seconds until it stops being one without a KEEPALIVE


@runtime_checkable
class FyrehoseView(Protocol):
    """The backbone (fqbroker.frontends.fyrehose.backbone.Backbone) as its stats see it.

    ``LiveFrontEnd.state`` holds it while the listener runs; that attribute is typed
    ``object`` (the table knows no front end's state), so it is checked against this
    Protocol at run time, and the backbone's module is not imported to read it.
    """

    @property
    def sequence(self) -> int: ...  # the last sequence given, 0 before the first
    @property
    def first_retained(self) -> int: ...  # the oldest sequence in the window, 0 if empty
    @property
    def retained_messages(self) -> int: ...
    @property
    def retained_bytes(self) -> int: ...
    @property
    def pushed(self) -> int: ...
    @property
    def sequenced(self) -> int: ...
    @property
    def delivered(self) -> int: ...
    @property
    def keepalives(self) -> int: ...
    @property
    def requests(self) -> int: ...
    @property
    def served(self) -> int: ...
    @property
    def forwarded(self) -> int: ...
    @property
    def unserved(self) -> int: ...
    @property
    def dropped(self) -> Mapping[str, int]: ...

    def subscribers(self) -> Iterable[FyrehoseSubscriberView]: ...


@dataclass(frozen=True, slots=True)
class FyrehoseSubscriberSnapshot:
    remote: str  # "ADDR:PORT" the DELIVERs go to
    journaling: bool
    expires_in: float


@dataclass(frozen=True, slots=True)
class FyrehoseSnapshot:
    sequence: int
    first_retained: int
    retained_messages: int
    retained_bytes: int
    pushed: int
    sequenced: int
    delivered: int
    keepalives: int
    requests: int
    served: int
    forwarded: int
    unserved: int
    dropped: tuple[tuple[str, int], ...]  # every reason of DROP_REASONS, then any other
    subscribers: tuple[FyrehoseSubscriberSnapshot, ...]


def take(host: object, live: LiveFrontEnd) -> FyrehoseSnapshot | None:
    """The backbone's numbers; None when the listener is off."""
    b = live.state
    if not isinstance(b, FyrehoseView):
        return None
    # Loaded already: the backbone is running.
    from fqbroker.frontends.fyrehose.backbone import DROP_REASONS

    dropped = dict.fromkeys(DROP_REASONS, 0)
    dropped.update(b.dropped)
    subscribers = tuple(
        sorted(
            (
                FyrehoseSubscriberSnapshot(f"{s.addr}:{s.port}", s.journaling, s.expires_in)
                for s in list(b.subscribers())
            ),
            key=lambda s: s.remote,
        )
    )
    return FyrehoseSnapshot(
        sequence=b.sequence,
        first_retained=b.first_retained,
        retained_messages=b.retained_messages,
        retained_bytes=b.retained_bytes,
        pushed=b.pushed,
        sequenced=b.sequenced,
        delivered=b.delivered,
        keepalives=b.keepalives,
        requests=b.requests,
        served=b.served,
        forwarded=b.forwarded,
        unserved=b.unserved,
        dropped=tuple(dropped.items()),
        subscribers=subscribers,
    )


def stats_json(f: FyrehoseSnapshot) -> dict[str, Any]:
    """The ``"fyrehose"`` section of /stats.json::

        "fyrehose": {"sequence", "first_retained", "retained_messages", "retained_bytes",
                     "pushed", "sequenced", "delivered", "keepalives", "requests", "served",
                     "forwarded", "unserved", "dropped": {reason: n},
                     "subscribers": [{"remote", "journaling", "expires_in"}]}

    ``sequence`` is the last sequence number given (0 before the first), ``first_retained``
    the oldest one the retained window still holds (0 while it is empty), so the window is
    ``first_retained..sequence``. ``dropped`` always lists every reason the backbone counts
    (``backbone.DROP_REASONS``, 0 until one happens), so a reader or a dashboard can rely on
    the keys.
    """
    return {
        "sequence": f.sequence,
        "first_retained": f.first_retained,
        "retained_messages": f.retained_messages,
        "retained_bytes": f.retained_bytes,
        "pushed": f.pushed,
        "sequenced": f.sequenced,
        "delivered": f.delivered,
        "keepalives": f.keepalives,
        "requests": f.requests,
        "served": f.served,
        "forwarded": f.forwarded,
        "unserved": f.unserved,
        "dropped": dict(f.dropped),
        "subscribers": [
            {"remote": s.remote, "journaling": s.journaling, "expires_in": round(s.expires_in, 3)}
            for s in f.subscribers
        ],
    }


def _dropped(f: FyrehoseSnapshot) -> Series:
    return (((reason,), count) for reason, count in f.dropped)


# fmt: off
METRICS: tuple[Metric[FyrehoseSnapshot], ...] = (
    Metric("fq_fyrehose_sequence", "gauge",
           "The last sequence number given (it continues across restarts).",
           lambda f: f.sequence),
    Metric("fq_fyrehose_first_retained", "gauge",
           "The oldest sequence number in the retained window (0: empty).",
           lambda f: f.first_retained),
    Metric("fq_fyrehose_retained_messages", "gauge", "Messages the window holds.",
           lambda f: f.retained_messages),
    Metric("fq_fyrehose_retained_bytes", "gauge", "Data bytes the window holds.",
           lambda f: f.retained_bytes),
    Metric("fq_fyrehose_subscribers", "gauge", "Live subscribers (KEEPALIVE < 5 s).",
           lambda f: len(f.subscribers)),
    Metric("fq_fyrehose_pushed", "counter", "PUSH datagrams published on the fyrehose exchange.",
           lambda f: f.pushed),
    Metric("fq_fyrehose_sequenced", "counter",
           "Messages given a sequence number since start (PUSHes and fq publishes).",
           lambda f: f.sequenced),
    Metric("fq_fyrehose_delivered", "counter", "DELIVER datagrams sent to live subscribers.",
           lambda f: f.delivered),
    Metric("fq_fyrehose_keepalives", "counter", "KEEPALIVE datagrams received.",
           lambda f: f.keepalives),
    Metric("fq_fyrehose_requests", "counter", "REQUEST datagrams received.",
           lambda f: f.requests),
    Metric("fq_fyrehose_served", "counter",
           "Messages re-sent from the retained window for REQUESTs.", lambda f: f.served),
    Metric("fq_fyrehose_forwarded", "counter",
           "FORWARD datagrams sent to journaling subscribers.", lambda f: f.forwarded),
    Metric("fq_fyrehose_unserved", "counter",
           "Requested messages older than the window with no journaling subscriber to ask.",
           lambda f: f.unserved),
    Metric("fq_fyrehose_dropped", "counter",
           "Datagrams or messages the backbone dropped, by reason (docs/fyrehose.md).",
           _dropped, labels=("reason",)),
)
# fmt: on


def panel(f: FyrehoseSnapshot) -> ui.Json:
    """The sequence and its rate, the retained window, recovery and drops, and the
    subscribers (journaling ones may be asked to FORWARD)."""
    if f.first_retained:
        window: ui.Text = [
            ui.n(f.first_retained, "plain"),
            "\u2013",
            ui.n(f.sequence, "plain"),
            " · ",
            ui.n(f.retained_bytes, "bytes"),
        ]
    else:
        window = "empty"
    drops = [(reason, count) for reason, count in f.dropped if count > 0]
    total = sum(count for _, count in drops)
    reasons: ui.Text = "none"
    if drops:
        reasons = []
        for i, (reason, count) in enumerate(drops):
            reasons += [*([" · "] if i else []), ui.n(count), f" {reason}"]
    recovery: ui.Parts = [ui.n(f.served), " served · ", ui.n(f.forwarded), " forwarded · "]
    recovery += [ui.n(f.unserved), " unserved"]
    subs = f.subscribers
    summary: ui.Parts = ui.plural(len(subs), "subscriber", "subscribers")
    if f.unserved:
        summary += [", ", ui.n(f.unserved), " unserved"]
    return {
        "count": ui.count(str(len(subs)), "fyrehose-subscriber-count"),
        "summary": {"text": summary, "state": "warn" if f.unserved else "ok"},
        "tiles": [
            ui.tile(
                "sequence",
                ui.cell("sequence", str(f.sequence), value=f.sequence, cls="accent mono"),
                ui.cell("rate", "", rate=f.sequence, suffix=" msg/s"),
            ),
            ui.tile(
                "retained",
                ui.cell("retained", [ui.n(f.retained_messages)], value=f.retained_messages),
                ui.cell("range", window),
            ),
            ui.tile(
                "pushed · delivered",
                ui.cell("pushed", [ui.n(f.pushed)], value=f.pushed),
                ui.cell("delivered", [ui.n(f.delivered), " delivered"], value=f.delivered),
            ),
            ui.tile(
                "requests",
                ui.cell("requests", [ui.n(f.requests)], value=f.requests),
                ui.cell(
                    "recovery",
                    recovery,
                    cls="warn" if f.unserved else "",
                ),
            ),
            ui.tile(
                "dropped",
                ui.cell("dropped", [ui.n(total)], value=total, cls="nonzero" if total else ""),
                ui.cell("drop-reasons", reasons),
                warn=True,
            ),
        ],
        "chips": ui.chips("subscribers", (_chip(s) for s in subs), "no subscribers"),
    }


def _chip(s: FyrehoseSubscriberSnapshot) -> ui.Json:
    journal = "journal" if s.journaling else "no journal"
    return ui.chip(
        f"{s.remote} · {journal}",
        [
            f"{s.remote}: {journal}, subscribed for ",
            ui.n(s.expires_in, "fixed1"),
            " s more without a KEEPALIVE",
        ],
        "" if s.journaling else "nojournal muted",
        {"remote": s.remote, "journaling": "true" if s.journaling else "false"},
    )


COUNTERS: Counters[Any, FyrehoseSnapshot] = Counters(
    read=take,
    metrics=METRICS,
    key="fyrehose",
    json=stats_json,
    title="Fyrehose",
    panel=panel,
)
