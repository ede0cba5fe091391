"""The table of front ends: test-only echo front ends on ports of their own (TCP, TLS, UDP)
are registered like any other, counted and limited alike, listed in /frontends.json and
/metrics, and closed at stop; the HTTP modules reach the broker through Protocols only."""

from __future__ import annotations

import ast
import asyncio
import json
import shutil
import ssl
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fqbroker.frontends.kit.component import Datagrams, FrontEnd, LiveFrontEnd, OwnPort, Sniffed
from fqbroker.frontends.kit.limits import Limits
from fqbroker.protocols.fq import wire
from fqbroker.server.broker import Broker
from fqbroker.server.frontends import FRONT_ENDS, sniff
from fqbroker.server.listeners import Listeners
from fqbroker.settings.broker import Settings
from tests.conftest import TIMEOUT, open_session, running, wait_for
from tests.e2e.http.test_http import get
from tests.vectors import SNIFF

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = ("127.0.0.1", 0)


class EchoHost:
    """What the echo front ends need of their host: the broker's ``closed``."""

    def closed(self, transport: asyncio.Transport) -> None: ...


class _Echo(asyncio.Protocol):
    """Sends back what it reads; counts bytes per read, as a real front end may."""

    def __init__(self, host: EchoHost, live: LiveFrontEnd, transport: asyncio.Transport) -> None:
        self.host, self.live, self.transport = host, live, transport
        live.counters.bytes_in = live.counters.bytes_in or 0
        live.counters.bytes_out = live.counters.bytes_out or 0

    def data_received(self, data: bytes) -> None:
        counters = self.live.counters
        assert counters.bytes_in is not None and counters.bytes_out is not None
        counters.bytes_in += len(data)
        counters.bytes_out += len(data)
        self.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.host.closed(self.transport)


def _open_echo(
    host: EchoHost, live: LiveFrontEnd, transport: asyncio.Transport, first: bytes
) -> asyncio.BaseProtocol:
    return _Echo(host, live, transport)


class _DatagramEcho(asyncio.DatagramProtocol):
    def __init__(self, live: LiveFrontEnd) -> None:
        self.live = live
        self.transport: asyncio.DatagramTransport | None = None
        live.counters.bytes_in = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        counters = self.live.counters
        assert counters.datagrams is not None and counters.bytes_in is not None
        counters.datagrams += 1
        counters.bytes_in += len(data)
        assert self.transport is not None
        self.transport.sendto(data, addr)


ECHO_TCP: FrontEnd[EchoHost] = FrontEnd(
    name="echo-tcp", reach=OwnPort(lambda settings: LOOPBACK, _open_echo), summary="echo"
)
ECHO_UDP: FrontEnd[EchoHost] = FrontEnd(
    name="echo-udp",
    reach=Datagrams(lambda settings: LOOPBACK, lambda host, live: _DatagramEcho(live)),
)
OFF: FrontEnd[EchoHost] = FrontEnd(name="off", reach=OwnPort(lambda settings: None, _open_echo))


def echo_tls(context: ssl.SSLContext) -> FrontEnd[EchoHost]:
    return FrontEnd(
        name="echo-tls",
        reach=OwnPort(lambda settings: LOOPBACK, _open_echo, tls=lambda settings: context),
    )


def port_of(broker: Broker, name: str) -> int:
    address = broker.front_ends[name].address
    assert address is not None
    return address[1]


async def front_ends_json(broker: Broker) -> dict[str, dict[str, Any]]:
    response, body = await get(broker.port, "/frontends.json")
    assert response.status_code == 200
    return {fe["name"]: fe for fe in json.loads(body)["frontends"]}


async def echo_round_trip(port: int, data: bytes, **tls: Any) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, **tls)
    try:
        writer.write(data)
        async with asyncio.timeout(TIMEOUT):
            assert await reader.readexactly(len(data)) == data
    finally:
        writer.close()


# --- the table ------------------------------------------------------------------------------


