"""Deadlines every front end declares: to log in, and without input (docs/limits.md).

Real brokers on loopback with small deadlines from the settings: a connection that never
logs in, or says nothing for too long, is closed and counted off; one that logged in and
waits quietly for messages is left alone.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import trustme

from fqbroker.protocols.fq import wire
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import (
    TIMEOUT,
    RawConn,
    on,
    open_session,
    port_of,
    root_and_bob,
    running,
    wait_for,
)
from tests.pki import make_pki

CMD = wire.Mode.CMD.to_bytes(4, "big")
DATA = wire.Mode.DATA.to_bytes(4, "big")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    yield make_pki(trustme.CA(), tmp_path_factory.mktemp("pki"))


async def closes(conn: RawConn) -> None:
    """The broker closes ``conn`` (within the test's timeout) without a word."""
    assert await conn.closed() == b""


# --- fq: log in, or pair, within login_timeout -------------------------------------------


@pytest.mark.parametrize("auth", ["none", "password"])
async def test_a_command_channel_that_never_logs_in_is_closed(
    settings: Settings, auth: str
) -> None:
    if auth == "password":
        root_and_bob(settings)
    settings.login_timeout = 0.3
    async with running(settings) as broker:
        conns = [await RawConn.open(broker.port) for _ in range(20)]
        for conn in conns:
            await conn.send(CMD)  # claimed by the command channel, then nothing
        await wait_for(lambda: broker.front_ends["fq-command"].counters.open == 20)
        for conn in conns:
            await closes(conn)
        await wait_for(lambda: broker.limits.connections == 0)
        assert broker.front_ends["fq-command"].counters.open == 0


async def test_each_connection_gets_its_own_login_time_and_a_login_is_kept(
    settings: Settings,
) -> None:
    # One queue and one timer per front end: a later arrival still gets its whole
    # deadline, and a session that logged in meanwhile is passed over.
    settings.login_timeout = 1.0
    async with running(settings) as broker:
        early = await RawConn.open(broker.port)
        await early.send(CMD)
        await asyncio.sleep(0.7)
        session = await open_session(broker.port)
        late = await RawConn.open(broker.port)
        await late.send(CMD)
        await closes(early)
        assert not late.reader.at_eof()  # its time is not up yet
        await closes(late)
        assert await session.status()  # logged in: still served
        await session.close()


async def test_a_connection_that_ends_leaves_its_deadline_at_once(settings: Settings) -> None:
    # Kept to its deadline, a closed connection would hold its session and buffers for
    # login_timeout: a reconnect storm's worth of them.
    async with running(settings) as broker:
        conns = [await RawConn.open(broker.port) for _ in range(20)]
        for conn in conns:
            await conn.send(CMD)
        await wait_for(lambda: broker.listeners.deadlines.kept() == 20)
        for conn in conns:
            await conn.close()
        await wait_for(lambda: broker.limits.connections == 0)
        assert broker.listeners.deadlines.kept() == 0


async def test_a_tls_command_channel_that_never_logs_in_is_closed(
    settings: Settings, pki: dict[str, Path]
) -> None:
    settings = replace(
        root_and_bob(settings), tls_cert=pki["cert"], tls_key=pki["key"], login_timeout=0.3
    )
    context = ssl.create_default_context(cafile=str(pki["ca"]))
    async with running(settings) as broker:
        conns = []
        for _ in range(10):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", broker.port, ssl=context, server_hostname="localhost"
            )
            conns.append(RawConn(reader, writer))
        for conn in conns:
            await conn.send(CMD)
        await wait_for(lambda: broker.front_ends["fq-command"].counters.open == 10)
        for conn in conns:
            await closes(conn)
        await wait_for(lambda: broker.limits.connections == 0)


