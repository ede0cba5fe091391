"""The OpenCluster store on its own: memory reads, group commits to a real journal file,
folds into a real sqlite file, expiry, max_keys, writes that fail (a journal on /dev/full:
the kernel's own "No space left on device"), reopen, and what a crash leaves (the
directory copied while the store runs: what kill -9 leaves on disk)."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from fqbroker.errors import KVStoreError
from fqbroker.storage.kv import store as kvstore
from fqbroker.storage.kv.journal import journal_path, journals, replay
from fqbroker.storage.kv.store import INT, STRING, Batch, KVStore, key_of
from tests.conftest import TIMEOUT, wait_for


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


def journaled(path: Path) -> list[tuple[object, ...]]:
    """The records of the journals beside ``path``, as a restart replays them."""
    return [record for _, journal in journals(path) for record in replay(journal)]


def crash_copy(path: Path, to: Path) -> Path:
    """What kill -9 would leave of a running store: its directory as the kernel has it."""
    shutil.copytree(path.parent, to)
    return to / path.name


async def folded(store: KVStore) -> None:
    await wait_for(lambda: store._folding is None)


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
        assert len(journaled(path)) == 100  # in the journal, as a restart reads it
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
        assert journaled(tmp_path / "kv.sqlite3")[0][:2] == (0xFFFFFFFF, 0xFFFFFFFE)
    finally:
        await store.close()
    assert rows(tmp_path / "kv.sqlite3")[0][:2] == (0xFFFFFFFF, 0xFFFFFFFE)


async def test_values_survive_close_and_reopen_and_expired_ones_are_dropped(
    tmp_path: Path,
) -> None:
    path = tmp_path / "kv.sqlite3"
    store = KVStore(path)
    store.set(1, 2, b"int", INT, -5)
    store.set(1, 3, b"str", STRING, b"\x00\xff" * 10)
    store.set(1, 4, b"later", STRING, b"x", expires=3600)
    await store.close()  # writes what is pending and folds it into sqlite
    assert len(rows(path)) == 3 and journals(path) == []  # a clean restart reads sqlite alone
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
        assert store.get(key_of(0, 3)) is not None
    finally:
        await store.close()
    assert [r[1] for r in rows(path)] == [2, 3]  # the fold left the expired key out


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


def full_disk(path: Path, gen: int) -> None:
    """The journal of ``gen`` will be /dev/full: every write to it fails with ENOSPC."""
    journal_path(path, gen).symlink_to("/dev/full")


async def test_a_failed_write_says_why_and_restores_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "kv.sqlite3"
    store = KVStore(path, sync="normal", fold_bytes=1)  # a fold after each write
    try:
        await committed(store.set(0, 1, b"k", STRING, b"stored"))
        await folded(store)
        full_disk(path, 2)
        full_disk(path, 3)
        failed = await committed(store.set(0, 1, b"k", STRING, b"x" * 100_000))
        fresh = store.set(0, 2, b"new", STRING, b"y" * 100_000)
        assert failed.error is not None and "No space left" in failed.error
        assert store.failed_commits == 1
        # Operators hear of it, once per WARN_EVERY however many writes fail.
        warned = [r for r in caplog.records if "journal write failed" in r.getMessage()]
        assert len(warned) == 1 and "No space left" in warned[0].getMessage()
        assert store.get(key_of(0, 1)) == (STRING, b"stored", 0.0, b"k")  # as on disk
        assert (await committed(fresh)).error is not None
        assert len([r for r in caplog.records if "journal write failed" in r.getMessage()]) == 1
        assert store.get(key_of(0, 2)) is None and store.keys == 1
        # The journal goes on in a new file (gen 4): the store carries on.
        assert (await committed(store.set(0, 2, b"new", INT, 1))).error is None
    finally:
        await store.close()
    assert [r[1] for r in rows(path)] == [1, 2] and rows(path)[0][4] == b"stored"


async def test_two_failed_writes_in_a_row_restore_the_value_before_both(tmp_path: Path) -> None:
    path = tmp_path / "kv.sqlite3"
    store = KVStore(path, sync="normal", fold_bytes=1)
    try:
        await committed(store.set(0, 1, b"k", STRING, b"v0"))
        await folded(store)
        full_disk(path, 2)
        full_disk(path, 3)
        first = store.set(0, 1, b"k", STRING, b"v1")
        await asyncio.sleep(0)  # v1's batch is being written: v2 joins the next one
        second = store.set(0, 1, b"k", STRING, b"v2")
        assert first is not second
        assert (await committed(first)).error is not None
        assert store.get(key_of(0, 1)) == (STRING, b"v2", 0.0, b"k")  # v2 still pending
        assert (await committed(second)).error is not None
        assert store.get(key_of(0, 1)) == (STRING, b"v0", 0.0, b"k")
    finally:
        await store.close()
    store = KVStore(path)
    try:
        assert store.get(key_of(0, 1)) == (STRING, b"v0", 0.0, b"k")
    finally:
        await store.close()


async def test_folds_run_while_sets_go_on_and_a_crash_at_any_point_loses_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "db" / "kv.sqlite3"
    store = KVStore(path, sync="normal", fold_bytes=4096)
    try:
        for round_ in range(40):
            for n in range(50):
                store.set(0, n, b"k%d" % n, INT, round_ * 100 + n)
            last = store.set(1, round_, b"r%d" % round_, STRING, b"x" * 100)
            await committed(last)
            if round_ % 8 == 7:
                await folded(store)  # else the sets outrun the fold thread: fewer folds
        assert store.folds >= 4
        crashed = crash_copy(path, tmp_path / "crash")  # sets since the last fold: journaled
    finally:
        await store.close()
    assert journals(path) == []
    for each in (path, crashed):
        store = KVStore(each)
        try:
            assert store.keys == 90
            assert all(
                store.get(key_of(0, n)) == (INT, 3900 + n, 0.0, b"k%d" % n) for n in range(50)
            )
            assert all(store.get(key_of(1, r)) is not None for r in range(40))
        finally:
            await store.close()


async def test_a_journal_folded_before_a_crash_is_not_replayed_over_newer_values(
    tmp_path: Path,
) -> None:
    path = tmp_path / "kv.sqlite3"
    store = KVStore(path, sync="normal", fold_bytes=1)
    try:
        await committed(store.set(0, 1, b"k", STRING, b"old"))
        stale = journal_path(path, 1).read_bytes()
        await folded(store)
        await committed(store.set(0, 1, b"k", STRING, b"new"))
        await folded(store)
    finally:
        await store.close()
    journal_path(path, 1).write_bytes(stale)  # as if the crash came before its unlink
    store = KVStore(path)
    try:
        assert store.get(key_of(0, 1)) == (STRING, b"new", 0.0, b"k")
        assert not journal_path(path, 1).exists()
    finally:
        await store.close()


async def test_a_torn_last_batch_is_ignored_and_the_batches_before_it_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "db" / "kv.sqlite3"
    store = KVStore(path)
    try:
        await committed(store.set(0, 1, b"a", INT, 1))
        await committed(store.set(0, 2, b"b", INT, 2))
        crashed = crash_copy(path, tmp_path / "crash")
    finally:
        await store.close()
    ((_, journal),) = journals(crashed)
    data = journal.read_bytes()
    # The batches, then the zeros written ahead of them (the last set's value ends in 2).
    end = len(data.rstrip(b"\0"))
    assert end < len(data)
    journal.write_bytes(data[: end - 3])  # the second batch's write never finished
    caplog.set_level(logging.WARNING)
    store = KVStore(crashed)
    try:
        assert store.get(key_of(0, 1)) == (INT, 1, 0.0, b"a") and store.get(key_of(0, 2)) is None
        assert any("never finished" in r.getMessage() for r in caplog.records)
    finally:
        await store.close()


async def test_a_batch_torn_over_the_zeros_ahead_is_ignored_and_the_zeros_are_no_damage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "db" / "kv.sqlite3"
    store = KVStore(path)
    try:
        await committed(store.set(0, 1, b"a", INT, 1))
        await committed(store.set(0, 2, b"b", INT, 2))
        crashed = crash_copy(path, tmp_path / "crash")
    finally:
        await store.close()
    ((_, journal),) = journals(crashed)
    caplog.set_level(logging.WARNING)
    # As written: both batches, and no word about the zeros (a copy: a close folds).
    store = KVStore(crash_copy(crashed, tmp_path / "again"))
    try:
        assert store.get(key_of(0, 2)) == (INT, 2, 0.0, b"b")
        assert not caplog.records
    finally:
        await store.close()
    data = bytearray(journal.read_bytes())
    end = len(data.rstrip(b"\0"))
    data[end - 3 : end] = bytes(3)  # the last pages of the second batch never reached the disk
    journal.write_bytes(bytes(data))
    store = KVStore(crashed)
    try:
        assert store.get(key_of(0, 1)) == (INT, 1, 0.0, b"a") and store.get(key_of(0, 2)) is None
        assert any("never finished" in r.getMessage() for r in caplog.records)
    finally:
        await store.close()


async def test_a_store_that_cannot_be_opened_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(KVStoreError, match=r"opencluster store .* cannot be opened"):
        KVStore(tmp_path / "file" / "kv.sqlite3")
    (tmp_path / "kv.sqlite3").write_bytes(b"not a database" * 100)
    with pytest.raises(KVStoreError, match="cannot be opened"):
        KVStore(tmp_path / "kv.sqlite3")


# --- flushes in flight together (sync = "full") ----------------------------------------------


class Flushes:
    """The journal thread's fdatasync, held until released, each answering as told: a
    test decides when each flush ends and whether it fails (os.fdatasync is replaced,
    not a method: the store's classes may be compiled). Records whether each flush found
    its file still open (a file must not be closed under a flush queued on it)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, in_flight: int = 2) -> None:
        monkeypatch.setattr(kvstore, "FLUSHES", in_flight)  # 2: a batch written behind one
        monkeypatch.setattr(kvstore, "INLINE_FLUSH", 0.0)  # every flush in the thread
        self.gates: list[threading.Event] = []
        self.errors: list[OSError | None] = []
        self.open_at_flush: list[bool] = []
        self.calls = 0
        self._real = os.fdatasync
        monkeypatch.setattr(os, "fdatasync", self.fdatasync)

    def plan(self, *errors: OSError | None) -> None:
        """How the next flushes end, in order."""
        for error in errors:
            self.gates.append(threading.Event())
            self.errors.append(error)

    def release(self, n: int) -> None:
        self.gates[n].set()

    def fdatasync(self, fd: int) -> None:
        if not threading.current_thread().name.startswith("fq-kvjournal"):
            self._real(fd)  # a new journal's own sync, on the loop
            return
        n = self.calls
        self.calls += 1
        assert self.gates[n].wait(TIMEOUT)
        try:
            os.fstat(fd)
            self.open_at_flush.append(True)
        except OSError:
            self.open_at_flush.append(False)
        error = self.errors[n]
        if error is not None:
            raise error