async def test_the_default_table_lists_fq_and_http_on_the_main_port(broker: Broker) -> None:
    consumer = await open_session(broker.port, b"fe-reader", b"fe-q")
    fes = await front_ends_json(broker)
    assert list(fes) == [
        "fq-command",
        "fq-data",
        "http",
        "lumberjack",
        "figg",
        "fyrehose",
        "opencluster",
    ]
    for own in ("lumberjack", "figg", "fyrehose", "opencluster"):
        assert fes.pop(own)["port"] is None  # a port of its own, off until configured
    for fe in fes.values():
        assert fe["transport"] == "main" and fe["port"] == broker.port
        assert {"open", "accepted", "refused"} <= set(fe) and "datagrams" not in fe
    assert fes["fq-command"]["open"] == 1 and fes["fq-data"]["open"] == 1
    assert fes["http"]["open"] == 1  # this request
    (command,) = fes["fq-command"]["connections"]
    assert command["user"] == "fe-reader" and command["queue"] == "fe-q"
    assert command["remote_addr"] == "127.0.0.1"
    assert command["remote_port"] == consumer.cmd.writer.get_extra_info("sockname")[1]
    (data,) = fes["fq-data"]["connections"]
    assert data["mode"] == "client" and data["user"] == "fe-reader"
    await consumer.close()
    await wait_for(lambda: broker.front_ends["fq-command"].counters.open == 0)
    assert broker.front_ends["fq-command"].counters.accepted == 1


# The session kind each opening of docs/fq-protocol.md §1.2 names (wire.Mode, "http", or
# None: closed), and the front end of the table that serves it.
FRONT_END_OF: dict[object, str | None] = {
    wire.Mode.CMD: "fq-command",
    wire.Mode.DATA: "fq-data",
    wire.Mode.PEER: "fq-data",
    wire.Mode.OLD_PEER: "fq-data",
    "http": "http",
    None: None,
}


@pytest.mark.parametrize("sniffed", SNIFF, ids=lambda s: s[0].hex())
def test_sniff(sniffed: tuple[bytes, object]) -> None:
    """Moved from test_wire.py with ``sniff``: the table now says what a connection is."""
    first4, expected = sniffed
    claimant = sniff(first4)
    assert (None if claimant is None else claimant.name) == FRONT_END_OF[expected]
    if isinstance(expected, wire.Mode):  # the data session reads its mode from the same bytes
        assert wire.Mode(int.from_bytes(first4, "big")) is expected


def test_names_and_preambles_are_each_claimed_once(settings: Settings) -> None:
    limits = Limits(settings, {})
    with pytest.raises(ValueError, match="two front ends"):
        Listeners(None, settings, limits, (ECHO_TCP, ECHO_TCP))
    taken: FrontEnd[Any] = FrontEnd("other", Sniffed(frozenset({b"GET "}), _open_echo))
    with pytest.raises(ValueError, match="preamble"):
        Listeners(None, settings, limits, (*FRONT_ENDS, taken))


# --- ports of their own -----------------------------------------------------------------------


async def test_a_tcp_front_end_on_its_own_port(settings: Settings) -> None:
    async with running(settings, ECHO_TCP, OFF) as broker:
        port = port_of(broker, "echo-tcp")
        assert port not in (0, broker.port)
        assert broker.front_ends["off"].address is None  # not configured: no port
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"hello")
        assert await reader.readexactly(5) == b"hello"
        fes = await front_ends_json(broker)
        echo = fes["echo-tcp"]
        assert echo["transport"] == "tcp" and echo["port"] == port and echo["summary"] == "echo"
        assert (echo["open"], echo["accepted"], echo["bytes_in"], echo["bytes_out"]) == (1, 1, 5, 5)
        (conn,) = echo["connections"]
        assert conn == {
            "remote_addr": "127.0.0.1",
            "remote_port": writer.get_extra_info("sockname")[1],
        }
        assert fes["off"]["host"] is None and fes["off"]["connections"] == []

        _, body = await get(broker.port, "/metrics")
        text = body.decode()
        assert 'fq_frontend_connections{frontend="echo-tcp"} 1.0' in text
        assert 'fq_frontend_accepted_total{frontend="echo-tcp"} 1.0' in text
        assert 'fq_frontend_received_bytes_total{frontend="echo-tcp"} 5.0' in text
        assert (
            f'fq_frontend_info{{address="127.0.0.1:{port}",frontend="echo-tcp",transport="tcp"}}'
            in text
        )
        assert 'fq_frontend_received_bytes_total{frontend="http"}' not in text  # not counted

        writer.close()
        await wait_for(lambda: broker.front_ends["echo-tcp"].counters.open == 0)
        assert broker.limits.connections == 0


