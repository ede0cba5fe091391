"""HTTP on the broker's port: /stats.json, /submit, checkpoints, /shutdown, static files."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import h11
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fqbroker.clients.fq.client import Client
from fqbroker.core.message import hop_addresses
from fqbroker.protocols.fq import wire
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from fqbroker.storage.configdb import checkpoints
from fqbroker.storage.segments import log as segmentlog
from tests.conftest import (
    TIMEOUT,
    FailingFsync,
    RawConn,
    Session,
    authenticate,
    open_session,
    wait_for,
)
from tests.procs import Proc
from tests.vectors import STATUS_KEYS

NODE = "10.254.254.1"


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
        hdrs = [("host", "localhost"), *headers]
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


# --- /stats.json ---------------------------------------------------------------------------

EXCHANGE = 'ex "quoted" ä→'.encode()
QUEUE = 'q "x" ü'.encode()
# A client in /stats.json: who it is, then its status counters but the queue's dropped_in.
CLIENT_KEYS = ["user", "remote_addr", "remote_port", "mode", *STATUS_KEYS[1:]]


async def traffic(broker: Broker) -> tuple[Session, Session]:
    """3 routed, 1 without route, 1 to no exchange, all received; returns (consumer, publisher)."""
    consumer = await open_session(broker.port, b'reader "r"', QUEUE + b"\x00mem:public")
    publisher = await open_session(broker.port, "writer é".encode())
    route_id = await consumer.bind(EXCHANGE, b'prefix:"a." route_contains(".")')
    assert route_id != wire.BIND_ILLEGAL
    for i in range(3):
        await publisher.publish(EXCHANGE, f"a.{i}".encode(), b"0123456789")
    await publisher.publish(EXCHANGE, b"b.1", b"0123456789")
    await publisher.publish(b"nope", b"a.1", b"0123456789")
    assert len(await consumer.receive(3)) == 3
    await wait_for(lambda: broker.router.aggregate.messages == 5)
    return consumer, publisher


async def test_stats_json_has_fqds_shape_after_traffic(broker: Broker) -> None:
    consumer, publisher = await traffic(broker)
    silent = await authenticate(broker.port, b"no-data", b"silent")  # no data channel
    await silent.reply()
    response, body = await get(broker.port, "/stats.json")
    assert response.status_code == 200
    assert header(response, b"content-type") == b"application/json"
    # Quotes are escaped, non-ASCII is sent as UTF-8 (fqd writes names raw).
    assert b'ex \\"quoted\\" \xc3\xa4\xe2\x86\x92' in body
    stats = json.loads(body)

    assert list(stats) == ["version", "exchanges", "queues"]
    assert stats["version"] == "0.13.12"
    exchanges = stats["exchanges"]
    assert list(exchanges) == [EXCHANGE.decode(), "_aggregate"]  # _aggregate last
    ex = exchanges[EXCHANGE.decode()]
    assert list(ex) == ["messages", "octets", "no_route", "routed", "dropped", "routes"]
    assert {k: v for k, v in ex.items() if k != "routes"} == {
        "messages": 4,
        "octets": 40,
        "no_route": 1,
        "routed": 3,
        "dropped": 0,
    }
    (route,) = ex["routes"].values()
    assert list(route) == [
        "route_id",
        "prefix",
        "queue",
        "permanent",
        "invocations",
        "avg_ns",
        "program",
    ]
    assert route["route_id"] == 1 and list(ex["routes"]) == ["1"]
    assert route["prefix"] == "a."
    assert route["queue"] == QUEUE.decode()
    assert route["permanent"] is False
    assert route["invocations"] == 3
    assert isinstance(route["avg_ns"], int)
    assert route["program"] == 'prefix:"a." route_contains(".")'
    assert exchanges["_aggregate"] == {
        "no_exchange": 1,
        "messages": 5,
        "octets": 50,
        "no_route": 2,
        "routed": 3,
        "dropped": 0,
        "size_dropped": 0,
    }
    assert list(exchanges["_aggregate"]) == [
        "no_exchange",
        "messages",
        "octets",
        "no_route",
        "routed",
        "dropped",
        "size_dropped",
    ]

    queue = stats["queues"][QUEUE.decode()]
    assert list(queue) == [
        "private",
        "type",
        "policy",
        "backlog_limit",
        "backlog",
        "dropped_to",
        "clients",
    ]
    assert queue["private"] is False and queue["type"] == "mem" and queue["policy"] == "drop"
    assert queue["backlog_limit"] == 16384 and queue["backlog"] == 0 and queue["dropped_to"] == 0
    (client,) = queue["clients"]
    assert list(client) == CLIENT_KEYS
    session = broker.clients[consumer.key]
    assert client["user"] == 'reader "r"'
    assert client["remote_addr"] == "127.0.0.1"
    assert client["remote_port"] == str(session.remote_port)
    assert client["mode"] == "client"
    # Every counter is a string, as fqd prints them.
    assert all(isinstance(client[k], str) for k in CLIENT_KEYS[4:])
    assert client["msgs_out"] == "3" and client["msgs_in"] == "0"

    (pub,) = [c for q in stats["queues"].values() for c in q["clients"] if c["user"] == "writer é"]
    assert (pub["msgs_in"], pub["routed"], pub["no_route"], pub["no_exchange"]) == (
        "5",
        "3",
        "2",
        "1",
    )
    assert pub["octets_in"] == str(broker.clients[publisher.key].stats.octets_in)
    # Without a data channel, fqd shows neither "mode" nor the counters.
    assert list(stats["queues"]["silent"]["clients"][0]) == ["user", "remote_addr", "remote_port"]
    await silent.close()
    await consumer.close()
    await publisher.close()


async def test_stats_json_without_exchanges_still_has_aggregate(broker: Broker) -> None:
    _, body = await get(broker.port, "/stats.json")
    stats = json.loads(body)
    assert stats["exchanges"] == {
        "_aggregate": {
            "no_exchange": 0,
            "messages": 0,
            "octets": 0,
            "no_route": 0,
            "routed": 0,
            "dropped": 0,
            "size_dropped": 0,
        }
    }
    assert stats["queues"] == {}


async def test_stats_json_names_that_are_not_utf8(broker: Broker) -> None:
    consumer = await open_session(broker.port, b"u\xff", b"q\xfe")
    await consumer.bind(b"ex\xff", b"prefix:")
    _, body = await get(broker.port, "/stats.json")
    stats = json.loads(body)  # still valid JSON
    assert "ex\ufffd" in stats["exchanges"]
    assert stats["queues"]["q\ufffd"]["clients"][0]["user"] == "u\ufffd"
    await consumer.close()


async def test_head_and_any_method(broker: Broker) -> None:
    conn = await HttpConn.open(broker.port)
    response, body = await conn.request("HEAD", "/stats.json")
    assert response.status_code == 200 and body == b""
    assert int(header(response, b"content-length") or 0) > 0
    # fqd never checks the method.
    response, body = await conn.request("PUT", "/stats.json?x=1", body=b"ignored")
    assert response.status_code == 200 and json.loads(body)["version"] == "0.13.12"
    await conn.close()


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


# --- /submit -------------------------------------------------------------------------------


async def test_submit_delivers_with_id_sender_and_one_hop(broker: Broker) -> None:
    consumer = await open_session(broker.port, b"sub")
    await consumer.bind(b"test", b"prefix:")
    response, body = await get(
        broker.port,
        "/submit",
        headers=[("X-Fq-Route", "bla"), ("X-Fq-Exchange", "test"), ("X-Fq-Sender", "me")],
        body=b"TEST",
    )
    assert response.status_code == 200
    assert header(response, b"content-type") == b"application/json"
    assert body == b'{"routed":1,"dropped":0,"no_route":0,"no_exchange":0}\n'
    (msg,) = await consumer.receive()
    assert (msg.exchange, msg.route, msg.payload, msg.sender) == (b"test", b"bla", b"TEST", b"me")
    assert msg.msgid == bytes.fromhex("01000000" + "00" * 12)
    # One hop, our node id, where fqd sends none (the npm client needs at least one).
    assert hop_addresses(msg.hops) == [NODE]
    # Counted in the totals, against no client.
    assert broker.router.aggregate.messages == 1
    assert all(s.stats.msgs_in == 0 for s in broker.clients.values())
    await consumer.close()


async def test_submit_fails_when_the_fsync_fails(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a 200, which is as good as a confirm, and not a reply that never comes."""
    async with Client(port=broker.port, source="c/dq/disk:permanent,fsync=always") as consumer:
        await consumer.bind(b"test", b"prefix:")
        monkeypatch.setattr(segmentlog, "os", FailingFsync())
        headers = [("X-Fq-Route", "r"), ("X-Fq-Exchange", "test")]
        async with asyncio.timeout(TIMEOUT):
            response, body = await get(broker.port, "/submit", headers, b"unsure")
        assert (response.status_code, body) == (500, b'{ "error": "disk queue write failed" }\n')


