"""Fixtures: a real broker on a loopback port picked by the kernel, and raw connections."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from fqbroker.core.router import Router
from fqbroker.frontends.kit.component import FrontEnd
from fqbroker.protocols.fq import wire
from fqbroker.protocols.fq.msgdecoder import MessageDecoder
from fqbroker.server.broker import Broker
from fqbroker.server.frontends import FRONT_ENDS
from fqbroker.settings.broker import Settings
from fqbroker.storage.configdb.catalog import Catalog
from fqbroker.storage.configdb.state import ConfigStore
from tests.procs import Proc

NODE_ID = "10.254.254.1"
TIMEOUT = 10.0


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        port=0,
        node_id=NODE_ID,
        config_db=tmp_path / "fqd.sqlite",
        queue_dir=tmp_path / "queues",
    )


@contextlib.asynccontextmanager
async def running(settings: Settings, *extra: FrontEnd[Any]) -> AsyncIterator[Broker]:
    """A broker started on ``settings``, with test-only front ends beside the table's, and
    stopped at the end whatever happened."""
    broker = Broker(settings, front_ends=(*FRONT_ENDS, *extra))
    await broker.start()
    try:
        yield broker
    finally:
        async with asyncio.timeout(TIMEOUT):
            await broker.stop()


def on(settings: Settings, name: str, **values: Any) -> Settings:
    """``settings`` with the table's front end ``name`` on, listening on a loopback port the
    kernel picks, and ``values`` set in its settings table."""
    (spec,) = [s for s in FRONT_ENDS if s.name == name]
    assert spec.settings is not None, f"{name} has no settings table"
    table = settings.section(spec.settings)
    settings.set_section(table.updated({"listen": "127.0.0.1:0", **values}))
    return settings


def port_of(broker: Broker, name: str) -> int:
    """The port the front end ``name`` listens on."""
    address = broker.front_ends[name].address
    assert address is not None, f"{name} is not listening"
    return address[1]


@pytest.fixture
async def broker_on(request: pytest.FixtureRequest, settings: Settings) -> AsyncIterator[Broker]:
    """A broker with the front ends the test's ``on`` marks name turned on (:func:`on`):
    ``@pytest.mark.on("figg", max_topics=5)``, or ``pytestmark`` for a whole file."""
    for mark in request.node.iter_markers("on"):
        on(settings, *mark.args, **mark.kwargs)
    async with running(settings) as broker:
        yield broker


def root_and_bob(settings: Settings) -> Settings:
    """Users on: "root" (password rootpw) may administer, "bob" (bobpw) only publish."""
    from fqbroker.storage.configdb.users import Users

    users = Users(settings.config_db)
    users.add("root", "rootpw")
    users.allow("root", "admin", "*")
    users.add("bob", "bobpw")
    users.allow("bob", "publish", "*")
    users.close()
    settings.auth = "password"
    return settings


@pytest.fixture
async def broker(settings: Settings) -> AsyncIterator[Broker]:
    async with running(settings) as b:
        yield b


@pytest.fixture
def catalog(tmp_path: Path) -> Iterator[Catalog]:
    """A catalog and router of their own, with no broker around them."""
    settings = Settings(config_db=tmp_path / "fqd.sqlite", queue_dir=tmp_path / "queues")
    catalog = Catalog(settings, Router(), ConfigStore(settings.config_db))
    yield catalog
    catalog.close()


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port bound and not listening for the test's duration: a connect is
    refused, and no other process can take it meanwhile (the tests run as root, so even
    port 1 once had a listener)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.fixture
async def procs() -> AsyncIterator[list[Proc]]:
    """Every process a test starts; all killed and reaped at the end, whatever happened."""
    started: list[Proc] = []
    yield started
    for p in started:
        p.kill()
    async with asyncio.timeout(TIMEOUT):
        for p in started:
            await p.proc.wait()


class RawConn:
    """A bare loopback connection for sending exact bytes and reading exact replies."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.replies = wire.ClientCommandDecoder()

    @classmethod
    async def open(cls, port: int) -> RawConn:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def read_exactly(self, n: int) -> bytes:
        async with asyncio.timeout(TIMEOUT):
            return await self.reader.readexactly(n)

    async def frame(self) -> wire.Frame:
        """The next command-channel reply."""
        async with asyncio.timeout(TIMEOUT):
            while (frame := self.replies.next_frame()) is None:
                chunk = await self.reader.read(65536)
                if not chunk:
                    raise EOFError("connection closed")
                self.replies.feed(chunk)
            return frame

    async def reply(self) -> wire.Frame:
        """The next reply that is not a heartbeat."""
        while isinstance(frame := await self.frame(), wire.Heartbeat):
            pass
        return frame

    async def closed(self) -> bytes:
        """Wait for the broker to close the connection; returns what it sent before."""
        data = b""
        async with asyncio.timeout(TIMEOUT):
            try:
                while chunk := await self.reader.read(65536):
                    data += chunk
            except ConnectionResetError:
                pass
        await self.close()
        return data

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


