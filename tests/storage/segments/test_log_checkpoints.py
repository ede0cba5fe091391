"""The segment log's checkpoints file: its documented bytes, slots rotating around
the latest and the durable one, torn and flipped slots, an unreadable file, growth,
conversion from format 1's checkpoints.json, a full disk, and a crash property."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fqbroker.storage.segments import checkpoints as segcheckpoints
from fqbroker.storage.segments.log import FORMAT_LINE, HEADER_SIZE, SegmentLog
from tests.conftest import FailingFsync
from tests.storage.segments.test_log import (
    BLOCK,
    ENTRY,
    ROOT,
    checkpoint_slots,
    contents,
    damage_slot,
    latest_slot,
    p20,
    slot_bytes,
)


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
