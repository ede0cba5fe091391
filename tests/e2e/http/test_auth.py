"""HTTP authentication (docs/security.md): the admin token, the read token, users over Basic.

Real brokers on loopback, real requests; the users are real rows in the config database,
made with fqbroker.storage.configdb.users as fq-admin makes them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import h11
import pytest

from fqbroker.frontends.http import auth
from fqbroker.protocols.fq import wire
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import RawConn, Session, authenticate, root_and_bob, running
from tests.e2e.http.test_http import (
    OK_HEADERS,
    HttpConn,
    assert_still_serving,
    get,
    header,
    post,
)
from tests.e2e.webui.test_webui import Chromium, Page, require_chromium
from tests.procs import Proc

ADMIN_TARGETS = [
    ("POST", "/submit"),
    ("POST", "/add_checkpoint?cpname=c&qname=q&chkptid=1:1"),
    ("POST", "/remove_checkpoint?cpname=c&qname=q"),
    ("POST", "/reset_to_checkpoint?cpname=c&qname=q"),
]
READ_TARGETS = [
    "/stats.json",
    "/frontends.json",
    "/metrics",
    "/queue/info?queue=q",
    "/topic/info?topic=t",
    "/",
    "/index.html",
]


def basic(user: str, password: str) -> tuple[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return ("Authorization", f"Basic {token}")


def bearer(token: str) -> tuple[str, str]:
    return ("Authorization", f"Bearer {token}")


def challenges(response: h11.Response) -> list[bytes]:
    return [v for k, v in response.headers if k == b"www-authenticate"]


async def admin_request(
    conn: HttpConn, method: str, target: str, headers: list[tuple[str, str]]
) -> tuple[h11.Response, bytes]:
    if target == "/submit":
        return await conn.request(method, target, [*OK_HEADERS, *headers], b"x")
    return await conn.request(method, target, headers)


def assert_refused(response: h11.Response, body: bytes, status: int) -> None:
    assert response.status_code == status, body
    assert header(response, b"content-type") == b"application/json"
    expected = "forbidden" if status == 403 else "authentication required"
    assert json.loads(body) == {"error": expected}
    if status == 401:
        assert challenges(response)
    else:
        assert not challenges(response)


# --- the header parsing, alone ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, auth.Credentials()),
        ({b"x-fq-token": b" t "}, auth.Credentials(token=b"t")),
        ({b"authorization": b"Bearer abc"}, auth.Credentials(token=b"abc")),
        ({b"authorization": b"bearer  abc "}, auth.Credentials(token=b"abc")),
        (
            {b"authorization": b"Basic " + base64.b64encode(b"al:p:w")},
            auth.Credentials(user="al", password=b"p:w"),
        ),
        (
            {b"authorization": b"Basic " + base64.b64encode("\u00e9:".encode())},
            auth.Credentials(user="\u00e9", password=b""),
        ),
        ({b"authorization": b"Basic !!!"}, auth.Credentials(malformed=True)),
        (
            {b"authorization": b"Basic " + base64.b64encode(b"nocolon")},
            auth.Credentials(malformed=True),
        ),
        (
            {b"authorization": b"Basic " + base64.b64encode(b":pw")},
            auth.Credentials(malformed=True),
        ),
        (
            {b"authorization": b"Basic " + base64.b64encode(b"\xff:pw")},
            auth.Credentials(malformed=True),
        ),
        ({b"authorization": b"Bearer"}, auth.Credentials(malformed=True)),
        ({b"authorization": b"Digest x=y"}, auth.Credentials(malformed=True)),
    ],
)
def test_credentials_from_headers(headers: dict[bytes, bytes], expected: auth.Credentials) -> None:
    assert auth.credentials(headers) == expected


def test_what_each_setting_protects() -> None:
    plain = Settings()
    assert auth.needs(plain, None, admin_path=True) is auth.Level.OPEN
    assert auth.needs(plain, None, admin_path=False) is auth.Level.OPEN
    token = Settings(admin_token="t")
    assert auth.needs(token, None, admin_path=True) is auth.Level.ADMIN
    assert auth.needs(token, None, admin_path=False) is auth.Level.OPEN
    reads = Settings(http_auth_reads=True, read_token="r")
    assert auth.needs(reads, None, admin_path=True) is auth.Level.ADMIN
    assert auth.needs(reads, None, admin_path=False) is auth.Level.READ


# --- the admin token (auth = "none") ---------------------------------------------------------


@pytest.mark.parametrize(("method", "target"), ADMIN_TARGETS)
async def test_admin_token_alone_403_without_or_with_a_wrong_one(
    broker: Broker, method: str, target: str
) -> None:
    """Under auth = "none" with only the admin token set, the answer is the 403 it was
    before users existed: scripts written against it keep working (docs/http.md)."""
    broker.settings.admin_token = "s3cret"
    conn = await HttpConn.open(broker.port)
    for headers in ([], [bearer("wrong")], [("X-Fq-Token", "s3cre")], [basic("a", "s3cret")]):
        response, body = await admin_request(conn, method, target, headers)
        assert_refused(response, body, 403)
    assert broker.router.aggregate.messages == 0
    response, body = await admin_request(conn, method, target, [bearer("s3cret")])
    assert response.status_code == 200
    await conn.close()


async def test_the_read_token_is_not_an_admin_token(broker: Broker) -> None:
    broker.settings.admin_token = "admin"
    broker.settings.read_token = "reader"
    response, body = await post(broker.port, "/add_checkpoint?cpname=c&qname=q", [bearer("reader")])
    assert_refused(response, body, 403)
    # Without http_auth_reads the reads stay open, with or without a token.
    for target in READ_TARGETS:
        response, _ = await get(broker.port, target)
        assert response.status_code in (200, 404), target  # no queue q, no topics: 404


async def test_shutdown_refused_then_done_with_the_token(settings: Settings) -> None:
    settings.http_shutdown = True
    settings.admin_token = "t"
    async with running(settings) as broker:
        response, body = await post(broker.port, "/shutdown")
        assert_refused(response, body, 403)
        response, body = await post(broker.port, "/shutdown", [bearer("nope")])
        assert_refused(response, body, 403)
        assert not broker.shutdown_requested.is_set()
        response, _ = await post(broker.port, "/shutdown", [bearer("t")])
        assert response.status_code == 200
        assert broker.shutdown_requested.is_set()


async def test_disabled_shutdown_stays_404_without_credentials(broker: Broker) -> None:
    broker.settings.admin_token = "t"
    response, _ = await get(broker.port, "/shutdown")
    assert response.status_code == 404


# --- protected reads ----------------------------------------------------------------------------


async def test_reads_need_the_read_token_when_set(broker: Broker) -> None:
    broker.settings.http_auth_reads = True
    broker.settings.read_token = "scrape"
    broker.settings.admin_token = "admin"
    conn = await HttpConn.open(broker.port)
    # Wrong credentials are answered later each time (a guesser's pace): a few suffice.
    for target, headers in (("/metrics", [bearer("wrong")]), ("/", [("Authorization", "Basic ?")])):
        response, body = await conn.request("GET", target, headers)
        assert_refused(response, body, 401)
    for target in READ_TARGETS:
        response, body = await conn.request("GET", target)
        assert_refused(response, body, 401)
        # Prometheus' authorization setting sends "Authorization: Bearer <credentials>".
        for headers in ([bearer("scrape")], [("X-Fq-Token", "scrape")], [bearer("admin")]):
            response, body = await conn.request("GET", target, headers)
            assert response.status_code in (200, 404), (target, body)
            assert response.status_code == 200 or target.startswith(("/queue", "/topic"))
    response, body = await conn.request(
        "GET", "/metrics", [bearer("scrape"), ("Accept", "text/plain")]
    )
    assert response.status_code == 200 and b"fq_messages" in body
    assert b'fq_refused_total{reason="http_auth_failed"} 2.0' in body
    # Every other path is behind the same door, even one that would be a 404.
    response, body = await conn.request("GET", "/no/such/file")
    assert_refused(response, body, 401)
    await conn.close()
    assert broker.limits.refused["http_auth_failed"] == 2
    broker.settings.http_auth_reads = False  # what assert_still_serving reads
    await assert_still_serving(broker)


async def test_submit_with_reads_protected_needs_the_admin_token(broker: Broker) -> None:
    broker.settings.http_auth_reads = True
    broker.settings.read_token = "scrape"
    conn = await HttpConn.open(broker.port)
    response, body = await admin_request(conn, "POST", "/submit", [])
    assert_refused(response, body, 401)
    response, body = await admin_request(conn, "POST", "/submit", [bearer("scrape")])
    assert_refused(response, body, 403)
    assert broker.router.aggregate.messages == 0
    await conn.close()


async def test_protected_reads_from_the_toml_file(tmp_path: Path, procs: list[Proc]) -> None:
    """The settings as an operator writes them, in a real fqd process."""
    conf = tmp_path / "fqd.toml"
    conf.write_text('[fqd]\nhttp_auth_reads = true\nread_token = "prom"\nadmin_token = "adm"\n')
    fqd, port = await Proc.start_fqd(tmp_path, "--config", str(conf))
    procs.append(fqd)
    response, body = await get(port, "/metrics")
    assert_refused(response, body, 401)
    response, _ = await get(port, "/metrics", [bearer("prom")])
    assert response.status_code == 200
    response, body = await post(port, "/add_checkpoint?cpname=c&qname=q", [bearer("prom")])
    assert_refused(response, body, 403)


# --- users (auth = "password") --------------------------------------------------------------


async def session_with_password(port: int, user: bytes, password: bytes) -> Session:
    cmd = await authenticate(port, user, b"q\x00mem:public", password)
    reply = await cmd.frame()
    assert isinstance(reply, wire.AuthResponse), reply
    assert await cmd.frame() == wire.Heartbeat()
    data = await RawConn.open(port)
    await data.send(wire.encode_hello(wire.Mode.DATA, reply.key))
    return Session(cmd, data, reply.key)


@pytest.fixture
async def with_users(settings: Settings) -> AsyncIterator[Broker]:
    async with running(root_and_bob(settings)) as broker:
        assert broker.users is not None
        yield broker


@pytest.mark.parametrize(("method", "target"), ADMIN_TARGETS)
async def test_admin_endpoints_with_users(with_users: Broker, method: str, target: str) -> None:
    broker = with_users
    conn = await HttpConn.open(broker.port)
    for headers in ([], [basic("root", "wrong")], [basic("nobody", "rootpw")], [bearer("x")]):
        response, body = await admin_request(conn, method, target, headers)
        assert_refused(response, body, 401)
        assert b'Basic realm="fqbroker", charset="UTF-8"' in challenges(response)
    response, body = await admin_request(conn, method, target, [basic("bob", "bobpw")])
    assert_refused(response, body, 403)
    assert broker.router.aggregate.messages == 0
    response, body = await admin_request(conn, method, target, [basic("root", "rootpw")])
    assert response.status_code == 200, body
    await conn.close()
    assert broker.limits.refused["http_auth_failed"] >= 3
    assert broker.limits.refused["http_forbidden"] >= 1


async def test_submit_by_an_admin_user_is_delivered(with_users: Broker) -> None:
    broker = with_users
    from fqbroker.storage.configdb.users import Users

    Users(broker.settings.config_db).add("reader", "readerpw")
    Users(broker.settings.config_db).allow("reader", "admin", "*")
    reader = await session_with_password(broker.port, b"reader", b"readerpw")
    await reader.bind(b"e", b"prefix:")
    response, body = await get(
        broker.port, "/submit", [*OK_HEADERS, basic("root", "rootpw")], b"hello"
    )
    assert response.status_code == 200 and json.loads(body)["routed"] == 1
    assert [m.payload for m in await reader.receive(1)] == [b"hello"]
    await reader.close()


async def test_admin_token_still_works_beside_users(settings: Settings) -> None:
    from fqbroker.storage.configdb.users import Users

    Users(settings.config_db).add("bob", "bobpw")
    settings.auth = "password"
    settings.admin_token = "tok"
    async with running(settings) as broker:
        response, body = await post(broker.port, "/add_checkpoint?cpname=c&qname=q")
        assert_refused(response, body, 401)
        assert len(challenges(response)) == 2  # Basic and Bearer both accepted
        response, _ = await post(broker.port, "/add_checkpoint?cpname=c&qname=q", [bearer("tok")])
        assert response.status_code == 200


async def test_reads_with_users_need_any_user(with_users: Broker) -> None:
    broker = with_users
    broker.settings.http_auth_reads = True
    conn = await HttpConn.open(broker.port)
    response, body = await conn.request("GET", "/stats.json", [basic("bob", "nope")])
    assert_refused(response, body, 401)
    for target in READ_TARGETS:
        response, body = await conn.request("GET", target)
        assert_refused(response, body, 401)
        for user, password in (("bob", "bobpw"), ("root", "rootpw")):
            response, body = await conn.request("GET", target, [basic(user, password)])
            if user == "bob" and target.startswith(("/queue/", "/topic/")):
                # Contents need the right on the name, which bob lacks (test_read_rights.py).
                assert_refused(response, body, 403)
            else:
                assert response.status_code in (200, 404), (target, body)
    await conn.close()


async def test_a_removed_user_is_refused_without_a_restart(with_users: Broker) -> None:
    from fqbroker.storage.configdb.users import Users

    broker = with_users
    path = "/add_checkpoint?cpname=c&qname=q"
    response, _ = await post(broker.port, path, [basic("root", "rootpw")])
    assert response.status_code == 200
    Users(broker.settings.config_db).remove("root")
    response, body = await post(broker.port, path, [basic("root", "rootpw")])
    assert_refused(response, body, 401)


# --- the web UI behind a login, in a real browser ----------------------------------------------


async def answer_the_browser(
    page: Page, user: str, password: str, challenges: list[Any], stop: asyncio.Event
) -> None:
    """Let every request of the page through, and answer each login prompt (a 401 with
    a challenge the browser understood) with ``user`` and ``password``, until ``stop``.

    Stopped between calls, never cancelled in one: a reply to a cancelled call would
    hit the DevTools client's pump."""
    browser, seen = page.browser, 0
    while not stop.is_set():
        while seen < len(browser.events):
            event = browser.events[seen]
            seen += 1
            if event.get("sessionId") != page.session:
                continue
            params = event.get("params", {})
            # A request the page gave up meanwhile is an error reply: not ours to mind.
            with contextlib.suppress(RuntimeError):
                if event.get("method") == "Fetch.requestPaused":
                    await page.call("Fetch.continueRequest", {"requestId": params["requestId"]})
                elif event.get("method") == "Fetch.authRequired":
                    challenges.append(params["authChallenge"])
                    answer = {
                        "response": "ProvideCredentials",
                        "username": user,
                        "password": password,
                    }
                    await page.call(
                        "Fetch.continueWithAuth",
                        {"requestId": params["requestId"], "authChallengeResponse": answer},
                    )
        await browser.event_arrived.wait()


