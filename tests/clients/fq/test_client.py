"""fqbroker.clients.fq.client: the sans-IO command channel alone, then the client against a
real broker."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from fqbroker.clients.fq.client import (
    Authenticated,
    Client,
    ClientClosed,
    ClientError,
    CommandChannel,
    Refused,
    Reply,
    parse_source,
)
from fqbroker.core.message import hop_addresses
from fqbroker.errors import ProtocolError
from fqbroker.protocols.fq import wire
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import NODE_ID, TIMEOUT
from tests.loopback import LoopbackServer
from tests.vectors import BROKER_STATUS_KEYS

Connect = Callable[..., Awaitable[Client]]
AUTO_QUEUE = re.compile(rb"q-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


# --- parse_source -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "user", "queue", "kind"),
    [
        ("user", b"user", None, b"mem"),
        ("user/", b"user", None, b"mem"),
        ("", b"", None, b"mem"),
        ("u/bob", b"u", b"bob", b"mem"),
        ("u/bob/", b"u", b"bob", b""),  # an empty type is sent empty; fqd reads it as mem
        (
            "USER/bob/mem:public,drop,backlog=100000",
            b"USER",
            b"bob",
            b"mem:public,drop,backlog=100000",
        ),
        (
            "fqd-peera//mem:drop,private,backlog=4096",
            b"fqd-peera",
            None,
            b"mem:drop,private,backlog=4096",
        ),
        ("u/q/disk:a/b", b"u", b"q", b"disk:a/b"),  # only the first two slashes split
        ("u/" + "n" * 200 + "/" + "t" * 200, b"u", b"n" * 127, b"t" * 127),
    ],
)
def test_parse_source(source: str, user: bytes, queue: bytes | None, kind: bytes) -> None:
    got_user, field = parse_source(source)
    got_queue, nul, got_kind = field.partition(b"\0")
    assert got_user == user
    assert nul == b"\0"
    if queue is None:
        assert AUTO_QUEUE.fullmatch(got_queue), got_queue
    else:
        assert got_queue == queue
    assert got_kind == kind


def test_parse_source_generates_a_fresh_queue_each_time() -> None:
    assert parse_source("u")[1] != parse_source("u")[1]


# --- CommandChannel (sans I/O) ------------------------------------------------------------


def test_hello_is_what_fq_rcvr_sends() -> None:
    # docs/fq-protocol.md §1.3: fq_rcvr -u tuser/tq/mem:public -P secret
    user, field = parse_source("tuser/tq/mem:public")
    sent = CommandChannel[int]().hello(user, field, b"secret")
    assert sent.hex() == (
        "cc50cafeaaaa000000057475736572000d7471006d656d3a7075626c69630006736563726574"
    )


def authed_channel() -> CommandChannel[str]:
    channel = CommandChannel[str]()
    channel.receive_data(wire.encode(wire.AuthResponse(b"k" * 127)) + b"\xbe\xa7")
    assert channel.next_event() == Authenticated(b"k" * 127)
    return channel


def test_auth_then_heartbeat_is_answered_with_one_heartbeat() -> None:
    channel = authed_channel()
    assert channel.data_to_send() == b""
    assert channel.next_event() is None  # the heartbeat is handled, not reported
    assert channel.data_to_send() == b"\xbe\xa7"
    assert channel.data_to_send() == b""


def test_refusal_carries_the_exact_text() -> None:
    channel = CommandChannel[str]()
    channel.receive_data(wire.encode(wire.ErrorReply("requested queue is private and in use\n")))
    assert channel.next_event() == Refused("requested queue is private and in use\n")


def test_replies_pair_with_requests_first_in_first_out_across_heartbeats() -> None:
    channel = authed_channel()
    channel.next_event()
    out = channel.request(wire.BindRequest(0x100, b"ex", b"prefix:"), "bind")
    assert out == wire.encode(wire.BindRequest(0x100, b"ex", b"prefix:"))
    channel.request(wire.StatusRequest(), "status")
    channel.request(wire.UnbindRequest(7, b"ex"), "unbind")
    replies = (
        wire.encode(wire.BindResponse(7))
        + b"\xbe\xa7"
        + wire.encode(wire.Status((("dropped_in", 0),)))
        + b"\xbe\xa7"
        + wire.encode(wire.UnbindResponse(7))
    )
    events = []
    for i in range(len(replies)):  # one byte at a time: same events
        channel.receive_data(replies[i : i + 1])
        while (event := channel.next_event()) is not None:
            events.append(event)
    assert events == [
        Reply("bind", wire.BindResponse(7)),
        Reply("status", wire.Status((("dropped_in", 0),))),
        Reply("unbind", wire.UnbindResponse(7)),
    ]
    assert channel.data_to_send() == b"\xbe\xa7" * 3
    assert channel.abandon() == []


@pytest.mark.parametrize(
    "reply",
    [
        wire.BindResponse(1),  # nothing was asked
        wire.ErrorReply("client heartbeat failed"),  # libfq: a protocol violation after auth
    ],
)
def test_out_of_order_frames_are_protocol_errors(reply: wire.Frame) -> None:
    channel = authed_channel()
    channel.receive_data(wire.encode(reply))
    with pytest.raises(ProtocolError):
        channel.next_event()


def test_a_reply_of_the_wrong_kind_is_a_protocol_error() -> None:
    channel = authed_channel()
    channel.request(wire.StatusRequest(), "status")
    channel.receive_data(wire.encode(wire.BindResponse(1)))
    with pytest.raises(ProtocolError):
        channel.next_event()


def test_abandon_returns_unanswered_tokens_in_order() -> None:
    channel = authed_channel()
    channel.request(wire.StatusRequest(), "a")
    channel.request(wire.StatusRequest(), "b")
    assert channel.abandon() == ["a", "b"]


# --- against a broker ---------------------------------------------------------------------


@pytest.fixture
async def connect(broker: Broker) -> AsyncIterator[Connect]:
    """Connected clients to ``broker``, all closed at the end of the test."""
    clients: list[Client] = []

    async def make(source: str = "user", **kwargs: Any) -> Client:
        client = Client(port=broker.port, source=source, **kwargs)
        clients.append(client)
        await client.connect()
        return client

    yield make
    async with asyncio.timeout(TIMEOUT):
        for client in clients:
            await client.close()


async def disconnected(client: Client) -> None:
    """Wait (polling; bounded by the caller) until the client noticed its link is gone."""
    # The client has no "disconnected" event to wait on.
    while client.connected:
        await asyncio.sleep(0.005)


async def test_round_trip_carries_route_sender_and_hops(connect: Connect) -> None:
    async with asyncio.timeout(TIMEOUT):
        sub = await connect("carol-sub")
        pub = await connect("carol")
        assert await sub.bind(b"ex", b"prefix:") != wire.BIND_ILLEGAL
        assert pub.publish(b"ex", b"a.b", b"hello")
        await pub.flush()
        msg = await sub.receive()
        assert (msg.exchange, msg.route, msg.payload) == (b"ex", b"a.b", b"hello")
        assert msg.sender == b"carol"
        assert hop_addresses(msg.hops) == [NODE_ID, "127.0.0.1"]
        assert len(msg.msgid) == 16 and msg.msgid != bytes(16)


async def test_messages_keep_their_order_and_ids(connect: Connect) -> None:
    async with asyncio.timeout(TIMEOUT):
        sub = await connect()
        pub = await connect()
        await sub.bind(b"ex", b'prefix:"r."')
        for i in range(500):
            pub.publish(b"ex", b"r.x", str(i).encode(), msgid=i.to_bytes(16, "big"))
        await pub.flush()
        got = []
        async for msg in sub.messages():
            got.append(msg)
            if len(got) == 500:
                break
        assert [m.payload for m in got] == [str(i).encode() for i in range(500)]
        assert [m.msgid for m in got] == [i.to_bytes(16, "big") for i in range(500)]


async def test_status_keys_come_in_fq_order(connect: Connect) -> None:
    async with asyncio.timeout(TIMEOUT):
        client = await connect()
        await client.bind(b"ex", b"prefix:")
        client.publish(b"ex", b"r", b"x")
        await client.flush()
        await client.receive()  # our own message came back: the data channel is paired
        status = await client.status()
        assert list(status) == BROKER_STATUS_KEYS
        assert status["msgs_in"] == 1 and status["routed"] == 1 and status["msgs_out"] == 1


async def test_pipelined_requests_are_answered_in_order(connect: Connect) -> None:
    async with asyncio.timeout(TIMEOUT):
        client = await connect()
        results = await asyncio.gather(
            client.bind(b"ex", b'prefix:"a"'),
            client.status(),
            client.bind(b"ex", b"no such program"),
            client.bind(b"ex", b'prefix:"b"'),
            client.status(),
            client.bind(b"ex", b'prefix:"c"'),
        )
        a, status1, bad, b, status2, c = results
        assert isinstance(status1, dict) and isinstance(status2, dict)
        assert bad == wire.BIND_ILLEGAL
        assert wire.BIND_ILLEGAL not in (a, b, c)
        assert len({a, b, c}) == 3


async def test_unbind(connect: Connect) -> None:
    async with asyncio.timeout(TIMEOUT):
        sub = await connect()
        pub = await connect()
        route_id = await sub.bind(b"ex", b"prefix:")
        await sub.bind(b"marker", b"prefix:")
        assert await sub.unbind(b"ex", route_id) is True
        assert await sub.unbind(b"ex", route_id) is False
        assert await sub.unbind(b"nope", 12345) is False
        pub.publish(b"ex", b"r", b"unbound")
        pub.publish(b"marker", b"r", b"marker")  # routed after the first: order is kept
        await pub.flush()
        assert (await sub.receive()).payload == b"marker"
        assert (await pub.status())["no_route"] == 1


@pytest.mark.parametrize(
    ("first", "second", "text"),
    [
        ("u/privq", "u/privq", "requested queue is private and in use\n"),
        ("u/pubq/mem:public", "u/pubq/mem:private", "requested private, queue is public"),
        ("u/dq/mem:public,drop", "u/dq/mem:public,block", "request block, queue is drop"),
        (None, "u/q/bogus", "invalid queue type: bogus"),
        (None, "u/q/mem:public, drop", "invalid queue param:  drop"),
        (None, "u" * 128, "user name is too long"),
    ],
)
async def test_refusals_raise_client_error_with_fq_text(
    connect: Connect, first: str | None, second: str, text: str
) -> None:
    async with asyncio.timeout(TIMEOUT):
        if first is not None:
            await connect(first)
        with pytest.raises(ClientError) as info:
            await connect(second)
        assert info.value.text == text
        assert str(info.value) == text


async def test_reconnect_rebinds_after_the_broker_drops_the_client(
    connect: Connect, broker: Broker
) -> None:
    async with asyncio.timeout(TIMEOUT):
        sub = await connect("sub")
        pub = await connect("pub")
        first_id = await sub.bind(b"ex", b"prefix:")
        await sub.bind(b"other", b'exact:"x"')
        for session in [s for s in broker.clients.values() if s.user == b"sub"]:
            session.close()
        assert await sub.wait_connected(newer_than=1) == 2
        assert len([s for s in broker.clients.values() if s.user == b"sub"]) == 1
        pub.publish(b"ex", b"again", b"after reconnect")
        pub.publish(b"other", b"x", b"on the second binding")
        await pub.flush()
        assert (await sub.receive()).payload == b"after reconnect"
        assert (await sub.receive()).payload == b"on the second binding"
        # The id bind() returned still unbinds, whatever the new connection numbered it.
        assert await sub.unbind(b"ex", first_id) is True


async def test_reconnect_after_broker_restart_rebinds_then_sends_the_backlog(
    connect: Connect, broker: Broker, settings: Settings
) -> None:
    # One client that consumes what it publishes: after a reconnect it re-binds before it
    # sends its backlog, so its own message must come back.
    async with asyncio.timeout(TIMEOUT):
        client = await connect("loop")
        await client.bind(b"ex", b"prefix:")
        port = broker.port
        await broker.stop()
        await disconnected(client)
        assert client.publish(b"ex", b"r", b"published while away")
        with pytest.raises(ConnectionError):
            await client.status()  # no connection to ask
        settings.port = port
        again = Broker(settings)
        await again.start()
        try:
            await client.flush()
            msg = await client.receive()
            assert msg.payload == b"published while away"
            assert msg.sender == b"loop"
            assert hop_addresses(msg.hops) == [NODE_ID, "127.0.0.1"]
            assert client.connections == 2
        finally:
            await client.close()
            await again.stop()


async def test_backlog_is_bounded_while_disconnected(connect: Connect, broker: Broker) -> None:
    async with asyncio.timeout(TIMEOUT):
        pub = await connect("pub", backlog=3)
        await broker.stop()
        await disconnected(pub)
        assert [pub.publish(b"ex", b"r", b"x") for _ in range(5)] == [True] * 3 + [False] * 2
        assert pub.dropped == 2


async def test_close_delivers_what_was_published(connect: Connect) -> None:
    async with asyncio.timeout(TIMEOUT):
        sub = await connect()
        pub = await connect()
        await sub.bind(b"ex", b"prefix:")
        for i in range(1000):
            pub.publish(b"ex", b"r", b"%d" % i)
        await pub.close()  # no flush: close() itself writes and waits for the broker
        got = [(await sub.receive()).payload for _ in range(1000)]
        assert got == [b"%d" % i for i in range(1000)]
        with pytest.raises(ClientClosed):
            pub.publish(b"ex", b"r", b"too late")


async def test_publish_before_connect_is_sent_on_connect(connect: Connect, broker: Broker) -> None:
    async with asyncio.timeout(TIMEOUT):
        sub = await connect()
        await sub.bind(b"ex", b"prefix:")
        pub = Client(port=broker.port)
        assert pub.publish(b"ex", b"r", b"early")  # kept until connect()
        await pub.connect()
        await pub.close()
        assert (await sub.receive()).payload == b"early"


async def test_a_slow_consumer_pauses_reading_and_loses_nothing(
    connect: Connect,
) -> None:
    async with asyncio.timeout(TIMEOUT):
        sub = await connect()
        pub = await connect()
        await sub.bind(b"ex", b"prefix:")
        n = 15000  # over the client's inbox limit, under the queue's default backlog
        for i in range(n):
            pub.publish(b"ex", b"r", b"%d" % i)
        await pub.flush()
        while sub.received_backlog < 10000:  # filling up is the point
            await asyncio.sleep(0.01)
        got = [(await sub.receive()).payload for _ in range(n)]
        assert got == [b"%d" % i for i in range(n)]
        assert (await sub.status())["dropped_in"] == 0


class HeartbeatTap(LoopbackServer):
    """A loopback relay between clients and a broker that counts the heartbeats crossing
    command connections each way: what the test waits on instead of the clock."""

    def __init__(self, broker_port: int) -> None:
        super().__init__()
        self.broker_port = broker_port
        self.accepted = 0
        self.ended = 0  # directions of relayed connections that ended
        self.to_broker = 0  # heartbeats the client sent
        self.to_client = 0  # heartbeats the broker sent (the one after auth included)
        self.changed = asyncio.Event()

    async def wait(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await self.changed.wait()
            self.changed.clear()

    def _count(self, frame: object, way: str) -> None:
        if isinstance(frame, wire.Heartbeat):
            setattr(self, way, getattr(self, way) + 1)
            self.changed.set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.broker_port)
        self.writers |= {writer, up_w}
        hello = await reader.readexactly(4)
        up_w.write(hello)
        cmd = hello == wire.Mode.CMD.to_bytes(4, "big")
        requests, replies = wire.ServerCommandDecoder(), wire.ClientCommandDecoder()
        self.spawn(self._pump(reader, up_w, requests if cmd else None, "to_broker"))
        self.spawn(self._pump(up_r, writer, replies if cmd else None, "to_client"))

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        decoder: wire.ServerCommandDecoder | wire.ClientCommandDecoder | None,
        way: str,
    ) -> None:
        try:
            while chunk := await reader.read(65536):
                writer.write(chunk)
                if decoder is not None:
                    decoder.feed(chunk)
                    while (frame := decoder.next_frame()) is not None:
                        self._count(frame, way)
        except (ConnectionError, ProtocolError):
            pass
        finally:
            writer.close()
            self.ended += 1
            self.changed.set()


async def test_heartbeats_keep_an_idle_client_connected(broker: Broker) -> None:
    # Both sides beat, and each drops the other after 3 intervals without hearing from it:
    # once four of the client's beats (four intervals) went by with nothing else said, the
    # link stood only because the heartbeats kept it. The interval leaves a loaded machine
    # 1.5 s of stall before either side may rightly give up; nothing here is timed.
    async with asyncio.timeout(30), HeartbeatTap(broker.port) as tap:
        client = Client(port=tap.port, heartbeat_ms=500)
        await client.connect()
        try:
            await tap.wait(lambda: (tap.to_broker >= 4 and tap.to_client >= 5) or tap.ended > 0)
            assert tap.ended == 0, "a side gave up on the link"
            assert client.connected and client.connections == 1
            assert tap.accepted == 2  # the command and data connections, never a reconnect
            assert len(broker.clients) == 1
            assert "dropped_in" in await client.status()
        finally:
            await client.close()


async def test_closed_client_raises_and_ends_iteration(connect: Connect) -> None:
    async with asyncio.timeout(TIMEOUT):
        client = await connect()
        await client.close()
        with pytest.raises(ClientClosed):
            await client.receive()
        assert [m async for m in client.messages()] == []
        with pytest.raises(ConnectionError):
            await client.status()


# --- against a scripted fake broker -------------------------------------------------------


class FakeBroker(LoopbackServer):
    """Authenticates everyone, then does what the test says with the command socket."""

    def __init__(
        self, on_command: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
    ) -> None:
        super().__init__()
        self.on_command = on_command
        self.seen: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        try:
            if await reader.readexactly(4) == wire.encode_hello(wire.Mode.CMD, b"")[:4]:
                decoder = wire.ServerCommandDecoder()
                while decoder.next_frame() is None:
                    decoder.feed(await reader.read(4096))
                writer.write(wire.encode(wire.AuthResponse(b"k" * 127)))
                await self.on_command(reader, writer)
            else:
                while chunk := await reader.read(4096):
                    self.seen.append(chunk)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def test_pending_requests_fail_with_connection_error_when_the_link_dies() -> None:
    async def close_on_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(2)

    async with asyncio.timeout(TIMEOUT), FakeBroker(close_on_request) as fake:
        client = Client(port=fake.port, reconnect=False)
        await client.connect()
        with pytest.raises(ConnectionError):
            await client.status()
        with pytest.raises(ClientClosed):
            await client.receive()
        await client.close()


async def test_server_heartbeats_are_answered() -> None:
    answered = asyncio.Event()

    async def heartbeat(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"\xbe\xa7")
        if await reader.readexactly(2) == b"\xbe\xa7":
            answered.set()
        await reader.read(1)

    async with (
        asyncio.timeout(TIMEOUT),
        FakeBroker(heartbeat) as fake,
        Client(port=fake.port, reconnect=False),
    ):
        await answered.wait()


async def test_a_silent_broker_is_dropped_after_three_heartbeat_intervals() -> None:
    requested = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if await reader.readexactly(4) == wire.encode(wire.HeartbeatRequest(20)):
            requested.set()
        while await reader.read(4096):  # the client's own heartbeats; we never answer
            pass

    async with asyncio.timeout(TIMEOUT), FakeBroker(silent) as fake:
        client = Client(port=fake.port, heartbeat_ms=20, reconnect=False)
        await client.connect()
        await requested.wait()
        with pytest.raises(ClientClosed):
            await client.receive()  # ends once the client gives up on the broker
        await client.close()
