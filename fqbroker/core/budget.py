"""The broker-wide memory budget: bytes held by queues and by reads in flight.

Publishers are slowed, never refused, while it is spent: a data socket pauses reading and
waits in :meth:`MemoryBudget.acquire` until consumers have drained enough, and consumers
are never held back, so a broker over its budget drains (docs/memory.md: what is counted,
and what happens at each limit). The byte-room rule queues and the router share
(:func:`fitting`) lives here too. Sans I/O but for the waiting: the waiters are futures
of the running loop.
"""

from __future__ import annotations

import asyncio

__all__ = ["MemoryBudget", "fitting"]


class MemoryBudget:
    """Bytes held in memory for publishers, against ``limit``."""

    __slots__ = ("_waiters", "limit", "paused", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        # Holders add to it directly (``used += n`` on the hot path costs what a counter
        # does) and give back through release(), which wakes the waiters there is room for.
        self.used = 0
        self.paused = 0  # times a publisher waited for the budget
        # (bytes wanted, future), first come first served.
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    def fits(self, n: int) -> bool:
        """Whether ``n`` more bytes stay within the limit (0: whether it is not over)."""
        return self.used + n <= self.limit

    def release(self, n: int) -> None:
        """``n`` bytes are no longer held; wake publishers the budget now has room for."""
        self.used -= n
        if self._waiters:
            self._wake()

    def _wake(self) -> None:
        waiters = self._waiters
        # In order: a large reservation at the head is not overtaken by small ones
        # forever, so it is granted once enough has drained.
        while waiters and self.used + waiters[0][0] <= self.limit:
            future = waiters.pop(0)[1]
            if not future.done():
                future.set_result(None)

    def resize(
        self, held: int, need: int, *, behind_waiters: bool = False
    ) -> tuple[int, int | None]:
        """Move a reader's reservation from ``held`` to ``need`` bytes.

        Returns the bytes held now and None, or the bytes held and how many more to
        :meth:`acquire` before the reader reads on. Shrinking always succeeds; a reader
        holding nothing waits while the budget is spent, so it adds nothing to it; growing
        takes what fits, unless ``behind_waiters`` and others are waiting (a large message
        queues behind those who came first; small ones may pass).
        """
        grow = need - held
        if grow <= 0:
            if grow:
                self.release(-grow)
            if need or self.used <= self.limit:
                return need, None
            return need, 0
        if self.fits(grow) and not (behind_waiters and self._waiters):
            self.used += grow
            return need, None
        return held, grow

    async def wait(self, n: int) -> None:
        """Return once ``n`` more bytes fit; :meth:`acquire` then holds them.

        A woken waiter checks again when it runs: others may have taken the room in
        between (a consumer's batch is released and held again in one turn), and then it
        waits again at the head of the line.
        """
        if self.fits(n) and not self._waiters:
            return
        self.paused += 1
        first = True
        while first or not self.fits(n):
            future = asyncio.get_running_loop().create_future()
            entry = (n, future)
            if first:
                self._waiters.append(entry)
            else:
                self._waiters.insert(0, entry)
            first = False
            try:
                await future
            except BaseException:
                # Cancelled, woken or not: the turn passes on.
                self._waiters = [w for w in self._waiters if w[1] is not future]
                if self._waiters:
                    self._wake()
                raise

    async def acquire(self, n: int) -> None:
        """Wait until ``n`` more bytes fit, and hold them: the caller gives them back
        with :meth:`release`."""
        await self.wait(n)
        self.used += n

    @property
    def waiting(self) -> int:
        return len(self._waiters)


def fitting(frames: list[bytes], room_bytes: int) -> int:
    """How many leading ``frames`` a queue with ``room_bytes`` left takes: each one while
    there is room before it, so the one that crosses the limit is taken too."""
    if room_bytes <= 0:
        return 0
    for i, frame in enumerate(frames, 1):
        room_bytes -= len(frame)
        if room_bytes <= 0:
            return i
    return len(frames)
