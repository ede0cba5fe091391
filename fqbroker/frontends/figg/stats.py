"""Retained topics' counters: /stats.json's ``"topics"`` key, the ``fq_topic_*`` metric
families and the web UI's Topics panel.

An fqbroker extension (fqd has no topics), present only when the broker keeps topics
(the Figg listener is configured), so fq's keys and shape are unchanged otherwise.
docs/http.md, "/stats.json", says what each counter means.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from fqbroker.frontends.kit import panel as ui
from fqbroker.frontends.kit.component import Counters, LiveFrontEnd, Metric, Rate, Series
from fqbroker.storage.topics.topic import Topic

__all__ = ["COUNTERS", "TopicSnapshot", "TopicSubscriberSnapshot"]


class TopicsHost(Protocol):
    """The broker's topics, or None when the Figg listener is not configured."""

    @property
    def topics(self) -> Iterable[Topic] | None: ...


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


Topics = tuple[TopicSnapshot, ...]

# Each broker's rates by topic name, gone with the broker.
_rates: weakref.WeakKeyDictionary[object, dict[bytes, Rate]] = weakref.WeakKeyDictionary()


def take(host: TopicsHost, live: LiveFrontEnd) -> Topics | None:
    """Every topic's numbers, in name order; None when the broker keeps no topics."""
    topics = host.topics
    if topics is None:
        return None
    rates = _rates.get(host)
    if rates is None:
        rates = _rates[host] = {}
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
        rate = rates.get(topic.name)
        if rate is None:
            rate = rates[topic.name] = Rate(now, topic.messages_in)
        out.append(
            TopicSnapshot(
                name=topic.name,
                size_bytes=topic.size_bytes,
                first_offset=topic.first_offset,
                last_offset=last,
                publish_rate=rate.sample(topic.messages_in, now),
                subscribers=subscribers,
            )
        )
    # Forget topics that are gone, so the map stays as big as the topic set.
    names = {t.name for t in out}
    for name in [n for n in rates if n not in names]:
        del rates[name]
    return tuple(out)


def stats_json(topics: Topics) -> dict[str, Any]:
    """The ``"topics"`` section of /stats.json, per topic::

        "T": {"size_bytes", "first_offset", "last_offset", "messages", "publish_rate",
              "subscribers": [{"remote", "offset", "behind"}]}

    ``messages`` is what retention keeps (``last_offset - first_offset``); ``behind`` is how
    many durable messages a subscriber has not been sent yet. ``publish_rate`` is messages
    per second over the stats interval (:class:`Rate`: any reader's samples count, so a page
    polled every 2 s shows the last 2 s and a scrape every 15 s the last 15 s); 0 until a
    topic has been sampled twice.
    """
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


def _label(name: bytes) -> str:
    # As every metric label: invalid bytes kept distinct (\xNN), not merged into U+FFFD.
    return name.decode("utf-8", errors="backslashreplace")


def _per_topic(value: Callable[[TopicSnapshot], int]) -> Callable[[Topics], Series]:
    def read(topics: Topics) -> Series:
        return (((_label(t.name),), value(t)) for t in topics)

    return read


# fmt: off
METRICS: tuple[Metric[Topics], ...] = (
    Metric("fq_topic_bytes", "gauge", "Bytes the topic keeps on disk.",
           _per_topic(lambda t: t.size_bytes), labels=("topic",)),
    Metric("fq_topic_first_offset", "gauge",
           "Offset before the oldest retained message (retention moves it up).",
           _per_topic(lambda t: t.first_offset), labels=("topic",)),
    Metric("fq_topic_last_offset", "gauge", "Offset after the newest durable message.",
           _per_topic(lambda t: t.last_offset), labels=("topic",)),
    # The last offset counts every message ever appended, across restarts: a counter.
    Metric("fq_topic_messages", "counter", "Messages appended to the topic (durable).",
           _per_topic(lambda t: t.last_offset), labels=("topic",)),
    Metric("fq_topic_retained_messages", "gauge", "Messages retention keeps.",
           _per_topic(lambda t: t.messages), labels=("topic",)),
    Metric("fq_topic_subscribers", "gauge", "Figg subscribers attached.",
           _per_topic(lambda t: len(t.subscribers)), labels=("topic",)),
    # One series per topic, not per subscriber: subscriber addresses come and go.
    Metric("fq_topic_subscriber_lag_messages", "gauge",
           "Durable messages the furthest-behind subscriber has not been sent (0: none).",
           _per_topic(lambda t: t.max_behind), labels=("topic",)),
)
# fmt: on


def panel(topics: Topics) -> ui.Json | None:
    """A row per topic, its subscribers as chips showing how far behind; hidden while
    there are none. The rate is the page's own, from the last offset between polls."""
    if not topics:
        return None
    subs = sum(len(t.subscribers) for t in topics)
    behind = max((t.max_behind for t in topics), default=0)
    summary: ui.Parts = [ui.n(subs), " subscribers"]
    summary += [", up to ", ui.n(behind), " behind"] if behind else [", all caught up"]
    return {
        "count": ui.count(str(len(topics)), "topic-count"),
        "summary": {"text": summary, "state": "warn" if behind else "ok"},
        "table": {
            "head": ui.head(
                "topic",
                ("size", True),
                ("first offset", True),
                ("last offset", True),
                ("messages", True),
                ("rate", True),
                "subscribers (messages behind)",
            ),
            "key": "topic",
            # In the order the page sorts names: by UTF-16 code unit.
            "rows": sorted((_row(t) for t in topics), key=lambda r: r["key"].encode("utf-16-be")),
        },
    }


def _row(t: TopicSnapshot) -> ui.Json:
    name = t.name.decode("utf-8", errors="replace")
    return {
        "key": name,
        "cells": [
            ui.cell("", name, cls="name", title=name),
            ui.cell("size", [ui.n(t.size_bytes, "bytes")], cls="n"),
            ui.cell("first", str(t.first_offset), cls="n"),
            ui.cell("last", str(t.last_offset), cls="n"),
            ui.cell("messages", [ui.n(t.messages)], cls="n"),
            ui.cell("rate", "", rate=t.last_offset, suffix="/s", cls="n rate"),
            {
                "field": "subscribers",
                "chips": ui.chips("subscribers", (_chip(s) for s in t.subscribers), "none"),
            },
        ],
    }


def _chip(s: TopicSubscriberSnapshot) -> ui.Json:
    return ui.chip(
        [f"{s.remote} · ", ui.n(s.behind)],
        f"{s.remote}: sent up to offset {s.offset}, {s.behind} behind",
        "behind warn" if s.behind > 0 else "",
        {"behind": str(s.behind)},
    )


COUNTERS: Counters[TopicsHost, Topics] = Counters(
    read=take,
    metrics=METRICS,
    key="topics",
    json=stats_json,
    title="Topics",
    panel=panel,
)
