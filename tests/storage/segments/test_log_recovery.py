"""Segment log recovery, on open and while running: torn tails, corrupt records
skipped with everything after them kept, missing segments, zero-filled tails,
checkpoints past the end, the FORMAT file; and properties: the recovered log is the
written prefix, and damage loses exactly the records it touches."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fqbroker.storage.segments.log import FORMAT_LINE, HEADER_SIZE, LogFormatError, SegmentLog
from tests.storage.segments.test_log import (
    HEADER,
    contents,
    flip,
    p20,
    record_starts,
    segments,
    stored,
)


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


def test_segments_that_are_not_ours_are_refused(tmp_path: Path) -> None:
    (tmp_path / f"{1:020d}.seg").write_bytes(os.urandom(100))
    with pytest.raises(LogFormatError, match="do not start with segment log records"):
        SegmentLog(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{1:020d}.seg"]  # untouched


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
