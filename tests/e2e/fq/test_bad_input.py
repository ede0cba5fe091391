"""One test per row of docs/fq-protocol.md §1.9: each bad input gets its specified answer,
the socket is closed promptly (fixing fqd's late close), and another client is then served
normally."""

from __future__ import annotations

import contextlib
import logging
import random
import time

import pytest

from fqbroker.protocols.fq import wire
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import RawConn, open_session, wait_for
from tests.e2e.fq.test_server import assert_broker_serves


@pytest.mark.parametrize("preamble", [b"OPTI", b"\x00\x00\x00\x00", b"\xde\xad\xbe\xef", b"get "])
async def test_unknown_first_bytes_close_silently(broker: Broker, preamble: bytes) -> None:
    conn = await RawConn.open(broker.port)
    await conn.send(preamble + b"ONS / HTTP/1.1\r\n\r\n")
    assert await conn.closed() == b""
    await assert_broker_serves(broker)


async def test_unknown_command_after_auth_closes_promptly(broker: Broker) -> None:
    session = await open_session(broker.port)
    await session.cmd.send(b"\x12\x34")
    assert await session.cmd.closed() == b""  # no error frame, as fqd
    await wait_for(lambda: session.key not in broker.clients)
    await session.data.closed()  # its data channel goes with it
    await assert_broker_serves(broker)


async def test_bind_with_exchange_over_127_closes(broker: Broker) -> None:
    session = await open_session(broker.port)
    await session.cmd.send(wire.encode(wire.BindRequest(0x100, b"e" * 128, b"prefix:")))
    assert await session.cmd.closed() == b""
    await session.data.closed()
    await assert_broker_serves(broker)


async def test_bind_cut_short_then_eof_closes(broker: Broker) -> None:
    session = await open_session(broker.port)
    await session.cmd.send(wire.encode(wire.BindRequest(0x100, b"ex", b"prefix:"))[:-3])
    session.cmd.writer.write_eof()
    assert await session.cmd.closed() == b""
    await wait_for(lambda: session.key not in broker.clients)
    await session.data.closed()
    await assert_broker_serves(broker)


@pytest.mark.parametrize(
    "program",
    [b"nonsense", b'prefix:x (route_contains("a"))', b"prefix:" + b"x" * 121, b'prefix:"abc'],
)
async def test_program_that_does_not_compile_answers_bind_illegal(
    broker: Broker, program: bytes
) -> None:
    session = await open_session(broker.port)
    assert await session.bind(b"ex", program) == wire.BIND_ILLEGAL
    assert await session.bind(b"ex", b"prefix:") == 1  # the session carries on
    await session.close()
    await assert_broker_serves(broker)


async def test_data_channel_with_unknown_key_closes_silently(broker: Broker) -> None:
    conn = await RawConn.open(broker.port)
    await conn.send(wire.encode_hello(wire.Mode.DATA, b"k" * 127))
    assert await conn.closed() == b""
    await assert_broker_serves(broker)


async def test_second_data_channel_for_a_key_closes_silently(broker: Broker) -> None:
    session = await open_session(broker.port)
    await wait_for(lambda: broker.clients[session.key].data is not None)
    second = await RawConn.open(broker.port)
    await second.send(wire.encode_hello(wire.Mode.DATA, session.key))
    assert await second.closed() == b""
    # The first data channel still works.
    await session.bind(b"ex", b"prefix:")
    publisher = await open_session(broker.port)
    await publisher.publish(b"ex", b"r", b"first channel")
    assert [m.payload for m in await session.receive()] == [b"first channel"]
    await session.close()
    await publisher.close()
    await assert_broker_serves(broker)


def _publish_frame(ex: bytes, route: bytes, payload: bytes) -> bytes:
    return (
        bytes([len(ex)])
        + ex
        + bytes([len(route)])
        + route
        + bytes(16)
        + len(payload).to_bytes(4, "big")
        + payload
    )


BAD_FRAMES = [
    ("exchange over 127", wire.Mode.DATA, b"\x80" + b"e" * 128),
    ("route over 127", wire.Mode.DATA, b"\x02ex\xff" + b"r" * 255),
    ("sender over 127", wire.Mode.OLD_PEER, b"\x02ex\x01r" + bytes(16) + b"\x80" + b"s" * 128),
    ("hops over 32", wire.Mode.OLD_PEER, b"\x02ex\x01r" + bytes(16) + b"\x01s\x21" + bytes(132)),
]


