"""The broker end to end over loopback sockets: auth, pairing, commands, routing, queues."""

from __future__ import annotations

import asyncio

import pytest

from fqbroker.core.message import hop_addresses
from fqbroker.protocols.fq import wire
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import RawConn, authenticate, open_session, wait_for
from tests.vectors import BROKER_STATUS_KEYS


async def paired(broker: Broker, key: bytes) -> None:
    await wait_for(lambda: broker.clients[key].data is not None)


async def assert_broker_serves(broker: Broker) -> None:
    """A fresh publisher and consumer still work: bad input elsewhere harmed nobody."""
    consumer = await open_session(broker.port, b"probe-consumer")
    publisher = await open_session(broker.port, b"probe-publisher")
    try:
        assert await consumer.bind(b"probe", b"prefix:") != wire.BIND_ILLEGAL
        await publisher.publish(b"probe", b"r", b"still serving")
        (msg,) = await consumer.receive()
        assert msg.payload == b"still serving"
        assert msg.sender == b"probe-publisher"
    finally:
        await consumer.close()
        await publisher.close()


async def test_auth_reply_is_key_then_heartbeat(broker: Broker) -> None:
    cmd = await authenticate(broker.port, b"tuser", b"tq\x00mem:public", b"secret")
    head = await cmd.read_exactly(4 + 127 + 2)
    assert head[:4] == bytes.fromhex("aa00007f")
    assert head[-2:] == bytes.fromhex("bea7")
    key = head[4:131]
    assert broker.clients[key].user == b"tuser"
    assert broker.queues[b"tq"].private is False
    await cmd.close()


async def test_keys_are_random_and_distinct(broker: Broker) -> None:
    a = await open_session(broker.port)
    b = await open_session(broker.port)
    assert a.key != b.key and len(a.key) == len(b.key) == 127
    await a.close()
    await b.close()


async def test_publish_and_consume_with_sender_and_hops(broker: Broker) -> None:
    consumer = await open_session(broker.port, b"carol-reader")
    publisher = await open_session(broker.port, b"carol")
    route_id = await consumer.bind(b"ex", b'prefix:"a."')
    assert route_id == 1
    await publisher.publish(b"ex", b"a.b", b"hello")
    (msg,) = await consumer.receive()
    assert (msg.exchange, msg.route, msg.payload, msg.sender) == (b"ex", b"a.b", b"hello", b"carol")
    assert hop_addresses(msg.hops) == ["10.254.254.1", "127.0.0.1"]
    await consumer.close()
    await publisher.close()


async def test_pipelined_commands_are_answered_in_order(broker: Broker) -> None:
    session = await open_session(broker.port)
    await paired(broker, session.key)
    pipeline = [
        wire.BindRequest(0x100, b"ex", b"prefix:a"),
        wire.BindRequest(0x100, b"ex", b"prefix:a"),  # duplicate: same id back
        wire.BindRequest(0x100, b"ex", b"nonsense"),
        wire.Heartbeat(),
        wire.BindRequest(0x100, b"other", b"prefix:a"),
        wire.UnbindRequest(1, b"ex"),
        wire.UnbindRequest(1, b"ex"),  # already gone
        wire.UnbindRequest(2, b"nope"),
        wire.StatusRequest(),
    ]
    await session.cmd.send(b"".join(wire.encode(f) for f in pipeline))
    replies = [await session.cmd.reply() for _ in range(8)]
    assert replies[:7] == [
        wire.BindResponse(1),
        wire.BindResponse(1),
        wire.BindResponse(wire.BIND_ILLEGAL),
        wire.BindResponse(2),
        wire.UnbindResponse(1),
        wire.UnbindResponse(wire.BIND_ILLEGAL),
        wire.UnbindResponse(wire.BIND_ILLEGAL),
    ]
    assert isinstance(replies[7], wire.Status)
    assert [k for k, _ in replies[7].items] == BROKER_STATUS_KEYS
    await session.close()


