"""The fyrehose sequence across restarts: ``<queue_dir>/fyrehose/sequence``.

Subscribers hold the numbers they were sent, and a broker that started again at 1 would
have them drop new messages as duplicates, or take a new message for an old one. So the
file holds the next sequence the broker may give, written durably (a temporary file,
fsync, rename, fsync of the directory): a **lease** of :data:`LEASE` numbers ahead while
running, the exact number at a clean stop. An unreadable file is a startup error
(:class:`SequenceFileError`). docs/fyrehose.md, "The sequence across restarts".
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Final

from fqbroker.errors import SequenceFileError
from fqbroker.protocols.fyrehose import wire
from fqbroker.storage.files import FILE_MODE, private_dirs

__all__ = ["LEASE", "SequenceFile", "SequenceFileError"]

LEASE: Final = 65536  # numbers a running broker may give before it writes the file again
# The highest number a start may begin at: 48 bits hold 281 trillion messages, so this only
# refuses a file someone wrote by hand, whose numbers would run out within a lease.
LAST_START: Final = wire.MAX_SEQUENCE - LEASE


class SequenceFile:
    """The file one listener keeps its next sequence number in."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def under(cls, queue_dir: Path) -> SequenceFile:
        return cls(Path(queue_dir) / "fyrehose" / "sequence")

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

    def _error(self, what: str) -> SequenceFileError:
        return SequenceFileError(
            f"fyrehose sequence file {self.path} {what}: the listener will not start and "
            "risk giving subscribers numbers they already hold; restore the file, or write "
            "into it a number above every sequence your subscribers have seen"
        )

    def write(self, next_sequence: int) -> None:
        """Make ``next_sequence`` the file's number, durably; OSError if it cannot be."""
        directory = self.path.parent
        if not directory.is_dir():
            private_dirs(directory)
            _fsync(directory.parent)
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        try:
            os.write(fd, f"{next_sequence}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        _fsync(directory)

    def lease(self, next_sequence: int) -> int:
        """Write a lease for the numbers from ``next_sequence`` on; the first number past
        it (the next that needs a new lease)."""
        end = next_sequence + LEASE
        self.write(end)
        return end


def _fsync(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):  # some file systems refuse to sync a directory
            os.fsync(fd)
    finally:
        os.close(fd)
