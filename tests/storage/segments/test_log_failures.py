"""Segment log under real write failures: EFBIG from RLIMIT_FSIZE in a child process,
no room to move damage aside, a disk that cannot create a file, failed fsyncs and
repair, and a new log directory made durably."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fqbroker.storage.segments import log as segmentlog
from fqbroker.storage.segments import records as segrecords
from fqbroker.storage.segments.log import HEADER_SIZE, SegmentLog
from tests.conftest import FailingFsync
from tests.storage.segments.test_log import (
    ROOT,
    contents,
    flip,
    p20,
    record_starts,
    segments,
    stored,
)

_EFBIG = r"""
import json, os, resource, signal, sys
from pathlib import Path
from fqbroker.storage.segments.log import SegmentLog

d = Path(sys.argv[1])
first = d / "00000000000000000001.seg"
log = SegmentLog(d, segment_bytes=4000)
log.append([b"a" * 100] * 20)  # 2320 bytes
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so write() fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (3000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
out = {}
try:
    log.append([b"b" * 100] * 10)  # to 3480: a short write, then EFBIG
except OSError as exc:
    out["errno1"] = exc.errno
out["after1"] = [log.next_seq, log.size_bytes, first.stat().st_size]
try:
    log.append([b"c" * 100] * 5 + [b"d" * 5000])  # fits in segment 1, then a new one fails
except OSError as exc:
    out["errno2"] = exc.errno
out["after2"] = [log.next_seq, log.size_bytes, first.stat().st_size, sorted(os.listdir(d))]
out["seq"] = log.append([b"e"])
out["read"] = [s for s, _ in log.read(1, 100)]
log.sync()
log.close()
print(json.dumps(out))
"""


def test_failed_write_leaves_the_log_unchanged(tmp_path: Path) -> None:
    """A real write failure: RLIMIT_FSIZE makes write() fail with EFBIG in a child process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _EFBIG, str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    out = json.loads(done.stdout)
    assert out["errno1"] == out["errno2"] == 27  # EFBIG
    assert out["after1"] == [21, 2320, 2320]
    assert out["after2"] == [
        21, 2320, 2320, ["00000000000000000001.seg", "FORMAT", "checkpoints"]
    ]  # fmt: skip
    assert out["seq"] == 21
    assert out["read"] == list(range(1, 22))
    log = SegmentLog(tmp_path, segment_bytes=4000)
    assert log.recovery == []
    assert contents(log) == [b"a" * 100] * 20 + [b"e"]


_NO_ROOM = r"""
import json, os, resource, signal, sys
from pathlib import Path
from fqbroker.storage.segments.log import SegmentLog

d = Path(sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (10_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    SegmentLog(d)
except OSError as exc:
    print(json.dumps({"errno": exc.errno}))
"""


def test_no_room_to_move_damage_aside_changes_nothing(tmp_path: Path) -> None:
    """The good records after damage need a file of their own; on a disk without room
    for it the log refuses to open and leaves no half-written file behind."""
    log = SegmentLog(tmp_path)
    log.append([p20(i) for i in range(1, 1001)])  # 36,000 bytes
    log.close()
    (path,) = segments(tmp_path)
    before = flip(path, 36 + 30)  # record 2: 998 good records after it, 35,928 bytes
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _NO_ROOM, str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert json.loads(done.stdout) == {"errno": 27}  # EFBIG, as ENOSPC would be
    assert path.read_bytes() == before
    assert not list(tmp_path.glob("*.tmp"))
    log = SegmentLog(tmp_path)  # with room: recovered
    assert sorted(set(range(1, 1001)) - set(stored(log))) == [2]
    log.close()


class _FullDisk:
    """Stands in for ``os`` in fqbroker.storage.segments.log: creating a file fails with ENOSPC, as
    on a disk with no inode or directory block left; everything else is the real call."""

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    def open(self, path: object, flags: int, *args: int) -> int:
        if flags & os.O_CREAT and not Path(str(path)).exists():
            raise OSError(28, os.strerror(28))
        return os.open(path, flags, *args)  # type: ignore[arg-type]


def test_a_drained_log_that_cannot_create_a_file_keeps_going(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = SegmentLog(tmp_path)
    log.append([b"x" * 1000] * 300)
    log.set_checkpoint("fq", 301)
    monkeypatch.setattr(segmentlog, "os", _FullDisk())
    assert log.trim() == 0  # no new segment: the old one stays, nothing is lost
    assert [p.name for p in segments(tmp_path)] == [f"{1:020d}.seg"]
    assert log.append([b"y"]) == 301  # and it still takes writes
    log.set_checkpoint("fq", 302)
    monkeypatch.undo()
    assert log.trim() == 301 * HEADER_SIZE + 300 * 1000 + 1  # with room: given back
    assert [p.name for p in segments(tmp_path)] == [f"{302:020d}.seg"]
    log.close()


def test_a_failed_fsync_refuses_writes_until_repaired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = SegmentLog(tmp_path, segment_bytes=200)
    log.append([p20(i) for i in range(1, 6)])  # segments 1, 6
    assert log.sync() == 5
    log.append([p20(i) for i in range(6, 12)])  # segments 6, 11
    fake = FailingFsync()
    monkeypatch.setattr(segmentlog, "os", fake)
    with pytest.raises(OSError, match="Input/output"):
        log.sync()
    for call in (lambda: log.append([b"x"]), log.sync):
        with pytest.raises(OSError, match="failed earlier"):
            call()
    assert contents(log) == [p20(i) for i in range(1, 12)]  # reads still work
    log.set_checkpoint("fq", 3)  # and so do checkpoints
    log.repair()  # while the disk still fails: the records are in the page cache
    with pytest.raises(OSError, match="Input/output"):
        log.sync()
    fake.failing = False
    log.repair()
    log.repair()  # nothing to do on a healthy log
    assert log.append([p20(12)]) == 12
    assert log.sync() == 12
    # Everything written since the last good sync was written and synced again.
    assert sorted(Path(p).name for p in fake.synced) == [
        "00000000000000000006.seg", "00000000000000000011.seg", tmp_path.name,
    ]  # fmt: skip
    log.close()
    log = SegmentLog(tmp_path, segment_bytes=200)
    assert log.recovery == []
    assert contents(log) == [p20(i) for i in range(1, 13)]


def test_repair_refuses_a_damaged_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = SegmentLog(tmp_path)
    log.append([p20(i) for i in range(1, 4)])
    log.sync()
    log.append([p20(i) for i in range(4, 8)])
    fake = FailingFsync()
    monkeypatch.setattr(segmentlog, "os", fake)
    with pytest.raises(OSError):
        log.sync()
    fake.failing = False
    path = segments(tmp_path)[0]
    with path.open("r+b") as f:  # what a page re-read from a failed disk might hold
        f.seek(record_starts(path)[5] + HEADER_SIZE)
        f.write(b"garbage")
    with pytest.raises(OSError, match="changed since it was written"):
        log.repair()
    with pytest.raises(OSError, match="failed earlier"):
        log.append([b"x"])
    log.close()
    monkeypatch.undo()
    log = SegmentLog(tmp_path)  # a reopen recovers: it skips the damaged record
    assert stored(log) == {i: p20(i) for i in range(1, 8) if i != 6}
    assert len(log.recovery) == 1
    log.close()


def test_a_new_log_directory_is_made_durably(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory's name is on disk only once its parent is fsynced: every directory the
    log creates has its parent synced, so a power cut cannot take a whole queue."""
    fsyncs = FailingFsync(failing=False)
    monkeypatch.setattr(segrecords, "os", fsyncs)
    log = SegmentLog(tmp_path / "queues" / "q")
    log.close()
    assert {str(tmp_path), str(tmp_path / "queues")} <= set(fsyncs.synced)
