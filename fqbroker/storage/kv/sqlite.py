"""The OpenCluster store's compacted form: its sqlite database, and how a start reads it
and the journals beside it (docs/opencluster.md; the store's side of it is
:mod:`~fqbroker.storage.kv.store`).

sqlite holds the latest value of each key as of the last fold (``meta.fold_gen``: the
journals up to that generation are in it); a start reads its rows, then replays the
journals above ``fold_gen`` in order. A fold writes the keys set since the last one in
one transaction, then deletes the journals it folded.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from fqbroker.storage.files import private_file
from fqbroker.storage.kv.journal import journals, replay

__all__ = ["CHUNK", "Entry", "Loaded", "Params", "key_of", "load", "open_db", "write_fold"]

# One value in memory: (kind, value, expires, name).
Entry = tuple[int, int | bytes, float, bytes]
# What a fold writes: the rows to upsert, flat (_COLUMNS values a row), and keys to delete.
Params = list[int | bytes | float]

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS kv(map_hash INTEGER, key_hash INTEGER, name BLOB,"
    " kind INTEGER, value, expires REAL, PRIMARY KEY(map_hash, key_hash)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value)",
)
# Rows go in by multi-row statements of at most CHUNK rows: one sqlite3_step (run without
# the GIL) per statement, where executemany takes and drops the GIL for every row while
# the event loop wants it. sqlite3 caches the prepared statements (up to CHUNK + a few).
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
_DELETE = "DELETE FROM kv WHERE map_hash = ? AND key_hash = ?"
_FOLD_GEN = "SELECT value FROM meta WHERE name = 'fold_gen'"
_SET_FOLD_GEN = "INSERT OR REPLACE INTO meta VALUES ('fold_gen', ?)"


def key_of(map_hash: int, key_hash: int) -> int:
    """The dict key of a (map_hash, key_hash) pair, signed or unsigned 32-bit alike."""
    return ((map_hash & 0xFFFFFFFF) << 32) | (key_hash & 0xFFFFFFFF)


def open_db(path: Path) -> sqlite3.Connection:
    """The database at ``path``, created if need be (WAL, fsynced). Raises sqlite3.Error."""
    private_file(path)
    db = sqlite3.connect(
        path, isolation_level=None, check_same_thread=False, cached_statements=CHUNK + 16
    )
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")  # folds are rare: always durable
        for statement in _SCHEMA:
            db.execute(statement)
    except sqlite3.Error:
        with contextlib.suppress(Exception):
            db.close()
        raise
    return db


class Loaded:
    """What a start found: the values, the keys the journals hold (not yet folded), the
    journals' bytes, and the generation of the next journal."""

    __slots__ = ("dirty", "gen", "unfolded", "values")

    def __init__(self) -> None:
        self.values: dict[int, Entry] = {}
        self.dirty: set[int] = set()
        self.unfolded = 0
        self.gen = 0


def load(db: sqlite3.Connection, path: Path, now: float) -> Loaded:
    """sqlite's rows, then the journals beside ``path`` not folded, with what expired
    before ``now`` left out."""
    loaded = Loaded()
    db.execute(_EXPIRE, (now,))  # expired while the broker was down
    row = db.execute(_FOLD_GEN).fetchone()
    folded = int(row[0]) if row else 0
    values = loaded.values
    rows = db.execute("SELECT map_hash, key_hash, name, kind, value, expires FROM kv")
    for map_hash, key_hash, name, kind, value, expires in rows:
        if not expires or expires > now:
            values[key_of(map_hash, key_hash)] = (kind, value, expires, name)
    last = folded
    for gen, journal in journals(path):
        last = max(last, gen)
        if gen <= folded:
            journal.unlink(missing_ok=True)  # folded; the crash came before its unlink
            continue
        for map_hash, key_hash, kind, value, expires, name in replay(journal):
            key = key_of(map_hash, key_hash)
            loaded.dirty.add(key)
            if expires and expires <= now:
                values.pop(key, None)
            else:
                values[key] = (kind, value, expires, name)
        loaded.unfolded += journal.stat().st_size
    loaded.gen = last + 1
    return loaded


def write_fold(
    db: sqlite3.Connection,
    path: Path,
    upserts: Params,
    deletes: list[tuple[int, int]],
    gen: int,
    now: float,
) -> str | None:
    """In the fold thread: one sqlite transaction, then the journals it folded (up to
    ``gen``) go. None, or why it failed (then the journals stay)."""
    step = CHUNK * _COLUMNS
    try:
        db.execute("BEGIN")
        for at in range(0, len(upserts), step):
            chunk = upserts[at : at + step]
            db.execute(_upsert(len(chunk) // _COLUMNS), chunk)
        if deletes:
            db.executemany(_DELETE, deletes)
        db.execute(_EXPIRE, (now,))
        db.execute(_SET_FOLD_GEN, (gen,))
        db.execute("COMMIT")
    except (sqlite3.Error, OSError) as exc:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")
        return str(exc) or type(exc).__name__
    for old, journal in journals(path):
        if old <= gen:
            journal.unlink(missing_ok=True)
    return None
