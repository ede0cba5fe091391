"""kill -9 fqd while a publisher with confirms writes to retained topics through the fq
exchange ``figg``: every confirmed message is in its topic afterwards, at the offset it had,
offsets stay dense, and a restarted broker goes on after them, reusing none.

Each topic gets the messages ``i`` with ``i % topics == t`` in order, so the k-th of them
has offset k: what offset a message had is known without reading it before the kill.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path

import pytest

from fqbroker.clients.fq.client import Client, ClientError
from fqbroker.core.frames import peer_fields
from fqbroker.core.router import Router
from fqbroker.frontends.figg.settings import topic_config
from fqbroker.protocols.figg import wire
from fqbroker.settings.broker import Settings
from fqbroker.storage.topics.retained import Topics
from tests.e2e.reliability.test_crash import Progress
from tests.procs import Proc


@dataclass(frozen=True)
class KillPoint:
    messages: int
    every: int  # ask for a confirm every this many (the next once the last is answered)
    confirmed: int  # kill once this many are confirmed
    topics: int
    fsync: str = "interval"

    def __str__(self) -> str:
        return (
            f"{self.messages}by{self.every}-confirmed{self.confirmed}-{self.topics}t-{self.fsync}"
        )


KILL_POINTS = [
    KillPoint(1, 1, 1, 1),
    KillPoint(300, 10, 50, 1),
    KillPoint(3000, 100, 1500, 3),
    KillPoint(20000, 500, 10000, 2),
    KillPoint(5000, 50, 2500, 4, fsync="always"),
]


def topic_of(i: int, point: KillPoint) -> bytes:
    return b"t%d" % (i % point.topics)


def write_config(state: Path, fsync: str) -> Path:
    conf = state / "fqd.toml"
    # Small segments: a crash lands in a topic of many of them.
    conf.write_text(f'[fqd]\nfsync = "{fsync}"\n[figg]\nsegment_bytes = 16384\nfsync = "{fsync}"\n')
    return conf


async def start(state: Path, fsync: str) -> tuple[Proc, int]:
    conf = write_config(state, fsync)
    return await Proc.start_fqd(state, "--config", str(conf), "--figg", "127.0.0.1:0")


async def publish(port: int, point: KillPoint, confirmed: Progress) -> None:
    publisher = Client(port=port, source="pub", reconnect=False)
    pending: asyncio.Future[int] | None = None
    try:
        await publisher.connect()
        for i in range(1, point.messages + 1):
            publisher.publish(b"figg", topic_of(i, point), b"%d" % i)
            if i % point.every == 0:
                if pending is not None:
                    confirmed.advance(await pending)
                pending = asyncio.ensure_future(publisher.confirm())
        if pending is not None:
            confirmed.advance(await pending)
            pending = None
    except (ConnectionError, OSError, ClientError):
        pass  # the kill
    finally:
        if pending is not None:
            with contextlib.suppress(ConnectionError, OSError, ClientError):
                confirmed.advance(await pending)
        with contextlib.suppress(ConnectionError, OSError, ClientError):
            await publisher.close()


def read_topics(state: Path) -> dict[bytes, list[tuple[int, int]]]:
    """Every topic's (offset, message number), read from the files as a restart finds them."""
    settings = Settings(queue_dir=state / "queues")
    topics = Topics(topic_config(settings), Router())
    found: dict[bytes, list[tuple[int, int]]] = {}
    try:
        for topic in topics:
            assert topic.store.log.recovery == []  # a process crash tears no write
            out = found[topic.name] = []
            after = 0
            while batch := topic.read(after, 1000):
                out += [(offset, int(peer_fields(f)[2])) for offset, f in batch]
                after = batch[-1][0]
    finally:
        for topic in topics:
            topic.close()
    return found


@pytest.mark.parametrize("point", KILL_POINTS, ids=str)
async def test_kill_9_keeps_every_confirmed_message_at_its_offset(
    tmp_path: Path, point: KillPoint
) -> None:
    fqd, port = await start(tmp_path, point.fsync)
    confirmed = Progress()
    try:
        async with asyncio.timeout(120):
            publisher = asyncio.create_task(publish(port, point, confirmed))
            await confirmed.reach(point.confirmed)
            fqd.proc.kill()
            await fqd.proc.wait()
            await publisher
    finally:
        fqd.kill()
        await fqd.proc.wait()
    done = confirmed.value
    assert done >= point.confirmed > 0

    found = read_topics(tmp_path)
    for t in range(point.topics):
        name = b"t%d" % t
        sent = [i for i in range(1, point.messages + 1) if i % point.topics == t]
        stored = found.get(name, [])
        # Dense offsets from 1, each message at the offset it was given, in order.
        assert stored == list(enumerate(sent[: len(stored)], 1)), name
        assert {i for i in sent if i <= done} <= {i for _, i in stored}, "a confirmed loss"

    # A restarted broker goes on after what it found: no offset is used twice.
    fqd, port = await start(tmp_path, point.fsync)
    try:
        async with asyncio.timeout(60), Client(port=port, source="pub2", reconnect=False) as c:
            for t in range(point.topics):
                c.publish(b"figg", b"t%d" % t, b"0")
            await c.confirm()
    finally:
        fqd.proc.terminate()
        async with asyncio.timeout(30):
            await fqd.proc.wait()
    after = read_topics(tmp_path)
    for name, stored in found.items():
        assert after[name] == [*stored, (len(stored) + 1, 0)]


# --- the same through Figg: what an ACK promises --------------------------------------


async def figg_publish(port: int, count: int, acked: Progress) -> None:
    """PUBLISH seq 0.. with data ``b"%d" % (seq + 1)`` to topic ``f``, 256 unacknowledged at
    most, as the Figg client does; ``acked`` is the number acknowledged (ACK(n): n + 1)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    decoder = wire.FrameDecoder()
    sent = 0
    try:
        while True:
            while sent < count and sent - acked.value < 256:
                writer.write(wire.encode_publish(b"f", sent, b"%d" % (sent + 1)))
                sent += 1
            data = await reader.read(65536)
            if not data:
                return
            decoder.receive_data(data)
            while (frame := decoder.next_frame()) is not None:
                assert isinstance(frame, wire.Ack)
                acked.advance(frame.seq + 1)
            if acked.value == count:
                return
    except (ConnectionError, OSError):
        pass  # the kill
    finally:
        writer.close()


@pytest.mark.parametrize("fsync", ["always", "interval"])
async def test_kill_9_keeps_every_figg_acknowledged_message_at_its_offset(
    tmp_path: Path, fsync: str
) -> None:
    conf = write_config(tmp_path, fsync)
    fqd, _ = await Proc.start_fqd(tmp_path, "--config", str(conf), "--figg", "127.0.0.1:0")
    acked = Progress()
    try:
        line = await fqd.wait_stderr("Figg listening on port: ")
        async with asyncio.timeout(120):
            publisher = asyncio.create_task(
                figg_publish(int(line.rsplit(" ", 1)[1]), 20_000, acked)
            )
            await acked.reach(5000)
            fqd.proc.kill()
            await fqd.proc.wait()
            await publisher
    finally:
        fqd.kill()
        await fqd.proc.wait()
    done = acked.value
    assert done >= 5000
    stored = read_topics(tmp_path)[b"f"]
    # One publisher that never reconnected: message n went in n-th, at offset n.
    assert stored == [(n, n) for n in range(1, len(stored) + 1)]
    assert len(stored) >= done, f"{done} acknowledged, {len(stored)} kept"
