"""Who reads what over HTTP under auth = "password" (docs/security.md, "Who reads what over
HTTP"): message contents need the same right as over the fq socket, and the statistics
name users, clients and files only to a user or the admin token.

A real broker on loopback with real users in its config database, disk queues and retained
topics filled by real fq and Figg publishers, and plain HTTP requests.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fqbroker.clients.fq.client import Client
from fqbroker.clients.http.replay import ReplayClient
from fqbroker.protocols.figg.wire import Attach, Attached, Publish
from fqbroker.protocols.fq import wire
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from fqbroker.storage.configdb.users import Users
from tests.conftest import RawConn, authenticate, on, root_and_bob, running, wait_for
from tests.e2e.figg.test_figg import Conn

ADMIN_TOKEN = "adm-token"
READ_TOKEN = "scrape-token"


def basic(user: str, password: str) -> dict[str, str]:
    pair = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {pair}"}


WHO = {
    "anonymous": {},
    "read token": {"Authorization": f"Bearer {READ_TOKEN}"},
    "carol": basic("carol", "carolpw"),  # queue app-* and consume app-* only
    "root": basic("root", "rootpw"),  # an admin user
    "admin token": {"X-Fq-Token": ADMIN_TOKEN},
}
WRONG_PASSWORD = basic("carol", "nope")

# /queue/read needs the queue right on the name, /topic/read the consume right.
TARGETS = {
    "private queue": "/queue/read?queue=secret&from=1",
    "app queue": "/queue/read?queue=app-x&from=1",
    "another's private app queue": "/queue/read?queue=app-root&from=1",
    "retained topic": "/topic/read?topic=secret-t&from=0",
    "app topic": "/topic/read?topic=app-t&from=0",
    "private queue info": "/queue/info?queue=secret",
    "app topic info": "/topic/info?topic=app-t",
}
ALL = dict.fromkeys(TARGETS, 200)
NONE_401 = dict.fromkeys(TARGETS, 401)
NONE_403 = dict.fromkeys(TARGETS, 403)
EXPECTED = {
    "anonymous": NONE_401,
    "read token": NONE_403,
    "carol": {
        "private queue": 403,
        "app queue": 200,
        "another's private app queue": 403,  # as over fq: attaching it is refused
        "retained topic": 403,
        "app topic": 200,
        "private queue info": 403,
        "app topic info": 200,
    },
    "root": ALL,
    "admin token": ALL,
}


def get(port: int, target: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", target, headers=headers)
        r = conn.getresponse()
        head: dict[str, str] = {}
        for k, v in r.getheaders():  # two WWW-Authenticate headers: both kept
            head[k.lower()] = f"{head[k.lower()]}, {v}" if k.lower() in head else v
        return r.status, head, r.read()
    finally:
        conn.close()


def guarded_settings(settings: Settings, *, reads: bool) -> Settings:
    root_and_bob(settings)
    users = Users(settings.config_db)
    users.add("carol", "carolpw")
    users.allow("carol", "queue", "app-*")
    users.allow("carol", "consume", "app-*")
    users.close()
    settings.admin_token = ADMIN_TOKEN
    settings.read_token = READ_TOKEN
    settings.http_auth_reads = reads
    # The topics are published over a plain Figg port: anonymous, said so outright.
    return on(settings, "figg", anonymous=True)


async def fill(broker: Broker) -> None:
    """Disk queues "secret" and "app-root" (root's private ones) and "app-x", topics
    "secret-t" and "app-t", each with a message in it."""
    rc = ReplayClient(port=broker.port)
    made = (
        ("secret", "disk:permanent,private"),
        ("app-x", "disk:permanent,public"),
        ("app-root", "disk:permanent,private"),  # carol has the right, root owns it
    )
    for queue, params in made:
        await asyncio.to_thread(
            rc.ensure_queue, queue, params=f"{params},backlog=-1",
            user="root", password="rootpw", exchange="ex",
        )  # fmt: skip
    async with Client(port=broker.port, source="root", password="rootpw") as client:
        client.publish(b"ex", b"r", b"queued-contents")
        assert await client.confirm() == 1
    figg = await Conn.open(broker)
    try:
        await figg.send(Publish(b"secret-t", 0, b"topic-contents"))
        await figg.send(Publish(b"app-t", 1, b"topic-contents"))
        await figg.ack(1)
    finally:
        await figg.close()
    topics = broker.topics
    assert topics is not None
    await wait_for(
        lambda: all((t := topics.get(n)) and t.last_offset >= 1 for n in (b"secret-t", b"app-t"))
    )


@pytest.fixture(params=[False, True], ids=["reads-open", "http_auth_reads"])
async def guarded(request: pytest.FixtureRequest, settings: Settings) -> AsyncIterator[Broker]:
    async with running(guarded_settings(settings, reads=request.param)) as broker:
        await fill(broker)
        yield broker


async def test_message_contents_need_the_right_on_the_name(guarded: Broker) -> None:
    """The matrix: whatever http_auth_reads says, contents need a user with the fq right
    on that queue (queue) or topic (consume), an admin user or the admin token; the read
    token reads statistics only."""
    got: dict[str, dict[str, int]] = {}
    for who, headers in WHO.items():
        got[who] = {}
        for what, target in TARGETS.items():
            status, head, body = await asyncio.to_thread(get, guarded.port, target, headers)
            got[who][what] = status
            if status == 401:
                assert json.loads(body) == {"error": "authentication required"}
                assert 'Basic realm="fqbroker"' in head["www-authenticate"]
            elif status == 403:
                assert json.loads(body) == {"error": "forbidden"}
            elif "/read" in target:
                assert b"contents" in body, (who, what)
            if status != 200:
                assert b"contents" not in body
    assert got == EXPECTED
    # Wrong credentials are refused, counted against the login throttle.
    status, _, body = await asyncio.to_thread(
        get, guarded.port, TARGETS["app queue"], WRONG_PASSWORD
    )
    assert status == 401 and b"contents" not in body


async def test_a_user_without_a_name_gets_the_reads_own_answer(guarded: Broker) -> None:
    for target in ("/queue/read", "/topic/read?topic="):
        status, _, body = await asyncio.to_thread(get, guarded.port, target, WHO["carol"])
        assert status == 400, body
        status, _, _ = await asyncio.to_thread(get, guarded.port, target, WHO["read token"])
        assert status == 403
    # A name nobody has: no right, so 403 before anything says whether it exists.
    status, _, _ = await asyncio.to_thread(
        get, guarded.port, "/queue/info?queue=nothing-here", WHO["carol"]
    )
    assert status == 403
    status, _, _ = await asyncio.to_thread(
        get, guarded.port, "/queue/info?queue=app-nothing", WHO["carol"]
    )
    assert status == 404


# --- names in the statistics -----------------------------------------------------------------


@dataclass
class Seen:
    """What must not show to an anonymous reader: carol's fq session, from where, and a
    Figg subscriber's address."""

    fq_client: str  # "127.0.0.1:PORT" of carol's command connection
    fq_port: int
    figg_client: str
    data_dir: str


@pytest.fixture
async def watched(settings: Settings, tmp_path: Path) -> AsyncIterator[tuple[Broker, Seen]]:
    async with running(guarded_settings(settings, reads=False)) as broker:
        await fill(broker)
        cmd = await authenticate(
            broker.port, b"carol", b"app-x\x00disk:permanent,public", b"carolpw"
        )
        reply = await cmd.frame()
        assert isinstance(reply, wire.AuthResponse), reply
        data = await RawConn.open(broker.port)
        await data.send(wire.encode_hello(wire.Mode.DATA, reply.key))
        sub = await Conn.open(broker)
        await sub.send(Attach(b"app-t", 0))
        assert await sub.next() == Attached(b"app-t", 0)
        host, port = cmd.writer.get_extra_info("sockname")[:2]
        fhost, fport = sub.writer.get_extra_info("sockname")[:2]
        topics = broker.topics
        assert topics is not None
        app_t = topics.get(b"app-t")
        assert app_t is not None
        await wait_for(lambda: len(app_t.subscribers) == 1)
        try:
            yield broker, Seen(f"{host}:{port}", port, f"{fhost}:{fport}", str(tmp_path))
        finally:
            await sub.close()
            data.writer.close()
            cmd.writer.close()


async def documents(port: int, headers: dict[str, str]) -> dict[str, str]:
    out = {}
    for path in ("/stats.json", "/frontends.json", "/node.json", "/metrics"):
        status, _, body = await asyncio.to_thread(get, port, path, headers)
        assert status == 200, (path, body)
        out[path] = body.decode()
    return out


async def test_statistics_name_users_clients_and_files_only_to_a_user_or_the_admin_token(
    watched: tuple[Broker, Seen],
) -> None:
    broker, seen = watched
    for who in ("anonymous", "read token"):
        assert_nobody_named(await documents(broker.port, WHO[who]), seen)
    for who in ("carol", "root", "admin token"):
        assert_named(await documents(broker.port, WHO[who]), seen)


def assert_nobody_named(docs: dict[str, str], seen: Seen) -> None:
    for path, body in docs.items():
        for secret in ("carol", seen.fq_client, seen.figg_client, seen.data_dir):
            assert secret not in body, (path, secret)
    stats = json.loads(docs["/stats.json"])
    (client,) = stats["queues"]["app-x"]["clients"]
    # The same shape, as the web UI reads it: strings, counters kept.
    assert client["user"] == client["remote_addr"] == ""
    assert client["remote_port"] == "0"
    assert client["mode"] == "client" and "msgs_out" in client
    assert stats["topics"]["app-t"]["subscribers"][0]["remote"] == ""
    fronts = {f["name"]: f for f in json.loads(docs["/frontends.json"])["frontends"]}
    conns = fronts["fq-command"]["connections"]
    assert conns and all(c["remote_addr"] == "" and c["remote_port"] == 0 for c in conns)
    assert all(c["user"] == "" for c in conns)
    assert fronts["figg"]["connections"]
    node = json.loads(docs["/node.json"])
    assert node["queue_dir"] == node["config_db"] == ""
    assert node["queue_dir_files"] > 0
    # The disk alarm's file systems: their free space, not where they are.
    filesystems = node["disk_alarm"]["filesystems"]
    assert filesystems and all(fs["path"] == "" and fs["free_bytes"] > 0 for fs in filesystems)
    assert 'fq_disk_free_bytes{filesystem="0",path=""}' in docs["/metrics"]
    assert "fq_disk_alarm 0.0" in docs["/metrics"]
    assert "fq_client_series_enabled 0.0" in docs["/metrics"]
    assert "fq_queue_clients" in docs["/metrics"]


def assert_named(docs: dict[str, str], seen: Seen) -> None:
    stats = json.loads(docs["/stats.json"])
    (client,) = stats["queues"]["app-x"]["clients"]
    assert (client["user"], client["remote_port"]) == ("carol", str(seen.fq_port))
    assert stats["topics"]["app-t"]["subscribers"][0]["remote"] == seen.figg_client
    assert seen.figg_client in docs["/frontends.json"]
    fronts = {f["name"]: f for f in json.loads(docs["/frontends.json"])["frontends"]}
    assert {"carol"} <= {c["user"] for c in fronts["fq-command"]["connections"]}
    assert seen.fq_port in {c["remote_port"] for c in fronts["fq-command"]["connections"]}
    assert json.loads(docs["/node.json"])["queue_dir"].startswith(seen.data_dir)
    node = json.loads(docs["/node.json"])
    assert node["disk_alarm"]["filesystems"][0]["path"].startswith(seen.data_dir)
    assert f'fq_disk_free_bytes{{filesystem="0",path="{seen.data_dir}' in docs["/metrics"]
    assert 'user="carol"' in docs["/metrics"]
    assert seen.fq_client in docs["/metrics"]


async def test_wrong_credentials_on_statistics_are_refused_not_answered_plainer(
    watched: tuple[Broker, Seen],
) -> None:
    """Else the plainer document would tell a guesser that the password was wrong, at a
    pace no login throttle counts."""
    broker, _ = watched
    for headers in (WRONG_PASSWORD, {"Authorization": "Bearer nope"}):
        status, head, _ = await asyncio.to_thread(get, broker.port, "/stats.json", headers)
        assert status == 401
        assert "www-authenticate" in head
    assert broker.limits.refused["http_auth_failed"] == 2
    # They spend the address's password checks, as fq logins do: once spent, even the
    # right password is refused unchecked, before any document is made.
    while (await asyncio.to_thread(get, broker.port, "/stats.json", WRONG_PASSWORD))[0] == 401:
        pass
    status, head, body = await asyncio.to_thread(get, broker.port, "/stats.json", WHO["carol"])
    assert status == 429 and "retry-after" in head
    assert b"carol" not in body