async def test_submit_to_a_disk_queue_survives_kill_9(tmp_path: Path, procs: list[Proc]) -> None:
    """A 200 from /submit means written and durable: no consumer needs to flush it first."""
    fqd, port = await Proc.start_fqd(tmp_path)
    procs.append(fqd)
    source = "keeper/kept/disk:permanent,backlog=-1"
    async with Client(port=port, source=source) as setup:
        await setup.bind(b"durable", b"prefix:", wire.BindFlags.PERM)
    headers = [("X-Fq-Route", "r"), ("X-Fq-Exchange", "durable")]
    for i in range(3):
        _, body = await get(port, "/submit", headers, b"kept %d" % i)
        assert json.loads(body)["routed"] == 1
    fqd.kill()
    await fqd.proc.wait()
    fqd, port = await Proc.start_fqd(tmp_path)
    procs.append(fqd)
    async with Client(port=port, source=source) as consumer, asyncio.timeout(TIMEOUT):
        got = [(await consumer.receive()).payload for _ in range(3)]
    assert got == [b"kept 0", b"kept 1", b"kept 2"]


async def test_submit_default_sender_and_misses(broker: Broker) -> None:
    consumer = await open_session(broker.port, b"sub")
    await consumer.bind(b"test", b'exact:"only"')
    conn = await HttpConn.open(broker.port)
    _, body = await conn.request(
        "POST", "/submit", [("X-Fq-Route", "only"), ("X-Fq-Exchange", "test")], b"x"
    )
    assert json.loads(body) == {"routed": 1, "dropped": 0, "no_route": 0, "no_exchange": 0}
    (msg,) = await consumer.receive()
    assert msg.sender == b"_web"
    _, body = await conn.request(
        "POST", "/submit", [("X-Fq-Route", "other"), ("X-Fq-Exchange", "test")], b"x"
    )
    assert json.loads(body) == {"routed": 0, "dropped": 0, "no_route": 1, "no_exchange": 0}
    _, body = await conn.request(
        "POST", "/submit", [("X-Fq-Route", "only"), ("X-Fq-Exchange", "none")], b"x"
    )
    assert json.loads(body) == {"routed": 0, "dropped": 0, "no_route": 1, "no_exchange": 1}
    await conn.close()
    await consumer.close()


