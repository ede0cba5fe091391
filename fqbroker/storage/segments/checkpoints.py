"""The checkpoints file of a segment log: named reader positions in a header block and
three slots, so that an update is one ``pwrite`` and a crash mid-write falls back to the
state before it (docs/disk-format.md, "Checkpoints").
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from fqbroker.storage.segments.records import (
    CRC,
    HEADER,
    HEADER_SIZE,
    LENSEQ,
    fsync_path,
    write_all,
    write_file,
)

__all__ = ["CheckpointFile", "Unreadable", "encode_points"]

BLOCK = 4096  # slots start on block boundaries: writing one never rewrites another's sector
_SLOTS = 3
_CKPT_MAGIC = b"fqckpts\n"
_CKPT_HEADER = struct.Struct(">8sII")  # magic, slot size, crc32 of the 12 bytes before it
_ENTRY = struct.Struct(">QH")  # seq, name length; then the UTF-8 name
_SEQ = struct.Struct(">Q")
_MAX_NAME = 0xFFFF
_fdatasync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync


class Unreadable(Exception):
    """A checkpoints file with no usable state in it."""


def encode_points(points: Mapping[str, int]) -> tuple[bytearray, dict[str, int]]:
    """A slot image of ``points`` (its header left blank) and where each name's seq is."""
    image = bytearray(HEADER_SIZE)
    offsets: dict[str, int] = {}
    for name, seq in points.items():
        # surrogatepass: any str round-trips, as it did through checkpoints.json.
        raw = name.encode("utf-8", "surrogatepass")
        if len(raw) > _MAX_NAME:
            raise ValueError(f"checkpoint name of {len(raw)} bytes is over {_MAX_NAME}")
        offsets[name] = len(image)
        image += _ENTRY.pack(seq, len(raw))
        image += raw
    return image, offsets


def _decode_points(data: bytes) -> dict[str, int]:
    points: dict[str, int] = {}
    off = 0
    while off < len(data):
        if off + _ENTRY.size > len(data):
            raise ValueError("entry runs past the slot")
        seq, n = _ENTRY.unpack_from(data, off)
        off += _ENTRY.size + n
        if off > len(data):
            raise ValueError("name runs past the slot")
        name = data[off - n : off].decode("utf-8", "surrogatepass")
        if name in points:
            raise ValueError(f"name {name!r} twice")
        points[name] = seq
    return points


def _seal(image: bytearray, generation: int) -> None:
    """Fill in a slot image's header: the same crc, length, seq layout as a record's."""
    LENSEQ.pack_into(image, 4, len(image) - HEADER_SIZE, generation)
    # A copy costs less than a memoryview for the few bytes of the usual state.
    rest = image[4:] if len(image) < BLOCK else memoryview(image)[4:]
    CRC.pack_into(image, 0, zlib.crc32(rest))


