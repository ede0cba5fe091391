"""A confirm that reaches the broker before the data socket has paired waits for the
pairing (bounded by ``confirm_pair_timeout``), so a client's first confirm never fails
with "no data channel" just because its two sockets raced (docs/confirms.md)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from fqbroker.clients.fq.client import Client
from fqbroker.core.message import Message
from fqbroker.protocols.fq import wire
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import RawConn, authenticate, wait_for
from tests.procs import Proc

FRESH_CLIENTS = 1000
AT_ONCE = 100


async def _authenticated(port: int) -> tuple[RawConn, bytes]:
    cmd = await authenticate(port)
    reply = await cmd.frame()
    assert isinstance(reply, wire.AuthResponse), reply
    return cmd, reply.key


async def test_a_confirm_sent_before_the_data_socket_pairs_waits_for_it(broker: Broker) -> None:
    cmd, key = await _authenticated(broker.port)
    # The broker has the confirm (and a status behind it) before the data socket exists.
    await cmd.send(wire.encode(wire.ConfirmRequest(1)) + wire.encode(wire.StatusRequest()))
    data = await RawConn.open(broker.port)
    await data.send(
        wire.encode_hello(wire.Mode.DATA, key) + Message(b"ex", b"r", b"first").publish_frame()
    )
    assert await cmd.reply() == wire.Confirmed(1)
    assert isinstance(await cmd.reply(), wire.Status)  # replies keep request order
    await data.close()
    await cmd.close()


async def test_a_confirm_with_no_data_socket_ever_fails_after_the_bound(settings: Settings) -> None:
    async with Broker(dataclasses.replace(settings, confirm_pair_timeout=0.05)) as broker:
        cmd, _ = await _authenticated(broker.port)
        await cmd.send(wire.encode(wire.ConfirmRequest(1)))
        assert await cmd.reply() == wire.ConfirmFailed(1, "no data channel")
        await cmd.send(wire.encode(wire.StatusRequest()))  # the session goes on
        assert isinstance(await cmd.reply(), wire.Status)
        await cmd.close()


async def test_a_waiting_confirm_ends_with_its_session(broker: Broker) -> None:
    cmd, key = await _authenticated(broker.port)
    await cmd.send(wire.encode(wire.ConfirmRequest(1)))
    await cmd.close()
    await wait_for(lambda: key not in broker.clients)


async def test_fresh_clients_each_confirm_their_first_message(
    tmp_path: Path, procs: list[Proc]
) -> None:
    """Through the Python client against a broker in its own process, as in production:
    there the command socket's confirm could overtake the data socket's hello."""
    fqd, port = await Proc.start_fqd(tmp_path)
    procs.append(fqd)
    failures: list[str] = []

    async def one(i: int) -> None:
        async with Client(port=port, source=f"c{i}", reconnect=False) as client:
            client.publish(b"ex", b"r", b"%d" % i)
            try:
                assert await client.confirm() == 1
            except Exception as exc:
                failures.append(f"client {i}: {exc!r}")

    async with asyncio.timeout(120):
        for start in range(0, FRESH_CLIENTS, AT_ONCE):
            await asyncio.gather(*(one(i) for i in range(start, start + AT_ONCE)))
    assert failures == []


async def test_fresh_raw_clients_confirm_at_once(tmp_path: Path, procs: list[Proc]) -> None:
    """A client that knows the broker confirms sends its confirm right behind its first
    message, with no status round trip between, which gives the race its widest window."""
    fqd, port = await Proc.start_fqd(tmp_path)
    procs.append(fqd)

    async def one(i: int) -> wire.Frame:
        cmd, key = await _authenticated(port)
        data = await RawConn.open(port)
        data.writer.write(
            wire.encode_hello(wire.Mode.DATA, key) + Message(b"ex", b"r", b"%d" % i).publish_frame()
        )
        await cmd.send(wire.encode(wire.ConfirmRequest(1)))
        reply = await cmd.reply()
        await data.close()
        await cmd.close()
        return reply

    replies: list[wire.Frame] = []
    async with asyncio.timeout(120):
        for start in range(0, FRESH_CLIENTS, AT_ONCE):
            replies += await asyncio.gather(*(one(i) for i in range(start, start + AT_ONCE)))
    assert [r for r in replies if r != wire.Confirmed(1)] == []
