"""The small disk the disk-full tests use is real and small."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.smalldisk import small_disk


def test_small_disk_is_small(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", 1 << 20) as disk:
        stat = os.statvfs(disk)
        assert stat.f_blocks * stat.f_frsize == 1 << 20
        with pytest.raises(OSError, match="No space left"):
            (disk / "big").write_bytes(b"x" * (2 << 20))
