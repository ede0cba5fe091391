"""Figg into a full reject-policy queue: a publish it refused gets no ACK (the connection
closes, as after a failed disk write), so the client sends it again; what came before is
acknowledged, and the broker serves the others."""

from __future__ import annotations

import asyncio

import pytest

from fqbroker.clients.fq.client import Client
from fqbroker.protocols.figg.wire import Publish
from fqbroker.server.broker import Broker
from tests.conftest import TIMEOUT
from tests.e2e.figg.test_figg import EXCHANGE, conn, publish

pytestmark = pytest.mark.on("figg")

SOURCE = "c/fgr/mem:permanent,reject,backlog=2,public"


@pytest.fixture
def fg(broker_on: Broker) -> Broker:
    return broker_on


async def test_a_publish_a_full_reject_queue_refused_gets_no_ack(fg: Broker) -> None:
    async with asyncio.timeout(TIMEOUT):
        async with Client(port=fg.port, source=SOURCE, reconnect=False) as setup:
            await setup.bind(EXCHANGE, b"prefix:", 0x0110)  # permanent, and no reader
        async with conn(fg) as c:
            await publish(c, b"T", [b"a", b"b"])  # it fits
            await c.send(Publish(b"T", 2, b"refused"))
            await c.closed_by_broker()
            assert c.decoder.next_frame() is None  # no ACK came before the close
        async with Client(port=fg.port, source=SOURCE, reconnect=False) as reader:
            assert [(await reader.receive()).payload for _ in range(2)] == [b"a", b"b"]
            async with conn(fg) as again:  # room again: sent again, acknowledged
                await publish(again, b"T", [b"refused"])
            assert (await reader.receive()).payload == b"refused"
