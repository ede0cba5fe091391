"""The OpenCluster client: its sans-IO core against the protocol's vectors (no sockets),
then the asyncio client and the ``opencluster`` console script against a real fqd."""

from __future__ import annotations

import asyncio
import socket
import struct
from pathlib import Path

import pytest
import trustme

from fqbroker.clients.opencluster.client import OpenClusterClient
from fqbroker.clients.opencluster.machine import Answer, OCMachine, as_value
from fqbroker.errors import ClientClosed, ClientError, OpenClusterProtocolError
from fqbroker.frontends.opencluster.settings import OpenCluster
from fqbroker.protocols.opencluster import wire
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import TIMEOUT, port_of, running
from tests.pki import make_pki
from tests.procs import Proc
from tests.protocols.opencluster.test_wire import (
    ACK_HELLO,
    DATA_INT_45,
    FAIL_GET_INT,
    GET_INT_TESTDATA,
    GOLDEN_SET_INT,
    HASHMASKS_UID1,
    HELLO,
    SERVERLIST_0,
    h,
)

# What the 2011 C client answered the two pushes: an ack with repcmd 100 for both.
ACK_SERVERLIST_UID0 = h("0001 0064 00000000 00000000")
ACK_HASHMASKS_AS_2011_UID1 = h("0001 0064 00000001 00000000")

pytestmark = pytest.mark.on("opencluster")


def feed(m: OCMachine, data: bytes, one_byte_at_a_time: bool = False) -> list[Answer]:
    if not one_byte_at_a_time:
        return m.receive_data(data)
    answers: list[Answer] = []
    for i in range(len(data)):
        answers += m.receive_data(data[i : i + 1])
    return answers


@pytest.mark.parametrize("one_byte_at_a_time", [False, True])
def test_the_hello_handshake_acks_the_pushes_as_the_2011_client(one_byte_at_a_time: bool) -> None:
    m = OCMachine()
    assert m.hello() == HELLO
    assert not m.ready
    answers = feed(m, ACK_HELLO + SERVERLIST_0 + HASHMASKS_UID1, one_byte_at_a_time)
    assert answers == [Answer(wire.HELLO, wire.ACK)]
    assert m.ready
    assert m.servers == []
    assert m.mask == 0x0F
    assert m.buckets == [(bucket, 0) for bucket in range(16)]
    assert m.data_to_send() == ACK_SERVERLIST_UID0 + ACK_HASHMASKS_AS_2011_UID1
    assert m.data_to_send() == b""
    assert m.outstanding == 0


def test_not_ready_until_both_the_ack_and_the_hashmasks() -> None:
    m = OCMachine()
    m.hello()
    m.receive_data(ACK_HELLO + SERVERLIST_0)
    assert not m.ready
    m.receive_data(HASHMASKS_UID1)
    assert m.ready


def test_requests_are_the_protocol_vectors() -> None:
    assert OCMachine().set(b"testdata", 45) == GOLDEN_SET_INT
    assert OCMachine().get(b"testdata", as_int=True) == GET_INT_TESTDATA
    assert OCMachine().get(b"testdata") == wire.get_string(0, b"testdata")
    assert OCMachine().set(b"k", b"v", expires=9) == wire.set_string(0, b"k", b"v", expires=9)
    assert OCMachine().ping() == wire.ping(0)
    assert OCMachine().goodbye() == wire.goodbye(0)


def test_get_int_answers_data_int_or_fail() -> None:
    m = OCMachine()
    m.get(b"testdata", as_int=True)
    assert m.receive_data(DATA_INT_45) == [Answer(wire.GET_INT, wire.DATA_INT, 45)]
    m2 = OCMachine()
    m2.get(b"testdata", as_int=True)
    assert m2.receive_data(FAIL_GET_INT) == [Answer(wire.GET_INT, wire.FAIL)]


def test_replies_are_matched_in_order_with_user_ids_counting_up() -> None:
    m = OCMachine()
    frames = [m.set(f"k{i}".encode(), i) for i in range(1000)]
    assert [struct.unpack_from(">i", f, 4)[0] for f in frames] == list(range(1000))
    assert m.outstanding == 1000
    replies = b"".join(wire.ack(wire.SET_INT, i) for i in range(1000))
    assert m.receive_data(replies) == [Answer(wire.SET_INT, wire.ACK)] * 1000
    assert m.outstanding == 0


def test_a_string_get_answers_its_bytes_and_failures_keep_their_text() -> None:
    m = OCMachine()
    m.get(b"name")
    m.set(b"name", 5)
    m.get(b"other")
    m.ping()
    key = wire.fnv1a32(b"name")
    stream = (
        wire.data_str(0, 0, key, b"\x00value\xff")
        + wire.failinfo(wire.SET_INT, 1, 3, b"store full")
        + wire.unknown(wire.GET_STRING, 2)
        + wire.encode_frame(wire.UNKNOWN, wire.PING, 3, b"\x00\x1e")  # the seed's unknown
    )
    assert feed(m, stream, True) == [
        Answer(wire.GET_STRING, wire.DATA_STR, b"\x00value\xff"),
        Answer(wire.SET_INT, wire.FAILINFO, code=3, text=b"store full"),
        Answer(wire.GET_STRING, wire.UNKNOWN),
        Answer(wire.PING, wire.UNKNOWN),
    ]


