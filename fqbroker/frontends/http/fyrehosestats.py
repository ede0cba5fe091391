"""The fyrehose backbone in a stats snapshot: /stats.json's ``"fyrehose"`` key and /metrics.

An fqbroker extension (fqd has no fyrehose): /stats.json gains a ``"fyrehose"`` object
only while the fyrehose listener runs (``--fyrehose`` or ``[fyrehose] listen``), so fq's
keys and shape are unchanged otherwise, as with ``"topics"`` (topicstats.py)::

    "fyrehose": {"sequence", "first_retained", "retained_messages", "retained_bytes",
                 "pushed", "sequenced", "delivered", "keepalives", "requests", "served",
                 "forwarded", "unserved", "dropped": {reason: n},
                 "subscribers": [{"remote", "journaling", "expires_in"}]}

``sequence`` is the last sequence number given (0 before the first), ``first_retained``
the oldest one the retained window still holds (0 while it is empty), so the window is
``first_retained..sequence``. ``dropped`` always lists every reason the backbone counts
(:data:`DROP_REASONS`, 0 until one happens), so a reader or a dashboard can rely on the
keys. docs/fyrehose.md says what each counter means.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from fqbroker.frontends.http.host import FyrehoseView, StatsSource, front_end_state

__all__ = [
    "DROP_REASONS",
    "FyrehoseSnapshot",
    "FyrehoseSubscriberSnapshot",
    "fyrehose_json",
    "take_fyrehose",
]

NAME: Final = "fyrehose"  # the front end's name in the table (fqbroker.server.frontends)

# Why the backbone drops a datagram or a message (docs/fyrehose.md, "Counters").
DROP_REASONS: Final = (
    "malformed",  # a datagram the codec refuses: never answered
    "unexpected",  # a datagram only a broker sends (DELIVER, FORWARD, KEEPALIVE-ACK)
    "too_large",  # a message over wire.MAX_DATA: not sequenced
    "busy",  # a PUSH while the publisher waits for a full block-policy queue
    "congested",  # a DELIVER while the socket's send buffer is full
    "subscribers_full",  # a KEEPALIVE past max_subscribers: acknowledged, not subscribed
)


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


def backbone_of(broker: StatsSource) -> FyrehoseView | None:
    """The running fyrehose backbone of ``broker``; None when the listener is off."""
    state = front_end_state(broker, NAME)
    return state if isinstance(state, FyrehoseView) else None


def take_fyrehose(broker: StatsSource) -> FyrehoseSnapshot | None:
    """The backbone's numbers; None when the broker runs no fyrehose listener."""
    b = backbone_of(broker)
    if b is None:
        return None
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


def fyrehose_json(f: FyrehoseSnapshot) -> dict[str, Any]:
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
