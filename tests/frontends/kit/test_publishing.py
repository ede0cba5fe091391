"""The publishing tail every publishing session shares (fqbroker.frontends.kit.publishing),
tested once, through a toy front end registered in this test alone: a line protocol
whose machine publishes each line ``route payload`` and answers ``ok N`` once the first
N messages are routed and durable. A real broker on loopback, fq clients as consumers.

What the tail promises: an ACK once the messages are handled, and after the fsync where a
disk queue took them (a failed one closes without it); a full block-policy queue pauses
reading and holds the ACK until it has room; what the machine buffers waits for the
memory budget; bad input closes the connection and is counted; EOF closes once the ACKs
owed are sent; an idle connection holds no task.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fqbroker.clients.fq.client import Client
from fqbroker.core.frames import encode_peer
from fqbroker.core.message import Message, MsgIdCounter, ipv4_bytes
from fqbroker.frontends.kit.acks import AckingMachine, BadInput, Batch
from fqbroker.frontends.kit.component import FrontEnd, LiveFrontEnd, OwnPort
from fqbroker.frontends.kit.publishing import BUDGET, ROOM, PublishingHost, PublishingSession
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from fqbroker.storage.segments import log as segmentlog
from tests.conftest import TIMEOUT, FailingFsync, running, wait_for

EXCHANGE = b"toy"
_ids = MsgIdCounter()


class LineMachine(AckingMachine[int]):
    """Lines ``route payload`` in, one batch per read; ``ok N`` out once the first N
    messages are safe; the line ``bad`` is bad input."""

    __slots__ = ("_bad", "_buf", "_made")

    def __init__(self) -> None:
        super().__init__()
        self._buf = bytearray()
        self._made = 0
        self._bad: BadInput | None = None

    @property
    def buffered(self) -> int:
        return len(self._buf)

    @property
    def in_flight(self) -> int:
        return len(self._buf)  # a line announces no size

    def receive_data(self, data: bytes, now: float) -> None:
        self._buf += data

    def next_event(self) -> Batch | BadInput | None:
        if self._bad is not None:
            return self._bad
        end = self._buf.rfind(b"\n")
        if end < 0:
            return None
        lines = bytes(self._buf[:end]).split(b"\n")
        del self._buf[: end + 1]
        runs: list[Any] = []
        octets = 0
        for line in lines:
            if line == b"bad":
                self._bad = BadInput("a bad line")
                break
            route, _, payload = line.partition(b" ")
            frame = encode_peer(
                EXCHANGE, route, _ids.next(), b"toy", ipv4_bytes("10.0.0.1"), payload
            )
            runs.append((EXCHANGE, route, [frame], len(frame) - len(payload)))
            octets += len(frame)
        if not runs:
            return self._bad
        self._made += len(runs)
        self.owe(self._made, self._made)
        return Batch(runs, octets)

    def _encode_acks(self, due: list[int]) -> bytes:
        return b"ok %d\n" % due[-1]


class LineSession(PublishingSession):
    FRONTEND = "toy"
    TITLE = "Toy"
    DISK_FAILED = "a disk write failed"

    def __init__(self, host: PublishingHost, live: LiveFrontEnd, transport: asyncio.Transport):
        super().__init__(host, live, transport, LineMachine())

    def eof_received(self) -> bool:
        self._eof = True
        self._ack_ready()
        return True


class HoldingLineSession(LineSession):
    HOLD_WAITING = True


def toy(session: type[LineSession]) -> FrontEnd[Any]:
    def open_(host: PublishingHost, live: LiveFrontEnd, transport: asyncio.Transport, first: bytes):  # type: ignore[no-untyped-def]
        return session(host, live, transport)

    return FrontEnd(
        name="toy", reach=OwnPort(lambda settings: ("127.0.0.1", 0), open_), counts_bytes=True
    )


@contextlib.asynccontextmanager
async def toy_broker(
    settings: Settings, session: type[LineSession] = LineSession
) -> AsyncIterator[Broker]:
    async with running(settings, toy(session)) as broker:
        yield broker


class Line:
    """A client of the toy front end."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, broker: Broker) -> Line:
        address = broker.front_ends["toy"].address
        assert address is not None
        return cls(*await asyncio.open_connection(*address))

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def ok(self, timeout: float = TIMEOUT) -> int:
        async with asyncio.timeout(timeout):
            line = await self.reader.readline()
        assert line.startswith(b"ok "), line
        return int(line[3:])

    async def nothing_for(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                line = await self.reader.readline()
                raise AssertionError(f"got {line!r}")

    async def closed_by_broker(self) -> bytes:
        async with asyncio.timeout(TIMEOUT):
            return await self.reader.read()

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


def session_of(broker: Broker) -> LineSession:
    (transport,) = broker.front_ends["toy"].connections
    session = transport.get_protocol()
    assert isinstance(session, LineSession)
    return session


async def consumer(broker: Broker, source: str, flags: int = 0x0100) -> Client:
    client = Client(port=broker.port, source=source, reconnect=False)
    await client.connect()
    await client.bind(EXCHANGE, b"prefix:", flags)
    return client


async def receive(client: Client, n: int) -> list[Message]:
    async with asyncio.timeout(TIMEOUT):
        return [await client.receive() for _ in range(n)]


async def test_acks_come_once_handled_and_eof_closes_once_they_are_sent(
    settings: Settings,
) -> None:
    async with toy_broker(settings) as broker:
        c = await consumer(broker, "c/q/mem:private")
        line = await Line.open(broker)
        await line.send(b"a 1\nb 2\n")
        assert await line.ok() == 2
        assert [(m.route, m.payload) for m in await receive(c, 2)] == [(b"a", b"1"), (b"b", b"2")]
        session = session_of(broker)
        assert (session._room, session._durable, session._holds) == (None, None, 0)
        await line.send(b"c 3\n")
        line.writer.write_eof()
        assert await line.ok() == 3
        assert await line.closed_by_broker() == b""
        await line.close()
        await c.close()


@pytest.mark.parametrize("session", [LineSession, HoldingLineSession])
async def test_a_full_block_queue_pauses_reading_and_holds_the_ack(
    settings: Settings, session: type[LineSession]
) -> None:
    async with toy_broker(settings, session) as broker:
        source = "c/bq/mem:permanent,block,backlog=2,public"
        await (await consumer(broker, source, flags=0x0110)).close()
        line = await Line.open(broker)
        sent = [b"r %d" % i for i in range(5)]
        await line.send(b"\n".join(sent) + b"\n")
        held = session_of(broker)
        await wait_for(lambda: held._holds & ROOM)
        await line.nothing_for(0.3)
        frame = len(encode_peer(EXCHANGE, b"r", bytes(16), b"toy", bytes(4), b"r 0"))
        # The batch waiting counts against the budget only where the session says so.
        if session.HOLD_WAITING:
            assert broker.budget.used >= 5 * frame
        else:
            assert broker.budget.used < 5 * frame
        c = await consumer(broker, source, flags=0x0110)
        assert [m.payload for m in await receive(c, 5)] == [b"%d" % i for i in range(5)]
        assert await line.ok() == 5
        assert held._holds == 0
        await line.send(b"r 5\n")  # reading goes on
        assert await line.ok() == 6
        await line.close()
        await c.close()
        await wait_for(lambda: broker.budget.used == 0)


async def test_what_the_machine_buffers_waits_for_the_budget(settings: Settings) -> None:
    settings.memory_budget = 64 << 10
    async with toy_broker(settings) as broker:
        source = "c/full/mem:permanent,public"
        await (await consumer(broker, source, flags=0x0110)).close()  # nobody reads it
        line = await Line.open(broker)
        await line.send(b"".join(b"r " + b"x" * (18 << 10) + b"\n" for _ in range(3)))
        assert await line.ok() == 3
        assert broker.budget.used >= 54 << 10  # held by the queue
        await line.send(b"r " + b"y" * (16 << 10))  # a line cut short: the machine holds it
        held = session_of(broker)
        await wait_for(lambda: held._holds & BUDGET)
        c = await consumer(broker, source, flags=0x0110)
        assert len(await receive(c, 3)) == 3  # room in the budget again
        await wait_for(lambda: not held._holds)
        await line.send(b"\n")
        assert await line.ok() == 4
        assert (await receive(c, 1))[0].payload == b"y" * (16 << 10)
        await line.close()
        await c.close()
        await wait_for(lambda: broker.budget.used == 0)


async def test_an_ack_waits_for_the_fsync_and_a_failed_one_closes_without_it(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        toy_broker(settings) as broker,
        Client(port=broker.port, source="c/dq/disk:permanent,fsync=always") as disk,
    ):
        await disk.bind(EXCHANGE, b"prefix:")
        fsync = FailingFsync(failing=False)
        monkeypatch.setattr(segmentlog, "os", fsync)
        line = await Line.open(broker)
        await line.send(b"d 1\n")
        assert await line.ok() == 1
        assert fsync.synced  # the ACK came after the fsync
        fsync.failing = True
        await line.send(b"d 2\n")
        assert await line.closed_by_broker() == b""  # closed, no ACK
        await line.close()
        assert [m.payload for m in await receive(disk, 2)] == [b"1", b"2"]


async def test_bad_input_closes_the_connection_and_is_counted(settings: Settings) -> None:
    async with toy_broker(settings) as broker:
        c = await consumer(broker, "c/q/mem:private")
        line = await Line.open(broker)
        await line.send(b"a 1\nbad\nb 2\n")
        assert await line.closed_by_broker() == b""  # the line before it: never acknowledged
        assert [m.payload for m in await receive(c, 1)] == [b"1"]
        assert broker.limits.bad_input["toy"] == 1
        await line.close()
        await c.close()
        await wait_for(lambda: broker.budget.used == 0)
