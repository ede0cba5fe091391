"""A memory queue's store: frames packed into chunks (fqd_queue_mem.c).

A queue (:mod:`fqbroker.core.queue`) holds each message as the peer frame its consumers
receive. Here, in memory, small frames are packed: a batch into one chunk, which
consumers write as they are; :class:`MemoryStore` says how, and what it holds beyond the
bytes it counts. Compiled by the accelerator (docs/accel.md): the walk over a chunk's
frames is a loop on ``bytes``.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import operator
from typing import cast

from fqbroker.core.budget import MemoryBudget
from fqbroker.core.frames import ID_SIZE

__all__ = ["OPEN_BYTES", "PACK_BELOW", "TAKE_BYTES", "Buffer", "MemoryStore", "split_frames"]

# What a store hands out: whole frames, one or many to a buffer.
Buffer = bytes | bytearray

TAKE_BYTES = 1 << 20
# Frames this large (on average in a batch) are held as they are: their object's header is
# little beside them, and they go out scattered, not copied.
PACK_BELOW = 1024
# A small chunk takes later small batches (a message a read) while under this size; a
# batch this large makes a chunk of its own, of its exact size.
OPEN_BYTES = 16 << 10


def _walk(data: bytes, pos: int, n: int, limit: int) -> tuple[int, int]:
    """(end, count) of the first ``n`` frames from ``pos``, or fewer: up to and with the
    one that reaches ``limit`` bytes. Read from their length fields as
    :func:`~fqbroker.core.frames.frame_length` does, inline on ``bytes``: compiled, far
    cheaper than a call on a ``bytearray`` (bench/RESULTS.md, figures behind comments)."""
    end = pos
    k = 0
    while k < n:
        at = end + 1 + data[end]  # route length
        at += 1 + ID_SIZE + data[at]  # sender length
        at += 1 + data[at]  # hop count
        at += 1 + 4 * data[at]  # payload length
        end = at + 4 + (data[at] << 24 | data[at + 1] << 16 | data[at + 2] << 8 | data[at + 3])
        k += 1
        if end - pos >= limit:
            break
    return end, k


def split_frames(buffers: list[Buffer]) -> list[bytes]:
    """The frames of what :meth:`Store.take_out` handed out, one ``bytes`` each."""
    frames: list[bytes] = []
    for buf in buffers:
        data = buf if isinstance(buf, bytes) else bytes(buf)
        pos = 0
        while pos < len(data):
            end = _walk(data, pos, 1, 1)[0]
            frames.append(data if end - pos == len(data) else data[pos:end])
            pos = end
    return frames


# The frames last packed, and their chunk: a batch routed to several queues is offered to
# each in turn, and is held once (chunks of bytes are never changed). Matched by the
# frames' identity, on a copy of the list: whatever the caller does with its own, a chunk
# is only ever the frames it is given, and equal batches from other reads (a publisher
# sending the same message again and again) are not held as one.
_last_frames: list[bytes] = []
_last_chunk = b""


def _shared(frames: list[bytes]) -> bytes | None:
    """The chunk of these very frames, if they were the last packed."""
    if len(frames) == len(_last_frames) and all(map(operator.is_, frames, _last_frames)):
        return _last_chunk
    return None


def _remember(frames: list[bytes], chunk: bytes) -> bytes:
    global _last_frames, _last_chunk
    _last_frames = frames[:]
    _last_chunk = chunk
    return chunk


class _Chunk:
    """Small frames packed: ``count`` of them from ``pos`` on in ``data``. A ``bytearray``
    while small batches are appended to it, ``bytes`` once it is read for lengths."""

    __slots__ = ("count", "data", "pos")

    def __init__(self, data: Buffer, count: int) -> None:
        self.data = data
        self.count = count
        self.pos = 0  # where what is left starts: only the first chunk is taken in part

    def rest(self) -> Buffer:
        return self.data[self.pos :] if self.pos else self.data


_Item = bytes | _Chunk


class MemoryStore:
    """An in-memory FIFO; its contents die with the process.

    Small frames are packed: each batch given to :meth:`extend` is copied into one chunk
    (held once for all the queues a batch is routed to), so a held message costs its
    bytes and little else, where a ``bytes`` object each costs
    about 50 more (header, allocator rounding, a pointer). Small batches (a message a
    read) are appended to a small ``bytearray`` chunk. A consumer takes whole chunks and
    writes them as they are: the copy made here is the one the consumer's write used to
    make joining its batch. Where frames start is not kept: a chunk taken in part (a
    batch's or a share's limit inside it) is read for its frames' lengths then. Large
    frames are held as they are, one ``bytes`` each, as a message into an empty queue.

    Only the first chunk is ever taken in part: the taken part goes out as a copy, and
    what is left is copied out of the chunk once the taken front is larger than it. So
    the memory a queue holds beyond its ``held_bytes`` is at most what the first chunk
    still holds again (``<=`` held bytes: a 1 MiB batch's chunk one 100-byte message is
    left of is cut to that message), plus the growth slack of the small chunks grown
    by appending (an eighth of their ``OPEN_BYTES`` at most).
    """

    __slots__ = ("_budget", "_chunks", "_items", "_n", "held_bytes")

    def __init__(self, budget: MemoryBudget | None = None) -> None:
        # Made on first use: an empty deque is 600 bytes, in every idle client's queue.
        self._items: collections.deque[_Item] | None = None
        self._n = 0
        self._chunks = 0  # how many items are chunks: none, and items are frames
        self.held_bytes = 0
        self._budget = budget

    def __len__(self) -> int:
        return self._n

    def extend(self, frames: list[bytes], size: int = -1) -> None:
        n = len(frames)
        if not n:
            return
        if size < 0:
            size = sum(map(len, frames))
        items = self._items
        if items is None:
            items = self._items = collections.deque()
        if size >= PACK_BELOW * n or (n == 1 and not items):
            # Large frames, or one into an empty queue (taken at once, most likely): held
            # as they are, no copy.
            items.extend(frames)
        else:
            self._pack(items, frames, n, size)
        self._n += n
        self.held_bytes += size
        if self._budget is not None:
            self._budget.used += size

    def _pack(
        self, items: collections.deque[_Item], frames: list[bytes], n: int, size: int
    ) -> None:
        shared = _shared(frames)
        if shared is not None:
            # Packed a moment ago for another queue it is routed to: held once for all.
            # Up to 4 frames, those: a pointer each here, where a chunk object is 64 B.
            if n <= 4:
                items.extend(frames)
            else:
                items.append(_Chunk(shared, n))
                self._chunks += 1
        elif size >= OPEN_BYTES:
            items.append(_Chunk(_remember(frames, b"".join(frames)), n))
            self._chunks += 1
        else:
            data = _remember(frames, frames[0] if n == 1 else b"".join(frames))
            tail = items[-1] if items else None
            if tail is None:
                # Into an empty queue, most likely taken whole at once (a consumer waits:
                # the latency row's every burst), as it is: no bytearray copy to append
                # to. A batch that follows before it is taken opens a chunk of its own.
                items.append(_Chunk(data, n))
                self._chunks += 1
            elif (
                isinstance(tail, _Chunk)
                and isinstance(tail.data, bytearray)
                and len(tail.data) < OPEN_BYTES
            ):
                tail.data += data
                tail.count += n
            else:
                items.append(_Chunk(bytearray(data), n))
                self._chunks += 1

    def take_out(self, n: int) -> tuple[int, list[Buffer]]:
        """Up to ``n`` messages, and at most about ``TAKE_BYTES`` but for one message: a
        consumer's batch is copied whole into its socket's buffer."""
        items = self._items
        if items is None or not self._n:
            return 0, []
        held = self.held_bytes
        out: list[Buffer]
        if not self._chunks:
            k, size, out = _take_frames(items, n, held)
        elif n >= self._n and held <= TAKE_BYTES:
            out = [item if isinstance(item, bytes) else item.rest() for item in items]
            items.clear()
            self._chunks = 0
            k = self._n
            size = held
        else:
            k, size, out = self._take_some(items, n)
        self._n -= k
        self.held_bytes = held - size
        if self._budget is not None:
            self._budget.release(size)
        return k, out

    def _take_some(self, items: collections.deque[_Item], n: int) -> tuple[int, int, list[Buffer]]:
        out: list[Buffer] = []
        k = size = 0
        while k < n and size < TAKE_BYTES and items:
            item = items[0]
            if isinstance(item, bytes):
                items.popleft()
                out.append(item)
                k += 1
                size += len(item)
                continue
            c = item.count
            pos = item.pos
            data = item.data
            if c <= n - k and size + len(data) - pos <= TAKE_BYTES:
                items.popleft()
                self._chunks -= 1
                out.append(item.rest())
                k += c
                size += len(data) - pos
                continue
            if not isinstance(data, bytes):
                data = item.data = bytes(data)  # read as bytes: fast (_walk)
            end, j = _walk(data, pos, n - k, TAKE_BYTES - size)
            k += j
            size += end - pos
            if j == c:
                items.popleft()
                self._chunks -= 1
                out.append(item.rest())
                continue
            out.append(data[pos:end])
            item.count = c - j
            if end > len(data) - end:
                # Less is left than was taken: that much is copied out, so a chunk is
                # never kept for the little left of it.
                item.data = data[end:]
                item.pos = 0
            else:
                item.pos = end
        return k, size, out

    def take(self, n: int) -> list[bytes]:
        """:meth:`take_out`'s messages as frames."""
        return split_frames(self.take_out(n)[1])

    def ack(self, taken: list[Buffer]) -> None:
        pass  # nothing to remember: a memory queue's contents die with the process

    def peek(self, n: int) -> list[bytes]:
        out: list[bytes] = []
        items = self._items
        if items is None:
            return out
        for item in items:
            if len(out) >= n:
                break
            if isinstance(item, bytes):
                out.append(item)
                continue
            data = item.data if isinstance(item.data, bytes) else bytes(item.data)
            pos = item.pos
            while pos < len(data) and len(out) < n:
                end = _walk(data, pos, 1, 1)[0]
                out.append(data[pos:end])
                pos = end
        return out

    def purge(self) -> int:
        n = self._n
        if self._items is not None:
            self._items.clear()  # not take_out(): it hands out a socket buffer's worth at most
        self._n = self._chunks = 0
        if self._budget is not None:
            self._budget.release(self.held_bytes)
        self.held_bytes = 0
        return n

    def close(self, *, destroy: bool) -> None:
        self._items = None
        self._n = self._chunks = 0
        if self._budget is not None:
            self._budget.release(self.held_bytes)
        self.held_bytes = 0


def _take_frames(
    chunkless: collections.deque[_Item], n: int, held: int
) -> tuple[int, int, list[Buffer]]:
    """A store of frames alone (no chunk): up to ``n``, and about ``TAKE_BYTES`` of them
    (at least one), as many as the average size allows, cut where they cross it if the
    first ones are larger, the rest put back. Pops looped in C."""
    items = cast("collections.deque[bytes]", chunkless)
    if held <= TAKE_BYTES and n >= len(items):
        out = list(items)
        items.clear()
        return len(out), held, cast("list[Buffer]", out)
    k = n if held <= TAKE_BYTES else max(1, min(n, len(items), TAKE_BYTES * len(items) // held))
    out = list(itertools.starmap(items.popleft, itertools.repeat((), k)))
    size = sum(map(len, out))
    if size > TAKE_BYTES and k > 1:
        keep = bisect.bisect_left(list(itertools.accumulate(map(len, out))), TAKE_BYTES) + 1
        items.extendleft(reversed(out[keep:]))
        del out[keep:]
        size = sum(map(len, out))
    return len(out), size, cast("list[Buffer]", out)
