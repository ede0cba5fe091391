"""Segment log: the on-disk format of a disk queue (fq: jlog behind fqd_queue_jlog.c).

A log is a directory of append-only segment files of checked records, each file named by
the sequence number of its first record, and a file of named checkpoints.
docs/disk-format.md has the bytes and the versioning rules, and says what opening
(:mod:`.segrecovery`), reading (:mod:`.segreads`), trimming and a failed fsync do; damage
never deletes what reads back correctly. This module appends, syncs, repairs, trims and
keeps the checkpoints.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import zlib
from array import array
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path

from fqbroker.errors import LogFormatError
from fqbroker.storage.files import FILE_MODE
from fqbroker.storage.segments.checkpoints import CheckpointFile
from fqbroker.storage.segments.format import (
    check_format,
    known_gaps,
    note_gap,
    open_checkpoints,
    write_format,
)
from fqbroker.storage.segments.reads import SegmentReads
from fqbroker.storage.segments.records import (
    FORMAT_GAPS,
    FORMAT_LINE,
    HEADER,
    HEADER_SIZE,
    LENSEQ,
    MARK_MASK,
    MARK_SHIFT,
    MAX_PAYLOAD,
    SCAN_CHUNK,
    SEGMENT_NAME,
    CorruptionReport,
    Damaged,
    Segment,
    make_directory_durably,
    records,
    write_all,
    write_file,
)
from fqbroker.storage.segments.recovery import Problem, recover_segments

__all__ = [
    "FORMAT_LINE",
    "HEADER_SIZE",
    "CorruptionReport",
    "LogFormatError",
    "SegmentInfo",
    "SegmentLog",
]

logger = logging.getLogger(__name__)

# A drained log (every reader at the end) whose newest segment holds this much starts a
# new, empty one, so the old one can go: a drained queue gives its disk back.
_ROLL_DRAINED = 256 << 10


_first = attrgetter("first")


def _fsync_path(path: Path) -> None:
    # Here, not in segrecords: tests put a failing fsync into this module's ``os``.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """One segment file, as :meth:`SegmentLog.segment_info` lists it."""

    first: int  # seq of its first record (or where it starts, if empty)
    end: int  # seq after its last record
    size: int  # bytes
    path: Path

    def mtime(self) -> float | None:
        """When it was last written (its newest record's arrival); None if it is gone."""
        try:
            return self.path.stat().st_mtime
        except FileNotFoundError:
            return None


class SegmentLog(SegmentReads):
    """A directory of segment files holding one queue's records, and its checkpoints.

    Threads: append, read, trim and checkpoints run on one thread (the event loop).
    ``sync``, and ``repair`` after a failed sync, may run on another one at the same time;
    they share ``next_seq``, the set of segments written since the last sync and the
    failure, under ``_lock``, which an append takes once per call. ``repair`` also reads
    the segments, which only a trim changes while the log refuses appends. Both open files
    by path, so the writer may close its descriptors whenever it wants.
    """

    def __init__(self, directory: Path, *, segment_bytes: int = 64 << 20) -> None:
        if segment_bytes <= HEADER_SIZE:
            raise ValueError(f"segment_bytes must be over {HEADER_SIZE}")
        self.directory = Path(directory)
        self.recovery = []
        self.next_seq = 1
        self.size_bytes = 0
        self._segment_bytes = segment_bytes
        self._segments = []
        self._wfd = -1  # the last segment's, opened on the first append
        self._rfds = {}
        self._cursors = {}
        self._lock = threading.Lock()  # next_seq, _dirty, _dir_dirty: shared with sync()
        self._sync_lock = threading.Lock()  # one sync at a time, or one could return early
        self._dirty: set[Segment] = set()
        self._dir_dirty = False
        self._broken: OSError | None = None
        self._closed = False
        self._holes = {}  # the reads' state: segreads.SegmentReads says what each holds
        self._gaps = []
        self._skipped = []
        self.corrupt_records = 0
        self.corrupt_bytes = 0
        self._format: int | None = None
        make_directory_durably(self.directory)
        self._ckpt = self._open_checkpoints(self._check_format())
        try:
            self._recover()
        except BaseException:
            self._ckpt.close()
            raise
        self._durable_seq = self.next_seq - 1  # recovery fsynced what it found

    # --- properties -----------------------------------------------------------------------

    @property
    def checkpoints(self) -> Mapping[str, int]:
        return self._ckpt.view

    # --- writing --------------------------------------------------------------------------

    def append(self, records: Sequence[bytes]) -> int:
        """Write ``records`` (no fsync); return the seq of the first. All or nothing."""
        self._check_writable()
        first = seq = self.next_seq
        if not records:
            return first
        active = self._segments[-1]
        fd = self._writer()
        # One plan per segment touched: (first seq, write offset, size after, end seq, parts,
        # sparse index marks). Everything is encoded before anything is written.
        plans: list[tuple[int, int, int, int, list[bytes], array[int]]] = []
        seg_first, offset, size = active.first, active.size, active.size
        parts: list[bytes] = []
        marks = array("Q")
        for payload in records:
            n = len(payload)
            if n > MAX_PAYLOAD:
                raise ValueError(f"record of {n} bytes is over the limit of {MAX_PAYLOAD}")
            if size and size + HEADER_SIZE + n > self._segment_bytes:
                plans.append((seg_first, offset, size, seq, parts, marks))
                seg_first, offset, size, parts, marks = seq, 0, 0, [], array("Q")
            if not (seq - seg_first) & MARK_MASK:
                marks.append(size)
            lenseq = LENSEQ.pack(n, seq)
            parts += (HEADER.pack(zlib.crc32(payload, zlib.crc32(lenseq)), n, seq), payload)
            size += HEADER_SIZE + n
            seq += 1
        plans.append((seg_first, offset, size, seq, parts, marks))
        created: list[tuple[Segment, int]] = []
        try:
            for seg_first, offset, _, _, seg_parts, _ in plans:
                if seg_first != active.first:
                    path = self._path(seg_first)
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
                    created.append((Segment(seg_first, path, seg_first), fd))
                if seg_parts:
                    write_all(fd, b"".join(seg_parts), offset)
        except OSError:
            self._undo(active, created)
            raise
        touched = [active, *(seg for seg, _ in created)]
        for seg, (_, offset, seg_size, end, _, seg_marks) in zip(touched, plans, strict=True):
            self.size_bytes += seg_size - offset
            seg.size, seg.end = seg_size, end
            seg.marks.extend(seg_marks)
        with self._lock:
            self._dirty.update(touched)
            if created:
                os.close(self._wfd)
                for _, old in created[:-1]:
                    os.close(old)
                self._wfd = created[-1][1]
                self._segments.extend(touched[1:])
                self._dir_dirty = True
            self.next_seq = seq
        return first

    def _undo(self, active: Segment, created: list[tuple[Segment, int]]) -> None:
        """Put the files back as they were before a failed append."""
        for _, fd in created:
            os.close(fd)
        try:
            os.ftruncate(self._wfd, active.size)  # opened before anything was written
            for seg, _ in created:
                seg.path.unlink(missing_ok=True)
        except OSError as exc:
            # Half a batch stays on disk, and a later append could make it look valid.
            self._broken = exc
            logger.error("%s: cannot undo a failed append, log disabled: %s", self.directory, exc)

    def sync(self) -> int:
        """fsync what was written since the last sync; return the highest durable seq."""
        with self._sync_lock:
            with self._lock:
                self._check_writable()
                durable = self.next_seq - 1
                paths = [seg.path for seg in self._dirty]
                self._dirty.clear()
                sync_dir, self._dir_dirty = self._dir_dirty, False
            try:
                for path in paths:
                    try:
                        _fsync_path(path)
                    except FileNotFoundError:
                        continue  # trimmed since it was written
                if sync_dir:
                    _fsync_path(self.directory)
            except OSError as exc:
                # Linux marks the failed pages clean: a later fsync would succeed without
                # the data, so every later sync would lie until repair() dirties them again.
                self._broken = exc
                raise
            self._durable_seq = durable
        return durable

    def repair(self) -> None:
        """Make a failed log writable again, if what the failed sync covered is intact.

        Every record written since the last successful sync is checked (crc, seq) and
        written again, from the page cache, so the next sync writes it to disk again; bytes
        a failed append left past the end are cut off. Raises OSError, and stays failed, if
        the disk still fails or those records are damaged (a reopen recovers then).

        Like sync(), it may run on another thread: appends fail meanwhile, and it touches
        no descriptor or cursor of the writer's and readers'.
        """
        with self._sync_lock:
            self._check_open()
            if self._broken is None:
                return
            start = max(self._durable_seq + 1, self.first_seq)
            segments = list(self._segments)
            if start < self.next_seq:
                # From the sparse index mark at or before it: a few durable records more
                # are written again, as they are, which saves a scan to find it.
                seg = segments[bisect_right(segments, start, key=_first) - 1]
                mark = (start - seg.first) >> MARK_SHIFT
                off, seq = seg.marks[mark], seg.first + (mark << MARK_SHIFT)
            else:
                seg = segments[-1]
                off, seq = seg.size, seg.end
            touched = segments[segments.index(seg) :]
            for seg in touched:
                self._rewrite(seg, off, seq)
                off, seq = 0, seg.end
            last = self._segments[-1].first
            for path in self.directory.iterdir():  # segments a failed append left behind
                if SEGMENT_NAME.fullmatch(path.name) and int(path.name[:20]) > last:
                    path.unlink()
            with self._lock:
                self._dirty.update(touched)
                self._dir_dirty = True
                self._broken = None

    def _rewrite(self, seg: Segment, off: int, seq: int) -> None:
        fd = os.open(seg.path, os.O_RDWR)
        try:
            for roff, buf, pos, crc, n, rseq in records(fd, off, seg.size, SCAN_CHUNK):
                if rseq != seq or zlib.crc32(buf[pos + 4 : pos + HEADER_SIZE + n]) != crc:
                    raise Damaged(roff, "record changed since it was written")
                seq += 1
            while off < seg.size:
                chunk = os.pread(fd, min(SCAN_CHUNK, seg.size - off), off)
                if not chunk:
                    raise Damaged(off, "file shrank while reading")
                write_all(fd, chunk, off)
                off += len(chunk)
            if os.fstat(fd).st_size > seg.size:
                os.ftruncate(fd, seg.size)
        finally:
            os.close(fd)

    # --- reading --------------------------------------------------------------------------

    def _writer(self) -> int:
        if self._wfd < 0:
            self._wfd = os.open(self._segments[-1].path, os.O_WRONLY)
        return self._wfd

    # --- checkpoints and trimming ---------------------------------------------------------

    def set_checkpoint(self, name: str, seq: int, *, durable: bool = False) -> None:
        """Record that reader ``name`` reads ``seq`` next; fsync only when ``durable``.

        Either way a process crash keeps the change once this returns. If the fsync of a
        durable change fails, the change is made (it raises all the same)."""
        self._check_open()
        if not self._segments[0].first <= seq <= self.next_seq:
            raise ValueError(f"seq {seq} is outside [{self.first_seq}, {self.next_seq}]")
        self._ckpt.set(name, seq, durable=durable)

    def remove_checkpoint(self, name: str) -> None:
        self._check_open()
        points = dict(self._ckpt.points)
        del points[name]  # KeyError if there is none
        self._ckpt.replace(points, durable=False)

    def trim(self) -> int:
        """Delete the segments every checkpoint is past; return bytes freed.

        The newest segment stays (its name keeps ``next_seq``), unless every reader has read
        everything and it holds at least ``_ROLL_DRAINED`` bytes: then an empty one is
        started after it, and it goes too, so a drained queue gives its disk back."""
        self._check_open()
        points = self._ckpt.points
        if not points:
            return 0
        low = min(points.values())
        drained = low >= self.next_seq and self._broken is None
        if drained and self._segments[-1].size >= _ROLL_DRAINED:
            self._roll()
        return self._drop_front(low, points)

    def segment_info(self) -> list[SegmentInfo]:
        """The segments, oldest first: what retention (topics) decides on."""
        self._check_open()
        return [SegmentInfo(seg.first, seg.end, seg.size, seg.path) for seg in self._segments]

    def drop_before(self, seq: int) -> int:
        """Delete the segments whose records all come before ``seq`` (retention: whoever
        reads them), never the newest; return bytes freed. Checkpoints below the first seq
        left move up to it."""
        self._check_open()
        return self._drop_front(seq, self._ckpt.points)

    def _drop_front(self, low: int, points: Mapping[str, int]) -> int:
        freed = 0
        while len(self._segments) > 1 and self._segments[0].end <= low:
            seg = self._segments[0]
            fd = self._rfds.pop(seg.first, None)
            if fd is not None:
                os.close(fd)
            seg.path.unlink(missing_ok=True)
            del self._segments[0]
            with self._lock:
                self._dirty.discard(seg)
                self._dir_dirty = True
            self.size_bytes -= seg.size
            freed += seg.size
        if freed:
            first = self.first_seq
            self._cursors = {s: c for s, c in self._cursors.items() if c[0].first >= first}
            live = {seg.first for seg in self._segments}
            self._gaps = [g for g in self._gaps if g[2].first in live]
            self._holes = {k: v for k, v in self._holes.items() if k[0] in live}
            self._skipped = [g for g in self._skipped if g[1] > first]
            if points and min(points.values()) < first:  # trimmed past them: to the first left
                moved = {name: max(seq, first) for name, seq in points.items()}
                self._ckpt.replace(moved, durable=False)
        return freed

    def _roll(self) -> None:
        """Start an empty newest segment at ``next_seq``, so trim can delete the old one."""
        path = self._path(self.next_seq)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        except OSError as exc:
            # A full disk can refuse even an empty file (no inode, no directory block):
            # nothing changed, and the next trim tries again.
            logger.debug("%s: cannot start a new segment: %s", self.directory, exc)
            return
        with self._lock:
            if self._wfd >= 0:
                os.close(self._wfd)
            self._wfd = fd
            self._segments.append(Segment(self.next_seq, path, self.next_seq))
            self._dir_dirty = True

    # --- lifetime -------------------------------------------------------------------------

    def release_descriptors(self) -> None:
        """Close the writer's and the readers' descriptors; the next append or read opens
        what it needs again. For logs that sit idle in numbers (retained topics): each
        would otherwise keep up to ``2 + _READ_FDS`` descriptors from the process's limit."""
        if self._closed:
            return
        with self._lock:  # an append holds it while it swaps the writer's descriptor
            fds = [self._wfd, *self._rfds.values()]
            self._wfd = -1
            self._rfds.clear()
        self._cursors.clear()  # they name read positions, not descriptors, but go cold
        for fd in fds:
            if fd >= 0:
                os.close(fd)

    def close(self) -> None:
        """Close the files; no fsync (call sync() first for that). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for fd in [self._wfd, *self._rfds.values()]:
            if fd >= 0:
                os.close(fd)
        self._ckpt.close()
        self._wfd = -1
        self._rfds.clear()
        self._cursors.clear()

    def destroy(self) -> None:
        self.close()
        with contextlib.suppress(FileNotFoundError):
            import shutil  # with bz2 and lzma: only queues being deleted need it

            shutil.rmtree(self.directory)

    def _check_writable(self) -> None:
        self._check_open()
        if self._broken is not None:  # reads still work: what is stored was checked
            msg = f"segment log {self.directory} failed earlier ({self._broken}); reopen it"
            raise OSError(errno.EIO, msg) from self._broken

    def _path(self, first: int) -> Path:
        return self.directory / f"{first:020d}.seg"

    # --- opening and recovery -------------------------------------------------------------

    def _check_format(self) -> int | None:
        self._format = check_format(self.directory, self._error)
        return self._format

    def _open_checkpoints(self, version: int | None) -> CheckpointFile:
        ckpt = open_checkpoints(self.directory, version, self._error)
        self._format = max(self._format or 2, 2)
        return ckpt

    def _add_gap(self, lo: int, stop: int) -> None:
        """Mark the log as one with gaps, and note this one, before recovery makes it."""
        if self._format != 3:
            write_format(self.directory, FORMAT_GAPS)
            self._format = 3
        note_gap(self.directory, lo, stop)

    def _error(self, segment: str, offset: int, reason: str, dropped: int) -> None:
        self._report(segment, offset, reason, dropped, 0, torn=False)

    def _recover(self) -> None:
        known = known_gaps(self.directory)
        self._segments, problems = recover_segments(self.directory, self._add_gap, known)
        for problem in problems:
            self._problem(problem)
        self.size_bytes = sum(seg.size for seg in self._segments)
        if self._segments:
            self.next_seq = self._segments[-1].end
        saved = dict(self._ckpt.points)
        points = dict(saved)
        floor = max([1, *points.values()])
        if self._segments and self.next_seq < floor:
            self._checkpoint_past_end(points, floor)
        if not self._segments:
            self._segments.append(Segment(floor, self._path(floor), floor))
            write_file(self._segments[0].path, b"", fsync=True)
            _fsync_path(self.directory)
            self.next_seq = floor
        pairs = zip(self._segments, self._segments[1:], strict=False)
        self._skipped = [(a.end, b.first) for a, b in pairs if b.first > a.end]
        for name, seq in points.items():
            if seq < self.first_seq:  # its records are gone: read from the first one left
                points[name] = self.first_seq
            elif seq < self.next_seq and seq >= self._find(seq).end:  # skipped: past them
                points[name] = self._locate(seq)[2]
        if points != saved:
            logger.warning("%s: checkpoints %s became %s", self.directory, saved, points)
            self._ckpt.replace(points, durable=True)

    def _checkpoint_past_end(self, points: dict[str, int], floor: int) -> None:
        """A checkpoint is past the last record: records were lost after a reader saw them."""
        lost = floor - self.next_seq
        if min(points.values()) >= self.next_seq:
            # No reader needs what is stored: restart empty at the checkpoint, never reusing
            # a seq a reader has seen.
            dropped = self.size_bytes
            for seg in self._segments:
                seg.path.unlink()
            self._segments.clear()
            self.size_bytes = 0
            reason = f"log ends at seq {self.next_seq}, before a checkpoint at {floor}"
            self._report(self._path(floor).name, 0, reason, dropped, lost, torn=False)
            for name in points:
                points[name] = floor
            return
        # A reader still needs stored records, so keep them and reuse the lost seqs.
        reason = f"checkpoints past the last seq {self.next_seq - 1} moved back; seqs reused"
        self._report(self._segments[-1].path.name, 0, reason, 0, lost, torn=False)
        for name, seq in points.items():
            points[name] = min(seq, self.next_seq)

    def _report(
        self, segment: str, offset: int, reason: str, dropped: int, records: int, *, torn: bool
    ) -> None:
        self._problem(Problem(segment, offset, reason, dropped, records, "", torn))
