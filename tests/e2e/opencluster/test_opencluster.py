"""The OpenCluster listener against real sockets: a session as the 2011 C client runs it,
every command's reply, values and expiry, restarts (clean, and kill -9 of a real fqd),
bad input per limit closing only that connection, flow control and max_keys.

The broker is driven with the wire codec's encoders over raw sockets, as the 2011 client
would send its frames; the vectors are the protocol's (docs/opencluster-protocol.md). Its
settings, and the listener over TLS: test_opencluster_settings.py."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fqbroker.protocols.opencluster import wire
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from fqbroker.storage.kv.journal import journal_path
from fqbroker.storage.kv.store import KVStore
from tests.conftest import TIMEOUT, on, port_of, running, wait_for
from tests.procs import Proc

pytestmark = pytest.mark.on("opencluster")


@pytest.fixture
def oc(broker_on: Broker) -> Broker:
    return broker_on


def store_of(broker: Broker) -> KVStore:
    state = broker.front_ends["opencluster"].state
    assert isinstance(state, KVStore)
    return state


def h(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


HELLO_REPLY = h(
    "0001 000a 00000000 00000000"  # ack of hello
    "0064 0000 00000000 00000004 00000000"  # serverlist push (user id 0), count 0
    "006e 0000 00000001 00000088 0000000f 00000010"  # hashmasks push (user id 1)
    + "".join(f"{bucket:08x} 00000000" for bucket in range(16))
)
GOLDEN_SET = h(
    "07d0 0000 00000000 00000020 00000000 0a6f8dc5 00000000 00000000 00000008"
    "7465737464617461 0000002d"
)


class Conn:
    """A raw client connection: frames out, frames back read by their headers."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Conn:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def send(self, *frames: bytes) -> None:
        self.writer.write(b"".join(frames))
        await self.writer.drain()

    async def frame(self) -> wire.Frame:
        async with asyncio.timeout(TIMEOUT):
            header = await self.reader.readexactly(wire.HEADER_SIZE)
            command, repcmd, userid, size = struct.unpack(">hhii", header)
            return wire.Frame(command, repcmd, userid, await self.reader.readexactly(size))

    async def frames(self, n: int) -> list[wire.Frame]:
        return [await self.frame() for _ in range(n)]

    async def raw(self, n: int) -> bytes:
        async with asyncio.timeout(TIMEOUT):
            return await self.reader.readexactly(n)

    async def closed_by_broker(self) -> None:
        async with asyncio.timeout(TIMEOUT):
            assert await self.reader.read() == b""

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


@pytest.fixture
async def conn(oc: Broker) -> AsyncIterator[Conn]:
    c = await Conn.open(port_of(oc, "opencluster"))
    yield c
    await c.close()


async def get_int(c: Conn, name: bytes, userid: int = 0) -> int | None:
    await c.send(wire.get_int(userid, name))
    f = await c.frame()
    if f.command == wire.FAIL:
        return None
    assert (f.command, f.repcmd, f.userid) == (wire.DATA_INT, wire.GET_INT, userid)
    return wire.decode_data_int(f.payload)[2]


async def get_string(c: Conn, name: bytes, userid: int = 0) -> bytes | None:
    await c.send(wire.get_string(userid, name))
    f = await c.frame()
    if f.command == wire.FAIL:
        return None
    assert (f.command, f.repcmd, f.userid) == (wire.DATA_STR, wire.GET_STRING, userid)
    return wire.decode_data_str(f.payload)[2]


async def acked(c: Conn, *frames: bytes) -> None:
    """Send sets; every one acknowledged, in order."""
    await c.send(*frames)
    for f, sent in zip(await c.frames(len(frames)), frames, strict=True):
        command, _, userid, _ = struct.unpack_from(">hhii", sent)
        assert (f.command, f.repcmd, f.userid, f.payload) == (wire.ACK, command, userid, b"")


# --- the 2011 C client --------------------------------------------------------------------