class Session:
    """An authenticated command connection with its paired data connection."""

    def __init__(self, cmd: RawConn, data: RawConn, key: bytes) -> None:
        self.cmd = cmd
        self.data = data
        self.key = key
        self.messages = MessageDecoder(peer_format=True)

    async def bind(self, exchange: bytes, program: bytes, flags: int = 0x100) -> int:
        await self.cmd.send(wire.encode(wire.BindRequest(flags, exchange, program)))
        reply = await self.cmd.reply()
        assert isinstance(reply, wire.BindResponse)
        return reply.route_id

    async def status(self) -> dict[str, int]:
        await self.cmd.send(wire.encode(wire.StatusRequest()))
        reply = await self.cmd.reply()
        assert isinstance(reply, wire.Status)
        return reply.as_dict()

    async def publish(self, exchange: bytes, route: bytes, payload: bytes) -> None:
        from fqbroker.core.message import Message

        await self.data.send(Message(exchange, route, payload).publish_frame())

    async def receive(self, n: int = 1) -> list:  # type: ignore[type-arg]
        out: list = []  # type: ignore[type-arg]
        async with asyncio.timeout(TIMEOUT):
            while len(out) < n:
                out.extend(self.messages.messages())
                if len(out) >= n:
                    break
                chunk = await self.data.reader.read(65536)
                if not chunk:
                    raise EOFError("data channel closed")
                self.messages.feed(chunk)
        return out

    async def close(self) -> None:
        await self.data.close()
        await self.cmd.close()


async def authenticate(
    port: int, user: bytes = b"user", queue_field: bytes = b"", password: bytes = b"pw"
) -> RawConn:
    cmd = await RawConn.open(port)
    await cmd.send(
        wire.encode_hello(wire.Mode.CMD, b"")[:4]
        + wire.encode(wire.AuthPlain(user, queue_field, password))
    )
    return cmd


async def open_session(port: int, user: bytes = b"user", queue_field: bytes = b"") -> Session:
    cmd = await authenticate(port, user, queue_field)
    reply = await cmd.frame()
    assert isinstance(reply, wire.AuthResponse), reply
    assert await cmd.frame() == wire.Heartbeat()
    data = await RawConn.open(port)
    await data.send(wire.encode_hello(wire.Mode.DATA, reply.key))
    return Session(cmd, data, reply.key)


async def wait_for(predicate, timeout: float = TIMEOUT) -> None:  # type: ignore[no-untyped-def]
    """Poll a condition on broker state: for things no event announces (bounded)."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)


class FailingFsync:
    """Stands in for the os module in fqbroker.storage.segments.log (monkeypatch its ``os``): fsync
    fails with EIO while ``failing`` is set. The fault is injected at the OS boundary and
    nowhere else; ``synced`` lists what the fsyncs that went through were for."""

    def __init__(self, failing: bool = True) -> None:
        self.failing = failing
        self.synced: list[str] = []

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    def fsync(self, fd: int) -> None:
        if self.failing:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        self.synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        os.fsync(fd)
