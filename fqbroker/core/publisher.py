"""One publisher's way into the router: a connection's or a link's, whatever its protocol.

Every front end that takes messages in (the fq data socket, each peering link, HTTP
/submit, and the other listeners) makes one :class:`Publisher` and hands it runs of peer
frames; it publishes them through :meth:`Router.publish_runs`, the router's one way in,
and keeps what each front end would otherwise copy. Sans I/O: it owns no task and no
socket; the only awaiting is in the coroutines a shell calls by name.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable, Sequence
from typing import Protocol

from fqbroker.core import dedup
from fqbroker.core.message import Run
from fqbroker.core.permissions import Permissions
from fqbroker.core.router import ClientStats, Router, Target

__all__ = [
    "DISK_FULL",
    "FULL_ERRNOS",
    "PUBLISH_DENIED",
    "QUEUE_FULL",
    "WRITE_FAILED",
    "DurableStore",
    "FlushDirty",
    "Publisher",
]

# Why a confirm fails (docs/confirms.md). Clients match the first words: a full disk's
# text still starts as any failed write's does.
WRITE_FAILED = "disk queue write failed"
DISK_FULL = "disk queue write failed: disk full"
QUEUE_FULL = "queue full"  # then ": " and the queue's name
PUBLISH_DENIED = "publish denied"
# A write that failed for want of space: the disk (or the quota, or the file size limit)
# is full, not broken.
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class DurableStore(Protocol):
    """A disk store as a publisher sees it: what it wrote last, and when that is safe."""

    @property
    def written_seq(self) -> int: ...

    async def wait_durable(self, seq: int) -> bool:
        """True once ``seq`` is durable under the store's fsync policy; False if an fsync
        failed."""
        ...


# Writes every disk store's appended messages: (the stores written, messages lost, the
# errno of the first write that failed, 0 if none did or it had none). It is the
# catalog's; every publisher calls it before it next awaits, so what it finds is its own.
FlushDirty = Callable[[], tuple[Sequence[DurableStore], int, int]]


class Publisher:
    """The publishing side of one connection or link. It keeps:

    * its counters (a :class:`~fqbroker.core.router.ClientStats`; the router adds routing
      outcomes to it, and size drops and lost disk writes go through :meth:`Router.count`
      like every other outcome);
    * where a batch stopped when a block-policy queue filled up: :meth:`publish` returns
      False and keeps the rest, the shell awaits :meth:`wait_for_room` and calls
      :meth:`carry_on`. How the shell waits is its own business: the data socket pauses
      reading, a peering link simply awaits;
    * durability: the disk stores it appended to are written (``flush_dirty``) before it
      waits and after each batch, and it records per store the last seq written and the
      number of the first message a disk write failed for, and why (a full disk or not);
    * refusals: a full reject-policy queue refuses messages as a drop-policy one does,
      and the router counts them (:attr:`Router.rejected`) and says where its call
      refused the first; the publisher records that message's number, so a confirm
      covering it fails;
    * publisher confirms (docs/confirms.md): :meth:`confirm` answers once the first
      ``count`` messages are handled and durable, or says why not;
    * permissions (auth = "password", :mod:`fqbroker.core.permissions`): a run on an
      exchange its user may not publish to is dropped unrouted and counted ``denied``, and
      a confirm covering it fails with ``publish denied``. A publisher made without
      permissions, or with :attr:`Permissions.ALL`, runs the loop it always ran: the check
      costs nothing then.

    The coroutines a shell awaits: :meth:`wait_for_room`, :meth:`finish`,
    :meth:`publish_all`, :meth:`durable`, :meth:`confirm`.
    """

    __slots__ = (
        "_first",
        "_flush_dirty",
        "_may_publish",
        "_next",
        "_octets",
        "_progress",
        "_router",
        "_runs",
        "blocked",
        "closed",
        "dedup",
        "denied_from",
        "failed_from",
        "failed_why",
        "handled",
        "rejected_by",
        "rejected_from",
        "stamp_size",
        "stats",
        "written",
    )

    def __init__(
        self,
        router: Router,
        flush_dirty: FlushDirty,
        stats: ClientStats | None = None,
        *,
        stamp_size: int = 0,
        permissions: Permissions | None = None,
    ) -> None:
        self._router = router
        # None when everything may be published: carry_on then asks nothing per run.
        self._may_publish = (
            None if permissions is None or permissions.everything else permissions.may_publish
        )
        self._flush_dirty = flush_dirty
        self.stats = ClientStats() if stats is None else stats
        # What the front end added to each frame beyond the bytes it read (sender and
        # hops): taken off again when a batch's read bytes are counted in part.
        self.stamp_size = stamp_size
        # Messages handled so far; the number of the first message since the last flush.
        self.handled = 0
        self._first = 1
        # The batch being published: its runs, where it stands, its read bytes not yet
        # counted (-1: counted by received()), and the full queues it waits for.
        self._runs: list[Run] = []
        self._next = 0
        self._octets = -1
        self.blocked: list[Target] = []
        # Confirms: the last seq written per disk store, the first message a write
        # failed for, and the event confirms wait on (made by the first that waits).
        self.written: dict[DurableStore, int] | None = None
        self.failed_from: int | None = None
        self.failed_why = WRITE_FAILED
        # The first message a full reject-policy queue refused, and that queue's name.
        self.rejected_from: int | None = None
        self.rejected_by = b""
        # The number of the first message denied (at most: see _deny), if any was.
        self.denied_from: int | None = None
        self._progress: asyncio.Event | None = None
        self.closed = False
        # Opted in to de-duplication (core/dedup.py): its batches are routed in the scope.
        self.dedup = False

    # --- publishing -----------------------------------------------------------------------

    def received(self, messages: int, octets: int) -> None:
        """Count messages as handled when read, before any is published (a peer's: those
        that looped are handled too, and never published)."""
        self.handled += messages
        stats = self.stats
        stats.msgs_in += messages
        stats.octets_in += octets

    def publish(self, runs: list[Run], octets: int = -1) -> bool:
        """Publish a batch; False when a full block-policy queue stopped it.

        ``octets``: the bytes the batch was read as, to count its messages as handled as
        they are published; -1 when :meth:`received` counted them. After False, await
        :meth:`wait_for_room` and call :meth:`carry_on`.
        """
        self._runs = runs
        self._next = 0
        self._octets = octets
        return self.carry_on()

    def carry_on(self) -> bool:
        """Publish what is left of the batch; False when it has to wait again."""
        if not self.dedup:
            return self._carry_on()
        dedup.enter(self._router.dedup)
        try:
            return self._carry_on()
        finally:
            dedup.leave()

    def _carry_on(self) -> bool:
        """:meth:`carry_on`, in or out of the de-duplication scope.

        The consumers it wakes are called back on the loop's next turn, not before it
        returns: calling them in the read's own turn was measured to cost broker CPU on
        every throughput row (a write per publisher read instead of one per turn) for no
        latency gain the bench could tell from noise (bench/RESULTS.md, latency at 10k
        msg/s).
        """
        runs = self._runs
        i = self._next
        stats = self.stats
        counting = self._octets >= 0
        router = self._router
        publish_runs = router.publish_runs
        may = self._may_publish
        rejected = router.rejected
        # Messages before the next one published: what the router's count of a call's
        # messages before its first refused one is added to.
        before = self.handled if counting else self._first - 1
        while i < len(runs):
            if may is None:
                i, done, blocked = publish_runs(runs, i, stats)
            else:
                # Publish up to the next run its user may not publish, then drop that one.
                j = i
                while j < len(runs) and may(runs[j][0]):
                    j += 1
                if j == i:
                    done = self._deny(runs[i], counting)
                    i += 1
                    blocked = []
                elif j == len(runs):
                    i, done, blocked = publish_runs(runs, i, stats)
                else:
                    part = runs[i:j]
                    k, done, blocked = publish_runs(part, 0, stats)
                    if k < len(part):
                        runs[i + k] = part[k]  # the rest of a run published in part
                    i += k
            if router.rejected != rejected:
                rejected = router.rejected
                self._rejected(before + router.rejected_after + 1)
            before += done
            if counting:
                self.handled += done
                stats.msgs_in += done
            if blocked:
                if counting:
                    # What went out so far counts now: a frame less the stamp is what
                    # was read for it.
                    stamp = self.stamp_size
                    left = sum(sum(map(len, r[2])) - len(r[2]) * stamp for r in runs[i:])
                    stats.octets_in += self._octets - left
                    self._octets = left
                self._next = i
                self.blocked = blocked
                self.flush()
                if not counting:
                    # handled counts the whole batch: the rest starts this far back.
                    self._first = self.handled + 1 - sum(len(r[2]) for r in runs[i:])
                return False
        if counting:
            stats.octets_in += self._octets
        self._runs = []
        self._next = 0
        self._octets = -1
        self.blocked = []
        self.flush()
        return True

    async def wait_for_room(self) -> None:
        """Wait until every queue that stopped the batch has room again."""
        for queue in self.blocked:
            await queue.wait_not_full()

    async def publish_all(self, runs: list[Run], octets: int = -1) -> None:
        """Publish a batch, waiting for room as often as it has to."""
        if not self.publish(runs, octets):
            await self.finish()

    async def finish(self) -> None:
        """After :meth:`publish` returned False: publish the rest of the batch, waiting
        for room as often as it has to."""
        while True:
            await self.wait_for_room()
            if self.carry_on():
                return

    def _deny(self, run: Run, counting: bool) -> int:
        """Drop a run its user may not publish; returns its messages (handled now)."""
        n = len(run[2])
        # Counting as published: the run's first message is the next one. Counted when
        # read (received()): its number is not kept, so the batch's first stands in
        # and a confirm covering any of the batch fails (never one that should not).
        first = self.handled + 1 if counting else self._first
        if self.denied_from is None or first < self.denied_from:
            self.denied_from = first
        self._router.count_denied(self.stats, run[0], n)
        return n

    def _rejected(self, first: int) -> None:
        """A full reject-policy queue refused message number ``first`` (and maybe more
        after it): a confirm covering it fails."""
        if self.rejected_from is None or first < self.rejected_from:
            self.rejected_from = first
            self.rejected_by = self._router.rejected_by

    def size_dropped(self, count: int) -> None:
        """Messages refused for their size before they were routed."""
        self._router.count(self.stats, size_dropped=count)

    # --- durability and confirms ----------------------------------------------------------

    def flush(self) -> None:
        """Write what was appended to disk stores; lost messages count as drops."""
        written, lost, error = self._flush_dirty()
        if written:
            if self.written is None:
                self.written = {}
            for store in written:
                self.written[store] = store.written_seq
        if lost:
            self._router.count(self.stats, dropped=lost)
            if self.failed_from is None:
                self.failed_from = self._first
                self.failed_why = DISK_FULL if error in FULL_ERRNOS else WRITE_FAILED
        self._first = self.handled + 1
        if self._progress is not None:
            self._progress.set()
            self._progress = None

    def close(self) -> None:
        """The connection is gone: confirms still waiting learn it."""
        self.closed = True
        if self._progress is not None:
            self._progress.set()

    async def durable(self) -> bool:
        """Wait until what it wrote to disk stores is durable; False if an fsync failed."""
        for store, seq in list((self.written or {}).items()):
            if not await store.wait_durable(seq):
                return False
            if self.written is not None and self.written.get(store) == seq:
                del self.written[store]
        return True

    @property
    def first_refused(self) -> int | None:
        """The number of the first message not accepted (denied, not written, or refused
        by a full reject-policy queue), if any was."""
        firsts = [n for n in (self.denied_from, self.failed_from, self.rejected_from) if n]
        return min(firsts) if firsts else None

    def refused(self, count: int) -> str | None:
        """Why one of the first ``count`` handled messages is not accepted, as far as is
        known without waiting for an fsync; None if nothing says so yet."""
        if self.denied_from is not None and self.denied_from <= count:
            return PUBLISH_DENIED
        if self.failed_from is not None and self.failed_from <= count:
            return self.failed_why
        if self.rejected_from is not None and self.rejected_from <= count:
            return f"{QUEUE_FULL}: {self.rejected_by.decode('ascii', 'backslashreplace')}"
        return None

    async def confirm(self, count: int) -> str | None:
        """Wait until the first ``count`` messages are routed and durable; None, or why not.

        The one answer every front end gives: an fq confirm's, /submit's, and what
        decides whether Lumberjack and Figg acknowledge."""
        while self.handled < count:
            if self.closed:
                return "data channel closed"
            if self._progress is None:
                self._progress = asyncio.Event()
            await self._progress.wait()
        why = self.refused(count)
        if why is not None:
            return why
        if not await self.durable():
            return WRITE_FAILED  # an fsync failed
        return None
