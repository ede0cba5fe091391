"""Queues: policy, backlog, clients and competing consumers (fqd_queue.c, fqd_queue_mem.c).

A queue holds the messages routed to it, each as the peer frame its consumers receive, in
a :class:`Store` (:class:`MemoryStore` here; the disk queue's store implements the same
protocol in :mod:`fqbroker.storage.store`). Under drop, what is past a limit is refused
and counted; under reject, refused as under drop, and the router tells the publisher so
its confirm fails; under block, only the publishers into a full queue wait. Waiting consumers
are called back in line and share a burst evenly: docs/queues.md says how, docs/memory.md
covers the byte limits.
"""

from __future__ import annotations

import asyncio
from _thread import get_ident
from typing import Protocol

from fqbroker.core.budget import MemoryBudget, fitting
from fqbroker.core.dedup import SCOPE, DedupLimits, Window, now_us
from fqbroker.core.memstore import Buffer, MemoryStore, split_frames
from fqbroker.core.queuespec import (
    DEFAULT_BACKLOG_BYTES,
    UNLIMITED_BYTES,
    Policy,
    QueueKind,
    QueueSpec,
    signed_backlog,
)
from fqbroker.errors import QueueError

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


class Store(Protocol):
    """Where a queue keeps its messages (fqd's ``fqd_queue_impl``): :class:`MemoryStore`
    here, the disk queue's store in :mod:`fqbroker.storage.store`. The core knows stores
    only through this protocol."""

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
        "rejects",
        "store",
        "window",
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
        self.rejects = self.policy is Policy.REJECT
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
        # The ids of opted-in publishers' messages it took (core/dedup.py): made when
        # the first comes, a disk queue's read back from its log.
        self.window: Window | None = None

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
            # fqd's text for drop against block, and the same shape for reject.
            raise QueueError(f"request {spec.effective_policy}, queue is {self.policy}")
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
        """Append messages in order; under drop and reject, those past either limit are
        refused (the router tells a reject queue's publisher). Returns how many of the
        first it took: the rest were refused.

        ``size``: their bytes, if the caller has counted them already. While an opted-in
        publisher's batch is routed, repeats are dropped first and count as taken.
        """
        if SCOPE:  # empty unless an opted-in batch is being routed
            limits = SCOPE.get(get_ident())
            if limits is not None:
                return self._offer_once(frames, limits)
        return self._offer(frames, size)

    def _offer_once(self, frames: list[bytes], limits: DedupLimits) -> int:
        window = self.window
        if window is None:
            window = self.window = self._open_window(limits)
        n = len(frames)
        kept = window.fresh(frames, now_us())
        if not kept:
            return n
        took = self._offer(kept, -1)
        if took == len(kept):
            return n
        window.forget(kept[took:])  # refused: a retry must get in
        # Where the first refused is in ``frames`` (the very object: a repeat of it may be
        # equal); before it, all were taken or repeats.
        first = kept[took]
        return next(i for i, frame in enumerate(frames) if frame is first)

    def _open_window(self, limits: DedupLimits) -> Window:
        # A disk store rebuilds its window from its log (storage/store.py); a memory
        # queue's messages die with the process, and so may its window.
        opener = getattr(self.store, "open_window", None)
        if opener is None:
            return Window(limits)
        window: Window = opener(limits)
        return window

    @property
    def duplicates(self) -> int:
        """Messages of opted-in publishers dropped as repeats (core/dedup.py)."""
        window = self.window
        return 0 if window is None else window.duplicates

    def _offer(self, frames: list[bytes], size: int) -> int:
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
        if isinstance(store, MemoryStore):
            store.extend(frames, size)  # compiled to compiled: not through the protocol
        else:
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
        checkpoints stay where they are (its store's ``purge``).
        """
        n = self.store.purge()
        if self._space is not None and not self.is_full:
            self._space.set()
            self._space = None
        return n

    def refilled(self) -> None:
        """The store holds messages that did not come through :meth:`offer` (a disk queue
        rewound to a checkpoint): wake consumers in line for them."""
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
        loop = _loop[0]
        if loop is None or _loop_thread[0] != get_ident() or not loop.is_running():
            # asyncio.get_running_loop() is a getpid() system call on every wake-up
            # (CPython 3.11 checks the loop was not inherited across a fork): one a burst
            # of the latency row. The loop kept is the one running here if it runs and
            # this is its thread: a thread runs one loop at a time, and brokers embedded
            # on two threads each wake on their own.
            loop = _loop[0] = asyncio.get_running_loop()
            _loop_thread[0] = get_ident()
        loop.call_soon(self._run)

    def _run(self) -> None:
        queue = self._queue
        queue._woken -= 1
        if not self._consumer.queue_ready():
            queue._wake_getters()


_WAITING, _WOKEN, _CANCELLED = "waiting", "woken", "cancelled"
# The loop the last wake-up was called soon on (Notify.set_result).
_loop: list[asyncio.AbstractEventLoop | None] = [None]
_loop_thread: list[int] = [0]  # ... and the thread it ran on
