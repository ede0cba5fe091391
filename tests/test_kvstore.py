"""The OpenCluster store on its own: memory reads, group commits to a real sqlite file,
expiry, max_keys, a commit that fails (sqlite's own "database or disk is full"), reopen."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

from fqbroker.errors import KVStoreError
from fqbroker.storage.kvstore import INT, STRING, Batch, KVStore, key_of

from .conftest import TIMEOUT, wait_for


async def committed(batch: Batch | None) -> Batch:
    assert batch is not None
    if not batch.done:
        done = asyncio.Event()
        batch.waiters.append(done.set)
        async with asyncio.timeout(TIMEOUT):
            await done.wait()
    return batch


def rows(path: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT * FROM kv ORDER BY map_hash, key_hash").fetchall()


async def test_sets_are_read_at_once_and_committed_together(tmp_path: Path) -> None:
    path = tmp_path / "kv.sqlite3"
    store = KVStore(path)
    try:
        batches = {store.set(0, n, b"k%d" % n, INT, n) for n in range(100)}
        assert len(batches) == 1  # one turn of the loop: one batch
        (batch,) = batches
        assert store.get(key_of(0, 7)) == (INT, 7, 0.0, b"k7") and not batch.done
        await committed(batch)
        assert batch.error is None and store.commits == 1 and store.sets == 100
        assert len(rows(path)) == 100  # in sqlite, as another reader sees it
        assert store.get(key_of(0, 1000)) is None
        assert (store.gets, store.hits, store.misses) == (2, 1, 1)
        assert store.keys == 100 and store.bytes == sum(len(b"k%d" % n) + 4 for n in range(100))
    finally:
        await store.close()


async def test_signed_and_unsigned_hashes_are_one_key(tmp_path: Path) -> None:
    store = KVStore(tmp_path / "kv.sqlite3")
    try:
        await committed(store.set(-1, -2, b"n", STRING, b"v"))
        assert store.get(key_of(0xFFFFFFFF, 0xFFFFFFFE)) == (STRING, b"v", 0.0, b"n")
        assert rows(tmp_path / "kv.sqlite3")[0][:2] == (0xFFFFFFFF, 0xFFFFFFFE)
    finally:
        await store.close()


async def test_values_survive_close_and_reopen_and_expired_ones_are_dropped(
    tmp_path: Path,
) -> None:
    path = tmp_path / "kv.sqlite3"
    store = KVStore(path)
    store.set(1, 2, b"int", INT, -5)
    store.set(1, 3, b"str", STRING, b"\x00\xff" * 10)
    store.set(1, 4, b"later", STRING, b"x", expires=3600)
    await store.close()  # commits what is pending
    with sqlite3.connect(path) as db:  # one that expired while the broker was down
        db.execute("INSERT INTO kv VALUES (1, 5, 'gone', 1, 9, ?)", (time.time() - 1,))
    store = KVStore(path)
    try:
        assert store.get(key_of(1, 2)) == (INT, -5, 0.0, b"int")
        assert store.get(key_of(1, 3)) == (STRING, b"\x00\xff" * 10, 0.0, b"str")
        entry = store.get(key_of(1, 4))
        assert entry is not None and entry[2] > time.time() + 3500
        assert store.get(key_of(1, 5)) is None and store.keys == 3
        assert len(rows(path)) == 3
    finally:
        await store.close()


async def test_expired_keys_are_never_returned_and_are_reclaimed(tmp_path: Path) -> None:
    path = tmp_path / "kv.sqlite3"
    store = KVStore(path)
    try:
        await committed(store.set(0, 1, b"lease", INT, 1, expires=1))
        await committed(store.set(0, 2, b"kept", INT, 2))
        # Set again before it expires: the first expiry no longer applies.
        await committed(store.set(0, 3, b"renewed", INT, 3, expires=1))
        await asyncio.sleep(0.5)
        await committed(store.set(0, 3, b"renewed", INT, 4, expires=60))
        await wait_for(lambda: store.get(key_of(0, 1)) is None)
        await wait_for(lambda: store.expired == 1 and store.keys == 2)
        await wait_for(lambda: [r[1] for r in rows(path)] == [2, 3])
        assert store.get(key_of(0, 3)) is not None
    finally:
        await store.close()


async def test_max_keys_refuses_new_keys_only(tmp_path: Path) -> None:
    store = KVStore(tmp_path / "kv.sqlite3", max_keys=2)
    try:
        assert store.set(0, 1, b"a", INT, 1) is not None
        assert store.set(0, 2, b"b", INT, 1) is not None
        assert store.set(0, 3, b"c", INT, 1) is None  # full
        assert store.set(0, 2, b"b", STRING, b"again") is not None  # an old key may change
        assert store.keys == 2 and store.sets == 3
    finally:
        await store.close()


async def test_a_failed_commit_says_why_and_restores_memory_from_sqlite(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "kv.sqlite3"
    store = KVStore(path, sync="normal")
    try:
        await committed(store.set(0, 1, b"k", STRING, b"stored"))
        pages = store._db.execute("PRAGMA page_count").fetchone()[0]
        store._db.execute(f"PRAGMA max_page_count = {pages}")  # sqlite: the disk is full
        failed = await committed(store.set(0, 1, b"k", STRING, b"x" * 100_000))
        fresh = store.set(0, 2, b"new", STRING, b"y" * 100_000)
        assert failed.error is not None and "full" in failed.error
        assert store.failed_commits == 1
        # Operators hear of it, once per WARN_EVERY however many commits fail.
        warned = [r for r in caplog.records if "a commit failed" in r.getMessage()]
        assert len(warned) == 1 and "full" in warned[0].getMessage()
        assert store.get(key_of(0, 1)) == (STRING, b"stored", 0.0, b"k")  # as in sqlite
        assert (await committed(fresh)).error is not None
        assert len([r for r in caplog.records if "a commit failed" in r.getMessage()]) == 1
        assert store.get(key_of(0, 2)) is None and store.keys == 1
        store._db.execute("PRAGMA max_page_count = 1000000")  # room again: carries on
        assert (await committed(store.set(0, 2, b"new", INT, 1))).error is None
    finally:
        await store.close()
    assert [r[1] for r in rows(path)] == [1, 2]


async def test_a_store_that_cannot_be_opened_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(KVStoreError, match=r"opencluster store .* cannot be opened"):
        KVStore(tmp_path / "file" / "kv.sqlite3")
    (tmp_path / "kv.sqlite3").write_bytes(b"not a database" * 100)
    with pytest.raises(KVStoreError, match="cannot be opened"):
        KVStore(tmp_path / "kv.sqlite3")