def test_user_ids_wrap_to_zero_past_the_i32_range() -> None:
    m = OCMachine()
    m._next_id = 2**31 - 1
    assert struct.unpack_from(">i", m.ping(), 4)[0] == 2**31 - 1
    assert struct.unpack_from(">i", m.ping(), 4)[0] == 0


def _broken(request: bytes | None, reply: bytes) -> None:
    m = OCMachine()
    if request is not None:
        assert request in (b"ping", b"get_int", b"get_string", b"set")
        if request == b"ping":
            m.ping()
        elif request == b"set":
            m.set(b"k", 1)
        else:
            m.get(b"testdata", as_int=request == b"get_int")
    with pytest.raises(OpenClusterProtocolError) as first:
        m.receive_data(reply)
    with pytest.raises(OpenClusterProtocolError) as again:  # final
        m.receive_data(wire.ack(wire.PING, 1))
    assert again.value is first.value


@pytest.mark.parametrize(
    ("request_", "reply"),
    [
        (None, wire.ack(wire.PING, 0)),  # nothing outstanding
        (b"ping", wire.ack(wire.PING, 7)),  # another user id
        (b"ping", wire.ack(wire.GOODBYE, 0)),  # another command
        (b"set", wire.data_int(0, 0, wire.fnv1a32(b"k"), 1)),  # data to a set
        (b"get_int", wire.data_str(0, 0, 0x0A6F8DC5, b"x")),  # string to get_int
        (b"get_string", wire.data_int(0, 0, 0x0A6F8DC5, 1)),  # int to get_string
        (b"get_int", wire.data_int(0, 0, 0x12345678, 1)),  # another key's data
        (b"ping", wire.encode_frame(wire.ACK, wire.PING, 0, b"x")),  # ack with a payload
        (b"ping", wire.encode_frame(wire.UNKNOWN, wire.PING, 0, b"xyz")),
        (b"ping", wire.encode_frame(wire.HELLO, wire.PING, 0)),  # no reply id
        (b"ping", wire.encode_frame(wire.FAILINFO, wire.PING, 0, struct.pack(">ii", 1, 5) + b"ab")),
        (None, wire.ping(0)),  # a push other than serverlist or hashmasks
        (None, wire.encode_frame(wire.HASHMASK, 0, 0, struct.pack(">iii", 15, 0, 0))),
        (None, wire.encode_frame(wire.SERVERLIST, 0, 0, b"\x00\x00")),  # bad serverlist
        (None, struct.pack(">hhii", wire.ACK, wire.PING, 0, -1)),  # bad framing
    ],
)
def test_replies_out_of_step_are_protocol_errors(request_: bytes | None, reply: bytes) -> None:
    _broken(request_, reply)


def test_values_and_expiry_are_checked_before_anything_is_sent() -> None:
    assert as_value("text") == b"text"
    assert as_value(bytearray(b"x")) == b"x"
    assert as_value(-(2**31)) == -(2**31)
    for bad in (True, 2**31, -(2**31) - 1, 1.5, None):
        with pytest.raises(ValueError):
            as_value(bad)  # type: ignore[arg-type]
    m = OCMachine()
    for expires in (-1, 2**31):
        with pytest.raises(ValueError):
            m.set(b"k", 1, expires=expires)
    assert m.outstanding == 0


# --- against a real broker ------------------------------------------------------------------


@pytest.fixture
def oc_port(broker_on: Broker) -> int:
    """A broker with its OpenCluster listener on a free loopback port."""
    return port_of(broker_on, "opencluster")


async def test_set_and_get_ints_and_strings(oc_port: int) -> None:
    async with asyncio.timeout(TIMEOUT):
        client = await OpenClusterClient.connect("127.0.0.1", oc_port)
        try:
            assert client.machine.mask == 0x0F and client.machine.servers == []
            await client.set("counter", 41)
            await client.set(b"counter", -(2**31))  # a str and its bytes are one name
            assert await client.get("counter", kind=int) == -(2**31)
            await client.set("motd", "h\u00e9llo")
            await client.set("blob", b"\x00\xff" * 1000)
            assert await client.get("motd") == "h\u00e9llo".encode()
            assert await client.get("blob") == b"\x00\xff" * 1000
            assert await client.get("nothing") is None
            assert await client.get("nothing", kind=int) is None
            with pytest.raises(ClientError, match="wrong type"):
                await client.get("motd", kind=int)
            with pytest.raises(ClientError, match="wrong type"):
                await client.get("counter")
            await client.set("counter", "now a string")  # a set replaces the type too
            assert await client.get("counter") == b"now a string"
            await client.ping()
        finally:
            await client.close()
        assert client.closed
        with pytest.raises(ClientClosed):
            await client.ping()
        # A second connection sees what the first stored.
        other = await OpenClusterClient.connect("127.0.0.1", oc_port)
        try:
            assert await other.get("blob") == b"\x00\xff" * 1000
        finally:
            await other.close()