def eio() -> OSError:
    return OSError(errno.EIO, os.strerror(errno.EIO))


async def test_a_batch_is_written_while_the_one_before_flushes_and_they_complete_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "kv.sqlite3"
    store = KVStore(path)
    try:
        await committed(store.set(0, 1, b"k", STRING, b"v0"))
        flushes = Flushes(monkeypatch)
        flushes.plan(None, None, None)
        order: list[str] = []
        first = store.set(0, 1, b"k", STRING, b"v1")
        await asyncio.sleep(0)  # written; its flush runs (held)
        second = store.set(0, 2, b"k2", STRING, b"w")
        await asyncio.sleep(0)  # written too, its flush queued behind the first
        third = store.set(0, 1, b"k", STRING, b"v3")
        await asyncio.sleep(0)  # two in flight: this one waits, open
        assert first is not None and second is not None and third is not None
        assert len({id(first), id(second), id(third)}) == 3
        assert len(store._flushing) == 2 and store._open is third
        for name, batch in (("first", first), ("second", second), ("third", third)):
            batch.waiters.append(lambda name=name: order.append(name))
        assert len(journaled(path)) == 3  # both in flight are in the file already
        flushes.release(1)  # the second's fdatasync may not end before the first's
        await asyncio.sleep(0.05)
        assert not first.done and not second.done and order == []
        flushes.release(0)
        await committed(second)
        assert first.error is None and second.error is None and order == ["first", "second"]
        flushes.release(2)
        assert (await committed(third)).error is None
        assert order == ["first", "second", "third"] and store.commits == 4
        assert flushes.open_at_flush == [True, True, True]
    finally:
        await store.close()
    store = KVStore(path)
    try:
        assert store.get(key_of(0, 1)) == (STRING, b"v3", 0.0, b"k")
        assert store.get(key_of(0, 2)) == (STRING, b"w", 0.0, b"k2")
    finally:
        await store.close()


