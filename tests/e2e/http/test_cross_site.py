"""What another web site's page could make a browser send, over real HTTP on loopback
(docs/security.md, "Cross-site requests and the admin API"): a form's text/plain body, a
foreign Origin, a DNS-rebound Host, a change by GET; and the headers on every reply.

tests/e2e/webui/test_cross_site.py does the same from a real page in Chromium.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlencode

import h11
import pytest
import trustme

from fqbroker.frontends.http.frontend import SERVICE_UNAVAILABLE
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from fqbroker.storage.configdb import checkpoints
from tests.conftest import open_session, root_and_bob, running, wait_for
from tests.e2e.http.test_auth import basic
from tests.e2e.http.test_http import OK_HEADERS, HttpConn, get, header, post
from tests.pki import make_pki

JSON = ("Content-Type", "application/json")
CREATE = b'{"name": "evil", "type": "disk", "permanent": true}'


def error_of(body: bytes) -> str:
    answer = json.loads(body)
    assert answer["status"] == "error", answer
    text: str = answer["error"]
    return text


def assert_secured(response: h11.Response) -> None:
    """The headers every reply carries, whatever it is."""
    assert header(response, b"x-frame-options") == b"DENY"
    assert header(response, b"x-content-type-options") == b"nosniff"
    csp = header(response, b"content-security-policy") or b""
    assert b"frame-ancestors 'none'" in csp and b"default-src 'self'" in csp
    assert b"form-action 'self'" in csp and b"base-uri 'none'" in csp


# --- Content-Type ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",  # what <form enctype="text/plain"> sends: the classic JSON forgery
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "",
        None,  # a body without a type (fetch with a Blob, no-cors)
    ],
)
async def test_a_change_with_a_body_not_json_is_refused(
    broker: Broker, content_type: str | None
) -> None:
    headers = [] if content_type is None else [("Content-Type", content_type)]
    response, body = await post(broker.port, "/admin/queues/create", headers, CREATE)
    assert response.status_code == 415, body
    assert "application/json" in error_of(body)
    assert b"evil" not in broker.queues
    # The same body as JSON is taken: the refusal was the type.
    response, body = await post(broker.port, "/admin/queues/create", [JSON], CREATE)
    assert response.status_code == 200, body
    assert b"evil" in broker.queues


async def test_a_form_posting_nothing_to_a_checkpoint_url_is_refused(broker: Broker) -> None:
    """A form with no fields, its action's query saying what to do, still sends a type."""
    target = "/remove_checkpoint?cpname=c&qname=q"
    response, body = await post(broker.port, target, [("Content-Type", "text/plain")], b"")
    assert response.status_code == 415, body
    response, body = await post(broker.port, target)  # curl -X POST: no type, no body
    assert response.status_code == 200
    assert json.loads(body)["message"] == "Cannot find registered queue 'q'"


async def test_submit_takes_raw_bytes_of_any_type(broker: Broker) -> None:
    """fq tools post the payload itself to /submit: its type is not looked at."""
    for content_type in ("text/plain", "application/octet-stream", "application/x-www-form"):
        headers = [*OK_HEADERS, ("Content-Type", content_type)]
        response, body = await post(broker.port, "/submit", headers, b"payload")
        assert response.status_code == 200, body


# --- Origin ---------------------------------------------------------------------------------


async def test_a_change_from_another_origin_is_refused(broker: Broker) -> None:
    port = broker.port
    foreign = [
        f"http://127.0.0.1:{port + 1}",  # another port of the same host: another origin
        f"http://localhost:{port}",  # another name for the same address
        "http://evil.example",
        "null",  # a sandboxed frame, a data: URL
        "",
    ]
    for origin in foreign:
        headers = [("Host", f"127.0.0.1:{port}"), ("Origin", origin), JSON]
        response, body = await post(port, "/admin/queues/create", headers, CREATE)
        assert response.status_code == 403, (origin, body)
        assert "may not change" in error_of(body)
        response, _ = await post(port, "/submit", [*headers, *OK_HEADERS], b"x")
        assert response.status_code == 403, origin
        response, _ = await post(port, "/remove_checkpoint?cpname=c&qname=q", headers[:2])
        assert response.status_code == 403, origin
    assert b"evil" not in broker.queues
    assert broker.router.aggregate.messages == 0
    assert broker.limits.refused["http_cross_site"] == 3 * len(foreign)
    # Reads from anywhere are still answered: a browser keeps their answers from the page.
    response, _ = await get(port, "/stats.json", [("Origin", "http://evil.example")])
    assert response.status_code == 200


