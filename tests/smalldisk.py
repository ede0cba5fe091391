"""A real small file system for disk-full tests: a tmpfs of a given size.

Mounting needs root (CI runs as root). Elsewhere the test is skipped, except under
``CI`` where a missing tmpfs is an error: a disk-full test that never runs proves nothing.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["small_disk"]


@contextlib.contextmanager
def small_disk(where: Path, size: int) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` bytes at ``where`` (made if missing) for the block."""
    where.mkdir(parents=True, exist_ok=True)
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mount.returncode != 0:
        reason = f"cannot mount a tmpfs: {mount.stderr.strip() or mount.returncode}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield where
    finally:
        # Lazy: a child that has not quite exited must not make the test fail here.
        subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)
