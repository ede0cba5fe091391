"""Replay reads of disk queues over HTTP (/queue/info, /queue/read) and their blocking client."""

from __future__ import annotations

import asyncio
import http.client
import json
import time
from dataclasses import replace

import pytest

from fqbroker.clients.fq.client import Client
from fqbroker.clients.http.replay import BrokerError, DataLost, ReplayClient
from fqbroker.core.message import Message, hop_addresses
from fqbroker.protocols import replay
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from fqbroker.storage.segments.log import SegmentLog
from fqbroker.storage.store import queue_directory
from tests.conftest import NODE_ID, TIMEOUT, open_session, wait_for
from tests.loopback import LoopbackServer


async def publish(port: int, n: int, exchange: str = "ex", size: int = 0) -> None:
    async with Client(port=port, source="pub") as client:
        for i in range(n):
            client.publish(exchange.encode(), b"r.%d" % i, b"m%d" % i + b"." * size)
        assert await client.confirm() == n


async def ensure_queue(rc: ReplayClient, queue: str = "rq", **kw: str) -> None:
    await asyncio.to_thread(rc.ensure_queue, queue, exchange="ex", **kw)


def get(port: int, target: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", target)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


async def test_read_gives_a_range_with_seq_arrival_sender_and_hops(broker: Broker) -> None:
    rc = ReplayClient(port=broker.port)
    await ensure_queue(rc)
    assert broker.queues[b"rq"].permanent
    await wait_for(lambda: not broker.queues[b"rq"].clients)  # setup opens no data socket
    before = time.time_ns() // 1000
    await publish(broker.port, 10)
    after = time.time_ns() // 1000

    info = await asyncio.to_thread(rc.info, "rq")
    assert (info.first, info.next, info.checkpoints) == (1, 11, {})
    entries = await asyncio.to_thread(rc.read, "rq", 3, 7)
    assert [e.seq for e in entries] == [3, 4, 5, 6]
    assert [e.message.payload for e in entries] == [b"m2", b"m3", b"m4", b"m5"]
    assert [e.message.route for e in entries] == [b"r.2", b"r.3", b"r.4", b"r.5"]
    assert all(e.message.exchange == b"ex" and e.message.sender == b"pub" for e in entries)
    assert all(hop_addresses(e.message.hops)[0] == NODE_ID for e in entries)
    assert [int.from_bytes(e.message.msgid[8:], "big") for e in entries] == [3, 4, 5, 6]
    arrivals = [e.arrival_us for e in entries]
    assert all(a is not None and before <= a <= after for a in arrivals)
    assert arrivals == sorted(arrivals)  # type: ignore[type-var]


async def test_reading_consumes_nothing(broker: Broker) -> None:
    rc = ReplayClient(port=broker.port)
    await ensure_queue(rc)
    await publish(broker.port, 5)
    first = await asyncio.to_thread(rc.read, "rq", 1, 6)
    again = await asyncio.to_thread(rc.read, "rq", 1, 6)
    assert [e.message.payload for e in again] == [e.message.payload for e in first]
    consumer = await open_session(broker.port, b"spark", b"rq\x00disk:permanent,backlog=-1")
    got = await consumer.receive(5)
    assert [m.payload for m in got] == [e.message.payload for e in first]
    await consumer.close()


async def test_read_stops_at_max_bytes_and_the_end(broker: Broker) -> None:
    rc = ReplayClient(port=broker.port)
    await ensure_queue(rc)
    await publish(broker.port, 20, size=100)
    assert [e.seq for e in await asyncio.to_thread(rc.read, "rq", 5, 20, 1)] == [5]
    assert len(await asyncio.to_thread(rc.read, "rq", 5, 20, 350)) == 3
    assert [e.seq for e in await asyncio.to_thread(rc.read, "rq", 19, 99)] == [19, 20]
    assert await asyncio.to_thread(rc.read, "rq", 21, 30) == []
    chunks = await asyncio.to_thread(lambda: list(rc.read_range("rq", 2, 21)))
    assert [e.seq for chunk in chunks for e in chunk] == list(range(2, 21))
    status, headers, _ = await asyncio.to_thread(get, broker.port, "/queue/read?queue=rq&from=1")
    assert status == 200
    assert (headers["x-fq-first"], headers["x-fq-next"]) == ("1", "21")
    assert headers["content-type"] == replay.CONTENT_TYPE


async def test_a_range_past_the_end_is_data_lost(broker: Broker) -> None:
    rc = ReplayClient(port=broker.port)
    await ensure_queue(rc)
    await publish(broker.port, 3)
    with pytest.raises(DataLost):
        await asyncio.to_thread(lambda: list(rc.read_range("rq", 2, 6)))


async def test_checkpoint_trims_and_trimmed_reads_are_gone(settings: Settings) -> None:
    async with Broker(replace(settings, segment_bytes=1024)) as broker:
        rc = ReplayClient(port=broker.port)
        await ensure_queue(rc)
        await publish(broker.port, 50, size=100)
        await asyncio.to_thread(rc.set_checkpoint, "rq", "spark-rq", 40)
        info = await asyncio.to_thread(rc.info, "rq")
        assert 1 < info.first <= 40 and info.checkpoints == {"spark-rq": 40}
        with pytest.raises(DataLost) as lost:
            await asyncio.to_thread(rc.read, "rq", 1, 50)
        assert lost.value.first == info.first
        status, _, body = await asyncio.to_thread(get, broker.port, "/queue/read?queue=rq&from=1")
        assert status == 410 and json.loads(body)["first"] == info.first
        # A consumer that never read starts at what is left, not at the trimmed records.
        assert broker.queues[b"rq"].backlog == 51 - info.first
        consumer = await open_session(broker.port, b"spark", b"rq\x00disk:permanent,backlog=-1")
        got = await consumer.receive(51 - info.first)
        assert got[0].payload.startswith(b"m%d." % (info.first - 1))
        await consumer.close()


async def test_setup_is_idempotent_and_survives_a_restart(settings: Settings) -> None:
    async with Broker(settings) as broker:
        rc = ReplayClient(port=broker.port)
        await ensure_queue(rc)
        await ensure_queue(rc)
        assert len(list(broker.router.bindings())) == 1
    async with Broker(settings) as broker:
        assert len(list(broker.router.bindings())) == 1
        await publish(broker.port, 4)
        info = await asyncio.to_thread(ReplayClient(port=broker.port).info, "rq")
        assert info.next == 5


async def test_setup_errors(broker: Broker, closed_port: int) -> None:
    rc = ReplayClient(port=broker.port)
    with pytest.raises(BrokerError, match="cannot bind"):
        await ensure_queue(rc, program="nonsense:")
    with pytest.raises(BrokerError, match="requested type disk, queue is mem"):
        consumer = await open_session(broker.port, b"u", b"memq\x00mem:public")
        try:
            await asyncio.to_thread(rc.ensure_queue, "memq", params="disk:public")
        finally:
            await consumer.close()
    with pytest.raises(BrokerError, match="cannot reach"):
        await asyncio.to_thread(ReplayClient(port=closed_port).info, "rq")


@pytest.mark.parametrize(
    ("target", "status", "error"),
    [
        ("/queue/info", 400, "'queue' parameter is required"),
        ("/queue/info?queue=nope", 404, "Cannot find registered queue 'nope'"),
        ("/queue/info?queue=memq", 400, "'memq' is not a disk queue"),
        ("/queue/read?queue=rq", 400, "'from' must be a non-negative integer"),
        ("/queue/read?queue=rq&from=-1", 400, "'from' must be a non-negative integer"),
        ("/queue/read?queue=rq&from=1&to=x", 400, "'to' must be a non-negative integer"),
    ],
)
async def test_request_errors(broker: Broker, target: str, status: int, error: str) -> None:
    await ensure_queue(ReplayClient(port=broker.port))
    mem = await open_session(broker.port, b"u", b"memq\x00mem:permanent")
    got = await asyncio.to_thread(get, broker.port, target)
    assert got[0] == status and json.loads(got[2]) == {"error": error}
    await mem.close()


async def test_records_written_before_arrival_times_read_as_unknown(settings: Settings) -> None:
    async with Broker(settings) as broker:
        await ensure_queue(ReplayClient(port=broker.port))
        await publish(broker.port, 1)
    # A record in the old encoding: the bare peer frame, as brokers before the tag wrote.
    log = SegmentLog(queue_directory(settings.queue_dir, b"rq"))
    old = Message(b"ex", b"old", b"legacy", bytes(16), b"pub", bytes([10, 0, 0, 1]))
    log.append([old.peer_frame()])
    log.sync()
    log.close()
    async with Broker(settings) as broker:
        await publish(broker.port, 1)
        rc = ReplayClient(port=broker.port)
        entries = await asyncio.to_thread(rc.read, "rq", 1, 4)
        assert [e.message.payload for e in entries] == [b"m0", b"legacy", b"m0"]
        assert [e.arrival_us is None for e in entries] == [False, True, False]
        consumer = await open_session(broker.port, b"spark", b"rq\x00disk:permanent,backlog=-1")
        assert [m.payload for m in await consumer.receive(3)] == [b"m0", b"legacy", b"m0"]
        await consumer.close()


def test_entries_round_trip_and_cut_bodies_fail() -> None:
    msg = Message(
        b"ex", b"rt", b"payload", bytes(8) + (7).to_bytes(8, "big"), b"s", b"\x01\x02\x03\x04"
    )
    body = replay.encode_entry(7, 123, msg.peer_frame()) + replay.encode_entry(
        8, None, msg.peer_frame()
    )
    entries = replay.decode_entries(body)
    assert [(e.seq, e.arrival_us, e.message) for e in entries] == [(7, 123, msg), (8, None, msg)]
    for cut in (1, replay.ENTRY.size + 3, len(body) - 1):
        with pytest.raises(ValueError, match=r"cut short|does not hold"):
            replay.decode_entries(body[:cut])


class FlakyHttp(LoopbackServer):
    """A loopback HTTP server that fails the first requests as a restarting broker does:
    the first connection is closed before any answer, the second is cut off in the middle
    of its body; then /queue/info is answered."""

    INFO = json.dumps({"queue": "rq", "first": 1, "next": 5, "checkpoints": {}}).encode()

    def __init__(self) -> None:
        super().__init__()
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await reader.readuntil(b"\r\n\r\n")
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            if self.connections == 2:
                writer.write(head + b"Content-Length: %d\r\n\r\n" % len(self.INFO) + b"{")
            elif self.connections > 2:
                writer.write(head + b"Content-Length: %d\r\n\r\n" % len(self.INFO) + self.INFO)
            await writer.drain()
        finally:
            writer.close()


async def test_requests_that_get_no_answer_are_retried_for_retry_seconds() -> None:
    async with FlakyHttp() as server:
        rc = ReplayClient(port=server.port, retry_seconds=TIMEOUT)
        info = await asyncio.to_thread(rc.info, "rq")
        assert (info.first, info.next, server.connections) == (1, 5, 3)


@pytest.mark.parametrize("connection", [1, 2], ids=["closed-before-answer", "cut-mid-body"])
async def test_without_retries_no_answer_is_a_broker_error(connection: int) -> None:
    # An answer cut off mid-body used to escape as http.client.IncompleteRead.
    async with FlakyHttp() as server:
        server.connections = connection - 1  # the next connection fails that way
        with pytest.raises(BrokerError, match="cannot reach the broker"):
            await asyncio.to_thread(ReplayClient(port=server.port).info, "rq")
