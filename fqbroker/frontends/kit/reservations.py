"""What every front end's reservations of the memory budget share (docs/memory.md).

A connection reserves budget for a message that is still arriving, from the moment its
size is known. Three rules keep such reservations from holding the budget hostage:

* **Caps.** A reservation goes through the connection's
  :class:`~fqbroker.core.budget.Share`: at most ``max_reserved_per_connection`` for one
  connection (a message needing more is refused, never waited for), and at most
  ``max_reserved_per_user`` for all of one user's connections (past it the connection
  waits for its user's own earlier reservations, and only it waits).
* **Who.** Under ``auth = "password"`` a connection that has not said who it is (a
  listener opened with ``anonymous = true``) reserves nothing (:func:`may_reserve`): it
  may hold a partial frame of one read (:data:`UNRESERVED`, the slack docs/memory.md
  allows every socket), no more. One a client certificate named reserves as its user.
* **Time.** A partial message whose bytes stop arriving for ``partial_message_seconds``
  closes its connection, which gives its reservation back (:class:`StallWatch`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fqbroker.settings.broker import Settings

__all__ = ["UNRESERVED", "StallWatch", "may_reserve"]

# A partial frame a connection that may not reserve may still hold: one ordinary read,
# which no socket's reservation counts anyway.
UNRESERVED = 256 << 10


def may_reserve(settings: Settings, user: object) -> bool:
    """Whether a connection of ``user`` (None: it has not said who it is) may reserve."""
    return user is not None or settings.auth != "password"


class StallWatch:
    """Calls ``expire`` once a connection's partial message has made no progress for
    ``seconds`` (0: never).

    Armed when a reservation is made; no timer per read: every ``seconds`` it compares
    ``progress()`` (something that changes as bytes of the partial message arrive, such
    as how many are buffered) with what it was the time before. ``progress()`` returning
    None stops it: nothing partial is held, or the broker itself holds the connection
    back (a full queue, the budget), which is no fault of the sender. So a stalled
    message is closed between ``seconds`` and twice that after its last byte.
    """

    __slots__ = ("_expire", "_handle", "_mark", "_progress", "seconds")

    def __init__(
        self,
        seconds: float,
        progress: Callable[[], Hashable | None],
        expire: Callable[[], None],
    ) -> None:
        self.seconds = seconds
        self._progress = progress
        self._expire = expire
        self._handle: asyncio.TimerHandle | None = None
        self._mark: Hashable | None = None

    def arm(self) -> None:
        """A reservation is held for a partial message: watch it (if not already)."""
        if self._handle is None and self.seconds > 0:
            self._mark = self._progress()
            self._handle = asyncio.get_running_loop().call_later(self.seconds, self._check)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _check(self) -> None:
        self._handle = None
        mark = self._progress()
        if mark is None:
            return
        if mark == self._mark:
            self._expire()
            return
        self.arm()
