"""The OpenCluster listener's key/value store: memory for reads, sqlite for what survives.

Theory of operation
-------------------
**Reads** come from a dict in memory, keyed by ``(map_hash << 32) | key_hash`` (the 32-bit
hashes the client computed; the server never hashes). It is the source of truth for
every get; sqlite is only read at startup, and after a commit fails.

**Writes** change the dict at once and join the open :class:`Batch`. Every set of one
turn of the event loop (the sets of a read, across connections) goes into one batch,
and a batch is one sqlite transaction (one ``executemany`` and a commit), run in the
store's one worker thread so the loop keeps reading. While a commit runs, new sets join
the next batch: the busier the store, the larger its batches (group commit). A batch's
``waiters`` are called on the loop once its commit returned: only then may a set be
acknowledged. ``sync = "full"`` (``PRAGMA synchronous=FULL``): the commit fsyncs the WAL,
an ack survives a power cut; ``"normal"``: the WAL is written, not fsynced, at each
commit, and an ack survives kill -9 of the broker, not a power cut.

**A failed commit** (a full disk): its batch carries the error, its sets are answered
"not stored", and the memory values of its keys are read back from sqlite (unless a
later set, still to be committed, changed them since). The store carries on.

**Expiry** is a wall-clock time (seconds since the epoch, 0 = never), so that it means
the same after a restart. An expired key is never returned; a sweep at least once a
second deletes expired keys from memory (counted ``expired``) and from sqlite (with the
next commit). Loading at startup drops what expired meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fqbroker.errors import KVStoreError

__all__ = ["INT", "STRING", "Batch", "KVStore", "key_of"]

INT = 1  # the kind of an i32 value
STRING = 2  # the kind of a byte-string value

SWEEP_SECONDS = 0.5  # expired keys are reclaimed within a second

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS kv(map_hash INTEGER, key_hash INTEGER, name BLOB,"
    " kind INTEGER, value, expires REAL, PRIMARY KEY(map_hash, key_hash)) WITHOUT ROWID"
)
# Rows go in by multi-row statements of at most CHUNK rows: one sqlite3_step (run without
# the GIL) per statement, where executemany takes and drops the GIL for every row while
# the event loop wants it. Each size's statement text is made once, and sqlite3 caches
# the prepared statements (up to CHUNK + a few).
CHUNK = 256
_COLUMNS = 6
_UPSERTS: dict[int, str] = {}


def _upsert(rows: int) -> str:
    sql = _UPSERTS.get(rows)
    if sql is None:
        sql = _UPSERTS[rows] = "INSERT OR REPLACE INTO kv VALUES " + ",".join(
            ["(?,?,?,?,?,?)"] * rows
        )
    return sql


_EXPIRE = "DELETE FROM kv WHERE expires > 0 AND expires <= ?"

_Bytes = bytes  # in KVStore, whose ``bytes`` property hides the type

# One value in memory: (kind, value, expires, name).
Entry = tuple[int, int | bytes, float, bytes]
# A batch's rows, flat: (map_hash, key_hash, name, kind, value, expires) one after the
# other; the hashes as unsigned 32-bit numbers, whatever the client sent.
Params = list[int | bytes | float]


def key_of(map_hash: int, key_hash: int) -> int:
    """The dict key of a (map_hash, key_hash) pair, signed or unsigned 32-bit alike."""
    return ((map_hash & 0xFFFFFFFF) << 32) | (key_hash & 0xFFFFFFFF)


def _keys(params: Params) -> list[int]:
    """The dict keys of a batch's rows."""
    return [
        key_of(params[at], params[at + 1])  # type: ignore[arg-type]
        for at in range(0, len(params), _COLUMNS)
    ]


def _size(entry: Entry) -> int:
    value = entry[1]
    return len(entry[3]) + (len(value) if entry[0] == STRING else 4)  # type: ignore[arg-type]


class Batch:
    """The sets of one group commit. ``error`` is None once committed, or says why the
    commit failed; ``waiters`` are called (on the loop) when ``done``."""

    __slots__ = ("done", "error", "params", "waiters")

    def __init__(self) -> None:
        self.params: Params = []  # _COLUMNS values a row
        self.waiters: list[Callable[[], None]] = []
        self.done = False
        self.error: str | None = None


