"""The Figg client against a real in-process broker: resume after the server drops a
subscriber, re-sent publishes after it drops a publisher, PING/PONG keeping an idle client
connected, a reconnect after two missed PONGs (a server of our own that never answers),
and the `figg` console script end to end around a real fqd."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from fqbroker.clients.figg.client import READ_SIZE, FiggClient, Message, Subscription
from fqbroker.clients.figg.machine import Backoff
from fqbroker.protocols.figg import wire
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import TIMEOUT, on, port_of, running, wait_for
from tests.procs import Proc

FAST = Backoff(0.01, 0.1)


pytestmark = pytest.mark.on("figg")


@pytest.fixture
def figg(broker_on: Broker) -> Broker:
    return broker_on


@contextlib.asynccontextmanager
async def client(broker: Broker, **kw: Any) -> AsyncIterator[FiggClient]:
    c = FiggClient("127.0.0.1", port_of(broker, "figg"), backoff=FAST, **kw)
    await c.connect()
    try:
        yield c
    finally:
        await c.close()


def server_side(broker: Broker, c: FiggClient) -> asyncio.Transport:
    """The broker's transport of ``c``'s current connection."""
    mine = c.local_address
    assert mine is not None
    for transport in broker.front_ends["figg"].connections:
        if transport.get_extra_info("peername")[:2] == mine[:2]:
            return transport
    raise AssertionError(f"no server side for {mine}")


async def take(sub: Subscription, n: int) -> list[Message]:
    out: list[Message] = []
    async with asyncio.timeout(TIMEOUT):
        async for msg in sub:
            out.append(msg)
            if len(out) == n:
                break
    return out


async def topic_contents(broker: Broker, topic: bytes) -> list[bytes]:
    """Every message of ``topic`` read back by a fresh subscriber from offset 0."""
    assert broker.topics is not None
    t = broker.topics.get(topic)
    assert t is not None
    async with client(broker) as reader:
        got = await take(reader.subscribe(topic, 0), t.last_offset)
    assert [m.offset for m in got] == list(range(1, t.last_offset + 1))
    return [m.data for m in got]


async def test_subscriber_dropped_by_the_server_resumes_without_gap_or_duplicate(
    figg: Broker,
) -> None:
    before, during = 2000, 1000
    async with client(figg) as pub, client(figg) as sub_client:
        for i in range(before):
            await pub.publish(b"t", b"m%d" % i)
        await pub.flush()
        sub = sub_client.subscribe(b"t", 0)
        got = await take(sub, 100)
        # Mid-stream: most of the backlog is still to come, and more is being published.
        server_side(figg, sub_client).abort()

        async def more() -> None:
            for i in range(before, before + during):
                await pub.publish(b"t", b"m%d" % i)
            await pub.flush()

        publishing = asyncio.create_task(more())
        got += await take(sub, before + during - 100)
        await publishing
        assert sub_client.connections >= 2
    assert [m.data for m in got] == [b"m%d" % i for i in range(before + during)]
    assert [m.offset for m in got] == list(range(1, before + during + 1))


async def test_publisher_dropped_with_unacknowledged_messages_sends_them_again(
    figg: Broker,
) -> None:
    async with client(figg) as pub:
        for i in range(500):
            await pub.publish(b"p", b"m%d" % i)
        await pub.flush()
        # The broker stops reading: the next 100 stay unacknowledged for certain.
        transport = server_side(figg, pub)
        transport.pause_reading()
        for i in range(500, 600):
            await pub.publish(b"p", b"m%d" % i)
        await asyncio.sleep(0.05)
        assert pub.in_flight == 100
        transport.abort()
        await pub.flush()
        assert pub.connections == 2
        assert pub.machine.resent == range(500, 600)
    # The broker never read them before the drop, so exactly once each here.
    assert await topic_contents(figg, b"p") == [b"m%d" % i for i in range(600)]


async def test_publisher_dropped_mid_stream_loses_nothing_acknowledged(figg: Broker) -> None:
    """Delivery is at least once: a message the broker appended but whose ACK died with the
    connection is sent again and stored twice. Duplicates are allowed for those only (the
    seqs re-sent after the drop); every message is in the topic, in seq order otherwise."""
    total = 3000
    async with client(figg) as pub:

        async def publish_all() -> None:
            for i in range(total):
                await pub.publish(b"q", b"%d" % i)
            await pub.flush()

        publishing = asyncio.create_task(publish_all())
        await wait_for(lambda: pub.machine.acked >= 1000)
        server_side(figg, pub).abort()
        async with asyncio.timeout(TIMEOUT):
            await publishing
            # Publishing may have ended before the drop: the reconnect is still to come.
            assert await pub.wait_connected(1) == 2
        resent = pub.machine.resent
    seqs = [int(data) for data in await topic_contents(figg, b"q")]
    assert set(seqs) == set(range(total))
    duplicates = {s for s in seqs if seqs.count(s) > 1}
    assert duplicates <= set(resent), (duplicates, resent)
    assert sorted(set(seqs)) == list(dict.fromkeys(seqs))


async def test_pings_keep_an_idle_client_connected(settings: Settings) -> None:
    # The broker closes a connection silent for 3 s; the client pings every 2 s.
    async with running(on(settings, "figg", idle_seconds=3.0)) as broker, client(broker) as c:
        first = server_side(broker, c)
        await asyncio.sleep(10)
        assert c.connections == 1
        assert server_side(broker, c) is first
        assert not first.is_closing()
        sub = c.subscribe(b"idle", 0)
        await c.publish(b"idle", b"still here")
        await c.flush()
        assert [m.data for m in await take(sub, 1)] == [b"still here"]


async def test_a_slow_consumer_stops_the_reading_not_the_connection(figg: Broker) -> None:
    total, limit = 20_000, 100
    async with client(figg) as pub:
        for i in range(total):
            await pub.publish(b"slow", b"%05d" % i + b"x" * 95)
        await pub.flush()
    async with client(figg, inbox_limit=limit, ping_interval=0.1) as c:
        sub = c.subscribe(b"slow", 0)
        first = await take(sub, 1)
        # Ten ping intervals without reading: no PONG can come, and that is not the broker.
        await asyncio.sleep(1.0)
        held = sub.backlog
        # What one read of the socket brings in at most, past the limit.
        assert held < limit + READ_SIZE // 100, held
        rest = await take(sub, total - 1)
        assert c.connections == 1
    assert [m.offset for m in first + rest] == list(range(1, total + 1))
    assert [int(m.data[:5]) for m in first + rest] == list(range(total))


class Silent:
    """A loopback server that accepts and reads, but never answers: what each connection
    received, as frames."""

    def __init__(self) -> None:
        self.received: list[list[wire.Frame]] = []
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames: list[wire.Frame] = []
        self.received.append(frames)
        self.writers.append(writer)
        decoder = wire.FrameDecoder()
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(65536):
                decoder.receive_data(chunk)
                while (frame := decoder.next_frame()) is not None:
                    frames.append(frame)
        writer.close()

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.close()
        await self.server.wait_closed()


async def test_two_missed_pongs_reconnect(caplog: pytest.LogCaptureFixture) -> None:
    silent = Silent()
    port = await silent.start()
    c = FiggClient("127.0.0.1", port, ping_interval=0.1, backoff=FAST)
    try:
        with caplog.at_level(logging.INFO):
            await c.connect()
            c.subscribe(b"t", 5)
            await c.publish(b"t", b"m0")
            await wait_for(lambda: len(silent.received) >= 2)
            await wait_for(lambda: len(silent.received[1]) >= 2)
    finally:
        await c.close()
        await silent.close()
    first, second = silent.received[0], silent.received[1]
    pings = [f for f in first if isinstance(f, wire.Ping)]
    assert len(pings) == 2, first  # two unanswered, then the connection was dropped
    assert [f for f in first if not isinstance(f, wire.Ping)] == [
        wire.Attach(b"t", 5),
        wire.Publish(b"t", 0, b"m0"),
    ]
    # The new connection re-attaches and re-sends before anything else.
    assert second[:2] == [wire.Attach(b"t", 5), wire.Publish(b"t", 0, b"m0")]
    assert any("no answer to PINGs" in r.getMessage() for r in caplog.records)
    assert not any(r.exc_info for r in caplog.records)  # logged, never a traceback


async def test_a_broker_that_goes_away_is_waited_for(settings: Settings) -> None:
    on(settings, "figg")
    async with running(settings) as broker:
        port = port_of(broker, "figg")
        c = FiggClient("127.0.0.1", port, backoff=FAST)
        await c.connect()
        sub = c.subscribe(b"back", 0)
        await c.publish(b"back", b"before")
        await c.flush()
        assert [m.data for m in await take(sub, 1)] == [b"before"]
    # Stopped; the same port again, the same queue directory: the topic is still there.
    on(settings, "figg", listen=f"127.0.0.1:{port}")
    try:
        await c.publish(b"back", b"while away")
        assert c.in_flight == 1
        async with running(settings):
            await asyncio.wait_for(c.flush(), TIMEOUT)
            assert [(m.offset, m.data) for m in await take(sub, 1)] == [(2, b"while away")]
    finally:
        await c.close()


# --- the console script -----------------------------------------------------------------


async def start_fqd(tmp_path: Path, procs: list[Proc]) -> int:
    fqd, _ = await Proc.start_fqd(tmp_path, "--figg", "127.0.0.1:0")
    procs.append(fqd)
    line = await fqd.wait_stderr("Figg listening on port: ")
    return int(line.rsplit(" ", 1)[1])


async def figg_cli(procs: list[Proc], port: int, *args: str, stdin: bytes | None = None) -> Proc:
    proc = await Proc.start(
        "-m", "fqbroker.cli.figg", "--port", str(port), *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else None,
    )  # fmt: skip
    procs.append(proc)
    return proc


async def test_figg_pub_and_sub_end_to_end(tmp_path: Path, procs: list[Proc]) -> None:
    port = await start_fqd(tmp_path, procs)
    lines = b"first\nsecond line\n\xff\xfe not utf-8\nlast without newline"
    pub = await figg_cli(procs, port, "pub", "news", stdin=lines)
    async with asyncio.timeout(TIMEOUT):
        status, out, err = await pub.finish(lines)
    assert status == 0, err
    assert "published 4 messages" in err and "Traceback" not in err
    sub = await figg_cli(procs, port, "sub", "news", "--offset", "0", "--count", "4", "--json")
    async with asyncio.timeout(TIMEOUT):
        status, out, err = await sub.finish()
    assert status == 0, err
    got = [json.loads(line) for line in out.splitlines()]
    assert got == [
        {"topic": "news", "offset": 1, "data": "first"},
        {"topic": "news", "offset": 2, "data": "second line"},
        {
            "topic": "news",
            "offset": 3,
            "data": base64.b64encode(b"\xff\xfe not utf-8").decode(),
            "base64": True,
        },
        {"topic": "news", "offset": 4, "data": "last without newline"},
    ]
    # Plain lines, resuming after offset 2.
    sub = await figg_cli(procs, port, "sub", "news", "--offset", "2", "--count", "2")
    async with asyncio.timeout(TIMEOUT):
        status, out, err = await sub.finish()
    assert (status, out) == (0, b"\xff\xfe not utf-8\nlast without newline\n"), err


async def test_figg_argument_errors_exit_2_without_traceback(
    procs: list[Proc], closed_port: int
) -> None:
    for args in (
        ["sub"],
        ["sub", "t", "--offset", "-1"],
        ["pub", "x" * 128],
        ["nonsense", "t"],
        ["--port", "70000", "sub", "t"],
    ):
        proc = await figg_cli(procs, 1, *args)
        async with asyncio.timeout(TIMEOUT):
            status, _out, err = await proc.finish()
        assert status == 2, (args, err)
        assert err.startswith("figg") and len(err.splitlines()) == 1, (args, err)  # one line
        assert "Traceback" not in err, (args, err)
    # Nothing listening: a clear line, status 1.
    proc = await figg_cli(procs, closed_port, "sub", "t")
    async with asyncio.timeout(TIMEOUT):
        status, _out, err = await proc.finish()
    assert status == 1 and f"figg: cannot reach 127.0.0.1:{closed_port}" in err
    assert "Traceback" not in err