async def test_sec_fetch_site_other_than_same_origin_is_refused(broker: Broker) -> None:
    for site in ("cross-site", "same-site"):
        headers = [("Sec-Fetch-Site", site), JSON]
        response, body = await post(broker.port, "/admin/queues/create", headers, CREATE)
        assert response.status_code == 403, body
    assert b"evil" not in broker.queues


async def test_the_broker_s_own_origin_may_change_state(broker: Broker) -> None:
    """What the web UI's fetch sends: the Origin it was loaded from, same-origin."""
    port = broker.port
    for n, (host, origin) in enumerate(
        [
            (f"127.0.0.1:{port}", f"http://127.0.0.1:{port}"),
            (f"localhost:{port}", f"http://LOCALHOST:{port}"),
            (f"[::1]:{port}", f"http://[::1]:{port}"),
            ("broker", "https://broker"),  # behind a proxy that ends TLS on 443
        ]
    ):
        headers = [("Host", host), ("Origin", origin), ("Sec-Fetch-Site", "same-origin"), JSON]
        body = json.dumps({"name": f"q{n}"}).encode()
        response, answer = await post(port, "/admin/queues/create", headers, body)
        assert response.status_code == 200, (host, answer)


# --- Host -----------------------------------------------------------------------------------


async def test_a_name_the_broker_does_not_answer_to_is_refused(broker: Broker) -> None:
    """DNS rebinding: a page on evil.example, the name then pointed at 127.0.0.1, reads
    with the browser's credentials unless the name is refused."""
    port = broker.port
    for host in (f"evil.example:{port}", "evil.example", "127.0.0.1.nip.io", "a@127.0.0.1"):
        for target in ("/stats.json", "/", "/admin/queues", "/queue/info?queue=q"):
            response, body = await get(port, target, [("Host", host)])
            assert response.status_code == 421, (host, target)
            assert_secured(response)
            assert "http_hosts" in error_of(body) or "not a host name" in error_of(body)
        response, _ = await post(port, "/admin/queues/create", [("Host", host), JSON], CREATE)
        assert response.status_code == 421
    assert b"evil" not in broker.queues
    # The names a broker answers to by default: addresses, dotless names, its host name.
    import socket

    for host in (f"127.0.0.1:{port}", f"[::1]:{port}", "localhost", "x", socket.gethostname()):
        response, _ = await get(port, "/stats.json", [("Host", host)])
        assert response.status_code == 200, host


async def test_http_hosts_names_more_or_any(settings: Settings) -> None:
    settings.http_hosts = ["Broker.Example.COM"]
    async with running(settings) as broker:
        response, _ = await get(broker.port, "/stats.json", [("Host", "broker.example.com.:1")])
        assert response.status_code == 200
        response, _ = await get(broker.port, "/stats.json", [("Host", "other.example.com")])
        assert response.status_code == 421
    settings.http_hosts = ["*"]
    async with running(settings) as broker:
        response, _ = await get(broker.port, "/stats.json", [("Host", "other.example.com")])
        assert response.status_code == 200


async def test_http_1_0_without_host_still_works(broker: Broker) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
    writer.write(b"GET /stats.json HTTP/1.0\r\n\r\n")
    answer = await reader.read()
    writer.close()
    assert answer.startswith(b"HTTP/1.1 200 ")


# --- no change by GET -----------------------------------------------------------------------


async def test_checkpoint_endpoints_change_nothing_on_get(broker: Broker) -> None:
    """An <img src> or a link to a checkpoint URL used to move, reset or delete it."""
    port = broker.port
    reader = await open_session(port, b"reader", b"cpq\x00disk:permanent,public")
    await reader.bind(b"cp", b"prefix:")
    publisher = await open_session(port, b"writer")
    for i in range(5):
        await publisher.publish(b"cp", b"r", b"m%d" % i)
    assert len(await reader.receive(5)) == 5
    store = broker.queues[b"cpq"].store  # type: ignore[attr-defined]
    await wait_for(lambda: store.durable_seq >= 5)
    response, body = await get(port, "/queue/info?queue=cpq")
    first = json.loads(body)["first"]
    at = checkpoints.format_position(first + 1)
    add = "/add_checkpoint?" + urlencode({"cpname": "mark", "qname": "cpq", "chkptid": at})
    gone = "/remove_checkpoint?cpname=kept&qname=cpq"
    reset = "/reset_to_checkpoint?cpname=kept&qname=cpq"
    kept = "/add_checkpoint?" + urlencode({"cpname": "kept", "qname": "cpq", "chkptid": at})
    response, body = await post(port, kept)
    assert json.loads(body)["status"] == "success", body

    for method in ("GET", "HEAD"):
        for target in (add, gone, reset):
            conn = await HttpConn.open(port)
            try:
                response, body = await conn.request(method, target)
            finally:
                await conn.close()
            assert response.status_code == 405, (method, target, body)
            assert header(response, b"allow") == b"POST"
    response, body = await get(port, "/queue/info?queue=cpq")
    marks = json.loads(body)["checkpoints"]
    assert marks.pop("fq") == first + 5  # the broker's own reader's
    assert marks == {"kept": first + 1}
    await publisher.publish(b"cp", b"r", b"after")
    # Not reset: the next message the reader gets is the new one, not m1 again.
    assert [m.payload for m in await reader.receive(1)] == [b"after"]
    await publisher.close()
    await reader.close()


