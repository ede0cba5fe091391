"""Permissions enforced end to end (auth = "password"): a real broker on loopback, users
and rules in its real sqlite config DB, fq's wire from raw sockets and the Python client.

A bind not permitted gets fq's bind failure; a message published where its user may
not is dropped and counted ``denied`` (client, exchange, /stats.json, /metrics) and a
confirm covering it fails; a queue not permitted, or another user's private queue,
refuses auth with a clear error.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from fqbroker.clients.fq.client import Client, ClientError
from fqbroker.protocols.fq import wire
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings, Upstream
from fqbroker.storage.configdb.users import Users
from tests.conftest import RawConn, Session, authenticate, running, wait_for
from tests.e2e.http.test_http import get
from tests.e2e.http.test_metrics import scrape, value

PASSWORD = "s3cret pw"
INTEROP = Path(__file__).resolve().parents[3] / "tests" / "interop"


@pytest.fixture
async def secured(settings: Settings) -> AsyncIterator[Broker]:
    """A broker under auth = "password" with three users: ``admin`` (everything),
    ``app`` (publish on logs.*, but not logs.secret; bind on metrics; queues app-*) and
    ``other`` (queues anything, nothing else); ``peer`` (a downstream broker's link:
    bind on logs.*, queues peer-*)."""
    users = Users(settings.config_db)
    try:
        for name in ("admin", "app", "other", "peer"):
            users.add(name, PASSWORD)
        users.allow("admin", "admin", "*")
        users.allow("app", "publish", "logs.*")
        users.deny("app", "publish", "logs.secret")
        users.allow("app", "consume", "metrics")
        users.allow("app", "queue", "app-*")
        users.allow("other", "queue", "*")
        users.allow("peer", "consume", "logs.*")
        users.allow("peer", "queue", "peer-*")
    finally:
        users.close()
    async with running(replace(settings, auth="password")) as broker:
        yield broker


async def login(port: int, user: bytes, queue_field: bytes) -> Session:
    """An authenticated command connection (with the right password) and its data socket."""
    cmd = await authenticate(port, user, queue_field, PASSWORD.encode())
    reply = await cmd.frame()
    assert isinstance(reply, wire.AuthResponse), reply
    data = await RawConn.open(port)
    await data.send(wire.encode_hello(wire.Mode.DATA, reply.key))
    return Session(cmd, data, reply.key)


async def refused(port: int, user: bytes, queue_field: bytes) -> bytes:
    """Authenticate with the right password; what the broker says before it closes."""
    cmd = await authenticate(port, user, queue_field, PASSWORD.encode())
    return await cmd.closed()


async def test_bind_not_permitted_gets_fqs_bind_failure(secured: Broker) -> None:
    app = await login(secured.port, b"app", b"app-q")
    try:
        assert await app.bind(b"metrics", b"prefix:") != wire.BIND_ILLEGAL
        assert await app.bind(b"logs.web", b"prefix:") == wire.BIND_ILLEGAL
        assert await app.bind(b"metrics2", b"prefix:") == wire.BIND_ILLEGAL
        # Nothing was bound for the refused ones; the session goes on serving.
        assert b"logs.web" not in secured.router.exchanges
        assert (await app.status())["dropped_in"] == 0
    finally:
        await app.close()


async def test_publish_not_permitted_is_dropped_and_counted(secured: Broker) -> None:
    admin = await login(secured.port, b"admin", b"admin-q")
    app = await login(secured.port, b"app", b"app-q")
    try:
        for exchange in (b"logs.web", b"logs.secret", b"other"):
            assert await admin.bind(exchange, b"prefix:") != wire.BIND_ILLEGAL
        await app.publish(b"logs.secret", b"r", b"no")
        await app.publish(b"other", b"r", b"no")
        await app.publish(b"logs.web", b"r", b"yes")
        await app.publish(b"never-bound", b"r", b"no")
        (msg,) = await admin.receive()
        assert (msg.exchange, msg.payload) == (b"logs.web", b"yes")
        stats = secured.clients[app.key].stats
        await wait_for(lambda: stats.msgs_in == 4)
        assert (stats.denied, stats.routed, stats.no_exchange) == (3, 1, 0)
        exchanges = secured.router.exchanges
        assert (exchanges[b"logs.secret"].denied, exchanges[b"other"].denied) == (1, 1)
        assert exchanges[b"logs.web"].denied == 0
        assert secured.router.aggregate.denied == 3

        _, body = await get(secured.port, "/stats.json")
        doc = json.loads(body)
        assert doc["exchanges"]["_aggregate"]["denied"] == 3
        assert doc["exchanges"]["logs.secret"]["denied"] == 1
        assert "denied" not in doc["exchanges"]["logs.web"]
        (client,) = doc["queues"]["app-q"]["clients"]
        assert client["denied"] == "3"
        # Series that name users and clients are a logged-in user's to see.
        basic = base64.b64encode(f"admin:{PASSWORD}".encode()).decode()
        samples, _ = await scrape(secured, login=[("Authorization", f"Basic {basic}")])
        assert value(samples, "fq_denied_total") == 3
        assert value(samples, "fq_exchange_denied_total", exchange="other") == 1
        key = secured.clients[app.key]
        labels = {"user": "app", "queue": "app-q", "client": f"127.0.0.1:{key.remote_port}"}
        assert value(samples, "fq_client_denied_total", **labels) == 3
        # The admin's own messages go anywhere.
        await admin.publish(b"other", b"r", b"admin may")
        (msg,) = await admin.receive()
        assert msg.payload == b"admin may"
    finally:
        await app.close()
        await admin.close()


async def test_a_confirm_covering_a_denied_message_fails(secured: Broker) -> None:
    async with Client(port=secured.port, source="app/app-c", password=PASSWORD) as client:
        client.publish(b"logs.web", b"r", b"fine")
        assert await client.confirm() == 1
        client.publish(b"logs.secret", b"r", b"denied")
        client.publish(b"logs.web", b"r", b"fine too")
        with pytest.raises(ClientError, match="publish denied"):
            await client.confirm()
        assert secured.router.aggregate.denied == 1


async def test_queue_not_permitted_refuses_auth(secured: Broker) -> None:
    said = await refused(secured.port, b"app", b"not-mine")
    assert wire.encode(wire.ErrorReply("permission denied: queue not-mine")) in said
    assert "not-mine" not in {q.decode() for q in secured.queues}
    # The broker serves everyone else.
    app = await login(secured.port, b"app", b"app-ok")
    await app.close()


async def test_another_users_private_queue_cannot_be_attached(secured: Broker) -> None:
    # A permanent private queue outlives its client; its owner comes back, nobody else.
    spec = b"app-private\x00mem:private,permanent"
    owner = await login(secured.port, b"app", spec)
    await owner.close()
    await wait_for(lambda: not secured.queues[b"app-private"].clients)
    said = await refused(secured.port, b"other", spec)
    assert wire.encode(wire.ErrorReply("permission denied: private queue of another user")) in said
    again = await login(secured.port, b"app", spec)
    await again.close()
    await wait_for(lambda: not secured.queues[b"app-private"].clients)
    # An administrator may (to drain it, say).
    admin = await login(secured.port, b"admin", spec)
    await admin.close()


async def test_public_queues_are_shared_between_users(secured: Broker) -> None:
    spec = b"app-shared\x00mem:public"
    first = await login(secured.port, b"app", spec)
    second = await login(secured.port, b"other", spec)
    assert len(secured.queues[b"app-shared"].clients) == 2
    await first.close()
    await second.close()


async def test_under_auth_none_nothing_is_denied(broker: Broker) -> None:
    """The default: every client may do everything, and /stats.json has no denied key."""
    session = await login(broker.port, b"anyone", b"any-q")
    try:
        assert await session.bind(b"logs.secret", b"prefix:") != wire.BIND_ILLEGAL
        await session.publish(b"logs.secret", b"r", b"m")
        (msg,) = await session.receive()
        assert msg.payload == b"m"
        _, body = await get(broker.port, "/stats.json")
        assert "denied" not in body.decode()
    finally:
        await session.close()


async def test_a_peer_links_user_needs_the_rights_on_the_upstream(
    secured: Broker, tmp_path: Path
) -> None:
    """A downstream broker pulls logs.web and secret through a link logging in as
    ``peer``: the upstream refuses the bind on secret (the link logs it and pulls the
    rest); once granted, the link's next connection binds it."""

    def row(exchange: bytes) -> Upstream:
        source = "peer/peer-q/mem:drop,private"
        return Upstream("127.0.0.1", secured.port, source, PASSWORD, exchange, b"prefix:", False)

    down = Settings(
        port=0,
        node_id="10.254.254.2",
        config_db=tmp_path / "down.sqlite",
        queue_dir=tmp_path / "down-queues",
        upstream=[row(b"logs.web"), row(b"secret")],
    )
    async with running(down) as downstream:
        (link,) = downstream.peering.links.values()
        await wait_for(lambda: len(link.bound) == 1 and len(link.refused) == 1)
        assert {b.exchange for b in link.refused} == {b"secret"}
        local = await login(downstream.port, b"reader", b"reader-q")
        admin = await login(secured.port, b"admin", b"admin-q")
        try:
            for exchange in (b"logs.web", b"secret"):
                assert await local.bind(exchange, b"prefix:") != wire.BIND_ILLEGAL
            await admin.publish(b"secret", b"r", b"not pulled")
            await admin.publish(b"logs.web", b"r", b"pulled")
            (msg,) = await local.receive()
            assert (msg.exchange, msg.payload) == (b"logs.web", b"pulled")

            # The upstream's operator grants it; the link asks again once it reconnects.
            users = Users(secured.settings.config_db)
            try:
                users.allow("peer", "consume", "secret")
            finally:
                users.close()
            (session,) = [s for s in secured.clients.values() if s.user == b"peer"]
            session.close()
            await wait_for(lambda: len(link.bound) == 2 and not link.refused)
            await admin.publish(b"secret", b"r", b"now pulled")
            (msg,) = await local.receive()
            assert (msg.exchange, msg.payload) == (b"secret", b"now pulled")
        finally:
            await admin.close()
            await local.close()


async def test_the_npm_fq_client_sees_bind_failure_and_its_messages_are_denied(
    secured: Broker,
) -> None:
    """An old client, unchanged: fq's bind failure reaches it (as -1, its signed reading
    of 0xffffffff), and what it publishes where it may not is counted denied."""
    node = shutil.which("node")
    if node is None or not (INTEROP / "node_modules" / "fq").is_dir():
        pytest.fail("node and the npm fq client are required: run `make node` (make test does)")
    proc = await asyncio.create_subprocess_exec(
        node, str(INTEROP / "npm_fq_perms.js"), str(secured.port), "app", PASSWORD,
        "app-npm", "logs.web", "other", "5",
        cwd=INTEROP, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(30):
            line = await proc.stdout.readline()
        assert json.loads(line) == {"bind": -1}
        await wait_for(lambda: secured.router.aggregate.denied == 5)
        (session,) = [s for s in secured.clients.values() if s.user == b"app"]
        assert session.stats.denied == 5 and session.stats.routed == 0
    finally:
        proc.kill()
        await proc.wait()
