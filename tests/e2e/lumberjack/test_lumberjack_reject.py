"""Lumberjack into a full reject-policy queue: the batch it refused gets no ACK (the
connection closes, as after a failed disk write), so the shipper sends it again; what
came before is acknowledged and kept. With the suite's own shipper and with pylogbeat."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from fqbroker.clients.fq.client import Client
from fqbroker.protocols.lumberjack import encoder
from fqbroker.server.broker import Broker
from tests.conftest import TIMEOUT, port_of
from tests.e2e.lumberjack.test_lumberjack import Shipper, events, receive

pytestmark = pytest.mark.on("lumberjack", ack_idle_ms=50.0)

SOURCE = "c/ljr/mem:permanent,reject,backlog=3,public"


@pytest.fixture
def lj(broker_on: Broker) -> Broker:
    return broker_on


async def reject_queue(broker: Broker) -> None:
    # Permanent, bound permanently, and no reader: it fills.
    async with Client(port=broker.port, source=SOURCE, reconnect=False) as setup:
        await setup.bind(b"logging", b"prefix:", 0x0110)


async def test_a_batch_a_full_reject_queue_refused_gets_no_ack(
    lj: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    await reject_queue(lj)
    shipper = await Shipper.open(lj)
    first = events(2)
    await shipper.send(encoder.batch(first))
    assert await shipper.ack() == (2, 2)
    with caplog.at_level(logging.WARNING):
        await shipper.send(encoder.batch(events(2, first=2), first_seq=3))  # one too many
        await shipper.closed_by_broker()
    assert [seq for _, seq in shipper.got if seq] == []  # no ACK for it
    assert any("queue full: ljr" in r.getMessage() for r in caplog.records), caplog.records
    await shipper.close()
    async with Client(port=lj.port, source=SOURCE, reconnect=False) as reader:
        got = [m.payload for m in await receive(reader, 3)]
        assert got == [*first, events(1, first=2)[0]]
        # Drained: the batch sent again is taken and acknowledged.
        again = await Shipper.open(lj)
        await again.send(encoder.batch(events(2, first=2)))
        assert await again.ack() == (2, 2)
        assert len(await receive(reader, 2)) == 2
        await again.close()


def _pylogbeat_send(port: int, batch: list[Any]) -> None:
    pylogbeat = pytest.importorskip("pylogbeat")
    with pylogbeat.PyLogBeatClient("127.0.0.1", port, timeout=5) as client:
        client.send(batch)  # returns once acknowledged


async def test_pylogbeat_is_not_told_a_refused_batch_arrived(lj: Broker) -> None:
    await reject_queue(lj)
    port = port_of(lj, "lumberjack")
    fits = [{"n": i} for i in range(3)]
    async with asyncio.timeout(TIMEOUT):
        await asyncio.to_thread(_pylogbeat_send, port, fits)
        # Its ConnectionException: the connection closed where the ACK was due.
        with pytest.raises(Exception, match="No ACK received"):
            await asyncio.to_thread(_pylogbeat_send, port, [{"n": 3}])


async def test_pipelined_the_batch_before_the_refused_one_is_acknowledged(lj: Broker) -> None:
    """Two windows in one write, the second one too many: the first is acknowledged, the
    second is not (no ACK covers a refused event, however the windows were read)."""
    await reject_queue(lj)
    shipper = await Shipper.open(lj)
    await shipper.send(encoder.batch(events(2)) + encoder.batch(events(2, first=2), first_seq=3))
    assert await shipper.ack() == (2, 2)
    with pytest.raises(EOFError):  # and nothing else but keepalives before the close
        await shipper.ack()
    await shipper.close()
