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

Checkpoints live in one preallocated file of three slots (``_CheckpointFile``): an update
is one ``pwrite`` of the whole state into a slot that holds neither the latest state nor
the latest fsynced one, so a crash mid-write falls back to one of those. Format 1 kept them
in ``checkpoints.json``; opening such a log converts it.

A failed fsync leaves the log refusing writes until :meth:`SegmentLog.repair` rewrites
what the failed sync covered, so the next sync writes it to disk again.

Threads: append, read, trim and checkpoints run on one thread (the event loop). ``sync``,
and ``repair`` after a failed sync, may run on another one at the same time; they share
``next_seq``, the set of segments written since the last sync and the failure, under
``_lock``, which an append takes once per call. ``repair`` also reads the segments, which
only a trim changes while the log refuses appends. Both open files by path, so the writer
may close its descriptors whenever it wants.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
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

FORMAT_LINE = "fqbroker-segmentlog 2\n"
_FORMAT_V1 = "fqbroker-segmentlog 1\n"  # checkpoints in checkpoints.json; converted on open
_HEADER = struct.Struct(">IIQ")  # crc32, payload length, seq
_LENSEQ = struct.Struct(">IQ")  # the header bytes after the crc, which the crc covers
_CRC = struct.Struct(">I")
HEADER_SIZE = _HEADER.size
_MAX_PAYLOAD = 0xFFFFFFFF
_MARK_SHIFT = 8  # the sparse index keeps the offset of every 256th record of a segment
_MARK_MASK = (1 << _MARK_SHIFT) - 1
_SEGMENT_NAME = re.compile(r"\d{20}\.seg")
_CHECKPOINTS = "checkpoints"
_CHECKPOINTS_V1 = "checkpoints.json"
_BLOCK = 4096  # slots start on block boundaries: writing one never rewrites another's sector
_SLOTS = 3
_CKPT_MAGIC = b"fqckpts\n"
_CKPT_HEADER = struct.Struct(">8sII")  # magic, slot size, crc32 of the 12 bytes before it
_ENTRY = struct.Struct(">QH")  # seq, name length; then the UTF-8 name
_SEQ = struct.Struct(">Q")
_MAX_NAME = 0xFFFF
_fdatasync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync
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


def _write_all(fd: int, data: bytes | bytearray, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)  # a short write is followed by one that raises
        if n <= 0:
            raise OSError(errno.EIO, "write made no progress")
        view, offset = view[n:], offset + n


def _write_file(path: Path, data: bytes | bytearray, *, fsync: bool) -> None:
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


# --- the checkpoints file -------------------------------------------------------------


class _Unreadable(Exception):
    """A checkpoints file with no usable state in it."""


def _encode_points(points: Mapping[str, int]) -> tuple[bytearray, dict[str, int]]:
    """A slot image of ``points`` (its header left blank) and where each name's seq is."""
    image = bytearray(HEADER_SIZE)
    offsets: dict[str, int] = {}
    for name, seq in points.items():
        # surrogatepass: any str round-trips, as it did through checkpoints.json.
        raw = name.encode("utf-8", "surrogatepass")
        if len(raw) > _MAX_NAME:
            raise ValueError(f"checkpoint name of {len(raw)} bytes is over {_MAX_NAME}")
        offsets[name] = len(image)
        image += _ENTRY.pack(seq, len(raw))
        image += raw
    return image, offsets


def _decode_points(data: bytes) -> dict[str, int]:
    points: dict[str, int] = {}
    off = 0
    while off < len(data):
        if off + _ENTRY.size > len(data):
            raise ValueError("entry runs past the slot")
        seq, n = _ENTRY.unpack_from(data, off)
        off += _ENTRY.size + n
        if off > len(data):
            raise ValueError("name runs past the slot")
        name = data[off - n : off].decode("utf-8", "surrogatepass")
        if name in points:
            raise ValueError(f"name {name!r} twice")
        points[name] = seq
    return points


def _seal(image: bytearray, generation: int) -> None:
    """Fill in a slot image's header: the same crc, length, seq layout as a record's."""
    _LENSEQ.pack_into(image, 4, len(image) - HEADER_SIZE, generation)
    # A copy costs less than a memoryview for the few bytes of the usual state.
    rest = image[4:] if len(image) < _BLOCK else memoryview(image)[4:]
    _CRC.pack_into(image, 0, zlib.crc32(rest))