LONG = "x" * 128
OK_HEADERS = [("X-Fq-Route", "r"), ("X-Fq-Exchange", "e")]


@pytest.mark.parametrize(
    ("headers", "text"),
    [
        ([("X-Fq-Sender", LONG), *OK_HEADERS], "sender too long"),
        ([("X-Fq-Exchange", "e")], "missing route"),
        ([("X-Fq-Route", LONG), ("X-Fq-Exchange", "e")], "route too long"),
        ([("X-Fq-Route", "r")], "missing exchange"),
        ([("X-Fq-Route", "r"), ("X-Fq-Exchange", LONG)], "exchange too long"),
    ],
)
async def test_submit_header_errors_keep_the_connection(
    broker: Broker, headers: list[tuple[str, str]], text: str
) -> None:
    conn = await HttpConn.open(broker.port)
    response, body = await conn.request("POST", "/submit", headers, b"payload")
    assert (response.status_code, response.reason) == (500, b"ERROR")
    assert header(response, b"content-type") == b"application/json"
    assert body == b'{ "error": "%s" }\n' % text.encode()
    # The connection goes on.
    response, _ = await conn.request("GET", "/stats.json")
    assert response.status_code == 200
    await conn.close()
    assert broker.router.aggregate.messages == 0


@pytest.mark.parametrize(
    "request_bytes",
    [
        # No Content-Length at all.
        b"POST /submit HTTP/1.1\r\nHost: x\r\nX-Fq-Route: r\r\nX-Fq-Exchange: e\r\n\r\n",
        # An empty body.
        b"POST /submit HTTP/1.1\r\nHost: x\r\nX-Fq-Route: r\r\nX-Fq-Exchange: e\r\n"
        b"Content-Length: 0\r\n\r\n",
        # Chunked: fqd wants the length up front.
        b"POST /submit HTTP/1.1\r\nHost: x\r\nX-Fq-Route: r\r\nX-Fq-Exchange: e\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n4\r\nTEST\r\n0\r\n\r\n",
    ],
    ids=["no-length", "empty", "chunked"],
)
async def test_submit_no_message(broker: Broker, request_bytes: bytes) -> None:
    close = b"GET /stats.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    data = await raw_exchange(broker.port, request_bytes + close)
    assert data.startswith(b"HTTP/1.1 500 ERROR\r\n")
    assert b'\r\n\r\n{ "error": "no message" }\n' in data
    # Small bodies are read past, so the next request on the connection is served.
    assert data.count(b"HTTP/1.1 200 OK\r\n") == 1
    assert broker.router.aggregate.messages == 0