async def test_web_ui_behind_a_login(with_users: Broker, tmp_path: Path) -> None:
    """The browser is challenged (Basic, realm fqbroker), logs in as a plain user, and the
    UI's own polls of stats.json then go through with the login it keeps."""
    chromium = require_chromium()
    broker = with_users
    broker.settings.http_auth_reads = True
    browser = await Chromium.launch(chromium, tmp_path / "profile", tmp_path / "chromium.log")
    answering: asyncio.Task[None] | None = None
    stop = asyncio.Event()
    try:
        async with asyncio.timeout(60):
            target = await browser.send("Target.createTarget", {"url": "about:blank"})
            attached = await browser.send(
                "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
            )
            page = Page(browser, attached["sessionId"])
            await page.call("Runtime.enable")
            await page.call("Network.enable")
            await page.call("Fetch.enable", {"handleAuthRequests": True})
            challenges: list[Any] = []
            answering = asyncio.create_task(
                answer_the_browser(page, "bob", "bobpw", challenges, stop)
            )
            await page.call("Page.navigate", {"url": f"http://127.0.0.1:{broker.port}/"})
            await page.wait_for(
                "document.getElementById('status') && "
                "document.getElementById('status').dataset.state === 'live'"
            )
            await page.rendered_polls(2)
            assert await page.evaluate("document.getElementById('status').dataset.state") == "live"
        assert challenges and challenges[0]["scheme"].lower() == "basic"
        assert challenges[0]["realm"] == "fqbroker"
        assert broker.limits.refused["http_auth_failed"] == 0
    finally:
        stop.set()
        browser.event_arrived.set()  # wakes the answering task if it waits for an event
        if answering is not None:
            async with asyncio.timeout(20):
                await answering
        await browser.close()


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"http_auth_reads": True}, "http_auth_reads needs read_token"),
        ({"http_auth_reads": "yes", "read_token": "r"}, "http_auth_reads must be true or false"),
        ({"read_token": 5}, "read_token must be a string"),
    ],
)
def test_settings_that_cannot_work_are_refused(values: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        Settings().updated(values)


def test_settings_that_work() -> None:
    for values in (
        {"http_auth_reads": True, "read_token": "r"},
        {"http_auth_reads": True, "admin_token": "a"},
        {"http_auth_reads": True, "auth": "password"},
    ):
        assert Settings().updated(values).http_auth_reads


async def fq_admin(state: Path, procs: list[Proc], *args: str, stdin: bytes = b"") -> None:
    admin = await Proc.start(
        "-m", "fqbroker.cli.admin", "-c", str(state / "fqd.sqlite"), "user", *args,
        stdin=asyncio.subprocess.PIPE,
    )  # fmt: skip
    procs.append(admin)
    status, _, err = await admin.finish(stdin)
    assert status == 0, err


async def test_an_operator_makes_an_admin_with_fq_admin(tmp_path: Path, procs: list[Proc]) -> None:
    """fq-admin and fqd as processes on one config database, as an operator runs them: a
    user made an admin while the broker runs may use the admin endpoints at once."""
    async with asyncio.timeout(60):
        await fq_admin(tmp_path, procs, "add", "ops", "--password-stdin", stdin=b"opspw\n")
        fqd, port = await Proc.start_fqd(tmp_path, "--auth", "password")
        procs.append(fqd)
        path = "/add_checkpoint?cpname=c&qname=q"
        response, body = await post(port, path)
        assert_refused(response, body, 401)
        response, body = await post(port, path, [basic("ops", "opspw")])
        assert_refused(response, body, 403)
        await fq_admin(tmp_path, procs, "allow", "ops", "admin", "*")
        response, body = await post(port, path, [basic("ops", "opspw")])
        assert response.status_code == 200, body
        assert json.loads(body)["message"] == "Cannot find registered queue 'q'"
        response, _ = await get(port, "/stats.json")  # reads stay open by default
        assert response.status_code == 200
