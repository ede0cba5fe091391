"""The OpenCluster store's write-ahead journal: appended batches, checksummed, replayed
at startup (docs/opencluster.md: "What an ack promises", and "On disk" for the format).

Why a journal in front of sqlite: a set must be on disk before its ack, and a sqlite row
costs CPU per set, most of it holding the GIL the event loop wants (bench/RESULTS.md). A
journal batch is the group commit's records joined into one buffer: one ``write`` and one
``fdatasync``, both without the GIL. sqlite stays the compacted form: the store folds the
journal's latest values into it in the background (as Redis rewrites its AOF).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import struct
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

from fqbroker.storage.files import FILE_MODE

__all__ = [
    "FRAMES",
    "MAGIC",
    "MAGIC_V1",
    "RECORD",
    "JournalWriter",
    "close_quietly",
    "journals",
    "replay",
    "set_payload",
]

log = logging.getLogger(__name__)

MAGIC = b"FQKVJ2\n\x00"
MAGIC_V1 = b"FQKVJ1\n\x00"
_BATCH = struct.Struct(">II")
RECORD = struct.Struct(">BdI")
I32 = struct.Struct(">i")
_SET_HEAD = struct.Struct(">IIiii")
_INT = 1  # kvstore.INT: an int value is 4 bytes, >i
FRAMES = 3  # a record that is a run of set frames (kvstore.INT and STRING are 1 and 2)
_FRAME_HEAD = struct.Struct(">hhii")
_SET_INT = 2000  # wire.SET_INT: the frames' other command is set_string
# A synced journal ("full") is grown by this many zero bytes ahead of its batches: a
# batch written over zeros leaves the file's size and blocks as they were, so its
# fdatasync writes the data alone, where an append's must also commit the file's new
# size to the filesystem's journal: about half the time and CPU (bench/RESULTS.md,
# figures behind comments). PostgreSQL zero-fills its WAL segments for the same reason.
ZERO_AHEAD = 1 << 20

# One replayed record: (map_hash, key_hash, kind, value, expires, name).
Record = tuple[int, int, int, int | bytes, float, bytes]


def journal_path(database: Path, gen: int) -> Path:
    """The journal of generation ``gen`` beside ``database``."""
    return database.with_name(f"{database.stem}.journal.{gen:08d}")


def journals(database: Path) -> list[tuple[int, Path]]:
    """The journals beside ``database``, oldest first."""
    prefix = f"{database.stem}.journal."
    found = []
    for path in database.parent.glob(prefix + "*"):
        suffix = path.name[len(prefix) :]
        if suffix.isdigit():
            found.append((int(suffix), path))
    return sorted(found)


def replay(path: Path) -> Iterator[Record]:
    """The records of one journal, in order, up to its first torn or damaged batch."""
    with path.open("rb") as file:
        status = os.fstat(file.fileno())
        if not stat.S_ISREG(status.st_mode):
            log.warning("opencluster: %s is not a regular file, skipped", path)
            return
        data = memoryview(file.read(status.st_size))
    if data[: len(MAGIC)] not in (MAGIC, MAGIC_V1):
        if len(data):  # empty: created, then the crash came before its first write
            log.warning("opencluster: %s is not a journal, skipped", path)
        return
    at, end = len(MAGIC), len(data)
    head_size = _BATCH.size
    while at < end:
        if at + head_size > end:
            break
        length, crc = _BATCH.unpack_from(data, at)
        if length == 0:  # no batch is empty: the zeros ahead of the batches, or damage
            break
        body = data[at + head_size : at + head_size + length]
        if len(body) < length or zlib.crc32(body) != crc:
            break
        yield from _records(body)
        at += head_size + length
    if at < end and bytes(data[at:]).count(0) != end - at:  # not the zeros ahead
        log.warning(
            "opencluster: %s: the last %d bytes are a batch whose write never finished "
            "(never acknowledged), ignored", path, end - at,
        )  # fmt: skip


def set_payload(map_hash: int, key_hash: int, name: bytes, kind: int, value: int | bytes) -> bytes:
    """A set's payload as OpenCluster carries it, for a set that came without one."""
    head = _SET_HEAD.pack(map_hash, key_hash, 0, 0, len(name))
    if kind == _INT:
        return head + name + I32.pack(value)
    assert isinstance(value, bytes)
    return head + name + I32.pack(len(value)) + value


def _records(body: memoryview) -> Iterator[Record]:
    at, end = 0, len(body)
    unpack = RECORD.unpack_from
    size = RECORD.size
    while at < end:
        kind, expires, length = unpack(body, at)
        at += size
        payload = body[at : at + length]
        at += length
        if kind == FRAMES:
            yield from _frames(payload, expires)
            continue
        map_hash, key_hash, _, _, name_size = _SET_HEAD.unpack_from(payload, 0)
        name = bytes(payload[20 : 20 + name_size])
        if kind == _INT:
            value: int | bytes = I32.unpack_from(payload, 20 + name_size)[0]
        else:
            value = bytes(payload[24 + name_size :])
        yield map_hash, key_hash, kind, value, expires, name