async def test_an_expired_value_is_not_found(oc_port: int) -> None:
    async with asyncio.timeout(TIMEOUT):
        client = await OpenClusterClient.connect("127.0.0.1", oc_port)
        try:
            await client.set("lease", b"held", expires=1)
            await client.set("kept", b"forever")
            assert await client.get("lease") == b"held"
            while await client.get("lease") is not None:  # bounded by the timeout above
                await asyncio.sleep(0.1)
            assert await client.get("kept") == b"forever"
            await client.set("lease", b"again", expires=60)
            assert await client.get("lease") == b"again"
        finally:
            await client.close()


async def test_a_thousand_pipelined_sets_then_gets(oc_port: int) -> None:
    async with asyncio.timeout(TIMEOUT * 3):
        client = await OpenClusterClient.connect("127.0.0.1", oc_port)
        try:
            sets = [client.set(f"k{i}", i if i % 2 else b"v%d" % i) for i in range(1000)]
            await asyncio.gather(*sets)
            gets = [client.get(f"k{i}", kind=int if i % 2 else bytes) for i in range(1000)]
            values = await asyncio.gather(*gets)
            assert values == [i if i % 2 else b"v%d" % i for i in range(1000)]
            assert client.machine.outstanding == 0
        finally:
            await client.close()


async def test_nothing_listening_is_an_os_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        with pytest.raises(OSError):
            await OpenClusterClient.connect("127.0.0.1", port, connect_timeout=TIMEOUT)


async def _tool(*args: str) -> tuple[int, bytes, str]:
    proc = await Proc.start("-m", "fqbroker.cli.opencluster", *args)
    async with asyncio.timeout(TIMEOUT * 3):
        return await proc.finish()


async def test_the_console_script(oc_port: int, tmp_path: Path) -> None:
    port = ("--port", str(oc_port))
    assert await _tool(*port, "set", "greeting", "hello world") == (0, b"", "")
    assert await _tool(*port, "get", "greeting") == (0, b"hello world\n", "")
    assert await _tool(*port, "set", "n", "-17", "--int", "--expires", "3600") == (0, b"", "")
    assert await _tool(*port, "get", "n", "--int") == (0, b"-17\n", "")
    assert await _tool(*port, "ping") == (0, b"", "")
    status, out, err = await _tool(*port, "get", "missing")
    assert (status, out) == (1, b"")
    assert err.strip() == "opencluster: missing: not found"
    status, out, err = await _tool(*port, "get", "greeting", "--int")
    assert (status, out) == (1, b"")
    assert "wrong type" in err and len(err.strip().splitlines()) == 1
    for bad in (
        ["set", "n", "x", "--int"],
        ["set", "n", str(2**31), "--int"],
        ["set", "n", "1", "--expires", "-1"],
        ["get"],
        ["--port", "70000", "ping"],
        ["frobnicate"],
    ):
        status, out, err = await _tool(*port, *bad)
        assert status == 2, bad
        assert "Traceback" not in err and err.strip(), bad
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = str(s.getsockname()[1])
        status, out, err = await _tool("--port", closed, "ping")
    assert status == 1
    assert err.strip().startswith(f"opencluster: cannot reach 127.0.0.1:{closed}")
    assert len(err.strip().splitlines()) == 1


async def test_the_client_and_the_tool_over_tls(settings: Settings, tmp_path: Path) -> None:
    (tmp_path / "pki").mkdir()
    pki = make_pki(trustme.CA(), tmp_path / "pki")
    settings.set_section(
        settings.section(OpenCluster).updated(
            {"listen": "127.0.0.1:0", "tls_cert": str(pki["cert"]), "tls_key": str(pki["key"])}
        )
    )
    async with running(settings) as broker, asyncio.timeout(TIMEOUT * 3):
        live = broker.front_ends["opencluster"]
        assert live.address is not None and live.transport == "tls"
        port = live.address[1]
        client = await OpenClusterClient.connect("127.0.0.1", port, cafile=pki["ca"])
        try:
            await client.set("secret", b"over tls")
        finally:
            await client.close()
        tool = ("--port", str(port), "--cafile", str(pki["ca"]))
        assert await _tool(*tool, "get", "secret") == (0, b"over tls\n", "")
        # Without the CA the server's certificate is not trusted: one line, exit 1.
        status, _, err = await _tool("--port", str(port), "--tls", "ping")
        assert status == 1 and len(err.strip().splitlines()) == 1, err