async def test_a_udp_front_end_on_its_own_port(settings: Settings) -> None:
    async with running(settings, ECHO_UDP) as broker:
        port = port_of(broker, "echo-udp")
        loop = asyncio.get_running_loop()
        got: asyncio.Queue[bytes] = asyncio.Queue()

        class Client(asyncio.DatagramProtocol):
            def datagram_received(self, data: bytes, addr: Any) -> None:
                got.put_nowait(data)

        transport, _ = await loop.create_datagram_endpoint(Client, remote_addr=("127.0.0.1", port))
        try:
            for n in range(3):
                transport.sendto(b"ping %d" % n)
                async with asyncio.timeout(TIMEOUT):
                    assert await got.get() == b"ping %d" % n
        finally:
            transport.close()
        echo = (await front_ends_json(broker))["echo-udp"]
        assert echo["transport"] == "udp" and echo["port"] == port
        assert (echo["datagrams"], echo["bytes_in"], echo["open"]) == (3, 18, 0)
        assert echo["connections"] == []
    assert broker.front_ends["echo-udp"].counters.datagrams == 3


def self_signed(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a fresh self-signed certificate, and a client that trusts it."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a certificate with")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    client = ssl.create_default_context(cafile=str(cert))
    return server, client


async def test_a_tls_front_end_on_its_own_port(settings: Settings, tmp_path: Path) -> None:
    server, client = self_signed(tmp_path)
    async with running(settings, echo_tls(server)) as broker:
        port = port_of(broker, "echo-tls")
        await echo_round_trip(port, b"secret" * 1000, ssl=client)
        echo = (await front_ends_json(broker))["echo-tls"]
        assert echo["transport"] == "tls" and echo["accepted"] == 1
        assert echo["bytes_in"] == 6000
        await wait_for(lambda: broker.front_ends["echo-tls"].counters.open == 0)


async def test_connection_limits_apply_to_a_front_end_of_its_own_port(settings: Settings) -> None:
    settings.max_connections_per_address = 1
    async with running(settings, ECHO_TCP) as broker:
        port = port_of(broker, "echo-tcp")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"x")
        assert await reader.readexactly(1) == b"x"
        # A second one from the same address is over the limit: closed without an answer.
        reader2, writer2 = await asyncio.open_connection("127.0.0.1", port)
        writer2.write(b"y")
        async with asyncio.timeout(TIMEOUT):
            assert await reader2.read() == b""
        writer2.close()
        counters = broker.front_ends["echo-tcp"].counters
        assert (counters.accepted, counters.refused, counters.open) == (1, 1, 1)
        assert broker.limits.refused["connections_per_address"] == 1
        writer.close()
        await wait_for(lambda: broker.limits.connections == 0)


async def test_stop_closes_every_port_and_connection(settings: Settings) -> None:
    broker = Broker(settings, front_ends=(*FRONT_ENDS, ECHO_TCP, ECHO_UDP))
    await broker.start()
    port = port_of(broker, "echo-tcp")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"x")
    assert await reader.readexactly(1) == b"x"
    async with asyncio.timeout(TIMEOUT):
        await broker.stop()
        assert await reader.read() == b""  # closed by the broker
        await broker.stop()  # twice is harmless
    assert all(not live.connections for live in broker.front_ends.values())
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)
    writer.close()


