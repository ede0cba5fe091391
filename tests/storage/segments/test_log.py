"""Segment log: round trips, rolling, random access, recovery from torn and corrupt files,
real write failures, trimming, sync from another thread, and a crash-recovery property;
the checkpoints file (slots, torn writes, durability, growth, conversion from format 1);
failed fsyncs and repair."""

from __future__ import annotations

import json
import logging
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fqbroker.storage.segments import checkpoints as segcheckpoints
from fqbroker.storage.segments import log as segmentlog
from fqbroker.storage.segments import records as segrecords
from fqbroker.storage.segments.log import FORMAT_LINE, HEADER_SIZE, LogFormatError, SegmentLog
from tests.conftest import FailingFsync

# Transcribed from docs/disk-format.md, not imported.
HEADER = struct.Struct(">IIQ")
CKPT_HEADER = struct.Struct(">8sII")
ENTRY = struct.Struct(">QH")
BLOCK = 4096
ROOT = Path(__file__).resolve().parents[3]


def p20(i: int) -> bytes:
    """A 20-byte payload, so a record takes 36 bytes."""
    return b"%020d" % i


def contents(log: SegmentLog, batch: int = 7) -> list[bytes]:
    """Every stored record, read forward in small batches; checks seqs are dense."""
    out: list[bytes] = []
    seq = log.first_seq
    while records := log.read(seq, batch):
        assert [s for s, _ in records] == list(range(seq, seq + len(records)))
        out += [payload for _, payload in records]
        seq += len(records)
    assert seq == log.next_seq
    return out


def stored(log: SegmentLog, batch: int = 7) -> dict[int, bytes]:
    """Every stored record by seq, read forward in small batches; seqs may skip damage."""
    out: dict[int, bytes] = {}
    seq = log.first_seq
    while records := log.read(seq, batch):
        assert all(s >= seq for s, _ in records)
        assert [s for s, _ in records] == sorted(s for s, _ in records)
        out.update(records)
        seq = records[-1][0] + 1
    assert seq <= log.next_seq
    return out


