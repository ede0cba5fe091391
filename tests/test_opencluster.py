"""The OpenCluster listener against real sockets: a session as the 2011 C client runs it,
every command's reply, values and expiry, restarts (clean, and kill -9 of a real fqd),
bad input per limit closing only that connection, flow control and max_keys.

The broker is driven with the wire codec's encoders over raw sockets, as the 2011 client
would send its frames; the vectors are the protocol's (§4.3 of our notes,
docs/opencluster-protocol.md)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import struct
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fqbroker.config import OpenCluster, Settings
from fqbroker.frontends.opencluster import wire
from fqbroker.server.broker import Broker
from fqbroker.storage.kvstore import KVStore

from .conftest import TIMEOUT, running


def with_opencluster(settings: Settings, **values: Any) -> Settings:
    settings.opencluster = dataclasses.replace(OpenCluster(), listen="127.0.0.1:0", **values)
    return settings


@pytest.fixture
async def oc(settings: Settings) -> AsyncIterator[Broker]:
    async with running(with_opencluster(settings)) as broker:
        yield broker


def oc_port(broker: Broker) -> int:
    address = broker.front_ends["opencluster"].address
    assert address is not None
    return address[1]


def store_of(broker: Broker) -> KVStore:
    state = broker.front_ends["opencluster"].state
    assert isinstance(state, KVStore)
    return state


def h(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


HELLO_REPLY = h(
    "0001 000a 00000000 00000000"  # ack of hello
    "0064 0000 00000000 00000004 00000000"  # serverlist push (user id 0), count 0
    "006e 0000 00000001 00000088 0000000f 00000010"  # hashmasks push (user id 1)
    + "".join(f"{bucket:08x} 00000000" for bucket in range(16))
)
GOLDEN_SET = h(
    "07d0 0000 00000000 00000020 00000000 0a6f8dc5 00000000 00000000 00000008"
    "7465737464617461 0000002d"
)


class Conn:
    """A raw client connection: frames out, frames back read by their headers."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Conn:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def send(self, *frames: bytes) -> None:
        self.writer.write(b"".join(frames))
        await self.writer.drain()

    async def frame(self) -> wire.Frame:
        async with asyncio.timeout(TIMEOUT):
            header = await self.reader.readexactly(wire.HEADER_SIZE)
            command, repcmd, userid, size = struct.unpack(">hhii", header)
            return wire.Frame(command, repcmd, userid, await self.reader.readexactly(size))

    async def frames(self, n: int) -> list[wire.Frame]:
        return [await self.frame() for _ in range(n)]

    async def raw(self, n: int) -> bytes:
        async with asyncio.timeout(TIMEOUT):
            return await self.reader.readexactly(n)

    async def closed_by_broker(self) -> None:
        async with asyncio.timeout(TIMEOUT):
            assert await self.reader.read() == b""

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


@pytest.fixture
async def conn(oc: Broker) -> AsyncIterator[Conn]:
    c = await Conn.open(oc_port(oc))
    yield c
    await c.close()


async def get_int(c: Conn, name: bytes, userid: int = 0) -> int | None:
    await c.send(wire.get_int(userid, name))
    f = await c.frame()
    if f.command == wire.FAIL:
        return None
    assert (f.command, f.repcmd, f.userid) == (wire.DATA_INT, wire.GET_INT, userid)
    return wire.decode_data_int(f.payload)[2]


async def get_string(c: Conn, name: bytes, userid: int = 0) -> bytes | None:
    await c.send(wire.get_string(userid, name))
    f = await c.frame()
    if f.command == wire.FAIL:
        return None
    assert (f.command, f.repcmd, f.userid) == (wire.DATA_STR, wire.GET_STRING, userid)
    return wire.decode_data_str(f.payload)[2]


async def acked(c: Conn, *frames: bytes) -> None:
    """Send sets; every one acknowledged, in order."""
    await c.send(*frames)
    for f, sent in zip(await c.frames(len(frames)), frames, strict=True):
        command, _, userid, _ = struct.unpack_from(">hhii", sent)
        assert (f.command, f.repcmd, f.userid, f.payload) == (wire.ACK, command, userid, b"")


# --- the 2011 C client --------------------------------------------------------------------


async def test_a_session_as_the_2011_c_client_runs_it(oc: Broker) -> None:
    loop = asyncio.get_running_loop()
    with socket.socket() as sock:
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", oc_port(oc)))
        await loop.sock_sendall(sock, wire.hello(0))
        async with asyncio.timeout(TIMEOUT):
            # One recv: the C client reads hello's ack and both pushes in one read.
            assert await loop.sock_recv(sock, 65536) == HELLO_REPLY
            # It acknowledges the hashmasks push with repcmd 100, and reuses user id 0.
            await loop.sock_sendall(sock, wire.encode_frame(wire.ACK, wire.SERVERLIST, 1))
            await loop.sock_sendall(sock, GOLDEN_SET)
            assert await loop.sock_recv(sock, 65536) == h("0001 07d0 00000000 00000000")
            await loop.sock_sendall(sock, h("0834 0000 00000000 00000008 00000000 0a6f8dc5"))
            assert await loop.sock_recv(sock, 65536) == h(
                "0839 0834 00000000 0000000c 00000000 0a6f8dc5 0000002d"
            )
            await loop.sock_sendall(sock, wire.get_int(0, b"clientname"))
            assert await loop.sock_recv(sock, 65536) == h("0002 0834 00000000 00000000")
            # A second hello: the pushes go on counting.
            await loop.sock_sendall(sock, wire.hello(0))
            reply = b""
            while len(reply) < len(HELLO_REPLY):
                reply += await loop.sock_recv(sock, 65536)
            assert struct.unpack_from(">hhi", reply, 12) == (wire.SERVERLIST, 0, 2)
            assert struct.unpack_from(">hhi", reply, 28) == (wire.HASHMASKS, 0, 3)
            await loop.sock_sendall(sock, wire.goodbye(0))
            assert await loop.sock_recv(sock, 65536) == h("0001 0014 00000000 00000000")
            assert await loop.sock_recv(sock, 65536) == b""  # closed after the ack
    assert store_of(oc).get(wire.fnv1a32(b"testdata")) is not None


