"""The Lumberjack listener under auth = "password": shippers log in with TLS client
certificates, as Beats and Logstash secure Lumberjack (``ssl.certificate_authorities``,
``client_authentication: required``); the subject CN is the user, who needs the publish
right on the listener's exchange. The real PyPI shipper (pylogbeat, which presents a
client certificate) publishes; our encoder over TLS shows what is refused."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from pathlib import Path

import pytest

from fqbroker.clients.fq.client import Client
from fqbroker.protocols.lumberjack import encoder
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import TIMEOUT, on, port_of, running, wait_for
from tests.e2e.interop.test_lumberjack_npm import INTEROP, _node, _run_node
from tests.pki import Logins, password_logins
from tests.prereqs import require_module

RIGHTS = {
    "root": [("admin", "*")],
    "shipper": [("publish", "logging")],
    "reader": [("consume", "logging")],
}


@pytest.fixture
def logins(settings: Settings, tmp_path: Path) -> Logins:
    logins = password_logins(settings, tmp_path, RIGHTS)
    on(settings, "lumberjack", tls_cert=logins.cert, tls_key=logins.key, ack_idle_ms=50.0)
    return logins


async def ship(broker: Broker, context: ssl.SSLContext) -> list[tuple[int, int]]:
    """One event over TLS with our encoder; the ACKs that come before the broker closes
    the connection (or a TLS alert ends it)."""
    acks = encoder.AckReader()
    got: list[tuple[int, int]] = []
    with contextlib.suppress(ssl.SSLError, ConnectionResetError, BrokenPipeError):
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port_of(broker, "lumberjack"), ssl=context, server_hostname="127.0.0.1"
        )
        try:
            writer.write(encoder.window(1, 1000) + encoder.data_frame(1, {"line": "x"}))
            async with asyncio.timeout(TIMEOUT):
                while not got and (data := await reader.read(65536)):
                    got += acks.feed(data)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
    return got


async def test_a_shipper_without_a_login_is_refused(settings: Settings, logins: Logins) -> None:
    async with running(settings) as broker:
        for context in (
            logins.context(None),  # no certificate
            logins.context("shipper", ca=logins.stranger),  # another CA's
            logins.context("mallory"),  # no such user
            logins.context("reader"),  # a user without the publish right
        ):
            assert await ship(broker, context) == []
        assert broker.limits.refused["auth"] == 3
        # Each refused connection was given back to the limits.
        await wait_for(lambda: broker.front_ends["lumberjack"].counters.open == 0)
        assert broker.limits.connections == 0
        assert await ship(broker, logins.context("shipper")) == [(1, 1)]


def _pylogbeat_send(port: int, logins: Logins, events: list[dict[str, object]]) -> None:
    pylogbeat = require_module("pylogbeat", "pylogbeat is the PyPI Beats client under test")
    cert = str(logins.client("shipper"))
    with pylogbeat.PyLogBeatClient(
        "127.0.0.1", port, timeout=10, ssl_enable=True, ca_certs=str(logins.cafile),
        certfile=cert, keyfile=cert,
    ) as client:  # fmt: skip
        client.send(events)  # returns once the ACK came


async def test_pylogbeat_publishes_with_its_client_certificate(
    settings: Settings, logins: Logins
) -> None:
    events: list[dict[str, object]] = [{"n": i, "message": f"line {i}"} for i in range(5)]
    async with running(settings) as broker:
        source = "root/certs/mem:private"
        async with Client(port=broker.port, source=source, password="rootpw") as c:
            await c.bind(b"logging", b"prefix:", 0x0100)
            async with asyncio.timeout(TIMEOUT):
                await asyncio.to_thread(_pylogbeat_send, port_of(broker, "lumberjack"), logins,
                                        events)  # fmt: skip
                got = [await c.receive() for _ in events]
    assert sorted(json.loads(m.payload)["n"] for m in got) == list(range(5))


async def test_npm_lumberjack_protocol_publishes_with_its_client_certificate(
    settings: Settings, logins: Logins
) -> None:
    """The npm ``lumberjack-protocol`` shipper (v1, TLS only) given a client certificate:
    every event acknowledged and delivered; without one it never gets an ACK."""
    node = _node("lumberjack-protocol")
    script = str(INTEROP / "lumberjack_protocol_send.js")
    count = 50
    async with running(settings) as broker:
        port, ca = str(port_of(broker, "lumberjack")), str(logins.cafile)
        source = "root/certs-npm/mem:private"
        async with Client(port=broker.port, source=source, password="rootpw") as c:
            await c.bind(b"logging", b"prefix:", 0x0100)
            cert = str(logins.client("shipper"))
            rc, out, err = await _run_node(node, script, port, ca, str(count), "10", cert)
            assert rc == 0, (out, err.decode(errors="replace"))
            assert json.loads(out)["acked"] == count
            async with asyncio.timeout(TIMEOUT):
                got = [await c.receive() for _ in range(count)]
        assert sorted(int(json.loads(m.payload)["n"]) for m in got) == list(range(1, count + 1))
        refused = broker.limits.refused["auth"]
        rc, out, err = await _run_node(node, script, port, ca, "1", "10")  # no certificate
        assert rc != 0 and json.loads(out)["acked"] == 0
        assert broker.limits.refused["auth"] > refused
