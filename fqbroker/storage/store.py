"""Disk-queue storage: a segment log under asyncio, with group commit (fqd_queue_jlog.c).

A :class:`DiskStore` is the core's ``Store`` protocol over a
:class:`~fqbroker.storage.segments.log.SegmentLog`: appends are written with one ``write()``
per store when the publisher that made them flushes, and made durable by a background
fsync task under the store's fsync policy; consumers read from a cursor, and the read
checkpoint ``fq`` moves only when they ack. docs/confirms.md says what each policy keeps
and what a failed fsync does; docs/disk-format.md has the records and the checkpoints.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import struct
import time
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from fqbroker.core.dedup import SCOPE, DedupLimits, Window, current, dedup_key, now_us
from fqbroker.core.frames import frame_length, frame_seq, place_seq
from fqbroker.storage.segments.coldread import ReadAhead
from fqbroker.storage.segments.log import SegmentLog

if TYPE_CHECKING:
    from fqbroker.core.budget import MemoryBudget
    from fqbroker.core.queue import Queue
    from fqbroker.settings.broker import Settings
    from fqbroker.storage.diskalarm import DiskAlarm

__all__ = [
    "DiskStore",
    "FsyncPolicy",
    "disk_log",
    "open_disk_store",
    "rewind_queue",
    "split_record",
]

log = logging.getLogger(__name__)

READER = "fq"  # the broker's own checkpoint, as jlog's subscriber "fq"
# Written frames not yet taken are kept in memory up to this many bytes, so consumers
# that keep up (or nearly: within a few socket buffers) never read the file back.
RECENT_BYTES = 8 << 20
_RETRY_FIRST, _RETRY_MAX = 0.1, 5.0  # seconds between attempts to repair a failed log
_TAG = struct.Struct(">BQ")  # record version, arrival time in microseconds
RECORD_V1 = 0x81
# The same, for a message whose publisher opted in to de-duplication (core/dedup.py): what
# a queue's window is read back from when it is first needed after the queue was opened.
RECORD_ONCE = 0x82
_WINDOW_READ = 4096  # records read at a time while a window is rebuilt


class FsyncPolicy(StrEnum):
    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"


def queue_directory(queue_dir: Path, name: bytes) -> Path:
    """fqd names a queue's directory by the lowercase hex of its name
    (docs/fq-protocol.md §3.3)."""
    return queue_dir / name.hex()


def open_disk_store(
    settings: Settings,
    name: bytes,
    policy: str | None = None,
    dirty: set[DiskStore] | None = None,
    budget: MemoryBudget | None = None,
    alarm: DiskAlarm | None = None,
) -> DiskStore:
    directory = queue_directory(Path(settings.queue_dir), name)
    return DiskStore(
        SegmentLog(directory, segment_bytes=settings.segment_bytes),
        policy=FsyncPolicy(policy or settings.fsync),
        interval_ms=settings.fsync_interval_ms,
        dirty=dirty,
        budget=budget,
        alarm=alarm,
    )


def disk_store(queue: Queue) -> DiskStore:
    """The store of a disk queue; TypeError for any other queue."""
    store = queue.store
    if not isinstance(store, DiskStore):
        raise TypeError(f"queue {queue.name!r} is not a disk queue")
    return store


def disk_log(queue: Queue) -> SegmentLog:
    """The segment log of a disk queue; TypeError for any other queue."""
    return disk_store(queue).log


def rewind_queue(queue: Queue, seq: int) -> None:
    """Deliver a disk queue's messages again from ``seq`` (reset to a named checkpoint)."""
    disk_store(queue).rewind(seq)
    queue.refilled()


def encode_records(
    frames: list[bytes], arrival_us: int, once: Sequence[tuple[int, int]] = ()
) -> list[bytes]:
    """The records of frames that arrived together: one tag, put before each; the frames
    in the ``once`` ranges [start, stop) get the tag of opted-in messages."""
    tag = _TAG.pack(RECORD_V1, arrival_us)
    records = [tag + frame for frame in frames]
    if once:
        tag = _TAG.pack(RECORD_ONCE, arrival_us)
        for start, stop in once:
            records[start:stop] = [tag + frame for frame in frames[start:stop]]
    return records


def split_record(record: bytes) -> tuple[int | None, bytes]:
    """(arrival time in microseconds or None if not recorded, peer frame) of a record."""
    if record[:1] < b"\x80":
        return None, record
    if record[0] != RECORD_V1 and record[0] != RECORD_ONCE:
        raise ValueError(f"unknown record version 0x{record[0]:02x}")
    return _TAG.unpack_from(record)[1], record[_TAG.size :]


