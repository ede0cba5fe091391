"""One heartbeat clock for all command sessions (docs/fq-protocol.md §1.7).

A session that asked for heartbeats has one entry in a heap, at the time it next needs
looking at: its next beat or the end of its 3x silence, whichever comes first. One timer,
for the head of the heap, serves every session: 10,000 idle clients are 10,000 small
heap entries rather than 10,000 tasks, each with its own timer and wake-ups.

The clock only keeps time. What is due when it calls is the session's protocol state to
say (``CommandMachine.heartbeat_due`` in fqbroker.frontends.fq.commandmachine, given the
time); the session's shell writes the beat and schedules its next look here.
"""

from __future__ import annotations

import asyncio
import heapq
from typing import Any, Protocol

__all__ = ["HeartbeatClock"]

# Sessions due this close together are served by one timer run: a heartbeat goes out at
# most this early, and the wave of beats of many clients costs far fewer timer wake-ups.
SLACK = 0.002
# Entries of sessions that stopped or moved their time stay in the heap until they come
# up; past this many (and half the heap) it is rebuilt, so a client that keeps changing
# its interval cannot grow it.
MAX_STALE = 256


class Beating(Protocol):
    # The session's live entry: any other of its entries in the heap is stale.
    _beat: Entry | None

    def heartbeat_due(self, now: float) -> None: ...

    def __lt__(self, other: Any) -> bool: ...  # any fixed order, for entries of one time


# (when, session): a tuple, so heapq compares it in C; 56 bytes in every idle client.
Entry = tuple[float, Beating]


class HeartbeatClock:
    __slots__ = ("_heap", "_loop", "_running", "_seq", "_stale", "_timer", "_timer_at")

    def __init__(self) -> None:
        self._heap: list[Entry] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running = False
        self._stale = 0
        # uvloop's call_at of a time past returns a plain Handle, without when().
        self._timer: asyncio.Handle | None = None
        self._timer_at = 0.0

    def time(self) -> float:
        """The loop's clock, which the timer runs on; sessions keep their times in it."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop.time()

    def schedule(self, session: Beating, when: float) -> Entry:
        """Call ``session.heartbeat_due`` at ``when``; returns the entry to :meth:`cancel`."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        self._drop_stale()
        entry: Entry = (when, session)
        heapq.heappush(self._heap, entry)
        if not self._running and (self._timer is None or when < self._timer_at):
            self._arm()
        return entry

    def cancel(self, entry: Entry) -> None:
        """``entry`` is no longer its session's: it stays in the heap, stale, until it
        comes up or the heap is rebuilt."""
        self._stale += 1

    def _drop_stale(self) -> None:
        if self._stale > MAX_STALE and self._stale > len(self._heap) // 2:
            self._heap = [e for e in self._heap if e[1]._beat is e]
            heapq.heapify(self._heap)
            self._stale = 0

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._heap.clear()

    def _arm(self) -> None:
        heap = self._heap
        # A stale head is armed for all the same: an entry just scheduled is not its
        # session's yet, and _run tells them apart when they come up.
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if heap:
            assert self._loop is not None
            self._timer_at = heap[0][0]
            self._timer = self._loop.call_at(self._timer_at, self._run)

    def _run(self) -> None:
        self._timer = None
        heap = self._heap
        now = self.time()
        self._running = True
        try:
            while heap and heap[0][0] <= now + SLACK:
                entry = heapq.heappop(heap)
                when, session = entry
                if session._beat is not entry:
                    self._stale = max(0, self._stale - 1)
                    continue
                # Served a little early counts as on time: the session's grid holds.
                session.heartbeat_due(max(now, when))
        finally:
            self._running = False
            self._arm()
