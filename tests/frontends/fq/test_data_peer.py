"""Peer mode needs the peer right (docs/permissions.md).

A data socket in peer mode sends messages with the sender and hops they claim. Under
auth = "password" only a user with the ``peer`` right (or admin) relays them so; any
other user's messages are its own: sender its name, hops this broker and its address,
as on a plain data socket.
"""

from __future__ import annotations

import ipaddress

import pytest

from fqbroker.core.message import Message
from fqbroker.protocols.fq import wire
from fqbroker.settings.broker import Settings
from fqbroker.storage.configdb.users import Users
from tests.conftest import NODE_ID, RawConn, Session, authenticate, open_session, running

FORGED_HOPS = ipaddress.IPv4Address("10.9.9.9").packed


def users(settings: Settings) -> Settings:
    """ "relay" may relay as a peer, "carol" may not; both publish anywhere. "root" is an
    admin."""
    store = Users(settings.config_db)
    for name in ("relay", "carol"):
        store.add(name, name + "pw")
        store.allow(name, "publish", "*")
        store.allow(name, "queue", name + "*")
    store.allow("relay", "peer", "*")
    store.add("root", "rootpw")
    store.allow("root", "admin", "*")
    store.close()
    settings.auth = "password"
    return settings


async def login(
    port: int, user: bytes, password: bytes, mode: wire.Mode, queue: bytes = b""
) -> Session:
    cmd = await authenticate(port, user, queue or user + b"q", password)
    reply = await cmd.frame()
    assert isinstance(reply, wire.AuthResponse), reply
    data = await RawConn.open(port)
    await data.send(wire.encode_hello(mode, reply.key, peer_id=bytes([10, 8, 8, 8])))
    return Session(cmd, data, reply.key)


async def forged(session: Session, payload: bytes) -> None:
    msg = Message(b"ex", b"r", payload, sender=b"admin", hops=FORGED_HOPS)
    await session.data.send(msg.peer_frame())


@pytest.mark.parametrize(
    ("user", "sender", "hops"),
    [
        # Without the right: its own name, and stamped as a publisher from loopback.
        (b"carol", b"carol", ipaddress.IPv4Address(NODE_ID).packed + bytes([127, 0, 0, 1])),
        # With it: as sent, with this broker first in the hops.
        (b"relay", b"admin", ipaddress.IPv4Address(NODE_ID).packed + FORGED_HOPS),
        (b"root", b"admin", ipaddress.IPv4Address(NODE_ID).packed + FORGED_HOPS),
    ],
)
async def test_peer_mode_keeps_the_sender_only_with_the_peer_right(
    settings: Settings, user: bytes, sender: bytes, hops: bytes
) -> None:
    async with running(users(settings)) as broker:
        consumer = await login(broker.port, b"root", b"rootpw", wire.Mode.DATA, b"consumed")
        assert await consumer.bind(b"ex", b"prefix:") != wire.BIND_ILLEGAL
        password = b"rootpw" if user == b"root" else user + b"pw"
        peer = await login(broker.port, user, password, wire.Mode.PEER)
        await forged(peer, b"hello")
        (msg,) = await consumer.receive()
        assert (msg.payload, msg.sender, msg.hops) == (b"hello", sender, hops)
        await peer.close()
        await consumer.close()


async def test_peer_mode_is_unchanged_without_passwords(settings: Settings) -> None:
    async with running(settings) as broker:
        consumer = await open_session(broker.port, user=b"consumer")
        assert await consumer.bind(b"ex", b"prefix:") != wire.BIND_ILLEGAL
        peer = await login(broker.port, b"anyone", b"pw", wire.Mode.PEER)
        await forged(peer, b"hello")
        (msg,) = await consumer.receive()
        assert (msg.sender, msg.hops) == (
            b"admin",
            ipaddress.IPv4Address(NODE_ID).packed + FORGED_HOPS,
        )
        await peer.close()
        await consumer.close()
