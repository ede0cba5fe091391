"""The Python client takes str or bytes for exchange, route, program, queue and user
names; str is sent as UTF-8 (the README's example writes str)."""

from __future__ import annotations

import pytest

from fqbroker.clients.fq.channel import as_bytes, parse_source
from fqbroker.clients.fq.client import Client
from fqbroker.protocols.fq import wire
from fqbroker.server.broker import Broker


@pytest.mark.parametrize("text", ["maryland", b"maryland"])
def test_a_name_is_bytes_on_the_wire(text: str | bytes) -> None:
    assert as_bytes(text) == b"maryland"


def test_str_is_utf8() -> None:
    assert as_bytes("müsli") == b"m\xc3\xbcsli"
    assert parse_source("zoë/käse/mem:public") == ("zoë".encode(), "käse\0mem:public".encode())
    assert parse_source(b"zo/q/disk") == (b"zo", b"q\0disk")


@pytest.mark.parametrize("kind", [str, bytes])
async def test_bind_publish_unbind_with_either(broker: Broker, kind: type) -> None:
    def name(text: str) -> str | bytes:
        return text if kind is str else text.encode()

    source = name("zoë/käse-queue/mem:public")
    async with Client(port=broker.port, source=source, password=name("pw")) as client:
        route_id = await client.bind(name("müsli"), name('prefix:"tëst."'))
        assert route_id != wire.BIND_ILLEGAL
        assert client.publish(name("müsli"), name("tëst.one"), b"payload")
        msg = await client.receive()
        assert (msg.exchange, msg.route, msg.payload) == (
            "müsli".encode(),
            "tëst.one".encode(),
            b"payload",
        )
        assert msg.sender == "zoë".encode()
        assert "käse-queue".encode() in broker.queues
        assert await client.unbind(name("müsli"), route_id)


async def test_a_str_and_a_bytes_binding_are_the_same_binding(broker: Broker) -> None:
    async with Client(port=broker.port, source="u/q") as client:
        route_id = await client.bind("ex", "prefix:")
        assert await client.bind(b"ex", b"prefix:") == route_id  # fq's duplicate bind
        assert await client.unbind(b"ex", route_id)
        assert not await client.unbind("ex", route_id)


async def test_names_over_127_bytes_are_refused_in_utf8_bytes(broker: Broker) -> None:
    async with Client(port=broker.port) as client:
        client.publish("é" * 63, "r", b"")  # 126 bytes: fine
        with pytest.raises(ValueError, match="127 bytes"):
            client.publish("é" * 64, "r", b"")  # 64 characters, 128 bytes
