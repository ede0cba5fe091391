"""HTTP on the broker's port: the shared client and helpers other tests import (HttpConn,
get, stats, metrics, ...), keep-alive, the admin token, /shutdown, static files, and bad or
oversized requests. /stats.json, /submit and checkpoints have their own files beside this."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import h11
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fqbroker.protocols.fq import wire
from fqbroker.server.broker import Broker
from tests.conftest import TIMEOUT, RawConn, open_session
from tests.procs import Proc

# Good /submit headers, for test_submit.py and test_auth.py.
OK_HEADERS = [("X-Fq-Route", "r"), ("X-Fq-Exchange", "e")]


class HttpConn:
    """A keep-alive HTTP/1.1 client over one loopback connection, parsed by h11."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.conn = h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, port: int) -> HttpConn:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def request(
        self,
        method: str,
        target: str,
        headers: Sequence[tuple[str, str]] = (),
        body: bytes | None = None,
    ) -> tuple[h11.Response, bytes]:
        given = any(name.lower() == "host" for name, _ in headers)
        hdrs = [*([] if given else [("host", "localhost")]), *headers]
        if body is not None:
            hdrs.append(("content-length", str(len(body))))
        if self.conn.our_state is h11.DONE:
            self.conn.start_next_cycle()
        data = self.conn.send(h11.Request(method=method, target=target, headers=hdrs))
        if body:
            data += self.conn.send(h11.Data(data=body))
        data += self.conn.send(h11.EndOfMessage())
        self.writer.write(data)
        return await self.response()

    async def response(self) -> tuple[h11.Response, bytes]:
        response: h11.Response | None = None
        body = b""
        async with asyncio.timeout(TIMEOUT):
            while True:
                event = self.conn.next_event()
                if event is h11.NEED_DATA:
                    self.conn.receive_data(await self.reader.read(65536))
                elif isinstance(event, h11.Response):
                    response = event
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    assert response is not None
                    return response, body
                else:
                    raise AssertionError(f"unexpected {event!r}")

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


async def stats(broker: Broker) -> dict[str, Any]:
    """/stats.json, parsed."""
    response, body = await get(broker.port, "/stats.json")
    assert response.status_code == 200
    out: dict[str, Any] = json.loads(body)
    return out


async def metrics(broker: Broker) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """/metrics, parsed by prometheus_client: each series once, by name and labels."""
    response, body = await get(broker.port, "/metrics")
    assert response.status_code == 200
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in samples, f"duplicate series {key}"
            samples[key] = s.value
    return samples


def header(response: h11.Response, name: bytes) -> bytes | None:
    return dict(response.headers).get(name)


async def get(
    port: int,
    target: str,
    headers: Sequence[tuple[str, str]] = (),
    body: bytes | None = None,
) -> tuple[h11.Response, bytes]:
    conn = await HttpConn.open(port)
    try:
        return await conn.request("GET", target, headers, body)
    finally:
        await conn.close()


async def post(
    port: int,
    target: str,
    headers: Sequence[tuple[str, str]] = (),
    body: bytes | None = None,
) -> tuple[h11.Response, bytes]:
    """POST on a connection of its own: the checkpoint endpoints and /shutdown take no GET."""
    conn = await HttpConn.open(port)
    try:
        return await conn.request("POST", target, headers, body)
    finally:
        await conn.close()


async def raw_exchange(port: int, data: bytes, *, half_close: bool = False) -> bytes:
    """Send raw bytes, then read until the broker closes; what it sent back."""
    conn = await RawConn.open(port)
    await conn.send(data)
    if half_close:
        conn.writer.write_eof()
    return await conn.closed()


async def assert_still_serving(broker: Broker) -> None:
    response, body = await get(broker.port, "/stats.json")
    assert response.status_code == 200
    assert json.loads(body)["version"] == "0.13.12"
    consumer = await open_session(broker.port, b"probe-consumer")
    publisher = await open_session(broker.port, b"probe-publisher")
    try:
        assert await consumer.bind(b"probe", b"prefix:") != wire.BIND_ILLEGAL
        await publisher.publish(b"probe", b"r", b"still serving")
        (msg,) = await consumer.receive()
        assert msg.payload == b"still serving"
    finally:
        await consumer.close()
        await publisher.close()


# --- keep-alive ----------------------------------------------------------------------------