async def test_a_session_as_the_2011_c_client_runs_it(oc: Broker) -> None:
    loop = asyncio.get_running_loop()
    with socket.socket() as sock:
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", port_of(oc, "opencluster")))
        await loop.sock_sendall(sock, wire.hello(0))
        async with asyncio.timeout(TIMEOUT):
            # One recv: the C client reads hello's ack and both pushes in one read.
            assert await loop.sock_recv(sock, 65536) == HELLO_REPLY
            # It acknowledges the hashmasks push with repcmd 100, and reuses user id 0.
            await loop.sock_sendall(sock, wire.encode_frame(wire.ACK, wire.SERVERLIST, 1))
            await loop.sock_sendall(sock, GOLDEN_SET)
            assert await loop.sock_recv(sock, 65536) == h("0001 07d0 00000000 00000000")
            await loop.sock_sendall(sock, h("0834 0000 00000000 00000008 00000000 0a6f8dc5"))
            assert await loop.sock_recv(sock, 65536) == h(
                "0839 0834 00000000 0000000c 00000000 0a6f8dc5 0000002d"
            )
            await loop.sock_sendall(sock, wire.get_int(0, b"clientname"))
            assert await loop.sock_recv(sock, 65536) == h("0002 0834 00000000 00000000")
            # A second hello: the pushes go on counting.
            await loop.sock_sendall(sock, wire.hello(0))
            reply = b""
            while len(reply) < len(HELLO_REPLY):
                reply += await loop.sock_recv(sock, 65536)
            assert struct.unpack_from(">hhi", reply, 12) == (wire.SERVERLIST, 0, 2)
            assert struct.unpack_from(">hhi", reply, 28) == (wire.HASHMASKS, 0, 3)
            await loop.sock_sendall(sock, wire.goodbye(0))
            assert await loop.sock_recv(sock, 65536) == h("0001 0014 00000000 00000000")
            assert await loop.sock_recv(sock, 65536) == b""  # closed after the ack
    assert store_of(oc).get(wire.fnv1a32(b"testdata")) is not None


# --- every command ------------------------------------------------------------------------


async def test_control_commands_are_acked_and_the_unspecified_answered_unknown(
    conn: Conn,
) -> None:
    await conn.send(
        wire.ping(7),
        wire.shuttingdown(8),
        wire.serverhello(9, b"10.0.0.1:13600"),
        *(wire.capabilities(10, c) for c in (wire.SET_INT, wire.GET_STRING, wire.HELLO)),
        *(wire.capabilities(11, c) for c in (wire.LOCK, wire.SET_LONG, 4242, wire.HASHMASKS)),
    )
    replies = await conn.frames(10)
    assert [(f.command, f.repcmd, f.userid) for f in replies] == [
        (wire.ACK, wire.PING, 7),
        (wire.ACK, wire.SHUTTINGDOWN, 8),
        (wire.ACK, wire.SERVERHELLO, 9),
        *[(wire.ACK, wire.CAPABILITIES, 10)] * 3,
        *[(wire.FAIL, wire.CAPABILITIES, 11)] * 4,
    ]
    never = sorted(wire.NEVER_SPECIFIED)
    # Commands that never had a format, ids nobody defined, server pushes sent to us.
    others = [*never, 7777, -5, wire.SERVERLIST, wire.HASHMASK]
    await conn.send(*(wire.encode_frame(c, 0, 40 + i) for i, c in enumerate(others)))
    replies = await conn.frames(len(others))
    assert [(f.command, f.repcmd, f.userid, f.payload) for f in replies] == [
        (wire.UNKNOWN, c, 40 + i, b"") for i, c in enumerate(others)
    ]
    # Replies from the client (to pushes, whatever repcmd) are ignored: the next
    # answer is the ping's.
    await conn.send(
        wire.ack(wire.HASHMASKS, 1),
        wire.fail(wire.SERVERLIST, 0),
        wire.failinfo(wire.SERVERLIST, 0, 1, b"no"),
        wire.unknown(wire.HASHMASKS, 1),
        wire.ping(99),
    )
    f = await conn.frame()
    assert (f.command, f.repcmd, f.userid) == (wire.ACK, wire.PING, 99)
    await conn.send(wire.goodbye(5), wire.ping(6))  # nothing after goodbye is answered
    f = await conn.frame()
    assert (f.command, f.repcmd, f.userid) == (wire.ACK, wire.GOODBYE, 5)
    await conn.closed_by_broker()


