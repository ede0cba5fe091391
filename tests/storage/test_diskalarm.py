"""The disk alarm: set below disk_free_limit, cleared a tenth above it, one change (and
one log line) each way; disk stores refuse to write while it is set."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from pathlib import Path

import pytest

from fqbroker.settings.broker import Settings, free_limit
from fqbroker.storage.diskalarm import ALARM_TEXT, Change, DiskAlarm, Reading, Watermark
from fqbroker.storage.segments.log import SegmentLog
from fqbroker.storage.store import DiskStore

MiB = 1 << 20


def _reading(free: int, total: int = 100 * MiB) -> Reading:
    return Reading(Path("/q"), free, total)


def test_set_below_the_limit_and_cleared_a_tenth_above_it() -> None:
    mark = Watermark(10 * MiB)
    assert mark.observe(1, _reading(50 * MiB)) is None
    assert mark.observe(1, _reading(10 * MiB)) is None  # at the limit: not below
    assert not mark.raised
    assert mark.observe(1, _reading(10 * MiB - 1)) == Change(
        True, Path("/q"), 10 * MiB - 1, 10 * MiB
    )
    assert mark.raised
    # Set once: more readings below say nothing more, nor do those above the limit
    # and under its margin (a disk hovering at the limit does not flap).
    for free in (5 * MiB, 9 * MiB, 10 * MiB, 10 * MiB + 1, 11 * MiB - 1):
        assert mark.observe(1, _reading(free)) is None
        assert mark.raised
    assert mark.observe(1, _reading(11 * MiB)) == Change(False, Path("/q"), 11 * MiB, 10 * MiB)
    assert not mark.raised
    assert mark.observe(1, _reading(12 * MiB)) is None


def test_each_file_system_on_its_own() -> None:
    mark = Watermark(10 * MiB)
    assert mark.observe(1, _reading(5 * MiB)) is not None
    assert mark.observe(2, _reading(50 * MiB)) is None
    assert mark.raised
    assert mark.observe(2, _reading(5 * MiB)) is not None  # set on this one too
    assert mark.observe(1, _reading(50 * MiB)) is not None
    assert mark.raised  # the other is still low
    assert mark.observe(2, _reading(50 * MiB)) is not None
    assert not mark.raised


def test_a_share_of_the_file_system() -> None:
    mark = Watermark(*free_limit("5%"))
    assert mark.limit_of(1000 * MiB) == 50 * MiB
    assert mark.observe(1, _reading(60 * MiB, 1000 * MiB)) is None
    change = mark.observe(1, _reading(40 * MiB, 1000 * MiB))
    assert change is not None and change.raised and change.limit == 50 * MiB


def test_off() -> None:
    mark = Watermark(*free_limit(0))
    assert mark.observe(1, _reading(0)) is None
    assert not mark.raised
    assert not DiskAlarm(0).enabled


@pytest.mark.parametrize(
    ("text", "limit"),
    [("256MiB", (256 * MiB, 0.0)), ("1GB", (10**9, 0.0)), (4096, (4096, 0.0)), ("0", (0, 0.0)),
     ("2.5%", (0, 0.025))],
)  # fmt: skip
def test_the_setting(text: int | str, limit: tuple[int, float]) -> None:
    assert free_limit(text) == limit
    assert Settings().updated({"disk_free_limit": text}).disk_free_limit == text


@pytest.mark.parametrize("bad", ["lots", "-5MiB", "100%", "5 parsecs", True, -1, 1.5, []])
def test_a_setting_it_cannot_work_with(bad: object) -> None:
    with pytest.raises(ValueError, match="disk_free_limit must be"):
        Settings().updated({"disk_free_limit": bad})


class FakeDisk:
    """statvfs of a file system whose free space the test sets (the OS's answer: the
    alarm's own code is what runs)."""

    def __init__(self, free: int, total: int = 100 * MiB) -> None:
        self.free, self.total = free, total
        self.calls: list[Path] = []

    def __call__(self, path: Path) -> os.statvfs_result:
        self.calls.append(path)
        # f_bsize, f_frsize, f_blocks, f_bfree, f_bavail, f_files, ...: in 1-byte blocks.
        return os.statvfs_result((1, 1, self.total, self.free, self.free, 0, 0, 0, 0, 255))


async def test_one_line_each_way(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "queues").mkdir()
    disk = FakeDisk(50 * MiB)
    # Two directories on one file system: looked at once, reported once.
    alarm = DiskAlarm("10MiB", (tmp_path / "queues", tmp_path), statvfs=disk)
    alarm.watch(tmp_path / "not-yet" / "q")  # made later: the file system it will be on
    caplog.set_level(logging.WARNING, "fqbroker.storage.diskalarm")
    alarm.check()
    assert disk.calls == [tmp_path / "queues"]
    assert not alarm.raised and not caplog.records
    disk.free = 1 * MiB
    for _ in range(3):
        alarm.check()
    assert alarm.raised
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"disk alarm set: {tmp_path / 'queues'} has {MiB} bytes free")
    assert f"disk_free_limit ({10 * MiB} bytes)" in line
    waiter = asyncio.ensure_future(alarm.wait_clear())
    disk.free = 10 * MiB + 1  # above the limit, under the margin: still set
    alarm.check()
    await asyncio.sleep(0)
    assert alarm.raised and not waiter.done()
    disk.free = 20 * MiB
    alarm.check()
    alarm.check()
    await asyncio.wait_for(waiter, 5)
    assert not alarm.raised
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[1].startswith(f"disk alarm cleared: {tmp_path / 'queues'} has {20 * MiB}")
    assert [reading.free for reading, _ in alarm.readings()] == [20 * MiB]
    await alarm.wait_clear()  # not raised: at once


async def test_a_disk_store_refuses_to_write_while_set(tmp_path: Path) -> None:
    disk = FakeDisk(1 * MiB)
    alarm = DiskAlarm("10MiB", (tmp_path,), statvfs=disk)
    alarm.check()
    dirty: set[DiskStore] = set()
    store = DiskStore(SegmentLog(tmp_path / "q"), dirty=dirty, alarm=alarm)
    size = store.log.size_bytes
    store.extend([b"frame one", b"frame two"])
    with pytest.raises(OSError, match=ALARM_TEXT) as refused:
        store.flush()
    assert refused.value.errno == errno.ENOSPC
    # Nothing written, nothing pending; a refusal is not a write error.
    assert store.log.size_bytes == size and store.written_seq == 0 and not store.pending
    assert store.write_errors == 0 and alarm.refusals == 2
    assert not dirty
    disk.free = 50 * MiB
    alarm.check()
    store.extend([b"frame three"])
    store.flush()
    assert store.written_seq == 1
    store.close(destroy=True)
