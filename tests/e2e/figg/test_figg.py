"""The Figg listener end to end: a real broker on loopback with retained topics in a tmp
queue dir, the project's own encoder and decoder (fqbroker.protocols.figg.wire) as the
client over real sockets, and fq clients on the other side of the bridge.

What the protocol promises (docs/figg.md) is checked from the client's side: ACK is
cumulative from seq 0 and sent only once the messages are durable; ATTACH starts where
ATTACHED says (latest, an offset, the oldest retained one, the end) and delivers every
message after it exactly once, replay turning into live delivery with neither gap nor
duplicate; DETACH is answered; PING keeps a connection that idles otherwise; bad input
closes only the connection that sent it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from fqbroker.clients.fq.client import Client
from fqbroker.frontends.figg.session import FiggSession
from fqbroker.frontends.figg.subscription import BATCH_BYTES
from fqbroker.protocols.figg import wire
from fqbroker.protocols.figg.wire import (
    Ack,
    Attach,
    Attached,
    Data,
    Detach,
    Detached,
    Frame,
    Ping,
    Pong,
    Publish,
)
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from fqbroker.storage.segments import log as segmentlog
from tests.conftest import TIMEOUT, FailingFsync, on, port_of, running, wait_for
from tests.server.test_frontends import front_ends_json

EXCHANGE = b"figg"


pytestmark = pytest.mark.on("figg")


@pytest.fixture
def fg(broker_on: Broker) -> Broker:
    return broker_on


class Conn:
    """A Figg client's connection: frames out, frames in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = wire.FrameDecoder()

    @classmethod
    async def open(cls, broker: Broker) -> Conn:
        return cls(*await asyncio.open_connection("127.0.0.1", port_of(broker, "figg")))

    async def send(self, *frames: Frame | bytes) -> None:
        self.writer.write(b"".join(f if isinstance(f, bytes) else wire.encode(f) for f in frames))
        await self.writer.drain()

    async def next(self, timeout: float = TIMEOUT) -> Frame:
        async with asyncio.timeout(timeout):
            while (frame := self.decoder.next_frame()) is None:
                data = await self.reader.read(65536)
                if not data:
                    raise EOFError("the broker closed the connection")
                self.decoder.receive_data(data)
        return frame

    async def frames(self, n: int) -> list[Frame]:
        return [await self.next() for _ in range(n)]

    async def nothing(self, seconds: float) -> None:
        """No frame arrives within ``seconds``."""
        with contextlib.suppress(TimeoutError):
            frame = await self.next(seconds)
            raise AssertionError(f"unexpected {frame}")

    async def ack(self, seq: int) -> list[int]:
        """ACKs until one names ``seq``; every one seen, in order."""
        seen: list[int] = []
        while not seen or seen[-1] < seq:
            frame = await self.next()
            assert isinstance(frame, Ack), frame
            seen.append(frame.seq)
        assert seen == sorted(seen) and seen[-1] == seq, seen
        return seen

    async def closed_by_broker(self) -> None:
        async with asyncio.timeout(TIMEOUT):
            with contextlib.suppress(ConnectionResetError):
                while await self.reader.read(65536):
                    pass

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


@contextlib.asynccontextmanager
async def conn(broker: Broker) -> AsyncIterator[Conn]:
    c = await Conn.open(broker)
    try:
        yield c
    finally:
        await c.close()


def payloads(n: int, first: int = 0) -> list[bytes]:
    return [b"m%d" % i for i in range(first, first + n)]


async def publish(c: Conn, topic: bytes, data: list[bytes], first_seq: int = 0) -> None:
    """Publish in one write and wait for the ACK of the last."""
    await c.send(*(Publish(topic, first_seq + i, d) for i, d in enumerate(data)))
    await c.ack(first_seq + len(data) - 1)