async def test_shutdown_takes_post_only(broker: Broker) -> None:
    broker.settings.http_shutdown = True
    response, body = await get(broker.port, "/shutdown")
    assert response.status_code == 405, body
    assert header(response, b"allow") == b"POST"
    assert not broker.shutdown_requested.is_set()


async def test_admin_405_says_what_is_allowed(broker: Broker) -> None:
    response, _ = await get(broker.port, "/admin/queues/create")
    assert response.status_code == 405 and header(response, b"allow") == b"POST"
    response, _ = await post(broker.port, "/admin/queues", [JSON], b"{}")
    assert response.status_code == 405 and header(response, b"allow") == b"GET, HEAD"


# --- headers on every reply -----------------------------------------------------------------


async def test_every_reply_has_the_security_headers(settings: Settings) -> None:
    root_and_bob(settings)
    settings.http_auth_reads = True
    async with running(settings) as broker:
        port = broker.port
        root = [basic("root", "rootpw")]
        for target, status, kind in [
            ("/", 200, b"text/html"),  # a page
            ("/js/fq.js", 200, b"text/javascript"),
            ("/stats.json", 200, b"application/json"),  # JSON
            ("/admin/status", 200, b"application/json"),
            ("/nope", 404, b"text/html"),  # errors
            ("/queue/info?queue=nope", 404, b"application/json"),
        ]:
            response, _ = await get(port, target, root)
            assert response.status_code == status, target
            assert header(response, b"content-type").startswith(kind), target
            assert_secured(response)
        response, _ = await get(port, "/stats.json")  # 401
        assert response.status_code == 401
        assert_secured(response)
        response, _ = await post(port, "/admin/queues/create", [*root, JSON], b"{")  # 400
        assert response.status_code == 400
        assert_secured(response)
    # The answer of a listener that is full, written before any HTTP is parsed.
    head = SERVICE_UNAVAILABLE.partition(b"\r\n\r\n")[0].lower()
    assert b"\r\nx-frame-options: deny" in head
    assert b"\r\ncontent-security-policy: " in head
    assert b"\r\nx-content-type-options: nosniff" in head


async def test_over_tls_the_origin_must_be_https_and_any_name_is_taken(
    settings: Settings, tmp_path: Path
) -> None:
    """A page served over plain HTTP could be a network attacker's: on a TLS connection
    only the https origin of the same name and port may change state."""
    pki = make_pki(trustme.CA(), tmp_path)
    tls = replace(settings, tls_cert=pki["cert"], tls_key=pki["key"])
    async with running(tls) as broker:
        port = broker.port
        context = ssl.create_default_context(cafile=str(pki["ca"]))
        answers = []
        for n, scheme in enumerate(("http", "https")):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
            body = json.dumps({"name": f"q{n}"}).encode()
            writer.write(
                b"POST /admin/queues/create HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                b"Origin: %s://127.0.0.1:%d\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                % (port, scheme.encode(), port, len(body), body)
            )
            answers.append((await reader.read()).split(b" ", 2)[1])
            writer.close()
        assert answers == [b"403", b"200"]
        assert b"q0" not in broker.queues and b"q1" in broker.queues
        # Any name over TLS: a browser sends nothing to a name the certificate is not
        # for, so a rebound name never gets this far; a name it is for is the broker's.
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
        writer.write(b"GET /stats.json HTTP/1.1\r\nHost: broker.example.com\r\n\r\n")
        assert (await reader.readline()).startswith(b"HTTP/1.1 200 ")
        writer.close()
        # The same name over plain HTTP is refused.
        response, _ = await get(port, "/stats.json", [("Host", "broker.example.com")])
        assert response.status_code == 421
