"""Retained topics in a stats snapshot: /stats.json's ``"topics"`` key and /metrics.

An fqbroker extension (fqd has no topics): /stats.json gains a ``"topics"`` object only
when the broker keeps topics (the Figg listener is configured), so fq's keys and shape
are unchanged otherwise. Per topic::

    "T": {"size_bytes", "first_offset", "last_offset", "messages", "publish_rate",
          "subscribers": [{"remote", "offset", "behind"}]}

``messages`` is what retention keeps (``last_offset - first_offset``); ``behind`` is how
many durable messages a subscriber has not been sent yet. ``publish_rate`` is messages
per second over the stats interval: between this snapshot and the last one taken at
least :data:`RATE_WINDOW` seconds before it (any reader's: /stats.json, /metrics and the
web UI share it), so a page polled every 2 s shows the last 2 s and a scrape every 15 s
the last 15 s. It is 0 until a topic has been sampled twice.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from fqbroker.frontends.http.host import TopicSource

__all__ = ["RATE_WINDOW", "TopicSnapshot", "TopicSubscriberSnapshot", "take_topics", "topics_json"]

RATE_WINDOW = 1.0  # seconds: samples closer than this keep the previous rate


@dataclass(frozen=True, slots=True)
class TopicSubscriberSnapshot:
    remote: str
    offset: int
    behind: int


@dataclass(frozen=True, slots=True)
class TopicSnapshot:
    name: bytes
    size_bytes: int
    first_offset: int
    last_offset: int
    publish_rate: float
    subscribers: tuple[TopicSubscriberSnapshot, ...]

    @property
    def messages(self) -> int:
        return self.last_offset - self.first_offset

    @property
    def max_behind(self) -> int:
        return max((s.behind for s in self.subscribers), default=0)


@dataclass(slots=True)
class _Rate:
    at: float
    count: int
    rate: float = 0.0


@dataclass(slots=True)
class _Rates:
    by_topic: dict[bytes, _Rate] = field(default_factory=dict)

    def sample(self, name: bytes, count: int, now: float) -> float:
        last = self.by_topic.get(name)
        if last is None or count < last.count:  # new, or the topic was opened again
            self.by_topic[name] = _Rate(now, count)
            return 0.0
        if now - last.at >= RATE_WINDOW:
            last.rate = (count - last.count) / (now - last.at)
            last.at, last.count = now, count
        return last.rate


_rates: weakref.WeakKeyDictionary[TopicSource, _Rates] = weakref.WeakKeyDictionary()


def take_topics(broker: TopicSource) -> tuple[TopicSnapshot, ...] | None:
    """Every topic's numbers, in name order; None when the broker keeps no topics."""
    topics = broker.topics
    if topics is None:
        return None
    rates = _rates.get(broker)
    if rates is None:
        rates = _rates[broker] = _Rates()
    now = time.monotonic()
    out = []
    for topic in sorted(topics, key=lambda t: t.name):
        last = topic.last_offset
        subscribers = tuple(
            sorted(
                (
                    TopicSubscriberSnapshot(s.remote, s.offset, max(0, last - s.offset))
                    for s in list(topic.subscribers)
                ),
                key=lambda s: (s.remote, s.offset),
            )
        )
        out.append(
            TopicSnapshot(
                name=topic.name,
                size_bytes=topic.size_bytes,
                first_offset=topic.first_offset,
                last_offset=last,
                publish_rate=rates.sample(topic.name, topic.messages_in, now),
                subscribers=subscribers,
            )
        )
    # Forget topics that are gone, so the map stays as big as the topic set.
    names = {t.name for t in out}
    for name in [n for n in rates.by_topic if n not in names]:
        del rates.by_topic[name]
    return tuple(out)


def topics_json(topics: tuple[TopicSnapshot, ...]) -> dict[str, Any]:
    return {
        t.name.decode("utf-8", errors="replace"): {
            "size_bytes": t.size_bytes,
            "first_offset": t.first_offset,
            "last_offset": t.last_offset,
            "messages": t.messages,
            "publish_rate": round(t.publish_rate, 3),
            "subscribers": [
                {"remote": s.remote, "offset": s.offset, "behind": s.behind} for s in t.subscribers
            ],
        }
        for t in topics
    }
