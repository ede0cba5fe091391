"""One broker per store: fqd holds an exclusive lock on its queue directory and its
config database for as long as it runs.

Two brokers on one store each keep their own idea of every queue's next record and
write over each other's: messages both confirmed are gone after a restart. So fqd takes
``flock(LOCK_EX | LOCK_NB)`` on ``<queue_dir>/.fqbroker.lock`` and on
``<config_db>.lock`` before it opens anything, and a second fqd on either refuses to
start, naming the holder's pid (the file holds it). The kernel drops the lock when the
holder exits, however it exits (kill -9 too); the pid left in the file then is stale and
harmless, since the lock, not the file, says who holds the store. The file is never
removed: unlinking a lock file races with whoever opens it next.

Only fqd locks: ``fq-admin -c DB`` opens a running broker's database as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from fqbroker.errors import StoreInUse
from fqbroker.settings.broker import Settings
from fqbroker.storage.files import FILE_MODE

__all__ = ["LOCK_NAME", "StoreLock", "held", "lock_files"]

LOCK_NAME: Final = ".fqbroker.lock"

_ADVICE = "give this one its own data directory (--data-dir, or -c and -q) or stop the other"


class StoreLock:
    """An exclusive lock on ``path`` (created 0600), held until :meth:`release`; raises
    :class:`StoreInUse` naming ``what`` and the holder's pid when another holds it."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self._fd: int | None = None
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _holder(fd)
            os.close(fd)
            who = f"pid {pid}" if pid is not None else "pid unknown"
            raise StoreInUse(f"{what} is in use by another fqd ({who}): {_ADVICE}", pid) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        # Ours now: the pid is for the one refused, never read to decide anything.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the last descriptor of the file drops the lock


def _holder(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0)
        return int(text.strip() or b"x")
    except (OSError, ValueError):
        return None  # written a moment after the lock was taken: not yet there


def lock_files(settings: Settings) -> list[tuple[Path, str]]:
    """The lock files of a broker's store, each with what it guards (as said when in use)."""
    return [
        (settings.queue_dir / LOCK_NAME, f"{settings.queue_dir}"),
        (
            settings.config_db.with_name(settings.config_db.name + ".lock"),
            f"config database {settings.config_db}",
        ),
    ]


@contextlib.contextmanager
def held(settings: Settings) -> Iterator[list[StoreLock]]:
    """Lock the queue directory and the config database (their directories exist) for the
    ``with`` body; none is held if one is refused."""
    with contextlib.ExitStack() as stack:
        locks = []
        for path, what in lock_files(settings):
            lock = StoreLock(path, what)
            stack.callback(lock.release)
            locks.append(lock)
        yield locks