async def test_submit_short_message(broker: Broker) -> None:
    data = await raw_exchange(
        broker.port,
        b"POST /submit HTTP/1.1\r\nHost: x\r\nX-Fq-Route: r\r\nX-Fq-Exchange: e\r\n"
        b"Content-Length: 10\r\n\r\nTEST",
        half_close=True,
    )
    assert data.startswith(b"HTTP/1.1 500 ERROR\r\n")
    assert data.endswith(b'\r\n\r\n{ "error": "short message" }\n')
    assert broker.router.aggregate.messages == 0


async def test_submit_expect_100_continue(broker: Broker) -> None:
    conn = await RawConn.open(broker.port)
    await conn.send(
        b"POST /submit HTTP/1.1\r\nHost: x\r\nX-Fq-Route: r\r\nX-Fq-Exchange: e\r\n"
        b"Content-Length: 4\r\nExpect: 100-continue\r\n\r\n"
    )
    assert await conn.read_exactly(25) == b"HTTP/1.1 100 Continue\r\n\r\n"
    await conn.send(b"TEST")
    head = await conn.reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    body = await conn.read_exactly(int(head.split(b"content-length: ")[1].split(b"\r\n")[0]))
    assert json.loads(body)["no_exchange"] == 1
    await conn.close()


async def test_submit_expect_100_refused_early_for_bad_headers(broker: Broker) -> None:
    conn = await RawConn.open(broker.port)
    await conn.send(
        b"POST /submit HTTP/1.1\r\nHost: x\r\nX-Fq-Exchange: e\r\n"
        b"Content-Length: 4\r\nExpect: 100-continue\r\n\r\n"
    )
    data = await conn.closed()  # no 100 Continue: the body is never asked for
    assert data.startswith(b"HTTP/1.1 500 ERROR\r\n")
    assert data.endswith(b'{ "error": "missing route" }\n')


async def test_submit_waits_for_room_in_a_block_queue(broker: Broker) -> None:
    cmd = await authenticate(broker.port, b"slow", b"blk\x00mem:block,backlog=1")
    auth = await cmd.frame()
    assert isinstance(auth, wire.AuthResponse)
    await cmd.frame()
    await cmd.send(wire.encode(wire.BindRequest(0x100, b"blk", b"prefix:")))
    assert isinstance(await cmd.reply(), wire.BindResponse)
    conn = await HttpConn.open(broker.port)
    submit = [("X-Fq-Route", "r"), ("X-Fq-Exchange", "blk")]
    reply = asyncio.ensure_future(conn.request("POST", "/submit", submit, b"fills the queue"))
    await wait_for(lambda: broker.queues[b"blk"].backlog == 1)
    # A request on another connection, answered after the broker has read the submit's
    # body and routed it: the reply can only be withheld, not late.
    stats = await HttpConn.open(broker.port)
    response, _ = await stats.request("GET", "/stats.json")
    assert response.status_code == 200
    await stats.close()
    assert not reply.done()  # the queue is full: the reply waits (block policy)
    data = await RawConn.open(broker.port)
    await data.send(wire.encode_hello(wire.Mode.DATA, auth.key))  # a consumer drains it
    response, body = await reply
    assert response.status_code == 200 and json.loads(body)["routed"] == 1
    await conn.close()
    await data.close()
    await cmd.close()