def test_own_ports_under_uvloop(settings: Settings, tmp_path: Path) -> None:
    uvloop = pytest.importorskip("uvloop")
    server, client = self_signed(tmp_path)

    async def main() -> None:
        async with running(settings, ECHO_TCP, echo_tls(server), ECHO_UDP) as broker:
            await echo_round_trip(port_of(broker, "echo-tcp"), b"uv")
            await echo_round_trip(port_of(broker, "echo-tls"), b"uv tls", ssl=client)
            loop = asyncio.get_running_loop()
            got: asyncio.Future[bytes] = loop.create_future()

            class Client(asyncio.DatagramProtocol):
                def datagram_received(self, data: bytes, addr: Any) -> None:
                    got.set_result(data)

            transport, _ = await loop.create_datagram_endpoint(
                Client, remote_addr=("127.0.0.1", port_of(broker, "echo-udp"))
            )
            transport.sendto(b"uv udp")
            async with asyncio.timeout(TIMEOUT):
                assert await got == b"uv udp"
            transport.close()
            # The main port's front ends too: the sniffer hands over under uvloop.
            fes = await front_ends_json(broker)
            assert fes["echo-tls"]["accepted"] == 1 and fes["echo-udp"]["datagrams"] == 1

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


# --- no Broker in the HTTP front end ------------------------------------------------------------

HTTP_SIDE = [
    *sorted((ROOT / "fqbroker" / "frontends").rglob("*.py")),
    *sorted((ROOT / "fqbroker" / "storage").rglob("*.py")),
    ROOT / "fqbroker" / "server" / "listeners.py",
]


@pytest.mark.parametrize("path", HTTP_SIDE, ids=lambda p: str(p.relative_to(ROOT)))
def test_front_ends_do_not_import_the_broker(path: Path) -> None:
    """Not even under TYPE_CHECKING: the broker imports the front ends, never back."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        assert "fqbroker.server.broker" not in names, f"{path.name}:{node.lineno}"


def test_h11_is_loaded_by_the_first_http_request_only() -> None:
    code = (
        "import sys, fqbroker.server.broker, fqbroker.server.frontends; "
        "assert 'h11' not in sys.modules, 'h11 loaded'; "
        "assert 'prometheus_client' not in sys.modules, 'prometheus_client loaded'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_every_front_end_of_the_table_has_fuzz_targets() -> None:
    """bench/frontends.py fuzzes each front end by its table name (fq-data also as fq-peer):
    registering one without fuzz targets fails here."""
    from bench.frontends import FRONT_ENDS as FUZZED

    assert {fe.name for fe in FRONT_ENDS} <= {fe.name for fe in FUZZED}


def test_an_error_raised_anywhere_in_the_package_is_ours() -> None:
    """What the exception handler logs as the broker's own (docs/limits.md): any module of
    the package, not only those next to limits.py."""
    from fqbroker.errors import ProtocolError
    from fqbroker.frontends.kit.limits import raised_in_package

    decoder = wire.ServerCommandDecoder()
    decoder.feed(b"\xff" * 64)
    with pytest.raises(ProtocolError) as raised:
        decoder.next_frame()
    assert raised_in_package(raised.value)


async def test_a_port_taken_fails_the_start_and_leaves_no_port_open(settings: Settings) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(LOOPBACK)
        taken.listen()
        address = taken.getsockname()[:2]
        clash: FrontEnd[EchoHost] = FrontEnd("clash", OwnPort(lambda s: address, _open_echo))
        broker = Broker(settings, front_ends=(*FRONT_ENDS, ECHO_TCP, clash))
        with pytest.raises(OSError):
            await broker.start()
        servers = list(broker.listeners.servers())
        assert len(servers) == 2 and not any(s.is_serving() for s in servers)
        await broker.stop()


class _Shared:
    """A front end's state: what happened to it, in order, beside its connections' ends."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        events.append("made")

    async def close(self) -> None:
        await asyncio.sleep(0)  # an async close, awaited
        self.events.append("closed")


