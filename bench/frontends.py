"""The broker's front ends as the fuzzer sees them: one :class:`FrontEnd` entry each.

An entry says how to reach the front end (TCP or UDP, and which port), how to open a
session whose opening bytes may themselves be mutated, how to generate one valid frame, how
to mutate one, and a normal round trip that must succeed however hard the front end is
being fuzzed. :data:`FRONT_ENDS` is made from the broker's table of front ends
(fqbroker/server/frontends.py): each front end names its entries (``FrontEnd.fuzz``) and
says how it is reached, TCP or UDP, on the fq port or on a port of its own, found in
``Target.ports[name]`` from the broker's /frontends.json; :data:`SCENARIOS` holds what
each named entry does (tests/server/test_frontends.py fails while a front end of the table names
none, or one missing here). Nothing else in the fuzzer changes.

Every random choice of a session comes from the ``random.Random`` it is given, so a
session replayed with the same seed sends the same bytes (apart from the key a data socket
gets from the broker): that is how findings are reproduced (bench/fuzz.py).

Today's entries, all on the fq port (frame formats: fqbroker/protocols/fq/wire.py,
docs/confirms.md):

* ``fq-command``: the command socket, auth then commands;
* ``fq-data``: a data socket paired with a command socket, publisher-format messages;
* ``fq-peer``: a data socket in peer mode (new or old magic), peer-format messages;
* ``http``: HTTP/1.1 requests, pipelined on one connection.

And on a port of its own, which every broker child turns on (bench/child.py
``own_port_args``):

* ``lumberjack``: Lumberjack v1 and v2 streams (windows, plain and zlib-compressed data
  frames; fqbroker/protocols/lumberjack/encoder.py ``sample_frames``), published into the
  ``logging`` exchange;
* ``figg``: Figg frames (ATTACH with and without an offset, PUBLISH runs, PING, DETACH;
  fqbroker/protocols/figg/wire.py), publishing into retained topics of the ``figg``
  exchange and replaying them;
* ``fyrehose``: over UDP, one datagram per frame, every datagram of
  fqbroker/protocols/fyrehose/wire.py (PUSH and KEEPALIVE in both forms, REQUEST, and the
  DELIVER, FORWARD and KEEPALIVE-ACK a broker never expects), mutated up to the largest
  datagram; every address the fuzzer names stays on this machine (bench/fyrehosefuzz.py);
* ``opencluster``: Nov-2011 OpenCluster frames, every command of
  fqbroker/protocols/opencluster/wire.py and those that never had a format, with lengths
  mutated past every limit; the round trip is hello, then a set_string and get_string of
  a unique key (bench/ocfuzz.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import struct
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from fqbroker.clients.fq.client import Client, ClientError
from fqbroker.core.message import Message
from fqbroker.frontends.kit.component import Datagrams, Sniffed
from fqbroker.frontends.kit.component import FrontEnd as TableEntry
from fqbroker.protocols.figg import wire as figg
from fqbroker.protocols.fq import wire
from fqbroker.protocols.lumberjack import encoder as lumberjack
from fqbroker.server.frontends import FRONT_ENDS as BROKER_FRONT_ENDS

from .child import http_reply
from .fuzzconn import NOTES, SEND_SECONDS, Conn, Target, connect_tcp, mutate_bytes
from .fyrehosefuzz import fyrehose_frame, mutate_fyrehose, open_fyrehose, round_trip_fyrehose
from .ocfuzz import (
    mutate_opencluster,
    open_opencluster,
    opencluster_frame,
    round_trip_opencluster,
)

__all__ = [
    "FRONT_ENDS",
    "NOTES",
    "SCENARIOS",
    "Conn",
    "FrontEnd",
    "Scenario",
    "Target",
    "auth_key",
    "connect_tcp",
    "entries",
    "mutate_bytes",
]

# --- the fq command socket ----------------------------------------------------------------

EXCHANGES = [b"fz.%d" % i for i in range(8)]
PROGRAMS = [
    b"prefix:",
    b'prefix:"a."',
    b'exact:"a.b"',
    b'prefix:"" (and)',
    b'prefix:"x" (or (route_prefix "y"))',
    b"bogus:",
    b"",
]
QUEUE_FIELDS = [b"fzq%d\x00mem:public,drop,backlog=1000" % i for i in range(6)] + [
    b"fzdisk\x00disk:public,drop,backlog=1000",
    b"\x00mem:private,backlog=10",
]


def auth_frame(rng: random.Random) -> bytes:
    user = b"fz%d" % rng.randrange(16)
    return wire.encode(wire.AuthPlain(user, rng.choice(QUEUE_FIELDS), b"pw"))


def command_frame(rng: random.Random) -> bytes:
    """One valid command after auth (never a permanent binding: it would outlive the run)."""
    kind = rng.randrange(10)
    if kind < 3:
        return wire.encode(wire.Heartbeat())
    if kind == 3:
        return wire.encode(wire.HeartbeatRequest(rng.choice((0, 0, 1000, 5000, 60000))))
    if kind < 6:
        return wire.encode(wire.StatusRequest())
    if kind < 8:
        flags = rng.choice((wire.BindFlags.TRANS, 0))
        return wire.encode(wire.BindRequest(flags, rng.choice(EXCHANGES), rng.choice(PROGRAMS)))
    if kind == 8:
        return wire.encode(wire.UnbindRequest(rng.randrange(64), rng.choice(EXCHANGES)))
    return wire.encode(wire.ConfirmRequest(rng.randrange(4)))


def mutate_command(rng: random.Random, frame: bytes) -> bytes:
    if rng.random() < 0.3:
        # A known command code with a body meant for another, or none.
        return struct.pack(">H", rng.choice(list(wire.Cmd))) + rng.randbytes(rng.randrange(24))
    return mutate_bytes(rng, frame)


async def open_command(t: Target, rng: random.Random, mutate_opening: bool) -> Conn:
    conn = await connect_tcp(t.host, t.fq_port)
    opening = wire.encode_hello(wire.Mode.CMD, b"")[:4] + auth_frame(rng)
    if mutate_opening:
        opening = mutate_command(rng, opening) if rng.random() < 0.5 else mutate_bytes(rng, opening)
    await conn.send(opening)
    return conn


async def round_trip_command(t: Target) -> None:
    async with Client(t.host, t.fq_port, source="rtc/rtcmd/mem:private", reconnect=False) as c:
        status = await c.status()
        if wire.CONFIRM_STATUS_KEY not in status:
            raise AssertionError(f"status without the confirm key: {status}")
        route = await c.bind(b"rt.cmd", b"prefix:")
        if route == wire.BIND_ILLEGAL:
            raise AssertionError("a valid bind was refused")


# --- the fq data and peer sockets ---------------------------------------------------------


async def auth_key(reader: asyncio.StreamReader, seconds: float) -> bytes:
    """The key the broker answers an authentication with on a command socket, within
    ``seconds``; its error reply, or the socket closing first, is a ConnectionError."""
    decoder = wire.ClientCommandDecoder()
    async with asyncio.timeout(seconds):
        while True:
            chunk = await reader.read(4096)
            if not chunk:
                raise ConnectionError("the broker closed the command socket at auth")
            decoder.feed(chunk)
            while (frame := decoder.next_frame()) is not None:
                if isinstance(frame, wire.AuthResponse):
                    return frame.key
                if isinstance(frame, wire.ErrorReply):
                    raise ConnectionError(frame.text)


async def _paired(t: Target, rng: random.Random, mode: wire.Mode, mutate_opening: bool) -> Conn:
    """A command session, authenticated, and a data socket opened with its key."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(t.host, t.fq_port), SEND_SECONDS
    )
    writer.write(wire.encode_hello(wire.Mode.CMD, b"")[:4] + auth_frame(rng))
    key = await auth_key(reader, SEND_SECONDS)
    command = Conn(reader, writer)
    data = await connect_tcp(t.host, t.fq_port)
    data.holds.append(command)
    opening = wire.encode_hello(mode, key, bytes([10, 8, rng.randrange(256), 1]))
    if mutate_opening:
        opening = mutate_bytes(rng, opening)
    await data.send(opening)
    return data