async def test_submit_too_large_is_refused_before_the_body(broker: Broker) -> None:
    broker.settings.max_message_size = 1000
    data = await raw_exchange(
        broker.port,
        b"POST /submit HTTP/1.1\r\nHost: x\r\nX-Fq-Route: r\r\nX-Fq-Exchange: e\r\n"
        b"Content-Length: 1001\r\n\r\n" + b"x" * 1001,
    )
    assert data.startswith(b"HTTP/1.1 413 ")  # the phrase differs between Pythons
    assert b"connection: close" in data.lower()
    assert broker.router.aggregate.messages == 0
    await assert_still_serving(broker)


# --- admin token ---------------------------------------------------------------------------


async def test_admin_token_protects_admin_endpoints_only(broker: Broker) -> None:
    broker.settings.admin_token = "s3cret"
    conn = await HttpConn.open(broker.port)
    for headers in ([], [("Authorization", "Bearer wrong")], [("X-Fq-Token", "s3cre")]):
        response, body = await conn.request("POST", "/submit", [*OK_HEADERS, *headers], b"x")
        assert response.status_code == 403 and json.loads(body) == {"error": "forbidden"}
        response, _ = await conn.request("GET", "/add_checkpoint?cpname=a&qname=b&chkptid=1:1")
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


# --- checkpoints ---------------------------------------------------------------------------


def checkpoint_body(status: str, message: str) -> dict[str, str]:
    return {"status": status, "message": message}


@pytest.mark.parametrize("endpoint", ["add_checkpoint", "remove_checkpoint", "reset_to_checkpoint"])
async def test_checkpoint_errors(broker: Broker, endpoint: str) -> None:
    eph = await open_session(broker.port, b"c", b"eph\x00mem:public")
    mem = await open_session(broker.port, b"c", b"pmem\x00mem:permanent")
    cases = [
        ("cpname=fq&qname=pmem", "'fq' is a reserved name, cannot be used for a checkpoint name"),
        ("cpname=c&qname=nosuch", "Cannot find registered queue 'nosuch'"),
        ("cpname=c&qname=eph", "Checkpoints on ephemeral queues not supported"),
        ("cpname=c&qname=pmem", "Checkpoints on memory queues not supported"),
        ("qname=pmem", "'cpname' parameter is required"),
        ("cpname=&qname=pmem", "'cpname' parameter is required"),
        ("cpname=c", "'qname' parameter is required"),
        ("", "'cpname' parameter is required"),
    ]
    conn = await HttpConn.open(broker.port)
    for query, message in cases:
        response, body = await conn.request("GET", f"/{endpoint}?{query}&chkptid=1:1")
        assert response.status_code == 200
        assert header(response, b"content-type") == b"application/json"
        assert json.loads(body) == checkpoint_body("error", message), query
    await conn.close()
    await eph.close()
    await mem.close()


async def checkpoint_call(port: int, endpoint: str, **query: str) -> dict[str, str]:
    response, body = await get(port, f"/{endpoint}?{urlencode(query)}")
    assert response.status_code == 200
    assert header(response, b"content-type") == b"application/json"
    answer: dict[str, str] = json.loads(body)
    return answer


async def queue_info(port: int, queue: str) -> dict[str, Any]:
    response, body = await get(port, f"/queue/info?queue={queue}")
    assert response.status_code == 200
    info: dict[str, Any] = json.loads(body)
    return info


