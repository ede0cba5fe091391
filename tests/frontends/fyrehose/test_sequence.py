"""The fyrehose sequence across restarts, on real files in a temporary directory: the
lease in ``sequence`` and the last number given in the shared mapping ``sequence.last``.

A process killed leaves the mapping's stores in the page cache, so these tests "kill" a
broker by starting a new SequenceFile on the same files without closing the first one's
mapping; a power cut is a start under another boot id (the page cache did not survive,
so the record may be stale or torn and only the lease is safe).
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from fqbroker.frontends.fyrehose.backbone import Backbone
from fqbroker.frontends.fyrehose.sequence import LEASE, MARK_SIZE, MASK, SequenceFile, boot_id

BOOT = uuid.uuid4().bytes
OTHER_BOOT = uuid.uuid4().bytes


def started(queue_dir: Path, boot: bytes | None = BOOT) -> tuple[SequenceFile, Backbone]:
    """What the listener does at a start: the next number, written exact, the mapping,
    and a backbone taking its lease at the first message."""
    file = SequenceFile.under(queue_dir, boot=boot)
    first = file.start()
    file.write(first)
    backbone = Backbone(
        next_sequence=first, renew=file.lease, lease=first, mark=file.open_mark(first - 1)
    )
    return file, backbone


def number(backbone: Backbone, n: int) -> list[int]:
    for _ in range(n):
        backbone.sequence_message(b"m")
    return list(range(backbone.sequence - n + 1, backbone.sequence + 1))


def test_a_killed_broker_continues_right_after_its_last_number(tmp_path: Path) -> None:
    file, backbone = started(tmp_path)
    assert number(backbone, 3) == [1, 2, 3]
    assert file.read() == 1 + LEASE  # the lease on disk, as before
    # Killed: no stop, the mapping left as it was.
    _, backbone = started(tmp_path)
    assert number(backbone, 2) == [4, 5]
    # And again, past a renewal of the lease.
    for _ in range(LEASE + 10):
        backbone.sequence_message(b"m")
    last = backbone.sequence
    _, backbone = started(tmp_path)
    assert number(backbone, 1) == [last + 1]


def test_a_kill_right_after_a_start_or_a_renewal_skips_nothing(tmp_path: Path) -> None:
    started(tmp_path)
    _, backbone = started(tmp_path)  # killed before the first message
    assert number(backbone, 1) == [1]
    for _ in range(LEASE - 1):  # the last number of the first lease
        backbone.sequence_message(b"m")
    assert backbone.sequence == LEASE
    _, backbone = started(tmp_path)
    assert number(backbone, 1) == [LEASE + 1]
    backbone.sequence_message(b"m")  # takes a new lease
    _, backbone = started(tmp_path)
    assert number(backbone, 1) == [LEASE + 3]


def test_a_clean_stop_is_exact_with_or_without_the_mapping(tmp_path: Path) -> None:
    file, backbone = started(tmp_path)
    number(backbone, 7)
    file.write(backbone.sequence + 1)
    file.close_mark()
    assert started(tmp_path)[0].read() == 8
    assert started(tmp_path, boot=OTHER_BOOT)[0].read() == 8


def test_after_a_power_cut_the_lease_is_taken(tmp_path: Path) -> None:
    _, backbone = started(tmp_path)
    number(backbone, 3)
    # Another boot: whatever sequence.last holds may be stale, the lease is safe.
    _, backbone = started(tmp_path, boot=OTHER_BOOT)
    assert number(backbone, 1) == [1 + LEASE]
    # The new record is this boot's: a kill now continues exactly.
    _, backbone = started(tmp_path, boot=OTHER_BOOT)
    assert number(backbone, 1) == [2 + LEASE]


def write_record(file: SequenceFile, at: int, data: bytes) -> None:
    raw = bytearray(file.mark_path.read_bytes())
    raw[at : at + len(data)] = data
    file.mark_path.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    "damage",
    [
        "torn_last",  # the kill cut a store of the last number in half
        "torn_lease",
        "magic",
        "short",
        "empty",
        "missing",
    ],
)
def test_a_torn_or_unreadable_record_falls_back_to_the_lease(tmp_path: Path, damage: str) -> None:
    file, backbone = started(tmp_path)
    number(backbone, 5)
    assert file.read() == 1 + LEASE
    if damage == "torn_last":
        # The new number's low half written, its complement still the old one's.
        write_record(file, 0, (6).to_bytes(4, "little"))
    elif damage == "torn_lease":
        write_record(file, 16, (1).to_bytes(8, "little"))
    elif damage == "magic":
        write_record(file, 48, b"garbage!")
    elif damage == "short":
        file.mark_path.write_bytes(file.mark_path.read_bytes()[:40])
    elif damage == "empty":
        file.mark_path.write_bytes(b"")
    else:
        file.mark_path.unlink()
    _, backbone = started(tmp_path)
    assert number(backbone, 1) == [1 + LEASE]


def test_a_record_of_another_lease_is_not_trusted(tmp_path: Path) -> None:
    file, backbone = started(tmp_path)
    number(backbone, 5)
    # Someone wrote a number into the file by hand, above what subscribers hold.
    file.path.write_text("1000000\n")
    _, backbone = started(tmp_path)
    assert number(backbone, 1) == [1000000]


def test_a_record_below_its_lease_is_not_trusted(tmp_path: Path) -> None:
    file, backbone = started(tmp_path)
    number(backbone, 5)
    # A last number that no broker under this lease could have given (written by hand).
    file.mark[0:16] = (1).to_bytes(8, "little") + (1 ^ MASK).to_bytes(8, "little")
    file.path.write_text(f"{1 + 2 * LEASE}\n")
    file.write(1 + 2 * LEASE)  # the record tied to it
    _, backbone = started(tmp_path)
    assert number(backbone, 1) == [1 + 2 * LEASE]


def test_numbers_past_a_lease_that_could_not_be_written_are_not_reused(tmp_path: Path) -> None:
    file = SequenceFile.under(tmp_path, boot=BOOT)
    file.write(1)

    def failing(seq: int) -> int:  # a full disk: the endpoint's renewer goes on
        return seq + 1024

    backbone = Backbone(next_sequence=1, renew=failing, lease=1, mark=file.open_mark(0))
    number(backbone, 3000)
    assert file.read() == 1
    _, backbone = started(tmp_path)
    assert number(backbone, 1) == [3001]


def test_without_a_boot_id_no_mapping_is_made_and_a_kill_takes_the_lease(
    tmp_path: Path,
) -> None:
    file, backbone = started(tmp_path, boot=None)
    assert isinstance(file.mark, bytearray) and not file.mark_path.exists()
    number(backbone, 3)
    _, backbone = started(tmp_path, boot=None)
    assert number(backbone, 1) == [1 + LEASE]


def test_a_mapping_that_cannot_be_made_is_logged_and_costs_only_the_jump(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "fyrehose" / "sequence.last").mkdir(parents=True)
    with caplog.at_level(logging.WARNING):
        file, backbone = started(tmp_path)
    assert "cannot map" in caplog.text and "jump ahead" in caplog.text
    assert isinstance(file.mark, bytearray) and len(file.mark) == MARK_SIZE
    number(backbone, 3)
    _, backbone = started(tmp_path)
    assert number(backbone, 1) == [1 + LEASE]


def test_the_boot_id_is_the_kernels(tmp_path: Path) -> None:
    proc = Path("/proc/sys/kernel/random/boot_id")
    if proc.exists():
        assert boot_id() == uuid.UUID(proc.read_text().strip()).bytes
    assert boot_id(tmp_path / "none") is None
    (tmp_path / "bad").write_text("not a uuid\n")
    assert boot_id(tmp_path / "bad") is None
    (tmp_path / "short").write_text("abcd-ef01\n")
    assert boot_id(tmp_path / "short") is None