def _payload(rng: random.Random) -> bytes:
    size = rng.choice((0, 1, 10, 100, 100, 1000, 4000))
    if rng.random() < 0.002:
        size = 60000
    return rng.randbytes(size)


def _names(rng: random.Random) -> tuple[bytes, bytes]:
    exchange = rng.choice(EXCHANGES) if rng.random() < 0.9 else rng.randbytes(rng.randrange(8))
    route = rng.choice((b"a.b", b"a.c", b"x", b"")) + rng.randbytes(rng.randrange(3))
    return exchange, route


def data_frame(rng: random.Random) -> bytes:
    exchange, route = _names(rng)
    return Message(exchange, route, _payload(rng), rng.randbytes(16)).publish_frame()


def peer_frame(rng: random.Random) -> bytes:
    exchange, route = _names(rng)
    hops = b"".join(bytes([10, 7, rng.randrange(256), 1]) for _ in range(rng.randrange(4)))
    msg = Message(exchange, route, _payload(rng), rng.randbytes(16), b"fzpeer", hops)
    return msg.peer_frame()


async def open_data(t: Target, rng: random.Random, mutate_opening: bool) -> Conn:
    return await _paired(t, rng, wire.Mode.DATA, mutate_opening)


async def open_peer(t: Target, rng: random.Random, mutate_opening: bool) -> Conn:
    mode = wire.Mode.PEER if rng.random() < 0.7 else wire.Mode.OLD_PEER
    return await _paired(t, rng, mode, mutate_opening)