async def test_keep_alive_serves_several_requests(broker: Broker) -> None:
    consumer = await open_session(broker.port, b"ka")
    await consumer.bind(b"ka", b"prefix:")
    conn = await HttpConn.open(broker.port)
    submit = [("x-fq-route", "r"), ("x-fq-exchange", "ka")]
    for i in range(3):
        response, body = await conn.request("POST", "/submit", submit, body=b"m%d" % i)
        assert (response.status_code, body) == (
            200,
            b'{"routed":1,"dropped":0,"no_route":0,"no_exchange":0}\n',
        )
        response, body = await conn.request("GET", "/stats.json")
        assert json.loads(body)["exchanges"]["ka"]["messages"] == i + 1
    response, _ = await conn.request("GET", "/metrics")
    assert response.status_code == 200
    response, body = await conn.request("GET", "/no/such/file")
    assert response.status_code == 404 and body == b""
    response, _ = await conn.request("GET", "/")
    assert response.status_code == 200
    await conn.close()
    assert [m.payload for m in await consumer.receive(3)] == [b"m0", b"m1", b"m2"]
    await consumer.close()


async def test_pipelined_requests_get_every_reply(broker: Broker) -> None:
    conn = await RawConn.open(broker.port)
    one = b"GET /stats.json HTTP/1.1\r\nHost: x\r\n\r\n"
    last = b"GET /stats.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    await conn.send(one + one + last)
    data = await conn.closed()
    assert data.count(b"HTTP/1.1 200 OK\r\n") == 3


async def test_http10_gets_its_reply_then_a_close(broker: Broker) -> None:
    data = await raw_exchange(broker.port, b"GET /stats.json HTTP/1.0\r\n\r\n")
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert json.loads(body)["version"] == "0.13.12"


async def test_idle_connection_is_closed(broker: Broker) -> None:
    broker.settings.idle_sniff_timeout = 0.2
    conn = await HttpConn.open(broker.port)
    response, _ = await conn.request("GET", "/stats.json")
    assert response.status_code == 200
    async with asyncio.timeout(TIMEOUT):
        assert await conn.reader.read() == b""
    await conn.close()


# --- admin token ---------------------------------------------------------------------------


async def test_admin_token_protects_admin_endpoints_only(broker: Broker) -> None:
    broker.settings.admin_token = "s3cret"
    conn = await HttpConn.open(broker.port)
    for headers in ([], [("Authorization", "Bearer wrong")], [("X-Fq-Token", "s3cre")]):
        response, body = await conn.request("POST", "/submit", [*OK_HEADERS, *headers], b"x")
        assert response.status_code == 403 and json.loads(body) == {"error": "forbidden"}
        response, _ = await conn.request("POST", "/add_checkpoint?cpname=a&qname=b&chkptid=1:1")
        assert response.status_code == 403
    assert broker.router.aggregate.messages == 0
    for headers in ([("Authorization", "Bearer s3cret")], [("X-Fq-Token", "s3cret")]):
        response, body = await conn.request("POST", "/submit", [*OK_HEADERS, *headers], b"x")
        assert response.status_code == 200 and json.loads(body)["no_exchange"] == 1
    # Read-only endpoints stay open.
    for target in ("/stats.json", "/metrics", "/"):
        response, _ = await conn.request("GET", target)
        assert response.status_code == 200
    await conn.close()


# --- /shutdown -----------------------------------------------------------------------------


async def test_shutdown_is_404_unless_enabled(broker: Broker) -> None:
    response, body = await get(broker.port, "/shutdown")
    assert (response.status_code, body) == (404, b"")
    assert broker.port  # still listening
    await assert_still_serving(broker)


async def test_shutdown_when_enabled_needs_the_token(broker: Broker) -> None:
    broker.settings.http_shutdown = True
    broker.settings.admin_token = "t"
    requested = broker.shutdown_requested
    response, _ = await post(broker.port, "/shutdown")
    assert response.status_code == 403 and not requested.is_set()
    response, body = await post(broker.port, "/shutdown", headers=[("X-Fq-Token", "t")])
    assert response.status_code == 200
    assert json.loads(body)["status"] == "success"
    assert header(response, b"connection") == b"close"
    async with asyncio.timeout(TIMEOUT):
        await requested.wait()


async def test_shutdown_stops_the_fqd_process(tmp_path: Path, procs: list[Proc]) -> None:
    conf = tmp_path / "fqd.toml"
    conf.write_text('[fqd]\nhttp_shutdown = true\nadmin_token = "t"\n')
    fqd, port = await Proc.start_fqd(tmp_path, "--config", str(conf))
    procs.append(fqd)
    response, _ = await post(port, "/shutdown", headers=[("X-Fq-Token", "t")])
    assert response.status_code == 200
    async with asyncio.timeout(TIMEOUT):
        status, _, _ = await fqd.finish()
    assert status == 0


# --- static files --------------------------------------------------------------------------


