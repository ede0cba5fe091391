"""Interop with third-party Lumberjack/Beats shippers.

Each test starts a real fqd subprocess with its Lumberjack listener on a loopback port,
binds an fq consumer (our Client) to the exchange ``logging``, lets a real client publish,
and checks that every event arrives exactly once with its JSON intact:

* PyPI ``pylogbeat`` (v2 ``J`` frames in a ``C`` frame per batch, sequence cumulative over
  the connection, blocks until the ACK equals it), plain TCP and TLS, and with it the
  issue's end-to-end promises seen from a real shipper: backpressure from a full
  block-policy queue (its send() waits, kept alive by ACK(0)) and durability (what it was
  acknowledged survives kill -9 of fqd);
* PyPI ``python-logstash-async`` with its Beats transport (pylogbeat under a logging handler,
  LogstashFormatter events);
* npm ``lumberjack-protocol`` (v1 ``D`` frames, TLS only, one ``W`` then a stream, flow
  controlled by our ACKs: it drops events past ten windows unacknowledged);
* npm ``lumberjack-client`` (v2, ``W(1)`` + ``C{J seq 1}`` per event, never reads ACKs).

The clients are installed by the test set-up (pyproject's dev extra, tests/interop/package.json
through ``make node``); a missing one skips here and fails on CI (tests/prereqs.py). The TLS
certificate is made by ``trustme`` with the SAN IP 127.0.0.1, its CA given to the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import socket
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fqbroker.clients.fq.client import Client
from fqbroker.core.message import Message
from tests.prereqs import missing, require_module
from tests.procs import Proc

INTEROP = Path(__file__).resolve().parents[3] / "tests" / "interop"
LJ_LINE = "Lumberjack listening on port: "
TIMEOUT = 30.0
# How long a consumer waits for a message that must not come (a duplicate) before it
# concludes there is none: events are in the queue before their ACK, so this is ample.
QUIET = 0.5


@dataclass
class Fqd:
    proc: Proc
    port: int  # fq
    lj_port: int  # Lumberjack


async def _start_fqd(tmp_path: Path, procs: list[Proc], *args: str) -> Fqd:
    fqd, port = await Proc.start_fqd(tmp_path, *args)
    procs.append(fqd)
    line = next((x for x in fqd.err_lines if x.startswith(LJ_LINE)), None)
    if line is None:
        async with asyncio.timeout(TIMEOUT):
            line = await fqd.wait_stderr(LJ_LINE)
    return Fqd(fqd, port, int(line.rsplit(" ", 1)[1]))


@pytest.fixture
async def fqd(tmp_path: Path, procs: list[Proc]) -> Fqd:
    """fqd with a plain-TCP Lumberjack listener on a free port (the flag)."""
    return await _start_fqd(tmp_path, procs, "--lumberjack", "127.0.0.1:0")


@dataclass
class Tls:
    ca: Path  # the CA's certificate, given to the clients
    cert: Path
    key: Path


@pytest.fixture
def tls(tmp_path: Path) -> Tls:
    trustme = require_module("trustme", "trustme makes the TLS test certificate")
    ca = trustme.CA()
    # An IP SAN: the npm client checks the server's name against 127.0.0.1.
    issued = ca.issue_cert("127.0.0.1")
    paths = Tls(tmp_path / "ca.pem", tmp_path / "cert.pem", tmp_path / "key.pem")
    ca.cert_pem.write_to_path(str(paths.ca))
    issued.private_key_pem.write_to_path(str(paths.key))
    # The whole chain: a client that trusts only the CA must see the issuing path.
    paths.cert.write_bytes(b"".join(p.bytes() for p in issued.cert_chain_pems))
    return paths


@pytest.fixture
async def tls_fqd(tmp_path: Path, procs: list[Proc], tls: Tls) -> Fqd:
    """fqd with a TLS Lumberjack listener, configured by the TOML table."""
    conf = tmp_path / "fqd.toml"
    conf.write_text(
        "[lumberjack]\n"
        'listen = "127.0.0.1:0"\n'
        f"tls_cert = {json.dumps(str(tls.cert))}\n"
        f"tls_key = {json.dumps(str(tls.key))}\n"
    )
    return await _start_fqd(tmp_path, procs, "--config", str(conf))


@contextlib.asynccontextmanager
async def consumer(port: int, exchange: bytes = b"logging") -> AsyncIterator[Client]:
    """An fq consumer bound to every route of ``exchange`` before anything is published."""
    source = f"ljtest/lj-{uuid.uuid4().hex[:8]}/mem:private,backlog=100000"
    async with Client(port=port, source=source, reconnect=False) as c:
        await c.bind(exchange, b"prefix:")
        yield c


async def receive_exactly(c: Client, n: int) -> list[Message]:
    """``n`` messages, then proof that no (n+1)th (a duplicate) follows."""
    async with asyncio.timeout(TIMEOUT):
        got = [await c.receive() for _ in range(n)]
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(QUIET):
            extra = await c.receive()
            raise AssertionError(f"more than {n} messages: {extra.payload[:200]!r}")
    return got


def by_number(msgs: list[Message], key: Callable[[dict[str, Any]], int]) -> dict[int, Message]:
    """The messages by the event number ``key`` finds in each payload; no number twice."""
    out: dict[int, Message] = {}
    for m in msgs:
        n = key(json.loads(m.payload))
        assert n not in out, f"event {n} delivered twice"
        out[n] = m
    return out


def assert_sender(m: Message) -> None:
    assert m.exchange == b"logging"
    assert m.sender.startswith(b"lumberjack/127.0.0.1:"), m.sender
    assert int(m.sender.rsplit(b":", 1)[1]) > 0


# --- pylogbeat --------------------------------------------------------------------------------


def _pylogbeat_events(start: int, n: int) -> list[Any]:
    """Events of every kind pylogbeat takes: dicts (it runs json.dumps) and JSON strings; some
    with a Beats ``@metadata.beat``, some with ``fields.type``, some with neither."""
    events: list[Any] = []
    for i in range(start, start + n):
        if i % 3 == 0:
            events.append({"@metadata": {"beat": "filebeat"}, "message": f"é ✓ {i}", "n": i})
        elif i % 3 == 1:
            events.append({"message": f"line {i}", "n": i, "fields": {"type": "app"}})
        else:
            events.append(json.dumps({"n": i, "nested": {"list": [1, 2.5, None, True]}}))
    return events


def _expected(event: Any) -> tuple[bytes, bytes]:
    """(payload, route) an event must arrive with: pylogbeat's JSON bytes exactly, and the
    default route template's choice."""
    payload = (event if isinstance(event, str) else json.dumps(event)).encode()
    obj = json.loads(payload)
    route = obj.get("@metadata", {}).get("beat") or obj.get("fields", {}).get("type")
    return payload, (route or "lumberjack").encode()


