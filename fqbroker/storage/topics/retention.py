"""Retention of a retained topic: whole segments go, oldest first (docs/topics.md).

A topic keeps its messages until retention deletes the segment holding them: while the
topic holds more than its ``retention_bytes``, and once a segment's newest record is older
than its ``retention_seconds`` (the segment file's modification time: it was last written
when that record arrived). The segment being written always stays (its name keeps the
next offset across a restart), and so does any segment with records not yet durable:
readers only ever see durable offsets, and the first offset never passes the last.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fqbroker.storage.store import DiskStore

__all__ = ["enforce"]

log = logging.getLogger(__name__)


def enforce(store: DiskStore, max_bytes: int, max_seconds: float, now: float) -> int:
    """Delete a topic's oversize and expired oldest segments; how many went."""
    segments = store.log.segment_info()
    if len(segments) < 2:
        return 0
    size = store.log.size_bytes
    durable = store.durable_seq
    keep = 0
    for seg in segments[:-1]:
        if seg.end - 1 > durable:
            break
        if size <= max_bytes:
            mtime = seg.mtime()
            if mtime is not None and now - mtime <= max_seconds:
                break
        size -= seg.size
        keep += 1
    if not keep:
        return 0
    before = store.log.first_seq
    freed = store.log.drop_before(segments[keep].first)
    log.info(
        "%s: retention deleted %d segments (%d bytes), offsets %d to %d",
        store.log.directory, keep, freed, before - 1, store.log.first_seq - 1,
    )  # fmt: skip
    return keep
