"""Opening a segment log: check every record, and get past damage without losing what is
intact (docs/disk-format.md, "Recovery", has the rules).

Where a record fails, the scan goes on at the next record that checks out
(:func:`~fqbroker.storage.segments.records.find_record`): the damaged bytes are copied aside, the
good records after them move to a segment of their own, and the skipped seqs become a gap.
Each change is ordered so that a crash at any step leaves it recoverable: the copy aside
is fsynced before anything is cut, a run's new segment before the original is truncated.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fqbroker.storage.files import FILE_MODE
from fqbroker.storage.segments.records import (
    HEADER_SIZE,
    MARK_MASK,
    SCAN_CHUNK,
    SEGMENT_NAME,
    Damaged,
    Segment,
    check,
    copy_aside,
    find_record,
    fsync_path,
    is_zeros,
    records,
    write_all,
)

__all__ = ["Problem", "recover_segments"]

_NO_LIMIT = 1 << 64


@dataclass
class Problem:
    """One damaged region, or a gap no segment covers, as recovery dealt with it."""

    segment: str
    offset: int
    reason: str
    dropped_bytes: int
    records: int  # seqs skipped; for a cut tail, an estimate from the average record size
    moved_to: str
    torn: bool  # the normal end of a crash, not damage


@dataclass
class _Run:
    start: int  # file offset
    end: int
    first: int  # seq
    stop: int  # seq after the last
    marks: array[int]


def recover_segments(
    directory: Path, add_gap: Callable[[int, int], None], known: set[tuple[int, int]]
) -> tuple[list[Segment], list[Problem]]:
    """The segments of the log in ``directory`` after recovery, and what it found.

    ``add_gap(first, stop)`` is called before a change leaves seqs [first, stop) in no
    segment, and for such a gap found with no record of it: the log marks its format, so
    that a reader that cannot skip gaps refuses it, and records the gap, so that ``known``
    gaps are not reported again at the next open.
    """
    paths = sorted(p for p in directory.iterdir() if SEGMENT_NAME.fullmatch(p.name))
    known = set(known)

    def note_gap(lo: int, stop: int) -> None:
        add_gap(lo, stop)
        known.add((lo, stop))

    segments: list[Segment] = []
    problems: list[Problem] = []
    for i, path in enumerate(paths):
        first = int(path.name[:20])
        last = i == len(paths) - 1
        upper = _NO_LIMIT if last else int(paths[i + 1].name[:20])
        if segments and first > segments[-1].end and (segments[-1].end, first) not in known:
            prev = segments[-1]
            note_gap(prev.end, first)
            reason = f"seqs {prev.end} to {first - 1} are in no segment; skipped"
            problems.append(Problem(path.name, 0, reason, 0, first - prev.end, "", torn=False))
        segments += _recover_segment(directory, path, first, upper, problems, note_gap)
    return segments, problems


def _recover_segment(
    directory: Path,
    path: Path,
    first: int,
    upper: int,
    problems: list[Problem],
    add_gap: Callable[[int, int], None],
) -> list[Segment]:
    last = upper == _NO_LIMIT
    fd = os.open(path, os.O_RDWR)
    try:
        # What a killed process wrote may still be only in the page cache: make it
        # durable, so sync() never needs to know what happened before this open.
        os.fsync(fd)
        size = os.fstat(fd).st_size
        runs, damage = _scan(fd, size, first, upper)
        if not damage:
            (run,) = runs
            return [Segment(first, path, run.stop, run.end, run.marks)]
        found: list[Problem] = []
        gaps: list[tuple[int, int]] = []
        for start, end, lo, hi, reason, torn in damage:
            tail = hi is None and last
            if tail and is_zeros(fd, start, end):
                reason, torn = "zero-filled tail", True
            moved = copy_aside(directory, fd, path.name, start, end)
            if tail:
                good = sum(r.end - r.start for r in runs)
                average = good // max(1, sum(r.stop - r.first for r in runs))
                zeros = reason == "zero-filled tail" or not average
                lost = 0 if zeros else -(-(end - start) // average)
            else:
                stop = upper if hi is None else hi
                lost = stop - lo
                if lost:
                    gaps.append((lo, stop))
            found.append(Problem(path.name, start, reason, end - start, lost, moved, torn))
        for lo, stop in gaps:
            add_gap(lo, stop)
        segments = [Segment(first, path, runs[0].stop, runs[0].end, runs[0].marks)]
        for run in runs[1:]:
            segments.append(_split_off(directory, fd, run))
        if len(runs) > 1:
            fsync_path(directory)
        os.ftruncate(fd, runs[0].end)
        os.fsync(fd)
        if runs[0].end == 0 and (not last or len(runs) > 1):
            # Nothing good before the damage: the file would be an empty segment between
            # others, which only the newest may be.
            path.unlink()
            fsync_path(directory)
            del segments[0]
        problems += found
        return segments
    finally:
        os.close(fd)


def _scan(
    fd: int, size: int, first: int, upper: int
) -> tuple[list[_Run], list[tuple[int, int, int, int | None, str, bool]]]:
    """The runs of good records in a segment file, and the damage between them: (start,
    end, first seq skipped, seq resumed at or None if nothing after it, reason, torn)."""
    runs: list[_Run] = []
    damage: list[tuple[int, int, int, int | None, str, bool]] = []
    off, seq = 0, first
    while True:
        run = _Run(off, off, seq, seq, array("Q"))
        runs.append(run)
        problem: tuple[str, bool] | None = None
        try:
            for roff, buf, pos, crc, n, rseq in records(fd, off, size, SCAN_CHUNK):
                if not check(buf, pos, crc, n):
                    problem = ("checksum mismatch", False)
                elif rseq != seq:
                    problem = (f"record has seq {rseq}, expected {seq}", False)
                elif seq >= upper:
                    problem = (f"record {seq} runs into the next segment", False)
                if problem:
                    break
                if not (seq - run.first) & MARK_MASK:
                    run.marks.append(roff - run.start)
                seq += 1
                off = roff + HEADER_SIZE + n
        except Damaged as exc:
            problem = (exc.reason, True)
        run.end, run.stop = off, seq
        if problem is None:
            return runs, damage
        resume = find_record(fd, off, size, seq, upper)
        if resume is None:
            damage.append((off, size, seq, None, problem[0], problem[1] and upper == _NO_LIMIT))
            return runs, damage
        damage.append((off, resume[0], seq, resume[1], problem[0], False))
        off, seq = resume


def _split_off(directory: Path, fd: int, run: _Run) -> Segment:
    """Copy a run of good records into a segment file of its own, durably."""
    path = directory / f"{run.first:020d}.seg"
    tmp = path.with_name(path.name + ".tmp")
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        off = run.start
        while off < run.end:
            chunk = os.pread(fd, min(SCAN_CHUNK, run.end - off), off)
            if not chunk:
                raise Damaged(off, "file shrank while reading")
            write_all(out, chunk, off - run.start)
            off += len(chunk)
        os.fsync(out)
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk: keep what room is left
        raise
    finally:
        os.close(out)
    os.replace(tmp, path)
    return Segment(run.first, path, run.stop, run.end - run.start, run.marks)