def _stateful(events: list[str], address: Callable[[Settings], tuple[str, int] | None]) -> Any:
    class Tracked(_Echo):
        def connection_lost(self, exc: Exception | None) -> None:
            events.append("connection lost")
            super().connection_lost(exc)

    def open_tracked(
        host: EchoHost, live: LiveFrontEnd, transport: asyncio.Transport, first: bytes
    ) -> asyncio.BaseProtocol:
        assert isinstance(live.state, _Shared)  # made before the first connection
        events.append("opened")
        return Tracked(host, live, transport)

    return FrontEnd(
        name="stateful",
        reach=OwnPort(address, open_tracked),
        state=lambda host, settings: _Shared(events),
    )


async def test_a_front_end_state_lives_from_before_its_port_to_after_its_connections(
    settings: Settings,
) -> None:
    events: list[str] = []
    async with running(settings, _stateful(events, lambda s: LOOPBACK)) as broker:
        live = broker.front_ends["stateful"]
        assert isinstance(live.state, _Shared) and events == ["made"]
        await echo_round_trip(port_of(broker, "stateful"), b"hi")
        await wait_for(lambda: "connection lost" in events)
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(broker, "stateful"))
        writer.write(b"x")
        async with asyncio.timeout(TIMEOUT):
            await reader.readexactly(1)  # served: open while the broker stops
    writer.close()
    assert events == ["made", "opened", "connection lost", "opened", "connection lost", "closed"]
    assert live.state is None


async def test_a_front_end_state_is_closed_when_a_port_fails_and_not_made_when_off(
    settings: Settings,
) -> None:
    import socket

    events: list[str] = []
    with socket.socket() as taken:
        taken.bind(LOOPBACK)
        taken.listen()
        address = taken.getsockname()[:2]
        clash: FrontEnd[EchoHost] = FrontEnd("clash", OwnPort(lambda s: address, _open_echo))
        broker = Broker(
            settings, front_ends=(*FRONT_ENDS, _stateful(events, lambda s: LOOPBACK), clash)
        )
        with pytest.raises(OSError):
            await broker.start()
        assert events == ["made", "closed"]
        await broker.stop()
    assert events == ["made", "closed"]  # closed once
    off: list[str] = []
    async with running(settings, _stateful(off, lambda s: None)) as broker:
        assert broker.front_ends["stateful"].state is None
    assert off == []


def _import_graph() -> dict[str, set[str]]:
    """fqbroker's modules and what each imports, type-only and lazy imports included."""
    modules = {}
    for path in (ROOT / "fqbroker").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    graph[name].add(full if full in modules else node.module)
            elif isinstance(node, ast.Import):
                graph[name].update(alias.name for alias in node.names)
        graph[name] &= modules.keys()
    return graph


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), list(graph[start])
    while todo:
        name = todo.pop()
        if name == goal:
            return True
        if name not in seen:
            seen.add(name)
            todo.extend(graph[name])
    return False


FRONT_END_SIDE = [
    "fqbroker.frontends.http",
    "fqbroker.frontends.http.endpoints",
    "fqbroker.frontends.http.frontend",
    "fqbroker.frontends.http.host",
    "fqbroker.frontends.http.stats.metrics",
    "fqbroker.frontends.http.reads.queues",
    "fqbroker.frontends.http.stats.snapshot",
    "fqbroker.storage.configdb.checkpoints",
    "fqbroker.frontends.kit.component",
    "fqbroker.server.listeners",
]


@pytest.mark.parametrize("module", FRONT_END_SIDE)
def test_no_import_circle_through_the_http_side_and_the_listeners(module: str) -> None:
    assert not _reaches(_import_graph(), module, module), f"{module} imports itself back"
