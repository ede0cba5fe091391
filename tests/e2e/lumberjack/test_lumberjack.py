"""The Lumberjack listener end to end: a real broker on loopback, the project's own encoder
as the shipper, fq clients as consumers (third-party shippers: tests/interop).

What an ACK promises (docs/lumberjack.md) is checked from the shipper's side: it names the
batch's version and last seq, comes in order for pipelined batches, after idle input for a
window that never fills, and only once the events are in their queues; a full block-policy
queue holds it back while ACK(0) keepalives flow. Each limit closes only the offending
connection, and another shipper publishes right after. Its settings: test_lumberjack_settings.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import zlib
from pathlib import Path
from typing import Any

import pytest

from fqbroker.clients.fq.client import Client
from fqbroker.core.message import Message, hop_addresses
from fqbroker.frontends.lumberjack.session import LumberjackSession
from fqbroker.protocols.lumberjack import encoder
from fqbroker.protocols.lumberjack.encoder import AckReader
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from fqbroker.storage.segments import log as segmentlog
from tests.conftest import NODE_ID, TIMEOUT, FailingFsync, on, port_of, running, wait_for
from tests.e2e.http.test_http import get
from tests.server.test_frontends import front_ends_json, self_signed

EXCHANGE = b"logging"


pytestmark = pytest.mark.on("lumberjack", ack_idle_ms=50.0)


def with_lumberjack(settings: Settings, **values: Any) -> Settings:
    return on(settings, "lumberjack", **{"ack_idle_ms": 50.0, **values})


@pytest.fixture
def lj(broker_on: Broker) -> Broker:
    return broker_on


class Shipper:
    """A shipper's connection: bytes out, ACKs in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.acks = AckReader()
        self.got: list[tuple[int, int]] = []

    @classmethod
    async def open(cls, broker: Broker, **tls: Any) -> Shipper:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port_of(broker, "lumberjack"), **tls
        )
        return cls(reader, writer)

    @property
    def port(self) -> int:
        return int(self.writer.get_extra_info("sockname")[1])

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def ack(self, timeout: float = TIMEOUT, keepalives: bool = False) -> tuple[int, int]:
        """The next ACK; ACK(0) keepalives are skipped unless asked for."""
        async with asyncio.timeout(timeout):
            while True:
                while not self.got:
                    data = await self.reader.read(65536)
                    if not data:
                        raise EOFError("the broker closed the connection")
                    self.got += self.acks.feed(data)
                ack = self.got.pop(0)
                if keepalives or ack[1] != 0:
                    return ack

    async def no_ack(self, seconds: float) -> list[tuple[int, int]]:
        """What arrives within ``seconds``: only keepalives are allowed."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                while True:
                    data = await self.reader.read(65536)
                    if not data:
                        break
                    self.got += self.acks.feed(data)
        got, self.got = self.got, []
        assert all(seq == 0 for _, seq in got), got
        return got

    async def closed_by_broker(self) -> None:
        async with asyncio.timeout(TIMEOUT):
            with contextlib.suppress(ConnectionResetError):
                while await self.reader.read(65536):
                    pass

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


async def consumer(broker: Broker, source: str = "c/lq/mem:private", program: bytes = b"prefix:",
                   flags: int = 0x0100) -> Client:  # fmt: skip
    client = Client(port=broker.port, source=source, reconnect=False)
    await client.connect()
    await client.bind(EXCHANGE, program, flags)
    return client


async def receive(client: Client, n: int) -> list[Message]:
    async with asyncio.timeout(TIMEOUT):
        return [await client.receive() for _ in range(n)]


def events(n: int, first: int = 0, beat: str = "filebeat") -> list[bytes]:
    return [
        json.dumps({"@metadata": {"beat": beat}, "message": f"line {first + i}", "n": first + i},
                   separators=(",", ":")).encode()
        for i in range(n)
    ]  # fmt: skip


# --- events become messages ---------------------------------------------------------------


async def test_v2_events_arrive_with_their_json_route_sender_and_hop(lj: Broker) -> None:
    c = await consumer(lj)
    shipper = await Shipper.open(lj)
    payloads = [*events(3), b'{"event":{"dataset":"nginx.access"},"x":"\\u00e9"}', b'{"a":1}']
    await shipper.send(encoder.batch(payloads))
    assert await shipper.ack() == (2, 5)
    got = await receive(c, 5)
    assert [m.payload for m in got] == payloads  # the bytes as received
    assert [m.route for m in got] == [b"filebeat"] * 3 + [b"nginx.access", b"lumberjack"]
    for m in got:
        assert m.exchange == EXCHANGE
        assert m.sender == b"lumberjack/127.0.0.1:%d" % shipper.port
        assert hop_addresses(m.hops) == [NODE_ID]
    assert len({m.msgid for m in got}) == 5
    await shipper.close()
    await c.close()


async def test_v1_data_frames_arrive_as_json_objects(lj: Broker) -> None:
    c = await consumer(lj)
    shipper = await Shipper.open(lj)
    pairs = [{"line": "hello", "type": "syslog", "host": "h1"}, {"line": 'ünï "q"', "file": "/x"}]
    await shipper.send(encoder.batch(pairs, version=1, compress=False))
    assert await shipper.ack() == (1, 2)
    got = await receive(c, 2)
    assert [json.loads(m.payload) for m in got] == pairs
    assert [m.route for m in got] == [b"syslog", b"lumberjack"]
    # The same, compressed.
    await shipper.send(encoder.batch(pairs[:1], first_seq=3, version=1))
    assert await shipper.ack() == (1, 3)
    assert json.loads((await receive(c, 1))[0].payload) == pairs[0]
    await shipper.close()
    await c.close()


async def test_route_template_and_exchange_from_the_settings(settings: Settings) -> None:
    with_lumberjack(settings, exchange="beats", route="logs.{fields.type|'other'}.{host.name}")
    async with running(settings) as broker:
        client = Client(port=broker.port, source="c/rt/mem:private", reconnect=False)
        await client.connect()
        await client.bind(b"beats", b'prefix:"logs."')
        shipper = await Shipper.open(broker)
        long = "x" * 300
        payloads = [b'{"fields":{"type":"web"},"host":{"name":"h1"}}', b'{"host":{"name":"%s"}}'
                    % long.encode()]  # fmt: skip
        await shipper.send(encoder.batch(payloads))
        assert await shipper.ack() == (2, 2)
        got = await receive(client, 2)
        assert got[0].route == b"logs.web.h1"
        assert got[1].route == (b"logs.other." + long.encode())[:127]
        await shipper.close()
        await client.close()


async def test_unrouted_events_are_acknowledged_and_counted(lj: Broker) -> None:
    shipper = await Shipper.open(lj)
    await shipper.send(encoder.batch(events(4)))  # no exchange "logging" yet
    assert await shipper.ack() == (2, 4)
    c = await consumer(lj, program=b'prefix:"nothing."')  # the exchange, no matching binding
    await shipper.send(encoder.batch(events(2), first_seq=5))
    assert await shipper.ack() == (2, 6)
    exchange = lj.router.exchanges[EXCHANGE]
    assert (exchange.messages, exchange.no_route) == (2, 2)
    stats = json.loads((await get(lj.port, "/stats.json"))[1])
    assert stats["exchanges"]["logging"]["no_route"] == 2
    (conn,) = (await front_ends_json(lj))["lumberjack"]["connections"]
    assert (conn["events"], conn["acked"], conn["version"], conn["held"]) == (6, 6, 2, "")
    await shipper.close()
    await c.close()


# --- what real shippers do ----------------------------------------------------------------


async def test_go_lumber_pattern_seq_restarts_at_one_per_batch(lj: Broker) -> None:
    c = await consumer(lj)
    shipper = await Shipper.open(lj)
    sent: list[bytes] = []
    for n in (3, 1, 5):
        batch = events(n, first=len(sent))
        await shipper.send(encoder.batch(batch, first_seq=1))
        assert await shipper.ack() == (2, n)
        sent += batch
    # pylogbeat's: cumulative over the connection.
    for n in (2, 2):
        batch = events(n, first=len(sent))
        await shipper.send(encoder.batch(batch, first_seq=len(sent) + 1))
        assert await shipper.ack() == (2, len(sent) + n)
        sent += batch
    assert [m.payload for m in await receive(c, len(sent))] == sent
    await shipper.close()
    await c.close()


async def test_pipelined_batches_are_acknowledged_in_order(lj: Broker) -> None:
    c = await consumer(lj)
    shipper = await Shipper.open(lj)
    sizes = (2, 3, 1, 4)
    sent = [events(n, first=10 * i) for i, n in enumerate(sizes)]
    # Each next W before the previous ACK, in one write and then in pieces.
    await shipper.send(b"".join(encoder.batch(b) for b in sent))
    assert [await shipper.ack() for _ in sizes] == [(2, n) for n in sizes]
    wire = b"".join(encoder.batch(b, compress=False) for b in sent)
    for i in range(0, len(wire), 7):
        shipper.writer.write(wire[i : i + 7])
    await shipper.writer.drain()
    assert [await shipper.ack() for _ in sizes] == [(2, n) for n in sizes]
    flat = [p for b in sent for p in b]
    assert [m.payload for m in await receive(c, 2 * len(flat))] == flat + flat
    await shipper.close()
    await c.close()


async def test_one_window_then_a_stream_is_acknowledged_when_input_goes_idle(lj: Broker) -> None:
    """lumberjack-protocol: W(1000) once, then D frames seq 1, 2, 3, ... forever."""
    c = await consumer(lj)
    shipper = await Shipper.open(lj)
    await shipper.send(encoder.window(1, 1000))
    for seq in range(1, 6):
        await shipper.send(encoder.data_frame(seq, {"line": f"l{seq}"}))
    assert await shipper.ack() == (1, 5)
    for seq in range(6, 9):
        await shipper.send(encoder.data_frame(seq, {"line": f"l{seq}"}))
    assert await shipper.ack() == (1, 8)
    got = await receive(c, 8)
    assert [json.loads(m.payload)["line"] for m in got] == [f"l{i}" for i in range(1, 9)]
    await shipper.close()
    await c.close()


async def test_a_window_that_fills_is_acknowledged_at_once_and_the_rest_when_idle(
    settings: Settings,
) -> None:
    # A long idle time: any ACK within a second is one the window triggered.
    async with running(with_lumberjack(settings, ack_idle_ms=1500.0)) as broker:
        shipper = await Shipper.open(broker)
        frames = b"".join(encoder.json_frame(i, b'{"i":%d}' % i) for i in range(1, 6))
        await shipper.send(encoder.window(2, 2) + frames)
        assert [await shipper.ack(timeout=1.0) for _ in range(2)] == [(2, 2), (2, 4)]
        assert await shipper.ack() == (2, 5)  # the fifth, after the idle time
        # A W ends the batch before it: what it got is acknowledged with it.
        await shipper.send(encoder.window(2, 3) + encoder.json_frame(1, b"{}"))
        await shipper.send(encoder.batch([b"{}"]))
        assert [await shipper.ack(timeout=1.0) for _ in range(2)] == [(2, 1), (2, 1)]
        # An empty window gets ACK(0), as Logstash answers it.
        await shipper.send(encoder.window(2, 0))
        assert await shipper.ack(timeout=1.0, keepalives=True) == (2, 0)
        await shipper.close()


async def test_a_shipper_that_half_closes_gets_its_acks(lj: Broker) -> None:
    c = await consumer(lj)
    shipper = await Shipper.open(lj)
    await shipper.send(encoder.window(1, 100) + encoder.data_frame(1, {"line": "last"}))
    shipper.writer.write_eof()
    assert await shipper.ack() == (1, 1)
    await shipper.closed_by_broker()
    await shipper.close()
    assert json.loads((await receive(c, 1))[0].payload) == {"line": "last"}
    await wait_for(lambda: lj.front_ends["lumberjack"].counters.open == 0)
    await c.close()


async def test_tls(settings: Settings, tmp_path: Path) -> None:
    server, client_context = self_signed(tmp_path)
    with_lumberjack(
        settings, tls_cert=str(tmp_path / "cert.pem"), tls_key=str(tmp_path / "key.pem")
    )
    async with running(settings) as broker:
        c = await consumer(broker)
        shipper = await Shipper.open(broker, ssl=client_context)
        await shipper.send(encoder.window(1, 1000) + encoder.data_frame(1, {"line": "secret"}))
        assert await shipper.ack() == (1, 1)
        assert json.loads((await receive(c, 1))[0].payload) == {"line": "secret"}
        fe = (await front_ends_json(broker))["lumberjack"]
        assert fe["transport"] == "tls" and fe["accepted"] == 1
        # Plain TCP to a TLS port gets nowhere, and the listener carries on.
        plain = await Shipper.open(broker)
        await plain.send(encoder.batch(events(1)))
        await plain.closed_by_broker()
        await plain.close()
        await shipper.send(encoder.data_frame(2, {"line": "again"}))
        assert await shipper.ack() == (1, 2)
        await shipper.close()
        await c.close()
    assert isinstance(server, ssl.SSLContext)


# --- backpressure -------------------------------------------------------------------------


async def test_a_full_block_queue_holds_the_ack_and_keepalives_flow(settings: Settings) -> None:
    async with running(with_lumberjack(settings, keepalive_seconds=0.2)) as broker:
        source = "c/bq/mem:permanent,block,backlog=4,public"
        c = await consumer(broker, source, flags=0x0110)
        await c.close()  # the queue and its binding stay; nobody reads it
        shipper = await Shipper.open(broker)
        sent = events(10)
        await shipper.send(encoder.batch(sent))
        keepalives = await shipper.no_ack(1.0)  # the ACK waits; only ACK(0) comes
        assert len(keepalives) >= 2 and set(keepalives) == {(2, 0)}
        (conn,) = (await front_ends_json(broker))["lumberjack"]["connections"]
        assert conn["held"] == "room" and conn["acked"] == 0
        held = broker.budget.used  # the queue's 4 and the 6 waiting, in memory both
        assert held >= sum(map(len, sent))
        # Another shipper's events wait in line too, nothing is dropped.
        other = await Shipper.open(broker)
        await other.send(encoder.batch(events(2, first=100)))
        await other.no_ack(0.3)
        c = await consumer(broker, source, flags=0x0110)
        got = await receive(c, 12)
        assert await shipper.ack() == (2, 10)
        assert await other.ack() == (2, 2)
        assert sorted(m.payload for m in got) == sorted(sent + events(2, first=100))
        assert [m.payload for m in got if m.sender.endswith(b":%d" % shipper.port)] == sent
        # Nothing twice: the next event is the next message.
        await shipper.send(encoder.batch([b'{"last":1}'], first_seq=11))
        assert await shipper.ack() == (2, 11)
        assert (await receive(c, 1))[0].payload == b'{"last":1}'
        await shipper.close()
        await other.close()
        await c.close()
        await wait_for(lambda: broker.budget.used == 0)


async def test_v1_gets_no_keepalives_while_held(settings: Settings) -> None:
    async with running(with_lumberjack(settings, keepalive_seconds=0.1)) as broker:
        source = "c/bq1/mem:permanent,block,backlog=2,public"
        await (await consumer(broker, source, flags=0x0110)).close()
        shipper = await Shipper.open(broker)
        await shipper.send(encoder.batch([{"n": str(i)} for i in range(5)], version=1))
        assert await shipper.no_ack(0.6) == []
        c = await consumer(broker, source, flags=0x0110)
        assert len(await receive(c, 5)) == 5
        assert await shipper.ack() == (1, 5)
        await shipper.close()
        await c.close()


async def test_the_memory_budget_bounds_what_a_connection_buffers(settings: Settings) -> None:
    settings.memory_budget = 256 << 10
    async with running(with_lumberjack(settings)) as broker:
        c = await consumer(broker)
        shipper = await Shipper.open(broker)
        big = b'{"m":"' + b"y" * (200 << 10) + b'"}'
        frame = encoder.json_frame(1, big)
        await shipper.send(encoder.window(2, 1) + frame[: len(frame) // 2])
        await wait_for(lambda: broker.budget.used >= len(frame) // 2)
        await shipper.send(frame[len(frame) // 2 :])
        assert await shipper.ack() == (2, 1)
        assert (await receive(c, 1))[0].payload == big
        await shipper.close()
        await wait_for(lambda: broker.front_ends["lumberjack"].counters.open == 0)
        await c.close()
        await wait_for(lambda: broker.budget.used == 0)


# --- limits and bad input ------------------------------------------------------------------


def _d_frame_with_fields(seq: int, n: int) -> bytes:
    return encoder.data_frame(seq, {f"k{i}": "v" for i in range(n)})


OVER_LIMITS = {
    "window": encoder.window(2, 101),
    "frame": encoder.window(2, 1) + encoder.json_frame(1, b'{"m":"' + b"z" * 5000 + b'"}'),
    "decompressed": encoder.window(2, 1)
    + encoder.compressed(2, encoder.json_frame(1, b'{"m":"' + b"0" * 50000 + b'"}')),
    "fields": encoder.window(1, 1) + _d_frame_with_fields(1, 9),
    "version": b"3W\x00\x00\x00\x01",
    "type": b"2A\x00\x00\x00\x01",
    "zlib": b"2C\x00\x00\x00\x04junk",
}


@pytest.mark.parametrize("what", list(OVER_LIMITS))
async def test_a_limit_closes_that_connection_only(settings: Settings, what: str) -> None:
    with_lumberjack(settings, max_window=100, max_frame=4096, max_decompressed=20000, max_fields=8)
    async with running(settings) as broker:
        c = await consumer(broker)
        bystander = await Shipper.open(broker)
        await bystander.send(encoder.window(1, 50) + encoder.data_frame(1, {"n": "1"}))
        assert await bystander.ack() == (1, 1)
        bad = await Shipper.open(broker)
        acked = events(2)
        await bad.send(encoder.batch(acked))
        assert await bad.ack() == (2, 2)
        await bad.send(OVER_LIMITS[what])
        await bad.closed_by_broker()
        await bad.close()
        assert broker.limits.bad_input["lumberjack"] == 1
        _, metrics = await get(broker.port, "/metrics")
        assert b'fq_bad_input_total{frontend="lumberjack"} 1.0' in metrics
        # What was acknowledged is there; the bystander and a new shipper carry on.
        got = await receive(c, 3)
        assert [m.payload for m in got[1:]] == acked
        await bystander.send(encoder.data_frame(2, {"n": "2"}))
        assert await bystander.ack() == (1, 2)
        fresh = await Shipper.open(broker)
        await fresh.send(encoder.batch(events(1, first=7)))
        assert await fresh.ack() == (2, 1)
        assert [m.payload for m in await receive(c, 2)] == [b'{"n":"2"}', events(1, first=7)[0]]
        for s in (bystander, fresh):
            await s.close()
        await c.close()


async def test_a_zip_bomb_stops_at_the_limit(settings: Settings) -> None:
    # Ten J frames of 8 MiB each (under max_frame) in under 100 KiB: inflating stops at
    # the default max_decompressed of 64 MiB.
    async with running(with_lumberjack(settings)) as broker:
        bomb = zlib.compressobj(9)
        parts = []
        for seq in range(1, 11):
            parts.append(
                bomb.compress(b"2J" + seq.to_bytes(4, "big") + (8 << 20).to_bytes(4, "big"))
            )
            parts += [bomb.compress(bytes(1 << 20)) for _ in range(8)]
        body = b"".join(parts) + bomb.flush()
        assert len(body) < 100 << 10
        shipper = await Shipper.open(broker)
        await shipper.send(encoder.window(2, 1) + b"2C" + len(body).to_bytes(4, "big") + body)
        await shipper.closed_by_broker()
        await shipper.close()
        assert broker.limits.bad_input["lumberjack"] == 1
        assert broker.budget.used == 0  # nothing held for it
        fresh = await Shipper.open(broker)
        await fresh.send(encoder.batch(events(1)))
        assert await fresh.ack() == (2, 1)
        await fresh.close()


# --- durability, idle connections -----------------------------------------------------------


async def test_no_ack_when_a_disk_queue_fsync_fails(
    lj: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ACK means durable: events whose fsync failed are not acknowledged, and the
    connection closes so the shipper sends them again; a memory queue's shipper is fine."""
    async with Client(port=lj.port, source="c/ljdq/disk:permanent,fsync=always") as disk:
        await disk.bind(EXCHANGE, b'prefix:"disk"')
        c = await consumer(lj, program=b'prefix:"mem"')
        safe = await Shipper.open(lj)
        await safe.send(encoder.batch(events(1, beat="disk")))
        assert await safe.ack() == (2, 1)  # while the disk works
        monkeypatch.setattr(segmentlog, "os", FailingFsync())
        shipper = await Shipper.open(lj)
        await shipper.send(encoder.batch(events(2, beat="disk")))
        await shipper.closed_by_broker()
        assert shipper.got == [] and shipper.acks.feed(b"") == []
        await shipper.close()
        await safe.send(encoder.batch(events(1, beat="mem"), first_seq=2))
        assert await safe.ack() == (2, 2)
        assert (await receive(c, 1))[0].route == b"mem"
        await safe.close()
        await c.close()


