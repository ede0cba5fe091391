"""fyrehose cannot authenticate, so it serves the datagram's own host only: a 19-byte
REQUEST (or a KEEPALIVE) naming a third party's address sends it nothing, unless
``send_elsewhere`` says so; and the listener stays on loopback unless ``allow_remote``.
Real UDP sockets on loopback: the victim listens on 127.0.0.2, the requester on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import pytest

from fqbroker.protocols.fyrehose import wire
from fqbroker.protocols.fyrehose.wire import Deliver, Keepalive, KeepaliveAck, Request
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import on, running, wait_for
from tests.e2e.fyrehose.test_fyrehose import TOKEN, backbone_of, fyrehose_address, push, udp


class Victim(asyncio.DatagramProtocol):
    """A third party on 127.0.0.2: counts whatever reaches it."""

    def __init__(self) -> None:
        self.received: list[bytes] = []

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.received.append(data)


@contextlib.asynccontextmanager
async def victim() -> AsyncIterator[tuple[Victim, int]]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.2", 0))
    transport, protocol = await asyncio.get_running_loop().create_datagram_endpoint(
        Victim, sock=sock
    )
    try:
        yield protocol, sock.getsockname()[1]
    finally:
        transport.close()


async def test_a_request_naming_a_third_party_sends_it_nothing(settings: Settings) -> None:
    async with running(on(settings, "fyrehose")) as broker:
        await push(broker, [b"m%d" % i for i in range(5)])
        await wait_for(lambda: backbone_of(broker).sequence == 5)
        async with victim() as (hit, port), udp(fyrehose_address(broker)) as c:
            # From 127.0.0.1, 19 bytes asking for 1..5 to be sent to 127.0.0.2; then the
            # requester's own REQUEST, answered once the broker has read the first.
            c.send(Request("127.0.0.2", port, 1, 5))
            c.send(Request("0.0.0.0", 0, 1, 1))
            got = await c.next()
            assert isinstance(got, Deliver) and got.seq == 1  # its own: served as before
            await asyncio.sleep(0.2)
            assert hit.received == []
            # Nor may a KEEPALIVE subscribe the third party to the stream.
            c.send(Keepalive("127.0.0.2", port, wire.NO_FLAGS, TOKEN))
            await c.nothing(0.2)  # not even its KEEPALIVE-ACK
            await push(broker, [b"later"])
            await wait_for(lambda: backbone_of(broker).sequence == 6)
            await asyncio.sleep(0.2)
            assert hit.received == []
        assert backbone_of(broker).dropped["elsewhere"] == 2


async def test_send_elsewhere_serves_any_address(settings: Settings) -> None:
    async with running(on(settings, "fyrehose", send_elsewhere=True)) as broker:
        await push(broker, [b"m%d" % i for i in range(5)])
        await wait_for(lambda: backbone_of(broker).sequence == 5)
        async with victim() as (hit, port), udp(fyrehose_address(broker)) as c:
            c.send(Request("127.0.0.2", port, 1, 5))
            await wait_for(lambda: len(hit.received) == 5)
            c.keepalive()
            assert await c.next() == KeepaliveAck(TOKEN)


async def test_fqd_refuses_to_listen_beyond_loopback_unless_allowed(settings: Settings) -> None:
    on(settings, "fyrehose", listen="0.0.0.0:0")
    settings.auth = "password"  # else the open-network check speaks first
    settings.set_section(settings.sections["fyrehose"].updated({"anonymous": True}))
    broker = Broker(settings)
    with pytest.raises(
        ValueError, match=r"fyrehose: refusing to listen on 0\.0\.0\.0.*allow_remote"
    ):
        await broker.start()
    assert broker.front_ends["fyrehose"].address is None  # nothing bound
    await broker.stop()
