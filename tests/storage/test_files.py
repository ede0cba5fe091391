"""What the broker writes is readable by its own user only (docs/security.md): the config
database, disk queues' segments and checkpoints, retained topics, the OpenCluster store
and the fyrehose sequence, and a start warns about what others can read."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from fqbroker.clients.fq.client import Client
from fqbroker.clients.opencluster.client import OpenClusterClient
from fqbroker.settings.broker import Settings
from fqbroker.storage.files import exposed
from tests.conftest import TIMEOUT, on, open_session, port_of, running

DISKQ = b"diskq\x00disk:permanent,backlog=-1"


@pytest.fixture
def umask_022() -> Iterator[None]:
    # The usual login umask: files 0644 and directories 0755 unless created tighter.
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def everything_under(*roots: Path) -> list[Path]:
    found: list[Path] = []
    for root in roots:
        found.append(root)
        if root.is_dir():
            found += sorted(root.rglob("*"))
    return found


async def test_every_file_and_directory_the_broker_makes_is_its_own(
    settings: Settings, umask_022: None, tmp_path: Path
) -> None:
    settings.queue_dir = tmp_path / "data" / "queues"
    settings.config_db = tmp_path / "data" / "config" / "fqd.sqlite"
    for name in ("figg", "opencluster", "fyrehose"):
        on(settings, name)
    async with running(settings) as broker:
        consumer = await open_session(broker.port, b"u", DISKQ)
        await consumer.bind(b"ex", b"prefix:")
        async with Client(port=broker.port, source="pub") as client:
            client.publish(b"ex", b"r", b"to a disk queue")
            client.publish(b"figg", b"a-topic", b"to a retained topic")
            assert await client.confirm() == 2
        await consumer.receive(1)
        await consumer.close()
        async with asyncio.timeout(TIMEOUT):
            kv = await OpenClusterClient.connect("127.0.0.1", port_of(broker, "opencluster"))
            await kv.set(b"k", b"v")
            await kv.close()
    paths = everything_under(settings.queue_dir, settings.config_db.parent)
    assert len(paths) > 10  # the queue's segment, its checkpoints, a topic, the KV store, ...
    loose = [
        f"{p.relative_to(tmp_path)} {stat.filemode(p.stat().st_mode)}"
        for p in paths
        if p.stat().st_mode & 0o077
    ]
    assert loose == []
    assert exposed(settings) == []


def test_a_start_names_what_others_can_read(
    settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings.queue_dir.mkdir(mode=0o755)
    settings.config_db.touch(mode=0o644)
    os.chmod(settings.config_db, 0o644)  # whatever the umask
    os.chmod(settings.queue_dir, 0o755)
    assert exposed(settings) == [
        f"config_db {settings.config_db} (-rw-r--r--)",
        f"queue_dir {settings.queue_dir} (drwxr-xr-x)",
    ]

    async def start() -> None:
        async with running(settings):
            pass

    with caplog.at_level(logging.WARNING, logger="fqbroker"):
        asyncio.run(start())
    warned = [r.getMessage() for r in caplog.records if "readable by other users" in r.getMessage()]
    assert len(warned) == 2 and str(settings.config_db) in warned[0]