async def test_a_failed_flush_fails_the_batches_written_behind_it_to_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "kv.sqlite3"
    store = KVStore(path)
    try:
        await committed(store.set(0, 1, b"k", STRING, b"v0"))
        await committed(store.set(0, 2, b"j", STRING, b"j0"))
        gen = store._journal.gen
        flushes = Flushes(monkeypatch)
        # The first fails; the second's fdatasync then succeeds (as Linux reports a
        # writeback error once), yet its batch follows a batch the file may have lost.
        flushes.plan(eio(), None, None)
        order: list[str] = []
        first = store.set(0, 1, b"k", STRING, b"v1")
        store.set(0, 2, b"j", STRING, b"j1")
        await asyncio.sleep(0)
        second = store.set(0, 1, b"k", STRING, b"v2")
        store.set(0, 2, b"j", STRING, b"j2")
        store.set(0, 3, b"new", STRING, b"n")  # a new key of a failed batch: gone again
        await asyncio.sleep(0)
        third = store.set(0, 1, b"k", STRING, b"v3")
        assert first is not None and second is not None and third is not None
        assert len(store._flushing) == 2
        for name, batch in (("first", first), ("second", second), ("third", third)):
            batch.waiters.append(lambda name=name: order.append(name))
        # Reads see the latest sets while they are in flight.
        assert store.get(key_of(0, 2)) == (STRING, b"j2", 0.0, b"j")
        flushes.release(0)
        flushes.release(1)
        await committed(second)
        assert first.error is not None and "Input/output error" in first.error
        assert second.error == first.error and order == ["first", "second"]
        assert store.failed_commits == 2
        # Both failed batches' keys are back to what is on disk; the third batch's set
        # of k is still to be written, so k keeps it (and would go back to v0).
        assert store.get(key_of(0, 2)) == (STRING, b"j0", 0.0, b"j")
        assert store.get(key_of(0, 3)) is None and store.keys == 2
        assert store.get(key_of(0, 1)) == (STRING, b"v3", 0.0, b"k")
        assert third.olds[key_of(0, 1)] == (STRING, b"v0", 0.0, b"k")
        # The journal went on in a new file; the failed one stayed open for the second
        # flush, and was closed after it.
        assert store._journal.gen > gen
        flushes.release(2)
        assert (await committed(third)).error is None
        assert order == ["first", "second", "third"]
        assert flushes.open_at_flush == [True, True, True]
        assert store.bytes == len(b"k") + len(b"v3") + len(b"j") + len(b"j0")
    finally:
        await store.close()
    store = KVStore(path)
    try:
        assert store.get(key_of(0, 1)) == (STRING, b"v3", 0.0, b"k")
        assert store.get(key_of(0, 2)) == (STRING, b"j0", 0.0, b"j")
        assert store.get(key_of(0, 3)) is None
    finally:
        await store.close()


