"""Failed logins per source address: how long to hold back the answer to the next one.

A client guessing passwords learns of each failure only after a delay that doubles with
every failure from its address (0.1 s, 0.2 s, ... up to ``MAX_DELAY``), and the count
halves for every ``DECAY_SECONDS`` without failures, so a user who mistyped once is
hardly slowed while a guesser drops to a few tries a minute per address. The right
password is never delayed. Memory is bounded: past ``MAX_ADDRESSES`` the address that
failed least recently is forgotten (an attacker with that many addresses is also
bounded by ``max_connections_per_address`` and the connection limits).
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable

__all__ = ["FailedLogins"]

FIRST_DELAY = 0.1
MAX_DELAY = 10.0
DECAY_SECONDS = 60.0
MAX_ADDRESSES = 4096
# The doubling stops where it reaches MAX_DELAY: 2 ** count in floating point overflows
# past about 1,024 failures, and a login that raises is never answered.
_MAX_DOUBLINGS = math.ceil(math.log2(MAX_DELAY / FIRST_DELAY))


class FailedLogins:
    """Failure counts per address, least recently failed first."""

    __slots__ = ("_clock", "_failures", "max_addresses")

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, max_addresses: int = MAX_ADDRESSES
    ) -> None:
        self._clock = clock
        self.max_addresses = max_addresses
        # address -> (failures, when the last one was)
        self._failures: collections.OrderedDict[str, tuple[float, float]] = (
            collections.OrderedDict()
        )

    def __len__(self) -> int:
        return len(self._failures)

    def failed(self, address: str) -> float:
        """Count a failure from ``address``; returns the seconds to wait before answering."""
        now = self._clock()
        count, last = self._failures.pop(address, (0.0, now))
        count = count / 2 ** ((now - last) / DECAY_SECONDS) + 1
        self._failures[address] = (count, now)
        while len(self._failures) > self.max_addresses:
            self._failures.popitem(last=False)
        return min(FIRST_DELAY * 2 ** min(count - 1, _MAX_DOUBLINGS), MAX_DELAY)

    def failures(self, address: str) -> float:
        """The decayed failure count of ``address`` now (0 when unknown)."""
        count, last = self._failures.get(address, (0.0, 0.0))
        return count / 2 ** ((self._clock() - last) / DECAY_SECONDS) if count else 0.0