class KVStore:
    """Keys and values of the OpenCluster listener, in memory and in sqlite at ``path``.

    Made where an event loop runs (its sweep and commits use it); ``close()`` commits
    what is pending and closes the database.
    """

    def __init__(self, path: Path, *, sync: str = "full", max_keys: int = 1_000_000) -> None:
        self.path = path
        self.max_keys = max_keys
        self._values: dict[int, Entry] = {}
        self._bytes = 0
        # Counters, for /stats.json and /metrics.
        self.sets = self.gets = self.hits = self.misses = 0
        self.expired = self.commits = self.failed_commits = 0
        # (expires, key) of keys set with an expiry; stale pairs (overwritten) are skipped.
        self._expiries: list[tuple[float, int]] = []
        self._expire_before = 0.0  # sqlite rows expiring up to this go with the next commit
        self._loop = asyncio.get_running_loop()
        # One thread: sqlite's connection is used by it alone, commits in order.
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="fq-kvstore")
        self._open: Batch | None = None  # taking sets, not yet committing
        self._committing: asyncio.Future[str | None] | None = None
        self._closed = False
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, cached_statements=CHUNK + 16
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={'FULL' if sync == 'full' else 'NORMAL'}")
            self._db.execute(_SCHEMA)
            self._load()
        except (OSError, sqlite3.Error) as exc:
            self._thread.shutdown(wait=False)
            raise KVStoreError(f"opencluster store {path} cannot be opened: {exc}") from None
        self._sweeper = self._loop.call_later(SWEEP_SECONDS, self._sweep)

    def _load(self) -> None:
        now = time.time()
        self._db.execute(_EXPIRE, (now,))  # expired while the broker was down
        rows = self._db.execute("SELECT map_hash, key_hash, name, kind, value, expires FROM kv")
        values = self._values
        for map_hash, key_hash, name, kind, value, expires in rows:
            entry: Entry = (kind, value, expires, name)
            key = key_of(map_hash, key_hash)
            values[key] = entry
            self._bytes += _size(entry)
            if expires:
                self._expiries.append((expires, key))
        heapq.heapify(self._expiries)

    # --- what stats read ------------------------------------------------------------------

    @property
    def keys(self) -> int:
        """Keys held (an expired one counts until the sweep reclaims it, within a second)."""
        return len(self._values)

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
    ) -> Batch | None:
        """Set a value now (reads see it at once); the batch whose commit makes it
        durable, or None when the store is full (``max_keys``) and ``key`` is new.
        ``expires``: seconds from now, 0 (or less) for never."""
        key = ((map_hash & 0xFFFFFFFF) << 32) | (key_hash & 0xFFFFFFFF)
        values = self._values
        old = values.get(key)
        # _size, inline: this is the hot path of every set.
        size = len(name) + (len(value) if kind == STRING else 4)  # type: ignore[arg-type]
        if old is None:
            if len(values) >= self.max_keys:
                return None
        else:
            size -= len(old[3]) + (len(old[1]) if old[0] == STRING else 4)  # type: ignore[arg-type]
        self._bytes += size
        at = time.time() + expires if expires > 0 else 0.0
        values[key] = (kind, value, at, name)
        if at:
            heapq.heappush(self._expiries, (at, key))
        self.sets += 1
        batch = self._open
        if batch is None:
            batch = self._open = Batch()
            if self._committing is None:
                # At the end of this turn of the loop: every set read meanwhile joins.
                self._loop.call_soon(self._commit)
        batch.params += (key >> 32, key & 0xFFFFFFFF, name, kind, value, at)
        return batch

    def _commit(self) -> None:
        batch = self._open
        if self._committing is not None or (batch is None and not self._expire_before):
            return
        self._open = None
        params = batch.params if batch is not None else []
        expire_before, self._expire_before = self._expire_before, 0.0
        future = self._loop.run_in_executor(self._thread, self._write, params, expire_before)
        self._committing = future
        future.add_done_callback(lambda f: self._committed(batch, f))

    def _write(self, params: Params, before: float) -> str | None:
        """In the worker thread: one transaction; None, or why it failed."""
        db = self._db
        step = CHUNK * _COLUMNS
        try:
            db.execute("BEGIN")
            if before:
                db.execute(_EXPIRE, (before,))
            for at in range(0, len(params), step):
                chunk = params[at : at + step]
                db.execute(_upsert(len(chunk) // _COLUMNS), chunk)
            db.execute("COMMIT")
        except (sqlite3.Error, OSError) as exc:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            return str(exc) or type(exc).__name__
        return None

    def _committed(self, batch: Batch | None, future: asyncio.Future[str | None]) -> None:
        self._committing = None
        error = future.result() if not future.cancelled() else "cancelled"
        if batch is not None:
            if error is None:
                self.commits += 1
            else:
                self.failed_commits += 1
                self._reload(batch)
            batch.done = True
            batch.error = error
            for waiter in batch.waiters:
                try:
                    waiter()
                except Exception as exc:  # a bug in one connection: the others are answered
                    self._loop.call_exception_handler(
                        {"message": "a waiter of an OpenCluster commit failed", "exception": exc}
                    )
        if self._open is not None or self._expire_before:
            self._commit()  # what was set while this one committed

    def _reload(self, batch: Batch) -> None:
        """Memory back to what sqlite holds for a failed batch's keys, except those a
        later set (still to be committed) changed since."""
        later = set(_keys(self._open.params)) if self._open is not None else set()
        keys = [key for key in dict.fromkeys(_keys(batch.params)) if key not in later]
        found: dict[int, Entry] = {}
        try:
            for key in keys:
                for row in self._db.execute(
                    "SELECT kind, value, expires, name FROM kv WHERE map_hash = ? AND key_hash = ?",
                    (key >> 32, key & 0xFFFFFFFF),
                ):
                    found[key] = (row[0], row[1], row[2], row[3])
        except sqlite3.Error:
            pass  # unreadable too: the keys are dropped from memory, as not stored
        for key in keys:
            old = self._values.pop(key, None)
            if old is not None:
                self._bytes -= _size(old)
            entry = found.get(key)
            if entry is not None:
                self._values[key] = entry
                self._bytes += _size(entry)

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
        if gone:
            self.expired += gone
            self._expire_before = now
            self._commit()
        if len(heap) > 2 * len(values) + 1024:
            # Keys set again and again with an expiry leave stale pairs: start afresh.
            self._expiries = [(e[2], k) for k, e in values.items() if e[2]]
            heapq.heapify(self._expiries)

    # --- closing --------------------------------------------------------------------------

    async def close(self) -> None:
        """Commit what is pending, then close the database and the worker thread."""
        if self._closed:
            return
        self._closed = True
        self._sweeper.cancel()
        while self._committing is not None or self._open is not None:
            if self._committing is None:
                self._commit()
            if self._committing is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(self._committing)
                await asyncio.sleep(0)  # its done callback runs
        await self._loop.run_in_executor(self._thread, self._db.close)
        self._thread.shutdown(wait=True)