async def test_set_and_get_ints_and_strings(oc: Broker, conn: Conn) -> None:
    await acked(
        conn,
        wire.set_int(1, b"counter", -7),
        wire.set_string(2, b"greeting", b"hello\x00world"),
        wire.set_string(3, b"empty", b""),
        wire.set_int(4, b"counter", 2**31 - 1, map_hash=5),  # another map: another key
    )
    assert await get_int(conn, b"counter", 12) == -7
    assert await get_string(conn, b"greeting") == b"hello\x00world"
    assert await get_string(conn, b"empty") == b""
    await conn.send(wire.get_int(3, b"counter", map_hash=5))
    f = await conn.frame()
    assert wire.decode_data_int(f.payload) == (5, wire.fnv1a32(b"counter"), 2**31 - 1)
    # Not found: fail, echoing the user id.
    await conn.send(wire.get_string(77, b"nothing"), wire.get_int(78, b"nothing"))
    assert [(f.command, f.repcmd, f.userid) for f in await conn.frames(2)] == [
        (wire.FAIL, wire.GET_STRING, 77),
        (wire.FAIL, wire.GET_INT, 78),
    ]
    # The wrong type: failinfo code 1.
    await conn.send(wire.get_string(5, b"counter"), wire.get_int(6, b"greeting"))
    wrong = await conn.frames(2)
    assert [(f.command, f.repcmd, f.userid) for f in wrong] == [
        (wire.FAILINFO, wire.GET_STRING, 5),
        (wire.FAILINFO, wire.GET_INT, 6),
    ]
    for f in wrong:
        code, text = wire.decode_failinfo(f.payload)
        assert code == 1 and text.startswith(b"wrong type: ")
    # A set may change a key's type.
    await acked(conn, wire.set_string(0, b"counter", b"now a string"))
    assert await get_string(conn, b"counter") == b"now a string"
    assert store_of(oc).keys == 4


async def test_a_pipelined_get_sees_the_sets_before_it_and_none_after(conn: Conn) -> None:
    await conn.send(
        wire.set_int(1, b"k", 1),
        wire.get_int(2, b"k"),
        wire.set_int(3, b"k", 2),
        wire.get_int(4, b"k"),
        wire.set_int(5, b"k", 3),
        wire.goodbye(6),
    )
    replies = await conn.frames(6)
    assert [(f.command, f.userid) for f in replies] == [
        (wire.ACK, 1), (wire.DATA_INT, 2), (wire.ACK, 3), (wire.DATA_INT, 4), (wire.ACK, 5),
        (wire.ACK, 6),
    ]  # fmt: skip
    assert wire.decode_data_int(replies[1].payload)[2] == 1
    assert wire.decode_data_int(replies[3].payload)[2] == 2
    await conn.closed_by_broker()  # goodbye behind a set: closed once its ack is written


async def test_half_closed_clients_still_get_their_acks(oc: Broker) -> None:
    c = await Conn.open(port_of(oc, "opencluster"))
    try:
        await c.send(*(wire.set_int(i, b"h%d" % i, i) for i in range(50)))
        c.writer.write_eof()
        replies = await c.frames(50)
        assert [(f.command, f.userid) for f in replies] == [(wire.ACK, i) for i in range(50)]
        await c.closed_by_broker()
    finally:
        await c.close()


# --- expiry and restarts ------------------------------------------------------------------


