"""The client's de-duplication option: it asks a broker that announces it before the data
socket opens, never asks one that does not (fqd would end the session), and gives
messages published without an id ids of its own, unique across clients."""

from __future__ import annotations

import asyncio

import pytest

from fqbroker.clients.fq.client import Client, ClientError
from fqbroker.protocols.fq import wire
from fqbroker.server.broker import Broker
from tests.conftest import TIMEOUT

SOURCE = "reader/dq/disk:permanent,backlog=-1"


async def read_all(port: int, n: int) -> list[bytes]:
    got: list[bytes] = []
    async with Client(port=port, source=SOURCE) as consumer, asyncio.timeout(TIMEOUT):
        while len(got) < n:
            got += [m.payload for m in await consumer.receive_many(100)]
        await asyncio.sleep(0.1)
        got += [m.payload for m in consumer._inbox]
    return got


async def test_the_same_id_is_stored_once_and_still_confirmed(broker: Broker) -> None:
    async with Client(port=broker.port, source=SOURCE) as setup:
        await setup.bind(b"ex", b"prefix:", wire.BindFlags.PERM)
    for _ in range(2):  # two connections, as a publisher sending again after a failure
        async with Client(port=broker.port, source="w", dedup=True) as client:
            client.publish(b"ex", b"r", b"a", b"A" * 16)
            client.publish(b"ex", b"r", b"a", b"A" * 16)
            client.publish(b"ex", b"r", b"b", b"B" * 16)
            assert await client.confirm() == 3
    assert sorted(await read_all(broker.port, 2)) == [b"a", b"b"]
    assert broker.queues[b"dq"].duplicates == 4


async def test_messages_without_ids_get_distinct_ids_of_the_client(broker: Broker) -> None:
    async with Client(port=broker.port, source=SOURCE) as setup:
        await setup.bind(b"ex", b"prefix:", wire.BindFlags.PERM)
    clients = [Client(port=broker.port, source="w", dedup=True) for _ in range(2)]
    for client in clients:
        async with client:
            for _ in range(3):
                client.publish(b"ex", b"r", b"same")
            assert await client.confirm() == 3
    assert await read_all(broker.port, 6) == [b"same"] * 6
    assert clients[0]._dedup_prefix != clients[1]._dedup_prefix


async def test_a_broker_that_does_not_announce_it_is_never_asked() -> None:
    asked: list[wire.Frame] = []
    handlers: list[asyncio.Future[object]] = []

    async def fake_fqd(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if (task := asyncio.current_task()) is not None:
            handlers.append(task)
        if await reader.readexactly(4) != wire.Mode.CMD.to_bytes(4, "big"):
            await reader.read()
            writer.close()
            return
        decoder = wire.ServerCommandDecoder()
        while chunk := await reader.read(65536):
            decoder.feed(chunk)
            while (frame := decoder.next_frame()) is not None:
                asked.append(frame)
                if isinstance(frame, wire.AuthPlain):
                    writer.write(wire.encode(wire.AuthResponse(b"k" * 127)))
                elif isinstance(frame, wire.StatusRequest):
                    writer.write(wire.encode(wire.Status((("dropped_in", 0),))))
        writer.close()

    server = await asyncio.start_server(fake_fqd, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(ClientError, match="does not de-duplicate"):
            await Client(port=port, source="u", reconnect=False, dedup=True).connect()
    finally:
        server.close()
        await server.wait_closed()
        # The handler sees the client's close and closes its end: nothing left open.
        async with asyncio.timeout(TIMEOUT):
            await asyncio.gather(*handlers)
    assert not any(isinstance(frame, wire.DedupRequest) for frame in asked)
