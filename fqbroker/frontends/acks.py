"""Acknowledgements a session owes its client, sent in order once they are true.

A front end whose protocol acknowledges what it took in (Lumberjack's ACK, Figg's ACK)
promises with each one that the messages before it are routed, and on disk where a disk
queue or a topic took them (docs/lumberjack.md, docs/figg.md). :class:`DurableAcks` keeps
that promise for any of them: the session says what it owes after how many messages
(:meth:`DurableAcks.owe`) and calls :meth:`DurableAcks.ready` whenever its publisher may
have moved on; the tokens come back through ``send`` in order, each once its messages are
handled by the publisher and :meth:`~fqbroker.core.publisher.Publisher.durable`. A disk
write or fsync that failed for one of them calls ``failed`` instead, and nothing after it
is sent: the client sends those messages again.

It is the one place this logic lives; it owns at most one task, the wait for durability.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from fqbroker.core.publisher import Publisher

__all__ = ["DurableAcks"]

T = TypeVar("T")


class DurableAcks(Generic[T]):
    """What one session owes, oldest first: (token, messages handled when it is due)."""

    __slots__ = ("_closed", "_failed", "_marks", "_publisher", "_resume", "_send", "_waiting")

    def __init__(
        self,
        publisher: Publisher,
        send: Callable[[list[T]], None],
        failed: Callable[[], None],
        resume: Callable[[], None],
    ) -> None:
        """``send`` writes the tokens now due; ``failed`` ends the session after a lost
        write; ``resume`` is called once a wait for durability is over (the session's own
        way to acknowledge more and to finish)."""
        self._publisher = publisher
        self._send = send
        self._failed = failed
        self._resume = resume
        self._marks: deque[tuple[T, int]] = deque()
        self._waiting: asyncio.Future[None] | None = None
        self._closed = False

    def owe(self, token: T, through: int) -> None:
        """``token`` is due once the session's first ``through`` messages are handled."""
        self._marks.append((token, through))

    def __len__(self) -> int:
        return len(self._marks)

    @property
    def waiting(self) -> bool:
        """Whether a wait for durability is under way."""
        return self._waiting is not None

    def ready(self) -> None:
        """Send what is due, or start waiting until it is durable, or fail."""
        if self._waiting is not None or self._closed:
            return
        marks = self._marks
        publisher = self._publisher
        handled = publisher.handled
        if not marks or marks[0][1] > handled:
            return
        failed = publisher.failed_from
        if failed is not None and failed <= marks[0][1]:
            self._failed()
        elif publisher.written:
            self._waiting = asyncio.ensure_future(self._durable_then_send(handled))
        else:
            self._send_through(handled)

    async def _durable_then_send(self, handled: int) -> None:
        ok = await self._publisher.durable()
        self._waiting = None
        if self._closed:
            return
        if not ok:
            self._failed()
            return
        self._send_through(handled)
        self._resume()  # more may have been routed meanwhile

    def _send_through(self, handled: int) -> None:
        marks = self._marks
        due = []
        while marks and marks[0][1] <= handled:
            due.append(marks.popleft()[0])
        if due:
            self._send(due)

    def close(self) -> None:
        """The session ended: nothing more is sent, and the wait (if any) is cancelled."""
        self._closed = True
        if self._waiting is not None:
            self._waiting.cancel()
            self._waiting = None
        self._marks.clear()