def _pylogbeat_send(port: int, batches: list[list[Any]], **tls: Any) -> None:
    pylogbeat = require_module("pylogbeat", "pylogbeat is the PyPI Beats client under test")
    # timeout bounds each socket call: a missing ACK fails the test instead of hanging it.
    with pylogbeat.PyLogBeatClient("127.0.0.1", port, timeout=10, **tls) as client:
        for batch in batches:
            client.send(batch)  # returns once the ACK equals the cumulative sequence


async def _pylogbeat_round_trip(f: Fqd, **tls: Any) -> None:
    # Three batches on one connection: sequences 1, 2..51, 52..301 (cumulative).
    sizes = (1, 50, 250)
    batches, start = [], 0
    for size in sizes:
        batches.append(_pylogbeat_events(start, size))
        start += size
    async with consumer(f.port) as c:
        async with asyncio.timeout(TIMEOUT):
            await asyncio.to_thread(_pylogbeat_send, f.lj_port, batches, **tls)
        got = by_number(await receive_exactly(c, sum(sizes)), lambda o: int(o["n"]))
    for n, event in enumerate(e for b in batches for e in b):
        payload, route = _expected(event)
        m = got[n]
        assert m.payload == payload  # the JSON bytes as the client sent them
        assert m.route == route
        assert_sender(m)


async def test_pylogbeat_publishes_batches_with_cumulative_sequence(fqd: Fqd) -> None:
    await _pylogbeat_round_trip(fqd)


async def test_pylogbeat_over_tls(tls_fqd: Fqd, tls: Tls) -> None:
    await _pylogbeat_round_trip(tls_fqd, ssl_enable=True, ca_certs=str(tls.ca))


