"""Bindings within max_bindings_per_queue and max_bindings_per_user (docs/limits.md).

A user allowed to consume one exchange could bind without end and slow every message's
routing; past the limits its bind gets fq's bind failure, and routing goes on.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fqbroker.clients.http.admin import AdminClient
from fqbroker.errors import AdminError
from fqbroker.protocols.fq import wire
from fqbroker.settings.broker import Settings
from fqbroker.storage.configdb.users import Users
from tests.conftest import TIMEOUT, RawConn, Session, authenticate, running


def carol(settings: Settings) -> Settings:
    """auth = "password" with "carol" (carolpw), who may only consume "metrics" (into
    queues of her own), and "root" (rootpw), an admin."""
    users = Users(settings.config_db)
    users.add("carol", "carolpw")
    users.allow("carol", "consume", "metrics")
    users.allow("carol", "queue", "carol*")
    users.add("root", "rootpw")
    users.allow("root", "admin", "*")
    users.close()
    settings.auth = "password"
    return settings


async def login(port: int, user: bytes, password: bytes, queue: bytes) -> Session:
    cmd = await authenticate(port, user, queue, password)
    reply = await cmd.frame()
    assert isinstance(reply, wire.AuthResponse), reply

    data = await RawConn.open(port)
    await data.send(wire.encode_hello(wire.Mode.DATA, reply.key))
    return Session(cmd, data, reply.key)


async def test_a_binding_flood_is_refused_past_the_limits(settings: Settings) -> None:
    carol(settings)
    settings.max_bindings_per_queue = 30
    settings.max_bindings_per_user = 50
    async with running(settings) as broker:
        one = await login(broker.port, b"carol", b"carolpw", b"carol1")
        ids = [await one.bind(b"metrics", f'prefix:"m.{i}."'.encode()) for i in range(40)]
        assert wire.BIND_ILLEGAL not in ids[:30]
        assert ids[30:] == [wire.BIND_ILLEGAL] * 10  # the queue is full
        # The same binding again adds no route: never refused.
        assert await one.bind(b"metrics", b'prefix:"m.3."') == ids[3]
        assert broker.limits.refused["bindings_per_queue"] == 10
        # Another queue of hers: up to her own limit, 50 in all.
        two = await login(broker.port, b"carol", b"carolpw", b"carol2")
        more = [await two.bind(b"metrics", f'prefix:"n.{i}."'.encode()) for i in range(25)]
        assert wire.BIND_ILLEGAL not in more[:20]
        assert more[20:] == [wire.BIND_ILLEGAL] * 5
        assert broker.limits.refused["bindings_per_user"] == 5
        # An unbind makes room again.
        await one.cmd.send(wire.encode(wire.UnbindRequest(ids[0], b"metrics")))
        assert await one.cmd.reply() == wire.UnbindResponse(ids[0])
        assert await two.bind(b"metrics", b'prefix:"n.99."') != wire.BIND_ILLEGAL
        # Routing still works, for her and for everyone else.
        other = await login(broker.port, b"root", b"rootpw", b"rootq")
        assert await other.bind(b"metrics", b'prefix:"m.5."') != wire.BIND_ILLEGAL
        publisher = await login(broker.port, b"root", b"rootpw", b"rootpub")
        await publisher.publish(b"metrics", b"m.5.cpu", b"42")
        (mine,) = await one.receive()
        (theirs,) = await other.receive()
        assert mine.payload == theirs.payload == b"42"
        for session in (one, two, other, publisher):
            await session.close()


async def test_the_admin_api_keeps_the_same_limits(settings: Settings) -> None:
    carol(settings)
    settings.max_bindings_per_queue = 3
    async with running(settings) as broker:
        admin = AdminClient(
            f"http://127.0.0.1:{broker.port}", timeout=TIMEOUT, user="root", password="rootpw"
        )

        async def call(method: str, *args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(getattr(admin, method), *args, **kwargs)

        await call("create_queue", "jobs")
        for i in range(3):
            await call("bind", "ex", f'prefix:"{i}."', "jobs")
        await call("bind", "ex", 'prefix:"0."', "jobs")  # the same again: no new route
        try:
            await call("bind", "ex", 'prefix:"3."', "jobs")
        except AdminError as exc:
            assert exc.status == 409 and "too many bindings" in str(exc)
        else:
            raise AssertionError("a fourth binding into jobs was accepted")
        assert broker.limits.refused["bindings_per_queue"] == 1