async def test_status_before_pairing_has_only_dropped_in(broker: Broker) -> None:
    cmd = await authenticate(broker.port)
    assert isinstance(await cmd.frame(), wire.AuthResponse)
    await cmd.send(wire.encode(wire.StatusRequest()))
    assert await cmd.reply() == wire.Status((("dropped_in", 0), ("confirm", 1), ("dedup", 1)))
    await cmd.close()


async def test_status_counters_after_drops(broker: Broker) -> None:
    """The reference's example: 10 messages into backlog=5 (docs/fq-protocol.md §1.6)."""
    sink = await open_session(broker.port, b"sink", b"small\x00mem:backlog=5")
    await sink.data.close()  # nobody consumes
    await wait_for(lambda: broker.clients[sink.key].data is None)
    await sink.bind(b"ex", b"prefix:")
    publisher = await open_session(broker.port, b"pub")
    for i in range(10):
        await publisher.publish(b"ex", b"r", b"%d" % i)  # 26 wire bytes each
    await wait_for(lambda: broker.clients[publisher.key].stats.msgs_in == 10)
    status = await publisher.status()
    assert status == {
        "dropped_in": 0,
        "no_exchange": 0,
        "no_route": 0,
        "routed": 10,
        "dropped": 5,
        "size_dropped": 0,
        "msgs_in": 10,
        "msgs_out": 0,
        "octets_in": 260,
        "octets_out": 0,
        "confirm": 1,
        "dedup": 1,
    }
    assert (await sink.status())["dropped_in"] == 5
    # The first five were kept (tail drop) and reach a consumer that pairs later.
    sink.data = await RawConn.open(broker.port)
    await sink.data.send(wire.encode_hello(wire.Mode.DATA, sink.key))
    got = await sink.receive(5)
    assert [m.payload for m in got] == [b"0", b"1", b"2", b"3", b"4"]
    await sink.close()
    await publisher.close()


async def test_no_exchange_and_no_route_counters(broker: Broker) -> None:
    consumer = await open_session(broker.port)
    await consumer.bind(b"known", b"exact:yes")
    publisher = await open_session(broker.port)
    await publisher.publish(b"unknown", b"r", b"x")
    await publisher.publish(b"known", b"no", b"x")
    await wait_for(lambda: broker.clients[publisher.key].stats.msgs_in == 2)
    status = await publisher.status()
    assert (status["no_exchange"], status["no_route"], status["routed"]) == (1, 2, 0)
    agg = broker.router.aggregate
    assert (agg.no_exchange, agg.no_route, agg.messages) == (1, 2, 2)
    await consumer.close()
    await publisher.close()


async def test_each_queue_gets_a_message_once(broker: Broker) -> None:
    a = await open_session(broker.port)
    b = await open_session(broker.port)
    await a.bind(b"ex", b"prefix:")
    await a.bind(b"ex", b"prefix:x")
    await b.bind(b"ex", b"prefix:x")
    publisher = await open_session(broker.port)
    await publisher.publish(b"ex", b"xyz", b"1")
    await publisher.publish(b"ex", b"abc", b"2")
    assert [m.payload for m in await a.receive(2)] == [b"1", b"2"]
    assert [m.payload for m in await b.receive(1)] == [b"1"]
    await wait_for(lambda: broker.clients[publisher.key].stats.msgs_in == 2)
    assert broker.clients[publisher.key].stats.routed == 3
    for s in (a, b, publisher):
        await s.close()


async def test_transient_queue_goes_with_its_last_client(broker: Broker) -> None:
    session = await open_session(broker.port, b"u", b"tq")
    await session.bind(b"ex", b"prefix:")
    assert b"tq" in broker.queues
    await session.close()
    await wait_for(lambda: b"tq" not in broker.queues)
    assert broker.router.exchanges[b"ex"].bindings == {}  # the exchange itself stays