async def test_an_earlier_batch_is_acknowledged_while_a_later_one_waits(
    settings: Settings,
) -> None:
    async with running(with_lumberjack(settings, keepalive_seconds=0.2)) as broker:
        source = "c/bq2/mem:permanent,block,backlog=4,public"
        await (await consumer(broker, source, flags=0x0110)).close()
        shipper = await Shipper.open(broker)
        first, second = events(3), events(5, first=3)
        # Pipelined in one write: the first fits, the second fills the queue.
        await shipper.send(encoder.batch(first) + encoder.batch(second))
        assert await shipper.ack() == (2, 3)
        assert set(await shipper.no_ack(0.5)) == {(2, 0)}  # the second's ACK waits
        c = await consumer(broker, source, flags=0x0110)
        assert [m.payload for m in await receive(c, 8)] == first + second
        assert await shipper.ack() == (2, 5)
        await shipper.close()
        await c.close()


async def test_an_idle_connection_holds_no_task_or_timer(lj: Broker) -> None:
    shipper = await Shipper.open(lj)
    await shipper.send(encoder.window(1, 100) + encoder.data_frame(1, {"a": "b"}))
    assert await shipper.ack() == (1, 1)  # after the idle time
    (transport,) = lj.front_ends["lumberjack"].connections
    session = transport.get_protocol()
    assert isinstance(session, LumberjackSession)
    await wait_for(lambda: session._idle is None)
    assert (session._room, session._durable, session._keepalive) == (None, None, None)
    assert session.held == "" and lj.budget.used == 0
    await shipper.close()
