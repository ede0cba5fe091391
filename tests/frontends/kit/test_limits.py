"""Resource limits with clear answers (docs/limits.md).

Each limit refuses with its documented answer and counter while everyone already served
goes on; the descriptor limit is real (a child broker under a low RLIMIT_NOFILE).
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
from pathlib import Path
from typing import Any

import pytest

from fqbroker.frontends.kit.limits import (
    DISK_QUEUE_RATE_TEXT,
    QUEUES_PER_USER_TEXT,
    Limits,
    LogLimiter,
    RateBucket,
    connection_limit,
    install_exception_handler,
)
from fqbroker.protocols.fq import wire
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import TIMEOUT, RawConn, Session, authenticate, open_session, wait_for
from tests.e2e.fq.test_server import assert_broker_serves
from tests.procs import Proc

# --- pure parts -------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_log_limiter_holds_back_a_flood_and_says_how_much(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    limiter = LogLimiter(logging.getLogger("t"), lines=2, period=1.0, clock=clock)
    caplog.set_level(logging.INFO, "t")
    sent = [limiter.log(logging.INFO, "data", "bad %d", i) for i in range(10)]
    assert sent == [True, True] + [False] * 8
    assert limiter.log(logging.INFO, "http", "other kind") is True  # kinds are apart
    clock.now += 1.0
    assert limiter.log(logging.INFO, "data", "bad %d", 10) is True
    assert [r.getMessage() for r in caplog.records] == [
        "bad 0",
        "bad 1",
        "other kind",
        "bad 10 (8 similar lines suppressed)",
    ]


def test_rate_bucket_allows_a_burst_then_the_rate() -> None:
    clock = Clock()
    bucket = RateBucket(2.0, 2.0, clock=clock)
    assert [bucket.take() for _ in range(3)] == [True, True, False]
    clock.now += 0.5
    assert [bucket.take() for _ in range(2)] == [True, False]
    clock.now += 100
    assert [bucket.take() for _ in range(3)] == [True, True, False]  # no more than the burst
    assert all(RateBucket(0, 0, clock=clock).take() for _ in range(100))  # 0: no limit


def test_connection_limit_keeps_descriptors_back_for_files() -> None:
    assert connection_limit(500) == 500
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    auto = connection_limit(0)
    assert 16 <= auto <= soft - 64


def test_exception_handler_logs_one_line_and_keeps_others_errors(
    caplog: pytest.LogCaptureFixture, settings: Settings
) -> None:
    loop = asyncio.new_event_loop()
    try:
        passed_on: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _loop, ctx: passed_on.append(ctx))
        limits = Limits(settings, {})
        install_exception_handler(loop, limits, lambda ctx: ctx.get("ours", False))
        caplog.set_level(logging.INFO)
        try:
            raise RuntimeError("a bug")
        except RuntimeError as exc:
            bug = exc
        for _ in range(20):
            loop.call_exception_handler({"message": "m", "exception": bug, "ours": True})
        loop.call_exception_handler({"message": "theirs", "exception": bug})
        errors = [r for r in caplog.records if r.levelno >= logging.INFO]
        assert len(errors) == settings.log_lines_per_second
        assert not [r for r in errors if r.exc_info]
        assert "RuntimeError at test_limits.py:" in errors[0].getMessage()
        assert limits.bad_input["internal"] == 20
        assert [ctx["message"] for ctx in passed_on] == ["theirs"]
    finally:
        loop.close()


# --- queues per user and disk-queue creation rate -----------------------------------------


async def _auth(port: int, user: bytes, queue_field: bytes) -> wire.Frame:
    cmd = await authenticate(port, user, queue_field)
    reply = await cmd.frame()
    if isinstance(reply, wire.ErrorReply):
        assert await cmd.closed() == b""
    else:
        await cmd.close()
    return reply


async def test_queues_per_user(tmp_path: Path, settings: Settings) -> None:
    settings.max_queues_per_user = 2
    async with Broker(settings) as broker:
        for name in (b"p1", b"p2"):
            reply = await _auth(broker.port, b"u", name + b"\0mem:permanent")
            assert isinstance(reply, wire.AuthResponse)
        await wait_for(lambda: not broker.clients)
        # A third permanent queue, a disk queue, or making a transient queue permanent:
        # each would outlive the connection, and each is refused.
        for field in (b"p3\0mem:permanent", b"d1\0disk"):
            reply = await _auth(broker.port, b"u", field)
            assert reply == wire.ErrorReply(QUEUES_PER_USER_TEXT)
        held = await open_session(broker.port, b"someone", b"t1\0mem")
        reply = await _auth(broker.port, b"u", b"t1\0mem:permanent")
        assert reply == wire.ErrorReply(QUEUES_PER_USER_TEXT)
        assert not broker.queues[b"t1"].permanent
        await held.close()
        assert broker.limits.refused["queues_per_user"] == 3
        assert b"p3" not in broker.queues and b"d1" not in broker.queues
        # Transient memory queues go with their connection: not counted.
        session = await open_session(broker.port, b"u", b"t2\0mem")
        await session.close()
        # Others are not held to u's count, and u gets room back when a queue goes.
        assert isinstance(await _auth(broker.port, b"v", b"p3\0mem:permanent"), wire.AuthResponse)
        assert isinstance(await _auth(broker.port, b"u", b"p1\0mem:transient"), wire.AuthResponse)
        await wait_for(lambda: b"p1" not in broker.queues)
        assert isinstance(await _auth(broker.port, b"u", b"p4\0mem:permanent"), wire.AuthResponse)
        await assert_broker_serves(broker)


async def test_disk_queue_creation_rate(settings: Settings) -> None:
    settings.disk_queues_per_second = 0.001  # a burst of one, then one in 1000 s
    async with Broker(settings) as broker:
        first = await open_session(broker.port, b"u", b"d1\0disk:permanent")
        reply = await _auth(broker.port, b"w", b"d2\0disk")
        assert reply == wire.ErrorReply(DISK_QUEUE_RATE_TEXT)
        assert b"d2" not in broker.queues
        assert not (settings.queue_dir / "d2").exists()
        assert broker.limits.refused["disk_queue_rate"] == 1
        # Attaching to the disk queue that exists creates nothing; memory queues are free.
        await first.close()
        await wait_for(lambda: not broker.clients)
        again = await open_session(broker.port, b"u", b"d1\0disk")
        await again.close()
        memory = await open_session(broker.port, b"u", b"m1\0mem")
        await memory.close()
        await assert_broker_serves(broker)


# --- connections --------------------------------------------------------------------------


async def _open_from(port: int, source: str) -> RawConn:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    return RawConn(reader, writer)


class _Served:
    """A consumer bound to ``ex`` and a publisher to it: sessions that must go on being
    served whatever a limit refuses to others."""

    def __init__(self, consumer: Session, publisher: Session) -> None:
        self.consumer = consumer
        self.publisher = publisher

    @classmethod
    async def open(cls, port: int) -> _Served:
        consumer = await open_session(port, b"c")
        assert await consumer.bind(b"ex", b"prefix:") != wire.BIND_ILLEGAL
        return cls(consumer, await open_session(port, b"p"))

    async def assert_served(self, payload: bytes) -> None:
        await self.publisher.publish(b"ex", b"r", payload)
        assert [m.payload for m in await self.consumer.receive()] == [payload]

    async def close(self) -> None:
        await self.consumer.close()
        await self.publisher.close()


async def test_connections_in_total(settings: Settings) -> None:
    settings.max_connections = 6
    async with Broker(settings) as broker:
        sessions = await _Served.open(broker.port)
        await wait_for(lambda: broker.limits.connections == 4)
        extra = [await RawConn.open(broker.port) for _ in range(2)]  # 5 and 6: served
        for conn in extra:
            await conn.send(b"GET /stats.json HTTP/1.1\r\nhost: x\r\n\r\n")
            assert (await conn.reader.readline()).startswith(b"HTTP/1.1 200")
        # The seventh: an fq connection is closed after its first 4 bytes ...
        fq = await RawConn.open(broker.port)
        await fq.send(wire.Mode.CMD.to_bytes(4, "big"))
        assert await fq.closed() == b""
        # ... and an HTTP one gets a 503.
        http = await RawConn.open(broker.port)
        await http.send(b"GET /stats.json HTTP/1.1\r\nhost: x\r\n\r\n")
        reply = await http.closed()
        assert reply.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), reply
        assert reply.endswith(b'\r\n\r\n{"error": "too many connections"}\n')
        assert broker.limits.refused["connections"] == 2
        # Who was served goes on being served.
        await sessions.assert_served(b"still here")
        # A connection freed is a connection served.
        await extra[0].close()
        await wait_for(lambda: broker.limits.connections == 5)
        await extra[1].close()
        await sessions.close()
        await wait_for(lambda: broker.limits.connections == 0)
        await assert_broker_serves(broker)


async def test_connections_per_address(settings: Settings) -> None:
    settings.max_connections_per_address = 4
    async with Broker(settings) as broker:
        session = await open_session(broker.port, b"a")  # two from 127.0.0.1
        held = [await _open_from(broker.port, "127.0.0.1") for _ in range(2)]
        refused = await _open_from(broker.port, "127.0.0.1")
        await refused.send(wire.Mode.CMD.to_bytes(4, "big"))
        assert await refused.closed() == b""
        assert broker.limits.refused["connections_per_address"] == 1
        # Another address is served.
        cmd = await _open_from(broker.port, "127.0.0.2")
        await cmd.send(
            wire.Mode.CMD.to_bytes(4, "big") + wire.encode(wire.AuthPlain(b"b", b"", b""))
        )
        assert isinstance(await cmd.frame(), wire.AuthResponse)
        await cmd.close()
        assert await session.status()  # the first address's session still works
        for conn in held:
            await conn.close()
        await session.close()
        await wait_for(lambda: broker.limits.connections == 0)
        await assert_broker_serves(broker)  # four from 127.0.0.1 again


async def test_refusals_are_counted_in_metrics(settings: Settings) -> None:
    settings.max_queues_per_user = 1
    async with Broker(settings) as broker:
        assert isinstance(await _auth(broker.port, b"u", b"a\0mem:permanent"), wire.AuthResponse)
        assert await _auth(broker.port, b"u", b"b\0mem:permanent") == wire.ErrorReply(
            QUEUES_PER_USER_TEXT
        )
        bad = await RawConn.open(broker.port)
        await bad.send(b"\xde\xad\xbe\xef")
        await bad.closed()
        conn = await RawConn.open(broker.port)
        await conn.send(b"GET /metrics HTTP/1.0\r\n\r\n")
        body = (await conn.closed()).decode()
        assert 'fq_refused_total{reason="queues_per_user"} 1.0' in body
        assert 'fq_bad_input_total{frontend="preamble"} 1.0' in body


# --- the descriptor limit, for real -------------------------------------------------------

NOFILE = 64
RUN_ASYNCIO = (
    "import asyncio, sys\n"
    "from fqbroker.cli.fqd import _configure_logging, _run, settings_from_args\n"
    "s = settings_from_args(sys.argv[1:])\n"
    "_configure_logging(s.debug)\n"
    "asyncio.run(_run(s))\n"
)


def _few_descriptors() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


async def _start(tmp_path: Path, loop: str, conf: str) -> tuple[Proc, int]:
    (tmp_path / "fqd.toml").write_text("[fqd]\n" + conf)
    args = (
        "-p", "0", "-n", "10.254.254.1", "--config", str(tmp_path / "fqd.toml"),
        "-c", str(tmp_path / "fqd.sqlite"), "-q", str(tmp_path / "queues"),
    )  # fmt: skip
    if loop == "uvloop":
        fqd = await Proc.start("-m", "fqbroker", *args, preexec_fn=_few_descriptors)
    else:
        fqd = await Proc.start("-c", RUN_ASYNCIO, *args, preexec_fn=_few_descriptors)
    line = await fqd.wait_stderr("Listening on port: ")
    return fqd, int(line.rsplit(" ", 1)[1])


async def _stop(fqd: Proc) -> str:
    fqd.proc.send_signal(signal.SIGTERM)
    async with asyncio.timeout(TIMEOUT):
        _, _, err = await fqd.finish()
    return err


async def _http_ok(conn: RawConn) -> None:
    await conn.send(b"GET /stats.json HTTP/1.1\r\nhost: x\r\n\r\n")
    async with asyncio.timeout(TIMEOUT):
        head = await conn.reader.readuntil(b"\r\n\r\n")
        length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
        await conn.reader.readexactly(length)
    assert head.startswith(b"HTTP/1.1 200"), head


async def test_at_the_connection_limit_below_the_descriptor_limit(tmp_path: Path) -> None:
    """The default limit comes from RLIMIT_NOFILE and stops short of it: over it, clear
    answers, while sessions already open go on; freed, new ones are served."""
    fqd, port = await _start(tmp_path, "uvloop", "")
    conns: list[RawConn] = []
    try:
        async with asyncio.timeout(60):
            sessions = await _Served.open(port)
            while True:
                conn = await RawConn.open(port)
                await conn.send(b"GET /stats.json HTTP/1.1\r\nhost: x\r\n\r\n")
                head = await conn.reader.readuntil(b"\r\n\r\n")
                if head.startswith(b"HTTP/1.1 503"):
                    await _hang_up(conn)
                    break
                length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
                await conn.reader.readexactly(length)
                conns.append(conn)
                assert len(conns) < NOFILE
            assert len(conns) + 4 == connection_limit_for(NOFILE)
            await sessions.assert_served(b"still served")
            for conn in conns:
                await _hang_up(conn)
            conns.clear()
            fresh = await RawConn.open(port)
            await _http_ok(fresh)
            await fresh.close()
            await sessions.close()
    finally:
        for conn in conns:
            await conn.close()
        err = await _stop(fqd)
    assert "Traceback" not in err
    assert sum("refusing connection" in line for line in err.splitlines()) == 1, err


async def _hang_up(conn: RawConn) -> None:
    """Close, and wait until the broker has closed its end: its descriptor is free."""
    conn.writer.write_eof()
    await conn.closed()


def connection_limit_for(nofile: int) -> int:
    return max(16, nofile - max(64, nofile // 8))


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
async def test_at_the_descriptor_limit(tmp_path: Path, loop: str) -> None:
    """No connection limit short of the descriptors: accepting fails with EMFILE. Who is
    served goes on, a queue file that cannot be opened is an error frame, the log gets
    one line, and once descriptors free new connections are served again."""
    pytest.importorskip(loop)
    conf = "max_connections = 100000\ndisk_queues_per_second = 0\n"
    fqd, port = await _start(tmp_path, loop, conf)
    conns: list[RawConn] = []
    try:
        async with asyncio.timeout(60):
            sessions = await _Served.open(port)
            await sessions.assert_served(b"before")  # both data channels are paired
            descriptors = _descriptors(fqd)
            waiting = await RawConn.open(port)  # asks for a disk queue at the limit
            await waiting.send(wire.Mode.CMD.to_bytes(4, "big"))
            full = asyncio.ensure_future(
                fqd.wait_stderr("cannot accept connections", anywhere=True)
            )
            pending: RawConn | None = None
            while pending is None:
                conn = await RawConn.open(port)
                served = asyncio.ensure_future(_http_ok(conn))
                done, _ = await asyncio.wait({served, full}, return_when=asyncio.FIRST_COMPLETED)
                if served in done and served.exception() is None:
                    conns.append(conn)
                    assert len(conns) < NOFILE
                elif served in done:  # uvloop: accepted and closed at once
                    await conn.close()
                    break
                else:  # asyncio: accepting paused; the connection waits in the backlog
                    pending, pending_reply = conn, served
            if pending is None:
                full.cancel()
            # Who is served goes on.
            await sessions.assert_served(b"still served")
            # A queue file that cannot be opened is fq's error frame.
            await waiting.send(wire.encode(wire.AuthPlain(b"d", b"dq\0disk", b"")))
            assert await waiting.frame() == wire.ErrorReply("initialization of disk queue failed")
            await waiting.closed()
            # Descriptors free: served again.
            for conn in conns:
                await _hang_up(conn)
            conns.clear()
            if pending is not None:
                await pending_reply
                await pending.close()
            fresh = await RawConn.open(port)
            await _http_ok(fresh)
            await _hang_up(fresh)
            # Nothing leaked: the failed queue opening and the refusals gave all back.
            assert _descriptors(fqd) <= descriptors
            disk = await open_session(port, b"d", b"dq\0disk")
            await disk.close()
            await sessions.close()
    finally:
        for conn in conns:
            await conn.close()
        err = await _stop(fqd)
    assert "Traceback" not in err, err
    assert sum("cannot accept" in line for line in err.splitlines()) <= 1, err


def _descriptors(fqd: Proc) -> int:
    return len(os.listdir(f"/proc/{fqd.proc.pid}/fd"))


async def test_fqd_takes_the_descriptor_limit_it_is_allowed(
    tmp_path: Path, procs: list[Proc]
) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard <= 256:
        pytest.skip("needs a finite hard descriptor limit above 256")

    def low_soft_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))

    fqd, _ = await Proc.start_fqd(tmp_path, preexec_fn=low_soft_limit)
    procs.append(fqd)
    limits = Path(f"/proc/{fqd.proc.pid}/limits").read_text()
    line = next(x for x in limits.splitlines() if x.startswith("Max open files"))
    assert line.split()[3:5] == [str(hard), str(hard)]


class _Sink:
    """A bind target: the router only keeps it, routing nothing to it here."""

    policy = None


def test_bindings_are_counted_until_they_go(settings: Settings) -> None:
    from fqbroker.core.router import Router

    settings.max_bindings_per_queue = 3
    settings.max_bindings_per_user = 5
    limits, router = Limits(settings, {}), Router()
    one, two = _Sink(), _Sink()

    def bind(queue: object, program: bytes) -> bool:
        if limits.bound(router, b"ex", program, queue) is not None:  # type: ignore[arg-type]
            return True
        if not limits.admit_binding(b"ex", queue, b"u"):  # type: ignore[arg-type]
            return False
        limits.charge_binding(b"u", router.bind(b"ex", program, queue))  # type: ignore[arg-type]
        return True

    assert [bind(one, b'prefix:"%d"' % i) for i in range(4)] == [True, True, True, False]
    assert bind(one, b'prefix:"0"\0trailing')  # the same program as fq reads it: no new rule
    assert [bind(two, b'prefix:"%d"' % i) for i in range(3)] == [True, True, False]
    assert limits.refused == {"bindings_per_queue": 1, "bindings_per_user": 1}
    # Unbinding, or the queue going, gives the room back.
    (first, *_) = [b for b in router.bindings() if b.queue is one]
    assert router.unbind(b"ex", first.route_id, one) is not None
    assert bind(two, b'prefix:"9"')
    router.unbind_queue(one)
    assert [bind(two, b'prefix:"%d"' % i) for i in (10, 11)] == [False, False]  # queue full
    assert bind(_Sink(), b'prefix:"x"')