@pytest.mark.parametrize(
    ("mode", "frame"), [(m, f) for _, m, f in BAD_FRAMES], ids=[n for n, _, _ in BAD_FRAMES]
)
async def test_bad_data_frame_closes_only_the_data_channel(
    broker: Broker, mode: wire.Mode, frame: bytes
) -> None:
    consumer = await open_session(broker.port, b"watcher")
    await consumer.bind(b"ex", b"prefix:")
    session = await open_session(broker.port, b"offender")
    await session.data.close()
    await wait_for(lambda: broker.clients[session.key].data is None)
    data = await RawConn.open(broker.port)
    await data.send(wire.encode_hello(mode, session.key))
    await wait_for(lambda: broker.clients[session.key].data is not None)
    # A good message first: what was handed over before the bad frame is not lost.
    good = (
        _publish_frame(b"ex", b"r", b"before")
        if mode is wire.Mode.DATA
        else (b"\x02ex\x01r" + bytes(16) + b"\x01s\x00" + b"\x00\x00\x00\x06before")
    )
    await data.send(good + frame)
    assert await data.closed() == b""
    assert [m.payload for m in await consumer.receive()] == [b"before"]
    # The command session survives; with no data channel its status is only dropped_in.
    assert await session.status() == {"dropped_in": 0, "confirm": 1, "dedup": 1}
    await session.close()
    await consumer.close()
    await assert_broker_serves(broker)


async def test_payload_over_the_limit_is_dropped_and_counted(tmp_path) -> None:  # type: ignore[no-untyped-def]
    settings = Settings(
        port=0, node_id="10.254.254.1", config_db=tmp_path / "db", max_message_size=1000
    )
    async with Broker(settings) as broker:
        consumer = await open_session(broker.port)
        await consumer.bind(b"ex", b"prefix:")
        publisher = await open_session(broker.port)
        await publisher.data.send(
            _publish_frame(b"ex", b"r", b"a")
            + _publish_frame(b"ex", b"r", b"x" * 5000)
            + _publish_frame(b"ex", b"r", b"b")
        )
        got = await consumer.receive(2)
        assert [m.payload for m in got] == [b"a", b"b"]
        status = await publisher.status()
        assert (status["size_dropped"], status["msgs_in"], status["routed"]) == (1, 2, 2)
        assert broker.router.aggregate.size_dropped == 1
        await consumer.close()
        await publisher.close()
        await assert_broker_serves(broker)


AUTH_FAILURES = [
    ("auth command expected", b"\xb1\x70\x00\x00"),
    ("unsupported auth method", b"\xaa\xaa\x00\x07"),
    ("user name is too long", wire.encode(wire.AuthPlain(b"u" * 128, b"q"))),
    ("queue detail is too long", wire.encode(wire.AuthPlain(b"u", b"q" * 1024))),
    ("queue name is too long", wire.encode(wire.AuthPlain(b"u", b"q" * 128))),
    ("queue name is too long", wire.encode(wire.AuthPlain(b"u", b"q" * 200 + b"\x00mem"))),
    ("pass field is too long", wire.encode(wire.AuthPlain(b"u", b"q", b"p" * 10241))),
    ("invalid queue type: ", wire.encode(wire.AuthPlain(b"u", b"bob\x00:public"))),
    ("invalid queue type: jlog", wire.encode(wire.AuthPlain(b"u", b"bob\x00jlog"))),
    ("invalid queue param:  drop", wire.encode(wire.AuthPlain(b"u", b"bob\x00mem:public, drop"))),
    ("invalid queue param: Public", wire.encode(wire.AuthPlain(b"u", b"bob\x00mem:Public"))),
]


@pytest.mark.parametrize(
    ("text", "request_bytes"), AUTH_FAILURES, ids=[t for t, _ in AUTH_FAILURES]
)
async def test_failed_auth_sends_the_error_then_closes(
    broker: Broker, text: str, request_bytes: bytes
) -> None:
    conn = await RawConn.open(broker.port)
    # Send more than the server reads: the error must still arrive (no RST,
    # docs/fq-protocol.md §1.8).
    await conn.send(wire.Mode.CMD.to_bytes(4, "big") + request_bytes + b"\x00" * 20000)
    assert await conn.frame() == wire.ErrorReply(text)
    assert await conn.closed() == b""
    await assert_broker_serves(broker)


async def test_auth_cut_short_gives_auth_method_read_failed(broker: Broker) -> None:
    conn = await RawConn.open(broker.port)
    await conn.send(wire.Mode.CMD.to_bytes(4, "big") + b"\xaa\xaa")
    conn.writer.write_eof()
    assert await conn.frame() == wire.ErrorReply("auth method read failed")
    assert await conn.closed() == b""
    await assert_broker_serves(broker)


async def test_a_silent_connection_is_closed_after_the_sniff_timeout(tmp_path) -> None:  # type: ignore[no-untyped-def]
    settings = Settings(
        port=0, node_id="10.254.254.1", config_db=tmp_path / "db", idle_sniff_timeout=0.2
    )
    async with Broker(settings) as broker:
        conn = await RawConn.open(broker.port)
        await conn.send(b"\xcc\x50")
        assert await conn.closed() == b""
        await assert_broker_serves(broker)


def garbage(seed: int, n: int, first: bytes = b"") -> bytes:
    """``n`` reproducible random bytes after ``first``, never starting an auth command."""
    rng = random.Random(seed)
    data = first + rng.randbytes(n)
    if data[:2] == b"\xaa\xaa" and not first:
        data = b"\x00" + data[1:]
    return data