async def test_pylogbeat_reconnects_and_every_batch_arrives_once(fqd: Fqd) -> None:
    """A connection per batch (as python-logstash-async's transport does): each new
    connection starts its sequence at 1 again, and nothing is lost or repeated."""
    async with consumer(fqd.port) as c:
        for k in range(4):
            batch = _pylogbeat_events(k * 30, 30)
            async with asyncio.timeout(TIMEOUT):
                await asyncio.to_thread(_pylogbeat_send, fqd.lj_port, [batch])
        got = by_number(await receive_exactly(c, 120), lambda o: int(o["n"]))
    assert sorted(got) == list(range(120))


async def test_pylogbeat_waits_on_a_full_block_queue_kept_alive_by_ack_0(fqd: Fqd) -> None:
    """Backpressure with the real client: a permanent block-policy queue of 20 with no
    reader fills, so the batch's ACK waits. pylogbeat reads with a 2.5 s socket timeout and
    the ACK is held for 4 s: it only survives because ACK(0) keepalives come every second
    (without them it raises a timeout). Once a consumer drains the queue, send() returns,
    and every event arrives once."""
    source = "ljbp/ljblock/mem:permanent,block,backlog=20,public"
    async with Client(port=fqd.port, source=source, reconnect=False) as setup:
        await setup.bind(b"logging", b"prefix:", 0x0110)  # permanent: outlives the client
    pylogbeat = require_module("pylogbeat", "pylogbeat is the PyPI Beats client under test")
    events = [{"n": i, "message": f"held {i}"} for i in range(100)]

    def send() -> None:
        with pylogbeat.PyLogBeatClient("127.0.0.1", fqd.lj_port, timeout=2.5) as client:
            client.send(events)

    sending = asyncio.ensure_future(asyncio.to_thread(send))
    try:
        done, _ = await asyncio.wait([sending], timeout=4.0)
        assert not done, f"the ACK came with the queue full: {sending.result()}"
        async with Client(port=fqd.port, source=source, reconnect=False) as drain:
            msgs = await receive_exactly(drain, len(events))
            async with asyncio.timeout(TIMEOUT):
                await sending  # the ACK, and no timeout in the client before it
    finally:
        if not sending.done():
            with contextlib.suppress(Exception):
                async with asyncio.timeout(TIMEOUT):
                    await sending
    got = by_number(msgs, lambda o: int(o["n"]))
    assert sorted(got) == list(range(len(events)))
    for n, m in got.items():
        assert m.payload == json.dumps(events[n]).encode()


async def test_pylogbeat_acknowledged_events_survive_kill_9(
    tmp_path: Path, procs: list[Proc]
) -> None:
    """What pylogbeat was told is delivered (its send() returned) is in a permanent disk
    queue: kill -9 fqd at once, restart it on the same state, and a consumer gets every
    event, once, in order."""
    first = await _start_fqd(tmp_path, procs, "--lumberjack", "127.0.0.1:0")
    source = "ljdur/ljdisk/disk:permanent,backlog=-1,public"
    async with Client(port=first.port, source=source, reconnect=False) as setup:
        await setup.bind(b"logging", b"prefix:", 0x0110)  # permanent: outlives fqd
    batches = [[{"n": b * 100 + i, "message": "kept"} for i in range(100)] for b in range(3)]
    async with asyncio.timeout(TIMEOUT):
        await asyncio.to_thread(_pylogbeat_send, first.lj_port, batches)
    first.proc.kill()  # SIGKILL, the moment the last ACK was read
    await first.proc.proc.wait()

    again = await _start_fqd(tmp_path, procs, "--lumberjack", "127.0.0.1:0")
    async with Client(port=again.port, source=source, reconnect=False) as c:
        await c.bind(b"logging", b"prefix:", 0x0110)
        msgs = await receive_exactly(c, 300)
    assert [json.loads(m.payload)["n"] for m in msgs] == list(range(300))


# --- python-logstash-async ----------------------------------------------------------------