async def test_a_write_that_fails_behind_a_flush_in_flight_is_answered_in_its_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "kv.sqlite3"
    store = KVStore(path)
    try:
        await committed(store.set(0, 1, b"k", STRING, b"v0"))
        gen = store._journal.gen
        full_disk(path, gen + 1)  # where the journal goes on after the failed flush
        flushes = Flushes(monkeypatch)
        flushes.plan(eio(), None, None)
        order: list[str] = []
        first = store.set(0, 1, b"k", STRING, b"v1")
        await asyncio.sleep(0)
        second = store.set(0, 1, b"k", STRING, b"v2")
        await asyncio.sleep(0)
        third = store.set(0, 1, b"k", STRING, b"v3")  # its write will hit the full disk
        assert first is not None and second is not None and third is not None
        for name, batch in (("first", first), ("second", second), ("third", third)):
            batch.waiters.append(lambda name=name: order.append(name))
        flushes.release(0)
        await wait_for(lambda: store._open is None and len(store._flushing) == 2)
        assert not third.done  # failed, but behind the second, still in flight
        flushes.release(1)
        await committed(third)
        assert order == ["first", "second", "third"]
        assert "Input/output error" in (second.error or "")
        assert "No space left" in (third.error or "")
        assert store.get(key_of(0, 1)) == (STRING, b"v0", 0.0, b"k")
        # And the store carries on, in the next file.
        flushes.release(2)
        assert (await committed(store.set(0, 1, b"k", STRING, b"v4"))).error is None
    finally:
        await store.close()
    store = KVStore(path)
    try:
        assert store.get(key_of(0, 1)) == (STRING, b"v4", 0.0, b"k")
    finally:
        await store.close()


