"""The disk alarm: writes refused before the disk is full (docs/reliability.md, "Disk alarm").

A broker that writes until the disk is full fails every write at once, and a log on the
same disk is cut mid-line. So, as RabbitMQ's ``disk_free_limit``, the broker watches the
free space of every file system it writes to (the queue directory, the topics and
OpenCluster stores, the config database's directory) and raises an alarm while any has
less than ``disk_free_limit``: disk stores then refuse to write (their flush raises
``ENOSPC``, as a full disk would, without writing), the OpenCluster store answers sets
``failinfo``, and the publishing sessions of Lumberjack and Figg hold their batches back
until it clears. One line is logged when it is set and one when it clears, per file
system; it clears only once the free space is :data:`CLEAR_MARGIN` above the limit, so a
disk hovering at the limit does not make it flap.

:class:`Watermark` is the rule, sans I/O: readings in, changes out. :class:`DiskAlarm` is
its shell: ``os.statvfs`` every :data:`CHECK_SECONDS`, and at once after a failed write.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from fqbroker.settings.broker import free_limit

__all__ = [
    "ALARM_TEXT",
    "CHECK_SECONDS",
    "CLEAR_MARGIN",
    "Change",
    "DiskAlarm",
    "Reading",
    "Watermark",
]

log = logging.getLogger(__name__)

ALARM_TEXT = "free space below disk_free_limit"  # the refused write's strerror
CHECK_SECONDS = 1.0  # between two looks at the free space
CLEAR_MARGIN = 0.1  # the alarm clears at this much above the limit (a tenth)


@dataclass(frozen=True, slots=True)
class Reading:
    """One look at a file system: the first directory watched on it, its free bytes (for
    unprivileged writers: ``f_bavail``) and its size."""

    path: Path
    free: int
    total: int


@dataclass(frozen=True, slots=True)
class Change:
    """The alarm of one file system was set (``raised``) or cleared."""

    raised: bool
    path: Path
    free: int
    limit: int


class Watermark:
    """The alarm's rule, sans I/O: per file system (by device), set below the limit,
    cleared at :data:`CLEAR_MARGIN` above it; a change is reported once each way.

    ``limit``: bytes; ``fraction``: a share of each file system's size instead (a
    ``disk_free_limit`` of "5%"); both 0: never set.
    """

    __slots__ = ("_below", "fraction", "limit", "readings")

    def __init__(self, limit: int, fraction: float = 0.0) -> None:
        self.limit = limit
        self.fraction = fraction
        self._below: set[int] = set()  # devices in alarm
        self.readings: dict[int, Reading] = {}  # the latest, by device

    @property
    def raised(self) -> bool:
        return bool(self._below)

    def limit_of(self, total: int) -> int:
        """The limit on a file system of ``total`` bytes."""
        return int(total * self.fraction) if self.fraction else self.limit

    def observe(self, device: int, reading: Reading) -> Change | None:
        """Take a reading of the file system ``device``; the change it makes, if any."""
        self.readings[device] = reading
        limit = self.limit_of(reading.total)
        if device in self._below:
            if reading.free < limit + int(limit * CLEAR_MARGIN):
                return None
            self._below.discard(device)
            return Change(False, reading.path, reading.free, limit)
        if reading.free >= limit:
            return None
        self._below.add(device)
        return Change(True, reading.path, reading.free, limit)


class DiskAlarm:
    """One broker's disk alarm: :class:`Watermark` over ``os.statvfs`` of the directories
    it is told of (:meth:`watch`), looked at every :data:`CHECK_SECONDS` once
    :meth:`start`-ed. Stores ask :attr:`raised` before they write and :meth:`refused`
    gives them the error; sessions that hold publishers back await :meth:`wait_clear`."""

    def __init__(
        self,
        setting: int | str,
        paths: Iterable[Path] = (),
        *,
        statvfs: Callable[[Path], os.statvfs_result] = os.statvfs,
    ) -> None:
        self.watermark = Watermark(*free_limit(setting))
        self.paths: list[Path] = []
        for path in paths:
            self.watch(path)
        self._statvfs = statvfs
        self.refusals = 0  # writes refused while raised: messages, or OpenCluster batches
        self._timer: asyncio.TimerHandle | None = None
        self._soon: asyncio.Handle | None = None
        self._clear: asyncio.Event | None = None  # made by the first that waits

    @property
    def enabled(self) -> bool:
        return bool(self.watermark.limit or self.watermark.fraction)

    @property
    def raised(self) -> bool:
        return self.watermark.raised

    def watch(self, path: Path) -> None:
        """Watch the file system ``path`` is on (or will be: it may not exist yet)."""
        if path not in self.paths:
            self.paths.append(path)

    def readings(self) -> list[tuple[Reading, int]]:
        """Each file system's latest reading and its limit, in the order first watched."""
        mark = self.watermark
        return [(r, mark.limit_of(r.total)) for r in mark.readings.values()]

    # --- refusing -------------------------------------------------------------------------

    def refused(self, count: int = 1) -> OSError:
        """The error a write refused while raised fails with: ENOSPC, as a full disk."""
        self.refusals += count
        return OSError(errno.ENOSPC, ALARM_TEXT)

    async def wait_clear(self) -> None:
        """Return once the alarm is not raised (at once if it is not)."""
        while self.raised:
            if self._clear is None:
                self._clear = asyncio.Event()
            await self._clear.wait()

    # --- looking --------------------------------------------------------------------------

    def check(self) -> None:
        """Look at every watched file system now (each once, however many directories on it
        are watched); log and act on the changes."""
        seen: set[int] = set()
        for path in self.paths:
            # A directory not made yet (a store makes it when it opens): the file system
            # it will be on, its nearest parent's.
            where = path
            while not where.exists() and where.parent != where:
                where = where.parent
            try:
                device = os.stat(where).st_dev
                if device in seen:
                    continue
                seen.add(device)
                vfs = self._statvfs(where)
            except OSError:
                continue  # gone meanwhile, or not ours to look at: the next look tells
            reading = Reading(path, vfs.f_bavail * vfs.f_frsize, vfs.f_blocks * vfs.f_frsize)
            change = self.watermark.observe(device, reading)
            if change is not None:
                self._changed(change)

    def _changed(self, change: Change) -> None:
        if change.raised:
            log.warning(
                "disk alarm set: %s has %d bytes free, below disk_free_limit (%d bytes);"
                " publishers into disk queues and topics are refused or held back until"
                " it clears", change.path, change.free, change.limit,
            )  # fmt: skip
            return
        log.warning(
            "disk alarm cleared: %s has %d bytes free (disk_free_limit %d bytes);"
            " publishing resumes", change.path, change.free, change.limit,
        )  # fmt: skip
        if not self.raised and self._clear is not None:
            self._clear.set()
            self._clear = None

    def start(self) -> None:
        """Look now, then every :data:`CHECK_SECONDS` (nothing at all when off)."""
        if not self.enabled:
            return
        self.check()
        self._timer = asyncio.get_running_loop().call_later(CHECK_SECONDS, self._tick)

    def _tick(self) -> None:
        self.check()
        self._timer = asyncio.get_running_loop().call_later(CHECK_SECONDS, self._tick)

    def failed(self) -> None:
        """A write failed: look again at once (on the loop's next turn), not in a second."""
        if self._timer is None or self._soon is not None:
            return
        self._soon = asyncio.get_running_loop().call_soon(self._checked_soon)

    def _checked_soon(self) -> None:
        self._soon = None
        self.check()

    def stop(self) -> None:
        for handle in (self._timer, self._soon):
            if handle is not None:
                handle.cancel()
        self._timer = self._soon = None
        if self._clear is not None:  # waiters end with their sessions, closed already
            self._clear.set()
            self._clear = None
