"""Announced sizes hold no budget hostage (docs/memory.md, docs/security.md): a real broker
on loopback with a small memory budget, real sockets for every client.

Connections that announce messages and stop sending hold at most their user's cap and
are closed after ``partial_message_seconds``; a user with no right to publish on an
exchange reserves nothing for a message announced there; one user's connections hold no
more than its cap together; a connection with no user under ``auth = "password"``
reserves nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct
from pathlib import Path

from fqbroker.clients.fq.client import Client
from fqbroker.core.message import Message
from fqbroker.protocols.fq import wire
from fqbroker.protocols.lumberjack import encoder
from fqbroker.protocols.lumberjack.wire import encode_ack
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import TIMEOUT, RawConn, authenticate, on, port_of, running, wait_for
from tests.pki import password_logins

MiB = 1 << 20
KiB = 1 << 10


def _publisher_head(exchange: bytes, route: bytes, size: int) -> bytes:
    return (
        bytes((len(exchange),)) + exchange + bytes((len(route),)) + route + bytes(16)
    ) + struct.pack(">I", size)


async def _data_channel(port: int, user: bytes, password: bytes = b"pw") -> tuple[RawConn, RawConn]:
    """A publisher's command and data connections, paired."""
    cmd = await authenticate(port, user, password=password)
    reply = await cmd.frame()
    assert isinstance(reply, wire.AuthResponse), reply
    data = await RawConn.open(port)
    await data.send(wire.encode_hello(wire.Mode.DATA, reply.key))
    return cmd, data


async def _publish_and_receive(
    port: int, user: str, password: str, n: int, size: int, exchange: bytes = b"ex"
) -> None:
    """``n`` messages of ``size`` bytes from ``user``, all received by a consumer."""
    payload = b"g" * size
    async with (
        Client(port=port, source=f"{user}/good/mem:private", password=password) as c,
        Client(port=port, source=user, password=password) as pub,
    ):
        await c.bind(exchange, b"prefix:good")
        for _ in range(n):
            pub.publish(exchange, b"good", payload)
        async with asyncio.timeout(TIMEOUT):
            got = [await c.receive() for _ in range(n)]
        assert [m.payload for m in got] == [payload] * n


def _lumberjack_frame(size: int) -> bytes:
    """A window of one and a JSON frame of about ``size`` bytes."""
    return encoder.window(2, 1) + encoder.json_frame(1, b'{"m":"' + b"s" * size + b'"}')


