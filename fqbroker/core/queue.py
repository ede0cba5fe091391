"""Queues: policy, backlog, clients and competing consumers (fqd_queue.c, fqd_queue_mem.c).

Theory of operation
-------------------
A queue holds messages routed to it until a consumer's data channel takes them. Under
the **drop** policy a message offered while ``backlog >= limit`` is refused (tail drop)
and counted in ``dropped_to``; ``backlog=0`` therefore drops everything. Under **block**
the message is accepted and the queue reports ``is_full``: the publishing session then
waits on :meth:`Queue.wait_not_full` before it reads more from its socket. That stalls
only the publishers writing into the full queue, not every publisher as fqd's worker
thread does (docs/fq-protocol.md §1.13, §9), and nothing a publisher handed over is lost.

A memory queue has a limit in bytes beside the message count (``backlog_bytes``,
docs/memory.md) under the same policy: a message is taken while the bytes held are under
the limit, so the one that crosses it is taken and the queue holds at most the limit plus
one message. The bytes are those of the frames held, which the broker-wide
:class:`~fqbroker.core.budget.MemoryBudget` counts too. A disk queue keeps its messages in its
files; what it holds in memory is its cache, which it bounds itself.

Consumers are data channels of the queue's clients (1 for a private queue, 16 for a public
one). Each waits in :meth:`notify_ready` (a protocol, no task of its own) and is called back
the moment a message arrives (fqd polls, docs/fq-protocol.md §1.13). Waiting consumers are
served first come, first served, and a public queue shares fairly under light load too,
where fqd hands everything to one consumer (docs/fq-protocol.md §3.4; what "fair" means:
docs/queues.md):

* messages arriving wake as many waiting consumers as there are new messages, up to all
  of them (one, for a private queue or a lone consumer: nothing more on the hot path);
* each woken consumer takes ``ceil(held / (woken still to come + 1))``, so 10 messages
  and two idle consumers are 5 and 5;
* a consumer that took its share while others are woken waits in line again
  (:attr:`Queue.contended`) instead of taking theirs; under load this turns consumers
  round-robin, a batch each, while a consumer whose socket is full is skipped.

Messages live in a :class:`MemoryStore`; disk queues swap in another store with the same
small interface. A queue holds each message as the peer frame its consumers receive
(docs/fq-protocol.md §1.10): nothing is decoded or built again on the way out. A memory
queue packs small frames into chunks (one for all the queues a batch is routed to), which
consumers write as they are.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import itertools
import operator
from typing import Protocol, cast

from fqbroker.core.budget import MemoryBudget, fitting
from fqbroker.core.frames import ID_SIZE
from fqbroker.core.queuespec import (
    DEFAULT_BACKLOG_BYTES,
    UNLIMITED_BYTES,
    Policy,
    QueueKind,
    QueueSpec,
    signed_backlog,
)
from fqbroker.errors import QueueError
from fqbroker.storage.segmentlog import SegmentLog
from fqbroker.storage.store import DiskStore

__all__ = [
    "MAX_PUBLIC_CLIENTS",
    "Buffer",
    "MemoryStore",
    "Notify",
    "Queue",
    "Store",
    "split_frames",
]

MAX_PUBLIC_CLIENTS = 16

# What a store hands out: whole frames, one or many to a buffer.
Buffer = bytes | bytearray


class Store(Protocol):
    """Where a queue keeps its messages (fqd's ``fqd_queue_impl``)."""

    def __len__(self) -> int: ...
    @property
    def held_bytes(self) -> int:
        """Bytes of messages held in memory."""
        ...

    def extend(self, frames: list[bytes], size: int = -1) -> None: ...
    def take_out(self, n: int) -> tuple[int, list[Buffer]]:
        """Up to ``n`` messages, as (how many, buffers of whole frames in order): what a
        consumer writes as it is. :meth:`ack` takes the buffers back."""
        ...

    def ack(self, taken: list[Buffer]) -> None: ...
    def peek(self, n: int) -> list[bytes]:
        """The next ``n`` messages :meth:`take_out` would hand out, left where they are."""
        ...

    def purge(self) -> int:
        """Drop every message not yet handed out; how many went."""
        ...

    def close(self, *, destroy: bool) -> None: ...


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
    :func:`~fqbroker.core.frames.frame_length` does, inline on ``bytes``: compiled, 15 ns a
    frame, where a call on a ``bytearray`` is ten times that."""
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
            if (
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


class Queue:
    """One named queue and the clients attached to it."""

    __slots__ = (
        "_getters",
        "_given_bytes",
        "_space",
        "_woken",
        "blocks",
        "clients",
        "dropped_to",
        "fsync",
        "kind",
        "limit",
        "limit_bytes",
        "name",
        "owner",
        "permanent",
        "policy",
        "private",
        "store",
    )

    def __init__(
        self,
        spec: QueueSpec,
        store: Store | None = None,
        budget: MemoryBudget | None = None,
        default_bytes: int = DEFAULT_BACKLOG_BYTES,
    ) -> None:
        self.name = spec.name
        self.kind = spec.kind
        self.private = spec.is_private
        self.policy = spec.effective_policy
        self.blocks = self.policy is Policy.BLOCK
        self.limit = spec.backlog_limit
        # A disk queue's messages are in its files: its byte limit is its cache's.
        self._given_bytes = spec.backlog_bytes  # None: the broker's default, not stored
        given = default_bytes if spec.backlog_bytes is None else spec.backlog_bytes
        self.limit_bytes = (
            (given or UNLIMITED_BYTES) if spec.kind is QueueKind.MEM else UNLIMITED_BYTES
        )
        self.permanent = bool(spec.permanent)
        self.fsync = spec.fsync
        self.store: Store = store if store is not None else MemoryStore(budget)
        self.clients: list[object] = []
        # The user that first attached to it while private: under auth = "password" no
        # other user (but an admin) may attach to it. In memory only: after a restart,
        # the first user to attach owns a permanent queue again (queue patterns are the
        # durable rule).
        self.owner: bytes | None = None
        self.dropped_to = 0
        # Waiting consumers, first come first served. A list: there are at most 16, and
        # an empty deque costs 700 bytes in every queue of every idle client.
        self._getters: list[Notify] = []
        # Consumers woken for new messages that have not taken their share yet.
        self._woken = 0
        self._space: asyncio.Event | None = None

    # --- attributes -----------------------------------------------------------------------

    @property
    def spec(self) -> QueueSpec:
        return QueueSpec(
            self.name,
            self.kind,
            self.private,
            self.policy,
            self.limit,
            self.permanent,
            self.fsync,
            self._given_bytes,
        )

    @property
    def backlog(self) -> int:
        return len(self.store)

    @property
    def backlog_limit(self) -> int:
        return signed_backlog(self.limit)

    @property
    def max_clients(self) -> int:
        return 1 if self.private else MAX_PUBLIC_CLIENTS

    @property
    def is_full(self) -> bool:
        """A block-policy queue at its limit: publishers into it should wait."""
        store = self.store
        return self.blocks and (len(store) >= self.limit or store.held_bytes >= self.limit_bytes)

    # --- clients --------------------------------------------------------------------------

    def check_attach(self, spec: QueueSpec) -> None:
        """fqd's checks for attaching to an existing queue, in its order
        (docs/fq-protocol.md §3.2)."""
        if self.private and self.clients:
            raise QueueError("requested queue is private and in use\n")
        if spec.kind != self.kind:
            raise QueueError(f"requested type {spec.kind}, queue is {self.kind}")
        if spec.is_private != self.private:
            if spec.is_private:
                raise QueueError("requested private, queue is public")
            raise QueueError("requested public, queue is private")
        if spec.effective_policy != self.policy:
            if spec.effective_policy is Policy.BLOCK:
                raise QueueError("request block, queue is drop")
            raise QueueError("request drop, queue is block")
        # A differing backlog= is ignored: the queue keeps the limit it was made with.

    def attach(self, client: object) -> None:
        if len(self.clients) >= self.max_clients:
            raise QueueError("can't add you to queue")
        self.clients.append(client)

    def detach(self, client: object) -> None:
        if client in self.clients:
            self.clients.remove(client)

    # --- producing ------------------------------------------------------------------------

    def offer(self, frames: list[bytes], size: int = -1) -> int:
        """Append messages in order; under drop, those past either limit are refused.

        ``size``: their bytes, if the caller has counted them already.
        """
        n = len(frames)
        store = self.store
        if size < 0:
            size = sum(map(len, frames)) if n > 1 else len(frames[0]) if n else 0
        if not self.blocks:
            room = self.limit - len(store)
            room_bytes = self.limit_bytes - store.held_bytes
            if room < n or room_bytes < size:
                room = min(room, fitting(frames, room_bytes))
                if room <= 0:
                    self.dropped_to += n
                    return 0
                if room < n:
                    self.dropped_to += n - room
                    frames = frames[:room]
                    n = room
                    size = -1
        store.extend(frames, size)
        self._wake_getters()
        return n

    @property
    def room(self) -> int:
        return self.limit - len(self.store)

    @property
    def room_bytes(self) -> int:
        """Bytes it takes before it is full (0 or less: none)."""
        return self.limit_bytes - self.store.held_bytes

    def takes(self, frames: list[bytes]) -> int:
        """How many of ``frames`` a block-policy queue takes before it is full: at least
        one, the message that fills it."""
        n = min(len(frames), max(self.room, 1))
        batch = frames if n == len(frames) else frames[:n]
        room_bytes = self.limit_bytes - self.store.held_bytes
        if sum(map(len, batch)) > room_bytes:
            n = max(fitting(batch, room_bytes), 1)
        return n

    async def wait_not_full(self) -> None:
        """Return once the backlog is under the limit (block policy)."""
        while self.is_full:
            if self._space is None:
                self._space = asyncio.Event()
            await self._space.wait()

    # --- consuming ------------------------------------------------------------------------

    def _wake_getters(self) -> None:
        """Wake consumers in line, one for each message held that no woken one will take:
        a burst to idle consumers is shared by all of them, and a lone consumer is woken
        once, however many messages follow before it runs."""
        getters = self._getters
        while getters and self._woken < len(self.store):
            getter = getters.pop(0)
            if not getter.done():
                getter.set_result(None)
                self._woken += 1

    @property
    def contended(self) -> bool:
        """Consumers were woken for the messages held and have not taken their share yet:
        one that took its own should wait in line again rather than take theirs."""
        return self._woken > 0

    def take_out(self, max_n: int) -> tuple[int, list[Buffer]]:
        """Take up to ``max_n`` messages now, leaving an even share to each consumer woken
        and still to come: (how many, buffers of whole frames, as :meth:`Store.take_out`)."""
        store = self.store
        available = len(store)
        if not available:
            return 0, []
        n = min(max_n, -(-available // (self._woken + 1)))
        taken = store.take_out(n)
        if self._getters and not self._woken:
            # What is left is no woken consumer's share: the next ones in line get it.
            self._wake_getters()
        if self._space is not None and not self.is_full:
            self._space.set()
            self._space = None
        return taken

    def take(self, max_n: int) -> list[bytes]:
        """:meth:`take_out`'s messages as frames, one ``bytes`` each."""
        return split_frames(self.take_out(max_n)[1])

    def notify_ready(self, consumer: Consumer) -> Notify:
        """Call ``consumer.queue_ready()`` soon once there may be messages to :meth:`take`.

        Consumers wait in line, and each takes its share of a batch. Cancel the result to
        stop waiting. A consumer that is gone by the time its callback runs returns False,
        and the wake-up goes to the next one in line, so no message sits unseen.
        """
        getter = Notify(self, consumer)
        self._getters.append(getter)
        return getter

    def ack(self, taken: list[Buffer]) -> None:
        """What :meth:`take_out` gave reached a consumer's socket (a disk queue's checkpoint
        moves)."""
        if taken:
            self.store.ack(taken)

    def peek(self, n: int) -> list[bytes]:
        """The next ``n`` messages a consumer would get, as frames; nothing moves."""
        return self.store.peek(n) if n > 0 else []

    def purge(self) -> int:
        """Drop the backlog (what no consumer has been handed yet); how many messages.

        Publishers waiting on a full block-policy queue go on. A disk queue's named
        checkpoints stay where they are (:meth:`DiskStore.purge`).
        """
        n = self.store.purge()
        if self._space is not None and not self.is_full:
            self._space.set()
            self._space = None
        return n

    def disk_log(self) -> SegmentLog:
        store = self.store
        if not isinstance(store, DiskStore):
            raise TypeError(f"queue {self.name!r} is not a disk queue")
        return store.log

    def rewind(self, seq: int) -> None:
        store = self.store
        if not isinstance(store, DiskStore):
            raise TypeError(f"queue {self.name!r} is not a disk queue")
        store.rewind(seq)
        self._wake_getters()

    def close(self, *, destroy: bool) -> None:
        for getter in self._getters:
            if not getter.done():
                getter.cancel()
        self._getters.clear()
        if self._space is not None:
            self._space.set()
        self.store.close(destroy=destroy)

    def __repr__(self) -> str:
        return (
            f"Queue({self.name!r}, {self.kind}, {'private' if self.private else 'public'}, "
            f"{self.policy}, backlog={self.backlog}/{self.backlog_limit})"
        )


class Consumer(Protocol):
    def queue_ready(self) -> bool:
        """Take and send what the queue has; False if this consumer is gone."""
        ...


class Notify:
    """A consumer waiting in :meth:`Queue.notify_ready`.

    It answers what the queue asks of a waiter as a future would, at a fraction of a
    future's size (a future with a callback is 500 bytes, and every idle consumer has one).
    """

    __slots__ = ("_consumer", "_queue", "_state")

    def __init__(self, queue: Queue, consumer: Consumer) -> None:
        self._queue = queue
        self._consumer = consumer  # not a bound method: 64 bytes in every idle client
        self._state = _WAITING

    def done(self) -> bool:
        return self._state is not _WAITING

    def cancelled(self) -> bool:
        return self._state is _CANCELLED

    def cancel(self) -> bool:
        if self._state is not _WAITING:
            return False  # woken: the callback comes, and passes the wake-up on
        self._state = _CANCELLED
        return True

    def set_result(self, _: None) -> None:
        # Called soon, not now, as a future's callback: the publisher finishes its batch
        # first, and the consumer takes it in one go.
        self._state = _WOKEN
        asyncio.get_running_loop().call_soon(self._run)

    def _run(self) -> None:
        queue = self._queue
        queue._woken -= 1
        if not self._consumer.queue_ready():
            queue._wake_getters()


_WAITING, _WOKEN, _CANCELLED = "waiting", "woken", "cancelled"