def flip(path: Path, at: int, bit: int = 6) -> bytes:
    """Flip one bit of a file in place (through the page cache, as rot would show);
    return the whole record-sized neighbourhood before the flip for comparison."""
    with path.open("r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ (1 << bit)]))
    return path.read_bytes()


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.seg"))


def record_starts(path: Path) -> list[int]:
    """Offsets of the whole records in a segment file, walking the documented headers."""
    data, off, starts = path.read_bytes(), 0, []
    while off + HEADER_SIZE <= len(data):
        _, length, _ = HEADER.unpack_from(data, off)
        if off + HEADER_SIZE + length > len(data):
            break
        starts.append(off)
        off += HEADER_SIZE + length
    return starts


def checkpoint_slots(directory: Path) -> list[tuple[int, dict[str, int]] | None]:
    """Each slot of the checkpoints file as (generation, positions), None if not valid."""
    data = (directory / "checkpoints").read_bytes()
    magic, slot_size, crc = CKPT_HEADER.unpack_from(data)
    assert (magic, crc) == (b"fqckpts\n", zlib.crc32(data[:12]))
    assert slot_size % BLOCK == 0 and len(data) == BLOCK + 3 * slot_size
    assert data[CKPT_HEADER.size : BLOCK] == bytes(BLOCK - CKPT_HEADER.size)
    slots: list[tuple[int, dict[str, int]] | None] = []
    for i in range(3):
        slot = data[BLOCK + i * slot_size : BLOCK + (i + 1) * slot_size]
        crc, length, generation = HEADER.unpack_from(slot)
        end = HEADER_SIZE + length
        if end > slot_size or zlib.crc32(slot[4:end]) != crc:
            slots.append(None)
            continue
        points, off = {}, HEADER_SIZE
        while off < end:
            seq, n = ENTRY.unpack_from(slot, off)
            points[slot[off + ENTRY.size : off + ENTRY.size + n].decode()] = seq
            off += ENTRY.size + n
        slots.append((generation, points))
    return slots


def latest_slot(directory: Path) -> int:
    slots = checkpoint_slots(directory)
    return max((s[0], i) for i, s in enumerate(slots) if s is not None)[1]


def slot_bytes(directory: Path, slot: int) -> bytes:
    data = (directory / "checkpoints").read_bytes()
    size = CKPT_HEADER.unpack_from(data)[1]
    return data[BLOCK + slot * size : BLOCK + (slot + 1) * size]


def damage_slot(directory: Path, slot: int, at: int = 0) -> None:
    """Zero a slot from byte ``at`` on: what a write cut short leaves, at worst."""
    path = directory / "checkpoints"
    size = CKPT_HEADER.unpack_from(path.read_bytes())[1]
    with path.open("r+b") as f:
        f.seek(BLOCK + slot * size + at)
        f.write(bytes(size - at))


def test_round_trip_dense_seqs_from_one(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path / "a" / "q")
    assert (log.first_seq, log.next_seq, log.size_bytes) == (1, 1, 0)
    assert log.read(1, 10) == []
    assert log.append([b"a", b"", b"ccc"]) == 1
    assert log.append([]) == 4
    assert log.append([b"d"]) == 4
    assert log.read(1, 10) == [(1, b"a"), (2, b""), (3, b"ccc"), (4, b"d")]
    assert log.read(3, 10) == [(3, b"ccc"), (4, b"d")]
    assert log.read(5, 10) == []
    assert (log.first_seq, log.next_seq) == (1, 5)
    assert (
        log.size_bytes
        == 4 * HEADER_SIZE + 5
        == sum(p.stat().st_size for p in segments(log.directory))
    )
    assert (log.directory / "FORMAT").read_text() == FORMAT_LINE
    assert log.sync() == 4


def test_record_bytes_match_the_documented_format(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path)
    log.append([b"hi"])
    data = (tmp_path / "00000000000000000001.seg").read_bytes()
    body = struct.pack(">IQ", 2, 1) + b"hi"
    assert data == struct.pack(">I", zlib.crc32(body)) + body
    assert data.hex() == "115f92620000000200000000000000016869"  # docs/disk-format.md


def test_segments_roll_and_reads_cross_boundaries(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, segment_bytes=100)  # two 36-byte records per segment
    for batch in ([1, 2, 3], [4, 5, 6], [7, 8, 9, 10]):
        log.append([p20(i) for i in batch])
    assert [p.name[-8:] for p in segments(tmp_path)] == [f"{i:04d}.seg" for i in (1, 3, 5, 7, 9)]
    assert all(p.stat().st_size == 72 for p in segments(tmp_path))
    assert contents(log, batch=3) == [p20(i) for i in range(1, 11)]
    assert log.read(2, 5) == [(i, p20(i)) for i in range(2, 7)]
    assert log.read(4, 1) == [(4, p20(4))]
    assert log.size_bytes == 360


def test_random_access_uses_the_sparse_index(tmp_path: Path) -> None:
    def payload(i: int) -> bytes:
        return str(i).encode() * (i % 7)

    log = SegmentLog(tmp_path, segment_bytes=40_000)
    for first in range(1, 5001, 100):
        log.append([payload(i) for i in range(first, first + 100)])
    assert len(segments(tmp_path)) > 3
    starts = [1, 2, 1023, 1024, 1025, 1026, 2049, 3333, 4999, 5000, 17]
    for reopened in (False, True):  # the index is built by appends, then by recovery
        for start in starts:
            assert log.read(start, 3) == [
                (i, payload(i)) for i in range(start, min(start + 3, 5001))
            ]
        log.close()
        log = SegmentLog(tmp_path, segment_bytes=40_000)
        assert log.recovery == [], reopened


def test_max_records_and_max_bytes(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path)
    log.append([b"x" * 100] * 10)
    assert len(log.read(1, 3)) == 3
    assert len(log.read(1, 0)) == 0
    assert len(log.read(1, 100, max_bytes=250)) == 2
    assert len(log.read(1, 100, max_bytes=300)) == 3
    assert len(log.read(1, 100, max_bytes=1)) == 1  # at least one record
    log.append([b"y" * 10_000, b"z"])
    assert log.read(11, 5, max_bytes=10) == [(11, b"y" * 10_000)]
    assert log.read(12, 5, max_bytes=10) == [(12, b"z")]


def test_record_bigger_than_a_segment_gets_its_own(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, segment_bytes=1000)
    big = os.urandom(5000)
    log.append([big])  # into the empty first segment
    log.append([b"a", big, b"b", b"c"])
    sizes = [(p.name[-8:-4], p.stat().st_size) for p in segments(tmp_path)]
    assert sizes == [("0001", 5016), ("0002", 17), ("0003", 5016), ("0004", 34)]
    assert contents(log) == [big, b"a", big, b"b", b"c"]


def test_reopen_keeps_contents_and_checkpoints(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, segment_bytes=200)
    records = [os.urandom(i % 50) for i in range(50)]
    log.append(records)
    log.set_checkpoint("fq", 10)
    log.set_checkpoint("spark", 20, durable=True)
    log.sync()
    state = (log.first_seq, log.next_seq, log.size_bytes)
    log.close()
    log.close()  # idempotent
    log = SegmentLog(tmp_path, segment_bytes=200)
    assert log.recovery == []
    assert (log.first_seq, log.next_seq, log.size_bytes) == state
    assert dict(log.checkpoints) == {"fq": 10, "spark": 20}
    assert contents(log) == records
    assert log.append([b"more"]) == 51


def test_checkpoint_api(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path)
    log.append([b"a", b"b"])
    log.set_checkpoint("fq", 3)
    for bad in (0, 4):
        with pytest.raises(ValueError):
            log.set_checkpoint("fq", bad)
    with pytest.raises(TypeError):
        log.checkpoints["x"] = 1  # type: ignore[index]
    log.remove_checkpoint("fq")
    with pytest.raises(KeyError):
        log.remove_checkpoint("fq")
    assert dict(log.checkpoints) == {}
    assert checkpoint_slots(tmp_path)[latest_slot(tmp_path)] == (3, {})
    assert not (tmp_path / "checkpoints.json").exists()


def test_trim_deletes_only_segments_below_every_checkpoint(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, segment_bytes=100)
    log.append([p20(i) for i in range(1, 10)])  # segments 1, 3, 5, 7 (two each), 9 (one)
    assert log.trim() == 0  # no checkpoints: keep everything
    log.set_checkpoint("a", 4)
    log.set_checkpoint("b", 6)
    assert log.trim() == 72  # only segment 1 (seqs 1-2) is below 4
    assert log.first_seq == 3
    for below in (1, 2):
        with pytest.raises(ValueError):
            log.read(below, 1)
    with pytest.raises(ValueError):
        log.set_checkpoint("c", 2)
    log.set_checkpoint("a", 10)
    assert log.trim() == 72  # now 6 is the lowest: segment 3 goes, 5 (seqs 5-6) stays
    assert log.read(5, 1) == [(5, p20(5))]
    log.set_checkpoint("b", 10)
    assert log.trim() == 144
    assert [p.name[-8:-4] for p in segments(tmp_path)] == ["0009"]  # the active one stays
    assert (log.first_seq, log.next_seq) == (9, 10)
    assert log.size_bytes == 36
    assert contents(log) == [p20(9)]


def test_seqs_never_reused_after_trim_and_reopen(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, segment_bytes=100)
    log.append([p20(i) for i in range(1, 11)])
    log.set_checkpoint("fq", 11)
    log.trim()
    log.close()
    log = SegmentLog(tmp_path, segment_bytes=100)
    assert (log.first_seq, log.next_seq) == (9, 11)
    assert log.append([b"x"]) == 11
    log.close()
    # Even with every segment gone, the checkpoint keeps next_seq from going back.
    for path in segments(tmp_path):
        path.unlink()
    log = SegmentLog(tmp_path, segment_bytes=100)
    assert (log.first_seq, log.next_seq) == (11, 11)
    assert log.append([b"y"]) == 11


@pytest.mark.parametrize("cut", [1, 8, 15, 16, 17, 40, -1])
def test_torn_tail_drops_only_the_partial_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, cut: int
) -> None:
    log = SegmentLog(tmp_path)
    log.append([p20(i) * 2 for i in range(1, 6)])
    log.close()
    path = segments(tmp_path)[-1]
    last = record_starts(path)[-1]
    size = path.stat().st_size
    at = last + cut if cut >= 0 else size - 1
    os.truncate(path, at)
    with caplog.at_level(logging.WARNING, logger="fqbroker.storage.segments.log"):
        log = SegmentLog(tmp_path)
    assert contents(log) == [p20(i) * 2 for i in range(1, 5)]
    (report,) = log.recovery
    assert (report.segment, report.offset, report.dropped_bytes) == (path.name, last, at - last)
    assert report.dropped_records_after == 1
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert path.stat().st_size == last
    # The torn record is cut off, as the end of the log, but its bytes are kept aside.
    assert report.moved_to == f"damaged/{path.name}@{last}"
    assert (tmp_path / report.moved_to).stat().st_size == at - last
    assert (log.corrupt_records, log.corrupt_bytes) == (0, 0)  # a crash, not damage
    assert log.append([b"new"]) == 5
    log.close()
    log = SegmentLog(tmp_path)
    assert log.recovery == []
    assert contents(log)[-1] == b"new"


