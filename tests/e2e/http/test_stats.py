"""/stats.json on the broker's port: fqd's shape and key order after real traffic, names
that need escaping or are not UTF-8, and HEAD or any other method."""

from __future__ import annotations

import json

from fqbroker.protocols.fq import wire
from fqbroker.server.broker import Broker
from tests.conftest import Session, authenticate, open_session, wait_for
from tests.e2e.http.test_http import HttpConn, get, header
from tests.vectors import STATUS_KEYS

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
