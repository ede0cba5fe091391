"""POST /submit: publishing over HTTP, its replies and header errors, Expect: 100-continue,
block queues, fsync failures and a disk queue that survives kill -9."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from fqbroker.clients.fq.client import Client
from fqbroker.core.message import hop_addresses
from fqbroker.protocols.fq import wire
from fqbroker.server.broker import Broker
from fqbroker.storage.segments import log as segmentlog
from tests.conftest import TIMEOUT, FailingFsync, RawConn, authenticate, open_session, wait_for
from tests.e2e.http.test_http import (
    OK_HEADERS,
    HttpConn,
    assert_still_serving,
    get,
    header,
    raw_exchange,
)
from tests.procs import Proc

NODE = "10.254.254.1"


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


async def test_submit_into_a_full_reject_queue_answers_507(broker: Broker) -> None:
    """Refused, not dropped in silence: the answer says which queue, as a confirm does."""
    source = "c/rq/mem:permanent,reject,backlog=2,public"
    async with Client(port=broker.port, source=source) as setup:
        await setup.bind(b"test", b"prefix:", wire.BindFlags.PERM)
    headers = [("X-Fq-Route", "r"), ("X-Fq-Exchange", "test")]
    async with asyncio.timeout(TIMEOUT):
        for i in range(2):
            response, body = await get(broker.port, "/submit", headers, b"kept %d" % i)
            assert response.status_code == 200, body
        response, body = await get(broker.port, "/submit", headers, b"refused")
        assert (response.status_code, body) == (507, b'{ "error": "queue full: rq" }\n')
        assert response.reason == b"Insufficient Storage"
        async with Client(port=broker.port, source=source) as reader:
            assert [(await reader.receive()).payload for _ in range(2)] == [b"kept 0", b"kept 1"]
        # Room again.
        response, _ = await get(broker.port, "/submit", headers, b"again")
        assert response.status_code == 200
