"""How the broker creates what it keeps on disk: readable and writable by its own user only.

The config database holds password hashes, and queues, topics and the key/value store
hold what clients sent: files are made 0600 and directories 0700 (tighter still if the
umask says so), and a start names what others can read (docs/security.md).
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Final

from fqbroker.settings.broker import Settings

__all__ = ["DIR_MODE", "FILE_MODE", "exposed", "private_dirs", "private_file"]

FILE_MODE: Final = 0o600
DIR_MODE: Final = 0o700


def private_dirs(path: Path) -> None:
    """Create directory ``path`` and its missing parents, each private: ``Path.mkdir``
    gives parents the default mode, whatever ``mode`` says."""
    missing = []
    while not path.exists():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=DIR_MODE)


def private_file(path: Path) -> None:
    """Create ``path`` empty and private if it does not exist: for files another library
    creates (sqlite), which then keeps the mode, its journals included."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    except FileExistsError:
        return
    os.close(fd)


def exposed(settings: Settings) -> list[str]:
    """What of the broker's state others than its user may read or enter: the config
    database and the queue directory, each as ``what path (mode)``."""
    out = []
    for what, path in (("config_db", settings.config_db), ("queue_dir", settings.queue_dir)):
        try:
            mode = path.stat().st_mode
        except OSError:
            continue
        if mode & 0o077:
            out.append(f"{what} {path} ({stat.filemode(mode)})")
    return out