async def test_expired_keys_are_never_returned_and_are_reclaimed(oc: Broker, conn: Conn) -> None:
    store = store_of(oc)
    await acked(
        conn,
        wire.set_int(0, b"lease", 1, expires=1),
        wire.set_string(0, b"session", b"s", expires=1),
        wire.set_int(0, b"forever", 2, expires=0),
        wire.set_int(0, b"hour", 3, expires=3600),
    )
    assert await get_int(conn, b"lease") == 1
    assert await get_string(conn, b"session") == b"s"
    await wait_for(lambda: store.expired == 2)  # the sweep: within a second or so
    assert store.keys == 2
    assert await get_int(conn, b"lease") is None
    assert await get_string(conn, b"session") is None
    assert await get_int(conn, b"forever") == 2 and await get_int(conn, b"hour") == 3
    # And gone from disk with the next fold of the journals into sqlite.
    import sqlite3

    from fqbroker.frontends.opencluster.frontend import store_path

    def names() -> set[bytes]:
        with sqlite3.connect(store_path(oc.settings)) as db:
            return {row[0] for row in db.execute("SELECT name FROM kv")}

    store.fold_bytes = 1  # the next write starts a fold
    await acked(conn, wire.set_int(0, b"next", 4))
    await wait_for(lambda: names() == {b"forever", b"hour", b"next"})


async def test_values_and_expiry_survive_a_clean_restart(settings: Settings) -> None:
    settings = on(settings, "opencluster")
    async with running(settings) as broker:
        c = await Conn.open(port_of(broker, "opencluster"))
        await acked(
            c,
            wire.set_int(0, b"n", 42),
            wire.set_string(0, b"s", b"\xff" * 1000),
            wire.set_int(0, b"soon", 1, expires=1),
            wire.set_int(0, b"later", 2, expires=3600),
            wire.set_int(0, b"n", 43, map_hash=9),
        )
        # Pipelined sets the broker stops during are committed before it exits.
        c.writer.write(b"".join(wire.set_int(1, b"p%d" % i, i) for i in range(100)))
        await c.writer.drain()
        await wait_for(lambda: store_of(broker).sets == 105)
    await c.close()
    await asyncio.sleep(1.1)  # "soon" expires while the broker is down
    async with running(settings) as broker:
        assert store_of(broker).keys == 104
        c = await Conn.open(port_of(broker, "opencluster"))
        assert await get_int(c, b"n") == 42
        assert await get_string(c, b"s") == b"\xff" * 1000
        assert await get_int(c, b"soon") is None and await get_int(c, b"later") == 2
        await c.send(wire.get_int(0, b"n", map_hash=9))
        assert wire.decode_data_int((await c.frame()).payload)[2] == 43
        assert [await get_int(c, b"p%d" % i) for i in range(100)] == list(range(100))
        await c.close()


async def start_fqd(state: Path, *args: str) -> tuple[Proc, int]:
    fqd, _ = await Proc.start_fqd(state, "--opencluster", "127.0.0.1:0", *args)
    try:
        line = await fqd.wait_stderr("OpenCluster listening on port: ")
    except BaseException:
        fqd.kill()
        await fqd.finish()
        raise
    return fqd, int(line.rsplit(" ", 1)[1])


@pytest.mark.parametrize("sync", ["full", "normal"])
async def test_acknowledged_sets_survive_kill_9_of_fqd(tmp_path: Path, sync: str) -> None:
    """Every acknowledged set is there after SIGKILL, under either sync: "normal" writes
    the WAL at each commit (in the page cache: the kernel keeps it when fqd dies)."""
    conf = tmp_path / "fqd.toml"
    conf.write_text(f'[fqd]\n[opencluster]\nsync = "{sync}"\n')
    fqd, port = await start_fqd(tmp_path, "--config", str(conf))
    try:
        c = await Conn.open(port)
        frames = [wire.set_int(i, b"k%d" % i, i * 3) for i in range(500)]
        frames += [wire.set_string(1000, b"big", b"v" * 100_000, expires=3600)]
        frames += [wire.set_int(1001, b"brief", 1, expires=1)]
        await acked(c, *frames)
        fqd.kill()  # SIGKILL
        await fqd.finish()
        await c.close()
    finally:
        fqd.kill()
    await asyncio.sleep(1.1)
    fqd, port = await start_fqd(tmp_path, "--config", str(conf))
    try:
        c = await Conn.open(port)
        await c.send(*(wire.get_int(i, b"k%d" % i) for i in range(500)))
        values = [wire.decode_data_int(f.payload)[2] for f in await c.frames(500)]
        assert values == [i * 3 for i in range(500)]
        assert await get_string(c, b"big") == b"v" * 100_000
        assert await get_int(c, b"brief") is None  # expired while fqd was down
        await c.close()
    finally:
        fqd.proc.terminate()
        status, _, err = await fqd.finish()
        assert status == 0, err


