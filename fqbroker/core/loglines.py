"""Rate-limited log lines: a flood of one kind of line costs a counter, not a log.

Bad input, refusals and failing writes can each come thousands of times a second (a full
disk fails every write); :class:`LogLimiter` lets a few lines of each kind out and says
how many it held back. The front ends' limits (kit/limits.py) and the storage's failing
writes share it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["LogLimiter"]


class LogLimiter:
    """At most ``lines`` log lines per kind in any ``period`` seconds.

    Lines over the limit are dropped and counted; the next line of that kind that goes
    out ends with how many were dropped. Nothing is kept per event, so a flood costs a
    counter, not memory.
    """

    def __init__(
        self,
        logger: logging.Logger,
        lines: int = 5,
        period: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.lines = lines
        self.period = period
        self._clock = clock
        # kind -> [start of the current period, lines in it, lines dropped since the last]
        self._state: dict[str, list[float]] = {}

    def log(self, level: int, kind: str, msg: str, *args: object) -> bool:
        """Log ``msg % args`` unless ``kind`` is over its limit; whether it went out."""
        if not self.logger.isEnabledFor(level):
            return False
        now = self._clock()
        state = self._state.get(kind)
        if state is None:
            state = self._state[kind] = [now, 0, 0]
        elif now - state[0] >= self.period:
            state[0], state[1] = now, 0
        if state[1] >= self.lines:
            state[2] += 1
            return False
        state[1] += 1
        if state[2]:
            msg += " (%d similar lines suppressed)"
            args = (*args, int(state[2]))
            state[2] = 0
        self.logger.log(level, msg, *args)
        return True
