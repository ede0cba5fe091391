"""Reading a segment log: records by seq, checked as they are read, over damage.

:class:`SegmentReads` is the reading half of :class:`~fqbroker.storage.segments.log.SegmentLog`
(which says how a log is laid out and recovered): finding a seq from the sparse index marks
and a few remembered positions, reading records and checking each one (crc, seq), and
stepping over damage found while running (copied aside, counted and logged once, the
skipped seqs remembered as a gap). It keeps a few read descriptors open, most recently
used first. Everything here runs on the event loop's thread, as appends and trims do.
"""

from __future__ import annotations

import logging
import os
import zlib
from bisect import bisect_right
from operator import attrgetter
from pathlib import Path

from fqbroker.storage.segments.records import (
    HEADER,
    HEADER_SIZE,
    MARK_SHIFT,
    SEGMENT_NAME,
    CorruptionReport,
    Damaged,
    Segment,
    copy_aside,
    find_record,
    records,
)
from fqbroker.storage.segments.recovery import Problem
from fqbroker.storage.segments.runs import checked_payloads

__all__ = ["SegmentReads"]

logger = logging.getLogger("fqbroker.storage.segments.log")  # one logger for everything a log says

_MIN_CHUNK, _MAX_CHUNK = 4 << 10, 1 << 20
_READ_FDS = 4  # open read descriptors kept per log, most recently used
_CURSORS = 8  # remembered (seq -> segment, offset) positions, so sequential reads never scan

_first = attrgetter("first")