GARBAGE_BEFORE_AUTH = [
    # What arrives where the auth request should be, and fqd's answer
    # (docs/fq-protocol.md §1.3, §1.9).
    ("random bytes", garbage(1, 4096), "auth command expected"),
    ("a heartbeat", wire.encode(wire.Heartbeat()), "auth command expected"),
    ("a status request", wire.encode(wire.StatusRequest()), "auth command expected"),
    ("a bind", wire.encode(wire.BindRequest(0x100, b"ex", b"prefix:")), "auth command expected"),
    ("http", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "auth command expected"),
    ("auth then garbage", garbage(2, 4096, b"\xaa\xaa\x7f"), "unsupported auth method"),
]


@pytest.mark.parametrize(
    ("data", "text"),
    [(d, t) for _, d, t in GARBAGE_BEFORE_AUTH],
    ids=[name for name, _, _ in GARBAGE_BEFORE_AUTH],
)
async def test_garbage_on_the_command_channel_before_auth(
    broker: Broker, data: bytes, text: str
) -> None:
    # The command hello, then garbage instead of the auth request, its first byte alone so
    # the broker must wait for more: the error frame, the close, nothing else.
    conn = await RawConn.open(broker.port)
    await conn.send(wire.Mode.CMD.to_bytes(4, "big") + data[:1])
    with contextlib.suppress(ConnectionError):
        await conn.send(data[1:])  # the broker may answer and close while this is in flight
    assert await conn.frame() == wire.ErrorReply(text)
    assert await conn.closed() == b""
    assert broker.clients == {}  # nothing was registered for it
    await assert_broker_serves(broker)


# --- no traceback from the network (docs/limits.md) -----------------------------------------


def _assert_quiet(caplog: pytest.LogCaptureFixture) -> None:
    """At most one log line, and no traceback, for one bad input."""
    records = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert not [r for r in records if r.exc_info], caplog.text
    assert "Traceback" not in caplog.text
    assert len(records) <= 1, caplog.text


@pytest.mark.parametrize(
    "hello",
    [
        wire.Mode.DATA.to_bytes(4, "big") + (200).to_bytes(2, "big") + b"k" * 200,
        wire.Mode.PEER.to_bytes(4, "big") + b"\x0a\x00\x00\x01" + (200).to_bytes(2, "big"),
        wire.Mode.OLD_PEER.to_bytes(4, "big") + (200).to_bytes(2, "big") + b"k" * 200,
    ],
    ids=["data", "peer", "old-peer"],
)
async def test_hello_with_an_overlong_key_closes_without_a_traceback(
    broker: Broker, caplog: pytest.LogCaptureFixture, hello: bytes
) -> None:
    caplog.set_level(logging.INFO)
    conn = await RawConn.open(broker.port)
    await conn.send(hello + b"k" * 200)
    assert await conn.closed() == b""
    await wait_for(lambda: broker.limits.bad_input["data"] == 1)
    _assert_quiet(caplog)
    await assert_broker_serves(broker)


async def test_head_with_a_bad_chunked_body_answers_400_without_a_traceback(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    conn = await RawConn.open(broker.port)
    await conn.send(b"HEAD / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
    reply = await conn.closed()
    assert reply.startswith(b"HTTP/1.1 400 "), reply
    assert reply.endswith(b"\r\n\r\n")  # a HEAD reply has no body, an error's neither
    await wait_for(lambda: not broker._http_tasks)
    _assert_quiet(caplog)
    await assert_broker_serves(broker)


async def test_http_10_request_closed_before_the_reply_logs_no_traceback(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    for _ in range(20):  # the close must overtake the reply; it does nearly every time
        conn = await RawConn.open(broker.port)
        await conn.send(b"GET /stats.json HTTP/1.0\r\n\r\n")
        conn.writer.transport.abort()  # closed before the reply: the reply meets a reset
        await wait_for(lambda: not broker._http_tasks)
    _assert_quiet(caplog)
    await assert_broker_serves(broker)


async def test_a_flood_of_bad_input_is_counted_and_logged_a_few_lines_a_second(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    start = time.monotonic()
    for _ in range(50):
        conn = await RawConn.open(broker.port)
        await conn.send(b"\xde\xad\xbe\xef")
        assert await conn.closed() == b""
    await wait_for(lambda: broker.limits.bad_input["preamble"] == 50)
    elapsed = time.monotonic() - start
    lines = [r for r in caplog.records if "unknown preamble" in r.getMessage()]
    # At most log_lines_per_second in any second the flood lasted.
    assert len(lines) <= broker.settings.log_lines_per_second * (elapsed + 1)
    await assert_broker_serves(broker)


async def test_replay_read_with_a_5000_digit_position_answers_400(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    session = await open_session(broker.port, b"u", b"dq\0disk")
    conn = await RawConn.open(broker.port)
    await conn.send(b"GET /queue/read?queue=dq&from=%s HTTP/1.0\r\n\r\n" % (b"9" * 5000))
    reply = await conn.closed()
    assert reply.startswith(b"HTTP/1.1 400 "), reply
    assert reply.endswith(b"\"'from' must be a non-negative integer\"}\n")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    await session.close()
