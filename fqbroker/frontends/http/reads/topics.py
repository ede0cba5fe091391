"""Reads of retained topics by message index, over HTTP (an fqbroker extension).

A topic (:mod:`fqbroker.storage.topics.retained`) is a log nothing consumes, so readers
that keep their own position (the Spark source's topic mode, :mod:`fqbroker.spark`) read it
here, as :mod:`fqbroker.frontends.http.reads.queues` reads a disk queue by position.
docs/http.md, "Topic reads", is the reference; :func:`respond` sums it up.
"""

from __future__ import annotations

import json
from urllib.parse import parse_qs

from fqbroker.frontends.http.host import TopicSource, TopicView
from fqbroker.frontends.http.reads.queues import (
    MAX_READ_BYTES,
    Answer,
    Refused,
    number_param,
    refused_answer,
)
from fqbroker.protocols.replay import CONTENT_TYPE, DEFAULT_READ_BYTES, encode_entry
from fqbroker.storage.store import split_record

__all__ = ["CONTENT_TYPE", "PATHS", "respond"]

PATHS = frozenset({"/topic/info", "/topic/read"})
MAX_TOPIC = 127
_READ_BATCH = 4096  # records per segment-log read; bounds the time one call holds the loop


def respond(broker: TopicSource, path: str, query: str) -> Answer:
    """Answer ``/topic/info`` or ``/topic/read``.

    * ``GET /topic/info?topic=T``: JSON ``{"topic", "first", "next", "size_bytes",
      "subscribers"}``. ``first`` is the topic's first offset and ``next`` its last one, read
      as 0-based message indexes: the oldest retained message has index ``first`` and the
      next message to arrive will have index ``next``. (A message of index ``i`` has Figg
      offset ``i + 1``, the position just past it.) ``subscribers`` counts registered Figg
      readers.
    * ``GET /topic/read?topic=T&from=N&to=M[&max_bytes=B]``: the messages of index ``[N, M)``
      in replay.py's entry format, the entry's u64 being the message index, at most about
      ``B`` bytes of them (always at least one message); the reader asks again from the index
      after the last entry it got. Reading consumes nothing and registers nothing.

    Only durable messages are readable, so an index a reader has seen always names the same
    message. A ``from`` below ``first`` (retention deleted it) is answered 410 with
    ``first``; entries may also skip indexes over damaged records, which a reader tells by
    the index of the first entry. Unknown topics are 404 (with ``"configured": 1``, or 0 when
    the broker keeps no topics at all), bad parameters 400.
    """
    params = {k: v[0] for k, v in parse_qs(query, keep_blank_values=True).items()}
    try:
        name = params.get("topic")
        if not name:
            raise Refused(400, "'topic' parameter is required")
        topic = _topic(broker, name)
        first, end = topic.first_offset, topic.last_offset
        if path == "/topic/info":
            info = {
                "topic": name,
                "first": first,
                "next": end,
                "size_bytes": topic.size_bytes,
                "subscribers": len(topic.subscribers),
            }
            return 200, json.dumps(info).encode() + b"\n", "application/json", []
        start = number_param(params, "from", None)
        stop = number_param(params, "to", end)
        limit = max(1, min(number_param(params, "max_bytes", DEFAULT_READ_BYTES), MAX_READ_BYTES))
        if start < first:
            raise Refused(410, f"index {start} is gone: the topic starts at {first}", first=first)
        positions = [(b"x-fq-first", b"%d" % first), (b"x-fq-next", b"%d" % end)]
        return 200, _read(topic, start, min(stop, end), limit), CONTENT_TYPE, positions
    except Refused as exc:
        return refused_answer(exc)


def _topic(broker: TopicSource, name: str) -> TopicView:
    raw = name.encode()
    topics = broker.topics
    if len(raw) > MAX_TOPIC:
        raise Refused(400, f"a topic name is at most {MAX_TOPIC} bytes")
    topic = None if topics is None else topics.get(raw)
    if topic is None:
        why = "" if topics is not None else " (the Figg listener is not configured)"
        raise Refused(404, f"Cannot find topic '{name}'{why}", configured=int(topics is not None))
    if topic.closed:  # a request racing the broker's stop: its files are going away
        raise Refused(503, f"topic '{name}' is closing: the broker is stopping")
    return topic


def _read(topic: TopicView, start: int, stop: int, limit: int) -> bytes:
    # Index i is log seq i + 1. Read from the segment log itself, not Topic.read: the
    # records carry the arrival time the entries (and Spark's timestamp column) report.
    # In the event loop, as replay.py reads: the segment log is not thread-safe.
    log = topic.store.log
    parts: list[bytes] = []
    seq, last, size = start + 1, stop, 0
    while seq <= last and size < limit:
        records = log.read(seq, min(last - seq + 1, _READ_BATCH), limit - size)
        if not records:
            break
        for rseq, record in records:
            if rseq > last:  # past a skipped range
                return b"".join(parts)
            arrival, frame = split_record(record)
            entry = encode_entry(rseq - 1, arrival, frame)
            parts.append(entry)
            size += len(entry)
        seq = records[-1][0] + 1
    # The next range a reader asks for goes into the page cache meanwhile (coldread.py).
    topic.store.replay_ahead.after_read(log.position(seq))
    return b"".join(parts)
