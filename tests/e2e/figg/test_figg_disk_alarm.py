"""Figg publishers held back by the disk alarm: no ACK while free space is below
disk_free_limit, the batch published and acknowledged once it clears, nothing lost or
twice. The queue directory (and so the topics) is on a real small tmpfs
(tests/smalldisk.py) that a ballast file fills below the limit."""

from __future__ import annotations

from pathlib import Path

from fqbroker.protocols.figg.wire import Publish
from fqbroker.settings.broker import Settings
from tests.conftest import on, running
from tests.e2e.figg.test_figg import conn, publish
from tests.smalldisk import small_disk

MiB = 1 << 20


async def test_a_figg_publisher_waits_for_the_alarm_to_clear(
    settings: Settings, tmp_path: Path
) -> None:
    with small_disk(tmp_path / "disk", 16 * MiB) as disk:
        settings.queue_dir = disk / "queues"
        settings.disk_free_limit = "8MiB"
        async with running(on(settings, "figg")) as broker, conn(broker) as c:
            await publish(c, b"T", [b"before"])
            ballast = disk / "ballast"
            ballast.write_bytes(b"\0" * (12 * MiB))
            broker.disk_alarm.check()  # rather than wait for the next look, within a second
            assert broker.disk_alarm.raised
            await c.send(*(Publish(b"T", seq, b"held %d" % seq) for seq in range(1, 4)))
            await c.nothing(0.5)  # no ACK while the alarm is set
            topics = broker.topics
            assert topics is not None
            topic = topics.get(b"T")
            assert topic is not None and topic.last_offset == 1  # nothing written
            ballast.unlink()
            assert await c.ack(3) == [3]  # the alarm clears within a second: then the ACK
            assert not broker.disk_alarm.raised
            assert topic.last_offset == 4 and topic.messages_in == 4  # each once