async def test_a_data_channel_that_never_pairs_is_closed(settings: Settings) -> None:
    settings.login_timeout = 0.3
    async with running(settings) as broker:
        conn = await RawConn.open(broker.port)
        await conn.send(DATA)  # the magic, and no key
        await wait_for(lambda: broker.front_ends["fq-data"].counters.open == 1)
        await closes(conn)
        await wait_for(lambda: broker.limits.connections == 0)


async def test_a_logged_in_consumer_without_heartbeats_may_stay_silent(
    settings: Settings,
) -> None:
    # fq-recv, the C tools and npm fq ask for no heartbeats and may wait for hours: past
    # every deadline of the broker, its channels stay open and serve it.
    settings.login_timeout = 0.2
    settings.idle_timeout = 0.2
    settings.http_keepalive_timeout = 0.2
    async with running(settings) as broker:
        session = await open_session(broker.port)
        assert await session.bind(b"ex", b"prefix:") != wire.BIND_ILLEGAL
        await asyncio.sleep(1.5)
        assert broker.front_ends["fq-command"].counters.open == 1
        assert broker.front_ends["fq-data"].counters.open == 1
        sender = await open_session(broker.port, user=b"sender")
        await sender.publish(b"ex", b"r", b"still here")
        (msg,) = await session.receive()
        assert msg.payload == b"still here"
        await sender.close()
        await session.close()


# --- the listeners of their own: idle_timeout ----------------------------------------------


@pytest.mark.parametrize("name", ["lumberjack", "opencluster"])
async def test_a_silent_connection_to_a_listener_is_closed(settings: Settings, name: str) -> None:
    on(settings, name)
    settings.idle_timeout = 0.3
    async with running(settings) as broker:
        conn = await RawConn.open(port_of(broker, name))
        await wait_for(lambda: broker.front_ends[name].counters.open == 1)
        await closes(conn)
        await wait_for(lambda: broker.front_ends[name].counters.open == 0)
        assert broker.limits.connections == 0


# --- HTTP: a whole head within http_header_timeout, keep-alive within its own -------------


async def http_get(broker: Broker) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
    writer.write(b"GET /stats.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    async with asyncio.timeout(TIMEOUT):
        data = await reader.read()
    writer.close()
    return data


async def test_a_slowloris_is_closed_after_the_header_timeout(settings: Settings) -> None:
    settings.http_header_timeout = 1.0
    async with running(settings) as broker:
        conns = []
        for _ in range(5):
            reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
            conns.append((reader, writer))
        head = b"GET /stats.json HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000
        loop = asyncio.get_running_loop()
        start = loop.time()
        closed = 0
        served = False
        # One byte per connection every 0.1 s: each read well within idle_sniff_timeout,
        # the head never whole.
        async with asyncio.timeout(TIMEOUT):
            for byte in head:
                for _, writer in conns:
                    if not writer.is_closing():
                        try:
                            writer.write(bytes([byte]))
                            await writer.drain()
                        except ConnectionError:
                            writer.close()
                if loop.time() - start > 0.5 and not served:
                    # Meanwhile a normal client is served.
                    assert (await http_get(broker)).startswith(b"HTTP/1.1 200 OK")
                    served = True
                closed = sum(r.at_eof() for r, _ in conns)
                if closed == len(conns):
                    break
                await asyncio.sleep(0.1)
        assert closed == len(conns) and served
        assert loop.time() - start >= 0.9
        for _, writer in conns:
            writer.close()
        await wait_for(lambda: broker.front_ends["http"].counters.open == 0)


async def test_an_idle_keep_alive_connection_is_closed(settings: Settings) -> None:
    settings.http_keepalive_timeout = 0.3
    async with running(settings) as broker:
        reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
        writer.write(b"GET /stats.json HTTP/1.1\r\nHost: x\r\n\r\n")
        async with asyncio.timeout(TIMEOUT):
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 OK")
            while await reader.read(65536):
                pass  # the body, then the close
        writer.close()
        await wait_for(lambda: broker.front_ends["http"].counters.open == 0)