def test_cut_at_a_record_boundary_is_clean(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path)
    log.append([b"a", b"b", b"c"])
    log.close()
    path = segments(tmp_path)[0]
    os.truncate(path, record_starts(path)[2])
    log = SegmentLog(tmp_path)
    assert log.recovery == []
    assert contents(log) == [b"a", b"b"]


@pytest.mark.parametrize(("segment", "record", "byte"), [(17, 1, 20), (9, 1, 3), (9, 0, 12)])
def test_a_corrupt_record_is_skipped_and_everything_after_it_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, segment: int, record: int, byte: int
) -> None:
    log = SegmentLog(tmp_path, segment_bytes=200)  # four 46-byte records per segment
    payloads = [os.urandom(30) for _ in range(20)]
    log.append(payloads)
    log.close()
    before = {p.name for p in segments(tmp_path)}
    path = tmp_path / f"{segment:020d}.seg"
    at = record * 46 + (HEADER_SIZE + byte if byte < 30 else byte)
    damaged = flip(path, at)[record * 46 : record * 46 + 46]
    with caplog.at_level(logging.WARNING, logger="fqbroker.storage.segments.log"):
        log = SegmentLog(tmp_path, segment_bytes=200)
    bad = segment + record  # its seq
    assert stored(log) == {i + 1: p for i, p in enumerate(payloads) if i + 1 != bad}
    assert (log.first_seq, log.next_seq) == (1, 21)
    (report,) = log.recovery
    assert report.reason == "checksum mismatch"
    assert (report.segment, report.offset) == (path.name, record * 46)
    assert (report.dropped_bytes, report.dropped_records_after) == (46, 1)
    assert report.moved_to == f"damaged/{path.name}@{record * 46}"
    assert (tmp_path / report.moved_to).read_bytes() == damaged
    assert (log.corrupt_records, log.corrupt_bytes) == (1, 46)
    assert [r.levelno for r in caplog.records] == [logging.ERROR]
    # The records after the damage went to a segment of their own; nothing later went.
    after = {p.name for p in segments(tmp_path)}
    assert after - before <= {f"{bad + 1:020d}.seg"}
    assert before - after <= {path.name}
    assert (tmp_path / "FORMAT").read_text() == "fqbroker-segmentlog 3\n"  # has a gap
    assert log.append([b"next"]) == 21
    log.close()
    log = SegmentLog(tmp_path, segment_bytes=200)
    assert log.recovery == []
    assert stored(log)[21] == b"next"
    assert len(stored(log)) == 20
    log.close()


def test_one_flipped_byte_in_the_first_of_six_segments_loses_one_record(
    tmp_path: Path,
) -> None:
    """The issue's case: 2,720 intact messages in the five later segments were deleted."""
    log = SegmentLog(tmp_path, segment_bytes=100 * 36)  # 100 records a segment
    payloads = [p20(i) for i in range(1, 601)]
    log.append(payloads)
    log.close()
    assert len(segments(tmp_path)) == 6
    flip(segments(tmp_path)[0], 41 * 36 + HEADER_SIZE + 5)  # record 42's payload
    log = SegmentLog(tmp_path, segment_bytes=100 * 36)
    got = stored(log)
    assert sorted(set(range(1, 601)) - set(got)) == [42]
    assert all(got[i] == p20(i) for i in got)
    assert log.corrupt_records == 1
    log.close()


def test_damage_in_several_places_skips_only_what_is_damaged(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path)
    log.append([p20(i) for i in range(1, 201)])
    log.close()
    (path,) = segments(tmp_path)
    with path.open("r+b") as f:
        f.seek(10 * 36 + 3)  # inside record 11, through record 13's first bytes
        f.write(b"\0" * (2 * 36 + 10))
        f.seek(100 * 36 + 8)  # record 101's seq field
        f.write(b"\xff")
        f.seek(150 * 36 + 4)  # record 151's length: it would run far past the end
        f.write(b"\x7f")
    log = SegmentLog(tmp_path)
    assert sorted(set(range(1, 201)) - set(stored(log))) == [11, 12, 13, 101, 151]
    assert (log.skipped_from(1), log.skipped_from(12), log.skipped_from(151)) == (5, 4, 1)
    assert [(r.offset, r.dropped_records_after) for r in log.recovery] == [
        (360, 3), (3600, 1), (5400, 1),
    ]  # fmt: skip
    assert [p.name for p in segments(tmp_path)] == [f"{n:020d}.seg" for n in (1, 14, 102, 152)]
    assert log.corrupt_records == 5
    assert sorted(p.name for p in (tmp_path / "damaged").iterdir()) == [
        f"{path.name}@{off}" for off in (360, 3600, 5400)
    ]
    log.close()


def test_a_checkpoint_in_a_skipped_region_moves_past_it(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path)
    log.append([p20(i) for i in range(1, 11)])
    log.set_checkpoint("fq", 5)
    log.set_checkpoint("other", 2)
    log.close()
    (path,) = segments(tmp_path)
    flip(path, 3 * 36 + 20)  # record 4
    flip(path, 4 * 36 + 20)  # record 5
    log = SegmentLog(tmp_path)
    assert dict(log.checkpoints) == {"fq": 6, "other": 2}
    assert log.read(4, 3) == [(6, p20(6)), (7, p20(7)), (8, p20(8))]
    assert log.read(2, 3) == [(2, p20(2)), (3, p20(3)), (6, p20(6))]
    log.close()