# --- bad input, limits, flow control ------------------------------------------------------


def _set_with(name: bytes, value: bytes) -> bytes:
    return wire.set_string(0, name, value)


BAD_INPUT = {
    "negative length": wire.encode_frame(wire.PING, 0, 0)[:8] + struct.pack(">i", -1),
    "payload over max_payload": struct.pack(">hhii", wire.SET_STRING, 0, 0, 4097),
    "set fields do not add up": wire.set_int(0, b"k", 1) + b"",
    "name over max_name": _set_with(b"n" * 65, b"v"),
    "value over max_value": _set_with(b"n", b"v" * 2049),
    "get of 7 bytes": wire.encode_frame(wire.GET_INT, 0, 0, b"\x00" * 7),
    "ping with a payload": wire.encode_frame(wire.PING, 0, 0, b"x"),
    "capabilities of 3 bytes": wire.encode_frame(wire.CAPABILITIES, 0, 0, b"abc"),
    "serverhello string past its payload": wire.encode_frame(
        wire.SERVERHELLO, 0, 0, struct.pack(">i", 10) + b"abc"
    ),
    "set name of negative length": wire.encode_frame(
        wire.SET_INT, 0, 0, struct.pack(">IIiii", 0, 1, 0, 0, -3) + b"\x00" * 4
    ),
}
# A set_int with one byte too many: the header says so, the fields do not add up.
_ADDS_UP = wire.set_int(0, b"k", 1)
BAD_INPUT["set fields do not add up"] = (
    _ADDS_UP[:8] + struct.pack(">i", len(_ADDS_UP) - 12 + 1) + _ADDS_UP[12:] + b"\x00"
)


@pytest.mark.parametrize("bad", list(BAD_INPUT), ids=list(BAD_INPUT))
async def test_bad_input_closes_only_that_connection(settings: Settings, bad: str) -> None:
    settings = on(settings, "opencluster", max_name=64, max_value=2048, max_payload=4096)
    async with running(settings) as broker:
        port = port_of(broker, "opencluster")
        good, evil = await Conn.open(port), await Conn.open(port)
        try:
            await acked(good, wire.set_string(0, b"shared", b"still here"))
            # Frames before the bad one are answered; the bad one closes the connection.
            await evil.send(wire.ping(1), wire.set_int(2, b"evil", 1), BAD_INPUT[bad])
            replies = await evil.frames(2)
            assert [(f.command, f.userid) for f in replies] == [(wire.ACK, 1), (wire.ACK, 2)]
            await evil.closed_by_broker()
            assert broker.limits.bad_input["opencluster"] == 1
            assert await get_string(good, b"shared") == b"still here"
        finally:
            await good.close()
            await evil.close()


async def test_max_inflight_stops_reading_until_replies_go_out(settings: Settings) -> None:
    """Past max_inflight unanswered commands the session takes no more frames; all are
    answered, in order, and the queue never holds more."""
    async with running(on(settings, "opencluster", max_inflight=4)) as broker:
        c = await Conn.open(port_of(broker, "opencluster"))
        most = 0
        stop = asyncio.Event()

        async def watch() -> None:
            nonlocal most
            live = broker.front_ends["opencluster"]
            while not stop.is_set():
                for view in live.views():
                    most = max(most, int(dict(view.facts)["inflight"]))
                await asyncio.sleep(0)

        watcher = asyncio.create_task(watch())
        try:
            n = 3000
            frames = []
            for i in range(n):
                frames.append(wire.set_int(i, b"f%d" % (i % 7), i))
                frames.append(wire.get_int(i, b"f%d" % (i % 7)))
            await c.send(*frames)
            replies = await c.frames(2 * n)
            assert [(f.command, f.userid) for f in replies[:2]] == [
                (wire.ACK, 0),
                (wire.DATA_INT, 0),
            ]
            for i in range(n):
                ack, data = replies[2 * i], replies[2 * i + 1]
                assert (ack.command, ack.userid, data.userid) == (wire.ACK, i, i)
                assert wire.decode_data_int(data.payload)[2] == i
        finally:
            stop.set()
            await watcher
            await c.close()
        assert 0 < most <= 4
        assert store_of(broker).commits < n  # group commits: sets share them