async def test_permanent_queue_keeps_messages_while_nobody_is_attached(broker: Broker) -> None:
    session = await open_session(broker.port, b"u", b"pq\x00mem:permanent")
    await session.bind(b"ex", b"prefix:")
    await session.close()
    await wait_for(lambda: not broker.queues[b"pq"].clients)
    publisher = await open_session(broker.port)
    for i in range(3):
        await publisher.publish(b"ex", b"r", b"%d" % i)
    await wait_for(lambda: broker.queues[b"pq"].backlog == 3)
    again = await open_session(broker.port, b"u", b"pq\x00mem:permanent")
    assert [m.payload for m in await again.receive(3)] == [b"0", b"1", b"2"]
    await again.close()
    await publisher.close()


async def test_empty_queue_name_gets_an_auto_name(broker: Broker) -> None:
    session = await open_session(broker.port, b"u", b"\x00mem:public")
    client = broker.clients[session.key]
    assert client.queue is not None
    name = client.queue.name.decode()
    assert name.startswith("auto-") and len(name) == 41
    assert client.queue.private and not client.queue.permanent
    await session.close()


@pytest.mark.parametrize(
    ("first", "second", "text"),
    [
        (b"q", b"q", "requested queue is private and in use\n"),
        (b"q\x00mem:public", b"q\x00disk:public", "requested type disk, queue is mem"),
        (b"q\x00mem:public", b"q\x00mem:private", "requested private, queue is public"),
        (b"q\x00mem:public", b"q\x00mem", "requested private, queue is public"),
        (b"q\x00mem:public", b"q\x00mem:public,block", "request block, queue is drop"),
        (b"q\x00mem:public,block", b"q\x00mem:public,drop", "request drop, queue is block"),
    ],
)
async def test_attach_checks_have_fq_texts(
    broker: Broker, first: bytes, second: bytes, text: str
) -> None:
    holder = await open_session(broker.port, b"u", first)
    cmd = await authenticate(broker.port, b"u", second)
    assert await cmd.frame() == wire.ErrorReply(text)
    assert await cmd.closed() == b""
    await holder.close()
    await assert_broker_serves(broker)


async def test_public_queue_takes_16_clients(broker: Broker) -> None:
    sessions = [await open_session(broker.port, b"u", b"shared\x00mem:public") for _ in range(16)]
    cmd = await authenticate(broker.port, b"u", b"shared\x00mem:public,backlog=5")
    assert await cmd.frame() == wire.ErrorReply("can't add you to queue")
    assert await cmd.closed() == b""
    assert broker.queues[b"shared"].limit == 16384  # the differing backlog= was ignored
    for s in sessions:
        await s.close()
    await assert_broker_serves(broker)


async def test_public_queue_shares_work_under_light_load(broker: Broker) -> None:
    consumers = [await open_session(broker.port, b"u", b"work\x00mem:public") for _ in range(3)]
    await consumers[0].bind(b"ex", b"prefix:")
    queue = broker.queues[b"work"]
    got: list[list] = [[] for _ in consumers]  # type: ignore[type-arg]

    async def drain(i: int) -> None:
        c = consumers[i]
        while chunk := await c.data.reader.read(65536):
            c.messages.feed(chunk)
            got[i].extend(c.messages.messages())

    readers = [asyncio.create_task(drain(i)) for i in range(3)]
    await wait_for(lambda: len(queue._getters) == 3)
    publisher = await open_session(broker.port)
    stats = broker.clients[publisher.key].stats
    for i in range(30):
        await publisher.publish(b"ex", b"r", b"%d" % i)
        # Light load: each message is taken before the next is sent.
        await wait_for(
            lambda n=i + 1: stats.msgs_in == n and queue.backlog == 0 and len(queue._getters) == 3
        )
    await wait_for(lambda: sum(map(len, got)) == 30)
    for task in readers:
        task.cancel()
    counts = [len(g) for g in got]
    assert all(n >= 5 for n in counts), counts  # fqd would give all 30 to one consumer
    payloads = sorted(int(m.payload) for g in got for m in g)
    assert payloads == list(range(30))  # no message went to two consumers
    for s in [*consumers, publisher]:
        await s.close()


