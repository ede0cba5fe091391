"""Segment log writes and reads: round trips, rolling, random access, read limits,
the checkpoint API, trimming and dropping, sync from another thread, closing. Also the
helpers the other test_log*.py files import: the disk format transcribed from
docs/disk-format.md, and ways to walk, read back and damage a log's files."""

from __future__ import annotations

import os
import struct
import threading
import time
import zlib
from pathlib import Path

import pytest

from fqbroker.storage.segments.log import FORMAT_LINE, HEADER_SIZE, SegmentLog

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