def test_a_flip_while_running_is_never_returned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Rot after the log was opened: the read checks every record, skips the damage,
    copies it aside and says so once; the next open cuts it out of the segment."""
    log = SegmentLog(tmp_path)
    log.append([p20(i) for i in range(1, 1001)])
    assert len(log.read(1, 1000)) == 1000
    (path,) = segments(tmp_path)
    flip(path, 499 * 36 + 30)  # record 500
    with caplog.at_level(logging.WARNING, logger="fqbroker.storage.segments.log"):
        assert sorted(set(range(1, 1001)) - set(stored(log))) == [500]
        assert (log.skipped_from(1), log.skipped_from(501)) == (1, 0)
        assert sorted(set(range(1, 1001)) - set(stored(log, batch=1000))) == [500]
        assert log.read(500, 2) == [(501, p20(501)), (502, p20(502))]
        assert log.read(700, 1) == [(700, p20(700))]  # random access walks past it
    assert (log.corrupt_records, log.corrupt_bytes) == (1, 36)
    assert [r.levelno for r in caplog.records] == [logging.ERROR]  # one line, not per read
    assert (tmp_path / f"damaged/{path.name}@{499 * 36}").stat().st_size == 36
    assert log.append([b"more"]) == 1001
    log.close()
    log = SegmentLog(tmp_path)
    assert len(log.recovery) == 1
    got = stored(log)
    assert sorted(set(range(1, 1002)) - set(got)) == [500]
    assert got[1001] == b"more"
    log.close()


def test_missing_middle_segment_leaves_a_gap(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, segment_bytes=100)
    log.append([p20(i) for i in range(1, 10)])
    log.close()
    (tmp_path / f"{5:020d}.seg").unlink()
    log = SegmentLog(tmp_path, segment_bytes=100)
    assert stored(log) == {i: p20(i) for i in range(1, 10) if i not in (5, 6)}
    (report,) = log.recovery
    assert "seqs 5 to 6 are in no segment" in report.reason
    assert report.dropped_records_after == 2
    assert (tmp_path / "FORMAT").read_text() == "fqbroker-segmentlog 3\n"
    log.close()
    (tmp_path / "FORMAT").unlink()  # lost again: rewritten as 3, since the log has a gap
    log = SegmentLog(tmp_path, segment_bytes=100)
    assert [r.segment for r in log.recovery] == ["FORMAT"]
    assert (tmp_path / "FORMAT").read_text() == "fqbroker-segmentlog 3\n"
    log.close()


@pytest.mark.parametrize("tail", [b"\0" * 4096, b"\0" * 7, os.urandom(1000)])
def test_zero_filled_or_garbage_tail(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, tail: bytes
) -> None:
    log = SegmentLog(tmp_path)
    log.append([b"a" * i for i in range(5)])
    log.close()
    path = segments(tmp_path)[0]
    size = path.stat().st_size
    with path.open("ab") as f:
        f.write(tail)
    with caplog.at_level(logging.WARNING, logger="fqbroker.storage.segments.log"):
        log = SegmentLog(tmp_path)
    assert contents(log) == [b"a" * i for i in range(5)]
    (report,) = log.recovery
    assert (report.offset, report.dropped_bytes) == (size, len(tail))
    if not any(tail):
        assert report.reason == "zero-filled tail"
        assert report.dropped_records_after == 0
        assert [r.levelno for r in caplog.records] == [logging.WARNING]
        assert report.moved_to == "" and not (tmp_path / "damaged").exists()  # zeros
    else:
        assert (tmp_path / report.moved_to).read_bytes() == tail
    assert path.stat().st_size == size


def test_zeroed_blocks_inside_the_last_record(tmp_path: Path) -> None:
    """Preallocated blocks after a crash: the file has its full size, the end is zeros."""
    log = SegmentLog(tmp_path)
    log.append([b"k" * 100, b"l" * 100])
    log.close()
    path = segments(tmp_path)[0]
    data = path.read_bytes()
    path.write_bytes(data[:-60] + b"\0" * 60)
    log = SegmentLog(tmp_path)
    assert contents(log) == [b"k" * 100]
    assert log.recovery[0].reason == "checksum mismatch"


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


def test_sync_from_another_thread_while_appending(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, segment_bytes=4096)
    stop = threading.Event()
    durable: list[int] = []
    errors: list[BaseException] = []

    def syncer() -> None:
        while not stop.is_set():
            try:
                durable.append(log.sync())
            except BaseException as exc:  # reported below, in the test's thread
                errors.append(exc)
                return

    thread = threading.Thread(target=syncer)
    thread.start()
    expected: list[bytes] = []
    try:
        for i in range(400):
            batch = [b"%d-%d" % (i, j) * (j % 5) for j in range(1 + i % 17)]
            assert log.append(batch) == len(expected) + 1
            expected += batch
            if i % 100 == 99:  # trim under the syncer's feet too
                log.set_checkpoint("fq", log.next_seq - 50)
                log.trim()
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not errors
    assert len(durable) > 1
    assert durable == sorted(durable)
    assert durable[-1] <= len(expected)
    assert log.sync() == len(expected)
    first = log.first_seq
    log.close()
    log = SegmentLog(tmp_path, segment_bytes=4096)
    assert log.recovery == []
    assert (log.first_seq, log.next_seq) == (first, len(expected) + 1)
    assert contents(log, batch=100) == expected[first - 1 :]


def test_checkpoint_past_the_end_moves_next_seq_up(tmp_path: Path) -> None:
    """Records a reader saw were lost (power cut): their seqs are not handed out again."""
    log = SegmentLog(tmp_path)
    log.append([p20(i) for i in range(1, 11)])
    log.set_checkpoint("fq", 11, durable=True)
    log.close()
    path = segments(tmp_path)[0]
    os.truncate(path, record_starts(path)[5])  # records 6-10 lost
    log = SegmentLog(tmp_path)
    assert (log.first_seq, log.next_seq) == (11, 11)
    assert "before a checkpoint at 11" in log.recovery[0].reason
    assert log.append([b"x"]) == 11


def test_lagging_reader_keeps_its_records_when_the_tail_is_lost(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path)
    log.append([p20(i) for i in range(1, 11)])
    log.set_checkpoint("slow", 3)
    log.set_checkpoint("fq", 11)
    log.close()
    path = segments(tmp_path)[0]
    os.truncate(path, record_starts(path)[5])
    log = SegmentLog(tmp_path)
    assert dict(log.checkpoints) == {"slow": 3, "fq": 6}
    assert log.read(3, 10) == [(i, p20(i)) for i in range(3, 6)]
    log.close()
    assert SegmentLog(tmp_path).recovery == []  # the moved checkpoint was saved


def test_unknown_format_is_refused(tmp_path: Path) -> None:
    SegmentLog(tmp_path).close()
    (tmp_path / "FORMAT").write_text("fqbroker-segmentlog 4\n")
    with pytest.raises(LogFormatError, match="fqbroker-segmentlog 4"):
        SegmentLog(tmp_path)
    assert (tmp_path / "FORMAT").read_text() == "fqbroker-segmentlog 4\n"


@pytest.mark.parametrize("damage", ["missing", "empty", "garbage"])
def test_a_missing_or_damaged_format_file_is_rewritten(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    log = SegmentLog(tmp_path)
    log.append([p20(i) for i in range(1, 11)])
    log.set_checkpoint("fq", 4)
    log.close()
    path = tmp_path / "FORMAT"
    if damage == "missing":
        path.unlink()
    else:
        path.write_bytes(b"" if damage == "empty" else b"\x00\xffqbroker-segmentlog 2")
    with caplog.at_level(logging.WARNING, logger="fqbroker.storage.segments.log"):
        log = SegmentLog(tmp_path)
    (report,) = log.recovery
    assert report.segment == "FORMAT"
    assert f"FORMAT file {damage if damage == 'missing' else 'damaged'}" in report.reason
    assert [r.levelno for r in caplog.records] == [logging.ERROR]
    assert path.read_text() == FORMAT_LINE
    assert dict(log.checkpoints) == {"fq": 4}  # the checkpoints file was kept
    assert stored(log) == {i: p20(i) for i in range(1, 11)}
    log.close()
    assert SegmentLog(tmp_path).recovery == []


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


def test_segments_that_are_not_ours_are_refused(tmp_path: Path) -> None:
    (tmp_path / f"{1:020d}.seg").write_bytes(os.urandom(100))
    with pytest.raises(LogFormatError, match="do not start with segment log records"):
        SegmentLog(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{1:020d}.seg"]  # untouched


def test_a_drained_log_gives_its_disk_back(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path)  # 64 MiB segments
    log.append([b"x" * 1000] * 300)
    log.set_checkpoint("fq", 200)
    assert log.trim() == 0  # a reader still needs the segment
    log.set_checkpoint("fq", 301)
    freed = log.trim()
    assert freed == 300 * (HEADER_SIZE + 1000) and log.size_bytes == 0
    assert [p.name for p in segments(tmp_path)] == [f"{301:020d}.seg"]
    assert (log.first_seq, log.next_seq) == (301, 301)
    assert log.append([b"y"]) == 301
    assert log.read(301, 5) == [(301, b"y")]
    log.set_checkpoint("fq", 302)
    assert log.trim() == 0  # a few bytes: not worth a new file after every batch
    log.close()
    log = SegmentLog(tmp_path)
    assert (log.recovery, log.first_seq, log.next_seq) == ([], 301, 302)
    log.close()


def test_closed_and_destroyed(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path / "q")
    log.append([b"a"])
    log.close()
    for call in (lambda: log.append([b"b"]), lambda: log.read(1, 1), log.sync, log.trim):
        with pytest.raises(ValueError, match="closed"):
            call()
    log = SegmentLog(tmp_path / "q")
    log.destroy()
    assert not (tmp_path / "q").exists()
    log.destroy()


# A step is an append batch, or a reopen that may first cut the last segment file at a
# fraction of its size (a crash mid-write).
_steps = st.lists(
    st.one_of(
        st.lists(st.binary(max_size=40), max_size=8),
        st.one_of(st.none(), st.floats(0, 1)).map(lambda cut: ("reopen", cut)),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=_steps, segment_bytes=st.sampled_from([40, 120, 1 << 20]))
def test_recovered_log_is_the_written_prefix(
    steps: list[list[bytes] | tuple[str, float | None]], segment_bytes: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "q"
        log = SegmentLog(directory, segment_bytes=segment_bytes)
        model: list[bytes] = []
        for step in [*steps, ("reopen", 0.5)]:
            if isinstance(step, list):
                assert log.append(step) == len(model) + 1
                model += step
                continue
            log.close()
            cut = step[1]
            if cut is not None:
                path = segments(directory)[-1]
                at = int(path.stat().st_size * cut)
                kept = int(path.name[:20]) - 1 + _whole_records(path, at)
                os.truncate(path, at)
                model = model[:kept]
            log = SegmentLog(directory, segment_bytes=segment_bytes)
            assert contents(log) == model
            assert log.next_seq == len(model) + 1
        log.close()


def _whole_records(path: Path, at: int) -> int:
    """How many records of ``path`` end at or before byte ``at``."""
    data = path.read_bytes()
    ends = [
        start + HEADER_SIZE + HEADER.unpack_from(data, start)[1] for start in record_starts(path)
    ]
    return sum(1 for end in ends if end <= at)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    payloads=st.lists(st.binary(max_size=30), min_size=1, max_size=30),
    where=st.floats(0, 1, exclude_max=True),
    bit=st.integers(0, 7),
    segment_bytes=st.sampled_from([60, 1 << 20]),
)
def test_a_flipped_bit_never_reaches_a_reader(
    payloads: list[bytes], where: float, bit: int, segment_bytes: int
) -> None:
    """CRC-32 catches every single-bit error: exactly the damaged record is skipped."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "q"
        log = SegmentLog(directory, segment_bytes=segment_bytes)
        log.append(payloads)
        log.close()
        at = int(log.size_bytes * where)
        for path in segments(directory):
            size = path.stat().st_size
            if at < size:
                break
            at -= size
        damaged = int(path.name[:20]) + sum(1 for start in record_starts(path) if start <= at) - 1
        data = bytearray(path.read_bytes())
        data[at] ^= 1 << bit
        path.write_bytes(bytes(data))
        log = SegmentLog(directory, segment_bytes=segment_bytes)
        expected = {i: p for i, p in enumerate(payloads, 1) if i != damaged}
        if damaged == len(payloads):  # the last record: a lost tail, as after a crash
            assert log.next_seq == damaged
        assert stored(log) == expected
        assert len(log.recovery) == 1
        log.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    payloads=st.lists(st.binary(max_size=60), min_size=1, max_size=60),
    damage=st.lists(
        st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 90), st.booleans()),
        min_size=1,
        max_size=3,
    ),
    segment_bytes=st.sampled_from([150, 400, 1 << 20]),
    reopen=st.booleans(),
)
def test_damage_loses_exactly_the_records_it_touches(
    payloads: list[bytes],
    damage: list[tuple[float, int, bool]],
    segment_bytes: int,
    reopen: bool,
) -> None:
    """Overwrite a few byte ranges (zeros or garbage) of any segments: every record none
    of whose bytes changed is still read, with its seq; nothing read differs from what
    was written. Found when the log is opened, or by reads while it runs."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "q"
        log = SegmentLog(directory, segment_bytes=segment_bytes)
        log.append(payloads)
        files = segments(directory)
        layout = {path: record_starts(path) for path in files}
        total = sum(p.stat().st_size for p in files)
        changed: dict[Path, list[tuple[int, int]]] = {}
        for where, length, zeros in damage:
            at = int(total * where)
            for path in files:
                size = path.stat().st_size
                if at < size:
                    break
                at -= size
            end = min(at + length, size)
            new = bytes(end - at) if zeros else os.urandom(end - at)
            with path.open("r+b") as f:  # in place: the open log's reads see it
                f.seek(at)
                old = f.read(end - at)
                f.seek(at)
                f.write(new)
            changed.setdefault(path, []).extend(
                (at + i, at + i + 1) for i in range(end - at) if old[i] != new[i]
            )
        intact = {}
        for path, starts in layout.items():
            for seq, start in enumerate(starts, int(path.name[:20])):
                end = start + HEADER_SIZE + len(payloads[seq - 1])
                if not any(start <= a < end for a, _ in changed.get(path, [])):
                    intact[seq] = payloads[seq - 1]
        if reopen:
            log.close()
            log = SegmentLog(directory, segment_bytes=segment_bytes)
        got = stored(log)
        assert {seq: got.get(seq) for seq in intact} == intact
        assert all(payloads[seq - 1] == payload for seq, payload in got.items())
        log.close()


# --- the checkpoints file ---------------------------------------------------------------


def test_checkpoint_file_bytes_match_the_documented_format(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path)
    data = (tmp_path / "checkpoints").read_bytes()
    assert data[:16] == bytes.fromhex("6671636b7074730a 00001000 5e433289")
    assert len(data) == 4 * BLOCK
    assert checkpoint_slots(tmp_path) == [(1, {}), None, None]
    log.append([b"x"] * 1041)
    log.set_checkpoint("fq", 1042)
    # The example of docs/disk-format.md: generation 2 goes to slot 1.
    assert slot_bytes(tmp_path, 1)[:28] == bytes.fromhex(
        "6206adb7 0000000c 0000000000000002 0000000000000412 0002 6671"
    )
    log.set_checkpoint("spark-reader", 980)  # not slot 0: its state (created so) is durable
    assert checkpoint_slots(tmp_path) == [
        (1, {}), (2, {"fq": 1042}), (3, {"fq": 1042, "spark-reader": 980}),
    ]  # fmt: skip
    log.close()


def test_updates_rotate_around_the_latest_and_the_durable_slot(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path)
    log.append([b"x"] * 100)
    log.set_checkpoint("fq", 2, durable=True)  # generation 2, slot 1: durable
    durable = slot_bytes(tmp_path, 1)
    written = []
    for seq in range(3, 13):
        log.set_checkpoint("fq", seq)
        written.append(latest_slot(tmp_path))
        assert slot_bytes(tmp_path, 1) == durable  # a power cut still finds it
    assert written == [2, 0] * 5  # and never the slot just written
    # A power cut that lost every non-durable write: back to the durable state, no further.
    log.close()
    damage_slot(tmp_path, 0)
    damage_slot(tmp_path, 2)
    assert dict(SegmentLog(tmp_path).checkpoints) == {"fq": 2}


def test_a_failed_durable_update_keeps_the_last_durable_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = SegmentLog(tmp_path)
    log.append([b"x"] * 100)
    log.set_checkpoint("fq", 2, durable=True)  # slot 1
    monkeypatch.setattr(segcheckpoints, "_fdatasync", FailingFsync().fsync)
    with pytest.raises(OSError, match="Input/output"):
        log.set_checkpoint("fq", 3, durable=True)  # slot 2, made but not durable
    assert log.checkpoints["fq"] == 3
    monkeypatch.undo()
    log.set_checkpoint("fq", 4)
    assert latest_slot(tmp_path) == 0  # not 1: that one still holds the durable state
    log.set_checkpoint("fq", 5, durable=True)  # slot 2: durable
    log.set_checkpoint("fq", 6)
    assert latest_slot(tmp_path) == 0
    log.close()
    assert dict(SegmentLog(tmp_path).checkpoints) == {"fq": 6}


@pytest.mark.parametrize("at", [0, 3, 4, 8, 16, 20, 27])
def test_a_torn_slot_leaves_the_state_before_it(tmp_path: Path, at: int) -> None:
    log = SegmentLog(tmp_path)
    log.append([b"x"] * 100)
    log.set_checkpoint("fq", 10)
    log.set_checkpoint("replay", 5)
    log.set_checkpoint("fq", 20)
    log.close()
    damage_slot(tmp_path, latest_slot(tmp_path), at)
    log = SegmentLog(tmp_path)
    assert log.recovery == []  # a torn slot is what a crash mid-write leaves: no damage
    assert dict(log.checkpoints) == {"fq": 10, "replay": 5}
    log.set_checkpoint("fq", 30)  # into the torn slot, the one that is neither kept one
    log.close()
    assert dict(SegmentLog(tmp_path).checkpoints) == {"fq": 30, "replay": 5}


def test_a_flipped_bit_in_a_slot_is_caught(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path)
    log.append([b"x"] * 100)
    log.set_checkpoint("fq", 10)
    log.set_checkpoint("fq", 11)
    log.close()
    slot = latest_slot(tmp_path)
    for byte in range(28):
        for bit in range(8):
            path = tmp_path / "checkpoints"
            data = bytearray(path.read_bytes())
            off = BLOCK + slot * BLOCK + byte
            data[off] ^= 1 << bit
            path.write_bytes(bytes(data))
            log = SegmentLog(tmp_path)
            assert dict(log.checkpoints) == {"fq": 10}, (byte, bit)
            log.close()
            data[off] ^= 1 << bit
            path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["header", "every slot", "short", "missing"])
def test_an_unreadable_checkpoints_file_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    log = SegmentLog(tmp_path)
    log.append([b"x"] * 10)
    log.set_checkpoint("fq", 5)
    log.close()
    path = tmp_path / "checkpoints"
    if damage == "header":
        path.write_bytes(b"\0" + path.read_bytes()[1:])
    elif damage == "every slot":
        for slot in range(3):
            damage_slot(tmp_path, slot, 8)
    elif damage == "short":
        os.truncate(path, BLOCK + BLOCK)
    else:
        path.unlink()
    with caplog.at_level(logging.ERROR, logger="fqbroker.storage.segments.log"):
        log = SegmentLog(tmp_path)
    (report,) = log.recovery
    assert report.segment == "checkpoints"
    assert "checkpoints" in report.reason
    assert [r.levelno for r in caplog.records] == [logging.ERROR]
    if damage == "header":  # the file size gives the slot size: the slots still count
        assert "header damaged; rebuilt" in report.reason
        assert dict(log.checkpoints) == {"fq": 5}
        log.close()
        return
    assert dict(log.checkpoints) == {}  # every reader starts from the first record
    assert contents(log) == [b"x"] * 10
    log.set_checkpoint("fq", 7)
    log.close()
    log = SegmentLog(tmp_path)
    assert (log.recovery, dict(log.checkpoints)) == ([], {"fq": 7})


def test_many_and_long_named_checkpoints_grow_the_file(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path)
    log.append([b"x"] * 5000)
    names = [f"reader-{i}-" + "é" * (i % 200) for i in range(500)]  # 110 KB in all
    for i, name in enumerate(names):
        log.set_checkpoint(name, 1 + i)
    size = (tmp_path / "checkpoints").stat().st_size
    assert size > 3 * 110_000  # grown, by renaming a bigger file into place
    longest = "n" * 0xFFFF
    log.set_checkpoint(longest, 3)
    with pytest.raises(ValueError, match="over 65535"):
        log.set_checkpoint(longest + "n", 3)
    with pytest.raises(ValueError, match="over 65535"):
        log.set_checkpoint("é" * 0x8000, 3)
    odd = "\udcff \x00 ☃"  # a lone surrogate too: whatever a str holds round-trips
    log.set_checkpoint(odd, 4)
    expected = {**{name: 1 + i for i, name in enumerate(names)}, longest: 3, odd: 4}
    assert dict(log.checkpoints) == expected
    log.set_checkpoint(names[7], 4999)  # in place, in the bigger slot
    expected[names[7]] = 4999
    log.close()
    log = SegmentLog(tmp_path)
    assert log.recovery == []
    assert dict(log.checkpoints) == expected
    for name in names[:490]:
        log.remove_checkpoint(name)
    log.trim()
    log.close()
    log = SegmentLog(tmp_path)
    assert dict(log.checkpoints) == {n: expected[n] for n in [*names[490:], longest, odd]}
    log.close()


def _v1_log(directory: Path, checkpoints: dict[str, int] | None) -> None:
    """A log as format 1 left it: its FORMAT line and checkpoints.json."""
    log = SegmentLog(directory)
    log.append([p20(i) for i in range(1, 21)])
    log.close()
    (directory / "checkpoints").unlink()
    (directory / "FORMAT").write_text("fqbroker-segmentlog 1\n")
    if checkpoints is not None:
        text = json.dumps({"checkpoints": checkpoints}, sort_keys=True) + "\n"
        (directory / "checkpoints.json").write_text(text)


@pytest.mark.parametrize("points", [{"fq": 11, "spark-reader": 4}, {}, None])
def test_format_1_is_converted_on_open(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, points: dict[str, int] | None
) -> None:
    _v1_log(tmp_path, points)
    with caplog.at_level(logging.WARNING, logger="fqbroker.storage.segments.log"):
        log = SegmentLog(tmp_path)
    assert log.recovery == []
    assert dict(log.checkpoints) == (points or {})
    assert (tmp_path / "FORMAT").read_text() == FORMAT_LINE == "fqbroker-segmentlog 2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "00000000000000000001.seg", "FORMAT", "checkpoints",
    ]  # fmt: skip
    assert "converted" in caplog.text
    assert contents(log) == [p20(i) for i in range(1, 21)]
    log.close()
    log = SegmentLog(tmp_path)
    assert (log.recovery, dict(log.checkpoints)) == ([], points or {})


def test_an_interrupted_conversion_is_finished(tmp_path: Path) -> None:
    # Stopped after the checkpoints file, before FORMAT: checkpoints.json still counts
    # (a format 1 fqbroker may even have run since).
    _v1_log(tmp_path, {"fq": 11})
    log = SegmentLog(tmp_path)
    log.set_checkpoint("fq", 15)
    log.close()
    (tmp_path / "FORMAT").write_text("fqbroker-segmentlog 1\n")
    (tmp_path / "checkpoints.json").write_text('{"checkpoints": {"fq": 12}}')
    log = SegmentLog(tmp_path)
    assert dict(log.checkpoints) == {"fq": 12}
    log.close()
    # Stopped after FORMAT, before checkpoints.json was deleted: the new file counts.
    (tmp_path / "checkpoints.json").write_text('{"checkpoints": {"fq": 3}}')
    (tmp_path / "checkpoints.json.tmp").write_text("{")
    log = SegmentLog(tmp_path)
    assert (log.recovery, dict(log.checkpoints)) == ([], {"fq": 12})
    assert not (tmp_path / "checkpoints.json").exists()
    assert not (tmp_path / "checkpoints.json.tmp").exists()
    log.close()


def test_an_unreadable_checkpoints_json_is_reported_and_converted(tmp_path: Path) -> None:
    _v1_log(tmp_path, None)
    (tmp_path / "checkpoints.json").write_text('{"checkpoints": {"fq": "x"}}')
    log = SegmentLog(tmp_path)
    (report,) = log.recovery
    assert (report.segment, report.dropped_bytes) == ("checkpoints.json", 28)
    assert dict(log.checkpoints) == {}
    assert (tmp_path / "FORMAT").read_text() == FORMAT_LINE
    log.close()


_EFBIG_CHECKPOINTS = r"""
import json, resource, signal, sys
from pathlib import Path
from fqbroker.storage.segments.log import SegmentLog

