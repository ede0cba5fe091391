"""A large publisher frame, assembled in place as its bytes arrive (sans I/O).

The receive buffer of :class:`~fqbroker.frontends.fq.msgdecoder.MessageDecoder` suits
small frames: it grows with each read and whole frames are copied out of it. For a message
of many megabytes that costs its size three times (the buffer, a copy of it, the stamped
frame). A large frame instead gets one buffer of the exact size of the peer frame
consumers receive, with the broker's sender and hops stamp in place; the bytes are written
into it as they arrive, and the buffer becomes the frame without a copy
(``BytesIO.getvalue`` hands over its own ``bytes`` when it is exactly full).
docs/memory.md says what that bounds.
"""

from __future__ import annotations

import io
import struct
from typing import Final

from fqbroker.core.frames import frame_length, publish_head
from fqbroker.core.message import Run

__all__ = ["LARGE_FRAME", "LargeFrame"]

LARGE_FRAME: Final = 1 << 20  # frames from this size on are assembled in place


class LargeFrame:
    """One publisher-format frame being assembled into its stamped peer frame."""

    __slots__ = ("_buffer", "left", "length", "run", "size")

    def __init__(self, buffer: io.BytesIO, left: int, length: int, size: int, run: Run) -> None:
        self._buffer = buffer
        self.left = left  # bytes still to come
        self.length = length  # the publisher frame's length, as the decoder counts octets
        self.size = size  # the stamped frame's length: what it holds once whole
        self.run = run  # its run; the frame is appended once whole

    @classmethod
    def start(cls, data: bytearray, pos: int, stamp: bytes, max_payload: int) -> LargeFrame | None:
        """The frame that starts at ``data[pos:]``, if it is large and not all there yet,
        and its payload within ``max_payload`` (a larger one is the decoder's to skip)."""
        try:
            length = frame_length(data, pos, peer=False)
        except (IndexError, struct.error):
            return None  # its head has not all arrived
        have = len(data) - pos
        if length < LARGE_FRAME or length <= have:
            return None
        exchange, route, after_id, payload = publish_head(data, pos)
        if payload > max_payload:
            return None
        size = length + len(stamp)
        buffer = io.BytesIO()
        buffer.seek(size - 1)
        buffer.write(b"\0")  # sized once: the frame never moves as it grows
        buffer.seek(0)
        with memoryview(data) as view:
            buffer.write(view[pos:after_id])
            buffer.write(stamp)
            buffer.write(view[after_id:])
        run: Run = (exchange, route, [], after_id - pos + len(stamp) + 4)
        return cls(buffer, length - have, length, size, run)

    def feed(self, data: bytes | bytearray) -> bytes | bytearray | None:
        """Take what belongs to the frame: None while it needs more, else what follows it
        (the frame is then the run's, whole)."""
        left = self.left
        if len(data) < left:
            self._buffer.write(data)
            self.left = left - len(data)
            return None
        with memoryview(data) as view:
            self._buffer.write(view[:left])
        self.left = 0
        self.run[2].append(self._buffer.getvalue())  # the buffer's own bytes: no copy
        return data[left:]
