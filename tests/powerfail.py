"""A simulated power cut for a broker child process: the disk keeps only what was fsynced.

kill -9 keeps the page cache, so a crash test cannot tell a confirm sent after the covering
fsync from one sent before it. This module keeps, beside the real files under one directory
tree (a broker's ``queue_dir``), a *shadow* of what a power cut would leave of them, and
rebuilds the tree from the shadow after the broker was killed.

The model, at the OS boundary (the broker's own code is not touched)
---------------------------------------------------------------------
* A file's durable content is its content when an ``fsync``/``fdatasync`` of it was
  called, taken when the call starts (data written while it runs is not covered) and
  kept only once the real call has returned without error. A file never fsynced is empty.
* A directory's durable entries (name -> file or directory) are its entries when it was
  last fsynced. A file created, renamed or unlinked since then is back as it was at that
  fsync; a directory never fsynced is empty. So a new file needs an fsync of its
  directory, and a rename an fsync of the file before it and of the directory after it,
  exactly as POSIX requires and as the segment log claims to do (docs/disk-format.md).
* Everything under the tree when the layer is installed is durable (it is what the disk
  held at start-up, perhaps after an earlier cut).
* Files are told apart by identity, not number: a new file or directory gets a new one
  even if the kernel reuses a freed inode number.

Only ``os.fsync``, ``os.fdatasync``, ``os.open`` and ``os.mkdir`` are wrapped (the last two
to see new inodes), before fqbroker is imported, since the segment log keeps its own
reference to ``fdatasync``. Outside the tree (the sqlite configuration database, which
sqlite fsyncs itself) nothing is modelled: it keeps what kill -9 left.

:func:`power_cut` rebuilds the tree from the shadow. With ``rng`` it models a kernel that
had written back part of what was not fsynced, in order: each file whose current content
extends its durable content keeps a random part of the extension (a torn tail).

``python -m tests.powerfail ROOT SHADOW [--lie] [--slow] -- <fqd arguments>`` runs fqd
with the layer. ``--lie`` makes every fsync of a segment file (``*.seg``) return success
without syncing anything, the OS-level picture of a broker that confirms before its fsync:
the test that uses it shows the cut catches such a broker. ``--slow`` makes every fsync of
a file under the tree take 20 ms more (a slow disk): a broker that answered before its fsync
returned is then almost surely killed before the fsync is kept, where a fast disk would
often hide it; a broker that waits is only slower.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import stat
import sys
import threading
import time
from pathlib import Path

__all__ = ["install", "power_cut"]

_real_fsync = os.fsync
_real_fdatasync = os.fdatasync
_real_open = os.open
_real_mkdir = os.mkdir


class _Shadow:
    """The durable picture of the tree under ``root``, kept in ``shadow``.

    ``files/<id>`` is a file's durable content, ``dirs/<id>.json`` a directory's durable
    entries ({name: [id, "d" or "f"]}), ``root.json`` the root's id. Every update is a
    write to a temporary file and a rename, so a kill -9 mid-update keeps the old picture:
    the fsync it belonged to had not returned either.
    """

    def __init__(self, root: Path, shadow: Path, *, lie: bool, slow: float) -> None:
        self.root = str(root.resolve())
        self.shadow = shadow
        self.lie = lie
        self.slow = slow
        self.ids: dict[tuple[int, int], int] = {}  # (device, inode) -> identity
        self._next = itertools.count(1)
        self.lock = threading.Lock()
        shutil.rmtree(shadow, ignore_errors=True)
        (shadow / "files").mkdir(parents=True)
        (shadow / "dirs").mkdir()
        self._snapshot_tree(Path(self.root))
        self._put(shadow / "root.json", json.dumps({"id": self._id(os.stat(self.root))}))

    def _id(self, st: os.stat_result, *, new: bool = False) -> int:
        key = (st.st_dev, st.st_ino)
        if new or key not in self.ids:
            self.ids[key] = next(self._next)
        return self.ids[key]

    def _put(self, path: Path, data: bytes | str) -> None:
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
        os.rename(tmp, path)

    def _snapshot_tree(self, directory: Path) -> None:
        self._snapshot_dir(str(directory))
        for entry in os.scandir(directory):
            if entry.is_dir(follow_symlinks=False):
                self._snapshot_tree(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                self._put(self.shadow / "files" / str(self._id(st)), Path(entry.path).read_bytes())

    def _snapshot_dir(self, path: str) -> None:
        target, listing = self._listing(path)
        self._put(target, listing)

    def _listing(self, path: str) -> tuple[Path, str]:
        """Where the directory's durable entries go, and what they are now."""
        listing = {}
        for entry in os.scandir(path):
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                listing[entry.name] = [self._id(st), "d"]
            elif stat.S_ISREG(st.st_mode):
                listing[entry.name] = [self._id(st), "f"]
        dir_id = self._id(os.stat(path))
        return self.shadow / "dirs" / f"{dir_id}.json", json.dumps(listing)

    def tracked(self, path: str) -> bool:
        return path == self.root or path.startswith(self.root + os.sep)

    def fsync(self, fd: int, real: object) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if not self.tracked(path):
            real(fd)  # type: ignore[operator]
            return
        with self.lock:
            st = os.fstat(fd)
            if self.lie and path.endswith(".seg"):
                return  # "synced"
            # What the page cache holds as the call starts: only that is promised.
            if stat.S_ISDIR(st.st_mode):
                target, listing = self._listing(path)
                tmp = target.with_name(target.name + ".tmp")
                tmp.write_text(listing)
            else:
                target = self.shadow / "files" / str(self._id(st))
                tmp = target.with_name(target.name + ".tmp")
                with open(f"/proc/self/fd/{fd}", "rb") as src, open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst)
            try:
                real(fd)  # type: ignore[operator]
                time.sleep(self.slow)
            except BaseException:
                tmp.unlink()
                raise
            os.rename(tmp, target)

    def created(self, path: str) -> None:
        """A new file or directory at ``path``: a new identity, nothing durable yet."""
        with self.lock:
            self._id(os.stat(path), new=True)