class SegmentReads:
    """The reads of a :class:`~fqbroker.storage.segments.log.SegmentLog`, which sets up the
    state declared here and changes it as it writes, trims and recovers."""

    directory: Path
    next_seq: int
    recovery: list[CorruptionReport]
    corrupt_records: int  # seqs skipped over damage, since opened (with recovery's)
    corrupt_bytes: int
    _segments: list[Segment]
    _closed: bool
    _rfds: dict[int, int]  # segment first seq -> fd, least recently used first
    _cursors: dict[int, tuple[Segment, int]]
    # Damage found while running, until the next open moves it aside: where a reader that
    # meets it goes on, by (segment, offset) of the damage, and each skipped range as
    # (first seq, seq resumed at, segment, offset resumed at) for random reads.
    _holes: dict[tuple[int, int], tuple[Segment, int, int]]
    _gaps: list[tuple[int, int, Segment, int]]
    _skipped: list[tuple[int, int]]  # every skipped range: [first, stop)

    @property
    def first_seq(self) -> int:
        return self._segments[0].first

    def segment_firsts(self) -> list[int]:
        """The first seq of each segment, oldest first: where a reader walking back from
        the end (a window of recent ids, storage/store.py) starts each step."""
        return [seg.first for seg in self._segments]

    def segment_end(self, first: int) -> int:
        """The seq after the last record of the segment that starts at ``first``."""
        return min(self._find(first).end, self.next_seq)

    def skipped_from(self, seq: int) -> int:
        """How many seqs from ``seq`` on were skipped as damaged: no record has them."""
        return sum(stop - max(lo, seq) for lo, stop in self._skipped if stop > seq)

    def read(
        self, start_seq: int, max_records: int, max_bytes: int = 4 << 20
    ) -> list[tuple[int, bytes]]:
        """Records [start_seq, ...) in order, without consuming them; at least one if any.

        Seqs recovery skipped, or damage found here, are stepped over: the seqs returned
        may jump. Every record is checked (crc, seq) as it is read, so bytes that rotted
        since the log was opened are never returned."""
        self._check_open()
        if start_seq < self.first_seq:
            raise ValueError(f"seq {start_seq} is below the first stored seq {self.first_seq}")
        out: list[tuple[int, bytes]] = []
        if start_seq >= self.next_seq or max_records <= 0:
            return out
        seg, off, seq = self._locate(start_seq)
        total = 0
        while len(out) < max_records and seq < self.next_seq:
            if seq >= seg.end:
                seg, off, seq = self._locate(seq)
                continue
            chunk = self._chunk(seg, max_records - len(out), max_bytes - total)
            try:
                for roff, buf, pos, crc, n, rseq in records(
                    self._reader(seg), off, seg.size, chunk
                ):
                    if out and total + n > max_bytes:
                        max_records = len(out)
                        break
                    end = pos + HEADER_SIZE + n
                    if rseq != seq or zlib.crc32(buf[pos + 4 : end]) != crc:
                        raise Damaged(roff, "record changed on disk since it was checked")
                    out.append((seq, buf[pos + HEADER_SIZE : end]))
                    seq, total, off = seq + 1, total + n, roff + HEADER_SIZE + n
                    if len(out) >= max_records:
                        break
                else:
                    if seq < seg.end:  # the file ended before its records did
                        raise Damaged(off, "segment file ends early")
            except Damaged as exc:
                seg, off, seq = self._skip_damage(seg, exc.offset, seq, exc.reason)
        self._remember(seq, seg, off)
        return out

    def read_run(
        self, start_seq: int, max_records: int, max_bytes: int = 4 << 20, skip: int = 0
    ) -> list[bytes]:
        """The payloads of records ``start_seq``, ``start_seq + 1``, ... in one segment,
        each without its first ``skip`` bytes: the bulk reader of retained topics, which
        :meth:`read` serves at twice the cost per record. [] whenever it cannot go the
        fast way (no such record, a gap, damage): :meth:`read` then steps over what it
        must. Every record is checked (crc, seq) all the same; stops before a bad one."""
        self._check_open()
        if not self.first_seq <= start_seq < self.next_seq or max_records <= 0:
            return []
        seg, off, seq = self._locate(start_seq)
        if seq == start_seq and seq >= seg.end:  # remembered at the end of the one before
            seg, off, seq = self._locate(seq)
        if seq != start_seq or seq >= seg.end:
            return []
        n = min(max_records, seg.end - seq)
        fd = self._reader(seg)
        # Payloads of at most about max_bytes: the caller cuts the last few if it must.
        buf = os.pread(fd, min(seg.size - off, max(max_bytes, 1) + n * HEADER_SIZE), off)
        if len(buf) >= HEADER_SIZE:
            first = HEADER.unpack_from(buf)[1] + HEADER_SIZE
            if first > len(buf) and off + first <= seg.size:  # one record bigger than that
                buf = os.pread(fd, first, off)
        out: list[bytes] = []
        # Stops before a record cut off (read on next time) or damaged (read() steps over).
        pos, seq = checked_payloads(buf, seq, seq + n, skip, out)
        self._remember(seq, seg, off + pos)
        return out

    def position(self, seq: int) -> tuple[Path, int] | None:
        """Where a read from ``seq`` starts (segment file, offset) when the last read ended
        there, else None: what reading ahead of that reader needs (coldread)."""
        hit = self._cursors.get(seq)
        return None if hit is None else (hit[0].path, hit[1])

    def _skip_damage(
        self, seg: Segment, off: int, seq: int, reason: str
    ) -> tuple[Segment, int, int]:
        """Where a reader goes on after damage at ``off`` in ``seg``, where it expected
        ``seq``: the next record that checks out. The first reader to meet it copies the
        bytes aside, counts and logs it; the next open cuts it out of the segment."""
        known = self._holes.get((seg.first, off))
        if known is not None:
            return known
        fd = self._reader(seg)
        found = find_record(fd, off, seg.size, seq, seg.end)
        end, resume = found if found is not None else (seg.size, seg.end)
        try:
            moved = copy_aside(self.directory, fd, seg.path.name, off, end)
        except OSError as exc:  # a full disk: the bytes stay where they are until reopened
            moved = f"not copied ({exc.strerror})"
        self._holes[(seg.first, off)] = (seg, end, resume)
        self._gaps.append((seq, resume, seg, end))
        if resume > seq:
            self._skipped.append((seq, resume))
        self._cursors.clear()
        self._problem(Problem(seg.path.name, off, reason, end - off, resume - seq, moved, False))
        return seg, end, resume

    def _find(self, seq: int) -> Segment:
        return self._segments[bisect_right(self._segments, seq, key=_first) - 1]

    def _locate(self, seq: int) -> tuple[Segment, int, int]:
        """(segment, offset, seq) of the first record at or after ``seq``."""
        hit = self._cursors.pop(seq, None)
        if hit is not None:
            return (*hit, seq)
        seg = self._find(seq)
        if seq >= seg.end:  # in a gap between segments (the caller knows seq < next_seq)
            seg = self._segments[bisect_right(self._segments, seq, key=_first)]
            return seg, 0, seg.first
        mark = (seq - seg.first) >> MARK_SHIFT
        at, off = seg.first + (mark << MARK_SHIFT), seg.marks[mark]
        for lo, resume, gseg, goff in self._gaps:
            if gseg is seg and lo <= seq < resume:
                return seg, goff, resume
            if gseg is seg and at < resume <= seq:
                at, off = resume, goff  # walk from past the damage, never through it
        # Walk from the mark, checking each record as a read would: a damaged length must
        # not send the walk astray, past good records.
        while at < seq:
            chunk = self._chunk(seg, seq - at, _MAX_CHUNK)
            try:
                for roff, buf, pos, crc, n, rseq in records(
                    self._reader(seg), off, seg.size, chunk
                ):
                    if rseq != at or zlib.crc32(buf[pos + 4 : pos + HEADER_SIZE + n]) != crc:
                        raise Damaged(roff, "record changed on disk since it was checked")
                    at, off = at + 1, off + HEADER_SIZE + n
                    if at == seq:
                        break
                break  # at seq, or at the end of the file (which the read then finds)
            except Damaged as exc:  # each skip moves ``off`` forward: the loop ends
                seg, off, at = self._skip_damage(seg, exc.offset, at, exc.reason)
        return seg, off, at

    def _chunk(self, seg: Segment, records: int, max_bytes: int) -> int:
        """How much to read for ``records`` records: no more than they likely take."""
        average = seg.size // max(1, seg.end - seg.first)
        guess = min(records * average, max(0, max_bytes) + records * HEADER_SIZE)
        return max(_MIN_CHUNK, min(guess, _MAX_CHUNK))

    def _remember(self, seq: int, seg: Segment, off: int) -> None:
        if len(self._cursors) >= _CURSORS:
            del self._cursors[next(iter(self._cursors))]
        self._cursors[seq] = (seg, off)

    def _reader(self, seg: Segment) -> int:
        fd = self._rfds.pop(seg.first, None)
        if fd is None:
            fd = os.open(seg.path, os.O_RDONLY)
            if len(self._rfds) >= _READ_FDS:
                os.close(self._rfds.pop(next(iter(self._rfds))))
        self._rfds[seg.first] = fd
        return fd

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"segment log {self.directory} is closed")

    def _problem(self, p: Problem) -> None:
        report = CorruptionReport(
            p.segment, p.offset, p.reason, p.dropped_bytes, p.records, p.moved_to
        )
        self.recovery.append(report)
        if not p.torn and SEGMENT_NAME.fullmatch(p.segment):
            self.corrupt_records += p.records
            self.corrupt_bytes += p.dropped_bytes
        log = logger.warning if p.torn else logger.error
        aside = f"; the bytes are in {p.moved_to}" if p.moved_to else ""
        log("%s: %s in %s at offset %d: skipped %d bytes, %d records%s",
            self.directory, p.reason, p.segment, p.offset, p.dropped_bytes, p.records,
            aside)  # fmt: skip
