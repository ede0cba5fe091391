"""The reject policy through fq's own wire: a publisher confirm covering a message a full
reject-policy queue refused fails and names the queue; a drop-policy queue's drops are
confirmed as fq counts them; a queue asked for with another policy is refused."""

from __future__ import annotations

import asyncio

import pytest

from fqbroker.clients.fq.client import Client, ClientError
from fqbroker.protocols.fq import wire
from fqbroker.server.broker import Broker
from tests.conftest import TIMEOUT

SOURCE = "c/rq/mem:permanent,reject,backlog=3,public"


async def test_a_confirm_fails_once_a_reject_queue_refused_a_message(broker: Broker) -> None:
    async with asyncio.timeout(TIMEOUT):
        async with Client(port=broker.port, source=SOURCE) as setup:
            await setup.bind(b"ex", b"prefix:", wire.BindFlags.PERM)
        publisher = Client(port=broker.port, source="pub", reconnect=False)
        await publisher.connect()
        for i in range(3):
            publisher.publish(b"ex", b"r", b"%d" % i)
        assert await publisher.confirm() == 3  # it fits
        publisher.publish(b"ex", b"r", b"refused")
        with pytest.raises(ClientError, match=r"^queue full: rq$"):
            await publisher.confirm()
        status = await publisher.status()
        assert status["dropped"] == 1  # counted as fq counts a drop
        await publisher.close()
        # What it took is there, and nothing else.
        async with Client(port=broker.port, source=SOURCE) as reader:
            got = [(await reader.receive()).payload for _ in range(3)]
            assert got == [b"0", b"1", b"2"]
            assert reader.received_backlog == 0
        # Room again: a fresh publisher's confirm succeeds.
        async with Client(port=broker.port, source="pub2", reconnect=False) as again:
            again.publish(b"ex", b"r", b"again")
            assert await again.confirm() == 1


async def test_a_full_drop_queue_confirms_what_it_dropped(broker: Broker) -> None:
    async with asyncio.timeout(TIMEOUT):
        source = "c/dq/mem:permanent,drop,backlog=1,public"
        async with Client(port=broker.port, source=source) as setup:
            await setup.bind(b"ex", b"prefix:", wire.BindFlags.PERM)
        async with Client(port=broker.port, source="pub", reconnect=False) as publisher:
            for i in range(3):
                publisher.publish(b"ex", b"r", b"%d" % i)
            assert await publisher.confirm() == 3
            assert (await publisher.status())["dropped"] == 2


@pytest.mark.parametrize(
    ("asked", "error"),
    [("drop", "request drop, queue is reject"), ("block", "request block, queue is reject")],
)
async def test_a_reject_queue_asked_for_with_another_policy(
    broker: Broker, asked: str, error: str
) -> None:
    async with asyncio.timeout(TIMEOUT):
        async with Client(port=broker.port, source=SOURCE):
            pass
        other = Client(port=broker.port, source=f"d/rq/mem:{asked},public", reconnect=False)
        with pytest.raises(ClientError, match=error):
            await other.connect()
        await other.close()
