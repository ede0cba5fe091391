"""Where the OpenCluster store's fdatasync runs (sync = "full"): on the loop while the disk
is fast (INLINE_FLUSH), in the journal thread while it is slow; a failed flush on the
loop. A real journal file in tmp_path; os.fdatasync is replaced, to see which thread ran
it and to make one slow or fail (the disk's own time would make the tests depend on it:
what a crash leaves is the page cache's, which crash_copy reads)."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from pathlib import Path

import pytest

from fqbroker.storage.kv import store as kvstore
from fqbroker.storage.kv.store import STRING, KVStore, key_of
from tests.storage.kv.test_store import committed, crash_copy


class Syncs:
    """os.fdatasync, recording the thread of each call; ``plan`` says what the next calls
    do, in order: seconds to take, or an error to raise (then none, at once)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.threads: list[str] = []
        self.plan: list[float | OSError] = []
        monkeypatch.setattr(kvstore, "INLINE_FLUSH", 0.05)  # far above a fake's time
        monkeypatch.setattr(os, "fdatasync", self.fdatasync)

    def fdatasync(self, fd: int) -> None:
        os.fstat(fd)  # the descriptor is open
        self.threads.append(threading.current_thread().name)
        what = self.plan.pop(0) if self.plan else 0.0
        if isinstance(what, OSError):
            raise what
        time.sleep(what)


async def test_a_fast_disks_flush_runs_on_the_loop_and_the_batch_is_answered_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "kv.sqlite3"
    syncs = Syncs(monkeypatch)
    store = KVStore(path)
    try:
        await committed(store.set(0, 1, b"k", STRING, b"v0"))  # the journal file is open
        syncs.threads.clear()
        batch = store.set(0, 1, b"k", STRING, b"v1")
        assert batch is not None and not batch.done
        await asyncio.sleep(0)  # the turn's commit: written and flushed, here
        assert batch.done and batch.error is None and not store._flushing
        assert syncs.threads == [threading.current_thread().name]
        crashed = crash_copy(path, tmp_path / "crash")
    finally:
        await store.close()
    store = KVStore(crashed)
    try:
        assert store.get(key_of(0, 1)) == (STRING, b"v1", 0.0, b"k")
    finally:
        await store.close()


async def test_a_slow_flush_sends_the_next_to_the_journal_thread_until_one_is_fast(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "kv.sqlite3"
    syncs = Syncs(monkeypatch)
    store = KVStore(path)
    try:
        await committed(store.set(0, 1, b"k", STRING, b"v0"))
        syncs.threads.clear()
        syncs.plan = [2 * kvstore.INLINE_FLUSH, 0.0, 0.0]
        loop = threading.current_thread().name
        for n in range(3):
            assert (await committed(store.set(0, 1, b"k", STRING, b"v%d" % n))).error is None
        # The slow one on the loop; the next in the thread, fast: the third on the loop.
        assert syncs.threads[0] == loop and syncs.threads[2] == loop
        assert syncs.threads[1].startswith("fq-kvjournal")
        assert store.get(key_of(0, 1)) == (STRING, b"v2", 0.0, b"k")
    finally:
        await store.close()


async def test_a_failed_flush_on_the_loop_fails_its_batch_and_the_journal_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "kv.sqlite3"
    syncs = Syncs(monkeypatch)
    store = KVStore(path)
    try:
        await committed(store.set(0, 1, b"k", STRING, b"v0"))
        gen = store._journal.gen
        syncs.threads.clear()
        syncs.plan = [OSError(errno.EIO, os.strerror(errno.EIO))]
        failed = store.set(0, 1, b"k", STRING, b"v1")
        new = store.set(0, 2, b"j", STRING, b"new")
        assert failed is not None and failed is new
        await asyncio.sleep(0)
        assert failed.done and "Input/output error" in (failed.error or "")
        assert syncs.threads == [threading.current_thread().name]
        # Memory as before the batch, and the next batch in a new file.
        assert store.get(key_of(0, 1)) == (STRING, b"v0", 0.0, b"k")
        assert store.get(key_of(0, 2)) is None and store.failed_commits == 1
        later = await committed(store.set(0, 1, b"k", STRING, b"v2"))
        assert later.error is None and store._journal.gen == gen + 1
        crashed = crash_copy(path, tmp_path / "crash")
    finally:
        await store.close()
    # (After a crash the failed batch may turn up: its write may reach the disk later.)
    for each in (path, crashed):
        store = KVStore(each)
        try:
            assert store.get(key_of(0, 1)) == (STRING, b"v2", 0.0, b"k")
            if each == path:
                assert store.get(key_of(0, 2)) is None
        finally:
            await store.close()


async def test_inline_flush_zero_keeps_every_fdatasync_in_the_journal_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # [opencluster] inline_sync_ms = 0: a disk that hangs in an fdatasync stalls the
    # store's thread, never the loop.
    syncs = Syncs(monkeypatch)
    store = KVStore(tmp_path / "kv.sqlite3", inline_flush=0.0)
    try:
        await committed(store.set(0, 1, b"k", STRING, b"v"))
        syncs.threads.clear()  # the journal's creation is synced where it is made
        for n in range(3):
            assert (await committed(store.set(0, 1, b"k", STRING, b"v%d" % n))).error is None
        assert len(syncs.threads) == 3
        assert all(t.startswith("fq-kvjournal") for t in syncs.threads), syncs.threads
    finally:
        await store.close()