log = SegmentLog(Path(sys.argv[1]))
log.append([b"x"] * 100)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so write() fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (20000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
out = {}
try:
    for i in range(1000):
        log.set_checkpoint("reader-%04d" % i, 1 + i % 100)
except OSError as exc:
    out["errno"] = exc.errno
log.set_checkpoint("reader-0000", 50)  # in place: needs no new block
out["points"] = dict(log.checkpoints)
log.close()
print(json.dumps(out))
"""


def test_a_full_disk_refuses_growing_the_checkpoints_file_cleanly(tmp_path: Path) -> None:
    """The file is preallocated, so updates in place go on; growing it (to a 28 KiB file,
    over the 20000-byte RLIMIT_FSIZE) fails and changes nothing."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _EFBIG_CHECKPOINTS, str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    out = json.loads(done.stdout)
    assert out["errno"] == 27  # EFBIG
    fit = (BLOCK - HEADER_SIZE) // (ENTRY.size + 11)  # 194 entries of 11-byte names
    assert len(out["points"]) == fit
    assert out["points"]["reader-0000"] == 50
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "00000000000000000001.seg", "FORMAT", "checkpoints",
    ]  # fmt: skip
    log = SegmentLog(tmp_path)
    assert (log.recovery, dict(log.checkpoints)) == ([], out["points"])
    log.close()


