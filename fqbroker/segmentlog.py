"""Segment log: the on-disk format of a disk queue (fq: jlog behind fqd_queue_jlog.c).

Theory of operation
-------------------
A log is a directory of append-only segment files named by the sequence number of their
first record (``00000000000000000001.seg``), so sorting names sorts sequence numbers. A
record is a 16-byte header (crc32, payload length, seq; big-endian) and the payload; the
crc covers everything after itself. Sequence numbers are dense and start at 1. The byte
layout, the FORMAT file and the versioning rules are in ``docs/disk-format.md``.

Opening a log recovers it: every record of every segment is checked (length, crc, seq).
The first bad one ends the log: its file is truncated there and later segments are
deleted, so a reader never sees a record written after a lost or damaged one. A torn
tail is normal after a crash; anything else is logged as an error. Both are listed in
``recovery``. The last segment always stays, even empty, so ``next_seq`` survives a
trim of everything; a checkpoint beyond the recovered end (records lost in a power cut)
also moves ``next_seq`` up, so a sequence number a reader has seen is not handed out again.

Threads: append, read, trim and checkpoints run on one thread (the event loop). ``sync``
may run on another one at the same time; it shares only ``next_seq`` and the set of
segments written since the last sync, under ``_lock``, which an append takes once per
call. It fsyncs by path, so the writer may close its descriptor whenever it wants.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import struct
import threading
import zlib
from array import array
from bisect import bisect_right
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from types import MappingProxyType

from .errors import FqError

__all__ = ["FORMAT_LINE", "HEADER_SIZE", "CorruptionReport", "LogFormatError", "SegmentLog"]

logger = logging.getLogger(__name__)

FORMAT_LINE = "fqbroker-segmentlog 1\n"
_HEADER = struct.Struct(">IIQ")  # crc32, payload length, seq
_LENSEQ = struct.Struct(">IQ")  # the header bytes after the crc, which the crc covers
HEADER_SIZE = _HEADER.size
_MAX_PAYLOAD = 0xFFFFFFFF
_MARK_SHIFT = 8  # the sparse index keeps the offset of every 256th record of a segment
_MARK_MASK = (1 << _MARK_SHIFT) - 1
_SEGMENT_NAME = re.compile(r"\d{20}\.seg")
_CHECKPOINTS = "checkpoints.json"
_SCAN_CHUNK = 1 << 20
_MIN_CHUNK, _MAX_CHUNK = 4 << 10, 1 << 20
_READ_FDS = 4  # open read descriptors kept per log, most recently used
_CURSORS = 8  # remembered (seq -> segment, offset) positions, so sequential reads never scan


_first = attrgetter("first")


class LogFormatError(FqError):
    """The directory holds a log of an unknown format version, or is not a segment log."""


@dataclass
class CorruptionReport:
    """One problem recovery found, and what it dropped to get past it."""

    segment: str  # file name
    offset: int  # where the log now ends in that file
    reason: str
    dropped_bytes: int
    dropped_records_after: int  # estimated from the average record size; 0 if unknown


@dataclass(eq=False, slots=True)
class _Segment:
    first: int  # seq of its first record, and its name
    path: Path
    end: int  # seq after its last record
    size: int = 0
    marks: array[int] = field(default_factory=lambda: array("Q"))


class _Damaged(OSError):
    """Bytes that are not a valid record: EIO to a reader, the end of the log to recovery."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(errno.EIO, f"{reason} at offset {offset}")
        self.offset, self.reason = offset, reason


