"""Disk queues in a running broker: delivery, restart, confirms, checkpoints, block policy,
failed fsyncs."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path

import pytest

from fqbroker.clients.fq.client import Client, ClientError
from fqbroker.core.frames import frame_seq
from fqbroker.core.message import Message
from fqbroker.protocols.fq import wire
from fqbroker.protocols.fq.msgdecoder import MessageDecoder
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from fqbroker.storage import store
from fqbroker.storage.configdb import checkpoints
from fqbroker.storage.segments import log as segmentlog
from fqbroker.storage.store import disk_log, queue_directory
from tests.conftest import FailingFsync, authenticate, open_session, wait_for

DISKQ = b"diskq\x00disk:permanent,backlog=-1"


async def test_disk_queue_delivers_and_carries_position_in_msgid(broker: Broker) -> None:
    consumer = await open_session(broker.port, b"u", DISKQ)
    await consumer.bind(b"ex", b"prefix:")
    publisher = await open_session(broker.port)
    for i in range(5):
        await publisher.publish(b"ex", b"r", b"m%d" % i)
    got = await consumer.receive(5)
    assert [m.payload for m in got] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert [int.from_bytes(m.msgid[8:], "big") for m in got] == [1, 2, 3, 4, 5]
    assert [m.sender for m in got] == [b"user"] * 5
    assert (queue_directory(broker.settings.queue_dir, b"diskq") / "FORMAT").exists()
    await consumer.close()
    await publisher.close()


async def test_disk_queue_and_mem_queue_survive_restart(settings: Settings) -> None:
    async with Broker(settings) as broker:
        disk = await open_session(broker.port, b"u", DISKQ)
        await disk.bind(b"ex", b"prefix:", 0x0110)
        mem = await open_session(broker.port, b"u", b"memq\x00mem:permanent")
        await mem.bind(b"ex", b"prefix:", 0x0110)
        await disk.close()
        await mem.close()
        await wait_for(lambda: not broker.queues[b"diskq"].clients)
        publisher = await open_session(broker.port)
        for i in range(100):
            await publisher.publish(b"ex", b"r", b"%d" % i)
        await wait_for(lambda: broker.queues[b"diskq"].backlog == 100)
        await publisher.close()
    async with Broker(settings) as broker:
        assert broker.established == (1, 2, 2)
        assert broker.queues[b"diskq"].backlog == 100
        assert broker.queues[b"memq"].backlog == 0  # memory contents die with the process
        disk = await open_session(broker.port, b"u", DISKQ)
        got = await disk.receive(100)
        assert [m.payload for m in got] == [b"%d" % i for i in range(100)]
        await disk.close()


async def test_read_checkpoint_moves_only_after_delivery(settings: Settings) -> None:
    async with Broker(settings) as broker:
        consumer = await open_session(broker.port, b"u", DISKQ)
        await consumer.bind(b"ex", b"prefix:", 0x0110)
        publisher = await open_session(broker.port)
        for i in range(10):
            await publisher.publish(b"ex", b"r", b"%d" % i)
        await consumer.receive(10)
        log = disk_log(broker.queues[b"diskq"])
        await wait_for(lambda: log.checkpoints.get("fq") == 11)
        await consumer.close()
        await publisher.close()
    async with Broker(settings) as broker:
        assert broker.queues[b"diskq"].backlog == 0


async def test_confirms_cover_disk_and_memory_queues(broker: Broker) -> None:
    disk = await open_session(broker.port, b"u", DISKQ)
    await disk.bind(b"ex", b"prefix:")
    async with Client(port=broker.port, source="pub") as client:
        for i in range(1000):
            client.publish(b"ex", b"r", b"%d" % i)
        assert await client.confirm() == 1000
        log = disk_log(broker.queues[b"diskq"])
        assert log.next_seq == 1001
        for i in range(10):
            client.publish(b"nowhere", b"r", b"%d" % i)
        assert await client.confirm() == 1010  # no route is accepted too, and counted
        assert (await client.status())["no_exchange"] == 10
    await disk.close()


async def test_confirm_answers_keep_request_order(broker: Broker) -> None:
    session = await open_session(broker.port)
    await wait_for(lambda: broker.clients[session.key].data is not None)
    # Ask to confirm 3 messages before they are sent: status and bind must wait behind it.
    await session.cmd.send(
        wire.encode(wire.ConfirmRequest(3))
        + wire.encode(wire.StatusRequest())
        + wire.encode(wire.BindRequest(0x100, b"ex", b"prefix:"))
    )
    for i in range(3):
        await session.publish(b"ex", b"r", b"%d" % i)
    assert await session.cmd.reply() == wire.Confirmed(3)
    assert isinstance(await session.cmd.reply(), wire.Status)
    assert await session.cmd.reply() == wire.BindResponse(1)
    await session.close()


async def test_confirm_fails_when_the_data_channel_closes_first(broker: Broker) -> None:
    session = await open_session(broker.port)
    await wait_for(lambda: broker.clients[session.key].data is not None)
    await session.cmd.send(wire.encode(wire.ConfirmRequest(5)))
    await session.publish(b"ex", b"r", b"only one")
    await session.data.close()
    assert await session.cmd.reply() == wire.ConfirmFailed(5, "data channel closed")
    await session.cmd.send(wire.encode(wire.ConfirmRequest(1)))
    assert await session.cmd.reply() == wire.ConfirmFailed(1, "no data channel")
    await session.cmd.close()


async def test_block_policy_stalls_only_its_publisher(broker: Broker) -> None:
    full = await open_session(broker.port, b"u", b"slow\x00mem:block,backlog=5,permanent")
    await full.bind(b"slow", b"prefix:")
    await full.close()
    await wait_for(lambda: not broker.queues[b"slow"].clients)
    other = await open_session(broker.port)
    await other.bind(b"fast", b"prefix:")

    stuck = await open_session(broker.port, b"stuck")
    flowing = await open_session(broker.port, b"flowing")
    for i in range(20):
        await stuck.publish(b"slow", b"r", b"%d" % i)
    stats = broker.clients[stuck.key].stats
    queue = broker.queues[b"slow"]
    await wait_for(lambda: queue.backlog == 5 and queue.is_full)
    # The other publisher keeps flowing while the first is held.
    for i in range(50):
        await flowing.publish(b"fast", b"r", b"%d" % i)
    assert len(await other.receive(50)) == 50
    assert stats.msgs_in == 5  # the stalled publisher is not read any further
    assert queue.dropped_to == 0
    # A consumer drains the queue: the stalled publisher resumes, nothing was lost.
    reader = await open_session(broker.port, b"u", b"slow\x00mem:block")
    got = await reader.receive(20)
    assert [m.payload for m in got] == [b"%d" % i for i in range(20)]
    for s in (other, stuck, flowing, reader):
        await s.close()


async def test_named_checkpoints(broker: Broker) -> None:
    consumer = await open_session(broker.port, b"u", DISKQ)
    await consumer.bind(b"ex", b"prefix:")
    publisher = await open_session(broker.port)
    for i in range(10):
        await publisher.publish(b"ex", b"r", b"%d" % i)
    got = await consumer.receive(10)
    assert checkpoints.add_checkpoint(broker, "replay", "diskq", "0:4") == "Checkpoint added"
    with pytest.raises(checkpoints.CheckpointError, match="out of range"):
        checkpoints.add_checkpoint(broker, "x", "diskq", "0:99")
    with pytest.raises(checkpoints.CheckpointError, match="must be of format"):
        checkpoints.add_checkpoint(broker, "x", "diskq", "4")
    with pytest.raises(checkpoints.CheckpointError, match="reserved"):
        checkpoints.add_checkpoint(broker, "fq", "diskq", "0:4")
    reply = checkpoints.reset_to_checkpoint(broker, "replay", "diskq")
    assert reply == "'diskq' reset to checkpoint 'replay'"
    again = await consumer.receive(7)
    assert [m.payload for m in again] == [m.payload for m in got[3:]]
    assert checkpoints.remove_checkpoint(broker, "replay", "diskq") == "Checkpoint removed"
    with pytest.raises(checkpoints.CheckpointError, match="does not exist"):
        checkpoints.remove_checkpoint(broker, "replay", "diskq")
    await consumer.close()
    await publisher.close()


async def leave_waiting(settings: Settings, payloads: list[bytes]) -> None:
    """Run a broker until ``payloads`` wait in the permanent queue diskq, nobody reading."""
    async with Broker(settings) as broker:
        s = await open_session(broker.port, b"u", DISKQ)
        await s.bind(b"ex", b"prefix:", 0x0110)
        await s.close()
        await wait_for(lambda: not broker.queues[b"diskq"].clients)
        publisher = await open_session(broker.port)
        for payload in payloads:
            await publisher.publish(b"ex", b"r", payload)
        await wait_for(lambda: broker.queues[b"diskq"].backlog == len(payloads))
        await publisher.close()


async def test_queues_of_format_1_keep_their_positions(settings: Settings) -> None:
    await leave_waiting(settings, [b"%d" % i for i in range(10)])
    # As a format 1 broker would have left it, with 4 messages read and a named checkpoint.
    directory = queue_directory(settings.queue_dir, b"diskq")
    (directory / "checkpoints").unlink()
    (directory / "FORMAT").write_text("fqbroker-segmentlog 1\n")
    (directory / "checkpoints.json").write_text('{"checkpoints": {"fq": 5, "replay": 2}}\n')
    async with Broker(settings) as broker:
        assert broker.queues[b"diskq"].backlog == 6
        s = await open_session(broker.port, b"u", DISKQ)
        assert [m.payload for m in await s.receive(6)] == [b"%d" % i for i in range(4, 10)]
        checkpoints.reset_to_checkpoint(broker, "replay", "diskq")
        assert [m.payload for m in await s.receive(9)] == [b"%d" % i for i in range(1, 10)]
        names = [f"r{i}-" + "€" * 50 for i in range(300)]  # past one slot: the file grows
        for i, name in enumerate(names):
            checkpoints.add_checkpoint(broker, name, "diskq", f"0:{1 + i % 10}")
        with pytest.raises(checkpoints.CheckpointError, match="Failed to set checkpoint"):
            checkpoints.add_checkpoint(broker, "n" * 0x10000, "diskq", "0:1")
        await s.close()
    assert (directory / "FORMAT").read_text() == "fqbroker-segmentlog 2\n"
    assert not (directory / "checkpoints.json").exists()
    async with Broker(settings) as broker:
        log = disk_log(broker.queues[b"diskq"])
        assert log.recovery == []
        assert log.checkpoints["replay"] == 2
        assert [log.checkpoints[name] for name in names] == [1 + i % 10 for i in range(300)]


async def test_named_checkpoint_keeps_segments(tmp_path: Path) -> None:
    settings = Settings(
        port=0,
        node_id="10.254.254.1",
        config_db=tmp_path / "db",
        queue_dir=tmp_path / "q",
        segment_bytes=4096,
    )
    async with Broker(settings) as broker:
        consumer = await open_session(broker.port, b"u", DISKQ)
        await consumer.bind(b"ex", b"prefix:")
        publisher = await open_session(broker.port)
        checkpoints.add_checkpoint(broker, "keep", "diskq", "0:1")
        for _ in range(400):
            await publisher.publish(b"ex", b"r", b"x" * 100)
        await consumer.receive(400)
        log = disk_log(broker.queues[b"diskq"])
        await wait_for(lambda: log.checkpoints.get("fq") == 401)
        assert log.first_seq == 1  # the named checkpoint holds every segment
        checkpoints.remove_checkpoint(broker, "keep", "diskq")
        await publisher.publish(b"ex", b"r", b"one more")
        await consumer.receive(1)
        await wait_for(lambda: log.first_seq > 1)  # read segments are deleted
        await consumer.close()
        await publisher.close()


async def test_torn_tail_is_skipped_at_startup(settings: Settings, caplog) -> None:  # type: ignore[no-untyped-def]
    await leave_waiting(settings, [b"good %d" % i for i in range(3)])
    directory = queue_directory(settings.queue_dir, b"diskq")
    segment = sorted(directory.glob("*.seg"))[-1]
    data = segment.read_bytes()
    segment.write_bytes(data[:-3])  # the last record loses its end, as in a crash
    async with Broker(settings) as broker:
        assert broker.queues[b"diskq"].backlog == 2
        warnings = [r for r in caplog.records if r.name == "fqbroker.storage.segments.log"]
        assert warnings and str(directory) in warnings[0].getMessage()
        s = await open_session(broker.port, b"u", DISKQ)
        got = await s.receive(2)
        assert [m.payload for m in got] == [b"good 0", b"good 1"]
        await s.close()


async def test_confirm_client_against_broker_without_support_is_refused() -> None:
    # A broker that does not announce confirms (an fqd) is never sent the request.
    async def fake_fqd(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = await reader.readexactly(4)
        if first == wire.Mode.CMD.to_bytes(4, "big"):
            decoder = wire.ServerCommandDecoder()
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                decoder.feed(chunk)
                while (frame := decoder.next_frame()) is not None:
                    if isinstance(frame, wire.AuthPlain):
                        writer.write(wire.encode(wire.AuthResponse(b"k" * 127)))
                    elif isinstance(frame, wire.StatusRequest):
                        writer.write(wire.encode(wire.Status((("dropped_in", 0),))))
                    elif isinstance(frame, wire.ConfirmRequest):
                        raise AssertionError("fqd would tear the session down")
        else:
            await reader.read()
        writer.close()

    server = await asyncio.start_server(fake_fqd, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with Client(port=port, source="u", reconnect=False) as client:
            client.publish(b"ex", b"r", b"x")
            with pytest.raises(ClientError, match="does not support"):
                await client.confirm()
    finally:
        server.close()
        await server.wait_closed()


async def test_a_queue_can_choose_its_fsync_policy(broker: Broker) -> None:
    session = await open_session(broker.port, b"u", b"q\x00disk:fsync=always,permanent")
    queue = broker.queues[b"q"]
    assert queue.store.policy == "always"  # type: ignore[attr-defined]
    assert queue.spec.attributes == "private,drop,backlog=16384,fsync=always"
    await session.close()
    bad = await authenticate(broker.port, b"u", b"q2\x00disk:fsync=sometimes")
    assert await bad.frame() == wire.ErrorReply("invalid queue param: fsync=sometimes")
    await bad.closed()


async def test_a_failed_fsync_fails_confirms_and_the_queue_recovers(
    broker: Broker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    source = "c/diskq/disk:permanent,backlog=-1,fsync=always"
    consumer = Client(port=broker.port, source=source, reconnect=False)
    await consumer.connect()
    await consumer.bind(b"ex", b"prefix:")
    store = broker.queues[b"diskq"].store
    fake = FailingFsync(failing=False)
    monkeypatch.setattr(segmentlog, "os", fake)
    async with asyncio.timeout(20):
        async with Client(port=broker.port, source="pub", reconnect=False) as publisher:
            for i in range(10):
                publisher.publish(b"ex", b"r", b"%d" % i)
            assert await publisher.confirm() == 10
            fake.failing = True
            for i in range(10, 20):
                publisher.publish(b"ex", b"r", b"%d" % i)
            # Their fsync failed: not known to be on disk, so not confirmed, and not a hang.
            with pytest.raises(ClientError, match="disk queue write failed"):
                await publisher.confirm()
        await wait_for(lambda: store.fsync_errors >= 3)  # retried in the background
        async with Client(port=broker.port, source="pub2", reconnect=False) as publisher:
            publisher.publish(b"ex", b"r", b"refused")  # the queue takes no writes meanwhile
            with pytest.raises(ClientError, match="disk queue write failed"):
                await publisher.confirm()
        fake.failing = False
        await wait_for(lambda: "works again" in caplog.text)
        async with Client(port=broker.port, source="pub3", reconnect=False) as publisher:
            for i in range(20, 30):
                publisher.publish(b"ex", b"r", b"%d" % i)
            assert await publisher.confirm() == 10
        # What the failed fsync covered was still in the page cache: written again, kept.
        got = [(await consumer.receive()).payload for _ in range(30)]
        assert got == [b"%d" % i for i in range(30)]
    await consumer.close()
    failures = [r for r in caplog.records if "fsync failed" in r.getMessage()]
    assert len(failures) == 1  # once per outage, however many retries
    assert failures[0].levelno == logging.ERROR
    assert store.write_errors == 1


def test_records_are_delivered_as_their_frames_with_their_position() -> None:
    msgs = [
        Message(b"e" * (i % 7), b"route." * (i % 5), b"p" * i, bytes(range(16)), b"s" * (i % 3))
        for i in range(50)
    ]
    for i, msg in enumerate(msgs):
        msg.stamp(msg.sender, bytes([10, 0, 0, i]) * (i % 4))
    # Old records (no arrival tag) and new ones, mixed, as a converted queue holds them.
    records = [
        (100 + i, m.peer_frame() if i % 2 else store.encode_records([m.peer_frame()], i)[0])
        for i, m in enumerate(msgs)
    ]
    delivered = [store._delivered(seq, record) for seq, record in records]
    decoder = MessageDecoder(peer_format=True)
    decoder.feed(b"".join(delivered))
    got = decoder.messages()
    expected = [
        Message(m.exchange, m.route, m.payload, m.msgid[:8] + seq.to_bytes(8), m.sender, m.hops)
        for m, (seq, _) in zip(msgs, records, strict=True)
    ]
    assert got == expected
    assert [frame_seq(f) for f in delivered] == list(range(100, 150))


PEER_FRAME = Message(b"e", b"r", b"p", bytes(16), b"s", bytes(4)).peer_frame()


async def test_a_backlog_longer_than_the_recent_cache_comes_back_whole(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Older messages are read back from the file, the newest from memory: one sequence."""
    monkeypatch.setattr(store, "RECENT_BYTES", 4000)  # about 90 of these messages
    count = 517
    consumer = await open_session(broker.port, b"u", DISKQ)
    await consumer.bind(b"ex", b"prefix:")
    await consumer.close()
    publisher = await open_session(broker.port)
    for i in range(count):
        await publisher.publish(b"ex", b"r.%d" % (i % 3), b"m%d" % i)
    await wait_for(lambda: broker.queues[b"diskq"].backlog == count)
    consumer = await open_session(broker.port, b"u", DISKQ)
    got = await consumer.receive(count)
    assert [m.payload for m in got] == [b"m%d" % i for i in range(count)]
    assert [m.route for m in got] == [b"r.%d" % (i % 3) for i in range(count)]
    assert [int.from_bytes(m.msgid[8:], "big") for m in got] == list(range(1, count + 1))
    await consumer.close()
    await publisher.close()


