"""Segment log: round trips, rolling, random access, recovery from torn and corrupt files,
real write failures, trimming, sync from another thread, and a crash-recovery property."""

from __future__ import annotations

import json
import logging
import os
import struct
import subprocess
import sys
import tempfile
import threading
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fqbroker.segmentlog import FORMAT_LINE, HEADER_SIZE, LogFormatError, SegmentLog

HEADER = struct.Struct(">IIQ")  # transcribed from docs/disk-format.md, not imported
ROOT = Path(__file__).resolve().parents[1]


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
    assert json.loads((tmp_path / "checkpoints.json").read_text()) == {"checkpoints": {}}


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
    with caplog.at_level(logging.WARNING, logger="fqbroker.segmentlog"):
        log = SegmentLog(tmp_path)
    assert contents(log) == [p20(i) * 2 for i in range(1, 5)]
    (report,) = log.recovery
    assert (report.segment, report.offset, report.dropped_bytes) == (path.name, last, at - last)
    assert report.dropped_records_after == 1
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert path.stat().st_size == last
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
def test_corrupt_record_ends_the_log_before_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, segment: int, record: int, byte: int
) -> None:
    log = SegmentLog(tmp_path, segment_bytes=200)  # four 46-byte records per segment
    payloads = [os.urandom(30) for _ in range(20)]
    log.append(payloads)
    log.close()
    path = tmp_path / f"{segment:020d}.seg"
    data = bytearray(path.read_bytes())
    at = record * 46 + (HEADER_SIZE + byte if byte < 30 else byte)
    data[at] ^= 0x40
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="fqbroker.segmentlog"):
        log = SegmentLog(tmp_path, segment_bytes=200)
    good = segment - 1 + record
    assert contents(log) == payloads[:good]
    assert log.next_seq == good + 1
    (report,) = log.recovery
    assert report.reason == "checksum mismatch"
    assert (report.segment, report.offset) == (path.name, record * 46)
    assert report.dropped_bytes == 20 * 46 - good * 46
    assert report.dropped_records_after == 20 - good
    assert [r.levelno for r in caplog.records] == [logging.ERROR]
    assert segments(tmp_path)[-1] == path  # later segments deleted
    assert log.append([b"next"]) == good + 1


def test_missing_middle_segment_ends_the_log(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, segment_bytes=100)
    log.append([p20(i) for i in range(1, 10)])
    log.close()
    (tmp_path / f"{5:020d}.seg").unlink()
    log = SegmentLog(tmp_path, segment_bytes=100)
    assert contents(log) == [p20(i) for i in range(1, 5)]
    (report,) = log.recovery
    assert "starts at seq 7, expected 5" in report.reason
    assert report.dropped_bytes == 72 + 36


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
    with caplog.at_level(logging.WARNING, logger="fqbroker.segmentlog"):
        log = SegmentLog(tmp_path)
    assert contents(log) == [b"a" * i for i in range(5)]
    (report,) = log.recovery
    assert (report.offset, report.dropped_bytes) == (size, len(tail))
    if not any(tail):
        assert report.reason == "zero-filled tail"
        assert report.dropped_records_after == 0
        assert [r.levelno for r in caplog.records] == [logging.WARNING]
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
from fqbroker.segmentlog import SegmentLog

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
    assert out["after2"] == [21, 2320, 2320, ["00000000000000000001.seg", "FORMAT"]]
    assert out["seq"] == 21
    assert out["read"] == list(range(1, 22))
    log = SegmentLog(tmp_path, segment_bytes=4000)
    assert log.recovery == []
    assert contents(log) == [b"a" * 100] * 20 + [b"e"]


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
    (tmp_path / "FORMAT").write_text("fqbroker-segmentlog 2\n")
    with pytest.raises(LogFormatError, match="fqbroker-segmentlog 2"):
        SegmentLog(tmp_path)
    (tmp_path / "FORMAT").unlink()
    with pytest.raises(LogFormatError, match="no FORMAT"):
        SegmentLog(tmp_path)


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
    """CRC-32 catches every single-bit error: the log ends just before the damaged record."""
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
        assert contents(log) == payloads[: damaged - 1]
        assert len(log.recovery) == 1
        log.close()
