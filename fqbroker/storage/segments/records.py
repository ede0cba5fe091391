"""Segment log records: the byte layout, reading them back, and finding them again after
damage (docs/disk-format.md). Shared by the log, its recovery and its checkpoints file.

A record is a 16-byte header (crc32, payload length, seq; big-endian) and the payload; the
crc covers everything after itself. :func:`find_record` is how a reader gets past damaged
bytes: it looks forward for the next header whose crc and sequence number check out.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import struct
import zlib
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from fqbroker.storage.files import DIR_MODE, FILE_MODE

__all__ = ["HEADER_SIZE", "CorruptionReport", "find_record"]

FORMAT_LINE = "fqbroker-segmentlog 2\n"
# Format 2 that may have gaps between segments, which recovery leaves where it skipped
# damaged records: a format 2 reader would end the log at the first gap (deleting what
# follows), so a log gets this line, and refuses older readers, only once it has a gap.
FORMAT_GAPS = "fqbroker-segmentlog 3\n"
FORMAT_V1 = "fqbroker-segmentlog 1\n"  # checkpoints in checkpoints.json; converted on open
HEADER = struct.Struct(">IIQ")  # crc32, payload length, seq
LENSEQ = struct.Struct(">IQ")  # the header bytes after the crc, which the crc covers
CRC = struct.Struct(">I")
HEADER_SIZE = HEADER.size
MAX_PAYLOAD = 0xFFFFFFFF
MARK_SHIFT = 8  # the sparse index keeps the offset of every 256th record of a segment
MARK_MASK = (1 << MARK_SHIFT) - 1
SEGMENT_NAME = re.compile(r"\d{20}\.seg")
SCAN_CHUNK = 1 << 20
DAMAGED_DIR = "damaged"
_NONZERO = re.compile(rb"[^\x00]")


@dataclass
class CorruptionReport:
    """One problem recovery found, and what it dropped to get past it."""

    segment: str  # file name
    offset: int  # where the damage starts in that file (where the log ends, for a tail)
    reason: str
    dropped_bytes: int  # taken out of the segment (a copy is in ``moved_to`` unless zeros)
    dropped_records_after: int  # exact for a skipped region; estimated for a lost tail
    moved_to: str = ""  # the copy of the dropped bytes, relative to the log's directory


@dataclass(eq=False, slots=True)
class Segment:
    first: int  # seq of its first record, and its name
    path: Path
    end: int  # seq after its last record
    size: int = 0
    marks: array[int] = field(default_factory=lambda: array("Q"))


class Damaged(OSError):
    """Bytes that are not a valid record: EIO to a reader, a region to skip for recovery."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(errno.EIO, f"{reason} at offset {offset}")
        self.offset, self.reason = offset, reason


def records(
    fd: int, off: int, end: int, chunk: int
) -> Iterator[tuple[int, bytes, int, int, int, int]]:
    """Yield (file offset, buffer, position in it, crc, payload length, seq) for each record
    in [off, end), reading ``chunk`` bytes at a time; raise Damaged where a record does not
    fit before ``end``. Callers slice the buffer themselves: one copy, of the payload."""
    buf, pos = b"", 0
    while off < end:
        avail, need = len(buf) - pos, HEADER_SIZE
        if avail >= HEADER_SIZE:
            crc, n, seq = HEADER.unpack_from(buf, pos)
            need += n
            if need <= avail:
                yield off, buf, pos, crc, n, seq
                pos, off = pos + need, off + need
                continue
        if need > end - off:
            reason = "truncated header" if need == HEADER_SIZE else "record runs past end of file"
            raise Damaged(off, reason)
        buf = buf[pos:] + os.pread(fd, min(max(need, chunk), end - off) - avail, off + avail)
        pos = 0
        if len(buf) < need:
            raise Damaged(off, "file shrank while reading")


def check(buf: bytes, pos: int, crc: int, n: int) -> bool:
    return zlib.crc32(buf[pos + 4 : pos + HEADER_SIZE + n]) == crc