@pytest.mark.parametrize("frame", [b"\x05ab", b"", b"\x01e\x01r" + bytes(16), PEER_FRAME + b"x"])
def test_a_record_that_is_not_a_message_is_named(frame: bytes) -> None:
    good = store.encode_records([PEER_FRAME], 1)[0]
    assert frame_seq(store._delivered(7, good)) == 7
    with pytest.raises(ValueError, match="record 8 is not a message"):
        store._delivered(8, store.encode_records([frame], 2)[0])


async def test_a_confirm_waiting_on_a_queue_its_consumer_deletes_is_answered(
    settings: Settings,
) -> None:
    """A private disk queue goes when its last client leaves. A confirm waiting for an fsync
    of that queue got no answer ever (fq-send --confirm hung about one run in six when its
    fq-recv left first): the messages were accepted into a queue that is now gone, and the
    confirm succeeds as it would for a memory queue whose consumer left."""
    slow = dataclasses.replace(settings, fsync_interval_ms=600_000.0)  # one fsync, then none
    async with Broker(slow) as broker:
        consumer = await open_session(broker.port, b"u", b"gone\x00disk:backlog=-1")
        await consumer.bind(b"ex", b"prefix:")
        async with Client(port=broker.port, reconnect=False) as publisher:
            publisher.publish(b"ex", b"r", b"first")  # its fsync starts the interval
            assert await publisher.confirm() == 1
            publisher.publish(b"ex", b"r", b"second")  # covered by no fsync for 10 minutes
            confirm = asyncio.ensure_future(publisher.confirm())
            store_ = broker.queues[b"gone"].store
            await wait_for(lambda: store_.written_seq == 2 and store_.durable_seq == 1)
            await consumer.close()
            async with asyncio.timeout(10):
                assert await confirm == 2