def _install(path: Path, image: bytearray, generation: int) -> tuple[int, int]:
    """Put a new checkpoints file holding ``image`` in slot 0 in place of ``path``, by an
    fsynced file and a rename; return (its descriptor, slot size). The caller fsyncs the
    directory, and keeps the descriptor even if that fails: the rename is done."""
    slot_size = max(_BLOCK, -(-2 * len(image) // _BLOCK) * _BLOCK)  # room to grow
    _seal(image, generation)
    # Every byte is written, not left a hole, so overwriting a slot never allocates a block:
    # no ENOSPC on a full disk (on file systems that overwrite in place).
    data = bytearray(_BLOCK + _SLOTS * slot_size)
    head = _CKPT_HEADER.pack(_CKPT_MAGIC, slot_size, 0)
    _CKPT_HEADER.pack_into(data, 0, _CKPT_MAGIC, slot_size, zlib.crc32(head[:12]))
    data[_BLOCK : _BLOCK + len(image)] = image
    tmp = path.with_name(path.name + ".tmp")
    fd = -1
    try:
        _write_file(tmp, data, fsync=True)
        fd = os.open(tmp, os.O_RDWR)  # before the rename, so nothing can fail after it
        os.replace(tmp, path)
    except OSError:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)  # a full disk, say: keep the space for the queue
        raise
    return fd, slot_size


class _CheckpointFile:
    """Named reader positions in a header block and three slots (docs/disk-format.md).

    Every update writes the whole state, with the next generation, into one slot with one
    ``pwrite``; opening takes the valid slot with the highest generation. The slot written
    is never ``_latest`` (the newest state: a process killed mid-write loses nothing it
    completed) nor ``_safe`` (the newest fsynced state: after a power cut the state is that
    one or newer). A durable update fsyncs and becomes ``_safe``. The encoded state is kept
    in ``_image`` so that moving an existing name's position packs 8 bytes into it.
    """

    def __init__(
        self,
        path: Path,
        fd: int,
        slot_size: int,
        points: dict[str, int],
        generation: int,
        slot: int,
    ) -> None:
        self.path = path
        self.points = points
        self.view: Mapping[str, int] = MappingProxyType(points)
        self._fd = fd
        self._slot_size = slot_size
        self._generation = generation
        self._latest = self._safe = slot
        self._image, self._offsets = _encode_points(points)

    @classmethod
    def create(cls, path: Path, points: Mapping[str, int]) -> _CheckpointFile:
        """A new file holding ``points``, durably."""
        image, _ = _encode_points(points)
        fd, slot_size = _install(path, image, 1)
        try:
            _fsync_path(path.parent)
        except OSError:
            os.close(fd)
            raise
        return cls(path, fd, slot_size, dict(points), 1, 0)

    @classmethod
    def open(cls, path: Path) -> _CheckpointFile:
        """Raises FileNotFoundError, or _Unreadable if no slot holds a valid state."""
        fd = os.open(path, os.O_RDWR)
        try:
            # A killed process may have left its last update only in the page cache: make
            # it durable, so the slot found is the safe one too.
            os.fsync(fd)
            size = os.fstat(fd).st_size
            head = os.pread(fd, _CKPT_HEADER.size, 0)
            if len(head) < _CKPT_HEADER.size:
                raise _Unreadable(f"file of {size} bytes")
            magic, slot_size, crc = _CKPT_HEADER.unpack(head)
            if magic != _CKPT_MAGIC or crc != zlib.crc32(head[:12]):
                raise _Unreadable("bad header")
            if slot_size < _BLOCK or slot_size % _BLOCK or size < _BLOCK + _SLOTS * slot_size:
                raise _Unreadable(f"slot size {slot_size} in a file of {size} bytes")
            best: tuple[int, int, dict[str, int]] | None = None
            for slot in range(_SLOTS):
                data = os.pread(fd, slot_size, _BLOCK + slot * slot_size)
                crc, n, generation = _HEADER.unpack_from(data)
                end = HEADER_SIZE + n
                if end > slot_size or zlib.crc32(memoryview(data)[4:end]) != crc:
                    continue  # never written, or torn by a crash mid-write
                try:
                    points = _decode_points(data[HEADER_SIZE:end])
                except ValueError:
                    continue
                if best is None or generation > best[0]:
                    best = (generation, slot, points)
            if best is None:
                raise _Unreadable("no valid slot")
        except BaseException:
            os.close(fd)
            raise
        generation, slot, points = best
        return cls(path, fd, slot_size, points, generation, slot)

    def set(self, name: str, seq: int, *, durable: bool) -> None:
        off = self._offsets.get(name)
        if off is None:
            self.replace({**self.points, name: seq}, durable=durable)
            return
        old = self.points[name]
        _SEQ.pack_into(self._image, off, seq)
        try:
            self._write()
        except OSError:
            _SEQ.pack_into(self._image, off, old)
            raise
        self.points[name] = seq
        if durable:
            self._sync()

    def replace(self, points: Mapping[str, int], *, durable: bool) -> None:
        """Make ``points`` the whole state. Raising after the write (a failed fsync) keeps
        the new state: it is in the page cache, as safe as a non-durable update."""
        new = dict(points)
        image, offsets = _encode_points(new)
        grow = len(image) > self._slot_size
        old, self._image = self._image, image
        try:
            if grow:
                self._grow()
            else:
                self._write()
        except OSError:
            self._image = old
            raise
        self._offsets = offsets
        self.points.clear()
        self.points.update(new)
        if grow:
            _fsync_path(self.path.parent)  # the rename
        elif durable:
            self._sync()

    def _write(self) -> None:
        generation = self._generation + 1
        _seal(self._image, generation)
        if self._latest == self._safe:
            slot = (self._latest + 1) % _SLOTS
        else:
            slot = _SLOTS - self._latest - self._safe  # the third one
        off = _BLOCK + slot * self._slot_size
        n = os.pwrite(self._fd, self._image, off)
        if n < len(self._image):
            _write_all(self._fd, self._image[n:], off + n)
        self._generation, self._latest = generation, slot

    def _sync(self) -> None:
        _fdatasync(self._fd)  # the file's size never changes in place: no metadata to sync
        self._safe = self._latest

    def _grow(self) -> None:
        """Replace the file by one with bigger slots. Always durable (but for the directory,
        left to the caller): a rename is only safe after an fsync of what it renames."""
        fd, slot_size = _install(self.path, self._image, self._generation + 1)
        os.close(self._fd)
        self._fd, self._slot_size = fd, slot_size
        self._generation += 1
        self._latest = self._safe = 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


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
        self._ckpt = self._open_checkpoints(self._check_format())
        try:
            self._recover()
        except BaseException:
            self._ckpt.close()
            raise
        self._durable_seq = self.next_seq - 1  # recovery fsynced what it found

    # --- properties -----------------------------------------------------------------------

    @property
    def first_seq(self) -> int:
        return self._segments[0].first

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
                mark = (start - seg.first) >> _MARK_SHIFT
                off, seq = seg.marks[mark], seg.first + (mark << _MARK_SHIFT)
            else:
                seg = segments[-1]
                off, seq = seg.size, seg.end
            touched = segments[segments.index(seg) :]
            for seg in touched:
                self._rewrite(seg, off, seq)
                off, seq = 0, seg.end
            last = self._segments[-1].first
            for path in self.directory.iterdir():  # segments a failed append left behind
                if _SEGMENT_NAME.fullmatch(path.name) and int(path.name[:20]) > last:
                    path.unlink()
            with self._lock:
                self._dirty.update(touched)
                self._dir_dirty = True
                self._broken = None

    def _rewrite(self, seg: _Segment, off: int, seq: int) -> None:
        fd = os.open(seg.path, os.O_RDWR)
        try:
            for roff, buf, pos, crc, n, rseq in _records(fd, off, seg.size, _SCAN_CHUNK):
                if rseq != seq or zlib.crc32(buf[pos + 4 : pos + HEADER_SIZE + n]) != crc:
                    raise _Damaged(roff, "record changed since it was written")
                seq += 1
            while off < seg.size:
                chunk = os.pread(fd, min(_SCAN_CHUNK, seg.size - off), off)
                if not chunk:
                    raise _Damaged(off, "file shrank while reading")
                _write_all(fd, chunk, off)
                off += len(chunk)
            if os.fstat(fd).st_size > seg.size:
                os.ftruncate(fd, seg.size)
        finally:
            os.close(fd)

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
        """Delete the segments every checkpoint is past (never the last); return bytes freed."""
        self._check_open()
        points = self._ckpt.points
        if not points:
            return 0
        low, freed = min(points.values()), 0
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
        self._ckpt.close()
        self._wfd = -1
        self._rfds.clear()
        self._cursors.clear()

    def destroy(self) -> None:
        self.close()
        with contextlib.suppress(FileNotFoundError):
            import shutil  # with bz2 and lzma: only queues being deleted need it

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

    def _check_format(self) -> int | None:
        """The format version of the log, or None for a new one."""
        path = self.directory / "FORMAT"
        try:
            found = path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            if any(_SEGMENT_NAME.fullmatch(p.name) for p in self.directory.iterdir()):
                raise LogFormatError(f"{self.directory} has segments but no FORMAT file") from None
            return None
        for version, line in ((2, FORMAT_LINE), (1, _FORMAT_V1)):
            if found.split() == line.split():
                return version
        raise LogFormatError(
            f"{self.directory} holds format {found.strip()!r}; this fqbroker reads "
            f"only {FORMAT_LINE.strip()!r} (and converts {_FORMAT_V1.strip()!r})"
        )

    def _open_checkpoints(self, version: int | None) -> _CheckpointFile:
        path = self.directory / _CHECKPOINTS
        if version == 2:
            try:
                ckpt = _CheckpointFile.open(path)
            except FileNotFoundError:
                self._report(_CHECKPOINTS, 0, "checkpoints file missing", 0, 0, torn=False)
            except _Unreadable as exc:
                size = path.stat().st_size
                self._report(
                    _CHECKPOINTS, 0, f"unreadable checkpoints ({exc})", size, 0, torn=False
                )
            else:
                self._remove_v1_checkpoints()  # a conversion stopped just before this
                return ckpt
            return _CheckpointFile.create(path, {})
        # New, or format 1. FORMAT is written last, so a log whose FORMAT says 2 always has
        # its checkpoints file; until then checkpoints.json is the one that counts.
        ckpt = _CheckpointFile.create(path, self._load_v1_checkpoints() if version else {})
        try:
            tmp = self.directory / "FORMAT.tmp"
            _write_file(tmp, FORMAT_LINE.encode(), fsync=True)
            os.replace(tmp, self.directory / "FORMAT")
            _fsync_path(self.directory)
        except BaseException:
            ckpt.close()
            raise
        if version:
            logger.warning(
                "%s: converted from %r to %r: checkpoints %s moved from %s to %s",
                self.directory, _FORMAT_V1.strip(), FORMAT_LINE.strip(), dict(ckpt.points),
                _CHECKPOINTS_V1, _CHECKPOINTS,
            )  # fmt: skip
            self._remove_v1_checkpoints()
        return ckpt

    def _load_v1_checkpoints(self) -> dict[str, int]:
        path = self.directory / _CHECKPOINTS_V1
        try:
            points = json.loads(path.read_bytes())["checkpoints"]
            if not all(isinstance(v, int) and 0 <= v < 1 << 64 for v in points.values()):
                raise ValueError("a position is not a sequence number")
            _encode_points(points)  # ValueError for a name format 2 cannot hold
        except FileNotFoundError:
            return {}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            size = path.stat().st_size
            self._report(_CHECKPOINTS_V1, 0, f"unreadable checkpoints ({exc})", size, 0, torn=False)
            return {}
        return dict(points)

    def _remove_v1_checkpoints(self) -> None:
        for name in (_CHECKPOINTS_V1, _CHECKPOINTS_V1 + ".tmp"):
            (self.directory / name).unlink(missing_ok=True)

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
        saved = dict(self._ckpt.points)
        points = dict(saved)
        floor = max([1, *points.values()])
        if self._segments and self.next_seq < floor:
            self._checkpoint_past_end(points, floor)
        if not self._segments:
            self._segments.append(_Segment(floor, self._path(floor), floor))
            _write_file(self._segments[0].path, b"", fsync=True)
            _fsync_path(self.directory)
            self.next_seq = floor
        for name, seq in points.items():
            if seq < self.first_seq:  # its records are gone: read from the first one left
                points[name] = self.first_seq
        if points != saved:
            logger.warning("%s: checkpoints %s became %s", self.directory, saved, points)
            self._ckpt.replace(points, durable=True)

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
        self.recovery.append(CorruptionReport(segment, offset, reason, dropped, records))
        log = logger.warning if torn else logger.error
        log("%s: %s in %s at offset %d: dropped %d bytes (about %d records)",
            self.directory, reason, segment, offset, dropped, records)  # fmt: skip