async def test_checkpoint_add_read_move_reset_remove_over_http(broker: Broker) -> None:
    """A checkpoint's whole life through real requests on a real disk queue, and what a
    reset does to the queue's reader: it gets the messages from the checkpoint on again."""
    port = broker.port
    reader = await open_session(port, b"reader", b"cpq\x00disk:permanent,public")
    await reader.bind(b"cp", b"prefix:")
    publisher = await open_session(port, b"writer")
    for i in range(10):
        await publisher.publish(b"cp", b"r", b"m%d" % i)
    assert [m.payload for m in await reader.receive(10)] == [b"m%d" % i for i in range(10)]
    info = await queue_info(port, "cpq")
    first = info["first"]
    # Sequence numbers are dense: m<i> is first + i. Wait until all are durable (readable).
    await wait_for(lambda: broker.queues[b"cpq"].store.durable_seq >= first + 9)  # type: ignore[attr-defined]
    assert "mark" not in (await queue_info(port, "cpq"))["checkpoints"]

    # Create, and read it back.
    at = checkpoints.format_position(first + 4)
    answer = await checkpoint_call(port, "add_checkpoint", cpname="mark", qname="cpq", chkptid=at)
    assert answer == checkpoint_body("success", "Checkpoint added")
    assert (await queue_info(port, "cpq"))["checkpoints"]["mark"] == first + 4

    # Move it: the same call with a later position.
    at = checkpoints.format_position(first + 6)
    answer = await checkpoint_call(port, "add_checkpoint", cpname="mark", qname="cpq", chkptid=at)
    assert answer == checkpoint_body("success", "Checkpoint added")
    assert (await queue_info(port, "cpq"))["checkpoints"]["mark"] == first + 6

    # Reset the queue's reader to it: m6..m9 come again, in order, then new messages.
    answer = await checkpoint_call(port, "reset_to_checkpoint", cpname="mark", qname="cpq")
    assert answer == checkpoint_body("success", "'cpq' reset to checkpoint 'mark'")
    assert [m.payload for m in await reader.receive(4)] == [b"m6", b"m7", b"m8", b"m9"]
    await publisher.publish(b"cp", b"r", b"m10")
    assert [m.payload for m in await reader.receive(1)] == [b"m10"]
    assert (await queue_info(port, "cpq"))["checkpoints"]["mark"] == first + 6  # not moved

    # Delete it: gone from the queue, and a reset to it is an error now.
    answer = await checkpoint_call(port, "remove_checkpoint", cpname="mark", qname="cpq")
    assert answer == checkpoint_body("success", "Checkpoint removed")
    assert "mark" not in (await queue_info(port, "cpq"))["checkpoints"]
    for endpoint in ("remove_checkpoint", "reset_to_checkpoint"):
        answer = await checkpoint_call(port, endpoint, cpname="mark", qname="cpq")
        assert answer == checkpoint_body("error", "Checkpoint does not exist")
    await publisher.close()
    await reader.close()


async def test_a_checkpoint_outlives_a_restart(settings: Settings) -> None:
    async with Broker(settings) as broker:
        session = await open_session(broker.port, b"reader", b"keep\x00disk:permanent,public")
        await session.bind(b"keep", b"prefix:")
        await session.publish(b"keep", b"r", b"one")
        await session.receive(1)
        first = (await queue_info(broker.port, "keep"))["first"]
        at = checkpoints.format_position(first + 1)
        answer = await checkpoint_call(
            broker.port, "add_checkpoint", cpname="kept", qname="keep", chkptid=at
        )
        assert answer == checkpoint_body("success", "Checkpoint added")
        await session.close()
    async with Broker(settings) as again:
        assert (await queue_info(again.port, "keep"))["checkpoints"]["kept"] == first + 1
        answer = await checkpoint_call(again.port, "remove_checkpoint", cpname="kept", qname="keep")
        assert answer == checkpoint_body("success", "Checkpoint removed")


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
    response, _ = await get(broker.port, "/shutdown")
    assert response.status_code == 403 and not requested.is_set()
    response, body = await get(broker.port, "/shutdown", headers=[("X-Fq-Token", "t")])
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
    response, _ = await get(port, "/shutdown", headers=[("X-Fq-Token", "t")])
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