async def test_packaged_web_ui_is_served(broker: Broker) -> None:
    conn = await HttpConn.open(broker.port)
    for target, mime in [
        ("/", b"text/html; charset=utf-8"),
        ("/index.html", b"text/html; charset=utf-8"),
        ("/js/fq.js", b"text/javascript; charset=utf-8"),
        ("/css/fq.css", b"text/css; charset=utf-8"),
    ]:
        response, body = await conn.request("GET", target)
        assert (response.status_code, header(response, b"content-type")) == (200, mime), target
        assert body
    _, index = await conn.request("GET", "/")
    # Nothing comes from elsewhere: no absolute URLs to load scripts or styles from.
    assert b"http://" not in index.replace(b"http://www.w3.org/2000/svg", b"")
    assert b"https://" not in index
    await conn.close()


@pytest.fixture
def web_root(tmp_path: Path, broker: Broker) -> Path:
    root = tmp_path / "web"
    (root / "sub").mkdir(parents=True)
    for name in ["a.js", "a.json", "a.css", "a.jpg", "a.jpeg", "a.gif", "a.png", "a.htm", "a.bin"]:
        (root / name).write_bytes(name.encode())
    (root / "index.html").write_bytes(b"<p>root</p>")
    (root / "sub" / "index.html").write_bytes(b"<p>sub</p>")
    (tmp_path / "secret.txt").write_bytes(b"secret")
    (root / "escape").symlink_to(tmp_path / "secret.txt")
    broker.settings.web_root = root
    return root


@pytest.mark.parametrize(
    ("name", "mime"),
    [
        ("a.js", "text/javascript; charset=utf-8"),
        ("a.json", "application/json"),
        ("a.css", "text/css; charset=utf-8"),
        ("a.jpg", "image/jpeg"),
        ("a.jpeg", "image/jpeg"),
        ("a.gif", "image/gif"),
        ("a.png", "image/png"),
        ("a.htm", "text/html; charset=utf-8"),
        ("a.bin", "application/octet-stream"),
    ],
)
async def test_static_mime_types(broker: Broker, web_root: Path, name: str, mime: str) -> None:
    response, body = await get(broker.port, "/" + name)
    assert response.status_code == 200
    assert header(response, b"content-type") == mime.encode()
    assert body == name.encode()


async def test_static_index_for_directories(broker: Broker, web_root: Path) -> None:
    assert (await get(broker.port, "/"))[1] == b"<p>root</p>"
    assert (await get(broker.port, "/sub/"))[1] == b"<p>sub</p>"
    assert (await get(broker.port, "/sub/?q=1"))[1] == b"<p>sub</p>"


@pytest.mark.parametrize(
    "target",
    [
        b"/../secret.txt",
        b"/../../../../etc/passwd",
        b"/%2e%2e/secret.txt",
        b"/..%2fsecret.txt",
        b"/sub/%2E%2E/%2E%2E/secret.txt",
        b"/escape",  # a symlink out of the root
        b"/%00index.html",
        b"/%ff",
        b"/nosuch.html",
        b"/sub",  # a directory, not a file
    ],
)
async def test_static_refuses_paths_outside_the_root(
    broker: Broker, web_root: Path, target: bytes
) -> None:
    data = await raw_exchange(
        broker.port, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert data.startswith(b"HTTP/1.1 404 Not Found\r\n")
    assert b"content-type: text/html\r\n" in data
    assert data.endswith(b"\r\n\r\n")  # empty body
    assert b"secret" not in data and b"root:" not in data
    await assert_still_serving(broker)


# --- bad and oversized requests ------------------------------------------------------------


async def test_oversized_headers_are_refused(broker: Broker) -> None:
    data = await raw_exchange(
        broker.port,
        b"GET /stats.json HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n",
    )
    assert data.startswith(b"HTTP/1.1 431 ")
    await assert_still_serving(broker)


async def test_oversized_body_elsewhere_is_refused(broker: Broker) -> None:
    data = await raw_exchange(
        broker.port,
        b"POST /stats.json HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n" + b"x" * 70000,
    )
    assert data.startswith(b"HTTP/1.1 413 ")
    await assert_still_serving(broker)


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n",
        b"GET /a b c\r\n\r\n",
        b"POST /submit HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"GET / HTTP/1.1\r\n\x00\x01\x02\r\n\r\n",
    ],
)
async def test_malformed_requests_get_400(broker: Broker, request_bytes: bytes) -> None:
    data = await raw_exchange(broker.port, request_bytes)
    assert data.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 500 ERROR"))
    await assert_still_serving(broker)


async def test_client_vanishing_mid_request_harms_nobody(broker: Broker) -> None:
    sock = socket.create_connection(("127.0.0.1", broker.port))
    sock.sendall(b"POST /submit HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()  # RST
    await assert_still_serving(broker)
