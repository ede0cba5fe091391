"""The fyrehose sequence across restarts: ``<queue_dir>/fyrehose/sequence`` and
``sequence.last`` beside it.

Subscribers hold the numbers they were sent, and a broker that started again at 1 would
have them drop new messages as duplicates, or take a new message for an old one. So the
file ``sequence`` holds the next sequence the broker may give, written durably (a
temporary file, fsync, rename, fsync of the directory): a **lease** of :data:`LEASE`
numbers ahead while running, the exact number at a clean stop.

A lease alone makes every crash a jump of up to :data:`LEASE`, which subscribers take for
a gap and request. So ``sequence.last`` is mapped shared into memory and the backbone
stores the last number given into it with every message (a memory store, no system
call). A process killed, even with ``kill -9``, leaves that store in the kernel's page
cache, and the next start on the same running kernel continues at the number after it.
A machine that went down (power, a kernel crash) may have written the page back at any
time or never: the record names the boot it was written in (the kernel's boot id) and is
trusted only in that same boot, only if it belongs to the lease now in ``sequence``, and
only if each of its numbers agrees with its complement (a store cut short by the kill);
otherwise the start takes the lease, as before. An unreadable ``sequence`` is a startup
error (:class:`SequenceFileError`); an unusable ``sequence.last`` only costs the jump.
docs/fyrehose.md, "The sequence across restarts".
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import struct
from pathlib import Path
from typing import Final

from fqbroker.errors import SequenceFileError
from fqbroker.protocols.fyrehose import wire
from fqbroker.storage.files import FILE_MODE, private_dirs

__all__ = ["LAST", "LEASE", "MASK", "Mark", "SequenceFile", "SequenceFileError", "boot_id"]

log = logging.getLogger(__name__)

LEASE: Final = 65536  # numbers a running broker may give before it writes the file again
# The highest number a start may begin at: 48 bits hold 281 trillion messages, so this only
# refuses a file someone wrote by hand, whose numbers would run out within a lease.
LAST_START: Final = wire.MAX_SEQUENCE - LEASE

# sequence.last, little-endian: the last number given and its complement (the backbone's
# store per message, at offset 0), the lease it was given under and its complement, the
# boot id, a magic. Each number beside its complement: a store the kill cut in half shows.
LAST: Final = struct.Struct("<QQ")
MASK: Final = (1 << 64) - 1
_RECORD: Final = struct.Struct("<QQQQ16s8s")
_LEASE_AT: Final = LAST.size
_MAGIC: Final = b"fyrseq1\n"
MARK_SIZE: Final = 64  # the file's size: the record, padded
BOOT_ID: Final = Path("/proc/sys/kernel/random/boot_id")
THIS_BOOT: Final = b"this boot"  # SequenceFile's default: the running kernel's boot id

Mark = mmap.mmap | bytearray  # where the backbone stores the last number given


def boot_id(path: Path = BOOT_ID) -> bytes | None:
    """This kernel boot's id (Linux), or None where there is none: then sequence.last is
    never trusted and every crash takes the lease."""
    try:
        boot = bytes.fromhex(path.read_text().strip().replace("-", ""))
    except (OSError, ValueError):
        return None
    return boot if len(boot) == 16 else None


class SequenceFile:
    """The files one listener keeps its next sequence number in."""

    def __init__(self, path: Path, *, boot: bytes | None = THIS_BOOT) -> None:
        self.path = path
        self.mark_path = path.with_name(path.name + ".last")
        # This kernel's boot id unless given (a test's power cut is another boot's id).
        self.boot = boot_id() if boot == THIS_BOOT else boot
        self.mark: Mark = bytearray(MARK_SIZE)  # the mapping once open_mark made it
        self._lease = 0  # the number sequence.last's record is tied to

    @classmethod
    def under(cls, queue_dir: Path, *, boot: bytes | None = THIS_BOOT) -> SequenceFile:
        return cls(Path(queue_dir) / "fyrehose" / "sequence", boot=boot)

    def read(self) -> int:
        """The next sequence to give: the file's number, or 1 when there is no file."""
        try:
            text = self.path.read_bytes()
        except FileNotFoundError:
            return 1
        except OSError as exc:
            raise self._error(f"cannot be read ({exc.strerror or exc})") from None
        word = text.strip()
        if not word.isdigit() or len(word) > 20:
            shown = text[:40].decode("ascii", "backslashreplace")
            raise self._error(f"does not hold a sequence number (it holds {shown!r})")
        if not 1 <= int(word) <= LAST_START:
            raise self._error(f"holds {int(word)}, not a number from 1 to {LAST_START}")
        return int(word)

    def start(self) -> int:
        """The next sequence to give at a start: the number after the last one given when
        sequence.last proves it (a process that was killed), else :meth:`read`'s."""
        written = self.read()
        last = self.last_given(written)
        # Below the lease's own first number, the record cannot be of that lease; above
        # the lease, numbers went on while a lease could not be written (a full disk),
        # and the record knows better than the file.
        if last is None or not written - LEASE <= last + 1 <= LAST_START:
            return written
        return last + 1

    def last_given(self, written: int) -> int | None:
        """The last number sequence.last holds if it can be trusted with the file holding
        ``written``: this boot's, the record of that very lease, each number whole."""
        if self.boot is None:
            return None
        try:
            data = self.mark_path.read_bytes()
        except OSError:
            return None
        if len(data) < _RECORD.size:
            return None
        last, last_check, lease, lease_check, boot, magic = _RECORD.unpack_from(data)
        if magic != _MAGIC or boot != self.boot:
            return None  # another boot's: the page cache it was in is gone
        if last ^ MASK != last_check or lease ^ MASK != lease_check:
            return None  # a store cut short
        if lease != written:
            return None  # the file was written after the record, by us or by hand
        return int(last)

    def _error(self, what: str) -> SequenceFileError:
        return SequenceFileError(
            f"fyrehose sequence file {self.path} {what}: the listener will not start and "
            "risk giving subscribers numbers they already hold; restore the file, or write "
            "into it a number above every sequence your subscribers have seen"
        )

    def open_mark(self, last: int) -> Mark:
        """Map sequence.last with ``last`` as the last number given, tied to the file's
        current number; the mapping (:attr:`mark`). Where it cannot be made, a buffer in
        memory, logged: a crash then takes the lease."""
        if self.boot is None:
            return self.mark
        record = _RECORD.pack(last, last ^ MASK, self._lease, self._lease ^ MASK, self.boot, _MAGIC)
        try:
            self._ensure_directory()
            fd = os.open(self.mark_path, os.O_RDWR | os.O_CREAT, FILE_MODE)
            try:
                # Written, not only truncated to size: the page has its blocks on disk, so
                # a store into it needs no space on a file system that writes in place (a
                # store the disk has no room for is a SIGBUS).
                os.pwrite(fd, record.ljust(MARK_SIZE, b"\0"), 0)
                self.mark = mmap.mmap(fd, MARK_SIZE, access=mmap.ACCESS_WRITE)
            finally:
                os.close(fd)
        except (OSError, ValueError) as exc:
            log.warning(
                "fyrehose: cannot map %s (%s): a crash will make the sequence jump ahead",
                self.mark_path,
                exc,
            )
        return self.mark

    def close_mark(self) -> None:
        mark = self.mark
        self.mark = bytearray(MARK_SIZE)
        if isinstance(mark, mmap.mmap):
            mark.close()

    def write(self, next_sequence: int) -> None:
        """Make ``next_sequence`` the file's number, durably; OSError if it cannot be."""
        self._ensure_directory()
        directory = self.path.parent
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        try:
            os.write(fd, f"{next_sequence}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        _fsync(directory)
        # Only now: until the rename the file still held the old number.
        self._lease = next_sequence
        LAST.pack_into(self.mark, _LEASE_AT, next_sequence, next_sequence ^ MASK)

    def lease(self, next_sequence: int) -> int:
        """Write a lease for the numbers from ``next_sequence`` on; the first number past
        it (the next that needs a new lease)."""
        end = next_sequence + LEASE
        self.write(end)
        return end

    def _ensure_directory(self) -> None:
        directory = self.path.parent
        if not directory.is_dir():
            private_dirs(directory)
            _fsync(directory.parent)


def _fsync(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):  # some file systems refuse to sync a directory
            os.fsync(fd)
    finally:
        os.close(fd)
