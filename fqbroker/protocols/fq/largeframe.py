"""A large publisher frame, assembled in place as its bytes arrive (sans I/O).

The receive buffer of :class:`~fqbroker.protocols.fq.msgdecoder.MessageDecoder` suits
small frames; for a message of many megabytes it would cost the message's size three
times. A large frame instead gets one buffer of the exact size of the stamped peer frame
consumers receive, its bytes are written into it as they arrive, and the buffer becomes
the frame without a copy (:class:`LargeFrame` says how). docs/memory.md, "How a large
message is read and written", says what that bounds.
"""

from __future__ import annotations

import io
import struct
from typing import Final

from fqbroker.core.frames import frame_length, publish_head
from fqbroker.core.message import Run

__all__ = ["LARGE_FRAME", "LargeFrame"]

LARGE_FRAME: Final = 1 << 20  # frames from this size on are assembled in place
# Buffers of frames read whole, kept for the next: a few, and none larger than this.
_KEEP: Final = 2
_KEEP_SIZE: Final = LARGE_FRAME
_kept: list[bytearray] = []


class LargeFrame:
    """One publisher-format frame being assembled into its stamped peer frame.

    The buffer has the broker's sender and hops stamp in place, and becomes the frame
    without a copy (``BytesIO.getvalue`` hands over its own ``bytes`` when it is exactly
    full and no view of it is left). A reader that can read into a buffer of ours
    (asyncio's ``BufferedProtocol``) is given :meth:`room`, the frame's own memory, so the
    kernel writes the payload where it stays. The buffer becomes the frame only once the
    event loop holds no view of it (uvloop lets go of a buffer after ``buffer_updated``
    returns), so a frame from ``LARGE_FRAME`` on is read into all but its last byte, which
    comes with the next ordinary read: no copy of a large message, for a read more. A
    smaller one (``spill`` > 0) is read whole, with a little room after it for the next
    frame's head (one read a message), into a warm buffer kept for the next one, and
    copied out once: a fresh ``BytesIO`` would cost a pass of zeroes and cold memory for
    the copy it saves.
    """

    __slots__ = ("_buffer", "_store", "_view", "filled", "left", "length", "run", "size", "spill")

    def __init__(
        self,
        buffer: io.BytesIO | None,
        store: bytearray | None,
        filled: int,
        left: int,
        length: int,
        size: int,
        run: Run,
        spill: int,
    ) -> None:
        # The frame's memory: a BytesIO that becomes it, or a kept buffer it is copied
        # out of (``spill`` > 0). Everything goes in through the writable view (a BytesIO
        # with a view taken refuses write()).
        self._buffer = buffer
        self._store = store
        view = buffer.getbuffer() if buffer is not None else None
        if store is not None:
            view = memoryview(store)
        self._view: memoryview | None = view
        self.spill = spill  # room past the frame for what follows it (room() reads only)
        self.filled = filled  # bytes of the frame in place
        self.left = left  # bytes still to come
        self.length = length  # the publisher frame's length, as the decoder counts octets
        self.size = size  # the stamped frame's length: what it holds once whole
        self.run = run  # its run; the frame is appended once whole

    @classmethod
    def start(
        cls,
        data: bytearray,
        pos: int,
        stamp: bytes,
        max_payload: int,
        least: int = LARGE_FRAME,
        spill: int = 0,
    ) -> LargeFrame | None:
        """The frame that starts at ``data[pos:]``, if it is at least ``least`` bytes
        long and not all there yet, and its payload within ``max_payload`` (a larger one
        is the decoder's to skip). With ``spill``, read into :meth:`room` whole."""
        try:
            length = frame_length(data, pos, peer=False)
        except (IndexError, struct.error):
            return None  # its head has not all arrived
        have = len(data) - pos
        if length < least or length <= have:
            return None
        exchange, route, after_id, payload = publish_head(data, pos)
        if payload > max_payload:
            return None
        size = length + len(stamp)
        run: Run = (exchange, route, [], after_id - pos + len(stamp) + 4)
        filled = have + len(stamp)
        head = after_id - pos
        if spill:
            store = _kept.pop() if _kept else None
            if store is None or len(store) < size + spill:
                store = bytearray(size + spill)
            with memoryview(store) as into, memoryview(data) as view:
                into[:head] = view[pos:after_id]
                into[head : head + len(stamp)] = stamp
                into[head + len(stamp) : filled] = view[after_id:]
            return cls(None, store, filled, length - have, length, size, run, spill)
        buffer = io.BytesIO()
        buffer.seek(size - 1)
        buffer.write(b"\0")  # sized once: the frame never moves as it grows
        buffer.seek(0)
        with memoryview(data) as view:
            buffer.write(view[pos:after_id])
            buffer.write(stamp)
            buffer.write(view[after_id:])
        return cls(buffer, None, filled, length - have, length, size, run, 0)

    def room(self) -> memoryview | None:
        """Where the next bytes of the frame go: the rest of it and ``spill`` bytes more,
        or without a spill all but its last byte; None once only that is left (it comes
        with an ordinary read, through :meth:`feed`)."""
        view = self._view
        end = self.size + self.spill if self.spill else self.size - 1
        if view is None or self.filled >= end:
            return None
        return view[self.filled : end]

    def filled_in(self, n: int) -> bool:
        """``n`` bytes were read into :meth:`room`; True: the frame is whole, and
        :meth:`finish` makes it the run's."""
        self.filled += n
        self.left -= n
        return self.left <= 0

    def finish(self) -> bytes:
        """The frame is the run's; returns the bytes read past it, into the spill."""
        view = self._view
        assert view is not None
        size = self.size
        rest = bytes(view[size : self.filled])
        self._view = None
        store = self._store
        if store is not None:
            frame = bytes(view[:size])
            view.release()
            self._store = None
            # (The reader may still hold a view of it: it only reads into it again once
            # it is given it again, for another frame.)
            if len(_kept) < _KEEP and len(store) <= _KEEP_SIZE:
                _kept.append(store)
        else:
            view.release()
            buffer = self._buffer
            assert buffer is not None
            try:
                buffer.truncate(size)  # refused while a view of it is still held
                frame = buffer.getvalue()  # then its own bytes, no copy
            except BufferError:
                with buffer.getbuffer() as whole:
                    frame = bytes(whole[:size])
        self.run[2].append(frame)
        return rest

    def feed(self, data: bytes | bytearray) -> bytes | bytearray | None:
        """Take what belongs to the frame: None while it needs more, else what follows it
        (the frame is then the run's, whole)."""
        view = self._view
        assert view is not None
        left, filled = self.left, self.filled
        if len(data) < left:
            end = filled + len(data)
            view[filled:end] = data
            self.filled = end
            self.left = left - len(data)
            return None
        with memoryview(data) as part:
            view[filled : filled + left] = part[:left]
        self.filled += left
        self.left = 0
        self.finish()  # nothing past it: that is what is returned
        return data[left:]
