"""Replay reads of disk queues by position, over HTTP (an fqbroker extension; fq has none).

fq's data socket hands each message to one consumer and forgets it, so a reader that must
read a range again after a failure (the Spark source in :mod:`fqbroker.spark`) cannot be
built on it. A permanent disk queue is a log with dense sequence numbers, though, so two
read-only endpoints give such readers what they need: docs/http.md, "Replay reads", is the
reference, and :func:`respond` sums it up.
"""

from __future__ import annotations

import json
from urllib.parse import parse_qs

from fqbroker.core.frames import place_seq
from fqbroker.core.queuespec import QueueKind
from fqbroker.frontends.http.host import QueueSource
from fqbroker.protocols.replay import CONTENT_TYPE, DEFAULT_READ_BYTES, encode_entry
from fqbroker.storage.store import DiskStore, split_record

__all__ = [
    "PATHS",
    "Answer",
    "Refused",
    "number_param",
    "refused_answer",
    "respond",
]

PATHS = frozenset({"/queue/info", "/queue/read"})
MAX_READ_BYTES = 64 << 20
_READ_BATCH = 4096  # records per segment-log read; bounds the time one call holds the loop

# (status, body, content type, extra headers): what http.py turns into its reply.
Answer = tuple[int, bytes, str, list[tuple[bytes, bytes]]]


class Refused(Exception):
    """A read refused with an HTTP status and a JSON error (extra keys beside it)."""

    def __init__(self, status: int, text: str, **extra: int) -> None:
        super().__init__(text)
        self.status = status
        self.text = text
        self.extra = extra


def respond(broker: QueueSource, path: str, query: str) -> Answer:
    """Answer ``/queue/info`` or ``/queue/read``.

    * ``GET /queue/info?queue=Q``: JSON ``{"queue", "first", "next", "checkpoints"}``, the
      oldest stored sequence number, the one after the newest readable record, and the named
      checkpoints.
    * ``GET /queue/read?queue=Q&from=N&to=M[&max_bytes=B]``: records ``[N, M)`` as a body of
      entries (below), at most about ``B`` bytes of them; the reader asks again from the seq
      after the last entry it got. Reading consumes nothing and moves no checkpoint.

    Only durable records are readable (what survives a crash under the queue's fsync
    policy): a sequence number a reader has seen is never given out again for another
    message.

    An entry is ``u64 seq, u64 arrival time in microseconds (0: not recorded), u32 length``
    and then the message as the data socket delivers it: fq's peer-format frame, with bytes
    8-15 of the message id holding the seq. The entry format:
    :mod:`fqbroker.protocols.replay`.
    """
    params = {k: v[0] for k, v in parse_qs(query, keep_blank_values=True).items()}
    try:
        name = params.get("queue")
        if not name:
            raise Refused(400, "'queue' parameter is required")
        store = _disk_store(broker, name)
        first, end = store.log.first_seq, store.durable_seq + 1
        if path == "/queue/info":
            info = {
                "queue": name,
                "first": first,
                "next": end,
                "checkpoints": dict(store.log.checkpoints),
            }
            return 200, json.dumps(info).encode() + b"\n", "application/json", []
        start = number_param(params, "from", None)
        stop = number_param(params, "to", end)
        limit = max(1, min(number_param(params, "max_bytes", DEFAULT_READ_BYTES), MAX_READ_BYTES))
        if start < first:
            raise Refused(410, f"seq {start} is gone: the queue starts at {first}", first=first)
        positions = [(b"x-fq-first", b"%d" % first), (b"x-fq-next", b"%d" % end)]
        return 200, _read(store, start, min(stop, end), limit), CONTENT_TYPE, positions
    except Refused as exc:
        return refused_answer(exc)


def _disk_store(broker: QueueSource, name: str) -> DiskStore:
    queue = broker.queues.get(name.encode())
    if queue is None:
        raise Refused(404, f"Cannot find registered queue '{name}'")
    if queue.kind is not QueueKind.DISK or not isinstance(queue.store, DiskStore):
        raise Refused(400, f"'{name}' is not a disk queue")
    return queue.store


def refused_answer(exc: Refused) -> Answer:
    body = json.dumps({"error": exc.text, **exc.extra}).encode() + b"\n"
    return exc.status, body, "application/json", []


def number_param(params: dict[str, str], key: str, default: int | None) -> int:
    """A position parameter: a u64 in decimal, or ``default`` when absent (None: required)."""
    text = params.get(key)
    if text is None and default is not None:
        return default
    # Positions are u64: 20 digits at most, and int() of thousands of them raises.
    if text is None or not text.isdigit() or not text.isascii() or len(text) > 20:
        raise Refused(400, f"'{key}' must be a non-negative integer")
    return int(text)


def _read(store: DiskStore, start: int, stop: int, limit: int) -> bytes:
    # In the event loop, as the store's own reads: the segment log is not thread-safe, and
    # it checks every record. What a reader asks next (the range after this one) is read
    # into the page cache meanwhile by a worker thread (storage/segments/coldread.py), so the loop
    # does not wait for the disk on it.
    parts: list[bytes] = []
    seq, size = start, 0
    while seq < stop and size < limit:
        records = store.log.read(seq, min(stop - seq, _READ_BATCH), limit - size)
        if not records:
            break
        for rseq, record in records:
            if rseq >= stop:  # past a skipped range (docs/disk-format.md, "Recovery")
                return b"".join(parts)
            arrival, frame = split_record(record)
            entry = encode_entry(rseq, arrival, place_seq(frame, rseq))
            parts.append(entry)
            size += len(entry)
        seq = records[-1][0] + 1
    store.replay_ahead.after_read(store.log.position(seq))
    return b"".join(parts)