def datas(frames: list[Frame]) -> list[tuple[int, bytes]]:
    out = []
    for frame in frames:
        assert isinstance(frame, Data), frame
        out.append((frame.offset, frame.data))
    return out


# --- publish and acknowledge --------------------------------------------------------------


async def test_ack_is_cumulative_from_seq_0_and_only_for_durable_messages(fg: Broker) -> None:
    async with conn(fg) as c:
        await c.send(Publish(b"T", 0, b"first"))
        assert await c.next() == Ack(0)  # a real acknowledgement, not a keepalive
        topics = fg.topics
        assert topics is not None
        topic = topics.get(b"T")
        assert topic is not None and topic.last_offset == 1  # durable when acknowledged
        await c.send(*(Publish(b"T", seq, b"x%d" % seq) for seq in range(1, 200)))
        await c.ack(199)
        assert topic.last_offset == 200


async def test_no_ack_when_the_topic_fsync_fails(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.fsync = "always"
    async with running(on(settings, "figg")) as broker, conn(broker) as c:
        await publish(c, b"T", [b"ok"])
        monkeypatch.setattr(segmentlog, "os", FailingFsync())
        await c.send(Publish(b"T", 1, b"lost"))
        await c.closed_by_broker()
        assert c.decoder.next_frame() is None  # no ACK came before the close
        monkeypatch.undo()
        assert broker.topics is not None
        topic = broker.topics.get(b"T")
        assert topic is not None and topic.last_offset == 1
        async with conn(broker) as other:  # the broker serves the others
            await publish(other, b"U", [b"fine"])


# --- attach -------------------------------------------------------------------------------


async def test_attach_latest_sends_only_new_messages(fg: Broker) -> None:
    async with conn(fg) as pub, conn(fg) as sub:
        await publish(pub, b"T", payloads(3))
        await sub.send(Attach(b"T", None))
        assert await sub.next() == Attached(b"T", 3)
        await publish(pub, b"T", [b"new"], first_seq=3)
        assert await sub.next() == Data(b"T", 4, b"new")
        await sub.nothing(0.2)


async def test_attach_from_0_replays_then_goes_live(fg: Broker) -> None:
    async with conn(fg) as pub, conn(fg) as sub:
        await publish(pub, b"T", payloads(5))
        await sub.send(Attach(b"T", 0))
        assert await sub.next() == Attached(b"T", 0)
        assert datas(await sub.frames(5)) == list(zip(range(1, 6), payloads(5), strict=True))
        await publish(pub, b"T", payloads(2, 5), first_seq=5)
        assert datas(await sub.frames(2)) == [(6, b"m5"), (7, b"m6")]
        # from an offset in the middle: the message after it
        async with conn(fg) as mid:
            await mid.send(Attach(b"T", 4))
            assert await mid.next() == Attached(b"T", 4)
            assert datas(await mid.frames(3)) == [(5, b"m4"), (6, b"m5"), (7, b"m6")]


async def test_attach_past_the_end_is_clamped(fg: Broker) -> None:
    async with conn(fg) as pub, conn(fg) as sub:
        await publish(pub, b"T", payloads(2))
        await sub.send(Attach(b"T", 1000))
        assert await sub.next() == Attached(b"T", 2)
        await publish(pub, b"T", [b"next"], first_seq=2)
        assert await sub.next() == Data(b"T", 3, b"next")


async def test_attach_creates_the_topic(fg: Broker) -> None:
    async with conn(fg) as sub:
        await sub.send(Attach(b"fresh", 7))
        assert await sub.next() == Attached(b"fresh", 0)
        assert fg.topics is not None and fg.topics.get(b"fresh") is not None


async def test_an_expired_offset_starts_at_the_oldest_retained_message(
    settings: Settings,
) -> None:
    config = on(settings, "figg", segment_bytes=4096, retention_bytes=8192)
    async with running(config) as broker, conn(broker) as c:
        data = [b"%05d" % i + b"." * 200 for i in range(200)]
        for i in range(0, 200, 20):
            await publish(c, b"T", data[i : i + 20], first_seq=i)
        topics = broker.topics
        assert topics is not None
        topic = topics.get(b"T")
        assert topic is not None
        topics.enforce_retention()
        first = topic.first_offset
        assert 0 < first < 199
        await c.send(Attach(b"T", 0))
        assert await c.next() == Attached(b"T", first)
        got = datas(await c.frames(200 - first))
        assert got == [(o, data[o - 1]) for o in range(first + 1, 201)]


async def test_replay_then_live_while_a_publisher_keeps_publishing(fg: Broker) -> None:
    """Every message exactly once, in order, offsets increasing, across the switch."""
    total = 3000
    async with conn(fg) as pub, conn(fg) as sub:
        await publish(pub, b"T", payloads(500))

        async def keep_publishing() -> None:
            for first in range(500, total, 100):
                await publish(pub, b"T", payloads(100, first), first_seq=first)
                await asyncio.sleep(0.001)

        task = asyncio.ensure_future(keep_publishing())
        try:
            await asyncio.sleep(0.01)  # some of it published meanwhile, some to come
            await sub.send(Attach(b"T", 0))
            assert await sub.next() == Attached(b"T", 0)
            got = datas(await sub.frames(total))
        finally:
            async with asyncio.timeout(TIMEOUT):
                await task
        assert got == list(zip(range(1, total + 1), payloads(total), strict=True))
        await sub.nothing(0.1)


async def test_a_second_attach_restarts_the_subscription(fg: Broker) -> None:
    async with conn(fg) as pub, conn(fg) as sub:
        await publish(pub, b"T", payloads(3))
        await sub.send(Attach(b"T", 0))
        assert await sub.next() == Attached(b"T", 0)
        assert len(await sub.frames(3)) == 3
        await sub.send(Attach(b"T", 1))
        assert await sub.next() == Attached(b"T", 1)
        assert datas(await sub.frames(2)) == [(2, b"m1"), (3, b"m2")]
        await sub.nothing(0.2)


async def test_subscribers_are_registered_on_the_topic(fg: Broker) -> None:
    async with conn(fg) as pub, conn(fg) as sub:
        await publish(pub, b"T", payloads(2))
        await sub.send(Attach(b"T", 0))
        await sub.frames(3)
        assert fg.topics is not None
        topic = fg.topics.get(b"T")
        assert topic is not None
        (reader,) = topic.subscribers
        await wait_for(lambda: reader.offset == 2)
        assert reader.remote.startswith("127.0.0.1:")
        await sub.send(Detach(b"T"))
        assert await sub.next() == Detached(b"T")
        assert topic.subscribers == set()
        await sub.send(Attach(b"T", None))
        await sub.next()
        assert len(topic.subscribers) == 1
    await wait_for(lambda: not topic.subscribers)  # the connection closed


async def test_detach_stops_delivery_and_is_answered(fg: Broker) -> None:
    async with conn(fg) as pub, conn(fg) as sub:
        await sub.send(Detach(b"never"))  # answered even when not attached
        assert await sub.next() == Detached(b"never")
        await sub.send(Attach(b"T", None), Attach(b"U", None))
        assert await sub.frames(2) == [Attached(b"T", 0), Attached(b"U", 0)]
        await sub.send(Detach(b"T"))
        assert await sub.next() == Detached(b"T")
        await publish(pub, b"T", [b"t"])
        await publish(pub, b"U", [b"u"], first_seq=1)
        assert await sub.next() == Data(b"U", 1, b"u")
        await sub.nothing(0.2)


async def test_max_topics_closes_the_connection_that_asks_for_one_more(
    settings: Settings,
) -> None:
    async with running(on(settings, "figg", max_topics=1)) as broker:
        async with conn(broker) as c:
            await c.send(Attach(b"one", None))
            assert await c.next() == Attached(b"one", 0)
            await c.send(Attach(b"two", None))
            await c.closed_by_broker()
        async with conn(broker) as c:  # the existing topic still works
            await c.send(Attach(b"one", None))
            assert await c.next() == Attached(b"one", 0)


# --- ping, idle, bad input ----------------------------------------------------------------


async def test_ping_is_answered_with_the_same_value(fg: Broker) -> None:
    async with conn(fg) as c:
        await c.send(Ping(0x18EA5623A618AFBE), Ping(0), Ping((1 << 64) - 1))
        assert await c.frames(3) == [Pong(0x18EA5623A618AFBE), Pong(0), Pong((1 << 64) - 1)]


async def test_idle_connections_close_and_pinging_ones_stay_10_seconds(
    settings: Settings,
) -> None:
    async with running(on(settings, "figg", idle_seconds=1.0)) as broker:
        async with conn(broker) as idle:
            await idle.closed_by_broker()
        async with conn(broker) as pinging:
            loop = asyncio.get_running_loop()
            end = loop.time() + 10.0
            n = 0
            while loop.time() < end:
                await pinging.send(Ping(n))
                assert await pinging.next() == Pong(n)
                n += 1
                await asyncio.sleep(0.3)
            await pinging.send(Ping(n))
            assert await pinging.next() == Pong(n)


async def test_a_subscriber_that_only_reads_stays_while_data_flows_to_it(
    settings: Settings,
) -> None:
    # The Figg protocol text has no PING: a reader that sends nothing but its ATTACH is
    # not idle while DATA reaches it, only once nothing flows either way.
    figg = on(settings, "figg", idle_seconds=1.0)
    async with running(figg) as broker, conn(broker) as reader, conn(broker) as writer:
        await reader.send(Attach(b"live", None))
        assert isinstance(await reader.next(), Attached)
        loop = asyncio.get_running_loop()
        end = loop.time() + 4.0
        seq = 0
        while loop.time() < end:
            await publish(writer, b"live", [b"m%d" % seq], seq)
            frame = await reader.next()
            assert isinstance(frame, Data) and frame.data == b"m%d" % seq, frame
            seq += 1
            await asyncio.sleep(0.3)
        await reader.closed_by_broker()  # nothing flows now: idle as any connection


@pytest.mark.parametrize(
    "bad",
    [
        wire.encode(Attach(b"t" * 128, None)),
        wire.encode(Publish(b"t" * 128, 0, b"x")),
        wire.encode(Publish(b"", 0, b"x")),
        b"\x00\x63\x00\x01\x00\x00\x00\x00",  # unknown type 99
        b"\x00\x05\x00\x01\x00\x00\x00\x05hello",  # PUBLISH whose fields do not add up
        b"\x00\x05\x00\x01\x7f\xff\xff\xff",  # over max_frame
        wire.encode(Data(b"T", 1, b"x")),  # a server's frame
    ],
    ids=["topic-128", "publish-topic-128", "empty-topic", "type", "fields", "length", "data"],
)
async def test_bad_input_closes_only_that_connection(fg: Broker, bad: bytes) -> None:
    async with conn(fg) as good, conn(fg) as c, conn(fg) as pub:
        await good.send(Attach(b"T", None))
        assert await good.next() == Attached(b"T", 0)
        before = fg.limits.bad_input["figg"]
        await c.send(Ping(1), bad, Ping(2))
        assert await c.next() == Pong(1)
        await c.closed_by_broker()
        assert c.decoder.next_frame() is None
        assert fg.limits.bad_input["figg"] == before + 1
        await publish(pub, b"T", [b"still"])
        assert await good.next() == Data(b"T", 1, b"still")


# --- fq <-> Figg --------------------------------------------------------------------------


async def test_figg_publishes_reach_fq_consumers_and_fq_publishes_reach_figg(
    fg: Broker,
) -> None:
    async with Client(port=fg.port, source="c/figgq/mem:private", reconnect=False) as fq:
        await fq.bind(EXCHANGE, b'exact:"T"')
        async with conn(fg) as c:
            await publish(c, b"T", [b"from figg"])
            await publish(c, b"other", [b"not for the binding"], first_seq=1)
            async with asyncio.timeout(TIMEOUT):
                msg = await fq.receive()
            assert (msg.exchange, msg.route, msg.payload) == (EXCHANGE, b"T", b"from figg")
            assert msg.sender.startswith(b"figg/127.0.0.1:")
            await c.send(Attach(b"T", None))
            assert await c.next() == Attached(b"T", 1)
            fq.publish(EXCHANGE, b"T", b"from fq")
            await fq.flush()
            assert await c.next() == Data(b"T", 2, b"from fq")


async def test_a_block_policy_queue_holds_the_ack_until_it_has_room(settings: Settings) -> None:
    """A full block-policy fq queue on the Figg exchange stops the batch: no ACK until a
    consumer makes room, then every message is in the queue and in the topic."""
    async with running(on(settings, "figg")) as broker:
        source = "c/figgbq/mem:permanent,block,backlog=4,public"
        async with Client(port=broker.port, source=source, reconnect=False) as fq:
            await fq.bind(EXCHANGE, b'exact:"T"')
        async with conn(broker) as c:
            await c.send(*(Publish(b"T", seq, b"b%d" % seq) for seq in range(10)))
            await c.nothing(0.3)  # 4 fit; the batch waits for room
            async with Client(port=broker.port, source=source, reconnect=False) as fq:
                async with asyncio.timeout(TIMEOUT):
                    got = [(await fq.receive()).payload for _ in range(10)]
                assert got == [b"b%d" % seq for seq in range(10)]
                await c.ack(9)
            await c.send(Attach(b"T", 0))
            assert await c.next() == Attached(b"T", 0)
            assert [d for _, d in datas(await c.frames(10))] == got


async def test_a_subscriber_that_does_not_read_costs_bounded_memory(fg: Broker) -> None:
    """Replaying to a client that reads nothing stops at about one batch beyond the
    transport's high-water mark; once it reads, it gets everything, in order."""
    n = 20000
    data = b"z" * 1000  # 20 MB of backlog: more than socket buffers hold
    async with conn(fg) as pub:
        for first in range(0, n, 500):
            await publish(pub, b"T", [data] * 500, first_seq=first)
    async with conn(fg) as sub:
        sub.writer.transport.pause_reading()  # type: ignore[attr-defined]
        await sub.send(Attach(b"T", 0))
        connections = fg.front_ends["figg"].connections
        await wait_for(lambda: len(connections) == 1)
        (transport,) = connections
        session = transport.get_protocol()
        assert isinstance(session, FiggSession)
        await wait_for(lambda: not session.writable.is_set())
        await asyncio.sleep(0.3)  # it would go on if it did not stop
        (sub_state,) = session.subscriptions.values()
        assert session.delivered < n and sub_state.offset < n
        assert transport.get_write_buffer_size() < 2 * BATCH_BYTES + 65536
        sub.writer.transport.resume_reading()  # type: ignore[attr-defined]
        assert await sub.next() == Attached(b"T", 0)
        offsets = []
        for _ in range(n):
            frame = await sub.next()
            assert isinstance(frame, Data) and frame.data == data
            offsets.append(frame.offset)
        assert offsets == list(range(1, n + 1))


async def test_frontends_json_shows_each_connection_s_counters(fg: Broker) -> None:
    async with conn(fg) as c:
        await publish(c, b"T", payloads(3))
        await c.send(Attach(b"T", 0))
        await c.frames(4)
        (shown,) = (await front_ends_json(fg))["figg"]["connections"]
        assert (shown["published"], shown["acked"], shown["delivered"]) == (3, 2, 3)
        assert shown["subscriptions"] == 1
