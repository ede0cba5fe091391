"""The admin API (docs/admin.md) against real brokers on loopback, through the real client.

The client (fqbroker.clients.http.admin) is blocking, so each call runs in a thread while the
broker serves on the test's loop. fq clients are raw sessions (conftest), so what an
admin's change does is seen as an fq client sees it.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fqbroker import accel
from fqbroker.clients.http.admin import AdminClient
from fqbroker.errors import AdminError
from fqbroker.protocols.fq import wire
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from fqbroker.storage.configdb.state import ConfigStore
from tests.conftest import TIMEOUT, open_session, root_and_bob, running, wait_for
from tests.e2e.http.test_http import HttpConn


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
    # Which build runs, as `fqd --version` says it.
    assert node["accelerator"] == accel.describe()
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


async def test_an_http_binding_is_the_one_an_fq_client_would_make(
    broker: Broker, admin: AdminClient
) -> None:
    session = await open_session(broker.port, queue_field=b"q2\x00mem:public,permanent")
    try:
        added = (await call(admin, "bind", "ex", 'prefix:"a."', "q2", permanent=True))["binding"]
        assert added["stored"] is True
        # The client binding the same program on its queue gets the same binding back...
        assert await session.bind(b"ex", b'prefix:"a."', 0x110) == added["id"]
        # ...and may unbind it by that id, as if it had made it: the stored row goes too.
        await session.cmd.send(wire.encode(wire.UnbindRequest(added["id"], b"ex")))
        reply = await session.cmd.reply()
        assert isinstance(reply, wire.UnbindResponse) and reply.route_id == added["id"]
        assert await call(admin, "bindings") == []
        assert broker.catalog.config.bindings() == []
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


async def test_peek_neither_consumes_nor_reorders(broker: Broker, admin: AdminClient) -> None:
    for name, kind in (("mq", "mem"), ("dq", "disk")):
        await call(admin, "create_queue", name, type=kind, public=True, permanent=True)
        await call(admin, "bind", f"ex-{name}", "prefix:", name)
        for i in range(20):
            await call(admin, "publish", f"ex-{name}", "r", f"m{i}")
        for _ in range(2):
            peeked = await call(admin, "peek", name, 5)
            assert [m["payload"] for m in peeked] == [f"m{i}" for i in range(5)]
        assert [m["payload"] for m in await call(admin, "peek", name, 1000)] == [
            f"m{i}" for i in range(20)
        ]  # at most 100 asked: all 20
        session = await open_session(
            broker.port, queue_field=name.encode() + b"\x00" + kind.encode() + b":public"
        )
        try:
            got = await session.receive(20)
            assert [m.payload for m in got] == [b"m%d" % i for i in range(20)]
        finally:
            await session.close()


async def test_a_purged_disk_queue_stays_purged_after_a_restart(settings: Settings) -> None:
    async with running(settings) as broker:
        admin = client(broker)
        await call(admin, "create_queue", "dq", type="disk", permanent=True, public=True)
        await call(admin, "bind", "ex", "prefix:", "dq", permanent=True)
        for i in range(10):
            await call(admin, "publish", "ex", "r", f"old{i}")
        assert await call(admin, "purge_queue", "dq") == 10
        for i in range(2):
            await call(admin, "publish", "ex", "r", f"new{i}")
    async with running(settings) as broker:
        admin = client(broker)
        assert [m["payload"] for m in await call(admin, "peek", "dq")] == ["new0", "new1"]
        session = await open_session(broker.port, queue_field=b"dq\x00disk:public")
        try:
            assert [m.payload for m in await session.receive(2)] == [b"new0", b"new1"]
            await call(admin, "publish", "ex", "r", "live")
            (msg,) = await session.receive(1)
            assert msg.payload == b"live"
            # Purging under a consumer is safe: it keeps receiving what comes next.
            assert await call(admin, "purge_queue", "dq") == 0
            await call(admin, "publish", "ex", "r", "after")
            (msg,) = await session.receive(1)
            assert msg.payload == b"after"
        finally:
            await session.close()


async def test_purge_lets_a_blocked_publisher_go_on(broker: Broker, admin: AdminClient) -> None:
    await call(admin, "create_queue", "bq", policy="block", backlog_limit=2)
    await call(admin, "bind", "ex", "prefix:", "bq")
    await call(admin, "publish", "ex", "r", "one")
    # The second fills the queue: its answer waits for room, as /submit's does.
    second = asyncio.ensure_future(call(admin, "publish", "ex", "r", "two"))
    await wait_for(lambda: broker.queues[b"bq"].backlog == 2)
    await asyncio.sleep(0.1)
    assert not second.done()
    assert await call(client(broker), "purge_queue", "bq") == 2
    async with asyncio.timeout(TIMEOUT):
        assert (await second)["routed"] == 1


async def test_purge_frees_a_big_memory_backlog(broker: Broker, admin: AdminClient) -> None:
    await call(admin, "create_queue", "big", public=True)
    await call(admin, "bind", "ex", "prefix:", "big")
    before = broker.budget.used
    payload = base64.b64encode(b"x" * 300_000).decode()
    for _ in range(10):  # 3 MB: more than one consumer batch (TAKE_BYTES)
        await call(
            admin, "post", "publish", {"exchange": "ex", "route": "r", "payload_base64": payload}
        )
    assert broker.budget.used >= before + 3_000_000
    assert await call(admin, "purge_queue", "big") == 10
    assert broker.queues[b"big"].backlog == 0 and broker.budget.used == before


async def test_forced_delete_of_a_permanent_disk_queue(settings: Settings) -> None:
    async with running(settings) as broker:
        admin = client(broker)
        await call(admin, "create_queue", "pd", type="disk", permanent=True, public=True)
        await call(admin, "bind", "ex", "prefix:", "pd", permanent=True)
        await call(admin, "publish", "ex", "r", "x")
        directory = settings.queue_dir / b"pd".hex()
        assert directory.is_dir()
        session = await open_session(broker.port, queue_field=b"pd\x00disk:public")
        try:
            await session.receive(1)
            assert (await refused(admin, "delete_queue", "pd")).status == 409
            await call(admin, "delete_queue", "pd", force=True)
            await wait_for(lambda: b"pd" not in broker.queues)
        finally:
            await session.close()
        assert not directory.exists()
        assert await call(admin, "bindings") == []
    store = ConfigStore(settings.config_db)
    try:
        assert store.queues() == [] and store.bindings() == []
    finally:
        store.close()


async def test_names_in_utf8(broker: Broker, admin: AdminClient) -> None:
    await call(admin, "create_queue", "café", public=True)
    assert b"caf\xc3\xa9" in broker.queues
    await call(admin, "bind", "échange", 'prefix:"é"', "café")
    await call(admin, "publish", "échange", "é.1", "ünïcode")
    (msg,) = await call(admin, "peek", "café")
    assert (msg["exchange"], msg["route"], msg["payload"]) == ("échange", "é.1", "ünïcode")
    assert [q["name"] for q in await call(admin, "queues")] == ["café"]


JSON = [("content-type", "application/json")]


async def test_raw_requests(broker: Broker) -> None:
    conn = await HttpConn.open(broker.port)
    try:
        response, body = await conn.request("HEAD", "/admin/queues")
        assert response.status_code == 200 and body == b""
        for payload in (b"{not json", b"[1, 2]", b'"text"'):
            response, body = await conn.request("POST", "/admin/queues/create", JSON, payload)
            assert response.status_code == 400
            answer = json.loads(body)
            assert answer["status"] == "error" and "\n" not in answer["error"]
        broker.settings.http_max_body = 1 << 16
        body = b'{"exchange": "e", "route": "\\ud800", "payload": "p"}'
        response, body = await conn.request("POST", "/admin/publish", JSON, body)
        assert response.status_code == 400, body
        big = b"x" * (1 << 18)
        response, body = await conn.request("POST", "/admin/publish", JSON, big)
        assert response.status_code == 413
    finally:
        await conn.close()
    conn = await HttpConn.open(broker.port)
    try:
        response, body = await conn.request("GET", "/admin/queues?x=1")  # unknown: ignored
        assert response.status_code == 200 and json.loads(body)["queues"] == []
    finally:
        await conn.close()


# --- checkpoints, peers, users, topics -------------------------------------------------------


async def test_checkpoints_survive_a_purge_and_bring_the_messages_back(
    broker: Broker, admin: AdminClient
) -> None:
    await call(admin, "create_queue", "dq", type="disk", permanent=True, public=True)
    await call(admin, "bind", "ex", "prefix:", "dq")
    for i in range(5):
        await call(admin, "publish", "ex", "r", f"m{i}")
    answer = await call(admin, "add_checkpoint", "dq", "before")
    assert answer["position"] == "0:1"
    (row,) = await call(admin, "checkpoints", "dq")
    named = {c["name"]: c for c in row["checkpoints"]}
    assert named["before"]["behind"] == 5 and not named["before"]["reader"]
    assert await call(admin, "purge_queue", "dq") == 5
    assert await call(admin, "peek", "dq") == []
    # The purge moved the broker's reader only: the named checkpoint still has them.
    reset = await call(admin, "reset_checkpoint", "dq", "before")
    assert reset["backlog"] == 5
    assert [m["payload"] for m in await call(admin, "peek", "dq", 2)] == ["m0", "m1"]
    await call(admin, "remove_checkpoint", "dq", "before")
    assert (await refused(admin, "remove_checkpoint", "dq", "before")).status == 404
    assert (await refused(admin, "add_checkpoint", "dq", "fq")).status == 400
    assert (await refused(admin, "add_checkpoint", "dq", "x", "99:99")).status == 400
    await call(admin, "create_queue", "mq")
    assert (await refused(admin, "checkpoints", "mq")).status == 400
    assert (await refused(admin, "add_checkpoint", "nope", "x")).status == 404


async def test_peer_rows_added_and_removed_over_http(settings: Settings, tmp_path: Any) -> None:
    upstream_settings = Settings(
        port=0,
        node_id="10.254.254.2",
        config_db=tmp_path / "a.sqlite",
        queue_dir=tmp_path / "a-queues",
    )
    async with running(upstream_settings) as upstream, running(settings) as broker:
        admin = client(broker)
        await call(admin, "create_queue", "in", public=True)
        await call(admin, "bind", "ex", "prefix:", "in")
        added = await call(admin, "add_peer", "127.0.0.1", "ex", "peerb", port=upstream.port)
        assert added["peer"]["origin"] == "config_db" and added["peer"]["password_set"] is False
        assert (
            await refused(admin, "add_peer", "127.0.0.1", "ex", "peerb", port=upstream.port)
        ).status == 409

        async def connected() -> bool:
            rows = await call(admin, "peers")
            return rows[0]["state"] == "connected" and rows[0].get("route_id") is not None

        async with asyncio.timeout(TIMEOUT):
            while not await connected():
                await asyncio.sleep(0.05)
        up = client(upstream)
        await call(up, "publish", "ex", "r", "from upstream")
        await wait_for(lambda: broker.queues[b"in"].backlog == 1)
        (msg,) = await call(admin, "peek", "in")
        assert msg["payload"] == "from upstream" and len(msg["hops"]) == 2
        assert await call(admin, "remove_peer", "127.0.0.1", "ex", port=upstream.port) == 1
        assert await call(admin, "peers") == []
        assert not broker.peering.links
        assert (
            await refused(admin, "remove_peer", "127.0.0.1", "ex", port=upstream.port)
        ).status == 404


async def test_users_managed_over_http_under_auth_none(broker: Broker, admin: AdminClient) -> None:
    answer = await call(admin, "add_user", "carol", "pw-carol")
    assert answer["created"] is True
    await call(admin, "allow", "carol", "publish", "logs.*")
    await call(admin, "deny", "carol", "consume", "secret")
    (row,) = await call(admin, "users")
    assert row["name"] == "carol" and row["admin"] is False
    assert {(r["kind"], r["pattern"], r["allow"]) for r in row["rules"]} == {
        ("publish", "logs.*", True),
        ("consume", "secret", False),
    }
    assert (await refused(admin, "allow", "carol", "root", "*")).status == 400
    assert (await refused(admin, "allow", "carol", "admin", "x")).status == 400
    assert (await refused(admin, "allow", "dave", "publish", "*")).status == 404
    await call(admin, "remove_user", "carol")
    assert await call(admin, "users") == []
    assert (await refused(admin, "remove_user", "carol")).status == 404


async def test_topics_listed(settings: Settings) -> None:

    from fqbroker.frontends.figg.settings import Figg

    async with running(settings.with_sections(Figg(listen="127.0.0.1:0"))) as broker:
        admin = client(broker)
        await call(admin, "publish", "figg", "t1", "retained")
        answer = await call(admin, "topics")
        assert answer["configured"] is True
        (topic,) = answer["topics"]
        assert topic["name"] == "t1" and topic["messages"] == 1
    async with running(settings) as broker:
        assert await call(client(broker), "topics") == {
            "status": "success",
            "configured": False,
            "topics": [],
        }


# --- credentials ---------------------------------------------------------------------------


ENDPOINTS = [
    ("get", "status", {}),
    ("get", "queues", {}),
    ("get", "queues/peek", {"name": "q"}),
    ("get", "bindings", {}),
    ("get", "checkpoints", {}),
    ("get", "peers", {}),
    ("get", "users", {}),
    ("get", "topics", {}),
    ("post", "queues/create", {"name": "x"}),
    ("post", "queues/delete", {"name": "q"}),
    ("post", "queues/purge", {"name": "q"}),
    ("post", "bindings/add", {"exchange": "e", "program": "prefix:", "queue": "q"}),
    ("post", "bindings/remove", {"exchange": "e", "program": "prefix:", "queue": "q"}),
    ("post", "publish", {"exchange": "e", "route": "r", "payload": "p"}),
    ("post", "checkpoints/add", {"queue": "q", "name": "c"}),
    ("post", "checkpoints/remove", {"queue": "q", "name": "c"}),
    ("post", "checkpoints/reset", {"queue": "q", "name": "c"}),
    ("post", "peers/add", {"host": "h", "exchange": "e", "source": "s"}),
    ("post", "peers/remove", {"host": "h", "exchange": "e"}),
    ("post", "users/add", {"name": "n", "password": "p"}),
    ("post", "users/remove", {"name": "n"}),
    ("post", "users/allow", {"name": "n", "kind": "publish", "pattern": "*"}),
    ("post", "users/deny", {"name": "n", "kind": "publish", "pattern": "*"}),
]


async def _answer(admin: AdminClient, method: str, endpoint: str, args: dict[str, Any]) -> int:
    try:
        if method == "get":
            await asyncio.to_thread(admin.get, endpoint, **args)
        else:
            await asyncio.to_thread(admin.post, endpoint, args)
    except AdminError as exc:
        return exc.status
    return 200


@pytest.fixture
async def with_users(settings: Settings) -> AsyncIterator[Broker]:
    settings.admin_token = "tok"
    async with running(root_and_bob(settings)) as broker:
        yield broker


async def test_every_endpoint_needs_admin_credentials(with_users: Broker) -> None:
    broker = with_users
    nobody = client(broker)
    wrong = client(broker, user="root", password="nope")
    bob = client(broker, user="bob", password="bobpw")
    for method, endpoint, args in ENDPOINTS:
        assert await _answer(nobody, method, endpoint, args) == 401, endpoint
        assert await _answer(bob, method, endpoint, args) == 403, endpoint
    assert await _answer(wrong, "get", "status", {}) == 401
    assert b"x" not in broker.queues
    root = client(broker, user="root", password="rootpw")
    token = client(broker, token="tok")
    await call(root, "create_queue", "x")
    assert [q["name"] for q in await call(token, "queues")] == ["x"]
    # Under auth = "password" the users are the broker's own: a new one logs in at once.
    await call(token, "add_user", "eve", "evepw")
    await call(token, "allow", "eve", "admin", "*")
    assert (await call(client(broker, user="eve", password="evepw"), "status"))["node_id"]


async def test_publish_into_a_full_reject_queue_is_refused(
    broker: Broker, admin: AdminClient
) -> None:
    """The admin API's publish answers as /submit and a confirm do: never "published"
    for a message a reject-policy queue refused."""
    await call(admin, "create_queue", "rq", policy="reject", backlog_limit=1)
    await call(admin, "bind", "ex", "prefix:", "rq")
    assert (await call(admin, "publish", "ex", "r", "kept"))["routed"] == 1
    error = await refused(admin, "publish", "ex", "r", "refused")
    assert (error.status, str(error)) == (507, "queue full: rq")
    assert broker.queues[b"rq"].backlog == 1