_shadow: _Shadow | None = None


def install(root: Path, shadow: Path, *, lie: bool = False, slow: float = 0.0) -> None:
    """Wrap the os functions for this process; call before importing fqbroker."""
    global _shadow
    _shadow = s = _Shadow(root, shadow, lie=lie, slow=slow)

    def fsync(fd: int) -> None:
        s.fsync(fd, _real_fsync)

    def fdatasync(fd: int) -> None:
        s.fsync(fd, _real_fdatasync)

    def open_(path, flags, mode=0o777, *, dir_fd=None):  # type: ignore[no-untyped-def]
        new = bool(flags & os.O_CREAT) and dir_fd is None and not os.path.lexists(path)
        fd = _real_open(path, flags, mode, dir_fd=dir_fd)
        if new and s.tracked(os.path.abspath(path)):
            s.created(os.path.abspath(path))
        return fd

    def mkdir(path, mode=0o777, *, dir_fd=None):  # type: ignore[no-untyped-def]
        _real_mkdir(path, mode, dir_fd=dir_fd)
        if dir_fd is None and s.tracked(os.path.abspath(path)):
            s.created(os.path.abspath(path))

    os.fsync, os.fdatasync, os.open, os.mkdir = fsync, fdatasync, open_, mkdir


def power_cut(root: Path, shadow: Path, rng: random.Random | None = None) -> dict[str, int]:
    """Replace the tree under ``root`` (its broker killed) by what the disk kept.

    Returns, for each file of the current tree, how many of its bytes were lost.
    """
    files, dirs = shadow / "files", shadow / "dirs"
    staging = root.with_name(root.name + ".cut")
    shutil.rmtree(staging, ignore_errors=True)

    def build(dir_id: int, dest: Path, current: Path) -> None:
        dest.mkdir()
        listing_path = dirs / f"{dir_id}.json"
        listing = json.loads(listing_path.read_text()) if listing_path.exists() else {}
        for name, (child, kind) in listing.items():
            if kind == "d":
                build(child, dest / name, current / name)
                continue
            durable = files / str(child)
            data = durable.read_bytes() if durable.exists() else b""
            now = current / name
            if rng is not None and now.is_file():
                extended = now.read_bytes()
                if len(extended) > len(data) and extended.startswith(data):
                    data = extended[: rng.randint(len(data), len(extended))]
            (dest / name).write_bytes(data)

    root_id = json.loads((shadow / "root.json").read_text())["id"]
    build(root_id, staging, root)
    lost = {}
    for path in root.rglob("*"):
        if path.is_file():
            kept = staging / path.relative_to(root)
            lost[str(path.relative_to(root))] = path.stat().st_size - (
                kept.stat().st_size if kept.is_file() else 0
            )
    shutil.rmtree(root)
    staging.rename(root)
    return lost


def main(argv: list[str]) -> int:
    split = argv.index("--")
    options, fqd_args = argv[:split], argv[split + 1 :]
    flags = {"--lie", "--slow"}
    root, shadow = (Path(a) for a in options if a not in flags)
    install(root, shadow, lie="--lie" in options, slow=0.02 if "--slow" in options else 0.0)
    from fqbroker.cli.fqd import fqd

    return fqd(fqd_args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