def _delivered(seq: int, record: bytes) -> bytes:
    """The frame a consumer receives for a stored record: its position in the id."""
    frame = split_record(record)[1]
    try:
        whole = frame_length(frame) == len(frame)
    except (IndexError, struct.error):
        whole = False
    if not whole:
        raise ValueError(f"record {seq} is not a message")
    return place_seq(frame, seq)


class DiskStore:
    """The messages of one disk queue.

    Appends are buffered and written by :meth:`flush`: every publisher flushes the
    broker's dirty stores before it next awaits, so a write error is reported to the
    publisher whose messages it concerns. Durability then follows the fsync policy:
    ``always``, a background task fsyncs after every write, in a worker thread, and
    writes that arrive during an fsync are covered by the next one (group commit);
    ``interval``, the same task fsyncs at most every ``fsync_interval_ms``; ``never``,
    the OS decides. :meth:`wait_durable` is what publisher confirms wait on. A failed
    fsync may have lost anything written since the last good one (Linux drops the failed
    pages), so its waiters get False at once, and the log refuses writes until the sync
    task has repaired it (rewritten that tail from the page cache) and synced again.

    Consumers read without consuming: :meth:`take` hands out records from a cursor, and
    the durable read checkpoint ``fq`` moves only when :meth:`ack` says they reached a
    consumer's socket. After a crash at most the batches in flight are delivered again,
    never lost (fqd moves its checkpoint when it reads). Each delivered id carries the
    record's seq in bytes 8-15 (``LOG:MARKER`` in checkpoint terms).

    While the broker's disk ``alarm`` is raised (free space below ``disk_free_limit``),
    :meth:`flush` writes nothing and fails as a full disk would (``ENOSPC``), before the
    disk is full: the publisher is told as of any failed write.
    """

    def __init__(
        self,
        segment_log: SegmentLog,
        *,
        policy: FsyncPolicy = FsyncPolicy.INTERVAL,
        interval_ms: float = 5.0,
        dirty: set[DiskStore] | None = None,
        budget: MemoryBudget | None = None,
        alarm: DiskAlarm | None = None,
    ) -> None:
        self.log = segment_log
        self.alarm = alarm
        self.policy = policy
        self.interval = interval_ms / 1000
        self._dirty = dirty if dirty is not None else set()
        self._pending: list[bytes] = []
        # De-duplication (core/dedup.py): the queue's window once an opted-in publisher
        # first sent to it, and which pending frames are such a publisher's.
        self.window: Window | None = None
        self._pending_once: list[tuple[int, int]] = []
        # The frames last written, the newest at ``written_seq``: a consumer that keeps
        # up gets them from here instead of reading them back from the file.
        self._recent: collections.deque[bytes] = collections.deque()
        self._recent_seq = 0  # the seq of _recent[0]
        self._recent_bytes = 0
        self.recent_limit = RECENT_BYTES  # the cache's bytes at most
        self._budget = budget  # counts the cache (docs/memory.md)
        self._cursor = segment_log.checkpoints.get(READER, segment_log.first_seq)
        # Batches handed to consumers and not yet acknowledged: [first, last, acked].
        self._in_flight: collections.deque[list[int]] = collections.deque()
        self._durable = segment_log.next_seq - 1  # what recovery found is on disk
        self._failed_through = 0  # seqs up to here were written before a failed fsync
        # Replaced, not cleared, on every change: each waiter holds the one it saw.
        self._durable_changed = asyncio.Event()
        self._sync_task: asyncio.Task[None] | None = None
        self._wrote = asyncio.Event()
        self.write_errors = 0
        # For /metrics (docs/http.md): count and running sum make a summary's mean.
        self.fsync_seconds = 0.0  # the latest sync's duration
        self.fsync_seconds_total = 0.0
        self.fsyncs = 0
        self.fsync_errors = 0
        self._retry = 0.0  # the next wait before repairing a failed log; 0 while healthy
        self._repair_failed = False
        # Readers behind the memory read the file: the consumers' cursor, and replay reads.
        self.read_ahead = ReadAhead()
        self.replay_ahead = ReadAhead()

    # --- sizes ----------------------------------------------------------------------------

    def __len__(self) -> int:
        """Messages not yet handed to a consumer: the queue's backlog."""
        cursor = max(self._cursor, self.log.first_seq)
        return self.log.next_seq + len(self._pending) - cursor - self.log.skipped_from(cursor)

    @property
    def size_bytes(self) -> int:
        return self.log.size_bytes

    @property
    def corrupt_records(self) -> int:
        """Records skipped over damage since the queue was opened (its recovery's too)."""
        return self.log.corrupt_records

    @property
    def corrupt_bytes(self) -> int:
        return self.log.corrupt_bytes

    @property
    def held_bytes(self) -> int:
        """What it holds in memory: its cache of written frames (docs/memory.md)."""
        return self._recent_bytes

    def extend(self, frames: list[bytes], size: int = -1) -> None:
        pending = self._pending
        if SCOPE and current() is not None:
            start = len(pending)
            self._pending_once.append((start, start + len(frames)))
        pending.extend(frames)
        self._dirty.add(self)

    # --- de-duplication -------------------------------------------------------------------

    def open_window(self, limits: DedupLimits) -> Window:
        """The queue's window, read back from the opted-in records of its log's tail: the
        ids a queue remembers are kept with the messages they guard, and survive a
        restart as long as those records are in the log."""
        window = Window(limits)
        window.on_repeat = self._repeated
        now = now_us()
        cutoff = now - limits.span_us
        found: list[tuple[int, bytes]] = []  # (arrival, key), newest segment first
        log = self.log
        for first in reversed(log.segment_firsts()):
            batch: list[tuple[int, bytes]] = []
            oldest = now
            seq = max(first, log.first_seq)
            stop = log.segment_end(first)
            while seq < stop:
                records = log.read(seq, min(_WINDOW_READ, stop - seq))
                if not records:
                    break
                for _, record in records:
                    if record[:1] == b"\x82" or record[:1] == b"\x81":
                        arrival = _TAG.unpack_from(record)[1]
                        oldest = min(oldest, arrival)
                        if record[0] == RECORD_ONCE and arrival > cutoff:
                            batch.append((arrival, dedup_key(record[_TAG.size :])))
                seq = records[-1][0] + 1
            found = batch + found
            if oldest <= cutoff or len(found) >= limits.ids:
                break
        for arrival, key in found[-limits.ids :]:
            window.add(key, arrival)
        self.window = window
        return window

    def _repeated(self) -> None:
        # A repeat is confirmed once the original is durable: its publisher waits for
        # this store's next fsync, as if it had written to it.
        self._dirty.add(self)

    def _forget_once(self, frames: list[bytes]) -> None:
        """Opted-in frames that were not written: sent again, they must get in."""
        ranges, self._pending_once = self._pending_once, []
        if self.window is not None:
            for start, stop in ranges:
                self.window.forget(frames[start:stop])

    # --- writing --------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Messages appended and not yet written."""
        return len(self._pending)

    def flush(self) -> None:
        """Write what was appended; raises OSError (and drops the batch) if the disk fails."""
        self._dirty.discard(self)
        frames, self._pending = self._pending, []
        if not frames:
            return
        alarm = self.alarm
        if alarm is not None and alarm.raised:
            self._forget_once(frames)
            raise alarm.refused(len(frames))  # nothing written: not a write error
        # Arrival is when the publisher's read is written: the same loop turn it was read.
        first = self.log.next_seq
        once, self._pending_once = self._pending_once, []
        try:
            self.log.append(encode_records(frames, time.time_ns() // 1000, once))
        except OSError:
            self._pending_once = once
            self._forget_once(frames)
            self.write_errors += len(frames)
            if alarm is not None:
                alarm.failed()  # a full disk, perhaps: look now, not in a second
            raise
        self._remember(first, frames)
        if self.policy is FsyncPolicy.NEVER:
            self._set_durable(self.log.next_seq - 1)
        else:
            self._start_syncing()
            self._wrote.set()

    @property
    def written_seq(self) -> int:
        return self.log.next_seq - 1

    @property
    def durable_seq(self) -> int:
        """The highest seq that survives a crash under the fsync policy."""
        return self._durable

    async def wait_durable(self, seq: int) -> bool:
        """Wait until ``seq`` is durable: True; False if an fsync meant to cover it failed."""
        while self._durable < seq:
            if seq <= self._failed_through:
                return False
            await self._durable_changed.wait()
        return True

    async def wait_durable_change(self, seq: int) -> None:
        """Return once ``durable_seq`` is past ``seq``, or at the next change or :meth:`wake`
        (callers check again): what readers that never take (topics) wait on."""
        if self._durable <= seq:
            await self._durable_changed.wait()

    def wake(self) -> None:
        """Wake everyone waiting for durability to change (a reader that is closing)."""
        self._wake_waiters()

    def _set_durable(self, seq: int) -> None:
        if seq > self._durable:
            self._durable = seq
            self._wake_waiters()

    def _wake_waiters(self) -> None:
        changed, self._durable_changed = self._durable_changed, asyncio.Event()
        changed.set()

    def _start_syncing(self) -> None:
        if self._sync_task is None or self._sync_task.done():
            self._sync_task = asyncio.get_running_loop().create_task(self._sync_loop())

    async def _sync_loop(self) -> None:
        while True:
            await self._wrote.wait()
            self._wrote.clear()
            try:
                durable, seconds = await asyncio.to_thread(self._timed_sync)
            except OSError as exc:
                await self._sync_failed(exc)
                continue
            if self._retry:
                self._retry, self._repair_failed = 0.0, False
                log.warning("fsync in %s works again", self.log.directory)
            self.fsync_seconds = seconds
            self.fsync_seconds_total += seconds
            self.fsyncs += 1
            self._set_durable(durable)
            if self.policy is FsyncPolicy.INTERVAL:
                await asyncio.sleep(max(0.0, self.interval - self.fsync_seconds))

    def _timed_sync(self) -> tuple[int, float]:
        # Timed in the worker thread: the wait for a free thread is not fsync time.
        start = time.perf_counter()
        durable = self.log.sync()
        return durable, time.perf_counter() - start

    async def _sync_failed(self, exc: OSError) -> None:
        """Fail the waiters of what the failed sync covered, then repair the log."""
        self.fsync_errors += 1
        unsure = self.log.next_seq - 1  # the log takes no more writes: this is all of it
        if unsure > self._failed_through:
            self._failed_through = unsure
            self._wake_waiters()
        if not self._retry:
            # Once per outage: while the disk keeps failing, every retry would say the same.
            log.error(
                "fsync failed in %s: %s; %d messages written since the last good fsync are "
                "not confirmed, and the queue takes no writes until an fsync succeeds "
                "(retrying)", self.log.directory, exc, max(0, unsure - self._durable),
            )  # fmt: skip
            self._retry = _RETRY_FIRST
        while True:
            await asyncio.sleep(self._retry)
            self._retry = min(self._retry * 2, _RETRY_MAX)
            try:
                await asyncio.to_thread(self.log.repair)  # reads from a failing disk may hang
            except OSError as repair_exc:
                # Damaged records stay damaged: then only a restart (recovery) gets past them.
                report = log.debug if self._repair_failed else log.warning
                report("cannot repair %s yet: %s", self.log.directory, repair_exc)
                self._repair_failed = True
                continue
            self._wrote.set()  # sync what repair wrote again
            return

    # --- reading --------------------------------------------------------------------------

    def take(self, n: int) -> list[bytes]:
        if self._pending:
            with contextlib.suppress(OSError):  # the publisher saw the error already
                self.flush()
        # Named checkpoints alone may have trimmed past a reader that never read.
        cursor = self._cursor = max(self._cursor, self.log.first_seq)
        frames = self._take_recent(cursor, n)
        if frames:
            out = [place_seq(frame, seq) for seq, frame in enumerate(frames, cursor)]
            last = cursor + len(out) - 1
        else:
            records = self.log.read(cursor, n)  # seqs may skip damage (docs/disk-format.md)
            if not records:
                if self.log.skipped_from(cursor) >= self.log.next_seq - cursor > 0:
                    self._cursor = self.log.next_seq  # what is left was all skipped
                return []
            out = [_delivered(seq, record) for seq, record in records]
            cursor, last = records[0][0], records[-1][0]
            self.read_ahead.after_read(self.log.position(last + 1))
        self._cursor = last + 1
        self._in_flight.append([cursor, last, 0])
        return out

    def _remember(self, first: int, frames: list[bytes]) -> None:
        before = self._recent_bytes
        budget = self._budget
        if budget is not None and not budget.fits(sum(map(len, frames))):
            # The cache only saves reading the file back: it gives way to publishers
            # rather than slowing them (docs/memory.md).
            self._recent.clear()
            self._recent_bytes = 0
            budget.release(before)
            return
        self._cache(first, frames)
        if budget is not None:
            budget.used += self._recent_bytes - before

    def recent(self) -> tuple[int, collections.deque[bytes]]:
        """(seq of the first, frames): the newest written frames, still in memory. Readers
        that never take (topics) read them in place; the deque is the store's own."""
        return self._recent_seq, self._recent

    def drop_recent(self) -> None:
        """Give the cache's memory back (an idle topic's readers have what it holds)."""
        self._recent.clear()
        if self._budget is not None:
            self._budget.release(self._recent_bytes)
        self._recent_bytes = 0

    def _take_recent(self, cursor: int, n: int) -> list[bytes]:
        """Up to ``n`` frames from ``cursor`` on out of memory; none if not all there."""
        before = self._recent_bytes
        frames = self._uncache(cursor, n)
        if self._budget is not None and before != self._recent_bytes:
            self._budget.release(before - self._recent_bytes)
        return frames

    def _cache(self, first: int, frames: list[bytes]) -> None:
        recent = self._recent
        if not recent:
            self._recent_seq = first
        recent.extend(frames)
        self._recent_bytes += sum(map(len, frames))
        while self._recent_bytes > self.recent_limit and recent:
            self._recent_bytes -= len(recent.popleft())
            self._recent_seq += 1

    def _uncache(self, cursor: int, n: int) -> list[bytes]:
        recent = self._recent
        popleft = recent.popleft
        while recent and self._recent_seq < cursor:  # taken already: not needed again
            self._recent_bytes -= len(popleft())
            self._recent_seq += 1
        if not recent or self._recent_seq != cursor:
            return []  # behind the memory: read the file until caught up
        n = min(n, len(recent))
        frames = [popleft() for _ in range(n)]
        self._recent_bytes -= sum(map(len, frames))
        self._recent_seq += n
        return frames

    def take_out(self, n: int) -> tuple[int, list[bytes | bytearray]]:
        """:meth:`take` as the Store protocol hands out: (how many, frames)."""
        frames: list[bytes | bytearray] = list(self.take(n))
        return len(frames), frames

    def ack(self, frames: Sequence[bytes | bytearray]) -> None:
        """The consumer's socket has these; the read checkpoint may move past them."""
        head = frames[0]  # the frames take() gave: bytes, each its own
        first = frame_seq(head if isinstance(head, bytes) else bytes(head))
        for batch in self._in_flight:
            if batch[0] == first:
                batch[2] = 1
                break
        while self._in_flight and self._in_flight[0][2]:
            self._in_flight.popleft()
        checkpoint = self._in_flight[0][0] if self._in_flight else self._cursor
        if checkpoint > self.log.checkpoints.get(READER, 0):
            self.log.set_checkpoint(READER, checkpoint)
            self.log.trim()

    def peek(self, n: int) -> list[bytes]:
        """The next ``n`` frames :meth:`take` would hand out, read without moving the
        cursor, a checkpoint or the memory cache; messages not yet written come last."""
        cursor = max(self._cursor, self.log.first_seq)
        out: list[bytes] = []
        if cursor < self.log.next_seq:
            # log.read steps over damage as take does, so the seqs are the ones delivered.
            out = [_delivered(seq, record) for seq, record in self.log.read(cursor, n)]
        return out + self._pending[: n - len(out)]

    def purge(self) -> int:
        """Skip the backlog: the read checkpoint ``fq`` moves to the end of the log and
        segments no checkpoint needs are deleted. Named checkpoints do not move, so a
        reader resetting to one (or a replay) still finds what it had not read."""
        with contextlib.suppress(OSError):  # the publisher saw the error already
            self.flush()
        n = len(self)
        self.rewind(self.log.next_seq)
        self.drop_recent()
        self.log.trim()
        return n

    def unsynced(self) -> bool:
        return bool(self._pending) or self._durable < self.log.next_seq - 1

    def rewind(self, seq: int) -> None:
        """Deliver again from ``seq`` (reset to a named checkpoint)."""
        self._in_flight.clear()
        self._cursor = max(seq, self.log.first_seq)
        self.log.set_checkpoint(READER, self._cursor)

    # --- lifetime -------------------------------------------------------------------------

    def close(self, *, destroy: bool) -> None:
        self.read_ahead.close()
        self.replay_ahead.close()
        if self._budget is not None:
            self._budget.release(self._recent_bytes)
            self._budget = None
        if self._sync_task is not None:
            self._sync_task.cancel()
        self._dirty.discard(self)
        if destroy:
            written = self.written_seq
            self.log.destroy()
            # The queue is gone with what it held, as a memory queue goes: confirms waiting
            # on it have nothing left to wait for, and would otherwise wait forever.
            self._set_durable(written)
            return
        with contextlib.suppress(OSError):
            self.flush()
        try:
            self._set_durable(self.log.sync())
        except OSError:
            self._failed_through = max(self._failed_through, self.written_seq)
            self._wake_waiters()
        self.log.close()