async def test_stalled_lumberjack_frames_leave_the_budget_to_others(settings: Settings) -> None:
    """Six anonymous shippers each send all but the last byte of a frame of a quarter of
    the budget. Together they hold at most the anonymous user's cap; an fq publisher's
    messages all get through meanwhile; each stalled connection is closed after
    partial_message_seconds and the budget is all given back."""
    settings.memory_budget = 8 * MiB
    settings.partial_message_seconds = 0.5
    on(settings, "lumberjack", max_frame=4 * MiB)
    async with running(settings) as broker:
        frame = _lumberjack_frame(2 * MiB - 4 * KiB)
        stalled = []
        for _ in range(6):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port_of(broker, "lumberjack")
            )
            writer.write(frame[:-1])
            stalled.append((reader, writer))
        await wait_for(lambda: broker.budget.used >= 3 * MiB)
        assert broker.budget.held_by(None) <= broker.budget.per_user
        await _publish_and_receive(broker.port, "good", "pw", 100, 16 * KiB)
        for reader, _ in stalled:
            async with asyncio.timeout(TIMEOUT):
                with contextlib.suppress(ConnectionError):
                    # Closed, no ACK: at most keepalives while it waited for the budget.
                    got = await reader.read()
                    assert got == encode_ack(2, 0) * (len(got) // 6), got
        await wait_for(lambda: broker.front_ends["lumberjack"].counters.open == 0)
        await wait_for(lambda: broker.budget.used == 0)
        assert broker.limits.bad_input["lumberjack"] == 6
        for _, writer in stalled:
            writer.close()


async def test_no_reservation_for_a_message_its_user_may_not_publish(settings: Settings) -> None:
    """bob may publish only on "bobs". He announces most of the budget on "ex" over the
    data socket and sends 10 bytes: nothing is reserved, his data channel is closed, and
    root's publishing on "ex" goes on unaffected."""
    from fqbroker.storage.configdb.users import Users

    users = Users(settings.config_db)
    users.add("root", "rootpw")
    users.allow("root", "admin", "*")
    users.add("bob", "bobpw")
    users.allow("bob", "publish", "bobs")
    users.allow("bob", "queue", "*")
    users.close()
    settings.auth = "password"
    settings.memory_budget = 8 * MiB
    async with running(settings) as broker:
        cmd, data = await _data_channel(broker.port, b"bob", b"bobpw")
        await data.send(_publisher_head(b"ex", b"r", 8 * MiB - 2 * KiB) + bytes(10))
        assert await data.closed() == b""
        assert broker.budget.used == 0
        assert broker.limits.bad_input["data"] == 1
        await _publish_and_receive(broker.port, "root", "rootpw", 100, 16 * KiB)
        await wait_for(lambda: broker.budget.used == 0)
        await cmd.close()


async def test_one_users_connections_reserve_no_more_than_its_cap(settings: Settings) -> None:
    """Two data channels of user "u" each announce 3 MiB against a per-user cap of 4 MiB:
    the second waits for the first, alone; user "v" reserves and publishes meanwhile.
    Once the first message is whole, the second is read too."""
    settings.memory_budget = 16 * MiB
    settings.max_reserved_per_user = 4 * MiB
    async with running(settings) as broker:
        async with Client(port=broker.port, source="c/big/mem:private") as c:
            await c.bind(b"ex", b"prefix:")
            first = await _data_channel(broker.port, b"u")
            second = await _data_channel(broker.port, b"u")
            size = 3 * MiB
            await first[1].send(_publisher_head(b"ex", b"r", size) + bytes(10))
            await wait_for(lambda: broker.budget.held_by(b"u") >= size)
            await second[1].send(_publisher_head(b"ex", b"r", size) + bytes(10))
            await wait_for(lambda: broker.budget.waiting or _user_waiting(broker))
            await asyncio.sleep(0.1)
            assert broker.budget.held_by(b"u") <= 4 * MiB
            assert broker.budget.used <= 4 * MiB
            # Another user is not held up by u's waiting connection.
            other = await _data_channel(broker.port, b"v")
            await other[1].send(_publisher_head(b"ex", b"r", size) + bytes(size))
            async with asyncio.timeout(TIMEOUT):
                assert len((await c.receive()).payload) == size
            # The first completes: the second is granted and completes too.
            await first[1].send(bytes(size - 10))
            await second[1].send(bytes(size - 10))
            async with asyncio.timeout(TIMEOUT):
                assert [len((await c.receive()).payload) for _ in range(2)] == [size, size]
            for conn in (*first, *second, *other):
                await conn.close()
        await wait_for(lambda: broker.budget.used == 0)


def _user_waiting(broker: Broker) -> bool:
    entry = broker.budget._users.get(b"u")
    return entry is not None and bool(entry.waiters)


async def test_a_message_over_the_connections_cap_is_refused_not_waited_for(
    settings: Settings,
) -> None:
    """max_reserved_per_connection bounds the largest message a connection may be read:
    one over it is discarded as it arrives and counted size_dropped, and the channel
    carries on."""
    settings.memory_budget = 16 * MiB
    settings.max_reserved_per_connection = 2 * MiB
    async with running(settings) as broker:
        async with Client(port=broker.port, source="c/big/mem:private") as c:
            await c.bind(b"ex", b"prefix:")
            cmd, data = await _data_channel(broker.port, b"u")
            await data.send(_publisher_head(b"ex", b"r", 3 * MiB) + bytes(3 * MiB))
            await data.send(_publisher_head(b"ex", b"r", 5) + b"after")
            async with asyncio.timeout(TIMEOUT):
                assert (await c.receive()).payload == b"after"
            assert broker.router.aggregate.size_dropped == 1
            await cmd.close()
            await data.close()
        await wait_for(lambda: broker.budget.used == 0)


async def test_a_stalled_fq_message_is_closed_and_given_back(settings: Settings) -> None:
    """A publisher announces a large message on the data socket and stops: after
    partial_message_seconds its channel is closed and its reservation given back."""
    settings.memory_budget = 16 * MiB
    settings.partial_message_seconds = 0.3
    async with running(settings) as broker:
        cmd, data = await _data_channel(broker.port, b"u")
        await data.send(_publisher_head(b"ex", b"r", 4 * MiB) + bytes(10))
        await wait_for(lambda: broker.budget.used >= 4 * MiB)
        assert await data.closed() == b""
        await wait_for(lambda: broker.budget.used == 0)
        assert broker.limits.bad_input["data"] == 1
        await cmd.close()


async def test_an_anonymous_shipper_reserves_nothing_under_password_auth(
    settings: Settings,
) -> None:
    """Under auth = "password" a Lumberjack listener opened with ``anonymous = true`` has
    connections with no user: a partial frame beyond one read closes one, nothing
    reserved."""
    settings.auth = "password"
    settings.memory_budget = 16 * MiB
    on(settings, "lumberjack", max_frame=4 * MiB, anonymous=True)
    async with running(settings) as broker:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(broker, "lumberjack"))
        frame = _lumberjack_frame(2 * MiB)
        writer.write(frame[: 1 * MiB])
        async with asyncio.timeout(TIMEOUT):
            with contextlib.suppress(ConnectionError):
                assert await reader.read() == b""
        assert broker.budget.used == 0
        assert broker.limits.bad_input["lumberjack"] == 1
        writer.close()