# A step: set a checkpoint (name, seq, durable), remove one, reopen after a crash (kill -9:
# nothing lost), or reopen after a crash in the middle of the last write.
_ckpt_steps = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["fq", "a", "b", "c" * 3000]), st.integers(1, 50), st.booleans()),
        st.sampled_from(["fq", "a", "b"]).map(lambda name: ("remove", name)),
        st.sampled_from(["kill", "torn"]),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=_ckpt_steps)
def test_checkpoints_after_a_crash_are_the_last_or_the_one_before(
    steps: list[tuple[str, int, bool] | tuple[str, str] | str],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "q"
        log = SegmentLog(directory)
        log.append([b"x"] * 49)
        model: dict[str, int] = {}
        before: dict[str, int] | None = None  # the state before the last write since open
        for step in steps:
            if isinstance(step, str):
                log.close()
                if step == "torn" and before is not None:
                    damage_slot(directory, latest_slot(directory), 5)
                    model = before
                log = SegmentLog(directory)
                assert log.recovery == []
                assert dict(log.checkpoints) == model
                before = None
                continue
            if step[0] == "remove":
                if step[1] not in model:
                    continue
                log.remove_checkpoint(step[1])
                before, model = dict(model), {k: v for k, v in model.items() if k != step[1]}
                continue
            name, seq, durable = step
            log.set_checkpoint(name, seq, durable=durable)
            before, model = dict(model), {**model, name: seq}
            assert dict(log.checkpoints) == model
        log.close()


# --- failed fsyncs and repair -----------------------------------------------------------


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


def test_segment_info_lists_every_segment(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, segment_bytes=100)
    log.append([p20(i) for i in range(1, 10)])  # segments 1, 3, 5, 7 (two each), 9 (one)
    info = log.segment_info()
    assert [(s.first, s.end, s.size) for s in info] == [
        (1, 3, 72), (3, 5, 72), (5, 7, 72), (7, 9, 72), (9, 10, 36)
    ]  # fmt: skip
    assert [s.path for s in info] == segments(tmp_path)
    old = time.time() - 3600
    os.utime(info[0].path, (old, old))
    assert info[0].mtime() == pytest.approx(old)
    assert info[1].mtime() == pytest.approx(info[1].path.stat().st_mtime)
    info[0].path.unlink()
    assert info[0].mtime() is None
    log.close()


def test_drop_before_deletes_whole_segments_never_the_newest(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, segment_bytes=100)
    log.append([p20(i) for i in range(1, 10)])
    assert log.drop_before(1) == 0
    assert log.drop_before(4) == 72  # segment 1 (seqs 1-2) only: 3 is in segment 3
    assert (log.first_seq, log.size_bytes) == (3, 3 * 72 + 36)
    assert contents(log) == [p20(i) for i in range(3, 10)]
    assert log.read(3, 1) == [(3, p20(3))]  # a remembered position into a deleted one is gone
    assert log.drop_before(10**9) == 3 * 72  # everything but the newest
    assert [p.name[-8:-4] for p in segments(tmp_path)] == ["0009"]
    assert (log.first_seq, log.next_seq) == (9, 10)
    assert log.append([p20(10)]) == 10
    log.close()
    # No checkpoints, no gap: recovery finds nothing wrong, and seqs go on.
    log = SegmentLog(tmp_path, segment_bytes=100)
    assert log.recovery == []
    assert (log.first_seq, log.next_seq) == (9, 11)
    assert contents(log) == [p20(9), p20(10)]
    log.close()


def test_drop_before_moves_checkpoints_up_to_the_first_seq_left(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, segment_bytes=100)
    log.append([p20(i) for i in range(1, 10)])
    log.set_checkpoint("behind", 2)
    log.set_checkpoint("ahead", 8)
    log.drop_before(6)
    assert dict(log.checkpoints) == {"behind": 5, "ahead": 8}
    log.close()


def test_read_run_reads_one_segment_fast_and_defers_the_rest_to_read(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, segment_bytes=200)  # five 36-byte records per segment
    log.append([p20(i) for i in range(1, 21)])
    assert log.read_run(1, 100) == [p20(i) for i in range(1, 6)]  # to the segment's end
    assert log.read_run(6, 100, skip=18) == [b"%02d" % i for i in range(6, 11)]
    assert log.read_run(13, 2) == [p20(13), p20(14)]
    # About max_bytes: it reads max_bytes and a header per record asked for (110 bytes).
    assert log.read_run(11, 100, max_bytes=30) == [p20(11), p20(12), p20(13)]
    assert log.read_run(20, 100) == [p20(20)]
    assert log.read_run(21, 100) == [] and log.read_run(0, 100) == []
    log.append([b"x" * 1000])  # bigger than any read it would plan
    assert log.read_run(21, 100, max_bytes=10) == [b"x" * 1000]
    # Damage: the run stops before it; read() steps over it.
    path = tmp_path / f"{1:020d}.seg"
    flip(path, 2 * 36 + HEADER_SIZE + 5)
    assert log.read_run(1, 100) == [p20(1), p20(2)]
    assert log.read_run(3, 100) == []
    assert [s for s, _ in log.read(3, 100)][:3] == [4, 5, 6]
    log.close()
    # A gap (a segment gone): nothing at its start, the next segment as usual.
    log = SegmentLog(tmp_path, segment_bytes=200)
    (tmp_path / f"{11:020d}.seg").unlink()
    log.close()
    log = SegmentLog(tmp_path, segment_bytes=200)
    assert log.read_run(11, 100) == []
    assert log.read_run(16, 100) == [p20(i) for i in range(16, 21)]
    log.close()
