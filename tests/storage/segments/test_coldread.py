"""Reading ahead of a reader behind the memory (fqbroker/storage/segments/coldread.py)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from fqbroker.core.message import Message
from fqbroker.storage.segments import coldread
from fqbroker.storage.segments.coldread import WINDOW, ReadAhead
from fqbroker.storage.segments.log import SegmentLog
from fqbroker.storage.store import DiskStore


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_reads_ahead_once_per_window_and_leaves_no_file_open(tmp_path: Path) -> None:
    path = tmp_path / "seg"
    path.write_bytes(b"x" * (WINDOW * 2))
    ahead = ReadAhead()
    fds = _open_fds()
    ahead.after_read((path, 0))
    first = ahead._task
    assert first is not None
    ahead.after_read((path, 10))  # one read at a time
    assert ahead._task is first
    await first
    assert ahead._task is None
    ahead.after_read((path, 1000))  # still well ahead: nothing to do
    assert ahead._task is None
    ahead.after_read((path, WINDOW // 2 + 1))  # half the window used: read on
    assert ahead._task is not None
    await ahead._task
    ahead.after_read((path, 0))  # back before the window (a rewind): read there again
    assert ahead._task is not None
    await ahead._task
    ahead.after_read((tmp_path / "gone", 0))  # a trimmed segment: nothing raised
    await asyncio.sleep(0.05)
    assert _open_fds() == fds


async def test_close_cancels_and_leaves_no_file_open(tmp_path: Path) -> None:
    path = tmp_path / "seg"
    path.write_bytes(b"x" * WINDOW)
    fds = _open_fds()
    ahead = ReadAhead()
    ahead.after_read((path, 0))
    ahead.close()
    assert ahead._task is None
    coldread._threads().submit(lambda: None).result()  # the thread's read is over
    await asyncio.sleep(0.05)
    assert _open_fds() == fds


def test_outside_an_event_loop_it_does_nothing(tmp_path: Path) -> None:
    ahead = ReadAhead()
    ahead.after_read((tmp_path / "seg", 0))
    assert ahead._task is None


async def test_a_consumer_reading_the_file_reads_ahead(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path / "log")
    log.append([Message(b"e", b"r", b"p", bytes(16), b"s", bytes(100)).peer_frame()] * 10)
    store = DiskStore(log)
    try:
        assert store.take(5)  # nothing in memory: from the file
        assert store.read_ahead._task is not None
        await store.read_ahead._task
    finally:
        store.close(destroy=True)