def find_record(fd: int, bad: int, end: int, lo: int, hi: int) -> tuple[int, int] | None:
    """(offset, seq) of the first whole record in (bad, end) whose crc checks out and
    whose seq could follow damage that began at ``bad`` with seq ``lo``: below ``hi``,
    and no more records past ``lo`` than 16-byte headers fit in the bytes skipped.

    Candidates are found by the top four bytes of their seq field (bytes.find, in C), and
    runs of zeros, which a crash leaves, are jumped over. A payload that embeds a whole
    valid-looking record with a fitting seq can pass: see docs/disk-format.md.
    """
    hi = min(hi, lo + (end - bad) // HEADER_SIZE + 1, 1 << 64)
    if hi <= lo:
        return None
    prefixes = {(lo >> 32).to_bytes(4, "big"), ((hi - 1) >> 32).to_bytes(4, "big")}
    off = bad + 1
    while off + HEADER_SIZE <= end:
        buf = os.pread(fd, min(SCAN_CHUNK, end - off), off)
        last = len(buf) - HEADER_SIZE  # the last position a whole header starts at
        if last < 0:
            return None
        pos = 0
        while pos <= last:
            hits = [h for h in (buf.find(p, pos + 8, last + 12) for p in prefixes) if h >= 0]
            if not hits:
                break
            pos = min(hits) - 8
            crc, n, seq = HEADER.unpack_from(buf, pos)
            at = off + pos
            fits = lo <= seq < hi and seq - lo <= (at - bad) // HEADER_SIZE
            if fits and at + HEADER_SIZE + n <= end and _whole_checks(fd, buf, pos, at, n, crc):
                return at, seq
            if seq == 0:  # zeros: no seq field can start before the next non-zero byte
                nonzero = _NONZERO.search(buf, pos + 8)
                if nonzero is None:
                    break
                pos = max(pos + 1, nonzero.start() - 15)
            else:
                pos += 1
        off += last + 1  # the buffers overlap by a header less one byte: no gap between
    return None


def _whole_checks(fd: int, buf: bytes, pos: int, at: int, n: int, crc: int) -> bool:
    if pos + HEADER_SIZE + n <= len(buf):
        return check(buf, pos, crc, n)
    data = os.pread(fd, HEADER_SIZE + n, at)
    return len(data) == HEADER_SIZE + n and check(data, 0, crc, n)


def write_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)  # a short write is followed by one that raises
        if n <= 0:
            raise OSError(errno.EIO, "write made no progress")
        view, offset = view[n:], offset + n


def write_file(path: Path, data: bytes | bytearray, *, fsync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        write_all(fd, data, 0)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_directory_durably(directory: Path) -> None:
    """Create ``directory`` and any missing parent, each parent fsynced after it gained an
    entry: a directory's name is only on disk once its parent is synced, so otherwise a
    power cut could take a queue's whole directory with every fsynced record in it."""
    if directory.is_dir():
        return
    make_directory_durably(directory.parent)
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=DIR_MODE)
    fsync_path(directory.parent)


def is_zeros(fd: int, off: int, end: int) -> bool:
    while off < end:
        chunk = os.pread(fd, min(SCAN_CHUNK, end - off), off)
        if not chunk or chunk.count(0) != len(chunk):
            return False
        off += len(chunk)
    return True


def copy_aside(directory: Path, fd: int, segment: str, start: int, end: int) -> str:
    """Copy bytes [start, end) of a segment into ``damaged/<segment>@<start>``, durably;
    return that path relative to ``directory``. Nothing is copied for zeros."""
    if is_zeros(fd, start, end):
        return ""
    aside = directory / DAMAGED_DIR
    aside.mkdir(mode=DIR_MODE, exist_ok=True)
    name = f"{segment}@{start}"
    out = os.open(aside / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        off = start
        while off < end:
            chunk = os.pread(fd, min(SCAN_CHUNK, end - off), off)
            if not chunk:
                break
            write_all(out, chunk, off - start)
            off += len(chunk)
        os.fsync(out)
    except OSError:
        (aside / name).unlink(missing_ok=True)  # a full disk: keep what room is left
        raise
    finally:
        os.close(out)
    fsync_path(aside)
    fsync_path(directory)
    return f"{DAMAGED_DIR}/{name}"
