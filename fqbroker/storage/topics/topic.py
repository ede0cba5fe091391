"""One retained topic: a never-consumed disk store read by offset (docs/topics.md).

Reads return durable messages only, from the store's in-memory cache of its newest frames
when the range is there (live readers), else from the segment files
(:meth:`SegmentLog.read_run`, checked as read); either way a batch costs a few C-level
list operations, not Python work per message. Retention (:mod:`.retention`) deletes whole
segments; nothing else does, since no reader ever sets a checkpoint the store's trim
would act on.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate, islice
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from fqbroker.storage.segments.log import SegmentLog
from fqbroker.storage.store import DiskStore, FsyncPolicy
from fqbroker.storage.topics.retention import enforce

if TYPE_CHECKING:
    from fqbroker.core.budget import MemoryBudget
    from fqbroker.storage.diskalarm import DiskAlarm

__all__ = ["RECENT_BYTES", "Topic", "TopicConfig", "TopicReader"]

# Per topic: live readers a little behind read from here. Less than a queue's cache, since
# nothing drains it: it holds memory (counted in the budget) until the topic goes idle.
RECENT_BYTES = 4 << 20
_TAG = 9  # a record's version byte and arrival time before the frame (store.py)


class TopicReader(Protocol):
    """A subscriber, as stats see it: where it is and who it is."""

    @property
    def offset(self) -> int: ...

    @property
    def remote(self) -> str: ...


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """What topics need of the settings, handed in by whoever reads them (the Figg front
    end's section): storage reads no settings table of its own."""

    directory: Path  # one directory per topic under it
    exchange: bytes  # the fq exchange topics share (route = topic name)
    max_topics: int
    segment_bytes: int
    fsync: str  # an FsyncPolicy's value
    fsync_interval_ms: float
    retention: Callable[[bytes], tuple[int, float]]  # a topic's (bytes, seconds)


class Topic:
    """One retained topic."""

    def __init__(
        self,
        name: bytes,
        directory: Path,
        config: TopicConfig,
        dirty: set[DiskStore] | None = None,
        budget: MemoryBudget | None = None,
        alarm: DiskAlarm | None = None,
    ) -> None:
        self.name = name
        self.store = DiskStore(
            SegmentLog(directory, segment_bytes=config.segment_bytes),
            policy=FsyncPolicy(config.fsync),
            interval_ms=config.fsync_interval_ms,
            dirty=dirty,
            budget=budget,
            alarm=alarm,
        )
        self.store.recent_limit = RECENT_BYTES
        self.retention_bytes, self.retention_seconds = config.retention(name)
        self.messages_in = 0  # appended since open
        self.segments_deleted = 0  # by retention, since open
        self.subscribers: set[TopicReader] = set()
        self.closed = False
        self.appended = False  # since the last retention pass: not idle

    def __repr__(self) -> str:
        return f"<Topic {self.name!r} [{self.first_offset}, {self.last_offset}]>"

    # --- positions ------------------------------------------------------------------------

    @property
    def first_offset(self) -> int:
        """The offset before the oldest retained message."""
        return min(self.store.log.first_seq - 1, self.store.durable_seq)

    @property
    def last_offset(self) -> int:
        """The offset after the newest durable message."""
        return self.store.durable_seq

    @property
    def size_bytes(self) -> int:
        return self.store.size_bytes

    def start_offset(self, requested: int | None) -> int:
        """Where an ATTACH starts: None is the end (latest); an expired offset is the
        oldest message kept; one past the end is the end."""
        last = self.last_offset
        if requested is None or requested >= last:
            return last
        return max(requested, self.first_offset)

    # --- writing --------------------------------------------------------------------------

    def append(self, frames: list[bytes]) -> None:
        """Append peer frames; the publisher's flush writes them, its durable() syncs."""
        self.store.extend(frames)
        self.messages_in += len(frames)
        self.appended = True

    # --- reading --------------------------------------------------------------------------

    def read(
        self, after: int, max_records: int = 4096, max_bytes: int = 1 << 20
    ) -> list[tuple[int, bytes]]:
        """Durable messages with offset > ``after`` as (offset, peer frame), in order; []
        when caught up. At least one when there is one, however large. From the oldest
        kept if ``after`` expired; offsets jump over damaged records."""
        start, frames, records = self._read(after, max_records, max_bytes)
        if records is not None:
            return records
        return list(zip(range(start, start + len(frames)), frames, strict=True))

    def read_frames(
        self, after: int, max_records: int = 4096, max_bytes: int = 1 << 20
    ) -> tuple[int, list[bytes]]:
        """As :meth:`read`, as the offset of the first and the peer frames of consecutive
        offsets from it: a subscription's batch, with no (offset, frame) pair made a
        message. Where damage was stepped over, up to the first offset skipped (the next
        read goes on from there)."""
        start, frames, records = self._read(after, max_records, max_bytes)
        if records is None:
            return start, frames
        if not records:
            return start, []
        first = records[0][0]
        k = 1
        while k < len(records) and records[k][0] == first + k:
            k += 1
        return first, [frame for _, frame in records[:k]]

    def _read(
        self, after: int, max_records: int, max_bytes: int
    ) -> tuple[int, list[bytes], list[tuple[int, bytes]] | None]:
        """(start, frames from start on, None), or, where the careful read stepped over
        damage, (start, [], its (offset, frame) records)."""
        start = after + 1
        if self.closed:
            return start, [], None
        store = self.store
        last = store.durable_seq
        if start > last or max_records <= 0:
            return start, [], None
        start = max(start, store.log.first_seq)
        n = min(max_records, last - start + 1)
        if n <= 0:
            return start, [], None
        first_cached, recent = store.recent()
        if recent and start >= first_cached:
            frames = _slice(recent, start - first_cached, n)
            if frames:
                return start, _fit(frames, max_bytes), None
        return self._read_file(start, n, max_bytes, last)

    def _read_file(
        self, start: int, n: int, max_bytes: int, last: int
    ) -> tuple[int, list[bytes], list[tuple[int, bytes]] | None]:
        store = self.store
        log = store.log
        # Every topic record has the arrival tag (topics are younger than it: store.py).
        frames = log.read_run(start, n, max_bytes, _TAG)
        if frames:
            frames = _fit(frames, max_bytes)
            store.replay_ahead.after_read(log.position(start + len(frames)))
            return start, frames, None
        # A gap or damage where it starts: the careful read steps over it.
        records = log.read(start, n, max_bytes)
        if records and records[-1][0] > last:  # stepped over damage, past the durable
            records = records[: bisect_right(records, last, key=_seq)]
        if not records:
            return start, [], None
        out = [(seq, record[_TAG:]) for seq, record in records]
        store.replay_ahead.after_read(log.position(out[-1][0] + 1))
        return start, [], out

    async def wait_beyond(self, offset: int) -> None:
        """Return once ``last_offset`` > ``offset``, or the topic is closing (``closed``)."""
        store = self.store
        while not self.closed and store.durable_seq <= offset:
            await store.wait_durable_change(offset)

    def enforce_retention(self, now: float) -> int:
        """Delete the oversize and expired oldest segments; how many went."""
        if self.closed:
            return 0
        gone = enforce(self.store, self.retention_bytes, self.retention_seconds, now)
        self.segments_deleted += gone
        return gone

    # --- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        """Write and sync what was appended, close the files, wake every waiter."""
        if self.closed:
            return
        self.closed = True
        self.store.wake()
        self.store.close(destroy=False)


def _seq(record: tuple[int, bytes]) -> int:
    return record[0]


def _slice(recent: deque[bytes], index: int, n: int) -> list[bytes]:
    """``recent[index : index + n]``, walking in from the nearer end: live readers read
    the newest frames, and a walk from the left would step over the whole cache each time."""
    tail = len(recent) - index
    if tail > index:
        return list(islice(recent, index, index + n))
    frames = list(islice(reversed(recent), max(0, tail - n), tail))
    frames.reverse()
    return frames


def _fit(frames: list[bytes], max_bytes: int) -> list[bytes]:
    """The leading frames within ``max_bytes``; the first one whatever its size."""
    if len(frames) > 1 and sum(map(len, frames)) > max_bytes:
        keep = bisect_right(list(accumulate(map(len, frames))), max_bytes)
        return frames[: max(1, keep)]
    return frames
