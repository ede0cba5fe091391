"""Disk queues that were damaged, and survive it (docs/disk-format.md, "Recovery"): a
missing or unknown FORMAT file, damaged checkpoints, a damaged record at start-up or while
running, a damaged segment among several. The undamaged cases: test_store.py."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path

import pytest

from fqbroker.core.message import Message
from fqbroker.protocols.fq import wire
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from fqbroker.storage.configdb import checkpoints
from fqbroker.storage.segments import log as segmentlog
from fqbroker.storage.store import disk_log, queue_directory
from tests.conftest import authenticate, open_session, wait_for
from tests.storage.test_store import DISKQ, leave_waiting


def _flip(path: Path, at: int) -> None:
    with path.open("r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x10]))


def _record_offsets(segment: Path) -> list[int]:
    data, off, starts = segment.read_bytes(), 0, []
    while off + segmentlog.HEADER_SIZE <= len(data):
        starts.append(off)
        off += segmentlog.HEADER_SIZE + int.from_bytes(data[off + 4 : off + 8], "big")
    return starts


async def _corrupt_total(broker: Broker, queue: str) -> tuple[float, float]:
    from prometheus_client.parser import text_string_to_metric_families

    from tests.e2e.http.test_http import get

    response, body = await get(broker.port, "/metrics")
    assert response.status_code == 200
    found = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.name.startswith("fq_queue_corrupt_") and s.labels == {"queue": queue}:
                found[s.name] = s.value
    return found["fq_queue_corrupt_records_total"], found["fq_queue_corrupt_bytes_total"]


async def test_a_missing_format_file_keeps_the_queue_and_its_bindings(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    await leave_waiting(settings, [b"%d" % i for i in range(10)])
    directory = queue_directory(settings.queue_dir, b"diskq")
    (directory / "FORMAT").unlink()
    with caplog.at_level(logging.ERROR, logger="fqbroker"):
        async with Broker(settings) as broker:
            assert broker.established == (1, 1, 1)  # the queue and its binding are back
            assert broker.queues[b"diskq"].backlog == 10
            s = await open_session(broker.port, b"u", DISKQ)
            publisher = await open_session(broker.port)
            await publisher.publish(b"ex", b"r", b"after")  # through the restored binding
            got = await s.receive(11)
            assert [m.payload for m in got] == [b"%d" % i for i in range(10)] + [b"after"]
            await s.close()
            await publisher.close()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "FORMAT file missing; rewritten" in errors[0], errors
    assert (directory / "FORMAT").read_text() == "fqbroker-segmentlog 2\n"


async def test_a_queue_that_cannot_be_opened_is_refused_with_a_reason(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """Not a traceback and a closed connection: an error reply, and the queue's row and
    binding stay in the config store for when the directory is put right."""
    await leave_waiting(settings, [b"x"])
    directory = queue_directory(settings.queue_dir, b"diskq")
    (directory / "FORMAT").write_text("fqbroker-segmentlog 99\n")
    async with Broker(settings) as broker:
        assert b"diskq" not in broker.queues
        bad = await authenticate(broker.port, b"u", DISKQ)
        assert await bad.frame() == wire.ErrorReply("initialization of disk queue failed")
        await bad.closed()
    assert "Traceback" not in caplog.text
    assert any("fqbroker-segmentlog 99" in r.getMessage() for r in caplog.records)
    (directory / "FORMAT").write_text("fqbroker-segmentlog 2\n")
    async with Broker(settings) as broker:
        assert broker.established == (1, 1, 1)
        assert broker.queues[b"diskq"].backlog == 1


@pytest.mark.parametrize("damage", ["header", "every slot"])
async def test_a_damaged_checkpoints_file_redelivers_rather_than_loses(
    settings: Settings, damage: str
) -> None:
    await leave_waiting(settings, [b"%d" % i for i in range(10)])
    async with Broker(settings) as broker:
        s = await open_session(broker.port, b"u", DISKQ)
        assert len(await s.receive(10)) == 10
        log = disk_log(broker.queues[b"diskq"])
        await wait_for(lambda: log.checkpoints.get("fq") == 11)
        await s.close()
        await wait_for(lambda: not broker.queues[b"diskq"].clients)
        log.set_checkpoint("fq", 5, durable=True)  # as if 6 were still to be acknowledged
        checkpoints.add_checkpoint(broker, "replay", "diskq", "0:3")
    path = queue_directory(settings.queue_dir, b"diskq") / "checkpoints"
    data = bytearray(path.read_bytes())
    if damage == "header":
        data[0] ^= 0xFF
    else:
        size = int.from_bytes(data[8:12], "big")
        for slot in range(3):
            data[4096 + slot * size : 4096 + slot * size + 16] = bytes(16)
    path.write_bytes(bytes(data))
    async with Broker(settings) as broker:
        log = disk_log(broker.queues[b"diskq"])
        (report,) = log.recovery
        assert "checkpoints" in report.reason
        s = await open_session(broker.port, b"u", DISKQ)
        if damage == "header":  # the slots are intact: the positions survive
            assert dict(log.checkpoints) == {"fq": 5, "replay": 3}
            expected = list(range(4, 10))
        else:  # nothing to go on: from the first message again, never past one
            assert dict(log.checkpoints) == {}
            expected = list(range(10))
        got = await s.receive(len(expected))
        assert [m.payload for m in got] == [b"%d" % i for i in expected]
        await s.close()


async def test_a_damaged_record_is_skipped_and_counted_at_startup(settings: Settings) -> None:
    await leave_waiting(settings, [b"message %d" % i for i in range(10)])
    (segment,) = sorted(queue_directory(settings.queue_dir, b"diskq").glob("*.seg"))
    _flip(segment, _record_offsets(segment)[3] + 30)  # the 4th message
    async with Broker(settings) as broker:
        assert broker.queues[b"diskq"].backlog == 9  # what can be delivered
        records, damaged_bytes = await _corrupt_total(broker, "diskq")
        assert records == 1 and damaged_bytes > 0
        s = await open_session(broker.port, b"u", DISKQ)
        got = await s.receive(9)
        assert [m.payload for m in got] == [b"message %d" % i for i in range(10) if i != 3]
        assert [frame_seq_of(m) for m in got] == [1, 2, 3, 5, 6, 7, 8, 9, 10]
        await s.close()


def frame_seq_of(message: Message) -> int:
    return int.from_bytes(message.msgid[8:], "big")


async def test_a_bit_flip_while_running_is_never_delivered(settings: Settings) -> None:
    await leave_waiting(settings, [b"message %d" % i for i in range(10)])
    (segment,) = sorted(queue_directory(settings.queue_dir, b"diskq").glob("*.seg"))
    starts = _record_offsets(segment)
    async with Broker(settings) as broker:  # nothing in memory: the consumer reads the file
        assert await _corrupt_total(broker, "diskq") == (0, 0)
        _flip(segment, starts[6] + 40)  # the 7th message rots after the queue was opened
        s = await open_session(broker.port, b"u", DISKQ)
        got = await s.receive(9)
        assert [m.payload for m in got] == [b"message %d" % i for i in range(10) if i != 6]
        assert await _corrupt_total(broker, "diskq") == (1, starts[7] - starts[6])
        assert broker.queues[b"diskq"].backlog == 0
        directory = queue_directory(settings.queue_dir, b"diskq")
        assert (directory / "damaged" / f"{segment.name}@{starts[6]}").exists()
        await s.close()


async def test_a_replay_read_of_a_range_ends_at_its_end_past_a_skipped_record(
    settings: Settings,
) -> None:
    await leave_waiting(settings, [b"message %d" % i for i in range(10)])
    (segment,) = sorted(queue_directory(settings.queue_dir, b"diskq").glob("*.seg"))
    _flip(segment, _record_offsets(segment)[4] + 30)  # seq 5
    async with Broker(settings) as broker:
        from fqbroker.protocols.replay import decode_entries
        from tests.e2e.http.test_replay import get

        for start, stop, seqs in (
            (5, 6, []),
            (4, 6, [4]),
            (5, 8, [6, 7]),
            (3, 11, [3, 4, 6, 7, 8, 9, 10]),
        ):
            target = f"/queue/read?queue=diskq&from={start}&to={stop}"
            status, _, body = await asyncio.to_thread(get, broker.port, target)
            assert status == 200, body
            assert [e.seq for e in decode_entries(body)] == seqs, (start, stop)


async def test_a_flipped_byte_in_the_first_of_six_segments_loses_one_message(
    settings: Settings,
) -> None:
    """The issue's case through a broker: on dea3d4e the five later segments were deleted
    (the messages in them gone); now exactly the damaged message is missing."""
    settings = dataclasses.replace(settings, segment_bytes=8192)
    payloads = [b"message %04d" % i for i in range(600)]
    await leave_waiting(settings, payloads)
    files = sorted(queue_directory(settings.queue_dir, b"diskq").glob("*.seg"))
    assert len(files) >= 6
    _flip(files[0], _record_offsets(files[0])[20] + 40)  # seq 21
    async with Broker(settings) as broker:
        assert broker.queues[b"diskq"].backlog == 599
        s = await open_session(broker.port, b"u", DISKQ)
        got = await s.receive(599)
        assert [m.payload for m in got] == payloads[:20] + payloads[21:]
        await s.close()
