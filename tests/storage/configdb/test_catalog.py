"""The catalog's flush of disk stores: a flood of failed writes is one log line, not one
per publisher's flush (a full disk fails every write)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from fqbroker.core.queuespec import QueueKind, QueueSpec
from fqbroker.core.router import Router
from fqbroker.settings.broker import Settings
from fqbroker.storage.configdb.catalog import Catalog
from fqbroker.storage.configdb.state import ConfigStore
from fqbroker.storage.diskalarm import ALARM_TEXT, DiskAlarm


def nearly_full(path: Path) -> os.statvfs_result:
    # The OS's answer for a file system with 1 MiB of 1 GiB free (1-byte blocks).
    return os.statvfs_result((1, 1, 1 << 30, 1 << 20, 1 << 20, 0, 0, 0, 0, 255))


async def test_failed_writes_are_logged_once_with_a_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(config_db=tmp_path / "fqd.sqlite", queue_dir=tmp_path / "queues")
    alarm = DiskAlarm("256MiB", (tmp_path,), statvfs=nearly_full)
    catalog = Catalog(settings, Router(), ConfigStore(settings.config_db), alarm)
    try:
        queue = catalog.create(QueueSpec(b"q", QueueKind.DISK, permanent=True))
        alarm.check()
        assert alarm.raised
        caplog.set_level(logging.ERROR, "fqbroker.storage.configdb.catalog")
        lost = 0
        for i in range(100):
            queue.store.extend([b"frame %d" % i])
            lost += catalog.flush_dirty()[1]
        assert lost == 100
        [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert line.startswith("disk queue write failed in ") and ALARM_TEXT in line
    finally:
        catalog.close()