async def _publish_and_receive(t: Target, exchange: bytes, peer_id: bytes | None) -> None:
    body = b"round trip %d" % random.getrandbits(64)
    source = f"rt/rt{exchange.decode()}/mem:private"
    async with Client(t.host, t.fq_port, source=source, reconnect=False) as consumer:
        if await consumer.bind(exchange, b"prefix:") == wire.BIND_ILLEGAL:
            raise AssertionError("a valid bind was refused")
        async with Client(
            t.host, t.fq_port, source="rtpub", reconnect=False, peer_id=peer_id
        ) as publisher:
            publisher.publish(exchange, b"rt", body)
            await confirm(publisher)
        msg = await consumer.receive()
        if msg.payload != body:
            raise AssertionError(f"received {msg.payload[:64]!r}, not {body!r}")


async def confirm(client: Client) -> None:
    """A publisher confirm. A confirm on a fresh connection may be refused with "no data
    channel" when it overtakes the pairing of the data socket (docs/confirms.md): that is
    counted in :data:`NOTES` and the confirm asked again, a few times, after a short wait."""
    for attempt in range(6):
        try:
            await client.confirm()
            return
        except ClientError as exc:
            if exc.text != "no data channel" or attempt == 5:
                raise
            NOTES["confirm on a fresh connection refused: no data channel"] += 1
            await asyncio.sleep(0.01 * 2**attempt)


async def round_trip_data(t: Target) -> None:
    await _publish_and_receive(t, b"rt.data", None)


async def round_trip_peer(t: Target) -> None:
    await _publish_and_receive(t, b"rt.peer", bytes([10, 9, 9, 8]))


# --- HTTP ---------------------------------------------------------------------------------