async def test_python_logstash_async_beats_transport(
    fqd: Fqd, monkeypatch: pytest.MonkeyPatch
) -> None:
    handler_mod = require_module(
        "logstash_async.handler", "python-logstash-async is the PyPI logging client under test"
    )
    from logstash_async.constants import constants

    # Its worker flushes every 10 s by default; flush() below asks for one now, and a short
    # check interval makes the worker notice the request at once.
    monkeypatch.setattr(constants, "QUEUE_CHECK_INTERVAL", 0.05)
    monkeypatch.setattr(constants, "QUEUED_EVENTS_FLUSH_INTERVAL", 0.2)
    count = 120  # more than one of its Beats batches (25 events each)
    handler = handler_mod.AsynchronousLogstashHandler(
        "127.0.0.1",
        fqd.lj_port,
        database_path=None,  # its in-memory queue
        transport="logstash_async.transport.BeatsTransport",
        ssl_enable=False,  # its socket timeout is constants.SOCKET_TIMEOUT, 5 s
    )
    log = logging.getLogger(f"ljinterop.{uuid.uuid4().hex[:6]}")
    log.propagate = False
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    try:
        async with consumer(fqd.port) as c:
            for i in range(count):
                log.info("request %d served", i, extra={"n": i, "uri": f"/p/{i}"})
            handler.flush()
            msgs = await receive_exactly(c, count)
    finally:
        log.removeHandler(handler)
        async with asyncio.timeout(TIMEOUT):
            await asyncio.to_thread(handler.close)  # stops and joins its worker thread
    got = by_number(msgs, lambda o: int(o["extra"]["n"]))
    assert sorted(got) == list(range(count))
    for n, m in got.items():
        event = json.loads(m.payload)
        assert event["message"] == f"request {n} served"
        assert event["extra"]["uri"] == f"/p/{n}"
        assert event["level"] == "INFO"
        assert "@timestamp" in event
        assert m.route == b"python-logstash"  # LogstashFormatter's "type", the v1-style field
        assert_sender(m)


# --- the npm clients ------------------------------------------------------------------------


def _node(package: str) -> str:
    node = shutil.which("node")
    if node is None or not (INTEROP / "node_modules" / package).is_dir():
        missing(f"node and the npm {package} client are required: run `make node`")
    assert node is not None
    return node


async def _run_node(*args: str) -> tuple[int, bytes, bytes]:
    proc = await asyncio.create_subprocess_exec(
        *args,
        cwd=INTEROP,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(TIMEOUT * 2):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out, err


async def test_npm_lumberjack_protocol_v1_over_tls(tls_fqd: Fqd, tls: Tls) -> None:
    """v1 ``D`` frames after one ``W(10)``: the client drops events once 100 are unacknowledged,
    so it only gets through 1,001 events if our ACKs flow (on every window's worth, and on idle
    input for the odd one at the end), carry version '1' (it asserts that) and the last seq."""
    node = _node("lumberjack-protocol")
    count = 1001
    async with consumer(tls_fqd.port) as c:
        rc, out, err = await _run_node(
            node,
            str(INTEROP / "lumberjack_protocol_send.js"),
            str(tls_fqd.lj_port),
            str(tls.ca),
            str(count),
            "10",
        )
        assert rc == 0, (out, err.decode(errors="replace"))
        result = json.loads(out)
        assert result == {**result, "acked": count, "dropped": 0, "connects": 1}
        got = by_number(await receive_exactly(c, count), lambda o: int(o["n"]))
    assert sorted(got) == list(range(1, count + 1))
    hostname = socket.gethostname()
    for n, m in got.items():
        # A D frame's pairs become a JSON object of strings (the client stringifies values).
        assert json.loads(m.payload) == {
            "line": f"line {n}",
            "n": str(n),
            "type": "nodelog",
            "file": "/var/log/app.log",
            "offset": str(n * 100),
            "host": hostname,
        }
        assert m.route == b"nodelog"  # the v1 "type" field
        assert_sender(m)


async def test_npm_lumberjack_client_never_reads_acks(fqd: Fqd) -> None:
    node = _node("lumberjack-client")
    count = 300
    async with consumer(fqd.port) as c:
        proc = await asyncio.create_subprocess_exec(
            node,
            str(INTEROP / "lumberjack_client_send.js"),
            str(fqd.lj_port),
            str(count),
            cwd=INTEROP,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            msgs = await receive_exactly(c, count)
            assert proc.stdin is not None and proc.stdout is not None
            async with asyncio.timeout(TIMEOUT):
                line = await proc.stdout.readline()
            assert line == f"sent {count}\n".encode()
            proc.stdin.close()  # the script closes its socket and exits
            async with asyncio.timeout(TIMEOUT):
                _, err = await proc.communicate()
            assert proc.returncode == 0, err.decode(errors="replace")
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    got = by_number(msgs, lambda o: int(o["n"]))
    assert sorted(got) == list(range(1, count + 1))
    for n, m in got.items():
        assert json.loads(m.payload) == {
            "message": f"event {n}",
            "n": n,
            "fields": {"type": "nodeapp"},
            "nested": {"a": [1, "b"]},
        }
        assert m.route == b"nodeapp"  # fields.type
        assert_sender(m)