def _records(
    fd: int, off: int, end: int, chunk: int
) -> Iterator[tuple[int, bytes, int, int, int, int]]:
    """Yield (file offset, buffer, position in it, crc, payload length, seq) for each record
    in [off, end), reading ``chunk`` bytes at a time; raise _Damaged where a record does not
    fit before ``end``. Callers slice the buffer themselves: one copy, of the payload."""
    buf, pos = b"", 0
    while off < end:
        avail, need = len(buf) - pos, HEADER_SIZE
        if avail >= HEADER_SIZE:
            crc, n, seq = _HEADER.unpack_from(buf, pos)
            need += n
            if need <= avail:
                yield off, buf, pos, crc, n, seq
                pos, off = pos + need, off + need
                continue
        if need > end - off:
            reason = "truncated header" if need == HEADER_SIZE else "record runs past end of file"
            raise _Damaged(off, reason)
        buf = buf[pos:] + os.pread(fd, min(max(need, chunk), end - off) - avail, off + avail)
        pos = 0
        if len(buf) < need:
            raise _Damaged(off, "file shrank while reading")


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)  # a short write is followed by one that raises
        if n <= 0:
            raise OSError(errno.EIO, "write made no progress")
        view, offset = view[n:], offset + n


def _write_file(path: Path, data: bytes, *, fsync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, data, 0)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _is_zeros(fd: int, off: int, end: int) -> bool:
    while off < end:
        chunk = os.pread(fd, min(_SCAN_CHUNK, end - off), off)
        if not chunk or chunk.count(0) != len(chunk):
            return False
        off += len(chunk)
    return True