async def test_a_peer_reserves_what_it_announces(settings: Settings) -> None:
    """A peer-mode data channel holds what its message announces while the message
    arrives (its decode copies are reserved only once it is whole), and the message is
    delivered once it is."""
    settings.memory_budget = 64 * MiB
    async with running(settings) as broker:
        async with Client(port=broker.port, source="c/pq/mem:private") as c:
            await c.bind(b"ex", b"prefix:")
            cmd = await authenticate(broker.port, b"peer")
            reply = await cmd.frame()
            assert isinstance(reply, wire.AuthResponse)
            data = await RawConn.open(broker.port)
            await data.send(wire.encode_hello(wire.Mode.PEER, reply.key, bytes([10, 9, 9, 9])))
            payload = bytes(4 * MiB)
            frame = Message(b"ex", b"r", payload, sender=b"s", hops=bytes([10, 9, 9, 9]))
            wire_frame = frame.peer_frame()
            await data.send(wire_frame[: 1 * MiB])
            await wait_for(lambda: broker.budget.used > 0)
            await asyncio.sleep(0.1)
            assert broker.budget.used == len(wire_frame)
            await data.send(wire_frame[1 * MiB :])
            async with asyncio.timeout(TIMEOUT):
                assert (await c.receive()).payload == payload
            await cmd.close()
            await data.close()
        await wait_for(lambda: broker.budget.used == 0)


async def test_a_submit_over_the_connections_cap_gets_413(settings: Settings) -> None:
    """/submit reserves through the same share: a body over what one connection may
    reserve is refused before it is read; one under it is published."""
    settings.max_reserved_per_connection = 1 * MiB
    async with running(settings) as broker:
        async with Client(port=broker.port, source="u") as c:
            await c.bind(b"ex", b"prefix:")
            for size, status in ((MiB, b"413"), (256 * KiB, b"200")):
                reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
                body = b"x" * size  # reserved twice: the body and its message
                writer.write(
                    b"POST /submit HTTP/1.0\r\nX-Fq-Exchange: ex\r\nX-Fq-Route: r\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(body) + body
                )
                async with asyncio.timeout(TIMEOUT):
                    reply = await reader.read()
                assert reply.startswith(b"HTTP/1.1 " + status), reply[:80]
                writer.close()
            async with asyncio.timeout(TIMEOUT):
                assert (await c.receive()).payload == b"x" * (256 * KiB)
        assert broker.budget.used == 0


async def test_a_certificate_shipper_reserves_as_its_user(
    settings: Settings, tmp_path: Path
) -> None:
    """A shipper logged in by its client certificate reserves from its user's share, the
    one that user's fq connections count against."""
    logins = password_logins(settings, tmp_path, {"shipper": [("publish", "logging")]})
    on(settings, "lumberjack", tls_cert=logins.cert, tls_key=logins.key, max_frame=4 * MiB)
    settings.memory_budget = 16 * MiB
    async with running(settings) as broker:
        _, writer = await asyncio.open_connection(
            "127.0.0.1",
            port_of(broker, "lumberjack"),
            ssl=logins.context("shipper"),
            server_hostname="127.0.0.1",
        )
        frame = _lumberjack_frame(2 * MiB)
        writer.write(frame[: 1 * MiB])
        await wait_for(lambda: broker.budget.held_by(b"shipper") >= 2 * MiB)
        assert broker.budget.held_by(None) == 0
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()
        await wait_for(lambda: broker.budget.used == 0)
