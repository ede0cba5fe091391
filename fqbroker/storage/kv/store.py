"""The OpenCluster listener's key/value store: memory for reads, a journal for acks.

Every get is answered from a dict in memory; the disk is read only at startup. Sets
change the dict at once and join the open :class:`Batch`: every set of one turn of the
event loop is one journal append (:mod:`.kvjournal`), written and fdatasynced in the
store's journal thread, and acknowledged only once written (group commit). The journals
fold into sqlite (:mod:`.kvsqlite`) in the background. docs/opencluster.md says what an
ack promises, and under "On disk" how the store keeps it.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import sqlite3
import struct
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

from fqbroker.accel import ACCELERATED
from fqbroker.errors import KVStoreError
from fqbroker.storage.diskalarm import DiskAlarm
from fqbroker.storage.files import private_dirs
from fqbroker.storage.kv.journal import FRAMES, RECORD, JournalWriter, close_quietly, set_payload
from fqbroker.storage.kv.sqlite import Entry, Params, key_of, load, open_db, write_fold

log = logging.getLogger(__name__)
WARN_EVERY = 10.0  # seconds between lines about failing writes: a full disk fails them all

__all__ = ["INT", "STRING", "Batch", "KVStore", "key_of"]

# Final: compiled (mypyc), a constant in the code, not a lookup in the module's dict.
INT: Final = 1  # the kind of an i32 value
STRING: Final = 2  # the kind of a byte-string value

SWEEP_SECONDS = 0.5  # expired keys are reclaimed within a second
FOLD_BYTES = 64 << 20  # journal bytes that start a fold into sqlite
# Batches written and waiting for their fdatasync ("full"). 1: the next batch is written
# when the flush before it ends. 2 (one flushing, one written behind it) measured fewer
# sets/s on the bench machine's disk (bench/RESULTS.md): the batch behind is the sets of
# one turn of the loop, so there are more and smaller batches, and each fdatasync costs
# CPU of its own.
FLUSHES = 1
# A flush ("full") is done on the loop, as Redis does with ``appendfsync always``, while
# the last one took less than this: handing it to the journal thread and back cost more
# CPU a batch than this disk's fdatasync blocks the loop, and the batches grow (every set
# read during the flush joins the next). A slower disk's flushes go to the journal thread,
# so that the loop goes on serving the other connections meanwhile (bench/RESULTS.md).
INLINE_FLUSH = 0.001  # seconds

_Bytes = bytes  # in KVStore, whose ``bytes`` property hides the type
_pack_record = RECORD.pack
# An OpenCluster set frame (docs/opencluster-protocol.md): its header (command, repcmd,
# user id, payload length) and the payload's head (hashes, expires, full_wait, name
# length), in one unpack; then the name and the value. The two 32-bit hashes are read
# as one 64-bit key: (map_hash << 32) | key_hash, what key_of makes.
_unpack_set_frame = struct.Struct(">hhiiQiii").unpack_from
_SET_FRAME_HEAD: Final = 32
_i32_from = struct.Struct(">i").unpack_from
_SET_STRING: Final = 2020  # its value is a string; set_int's (2000) an i32
_FRAMES: Final = FRAMES
_COMPILED: Final = ACCELERATED  # this module is (mypyc)


def _u32(buf: bytes, at: int) -> int:
    """The big-endian unsigned 32-bit int at ``at``: compiled, four loads and no object."""
    return buf[at] << 24 | buf[at + 1] << 16 | buf[at + 2] << 8 | buf[at + 3]


def _failed(error: str) -> str | None:
    """In the journal thread: a batch whose write failed, answered in its turn."""
    return error


def _size(entry: Entry) -> int:
    value = entry[1]
    return len(entry[3]) + (len(value) if entry[0] == STRING else 4)  # type: ignore[arg-type]


class Batch:
    """The sets of one group commit. ``error`` is None once written, or says why the
    write failed; ``waiters`` are called (on the loop) when ``done``."""

    __slots__ = ("count", "done", "error", "gen", "olds", "parts", "size", "waiters")

    def __init__(self) -> None:
        self.parts: list[bytes] = []  # the journal records, in pieces, until written
        self.count = 0  # sets
        self.size = 0  # bytes written to the journal
        self.gen = -1  # the journal written to (-1: none, the write failed)
        # Each key's entry before the batch's first set of it (None: there was none).
        self.olds: dict[int, Entry | None] = {}
        self.waiters: list[Callable[[], None]] = []
        self.done = False
        self.error: str | None = None


class KVStore:
    """Keys and values of the OpenCluster listener: in memory, in journals beside
    ``path`` and in the sqlite database at ``path``.

    Made where an event loop runs (its sweep and writes use it); ``close()`` writes what
    is pending, folds the journals into sqlite and closes it.
    """

    def __init__(
        self,
        path: Path,
        *,
        sync: str = "full",
        max_keys: int = 1_000_000,
        fold_bytes: int = FOLD_BYTES,
        alarm: DiskAlarm | None = None,
        inline_flush: float | None = None,
    ) -> None:
        self.path = path
        # An fdatasync runs on the loop while the last took under this many seconds (0:
        # never): [opencluster] inline_sync_ms; None: INLINE_FLUSH's, read at each flush.
        self._inline_flush = inline_flush
        # While it is raised (free space below disk_free_limit) a batch is not written
        # but failed as on a full disk: its sets are answered failinfo, gets go on.
        self.alarm = alarm
        if alarm is not None:
            alarm.watch(path.parent)
        self.max_keys = max_keys
        self.fold_bytes = fold_bytes
        # Counters, for /stats.json and /metrics (sets: :attr:`sets`).
        self._sets = self.gets = self.hits = self.misses = 0
        self.expired = self.commits = self.failed_commits = self.folds = 0
        self._warned_at = -WARN_EVERY
        self._loop = asyncio.get_running_loop()
        self._open: Batch | None = None  # taking sets, not yet written
        # Batches written, each with its flush, in order ("full"; at most FLUSHES).
        self._flushing: deque[tuple[Batch, asyncio.Future[str | None]]] = deque()
        # Journals up to this generation had a flush fail: their batches in flight fail.
        self._failed_gen = -1
        self._failed_error = ""
        self._folding: asyncio.Future[str | None] | None = None
        self._closed = False
        self._flush_seconds = 0.0  # how long the last fdatasync took (INLINE_FLUSH)
        try:
            private_dirs(path.parent)
            self._db = open_db(path)
        except (OSError, sqlite3.Error) as exc:
            raise KVStoreError(f"opencluster store {path} cannot be opened: {exc}") from None
        try:
            loaded = load(self._db, path, time.time())
        except (OSError, sqlite3.Error) as exc:
            with contextlib.suppress(Exception):
                self._db.close()
            raise KVStoreError(f"opencluster store {path} cannot be opened: {exc}") from None
        self._values: dict[int, Entry] = loaded.values
        self._bytes = sum(_size(entry) for entry in self._values.values())
        self._dirty: set[int] = loaded.dirty  # keys written to journals since the last fold
        self._unfolded = loaded.unfolded  # bytes of the journals not folded
        # (expires, key) of keys set with an expiry; stale pairs (overwritten) are skipped.
        self._expiries = [(e[2], k) for k, e in self._values.items() if e[2]]
        heapq.heapify(self._expiries)
        # One thread each: journal flushes run in order, and a fold (sqlite's connection
        # is its alone) does not hold them up.
        self._flusher = ThreadPoolExecutor(1, thread_name_prefix="fq-kvjournal")
        full = sync == "full"
        self._journal = JournalWriter(
            path, loaded.gen, sync=full, closer=self._close_later if full else close_quietly
        )
        self._folder = ThreadPoolExecutor(1, thread_name_prefix="fq-kvfold")
        self._sweeper = self._loop.call_later(SWEEP_SECONDS, self._sweep)

    # --- what stats read ------------------------------------------------------------------

    @property
    def keys(self) -> int:
        """Keys held (an expired one counts until the sweep reclaims it, within a second)."""
        return len(self._values)

    @property
    def sets(self) -> int:
        """Sets taken (stored or failed since): counted per batch, the open one's too."""
        batch = self._open
        return self._sets + (batch.count if batch is not None else 0)

    @property
    def bytes(self) -> int:
        """Bytes of names and values held (an int value counts 4)."""
        return self._bytes

    # --- reads ----------------------------------------------------------------------------

    def get(self, key: int) -> Entry | None:
        """The entry of ``key`` (see :func:`key_of`), or None: not found or expired."""
        self.gets += 1
        entry = self._values.get(key)
        if entry is None or (entry[2] and entry[2] <= time.time()):
            self.misses += 1
            return None
        self.hits += 1
        return entry

    # --- writes ---------------------------------------------------------------------------

    def set(
        self,
        map_hash: int,
        key_hash: int,
        name: _Bytes,
        kind: int,
        value: int | _Bytes,
        expires: int = 0,
        payload: _Bytes | None = None,
    ) -> Batch | None:
        """Set a value now (reads see it at once); the batch whose write makes it
        durable, or None when the store is full (``max_keys``) and ``key`` is new.
        ``expires``: seconds from now, 0 (or less) for never. ``payload``: the set as
        OpenCluster carried it, holding these same fields (the journal keeps it)."""
        key = ((map_hash & 0xFFFFFFFF) << 32) | (key_hash & 0xFFFFFFFF)
        if payload is None:
            payload = set_payload(key >> 32, key & 0xFFFFFFFF, name, kind, value)
        return self.put(key, name, kind, value, expires, payload)

    def put(
        self, key: int, name: _Bytes, kind: int, value: int | _Bytes, expires: int, payload: _Bytes
    ) -> Batch | None:
        """:meth:`set` of a :func:`key_of` key with its payload: the listener's hot path
        (every set of a pipelined load comes through here, so it is kept lean)."""
        values = self._values
        old = values.get(key)
        # _size, inline.
        size = len(name) + (len(value) if kind == STRING else 4)  # type: ignore[arg-type]
        if old is None:
            if len(values) >= self.max_keys:
                return None
        else:
            size -= len(old[3]) + (len(old[1]) if old[0] == STRING else 4)  # type: ignore[arg-type]
        self._bytes += size
        if expires > 0:
            at = time.time() + expires
            heapq.heappush(self._expiries, (at, key))
        else:
            at = 0.0
        values[key] = (kind, value, at, name)
        batch = self._open
        if batch is None:
            batch = self._open = Batch()
            if len(self._flushing) < FLUSHES:
                # At the end of this turn of the loop: every set read meanwhile joins.
                # (Else the flush that completes first writes it.)
                self._loop.call_soon(self._commit)
        olds = batch.olds
        if key not in olds:
            olds[key] = old
        batch.parts += (_pack_record(kind, at, len(payload)), payload)  # 2 parts a set
        batch.count += 1
        return batch

    def put_frames(
        self,
        buf: _Bytes,
        pos: int,
        have: int,
        room: int,
        command: int,
        limits: tuple[int, int, int],
        userids: list[int],
    ) -> int:
        """:meth:`put` of the run of OpenCluster ``command`` frames (set_string 2020 or
        set_int 2000: docs/opencluster-protocol.md) in ``buf`` from ``pos``, up to ``have``
        and at most ``room`` of them: the listener's hot path, a pipelined read's sets in
        one call and one journal record (the frames as read), with no object per set but
        its entry. ``limits``: (max_payload, max_name, max_value). Stops before a frame
        that is not whole, not of ``command``, not a set within the limits, or a new key
        when the store is full: the caller takes that one alone (and says why). Appends
        each set's user id to ``userids``; the position after the last frame taken (then
        :attr:`open_batch` is the batch they joined)."""
        values = self._values
        get = values.get
        max_payload, max_name, max_value = limits
        max_keys = self.max_keys
        string = command == _SET_STRING
        kind = STRING if string else INT
        batch = self._open
        fresh = batch is None
        if batch is None:
            batch = Batch()
        olds = batch.olds
        expiries = self._expiries
        now = time.time()
        start = pos
        grow = count = 0
        append = userids.append
        unpack_frame, i32_from = _unpack_set_frame, _i32_from  # one lookup, not one a set
        compiled = _COMPILED
        # Typed, so that compiled (mypyc) they are machine ints, not objects.
        cmd: int
        userid: int
        size: int
        expires: int
        n: int
        length: int
        while count < room and have - pos >= _SET_FRAME_HEAD:
            if compiled:  # machine loads, no tuple nor int objects (but the key)
                cmd = buf[pos] << 8 | buf[pos + 1]
                userid = _u32(buf, pos + 4)
                if userid >= 0x80000000:  # >i
                    userid -= 0x100000000
                size = _u32(buf, pos + 8)  # negative: over max_payload
                key = _u32(buf, pos + 12) << 32 | _u32(buf, pos + 16)
                expires = _u32(buf, pos + 20)
                if expires >= 0x80000000:  # negative: never, as 0
                    expires = 0
                n = _u32(buf, pos + 28)  # negative: over max_name
            else:  # interpreted, one struct call costs less than the loads
                cmd, _, userid, size, key, expires, _, n = unpack_frame(buf, pos)
            if cmd != command or size < 24 or size > max_payload:
                break
            end = pos + 12 + size
            at = pos + _SET_FRAME_HEAD + n
            if end > have or n < 0 or n > max_name or at + 4 > end:
                break
            value: int | bytes
            if string:
                # The value's length is the frame's rest; its 4 bytes must say so.
                length = end - at - 4
                if length < 0 or length > max_value:
                    break
                said = _u32(buf, at) if compiled else i32_from(buf, at)[0]
                if said != length:
                    break
                value = buf[at + 4 : end]
            else:
                if at + 4 != end:
                    break
                value = i32_from(buf, at)[0]
                length = 4
            old = get(key)
            if old is None:
                if len(values) >= max_keys:
                    break
                grow += n + length
            else:
                grow += n + length - len(old[3])
                grow -= len(old[1]) if old[0] == STRING else 4  # type: ignore[arg-type]
            if expires > 0:
                expiry = now + expires
                heapq.heappush(expiries, (expiry, key))
            else:
                expiry = 0.0
            values[key] = (kind, value, expiry, buf[pos + _SET_FRAME_HEAD : at])
            olds.setdefault(key, old)  # the value before the batch: its first set's old
            append(userid)
            pos = end
            count += 1
        if count:
            self._bytes += grow
            batch.parts += (_pack_record(_FRAMES, now, pos - start), buf[start:pos])
            batch.count += count
            if fresh:
                self._open = batch
                if len(self._flushing) < FLUSHES:
                    self._loop.call_soon(self._commit)  # as put's
        return pos

    @property
    def open_batch(self) -> Batch | None:
        """The batch taking sets now, if any."""
        return self._open

    def _commit(self, *, behind: bool = False) -> None:
        """Write the open batch to the journal, here on the loop: a write to the page
        cache costs less than handing the batch to a thread. ``"normal"``: done;
        ``"full"``: its fdatasync is queued in the journal thread, behind the one in
        flight if any, and sets that come meanwhile wait for the next batch (group
        commit). Not while :data:`FLUSHES` batches are in flight, nor, once a fold is
        due, while any is: the fold closes the journal and needs none in flight.
        ``behind``: a batch that completed is still to be answered, so a write that
        fails is answered after it."""
        batch = self._open
        flushing = self._flushing
        if batch is None or len(flushing) >= FLUSHES:
            return
        if flushing and self._unfolded >= self.fold_bytes and self._folding is None:
            return
        self._open = None
        self._sets += batch.count
        journal = self._journal
        future: asyncio.Future[str | None]
        alarm = self.alarm
        try:
            if alarm is not None and alarm.raised:
                raise alarm.refused()
            batch.size = journal.write(batch.parts)
        except OSError as exc:
            if alarm is not None and not alarm.raised:
                alarm.failed()  # a full disk, perhaps: look now, not in a second
            error = str(exc) or type(exc).__name__
            if not (flushing or behind):
                self._finish(batch, error)
                return
            # Behind batches in flight: failed in its turn, so that batches complete
            # in order (a later batch's restore relies on it).
            future = self._loop.run_in_executor(self._flusher, _failed, error)
        else:
            batch.parts = []
            if not journal.sync:
                self._finish(batch, None)
                return
            batch.gen = journal.gen
            if not (flushing or behind) and self._disk_is_fast():
                # On the loop: nothing is in flight, so nothing is to complete before it.
                failed = self._flush(journal.fd)
                if failed is not None:
                    journal.discard()  # its file may have lost pages: go on in a new one
                self._finish(batch, failed)
                return
            future = self._loop.run_in_executor(self._flusher, self._flush, journal.fd)
        flushing.append((batch, future))
        future.add_done_callback(self._flushed)

    def _disk_is_fast(self) -> bool:
        """Whether the next fdatasync runs on the loop: the last took under the threshold
        (``inline_flush``, else INLINE_FLUSH, read now: tests change it)."""
        limit = INLINE_FLUSH if self._inline_flush is None else self._inline_flush
        return self._flush_seconds < limit

    def _flush(self, fd: int | None) -> str | None:
        """In the journal thread, or on the loop (INLINE_FLUSH): None, or why the
        fdatasync failed."""
        started = time.perf_counter()
        try:
            self._journal.flush(fd)
        except OSError as exc:
            return str(exc) or type(exc).__name__
        finally:
            self._flush_seconds = time.perf_counter() - started
        return None

    def _close_later(self, fd: int) -> None:
        """A journal left (failed, or rotated for a fold): closed in the journal thread,
        after the flushes queued on it."""
        self._flusher.submit(close_quietly, fd)

    def _flushed(self, future: asyncio.Future[str | None]) -> None:
        batch, mine = self._flushing.popleft()
        assert mine is future  # the journal thread completes them in order
        if future.cancelled():
            error: str | None = "cancelled"
        elif (exc := future.exception()) is not None:  # a bug: still, answer the batch
            error = str(exc) or type(exc).__name__
        else:
            error = future.result()
        if batch.gen >= 0:
            if error is not None:
                # Its file may have lost pages: the batches written to it after this
                # one fail too, and the next batch goes to a new file.
                self._failed_gen = max(self._failed_gen, batch.gen)
                self._failed_error = error
                if self._journal.gen == batch.gen:
                    self._journal.discard()
            elif batch.gen <= self._failed_gen:
                error = self._failed_error
        if error is None and (
            self._unfolded + batch.size >= self.fold_bytes
            or (not self._flushing and self._disk_is_fast())
        ):
            # A fold, if none runs, before the next write; or the next flush on the loop
            # (the disk is fast again), once this batch's clients have their acks.
            self._finish(batch, error)
            self._commit()
            return
        # The sets that came while this batch was flushed are written, and their flush
        # started, before this batch's waiters write their acks: 50 connections' sends
        # take longer than a fdatasync here, and the journal thread would wait for them.
        # (A failed batch restores behind the one now in flight: see _restore.)
        self._commit(behind=True)
        self._finish(batch, error)

    def _finish(self, batch: Batch, error: str | None) -> None:
        """A batch is on disk (``error`` None) or not: answer its waiters."""
        if error is None:
            self.commits += 1
            self._dirty.update(batch.olds)
            self._unfolded += batch.size
            due = self._unfolded >= self.fold_bytes and self._folding is None
            if due and not self._flushing:  # else the last batch in flight folds
                self._fold()
        else:
            self.failed_commits += 1
            self._warn_failed(error, len(batch.waiters))
            self._restore(batch)
        batch.done = True
        batch.error = error
        for waiter in batch.waiters:
            try:
                waiter()
            except Exception as exc:  # a bug in one connection: the others are answered
                self._loop.call_exception_handler(
                    {"message": "a waiter of an OpenCluster commit failed", "exception": exc}
                )

    def _warn_failed(self, error: str, waiters: int) -> None:
        now = time.monotonic()
        if now < self._warned_at + WARN_EVERY:
            return
        self._warned_at = now
        log.warning(
            "opencluster: a journal write failed, its sets were answered `not stored` "
            "(%d failed writes so far; %d connections waited on this one): %s",
            self.failed_commits, waiters, error,
        )  # fmt: skip

    def _restore(self, batch: Batch) -> None:
        """Memory back to each key's value before a failed batch; a key a later batch
        (in flight, or open) set since keeps that value, and the first such batch
        restores to the older one."""
        laters = [later.olds for later, _ in self._flushing]  # all later: in order
        if self._open is not None:
            laters.append(self._open.olds)
        values = self._values
        for key, old in batch.olds.items():
            for later in laters:
                if key in later:
                    later[key] = old
                    break
            else:
                now = values.pop(key, None)
                if now is not None:
                    self._bytes -= _size(now)
                if old is not None:
                    values[key] = old
                    self._bytes += _size(old)

    # --- folding --------------------------------------------------------------------------

    def _fold(self) -> None:
        """Close the journal and fold the committed value of each key set since the last
        fold into sqlite, in the fold thread. Only while no batch is in flight."""
        assert not self._flushing
        later = self._open.olds if self._open is not None else {}
        values = self._values
        upserts: Params = []
        deletes: list[tuple[int, int]] = []
        for key in self._dirty:
            entry = later[key] if key in later else values.get(key)
            if entry is None:
                deletes.append((key >> 32, key & 0xFFFFFFFF))
            else:
                kind, value, at, name = entry
                upserts += (key >> 32, key & 0xFFFFFFFF, name, kind, value, at)
        dirty, self._dirty = self._dirty, set()
        unfolded, self._unfolded = self._unfolded, 0
        gen = self._journal.rotate()
        future = self._loop.run_in_executor(
            self._folder, write_fold, self._db, self.path, upserts, deletes, gen, time.time()
        )
        self._folding = future

        def folded(f: asyncio.Future[str | None]) -> None:
            self._folding = None
            error = f.result() if not f.cancelled() else "cancelled"
            if error is None:
                self.folds += 1
                return
            # The journals stay; the next fold takes their keys again.
            log.warning("opencluster: folding the journals into %s failed: %s", self.path, error)
            self._dirty |= dirty
            self._unfolded += unfolded

        future.add_done_callback(folded)

    # --- expiry ---------------------------------------------------------------------------

    def _sweep(self) -> None:
        self._sweeper = self._loop.call_later(SWEEP_SECONDS, self._sweep)
        now = time.time()
        heap, values = self._expiries, self._values
        gone = 0
        while heap and heap[0][0] <= now:
            at, key = heapq.heappop(heap)
            entry = values.get(key)
            if entry is not None and entry[2] == at:
                del values[key]
                self._bytes -= _size(entry)
                gone += 1
        self.expired += gone
        if len(heap) > 2 * len(values) + 1024:
            # Keys set again and again with an expiry leave stale pairs: start afresh.
            self._expiries = [(e[2], k) for k, e in values.items() if e[2]]
            heapq.heapify(self._expiries)

    # --- closing --------------------------------------------------------------------------

    async def close(self) -> None:
        """Write what is pending, fold the journals into sqlite, close both threads."""
        if self._closed:
            return
        self._closed = True
        self._sweeper.cancel()
        while self._flushing or self._open is not None:
            self._commit()
            if self._flushing:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(self._flushing[0][1])
                await asyncio.sleep(0)  # its done callback runs
        await self._folded()  # one running
        if self._dirty or self._unfolded:
            self._fold()  # everything left: a clean restart reads sqlite alone
            await self._folded()
        await self._loop.run_in_executor(self._folder, self._db.close)
        self._journal.closer = close_quietly  # the journal thread's work is all done
        self._journal.close()
        self._flusher.shutdown(wait=True)
        self._folder.shutdown(wait=True)

    async def _folded(self) -> None:
        if self._folding is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(self._folding)
            await asyncio.sleep(0)  # its done callback runs