# --- every command ------------------------------------------------------------------------


async def test_control_commands_are_acked_and_the_unspecified_answered_unknown(
    conn: Conn,
) -> None:
    await conn.send(
        wire.ping(7),
        wire.shuttingdown(8),
        wire.serverhello(9, b"10.0.0.1:13600"),
        *(wire.capabilities(10, c) for c in (wire.SET_INT, wire.GET_STRING, wire.HELLO)),
        *(wire.capabilities(11, c) for c in (wire.LOCK, wire.SET_LONG, 4242, wire.HASHMASKS)),
    )
    replies = await conn.frames(10)
    assert [(f.command, f.repcmd, f.userid) for f in replies] == [
        (wire.ACK, wire.PING, 7),
        (wire.ACK, wire.SHUTTINGDOWN, 8),
        (wire.ACK, wire.SERVERHELLO, 9),
        *[(wire.ACK, wire.CAPABILITIES, 10)] * 3,
        *[(wire.FAIL, wire.CAPABILITIES, 11)] * 4,
    ]
    never = sorted(wire.NEVER_SPECIFIED)
    # Commands that never had a format, ids nobody defined, server pushes sent to us.
    others = [*never, 7777, -5, wire.SERVERLIST, wire.HASHMASK]
    await conn.send(*(wire.encode_frame(c, 0, 40 + i) for i, c in enumerate(others)))
    replies = await conn.frames(len(others))
    assert [(f.command, f.repcmd, f.userid, f.payload) for f in replies] == [
        (wire.UNKNOWN, c, 40 + i, b"") for i, c in enumerate(others)
    ]
    # Replies from the client (to pushes, whatever repcmd) are ignored: the next
    # answer is the ping's.
    await conn.send(
        wire.ack(wire.HASHMASKS, 1),
        wire.fail(wire.SERVERLIST, 0),
        wire.failinfo(wire.SERVERLIST, 0, 1, b"no"),
        wire.unknown(wire.HASHMASKS, 1),
        wire.ping(99),
    )
    f = await conn.frame()
    assert (f.command, f.repcmd, f.userid) == (wire.ACK, wire.PING, 99)
    await conn.send(wire.goodbye(5), wire.ping(6))  # nothing after goodbye is answered
    f = await conn.frame()
    assert (f.command, f.repcmd, f.userid) == (wire.ACK, wire.GOODBYE, 5)
    await conn.closed_by_broker()


async def test_set_and_get_ints_and_strings(oc: Broker, conn: Conn) -> None:
    await acked(
        conn,
        wire.set_int(1, b"counter", -7),
        wire.set_string(2, b"greeting", b"hello\x00world"),
        wire.set_string(3, b"empty", b""),
        wire.set_int(4, b"counter", 2**31 - 1, map_hash=5),  # another map: another key
    )
    assert await get_int(conn, b"counter", 12) == -7
    assert await get_string(conn, b"greeting") == b"hello\x00world"
    assert await get_string(conn, b"empty") == b""
    await conn.send(wire.get_int(3, b"counter", map_hash=5))
    f = await conn.frame()
    assert wire.decode_data_int(f.payload) == (5, wire.fnv1a32(b"counter"), 2**31 - 1)
    # Not found: fail, echoing the user id.
    await conn.send(wire.get_string(77, b"nothing"), wire.get_int(78, b"nothing"))
    assert [(f.command, f.repcmd, f.userid) for f in await conn.frames(2)] == [
        (wire.FAIL, wire.GET_STRING, 77),
        (wire.FAIL, wire.GET_INT, 78),
    ]
    # The wrong type: failinfo code 1.
    await conn.send(wire.get_string(5, b"counter"), wire.get_int(6, b"greeting"))
    wrong = await conn.frames(2)
    assert [(f.command, f.repcmd, f.userid) for f in wrong] == [
        (wire.FAILINFO, wire.GET_STRING, 5),
        (wire.FAILINFO, wire.GET_INT, 6),
    ]
    for f in wrong:
        code, text = wire.decode_failinfo(f.payload)
        assert code == 1 and text.startswith(b"wrong type: ")
    # A set may change a key's type.
    await acked(conn, wire.set_string(0, b"counter", b"now a string"))
    assert await get_string(conn, b"counter") == b"now a string"
    assert store_of(oc).keys == 4


async def test_a_pipelined_get_sees_the_sets_before_it_and_none_after(conn: Conn) -> None:
    await conn.send(
        wire.set_int(1, b"k", 1),
        wire.get_int(2, b"k"),
        wire.set_int(3, b"k", 2),
        wire.get_int(4, b"k"),
        wire.set_int(5, b"k", 3),
        wire.goodbye(6),
    )
    replies = await conn.frames(6)
    assert [(f.command, f.userid) for f in replies] == [
        (wire.ACK, 1), (wire.DATA_INT, 2), (wire.ACK, 3), (wire.DATA_INT, 4), (wire.ACK, 5),
        (wire.ACK, 6),
    ]  # fmt: skip
    assert wire.decode_data_int(replies[1].payload)[2] == 1
    assert wire.decode_data_int(replies[3].payload)[2] == 2
    await conn.closed_by_broker()  # goodbye behind a set: closed once its ack is written