class SegmentLog:
    """A directory of segment files holding one queue's records, and its checkpoints."""

    def __init__(self, directory: Path, *, segment_bytes: int = 64 << 20) -> None:
        if segment_bytes <= HEADER_SIZE:
            raise ValueError(f"segment_bytes must be over {HEADER_SIZE}")
        self.directory = Path(directory)
        self.recovery: list[CorruptionReport] = []
        self.next_seq = 1
        self.size_bytes = 0
        self._segment_bytes = segment_bytes
        self._segments: list[_Segment] = []
        self._checkpoints: dict[str, int] = {}
        self._checkpoint_view = MappingProxyType(self._checkpoints)
        self._wfd = -1  # the last segment's, opened on the first append
        self._rfds: dict[int, int] = {}  # segment first seq -> fd, least recently used first
        self._cursors: dict[int, tuple[_Segment, int]] = {}
        self._lock = threading.Lock()  # next_seq, _dirty, _dir_dirty: shared with sync()
        self._sync_lock = threading.Lock()  # one sync at a time, or one could return early
        self._dirty: set[_Segment] = set()
        self._dir_dirty = False
        self._broken: OSError | None = None
        self._closed = False
        self.directory.mkdir(parents=True, exist_ok=True)
        self._check_format()
        self._load_checkpoints()
        self._recover()

    # --- properties -----------------------------------------------------------------------

    @property
    def first_seq(self) -> int:
        return self._segments[0].first

    @property
    def checkpoints(self) -> Mapping[str, int]:
        return self._checkpoint_view

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
            if n > _MAX_PAYLOAD:
                raise ValueError(f"record of {n} bytes is over the limit of {_MAX_PAYLOAD}")
            if size and size + HEADER_SIZE + n > self._segment_bytes:
                plans.append((seg_first, offset, size, seq, parts, marks))
                seg_first, offset, size, parts, marks = seq, 0, 0, [], array("Q")
            if not (seq - seg_first) & _MARK_MASK:
                marks.append(size)
            lenseq = _LENSEQ.pack(n, seq)
            parts += (_HEADER.pack(zlib.crc32(payload, zlib.crc32(lenseq)), n, seq), payload)
            size += HEADER_SIZE + n
            seq += 1
        plans.append((seg_first, offset, size, seq, parts, marks))
        created: list[tuple[_Segment, int]] = []
        try:
            for seg_first, offset, _, _, seg_parts, _ in plans:
                if seg_first != active.first:
                    path = self._path(seg_first)
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    created.append((_Segment(seg_first, path, seg_first), fd))
                if seg_parts:
                    _write_all(fd, b"".join(seg_parts), offset)
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

    def _undo(self, active: _Segment, created: list[tuple[_Segment, int]]) -> None:
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
                # the data, so every later sync would lie. Only a reopen knows what is there.
                self._broken = exc
                raise
        return durable

    # --- reading --------------------------------------------------------------------------

    def read(
        self, start_seq: int, max_records: int, max_bytes: int = 4 << 20
    ) -> list[tuple[int, bytes]]:
        """Records [start_seq, ...) in order, without consuming them; at least one if any."""
        self._check_open()
        if start_seq < self.first_seq:
            raise ValueError(f"seq {start_seq} is below the first stored seq {self.first_seq}")
        out: list[tuple[int, bytes]] = []
        if start_seq >= self.next_seq or max_records <= 0:
            return out
        seg, off = self._locate(start_seq)
        seq, total = start_seq, 0
        while len(out) < max_records and seq < self.next_seq:
            if off >= seg.size:
                seg, off = self._find(seq), 0
            chunk = self._chunk(seg, max_records - len(out), max_bytes - total)
            for roff, buf, pos, crc, n, rseq in _records(self._reader(seg), off, seg.size, chunk):
                if out and total + n > max_bytes:
                    max_records = len(out)
                    break
                end = pos + HEADER_SIZE + n
                if rseq != seq or zlib.crc32(buf[pos + 4 : end]) != crc:
                    raise _Damaged(roff, "record changed on disk since it was checked")
                out.append((seq, buf[pos + HEADER_SIZE : end]))
                seq, total, off = seq + 1, total + n, roff + HEADER_SIZE + n
                if len(out) >= max_records:
                    break
        self._remember(seq, seg, off)
        return out

    def _find(self, seq: int) -> _Segment:
        return self._segments[bisect_right(self._segments, seq, key=_first) - 1]

    def _locate(self, seq: int) -> tuple[_Segment, int]:
        hit = self._cursors.pop(seq, None)
        if hit is not None:
            return hit
        seg = self._find(seq)
        mark = (seq - seg.first) >> _MARK_SHIFT
        off, skip = seg.marks[mark], seq - seg.first - (mark << _MARK_SHIFT)
        if skip:
            chunk = self._chunk(seg, skip, _MAX_CHUNK)
            records = _records(self._reader(seg), off, seg.size, chunk)
            for _ in range(skip):
                roff, _, _, _, n, _ = next(records)
                off = roff + HEADER_SIZE + n
        return seg, off

    def _chunk(self, seg: _Segment, records: int, max_bytes: int) -> int:
        """How much to read for ``records`` records: no more than they likely take."""
        average = seg.size // max(1, seg.end - seg.first)
        guess = min(records * average, max(0, max_bytes) + records * HEADER_SIZE)
        return max(_MIN_CHUNK, min(guess, _MAX_CHUNK))

    def _remember(self, seq: int, seg: _Segment, off: int) -> None:
        if len(self._cursors) >= _CURSORS:
            del self._cursors[next(iter(self._cursors))]
        self._cursors[seq] = (seg, off)

    def _reader(self, seg: _Segment) -> int:
        fd = self._rfds.pop(seg.first, None)
        if fd is None:
            fd = os.open(seg.path, os.O_RDONLY)
            if len(self._rfds) >= _READ_FDS:
                os.close(self._rfds.pop(next(iter(self._rfds))))
        self._rfds[seg.first] = fd
        return fd

    def _writer(self) -> int:
        if self._wfd < 0:
            self._wfd = os.open(self._segments[-1].path, os.O_WRONLY)
        return self._wfd

    # --- checkpoints and trimming ---------------------------------------------------------

    def set_checkpoint(self, name: str, seq: int, *, durable: bool = False) -> None:
        """Record that reader ``name`` reads ``seq`` next; fsync only when ``durable``."""
        self._check_open()
        if not self.first_seq <= seq <= self.next_seq:
            raise ValueError(f"seq {seq} is outside [{self.first_seq}, {self.next_seq}]")
        self._save_checkpoints({**self._checkpoints, name: seq}, durable=durable)
        self._checkpoints[name] = seq

    def remove_checkpoint(self, name: str) -> None:
        self._check_open()
        if name not in self._checkpoints:
            raise KeyError(name)
        points = dict(self._checkpoints)
        del points[name]
        self._save_checkpoints(points, durable=False)
        del self._checkpoints[name]

    def _save_checkpoints(self, points: dict[str, int], *, durable: bool) -> None:
        # Rename over the old file: a crash leaves the old or the new file, never half of one.
        tmp = self.directory / (_CHECKPOINTS + ".tmp")
        data = json.dumps({"checkpoints": points}, sort_keys=True).encode() + b"\n"
        _write_file(tmp, data, fsync=durable)
        os.replace(tmp, self.directory / _CHECKPOINTS)
        if durable:
            _fsync_path(self.directory)

    def trim(self) -> int:
        """Delete the segments every checkpoint is past (never the last); return bytes freed."""
        self._check_open()
        if not self._checkpoints:
            return 0
        low, freed = min(self._checkpoints.values()), 0
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
        return freed

    # --- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        """Close the files; no fsync (call sync() first for that). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for fd in [self._wfd, *self._rfds.values()]:
            if fd >= 0:
                os.close(fd)
        self._wfd = -1
        self._rfds.clear()
        self._cursors.clear()

    def destroy(self) -> None:
        self.close()
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self.directory)

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"segment log {self.directory} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self._broken is not None:  # reads still work: what is stored was checked
            msg = f"segment log {self.directory} failed earlier ({self._broken}); reopen it"
            raise OSError(errno.EIO, msg) from self._broken

    def _path(self, first: int) -> Path:
        return self.directory / f"{first:020d}.seg"

    # --- opening and recovery -------------------------------------------------------------

    def _check_format(self) -> None:
        path = self.directory / "FORMAT"
        try:
            found = path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            if any(_SEGMENT_NAME.fullmatch(p.name) for p in self.directory.iterdir()):
                raise LogFormatError(f"{self.directory} has segments but no FORMAT file") from None
            tmp = path.with_name("FORMAT.tmp")
            _write_file(tmp, FORMAT_LINE.encode(), fsync=True)
            os.replace(tmp, path)
            _fsync_path(self.directory)
            return
        if found.split() != FORMAT_LINE.split():
            raise LogFormatError(
                f"{self.directory} holds format {found.strip()!r}; this fqbroker reads "
                f"only {FORMAT_LINE.strip()!r}"
            )

    def _load_checkpoints(self) -> None:
        path = self.directory / _CHECKPOINTS
        try:
            points = json.loads(path.read_bytes())["checkpoints"]
            if not all(isinstance(v, int) and v >= 0 for v in points.values()):
                raise ValueError("a position is not a sequence number")
        except FileNotFoundError:
            return
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            size = path.stat().st_size
            self._report(_CHECKPOINTS, 0, f"unreadable checkpoints ({exc})", size, 0, torn=False)
            return
        self._checkpoints.update(points)

    def _recover(self) -> None:
        paths = sorted(p for p in self.directory.iterdir() if _SEGMENT_NAME.fullmatch(p.name))
        for i, path in enumerate(paths):
            first = int(path.name[:20])
            if self._segments and first != self._segments[-1].end:
                reason = f"segment starts at seq {first}, expected {self._segments[-1].end}"
                self._drop(paths[i:], self._segments[-1], -1, reason, torn=False)
                break
            seg = _Segment(first, path, first)
            self._segments.append(seg)
            fd = os.open(path, os.O_RDONLY)
            try:
                # What a killed process wrote may still be only in the page cache: make it
                # durable, so sync() never needs to know what happened before this open.
                os.fsync(fd)
                end = os.fstat(fd).st_size
                problem = self._scan(seg, fd, end)
                torn = problem is not None and problem[2] and i == len(paths) - 1
                if problem is not None and _is_zeros(fd, problem[0], end):
                    problem, torn = (problem[0], "zero-filled tail", True), True
            finally:
                os.close(fd)
            self.size_bytes += seg.size
            if problem is not None:
                self._drop(paths[i:], seg, end, problem[1], torn=torn)
                break
        if self._segments:
            self.next_seq = self._segments[-1].end
        floor = max([1, *self._checkpoints.values()])
        saved = dict(self._checkpoints)
        if self._segments and self.next_seq < floor:
            self._checkpoint_past_end(floor)
        if not self._segments:
            self._segments.append(_Segment(floor, self._path(floor), floor))
            _write_file(self._segments[0].path, b"", fsync=True)
            _fsync_path(self.directory)
            self.next_seq = floor
        for name, seq in self._checkpoints.items():
            if seq < self.first_seq:  # its records are gone: read from the first one left
                self._checkpoints[name] = self.first_seq
        if self._checkpoints != saved:
            logger.warning("%s: checkpoints %s became %s", self.directory, saved, self._checkpoints)
            self._save_checkpoints(self._checkpoints, durable=True)

    def _scan(self, seg: _Segment, fd: int, end: int) -> tuple[int, str, bool] | None:
        """Index ``seg``'s valid records; return (offset, reason, torn) of the first bad one."""
        seq = seg.first
        try:
            for off, buf, pos, crc, n, rseq in _records(fd, 0, end, _SCAN_CHUNK):
                if zlib.crc32(buf[pos + 4 : pos + HEADER_SIZE + n]) != crc:
                    return off, "checksum mismatch", False
                if rseq != seq:
                    return off, f"record has seq {rseq}, expected {seq}", False
                if not (seq - seg.first) & _MARK_MASK:
                    seg.marks.append(off)
                seq += 1
                seg.end, seg.size = seq, off + HEADER_SIZE + n
        except _Damaged as exc:
            return exc.offset, exc.reason, True
        return None

    def _drop(self, paths: list[Path], seg: _Segment, end: int, reason: str, *, torn: bool) -> None:
        """End the log after ``seg``'s valid records: truncate it, delete ``paths`` after it."""
        dropped = max(0, end - seg.size)
        if end >= 0:
            os.truncate(seg.path, seg.size)
            _fsync_path(seg.path)
        for path in paths[1:] if end >= 0 else paths:
            dropped += path.stat().st_size
            path.unlink()
        _fsync_path(self.directory)
        average = self.size_bytes // max(1, seg.end - self._segments[0].first)
        estimate = 0 if reason == "zero-filled tail" or not average else -(-dropped // average)
        self._report(seg.path.name, seg.size, reason, dropped, estimate, torn=torn)

    def _checkpoint_past_end(self, floor: int) -> None:
        """A checkpoint is past the last record: records were lost after a reader saw them."""
        lost = floor - self.next_seq
        if min(self._checkpoints.values()) >= self.next_seq:
            # No reader needs what is stored: restart empty at the checkpoint, never reusing
            # a seq a reader has seen.
            dropped = self.size_bytes
            for seg in self._segments:
                seg.path.unlink()
            self._segments.clear()
            self.size_bytes = 0
            reason = f"log ends at seq {self.next_seq}, before a checkpoint at {floor}"
            self._report(self._path(floor).name, 0, reason, dropped, lost, torn=False)
            for name in self._checkpoints:
                self._checkpoints[name] = floor
            return
        # A reader still needs stored records, so keep them and reuse the lost seqs.
        reason = f"checkpoints past the last seq {self.next_seq - 1} moved back; seqs reused"
        self._report(self._segments[-1].path.name, 0, reason, 0, lost, torn=False)
        for name, seq in self._checkpoints.items():
            self._checkpoints[name] = min(seq, self.next_seq)

    def _report(
        self, segment: str, offset: int, reason: str, dropped: int, records: int, *, torn: bool
    ) -> None:
        self.recovery.append(CorruptionReport(segment, offset, reason, dropped, records))
        log = logger.warning if torn else logger.error
        log("%s: %s in %s at offset %d: dropped %d bytes (about %d records)",
            self.directory, reason, segment, offset, dropped, records)  # fmt: skip