def http_frame(rng: random.Random) -> bytes:
    """One valid HTTP/1.1 request; never /shutdown, never a permanent change."""
    kind = rng.randrange(20)
    if kind < 6:
        body = _payload(rng)[:2000] or b"x"
        exchange, route = rng.choice(EXCHANGES).decode(), rng.choice(("a.b", "x"))
        expect = "Expect: 100-continue\r\n" if rng.random() < 0.1 else ""
        head = (
            f"POST /submit HTTP/1.1\r\nHost: fz\r\nX-Fq-Exchange: {exchange}\r\n"
            f"X-Fq-Route: {route}\r\n{expect}Content-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body
    path = rng.choice(
        (
            "/stats.json",
            "/stats.json",
            "/metrics",
            "/queue/info?queue=fzdisk",
            "/queue/read?queue=fzdisk&from=1&max_bytes=1000",
            "/add_checkpoint?cpname=fz&qname=fzdisk&chkptid=00000001:00000001",
            "/remove_checkpoint?cpname=fz&qname=fzdisk",
            "/reset_to_checkpoint?cpname=fz&qname=fzq1",
            "/",
            "/nope",
            "/queue/info?queue=",
        )
    )
    method = rng.choice(("GET", "GET", "GET", "HEAD"))
    if "checkpoint" in path and method == "GET":
        method = "POST"  # they take no GET: a fuzzed GET would only ever meet the 405
    return f"{method} {path} HTTP/1.1\r\nHost: fz\r\n\r\n".encode()


HTTP_INSERTS = (
    b"Transfer-Encoding: chunked\r\n",
    b"Content-Length: 99999999999\r\n",
    b"Content-Length: -1\r\n",
    b"Content-Length: 5\r\nContent-Length: 6\r\n",
    b"X-Fq-Exchange: " + b"e" * 200 + b"\r\n",
    b"Connection: close\r\n",
    b"Expect: 100-continue\r\n",
    b"X-" + b"h" * 40000 + b": v\r\n",
)


def mutate_http(rng: random.Random, frame: bytes) -> bytes:
    roll = rng.random()
    if roll < 0.3:
        at = frame.find(b"\r\n") + 2
        return frame[:at] + rng.choice(HTTP_INSERTS) + frame[at:]
    if roll < 0.4:
        return frame.replace(b"HTTP/1.1", rng.choice((b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.1x")), 1)
    return mutate_bytes(rng, frame)


async def open_http(t: Target, rng: random.Random, mutate_opening: bool) -> Conn:
    conn = await connect_tcp(t.host, t.fq_port)
    if mutate_opening:
        await conn.send(mutate_http(rng, http_frame(rng)))
    return conn


async def round_trip_http(t: Target) -> None:
    reader, writer = await asyncio.open_connection(t.host, t.fq_port)
    try:
        writer.write(b"GET /stats.json HTTP/1.1\r\nHost: rt\r\n\r\n")
        status, body = await http_reply(reader)
        if status != 200 or "exchanges" not in json.loads(body):
            raise AssertionError(f"/stats.json: {status} {body[:200]!r}")
        async with Client(t.host, t.fq_port, source="rt/rthttp/mem:private", reconnect=False) as c:
            await c.bind(b"rt.http", b"prefix:")
            payload = b"submitted %d" % random.getrandbits(64)
            writer.write(
                b"POST /submit HTTP/1.1\r\nHost: rt\r\nX-Fq-Exchange: rt.http\r\n"
                b"X-Fq-Route: r\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload)
            )
            status, body = await http_reply(reader)
            if status != 200 or json.loads(body).get("routed") != 1:
                raise AssertionError(f"/submit: {status} {body[:200]!r}")
            msg = await c.receive()
            if msg.payload != payload:
                raise AssertionError(f"received {msg.payload[:64]!r}, not {payload!r}")
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()


# --- Lumberjack ---------------------------------------------------------------------------


def _lumberjack_port(t: Target) -> int:
    return t.ports["lumberjack"]


def lumberjack_frame(rng: random.Random) -> bytes:
    """A valid stream: windows then their events, v1 or v2, plain or compressed."""
    return lumberjack.sample_frames(rng)


# What a mutation may put at a frame's start: every version and type byte, real or not.
LJ_HEADERS = (b"1W", b"2W", b"1D", b"2J", b"1C", b"2C", b"2D", b"1J", b"2A", b"3W", b"\x00\x00")


def mutate_lumberjack(rng: random.Random, frame: bytes) -> bytes:
    roll = rng.random()
    if roll < 0.15:
        # A header with a length or count at the edges of the limits.
        count = rng.choice((0, 1, 65536, 65537, 1 << 24, (16 << 20) + 1, 0xFFFFFFFF))
        return rng.choice(LJ_HEADERS) + struct.pack(">I", count) + frame
    if roll < 0.25:
        # A compressed frame around whatever the stream was: a C of W frames, of C frames.
        version = rng.choice((1, 2))
        return lumberjack.compressed(version, frame, rng.choice((0, 9)))
    return mutate_bytes(rng, frame)


async def open_lumberjack(t: Target, rng: random.Random, mutate_opening: bool) -> Conn:
    conn = await connect_tcp(t.host, _lumberjack_port(t))
    if mutate_opening:
        await conn.send(mutate_lumberjack(rng, lumberjack_frame(rng)))
    return conn


async def round_trip_lumberjack(t: Target) -> None:
    """A v2 batch is acknowledged and reaches a consumer bound to its route."""
    route = f"rt{random.getrandbits(48):x}"
    async with Client(t.host, t.fq_port, source="rt/rtlj/mem:private", reconnect=False) as c:
        if await c.bind(b"logging", f'exact:"{route}"'.encode()) == wire.BIND_ILLEGAL:
            raise AssertionError("a valid bind was refused")
        payloads = [
            json.dumps({"@metadata": {"beat": route}, "message": f"line {i}"}).encode()
            for i in range(3)
        ]
        reader, writer = await asyncio.open_connection(t.host, _lumberjack_port(t))
        try:
            writer.write(lumberjack.batch(payloads))
            acks = lumberjack.AckReader()
            got: list[tuple[int, int]] = []
            while (2, 3) not in got:
                data = await reader.read(4096)
                if not data:
                    raise AssertionError(f"closed before its ACK; ACKs so far {got}")
                got += acks.feed(data)
        finally:
            writer.close()
        for payload in payloads:
            msg = await c.receive()
            if msg.payload != payload:
                raise AssertionError(f"received {msg.payload[:64]!r}, not {payload!r}")


# --- Figg ---------------------------------------------------------------------------------


def _figg_port(t: Target) -> int:
    return t.ports["figg"]


FIGG_TOPICS = (b"fz", b"fz.a", b"fz.b")


def figg_frame(rng: random.Random) -> bytes:
    """A few valid client frames: subscriptions, publishes, pings, detaches."""
    frames: list[bytes] = []
    for _ in range(rng.randint(1, 6)):
        topic = rng.choice(FIGG_TOPICS)
        roll = rng.random()
        if roll < 0.2:
            offset = rng.choice((None, 0, rng.randrange(1 << 20), (1 << 64) - 1))
            frames.append(figg.encode(figg.Attach(topic, offset)))
        elif roll < 0.3:
            frames.append(figg.encode(figg.Detach(topic)))
        elif roll < 0.4:
            frames.append(figg.encode(figg.Ping(rng.getrandbits(64))))
        else:
            seq = rng.getrandbits(16)
            for i in range(rng.randint(1, 20)):
                frames.append(
                    figg.encode_publish(topic, seq + i, rng.randbytes(rng.randint(0, 200)))
                )
    return b"".join(frames)


def mutate_figg(rng: random.Random, frame: bytes) -> bytes:
    if rng.random() < 0.2:
        # A header with a type and length at the edges: unknown, server-only, huge, short.
        kind = rng.choice((0, 1, 2, 5, 6, 7, 8, 10, 0xFFFF))
        size = rng.choice((0, 1, 7, 8, 127, 1 << 20, (16 << 20) + 1, 0xFFFFFFFF))
        return struct.pack(">HHI", kind, rng.choice((0, 1, 2)), size) + frame
    return mutate_bytes(rng, frame)


async def open_figg(t: Target, rng: random.Random, mutate_opening: bool) -> Conn:
    conn = await connect_tcp(t.host, _figg_port(t))
    if mutate_opening:
        await conn.send(mutate_figg(rng, figg_frame(rng)))
    return conn


async def round_trip_figg(t: Target) -> None:
    """Publishes are acknowledged (ACK of the last seq) and delivered to a subscriber.

    One topic for every round trip, so a long run does not make a topic (files held
    open) per round trip; other round trips' messages on it are told apart by a token.
    """
    topic = b"rt.figg"
    token = b"%x" % random.getrandbits(48)
    payloads = [b"%s %d" % (token, i) for i in range(3)]
    reader, writer = await asyncio.open_connection(t.host, _figg_port(t))
    try:
        # ATTACH is answered before the publishes after it are routed: they are delivered.
        writer.write(figg.encode(figg.Attach(topic, None)))
        writer.write(b"".join(figg.encode_publish(topic, i, p) for i, p in enumerate(payloads)))
        decoder = figg.FrameDecoder()
        acks: list[int] = []
        got: list[bytes] = []
        while 2 not in acks or len(got) < len(payloads):
            data = await reader.read(65536)
            if not data:
                raise AssertionError(f"closed; ACKs {acks}, DATA {got}")
            decoder.receive_data(data)
            while (frame := decoder.next_frame()) is not None:
                if isinstance(frame, figg.Ack):
                    acks.append(frame.seq)
                elif isinstance(frame, figg.Data) and frame.data.startswith(token):
                    got.append(frame.data)
        if got != payloads:
            raise AssertionError(f"delivered {got}, not {payloads}")
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()


# --- the table ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """What the fuzzer does with one entry: open a session, make frames, mutate them, and
    the round trip that must succeed meanwhile."""

    open: Callable[[Target, random.Random, bool], Awaitable[Conn]]
    frame: Callable[[random.Random], bytes]
    mutate: Callable[[random.Random, bytes], bytes]
    round_trip: Callable[[Target], Awaitable[None]]
    weight: float = 1.0  # share of the fuzzing sessions


# By the names the broker's front ends give their fuzz entries (``FrontEnd.fuzz``).
# fmt: off
SCENARIOS: dict[str, Scenario] = {
    "fq-command": Scenario(open_command, command_frame, mutate_command, round_trip_command),
    "fq-data": Scenario(open_data, data_frame, mutate_bytes, round_trip_data),
    "fq-peer": Scenario(open_peer, peer_frame, mutate_bytes, round_trip_peer),
    "http": Scenario(open_http, http_frame, mutate_http, round_trip_http),
    "lumberjack": Scenario(
        open_lumberjack, lumberjack_frame, mutate_lumberjack, round_trip_lumberjack
    ),
    "figg": Scenario(open_figg, figg_frame, mutate_figg, round_trip_figg),
    "fyrehose": Scenario(open_fyrehose, fyrehose_frame, mutate_fyrehose, round_trip_fyrehose),
    "opencluster": Scenario(
        open_opencluster, opencluster_frame, mutate_opencluster, round_trip_opencluster
    ),
}
# fmt: on


@dataclass(frozen=True)
class FrontEnd:
    """One entry: how to reach it, its frames, their mutations, its round trip."""

    name: str
    transport: str  # "tcp" or "udp"
    port: Callable[[Target], int]
    open: Callable[[Target, random.Random, bool], Awaitable[Conn]]
    frame: Callable[[random.Random], bytes]
    mutate: Callable[[random.Random, bytes], bytes]
    round_trip: Callable[[Target], Awaitable[None]]
    weight: float = 1.0  # share of the fuzzing sessions


def _port_of(spec: TableEntry[Any]) -> Callable[[Target], int]:
    if isinstance(spec.reach, Sniffed):
        return lambda t: t.fq_port
    return lambda t: t.ports[spec.name]  # read from the broker's /frontends.json


def entries(front_ends: Iterable[TableEntry[Any]] = BROKER_FRONT_ENDS) -> list[FrontEnd]:
    """The fuzzer's entries for each front end of the broker's table, in its order, as the
    front end names them; KeyError for a name with no scenario here."""
    out = []
    for spec in front_ends:
        transport = "udp" if isinstance(spec.reach, Datagrams) else "tcp"
        for name in spec.fuzz:
            s = SCENARIOS[name]
            out.append(
                FrontEnd(
                    name, transport, _port_of(spec), s.open, s.frame, s.mutate, s.round_trip,
                    s.weight,
                )
            )  # fmt: skip
    return out


FRONT_ENDS: list[FrontEnd] = entries()
