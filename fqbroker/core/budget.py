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

__all__ = ["MemoryBudget", "Share", "fitting"]


class MemoryBudget:
    """Bytes held in memory for publishers, against ``limit``.

    What connections reserve for messages still arriving goes through a :class:`Share`,
    within ``per_connection`` and, for all of one user's connections, ``per_user``: a
    connection or a user that stops sending can hold no more than that, and the rest of
    the budget stays for everyone else (0: the whole budget).
    """

    __slots__ = ("_users", "_waiters", "limit", "paused", "per_connection", "per_user", "used")

    def __init__(self, limit: int, per_connection: int = 0, per_user: int = 0) -> None:
        self.limit = limit
        self.per_connection = per_connection or limit
        self.per_user = per_user or limit
        # What each user's shares hold, with the shares that wait for the user's others.
        self._users: dict[object, _User] = {}
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

    def share(self, user: object) -> Share:
        """A connection's share of the budget, counted with ``user``'s others (None: the
        anonymous connections, together)."""
        entry = self._users.get(user)
        if entry is None:
            entry = self._users[user] = _User()
        entry.shares += 1
        return Share(self, user, entry)

    def held_by(self, user: object) -> int:
        """What ``user``'s shares hold (or have been granted and are about to hold)."""
        entry = self._users.get(user)
        return 0 if entry is None else entry.held


class _User:
    __slots__ = ("held", "shares", "waiters")

    def __init__(self) -> None:
        self.held = 0
        self.shares = 0
        self.waiters: list[asyncio.Future[None]] = []

    def wake(self) -> None:
        # Few waiters (one user's connections), each checks again when it runs.
        waiters, self.waiters = self.waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(None)


class Share:
    """One connection's reservation of the budget, for what it reads and has not yet
    handed on: at most :attr:`cap` bytes, and with its user's other shares at most
    ``per_user``.

    A share that would take its user past ``per_user`` waits for the user's other shares
    to give back, outside the budget's line, so it holds up nobody else; a share whose
    user's others hold nothing may grow to its own cap (one large message is never
    refused for the user's cap, only made to wait for the user's others). A reservation
    over :attr:`cap` can never be granted: the connection refuses what it is for instead.

    Two of a user's connections must never wait for each other. A reservation made for
    an announced size (the message's bytes are read only once it is granted, so the
    connection has at most a read of them in memory) lets go of what it held while it
    waits; one that grows with bytes already in memory (``gradual``: nothing announced
    them) grows past the user's cap instead, bounded by its own.
    """

    __slots__ = ("_budget", "_user", "held", "user")

    def __init__(self, budget: MemoryBudget, user: object, entry: _User) -> None:
        self._budget = budget
        self._user = entry
        self.user = user
        self.held = 0

    @property
    def cap(self) -> int:
        """The most this connection may hold."""
        return self._budget.per_connection

    def resize(
        self, need: int, *, behind_waiters: bool = False, gradual: bool = False
    ) -> int | None:
        """Move the reservation to ``need`` bytes: None once it holds them, or how many
        more to :meth:`acquire` first (:meth:`MemoryBudget.resize`)."""
        budget = self._budget
        held = self.held
        entry = self._user
        if (
            need > held
            and entry.held + need - held > budget.per_user
            and entry.held > held
            and not gradual
        ):
            # Over the user's cap while its others hold some: wait for them, holding
            # nothing meanwhile, so that none of them waits for this one.
            self.release()
            return need
        self.held, grow = budget.resize(held, need, behind_waiters=behind_waiters)
        entry.held += self.held - held
        if self.held < held and entry.waiters:
            entry.wake()
        return grow

    async def acquire(self, n: int) -> None:
        """Wait until ``n`` more bytes fit the user's cap and the budget, and hold them."""
        budget = self._budget
        entry = self._user
        if entry.held + n > budget.per_user and entry.held > self.held and not self.held:
            budget.paused += 1
        while entry.held + n > budget.per_user and entry.held > self.held and not self.held:
            future = asyncio.get_running_loop().create_future()
            entry.waiters.append(future)
            try:
                await future
            except BaseException:
                if future in entry.waiters:
                    entry.waiters.remove(future)
                raise
        entry.held += n  # the user's before the budget grants it: no other share takes it
        try:
            await budget.acquire(n)
        except BaseException:
            entry.held -= n
            if entry.waiters:
                entry.wake()
            self._forget_if_idle()  # the connection may have closed while it waited
            raise
        self.held += n

    def release(self) -> None:
        """Give back everything held."""
        held = self.held
        if held:
            self.held = 0
            entry = self._user
            entry.held -= held
            self._budget.release(held)
            if entry.waiters:
                entry.wake()

    def close(self) -> None:
        """The connection is gone: give back what it holds, and forget it."""
        self.release()
        self._user.shares -= 1
        self._forget_if_idle()

    def _forget_if_idle(self) -> None:
        entry = self._user
        if not entry.shares and not entry.held:
            users = self._budget._users
            if users.get(self.user) is entry:
                del users[self.user]


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
