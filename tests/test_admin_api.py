"""The admin API (docs/admin.md) against real brokers on loopback, through the real client.

The client (fqbroker.clients.admin) is blocking, so each call runs in a thread while the
broker serves on the test's loop. fq clients are raw sessions (conftest), so what an
admin's change does is seen as an fq client sees it.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fqbroker.clients.admin import AdminClient
from fqbroker.config import Settings
from fqbroker.errors import AdminError
from fqbroker.server.broker import Broker
from fqbroker.storage.state import ConfigStore

from .conftest import TIMEOUT, open_session, running, wait_for


def client(broker: Broker, **creds: Any) -> AdminClient:
    return AdminClient(f"http://127.0.0.1:{broker.port}", timeout=TIMEOUT, **creds)


async def call(admin: AdminClient, method: str, *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(getattr(admin, method), *args, **kwargs)


async def refused(admin: AdminClient, method: str, *args: Any, **kwargs: Any) -> AdminError:
    with pytest.raises(AdminError) as info:
        await call(admin, method, *args, **kwargs)
    return info.value


@pytest.fixture
async def admin(broker: Broker) -> AsyncIterator[AdminClient]:
    yield client(broker)


async def test_status_names_the_node(broker: Broker, admin: AdminClient) -> None:
    node = await call(admin, "status")
    assert node["node_id"] == "10.254.254.1"
    assert node["version"] and node["fq_version"]
    assert node["uptime_seconds"] >= 0 and node["rss_bytes"] > 0
    assert {"name": "fq", "address": f"127.0.0.1:{broker.port}"} in node["listeners"] or any(
        listener["address"].endswith(f":{broker.port}") for listener in node["listeners"]
    )
    assert node["peers"] == []


async def test_queue_create_list_peek_purge_delete(broker: Broker, admin: AdminClient) -> None:
    made = await call(admin, "create_queue", "jobs", public=True, policy="drop", backlog_limit=50)
    assert made["queue"]["name"] == "jobs" and made["queue"]["public"] is True
    assert (await refused(admin, "create_queue", "jobs")).status == 409
    await call(admin, "bind", "ex", "prefix:", "jobs")
    for i in range(3):
        await call(admin, "publish", "ex", f"r.{i}", f"message {i}")
    (row,) = [q for q in await call(admin, "queues") if q["name"] == "jobs"]
    assert row["backlog"] == 3 and row["backlog_limit"] == 50 and row["clients"] == 0
    peeked = await call(admin, "peek", "jobs", 2)
    assert [m["payload"] for m in peeked] == ["message 0", "message 1"]
    assert [m["route"] for m in peeked] == ["r.0", "r.1"]
    assert base64.b64decode(peeked[0]["payload_base64"]) == b"message 0"
    again = await call(admin, "peek", "jobs", 10)
    assert [m["payload"] for m in again] == ["message 0", "message 1", "message 2"]
    assert await call(admin, "purge_queue", "jobs") == 3
    assert await call(admin, "peek", "jobs") == []
    await call(admin, "delete_queue", "jobs")
    assert b"jobs" not in broker.queues
    assert (await refused(admin, "purge_queue", "jobs")).status == 404


async def test_binding_added_over_http_routes_to_an_fq_client(
    broker: Broker, admin: AdminClient
) -> None:
    session = await open_session(broker.port, queue_field=b"q1\x00mem:public")
    try:
        added = await call(admin, "bind", "logs", 'prefix:"app."', "q1")
        assert added["binding"]["queue"] == "q1"
        rows = await call(admin, "bindings")
        assert [(b["exchange"], b["program"], b["queue"]) for b in rows] == [
            ("logs", 'prefix:"app."', "q1")
        ]
        await call(admin, "publish", "logs", "app.web", "hello")
        await call(admin, "publish", "logs", "db.x", "not for q1")
        (msg,) = await session.receive(1)
        assert msg.payload == b"hello" and msg.route == b"app.web"
        # The client's queue has clients: no delete without force.
        assert (await refused(admin, "delete_queue", "q1")).status == 409
        await call(admin, "unbind", "logs", 'prefix:"app."', "q1")
        assert await call(admin, "bindings") == []
        assert (await refused(admin, "unbind", "logs", 'prefix:"app."', "q1")).status == 404
    finally:
        await session.close()


async def test_permanent_queue_and_binding_are_stored_and_restored(settings: Settings) -> None:
    async with running(settings) as broker:
        admin = client(broker)
        await call(admin, "create_queue", "keep", type="disk", permanent=True, public=True)
        answer = await call(admin, "bind", "ex", "prefix:", "keep", permanent=True)
        assert answer["binding"]["stored"] is True
        await call(admin, "publish", "ex", "r", "durable")
    store = ConfigStore(settings.config_db)
    try:
        assert [q.name for q in store.queues()] == [b"keep"]
        assert [(b.exchange, b.queue, b.program) for b in store.bindings()] == [
            (b"ex", b"keep", b"prefix:")
        ]
    finally:
        store.close()
    async with running(settings) as broker:
        admin = client(broker)
        (row,) = await call(admin, "queues")
        assert row["name"] == "keep" and row["permanent"] and row["type"] == "disk"
        assert row["backlog"] == 1
        assert [m["payload"] for m in await call(admin, "peek", "keep")] == ["durable"]
        assert await call(admin, "purge_queue", "keep") == 1
        await call(admin, "delete_queue", "keep")
    store = ConfigStore(settings.config_db)
    try:
        assert store.queues() == [] and store.bindings() == []
    finally:
        store.close()


async def test_bad_requests_are_400(broker: Broker, admin: AdminClient) -> None:
    assert (await refused(admin, "create_queue", "q", type="tape")).status == 400
    assert (await refused(admin, "post", "queues/create", {"name": 5})).status == 400
    assert (await refused(admin, "post", "queues/create", {})).status == 400
    await call(admin, "create_queue", "q")
    assert (await refused(admin, "bind", "ex", "nonsense:(", "q")).status == 400
    assert (await refused(admin, "bind", "ex", "prefix:", "nope")).status == 404
    assert (await refused(admin, "peek", "q", 0)).status == 400
    assert (await refused(admin, "get", "nothing/here")).status == 404
    assert (await refused(admin, "get", "queues/purge")).status == 405


async def test_forced_delete_ends_the_clients(broker: Broker, admin: AdminClient) -> None:
    session = await open_session(broker.port, queue_field=b"busy\x00mem:public")
    try:
        answer = await call(admin, "delete_queue", "busy", force=True)
        assert answer["clients_closed"] == 1
        await wait_for(lambda: b"busy" not in broker.queues)
    finally:
        await session.close()