async def test_backlog_zero_drops_everything(broker: Broker) -> None:
    sink = await open_session(broker.port, b"u", b"z\x00mem:backlog=0")
    await sink.bind(b"ex", b"prefix:")
    publisher = await open_session(broker.port)
    await publisher.publish(b"ex", b"r", b"x")
    await wait_for(lambda: broker.queues[b"z"].dropped_to == 1)
    await sink.close()
    await publisher.close()


async def test_data_channel_can_pair_again_after_it_drops(broker: Broker) -> None:
    session = await open_session(broker.port)
    await session.bind(b"ex", b"prefix:")
    await session.data.close()
    await wait_for(lambda: broker.clients[session.key].data is None)
    session.data = await RawConn.open(broker.port)
    await session.data.send(wire.encode_hello(wire.Mode.DATA, session.key))
    await paired(broker, session.key)
    publisher = await open_session(broker.port)
    await publisher.publish(b"ex", b"r", b"again")
    assert [m.payload for m in await session.receive()] == [b"again"]
    await session.close()
    await publisher.close()


async def test_heartbeat_request_then_silence_fails_the_client(broker: Broker) -> None:
    cmd = await authenticate(broker.port)
    assert isinstance(await cmd.frame(), wire.AuthResponse)
    assert await cmd.frame() == wire.Heartbeat()
    await cmd.send(wire.encode(wire.HeartbeatRequest(100)))
    frames = []
    while not isinstance(frame := await cmd.frame(), wire.ErrorReply):
        frames.append(frame)
    assert frame == wire.ErrorReply("client heartbeat failed")
    assert frames and all(f == wire.Heartbeat() for f in frames)
    assert await cmd.closed() == b""
    await wait_for(lambda: not broker.clients)


async def test_client_heartbeats_keep_the_session(broker: Broker) -> None:
    session = await open_session(broker.port)
    await session.cmd.send(wire.encode(wire.HeartbeatRequest(500)))
    # 20 x 100 ms is more than the 3 x 500 ms after which a silent client is dropped; a
    # machine that stalls this loop for under 1.5 s cannot fail it.
    for _ in range(20):
        await session.cmd.send(wire.encode(wire.Heartbeat()))
        await asyncio.sleep(0.1)
    assert session.key in broker.clients
    assert (await session.status())["dropped_in"] == 0
    await session.cmd.send(wire.encode(wire.HeartbeatRequest(0)))
    await session.close()


async def test_no_heartbeat_request_means_no_timeout(broker: Broker) -> None:
    session = await open_session(broker.port)
    await asyncio.sleep(0.5)
    assert session.key in broker.clients
    await session.close()


async def test_messages_sent_just_before_hanging_up_are_not_lost(broker: Broker) -> None:
    consumer = await open_session(broker.port, b"u", b"big\x00mem:backlog=-1")
    await consumer.bind(b"ex", b"prefix:")
    publisher = await open_session(broker.port)
    await paired(broker, publisher.key)
    payload = b"x" * 5000
    publisher.data.writer.write(
        b"".join(wire_message(b"ex", b"r", payload + b"%d" % i) for i in range(2000))
    )
    # Hang up at once: the command socket may close before the data is read.
    publisher.data.writer.write_eof()
    await publisher.cmd.close()
    got = await consumer.receive(2000)
    assert [m.payload[5000:] for m in got] == [b"%d" % i for i in range(2000)]
    await publisher.data.close()
    await consumer.close()


def wire_message(exchange: bytes, route: bytes, payload: bytes) -> bytes:
    from fqbroker.core.message import Message

    return Message(exchange, route, payload).publish_frame()


async def test_stopping_twice_is_harmless(settings: Settings) -> None:
    """An operator's /shutdown and a SIGTERM, or a test's teardown after a stop: the second
    stop finds everything already closed and returns (it raised "segment log ... is
    closed" from a disk queue)."""
    broker = Broker(settings)
    await broker.start()
    consumer = await open_session(broker.port, b"u", b"dq\x00disk:permanent")
    await consumer.bind(b"ex", b"prefix:")
    await broker.stop()
    await broker.stop()
    await consumer.close()