def _frames(frames: memoryview, now: float) -> Iterator[Record]:
    """The sets of a FRAMES record read at ``now``, as the store applied them."""
    at, end = 0, len(frames)
    while at < end:
        command, _, _, size = _FRAME_HEAD.unpack_from(frames, at)
        at += 12
        payload = frames[at : at + size]
        at += size
        map_hash, key_hash, expires, _, name_size = _SET_HEAD.unpack_from(payload, 0)
        name = bytes(payload[20 : 20 + name_size])
        value: int | bytes
        if command == _SET_INT:
            kind, value = _INT, I32.unpack_from(payload, 20 + name_size)[0]
        else:
            kind, value = 2, bytes(payload[24 + name_size :])
        yield map_hash, key_hash, kind, value, now + expires if expires > 0 else 0.0, name


class JournalWriter:
    """Appends batches to the journal of generation :attr:`gen`, opened at its first
    batch. :meth:`write`, :meth:`discard` and :meth:`rotate` are called from one thread;
    :meth:`flush` of the file a write went to (:attr:`fd` after it) may run in another,
    while later batches are written. A file left (discard, rotate) is closed by
    ``closer``: a store whose flushes run in a thread closes it there, behind the
    flushes still to come on it, so that no flush finds its descriptor closed (or
    reused by another file)."""

    def __init__(
        self,
        database: Path,
        gen: int,
        *,
        sync: bool,
        closer: Callable[[int], None] | None = None,
    ) -> None:
        self.database = database
        self.gen = gen
        self.sync = sync
        self.written = 0  # bytes of the current file's batches (and its magic)
        self._zeroed = 0  # bytes of the current file, zeros after its batches ("full")
        self.closer = closer or close_quietly
        self._fd: int | None = None

    @property
    def fd(self) -> int | None:
        """The descriptor of the current file (None until its first batch)."""
        return self._fd

    def write(self, parts: list[bytes]) -> int:
        """Append one batch of records (``parts`` joined) to the file, not yet flushed;
        the bytes written. Raises OSError. After a failure the file may end in a torn
        batch, so the next batch goes to a new one."""
        body = b"".join(parts)
        head = _BATCH.pack(len(body), zlib.crc32(body))
        try:
            fd = self._fd if self._fd is not None else self._open()
            if self.sync:
                end = self.written + len(head) + len(body)
                if end > self._zeroed:
                    zeros = max(ZERO_AHEAD, end - self._zeroed)
                    _pwrite_all(fd, bytes(zeros), self._zeroed)
                    self._zeroed += zeros
                _pwrite_all(fd, head + body, self.written)
            else:
                _write_all(fd, head, body)
        except OSError:
            self.discard()
            raise
        size = len(head) + len(body)
        self.written += size
        return size

    def flush(self, fd: int | None = None) -> None:
        """What was written to ``fd`` (the current file by default), on the disk
        (fdatasync); raises OSError, and then the caller must :meth:`discard` that file
        (if still current) and fail every batch written to it: the kernel may have
        dropped its pages."""
        if fd is None:
            fd = self._fd
        if fd is not None:
            os.fdatasync(fd)

    def discard(self) -> None:
        """Go on in a new file: this one may end in a torn batch."""
        self._drop()

    def rotate(self) -> int:
        """Close the current journal; the generation closed (every journal up to it is
        complete). The next batch goes to the next generation."""
        closed = self.gen
        self._drop()
        return closed

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open(self) -> int:
        path = journal_path(self.database, self.gen)
        # Synced, batches are written at their offset, over zeros (ZERO_AHEAD).
        append = 0 if self.sync else os.O_APPEND
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | append | os.O_CLOEXEC, FILE_MODE)
        try:
            _write_all(fd, MAGIC, b"")
            if self.sync:
                os.fdatasync(fd)
                _sync_directory(path.parent)  # the file itself must survive a power cut
        except OSError:
            os.close(fd)
            raise
        self._fd = fd
        self.written = self._zeroed = len(MAGIC)
        return fd

    def _drop(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            self.closer(fd)
        self.gen += 1
        self.written = self._zeroed = 0


def close_quietly(fd: int) -> None:
    """Close a journal left behind: its batches were flushed or failed already."""
    with contextlib.suppress(OSError):
        os.close(fd)


def _write_all(fd: int, head: bytes, body: bytes) -> None:
    done = os.writev(fd, [head, body])
    if done < len(head) + len(body):  # a regular file writes short only when it fills up
        rest = memoryview(head + body)[done:]
        while rest:
            rest = rest[os.write(fd, rest) :]


def _pwrite_all(fd: int, data: bytes, at: int) -> None:
    view = memoryview(data)
    while view:  # a regular file writes short only when it fills up
        done = os.pwrite(fd, view, at)
        view, at = view[done:], at + done


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