async def test_max_keys_refuses_new_keys_with_failinfo_3(settings: Settings) -> None:
    async with running(on(settings, "opencluster", max_keys=3)) as broker:
        c = await Conn.open(port_of(broker, "opencluster"))
        try:
            await acked(c, *(wire.set_int(i, b"k%d" % i, i) for i in range(3)))
            await c.send(wire.set_int(7, b"k3", 3), wire.set_string(8, b"k0", b"changed"))
            full, changed = await c.frames(2)
            assert (full.command, full.repcmd, full.userid) == (wire.FAILINFO, wire.SET_INT, 7)
            assert wire.decode_failinfo(full.payload) == (3, b"store full")
            assert (changed.command, changed.userid) == (wire.ACK, 8)
            assert await get_int(c, b"k3") is None
            assert await get_string(c, b"k0") == b"changed"
        finally:
            await c.close()


async def test_a_failed_commit_answers_not_stored_and_the_store_carries_on(
    oc: Broker, conn: Conn
) -> None:
    store = store_of(oc)
    store.fold_bytes = 1  # a fold after each write: the next one goes to a new journal
    journal_path(store.path, store._journal.gen + 1).symlink_to("/dev/full")  # ENOSPC
    await acked(conn, wire.set_string(0, b"k", b"stored"))
    await conn.send(wire.set_string(1, b"k", b"x" * 200_000), wire.get_string(2, b"k"))
    failed, _ = await conn.frames(2)
    assert (failed.command, failed.repcmd, failed.userid) == (wire.FAILINFO, wire.SET_STRING, 1)
    code, text = wire.decode_failinfo(failed.payload)
    assert code == 2 and text == b"not stored: [Errno 28] No space left on device"
    assert await get_string(conn, b"k") == b"stored"  # memory as the disk has it
    await acked(conn, wire.set_string(3, b"k", b"again"))  # in the journal after it
    assert await get_string(conn, b"k") == b"again"


# --- the machine, without a socket ----------------------------------------------------------


async def test_the_machine_answers_in_order_and_holds_replies_behind_a_set(
    tmp_path: Path,
) -> None:
    from fqbroker.frontends.opencluster.machine import Limits, Machine

    store = KVStore(tmp_path / "kv.sqlite3")
    try:
        machine = Machine(store, Limits(64, 1024, 2048, 3))
        hello = wire.hello(0)
        # Fed a byte at a time: nothing until the frame is whole, then all three at once.
        assert [machine.receive(hello[i : i + 1]) for i in range(11)] == [b""] * 11
        assert machine.receive(hello[11:]) == HELLO_REPLY
        assert machine.receive(GOLDEN_SET + wire.ping(1) + wire.get_int(2, b"testdata")) == b""
        batch = machine.waiting
        assert batch is not None and not batch.done and machine.inflight == 3
        assert machine.full  # max_inflight 3: the shell stops reading
        assert machine.receive(wire.ping(3)) == b""  # buffered, not taken while full
        done = asyncio.Event()
        batch.waiters.append(done.set)
        async with asyncio.timeout(TIMEOUT):
            await done.wait()
        assert machine.committed() == (
            h("0001 07d0 00000000 00000000")
            + wire.ack(wire.PING, 1)
            + h("0839 0834 00000002 0000000c 00000000 0a6f8dc5 0000002d")
            + wire.ack(wire.PING, 3)
        )
        assert machine.waiting is None and not machine.full
        assert machine.receive(wire.goodbye(4) + wire.ping(5)) == wire.ack(wire.GOODBYE, 4)
        assert machine.finished and machine.error is None
    finally:
        await store.close()