async def test_folds_wait_for_the_flushes_in_flight_and_lose_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kvstore, "FLUSHES", 2)
    monkeypatch.setattr(kvstore, "INLINE_FLUSH", 0.0)
    path = tmp_path / "db" / "kv.sqlite3"
    store = KVStore(path, fold_bytes=4096)
    try:
        pending: list[Batch] = []
        for round_ in range(60):
            for n in range(20):
                batch = store.set(0, n, b"k%d" % n, INT, round_ * 100 + n)
                assert batch is not None
            pending.append(batch)
            await asyncio.sleep(0)  # no wait for the commit: batches overlap
            if round_ % 15 == 14:
                await committed(batch)
                await folded(store)  # else the sets outrun the fold thread: fewer folds
        for batch in pending:
            assert (await committed(batch)).error is None
        await folded(store)
        assert store.folds >= 2 and store.failed_commits == 0
        crashed = crash_copy(path, tmp_path / "crash")
    finally:
        await store.close()
    for each in (path, crashed):
        store = KVStore(each)
        try:
            assert store.keys == 20
            assert all(
                store.get(key_of(0, n)) == (INT, 5900 + n, 0.0, b"k%d" % n) for n in range(20)
            )
        finally:
            await store.close()


async def test_the_next_batch_is_written_before_the_flushed_one_is_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "kv.sqlite3"
    store = KVStore(path)
    try:
        await committed(store.set(0, 1, b"k", STRING, b"v0"))
        flushes = Flushes(monkeypatch, in_flight=1)
        flushes.plan(None, None)
        first = store.set(0, 1, b"k", STRING, b"v1")
        await asyncio.sleep(0)
        second = store.set(0, 1, b"k", STRING, b"v2")
        await asyncio.sleep(0)
        assert first is not None and second is not None and first is not second
        assert store._open is second and len(store._flushing) == 1  # one in flight
        seen: list[tuple[bool, int]] = []
        first.waiters.append(lambda: seen.append((second.done, len(store._flushing))))
        flushes.release(0)
        await committed(first)
        # When the first batch's acks go out, the second is written and its flush queued.
        assert seen == [(False, 1)] and store._open is None
        flushes.release(1)
        assert (await committed(second)).error is None
    finally:
        await store.close()


async def test_a_write_failing_after_a_failed_flush_is_answered_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "kv.sqlite3"
    store = KVStore(path)
    try:
        await committed(store.set(0, 1, b"k", STRING, b"v0"))
        full_disk(path, store._journal.gen + 1)  # where the journal goes on after it
        flushes = Flushes(monkeypatch, in_flight=1)
        flushes.plan(eio())
        order: list[str] = []
        first = store.set(0, 1, b"k", STRING, b"v1")
        await asyncio.sleep(0)
        second = store.set(0, 1, b"k", STRING, b"v2")
        store.set(0, 2, b"j", STRING, b"new")
        assert first is not None and second is not None
        for name, batch in (("first", first), ("second", second)):
            batch.waiters.append(lambda name=name: order.append(name))
        flushes.release(0)
        await committed(second)
        assert order == ["first", "second"]
        assert "Input/output error" in (first.error or "")
        assert "No space left" in (second.error or "")
        assert store.get(key_of(0, 1)) == (STRING, b"v0", 0.0, b"k")
        assert store.get(key_of(0, 2)) is None and store.keys == 1
    finally:
        await store.close()