def _install(path: Path, image: bytearray, generation: int) -> tuple[int, int]:
    """Put a new checkpoints file holding ``image`` in slot 0 in place of ``path``, by an
    fsynced file and a rename; return (its descriptor, slot size). The caller fsyncs the
    directory, and keeps the descriptor even if that fails: the rename is done."""
    slot_size = max(BLOCK, -(-2 * len(image) // BLOCK) * BLOCK)  # room to grow
    _seal(image, generation)
    # Every byte is written, not left a hole, so overwriting a slot never allocates a block:
    # no ENOSPC on a full disk (on file systems that overwrite in place).
    data = bytearray(BLOCK + _SLOTS * slot_size)
    head = _CKPT_HEADER.pack(_CKPT_MAGIC, slot_size, 0)
    _CKPT_HEADER.pack_into(data, 0, _CKPT_MAGIC, slot_size, zlib.crc32(head[:12]))
    data[BLOCK : BLOCK + len(image)] = image
    tmp = path.with_name(path.name + ".tmp")
    fd = -1
    try:
        write_file(tmp, data, fsync=True)
        fd = os.open(tmp, os.O_RDWR)  # before the rename, so nothing can fail after it
        os.replace(tmp, path)
    except OSError:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)  # a full disk, say: keep the space for the queue
        raise
    return fd, slot_size


class CheckpointFile:
    """Named reader positions in a header block and three slots (docs/disk-format.md).

    Every update writes the whole state, with the next generation, into one slot with one
    ``pwrite``; opening takes the valid slot with the highest generation. The slot written
    is never ``_latest`` (the newest state: a process killed mid-write loses nothing it
    completed) nor ``_safe`` (the newest fsynced state: after a power cut the state is that
    one or newer). A durable update fsyncs and becomes ``_safe``. The encoded state is kept
    in ``_image`` so that moving an existing name's position packs 8 bytes into it.
    """

    def __init__(
        self,
        path: Path,
        fd: int,
        slot_size: int,
        points: dict[str, int],
        generation: int,
        slot: int,
    ) -> None:
        self.path = path
        self.points = points
        self.view: Mapping[str, int] = MappingProxyType(points)
        self._fd = fd
        self._slot_size = slot_size
        self._generation = generation
        self._latest = self._safe = slot
        self._image, self._offsets = encode_points(points)
        self.repaired = ""  # what opening it had to put right, for the log's report

    @classmethod
    def create(cls, path: Path, points: Mapping[str, int]) -> CheckpointFile:
        """A new file holding ``points``, durably."""
        image, _ = encode_points(points)
        fd, slot_size = _install(path, image, 1)
        try:
            fsync_path(path.parent)
        except OSError:
            os.close(fd)
            raise
        return cls(path, fd, slot_size, dict(points), 1, 0)

    @classmethod
    def open(cls, path: Path) -> CheckpointFile:
        """Raises FileNotFoundError, or Unreadable if no slot holds a valid state."""
        fd = os.open(path, os.O_RDWR)
        try:
            # A killed process may have left its last update only in the page cache: make
            # it durable, so the slot found is the safe one too.
            os.fsync(fd)
            size = os.fstat(fd).st_size
            head = os.pread(fd, _CKPT_HEADER.size, 0)
            if len(head) < _CKPT_HEADER.size:
                raise Unreadable(f"file of {size} bytes")
            magic, slot_size, crc = _CKPT_HEADER.unpack(head)
            repaired = ""
            if magic != _CKPT_MAGIC or crc != zlib.crc32(head[:12]):
                # The file's size says the slot size (it never changes in place): the
                # slots may well be intact, and they are what counts.
                slot_size, rest = divmod(size - BLOCK, _SLOTS)
                if size <= BLOCK or rest or slot_size % BLOCK:
                    raise Unreadable("bad header")
                repaired = "checkpoints header damaged; rebuilt from the file size"
            if slot_size < BLOCK or slot_size % BLOCK or size < BLOCK + _SLOTS * slot_size:
                raise Unreadable(f"slot size {slot_size} in a file of {size} bytes")
            best: tuple[int, int, dict[str, int]] | None = None
            for slot in range(_SLOTS):
                data = os.pread(fd, slot_size, BLOCK + slot * slot_size)
                crc, n, generation = HEADER.unpack_from(data)
                end = HEADER_SIZE + n
                if end > slot_size or zlib.crc32(memoryview(data)[4:end]) != crc:
                    continue  # never written, or torn by a crash mid-write
                try:
                    points = _decode_points(data[HEADER_SIZE:end])
                except ValueError:
                    continue
                if best is None or generation > best[0]:
                    best = (generation, slot, points)
            if best is None:
                raise Unreadable("bad header" if repaired else "no valid slot")
            if repaired:
                head = _CKPT_HEADER.pack(_CKPT_MAGIC, slot_size, 0)
                crc = zlib.crc32(head[:12])
                write_all(fd, _CKPT_HEADER.pack(_CKPT_MAGIC, slot_size, crc), 0)
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        generation, slot, points = best
        ckpt = cls(path, fd, slot_size, points, generation, slot)
        ckpt.repaired = repaired
        return ckpt

    def set(self, name: str, seq: int, *, durable: bool) -> None:
        off = self._offsets.get(name)
        if off is None:
            self.replace({**self.points, name: seq}, durable=durable)
            return
        old = self.points[name]
        _SEQ.pack_into(self._image, off, seq)
        try:
            self._write()
        except OSError:
            _SEQ.pack_into(self._image, off, old)
            raise
        self.points[name] = seq
        if durable:
            self._sync()

    def replace(self, points: Mapping[str, int], *, durable: bool) -> None:
        """Make ``points`` the whole state. Raising after the write (a failed fsync) keeps
        the new state: it is in the page cache, as safe as a non-durable update."""
        new = dict(points)
        image, offsets = encode_points(new)
        grow = len(image) > self._slot_size
        old, self._image = self._image, image
        try:
            if grow:
                self._grow()
            else:
                self._write()
        except OSError:
            self._image = old
            raise
        self._offsets = offsets
        self.points.clear()
        self.points.update(new)
        if grow:
            fsync_path(self.path.parent)  # the rename
        elif durable:
            self._sync()

    def _write(self) -> None:
        generation = self._generation + 1
        _seal(self._image, generation)
        if self._latest == self._safe:
            slot = (self._latest + 1) % _SLOTS
        else:
            slot = _SLOTS - self._latest - self._safe  # the third one
        off = BLOCK + slot * self._slot_size
        n = os.pwrite(self._fd, self._image, off)
        if n < len(self._image):
            write_all(self._fd, self._image[n:], off + n)
        self._generation, self._latest = generation, slot

    def _sync(self) -> None:
        _fdatasync(self._fd)  # the file's size never changes in place: no metadata to sync
        self._safe = self._latest

    def _grow(self) -> None:
        """Replace the file by one with bigger slots. Always durable (but for the directory,
        left to the caller): a rename is only safe after an fsync of what it renames."""
        fd, slot_size = _install(self.path, self._image, self._generation + 1)
        os.close(self._fd)
        self._fd, self._slot_size = fd, slot_size
        self._generation += 1
        self._latest = self._safe = 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
