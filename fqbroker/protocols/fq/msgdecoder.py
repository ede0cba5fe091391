"""Message frames on a data channel, sans I/O (fq.h, fqd_dss.c, docs/fq-protocol.md §1.10).

After the data-channel hello a connection carries message frames, in publisher or peer
format (:mod:`fqbroker.core.frames` has their layout and the loops that read them).
:class:`MessageDecoder` reads them on the same terms as the command decoders of
:mod:`fqbroker.protocols.fq.wire`: it buffers only what it is fed, any split of the input
yields the same messages, and limits are checked on the length fields before the bytes
arrive. Large publisher frames are assembled in place (:mod:`.largeframe`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final, TypeVar

from fqbroker.core.frames import (
    MAX_MESSAGE_SIZE,
    MAX_RK_LEN,
    frame_length,
    publish_head,
    read_head,
    scan_messages,
    scan_runs,
    split_run,
    stamp,
)
from fqbroker.core.message import Message, Run, runs_of
from fqbroker.errors import ProtocolError
from fqbroker.protocols.decoding import Decoder, NeedData
from fqbroker.protocols.fq.largeframe import LARGE_FRAME, LargeFrame

__all__ = ["BIG_READ", "SIZED_FRAME", "SMALL_READ", "MessageDecoder"]

# With a reader that reads into our buffers (:meth:`MessageDecoder.room`): frames from
# this size on are read straight into their own memory. Each takes a read of its own
# then, which a smaller one need not (measured at 128 KiB: one read a message instead of
# one per two cost the broker more in the kernel than the copies it saved); a frame this
# large takes one anyway. The ordinary read between two of them is small, so that it
# brings the next one's head and little of its payload to copy.
SIZED_FRAME: Final = 256 << 10
SMALL_READ: Final = 1024  # also the spill of a frame read whole (LargeFrame)
BIG_READ: Final = 256 << 10  # uvloop's own read size

# The longest publisher frame head: two names of 127 bytes, their lengths, id and u32.
_HEAD_MAX = 2 + 2 * MAX_RK_LEN + 16 + 4

_Cache = TypeVar("_Cache", bound=dict[Any, Any])


def _bounded(cache: _Cache) -> _Cache:
    """``cache``, emptied first if it grew past 4096 names: a stream of new names stays cheap."""
    if len(cache) > 4096:
        cache.clear()
    return cache


class MessageDecoder(Decoder):
    """Message frames on a data channel (docs/fq-protocol.md §1.10).

    ``peer_format`` selects the frame with sender and hops. A payload over ``max_payload``
    is not buffered: its bytes are skipped as they arrive and ``oversized`` counts it. fqd
    truncates such payloads instead; we drop them, because a truncated message is a corrupt
    one, and count them as ``size_dropped``, the counter fq has for exactly this.

    A large publisher frame (``LARGE_FRAME`` bytes or more) is not grown in the receive
    buffer and copied out of it but assembled in place (:class:`LargeFrame`), from the
    next feed after :meth:`runs` has seen its head: by then the reader has reserved its
    size, which :attr:`in_flight` announces before the bytes arrive (docs/memory.md).
    """

    __slots__ = (
        "_after_id",
        "_error",
        "_heads",
        "_hops",
        "_large",
        "_large_done",
        "_large_stamp",
        "_names",
        "_pending",
        "_sender",
        "_sized",
        "_skipping",
        "max_payload",
        "octets",
        "oversized",
        "peer_format",
    )

    def __init__(self, *, peer_format: bool, max_payload: int = MAX_MESSAGE_SIZE) -> None:
        super().__init__()
        self.peer_format = peer_format
        self.max_payload = max_payload
        self.oversized = 0
        self.octets = 0
        self._skipping = 0
        self._names: dict[bytes, bytes] = {}
        self._heads: dict[bytes, tuple[bytes, bytes]] = {}
        self._error: ProtocolError | None = None
        # A large frame being assembled; once whole, until runs() returns it; the stamp
        # to assemble the next one with, set by runs() for the next feed.
        self._large: LargeFrame | None = None
        self._large_done: LargeFrame | None = None
        self._large_stamp: bytes | None = None
        # The last read, not yet copied into the buffer: runs() decodes it where it lies
        # and buffers only the partial frame it ends with. It follows what _buf holds.
        self._pending: bytes | None = None
        # Frames are coming that room() reads in place: ordinary reads are kept small.
        self._sized = False
        # The stamp runs() last spliced in, and the sender and hops it was made of.
        self._sender: bytes | None = None
        self._hops = self._after_id = b""

    def feed(self, data: bytes | bytearray) -> None:
        after_id = self._large_stamp
        if after_id is not None:
            # Only now: more bytes coming means the reader has granted the frame's size.
            self._large_stamp = None
            if (self._head_length() or 0) < LARGE_FRAME:
                self._hold(data)
                return
            buf = self._buf
            buf.feed(data)
            self._large = LargeFrame.start(buf.data, buf.pos, after_id, self.max_payload)
            if self._large is not None:
                buf.data = bytearray()
                buf.pos = 0
            return
        large = self._large
        if large is not None:
            rest = large.feed(data)
            if rest is None:
                return
            self._large, self._large_done = None, large
            if not rest:
                return
            data = rest
        self._hold(data)

    def _hold(self, data: bytes | bytearray) -> None:
        if self._pending is not None:
            self._buf.feed(self._pending)
            self._pending = None
        if type(data) is bytes and not self._skipping:
            self._pending = data  # immutable: safe to keep uncopied
        else:
            self._buf.feed(data)

    def _settle(self) -> None:
        """Into the buffer with the last read, for the careful paths that read only it."""
        if self._pending is not None:
            self._buf.feed(self._pending)
            self._pending = None

    @property
    def buffered(self) -> int:
        self._settle()
        return len(self._buf)

    def unconsumed(self) -> bytes:
        self._settle()
        return self._buf.rest()

    def room(self) -> memoryview | None:
        """Where a reader that can read into our memory should put its next bytes: the
        large frame being read, in place; None: an ordinary read of :attr:`read_size`
        bytes, given to :meth:`feed`.

        A frame of ``SIZED_FRAME`` bytes or more is started here rather than from the
        next feed, on the same terms: only once :meth:`runs` has seen its head, and the
        reader reserved what :attr:`in_flight` then announced.
        """
        large = self._large
        if large is None:
            after_id = self._large_stamp
            if after_id is None:
                return None
            self._settle()
            if (self._head_length() or 0) < SIZED_FRAME:
                return None
            buf = self._buf
            length = self._head_length() or 0
            spill = SMALL_READ if length < LARGE_FRAME else 0
            large = LargeFrame.start(
                buf.data, buf.pos, after_id, self.max_payload, SIZED_FRAME, spill
            )
            if large is None:
                return None
            self._large_stamp = None
            self._large = large
            self._sized = True
            buf.data = bytearray()
            buf.pos = 0
        return large.room()

    def filled_in(self, n: int) -> bool:
        """``n`` bytes were read into :meth:`room`; True: a message is whole (and what
        came after it is fed), so there is something to decode."""
        large = self._large
        assert large is not None
        if not large.filled_in(n):
            return False
        rest = large.finish()
        self._large, self._large_done = None, large
        if rest:
            self._hold(rest)
        return True

    @property
    def read_size(self) -> int:
        """How much an ordinary read should take (:meth:`room`)."""
        return SMALL_READ if self._sized else BIG_READ

    @property
    def in_flight(self) -> int:
        """Bytes held or announced: what is buffered, or the frame it starts if longer."""
        self._settle()
        if self._large is not None:
            return self._large.size
        extra = 0 if self._large_done is None else self._large_done.size
        buf = self._buf
        n = len(buf)
        if not n or self._skipping or (length := self._head_length()) is None:
            return n + extra
        return max(n, min(length, self.max_payload + 1024)) + extra

    @property
    def received(self) -> int:
        """Bytes taken in and still held, the large frame's too: it grows as a partial
        message arrives (how a reader tells one that stalled)."""
        pending = self._pending
        large = self._large
        return (
            len(self._buf)
            + (0 if pending is None else len(pending))
            + (0 if large is None else large.filled)
        )

    @property
    def ready(self) -> int:
        """Bytes buffered once the first frame is whole (what a decode now goes over);
        0 while it is partial."""
        self._settle()
        return len(self._buf) if self._first_is_whole() else 0

    def head_exchange(self) -> bytes | None:
        """The exchange of the publisher frame the buffer starts with, once its head is
        whole (before its payload is reserved for); None if there is none yet."""
        if self.peer_format or self._large is not None or self._skipping:
            return None
        self._settle()
        if self._head_length() is None:
            return None
        buf = self._buf
        return publish_head(buf.data, buf.pos)[0]

    def _head_length(self) -> int | None:
        """The length of the frame the buffer starts with; None while its head is partial."""
        buf = self._buf
        try:
            return frame_length(buf.data, buf.pos, peer=self.peer_format)
        except (IndexError, struct.error):
            return None

    def _first_is_whole(self) -> bool:
        length = self._head_length()
        return length is not None and length <= len(self._buf)

    def next_message(self) -> Message | None:
        self._settle()
        buf = self._buf
        if self._skipping:
            self._skipping -= buf.skip(self._skipping)
            if self._skipping:
                return None
        while True:
            start = buf.pos
            try:
                exchange, route, msgid, sender, hops, n = read_head(buf, self.peer_format)
                if n > self.max_payload:
                    self.oversized += 1
                    self._skipping = n - buf.skip(n)
                    if self._skipping:
                        return None
                    continue
                payload = buf.take(n)
            except NeedData:
                buf.pos = start
                return None
            return Message(exchange, route, payload, msgid, sender, hops)

    def messages(self) -> list[Message]:
        """Every whole message buffered so far, in one pass over the buffer.

        The decoder of peers' and clients' reads (a publisher's go through :meth:`runs`):
        local names for everything, one copy of the buffer, slices for the fields,
        exchange and route names shared between messages. Anything unusual (a limit
        broken, a payload over ``max_payload``, a skip in progress) is left to
        :meth:`next_message`, which raises or skips exactly as it always does.
        ``octets`` counts the frame bytes of the messages returned.
        """
        self._raise_pending()
        self._settle()
        out: list[Message] = []
        self._decode_fast(
            lambda data: scan_messages(
                data, out, Message, self.peer_format, _bounded(self._names), self.max_payload
            )
        )
        try:
            while (msg := self.next_message()) is not None:
                self.octets += msg.peer_octets if self.peer_format else msg.publish_octets
                out.append(msg)
        except ProtocolError as exc:
            if not out:
                raise
            # The messages before a bad frame are delivered; the error comes next call.
            self._error = exc
        return out

    def runs(self, sender: bytes, hops: bytes) -> list[Run]:
        """Every whole publisher-format message buffered so far, as stamped peer frames.

        The data path's decoder. Frames come grouped in runs of consecutive messages on one
        exchange and route, so the router looks a route up once per run; each frame is the
        peer frame consumers receive (docs/fq-protocol.md §1.10), with ``sender`` and
        ``hops`` (the broker's stamp, docs/fq-protocol.md §1.11) spliced in, so no
        per-message object is built. Anything unusual is left to :meth:`next_message`, as in
        :meth:`messages`.
        """
        if self.peer_format:
            raise TypeError("runs() decodes publisher-format frames")
        self._raise_pending()
        out: list[Run] = []
        if self._large_done is not None:
            done, self._large_done = self._large_done, None
            out.append(done.run)
            self.octets += done.length
        large_runs = len(out)
        after_id = self._after_id
        if sender is not self._sender or hops is not self._hops:
            # A channel stamps every read alike: built once, not a cache lookup a read.
            after_id = self._after_id = stamp(sender, hops)
            self._sender, self._hops = sender, hops
        pending = self._pending
        if pending is not None:
            self._pending = None
            self._scan_read(pending, out, after_id)
        else:
            self._decode_fast(
                lambda data: scan_runs(data, out, after_id, _bounded(self._heads), self.max_payload)
            )
        slow: list[Message] = []
        try:
            # (an empty buffer holds no message: NeedData raised and caught costs more)
            while len(self._buf) and (msg := self.next_message()) is not None:
                msg.stamp(sender, hops)
                self.octets += msg.publish_octets
                slow.append(msg)
        except ProtocolError as exc:
            if not out and not slow:
                raise
            self._error = exc
        if self._sized and (slow or len(out) > large_runs):
            self._sized = False  # smaller frames again: ordinary reads take them in bulk
        if (
            self._error is None
            and not self._skipping
            and self._large is None
            and len(self._buf)
            and self._head_length() is not None
        ):
            # The head is whole, so in_flight now announces the frame's true size, which the
            # reader reserves before it feeds more: only then may the frame be assembled. A
            # head still in pieces would be assembled at whatever size it turns out to say.
            self._large_stamp = after_id
        return out + runs_of(slow) if slow else out

    def _scan_read(self, data: bytes, out: list[Run], after_id: bytes) -> None:
        """Decode a read where it lies: the frame the buffer holds the start of, completed
        from its first bytes, then the rest of it; only a partial frame at its end (or an
        unusual one, left to next_message) is copied into the buffer."""
        buf = self._buf
        names = _bounded(self._heads)
        max_payload = self.max_payload
        start = 0
        if len(buf):
            need = self._needs(data)
            if need is None or not self._first_run(data, need, out, after_id, names):
                # A frame longer than this read, or one for the careful path: as before.
                buf.feed(data)
                self._decode_fast(lambda rest: scan_runs(rest, out, after_id, names, max_payload))
                return
            start = need
            buf.pos = len(buf.data)
        runs = len(out)
        end = scan_runs(data, out, after_id, names, max_payload, start)
        self.octets += end - start
        if runs and len(out) > runs:
            last, following = out[runs - 1], out[runs]
            if last[0] is following[0] and last[1] is following[1]:
                last[2].extend(following[2])  # one run, as when it came in one read
                del out[runs]
        if end < len(data):
            with memoryview(data) as rest:
                buf.feed(rest[end:])

    def _first_run(
        self,
        data: bytes,
        need: int,
        out: list[Run],
        after_id: bytes,
        names: dict[bytes, tuple[bytes, bytes]],
    ) -> bool:
        """Append the run of the frame the buffer starts with and ``data[:need]`` ends;
        False if it is one for the careful path."""
        buf = self._buf
        length = len(buf) + need
        run = split_run(buf.data, buf.pos, data, need, after_id, names, self.max_payload)
        if run is not None:
            out.append(run)
        else:  # its head in pieces too, or not ordinary
            with memoryview(buf.data) as held, memoryview(data) as rest:
                first = b"".join((held[buf.pos :], rest[:need]))
            if scan_runs(first, out, after_id, names, self.max_payload) < length:
                return False
        self.octets += length
        return True

    def _needs(self, data: bytes) -> int | None:
        """How many bytes of ``data`` complete the frame the buffer starts with; None if
        it does not complete it."""
        buf = self._buf
        held, pos = buf.data, buf.pos
        try:
            length = frame_length(held, pos, peer=False)
        except (IndexError, struct.error):
            try:  # its head is in pieces too, and at most _HEAD_MAX long
                length = frame_length(bytes(held[pos:]) + data[:_HEAD_MAX], peer=False)
            except (IndexError, struct.error):
                return None
        need = length - (len(held) - pos)
        return need if 0 < need <= len(data) else None

    def _raise_pending(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _decode_fast(self, fast: Callable[[bytes], int]) -> None:
        """Run ``fast`` over a copy of the buffer; it returns how many bytes it decoded."""
        buf = self._buf
        # Never copy a buffer holding only part of a (big) message.
        if self._skipping or not len(buf) or not self._first_is_whole():
            return
        pos = fast(bytes(memoryview(buf.data)[buf.pos :]))
        buf.pos += pos
        self.octets += pos

    @property
    def error_pending(self) -> bool:
        """A bad frame follows the messages last returned: the next call raises."""
        return self._error is not None
