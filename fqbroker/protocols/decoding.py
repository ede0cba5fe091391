"""The incremental-reading base of every front end's sans-IO decoders.

A decoder only buffers what it is fed (``feed``) and decodes whole frames out of its
:class:`ReceiveBuffer`. A decode step reads fields with the buffer's cursor; when the
bytes run out the buffer raises :class:`NeedData` and the step rolls back to where it
started (``buf.pos = start``), so any split of the input yields the same frames and a
partial frame consumes nothing. What a front end's decoders add is the frame layout:
:mod:`fqbroker.protocols.fq.wire` (command channel and data hello) and
:mod:`fqbroker.protocols.fq.msgdecoder` (message frames) for fq.
"""

from __future__ import annotations

import struct

__all__ = ["CompactingBuffer", "Decoder", "NeedData", "ReceiveBuffer"]

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


class NeedData(Exception):
    """Raised inside a decode step when the buffer runs out; the step is rolled back."""


class ReceiveBuffer:
    """A receive buffer read with a cursor; a failed step rolls back to its start."""

    __slots__ = ("data", "pos")

    def __init__(self) -> None:
        self.data = bytearray()
        self.pos = 0

    def feed(self, chunk: bytes | bytearray | memoryview) -> None:
        # Any buffer: a caller may hand over a view of its own read. (Spelled out, not
        # a cast at the call: compiled with mypyc, an argument must be what it says.)
        if self.pos:
            # Compact only when there is something to drop: the buffer stays small, and a
            # byte-at-a-time feed does not copy the whole tail each time.
            if self.pos >= len(self.data):
                self.data.clear()
            else:
                del self.data[: self.pos]
            self.pos = 0
        self.data += chunk

    def __len__(self) -> int:
        return len(self.data) - self.pos

    def u8(self) -> int:
        if self.pos >= len(self.data):
            raise NeedData
        value = self.data[self.pos]
        self.pos += 1
        return value

    def u16(self) -> int:
        if self.pos + 2 > len(self.data):
            raise NeedData
        value: int = _U16.unpack_from(self.data, self.pos)[0]
        self.pos += 2
        return value

    def u32(self) -> int:
        if self.pos + 4 > len(self.data):
            raise NeedData
        value: int = _U32.unpack_from(self.data, self.pos)[0]
        self.pos += 4
        return value

    def u64(self) -> int:
        if self.pos + 8 > len(self.data):
            raise NeedData
        value: int = _U64.unpack_from(self.data, self.pos)[0]
        self.pos += 8
        return value

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise NeedData
        value = bytes(self.data[self.pos : end])
        self.pos = end
        return value

    def skip(self, n: int) -> int:
        """Drop up to ``n`` buffered bytes; returns how many were dropped."""
        n = min(n, len(self.data) - self.pos)
        self.pos += n
        return n

    def release_if_read(self) -> None:
        """Drop the buffer once all of it is read: an idle session then holds none."""
        if self.pos and self.pos >= len(self.data):
            self.data = bytearray()
            self.pos = 0

    def rest(self) -> bytes:
        value = bytes(self.data[self.pos :])
        self.pos = len(self.data)
        return value


class Decoder:
    __slots__ = ("_buf", "_eof")

    def __init__(self) -> None:
        self._buf = ReceiveBuffer()
        self._eof = False

    def feed(self, data: bytes) -> None:
        self._buf.feed(data)

    def feed_eof(self) -> None:
        self._eof = True

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def unconsumed(self) -> bytes:
        """Bytes fed but not yet decoded (for handing a connection to another protocol)."""
        return self._buf.rest()


class CompactingBuffer:
    """The buffer of a length-prefixed frame decoder that walks it with an offset
    (Figg's, OpenCluster's): ``_pos`` bytes of ``_buf`` are decoded, and they are dropped
    once per :meth:`receive_data`, before the append, so the buffer holds one partial
    frame at most and decoding copies nothing per frame. A subclass sets ``_error`` to its
    protocol error, after which input is ignored."""

    __slots__ = ("_buf", "_error", "_pos")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0
        self._error: Exception | None = None

    @property
    def buffered(self) -> int:
        """Bytes received and not yet decoded."""
        return len(self._buf) - self._pos

    def receive_data(self, data: bytes) -> None:
        if self._error is not None:
            return
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data
