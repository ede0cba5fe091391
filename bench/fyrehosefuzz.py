"""The fuzzer's fyrehose entry (bench/frontends.py): datagrams over UDP, and a round trip.

Frames are single datagrams of every kind of fqbroker/protocols/fyrehose/wire.py, valid
and mutated (docs/reliability.md, "make fuzz", the fyrehose row). The broker sends
DELIVERs to whatever address a KEEPALIVE or REQUEST names, so every address the fuzzer
names is 0.0.0.0 or on 127.0.0.0/8, and its port 0 or the sink's: a UDP socket of this
process that is bound and never read, so no other program on the box receives anything.
"""

from __future__ import annotations

import asyncio
import atexit
import random
import socket
import struct
import time
from typing import Any

from fqbroker.errors import FyrehoseProtocolError
from fqbroker.protocols.fyrehose import wire as fh

from .fuzzconn import ROUND_TRIP_SECONDS, Conn, Target, connect_udp, mutate_bytes

__all__ = ["fyrehose_frame", "mutate_fyrehose", "open_fyrehose", "round_trip_fyrehose"]

RESEND_SECONDS = 0.5
RECEIVE_BUFFER = 8 << 20
_sink: socket.socket | None = None


def sink_port() -> int:
    """The port of this process's sink: bound on loopback, never read (see above)."""
    global _sink
    if _sink is None:
        _sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        _sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        _sink.bind(("127.0.0.1", 0))
        atexit.register(_sink.close)
    port: int = _sink.getsockname()[1]
    return port


def _destination(rng: random.Random) -> tuple[str, int]:
    """An ADDR:PORT the broker may send to: the source (0.0.0.0), or the sink."""
    roll = rng.random()
    if roll < 0.4:
        return "0.0.0.0", 0
    if roll < 0.5:
        return "0.0.0.0", sink_port()
    if roll < 0.9:
        return "127.0.0.1", sink_port()
    return rng.choice(("127.0.0.2", "127.255.255.254")), sink_port()  # nobody there


def _data(rng: random.Random) -> bytes:
    size = rng.choice((0, 1, 10, 100, 100, 1000, 4000))
    if rng.random() < 0.003:
        size = rng.choice((60000, fh.MAX_DATA))
    return rng.randbytes(size)


def _range(rng: random.Random) -> tuple[int, int]:
    """A plausible range: mostly narrow and low (where the fuzzer's own PUSHes are), a few
    wide (past request_limit) or at the 48-bit end."""
    roll = rng.random()
    if roll < 0.05:
        first = rng.randrange(fh.MAX_SEQUENCE - 100, fh.MAX_SEQUENCE + 1)
        return first, rng.randrange(first, fh.MAX_SEQUENCE + 1)
    first = rng.choice((1, rng.randrange(1, 1 << 10), rng.randrange(1, 1 << 17)))
    width = rng.choice((0, 0, 1, 7, 63)) if roll < 0.95 else rng.choice((5000, 1 << 30))
    return first, min(fh.MAX_SEQUENCE, first + width)


def _flags(rng: random.Random) -> int:
    return rng.choice((0, 0, 1, 2, 3, 0xFF, (1 << 48) - 1))


def _keepalive(rng: random.Random) -> bytes:
    addr, port = _destination(rng)
    if rng.random() < 0.25:
        return fh.encode(fh.Keepalive(addr, port, seed=True))
    # Flags as raw bits: ones no revision defines are dropped on read, never refused.
    head = fh.encode(fh.Keepalive(addr, port, token=rng.randbytes(fh.TOKEN_SIZE)))
    return head[:7] + _flags(rng).to_bytes(6, "big") + head[13:]


def fyrehose_frame(rng: random.Random) -> bytes:
    """One valid datagram of any kind, the kinds a broker never expects included."""
    roll = rng.random()
    if roll < 0.45:
        return fh.encode(fh.Push(_data(rng), seed=rng.random() < 0.3))
    if roll < 0.65:
        return _keepalive(rng)
    if roll < 0.8:
        addr, port = _destination(rng)
        return fh.encode(fh.Request(addr, port, *_range(rng)))
    if roll < 0.88:
        return fh.encode(fh.Deliver(rng.randrange(1, fh.MAX_SEQUENCE + 1), _data(rng)))
    if roll < 0.94:
        addr, port = _destination(rng)
        return fh.encode(fh.Forward(addr, port, *_range(rng)))
    return fh.encode(fh.KeepaliveAck(rng.randbytes(fh.TOKEN_SIZE)))


KINDS = (0x00, fh.DELIVER, fh.PUSH, 0x03, fh.REQUEST, fh.FORWARD, fh.KEEPALIVE,
         fh.KEEPALIVE_ACK, 0x40, 0x80, 0xFF)  # fmt: skip
LENGTHS = (0, 1, 0x7F, 0x80, 0xFF, 0x100, fh.MAX_DATA, fh.MAX_DATA + 1, 0xFFFF)


def _oversize(rng: random.Random, frame: bytes) -> bytes:
    """Up to the largest UDP datagram, LENGTH agreeing with the size (a PUSH of 65,498
    bytes is the largest valid one, a seed-form PUSH of 65,504 is over the limit) or not."""
    size = rng.choice((fh.MAX_DATAGRAM, fh.MAX_DATAGRAM - 1, rng.randrange(60000, 65508)))
    kind = frame[0] if frame else fh.PUSH
    if kind in (fh.DELIVER, fh.PUSH) and rng.random() < 0.7:
        header = fh.SEED_PUSH_HEADER_SIZE if rng.random() < 0.3 else fh.HEADER_SIZE
        head = bytearray(frame[:header].ljust(header, b"\x01"))
        struct.pack_into(">H", head, 1, (size - header) & 0xFFFF)
        return bytes(head) + rng.randbytes(size - header)
    return frame[:size] + rng.randbytes(max(0, size - len(frame)))


def _contain(frame: bytes) -> bytes:
    """Keep a datagram that names an address to 0.0.0.0 or loopback, port 0 or the sink."""
    if len(frame) < 7 or frame[0] not in (fh.KEEPALIVE, fh.REQUEST, fh.FORWARD):
        return frame
    addr, port = frame[1:5], struct.unpack_from(">H", frame, 5)[0]
    if (addr == bytes(4) or addr[0] == 127) and port in (0, sink_port()):
        return frame
    if addr != bytes(4) and addr[0] != 127:
        addr = bytes((127, *addr[1:]))
    return frame[:1] + addr + struct.pack(">H", sink_port()) + frame[7:]


def mutate_fyrehose(rng: random.Random, frame: bytes) -> bytes:
    roll = rng.random()
    b = bytearray(frame)
    if roll < 0.15 and b:
        out = bytes(b[: rng.randrange(len(b))])  # truncated
    elif roll < 0.25:
        out = frame + rng.randbytes(rng.randint(1, 64))  # trailing bytes
    elif roll < 0.4 and len(b) >= 3:
        struct.pack_into(">H", b, 1, rng.choice(LENGTHS))  # a LENGTH that disagrees
        out = bytes(b)
    elif roll < 0.5 and b:
        b[0] = rng.choice(KINDS)  # another type's body
        out = bytes(b)
    elif roll < 0.55:
        out = _oversize(rng, frame)
    else:
        out = mutate_bytes(rng, frame)
    return _contain(out[: fh.MAX_DATAGRAM])


async def open_fyrehose(t: Target, rng: random.Random, mutate_opening: bool) -> Conn:
    conn = await connect_udp(t.host, t.ports["fyrehose"])
    if mutate_opening:
        await conn.send(mutate_fyrehose(rng, fyrehose_frame(rng)))
    return conn


class _Inbox(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.queue.put_nowait(data)


async def _until(
    transport: asyncio.DatagramTransport, inbox: _Inbox, sends: list[bytes], wanted: Any
) -> fh.Datagram:
    """Send ``sends`` every RESEND_SECONDS until a datagram ``wanted(d)`` is true arrives."""
    loop = asyncio.get_running_loop()
    while True:
        for datagram in sends:
            transport.sendto(datagram)
        resend_at = loop.time() + RESEND_SECONDS
        while (left := resend_at - loop.time()) > 0:
            try:
                data = await asyncio.wait_for(inbox.queue.get(), left)
            except TimeoutError:
                break
            try:
                d = fh.decode(data)
            except FyrehoseProtocolError as exc:
                raise AssertionError(f"the broker sent a malformed datagram: {exc}") from None
            if wanted(d):
                return d


async def round_trip_fyrehose(t: Target) -> None:
    """KEEPALIVE to its KEEPALIVE-ACK, then a unique PUSH to its DELIVER, on a fresh socket."""
    loop = asyncio.get_running_loop()
    broker = (t.host, t.ports["fyrehose"])  # before the socket: a KeyError must not leak it
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        sock.bind(("127.0.0.1", 0))
        sock.connect(broker)
        transport, inbox = await loop.create_datagram_endpoint(_Inbox, sock=sock)
    except BaseException:
        sock.close()
        raise
    try:
        async with asyncio.timeout(ROUND_TRIP_SECONDS - 2):
            host, port = sock.getsockname()
            token = random.randbytes(fh.TOKEN_SIZE)
            keepalive = fh.encode(fh.Keepalive(host, port, token=token))
            await _until(transport, inbox, [keepalive], lambda d: d == fh.KeepaliveAck(token))
            body = b"round trip %d %f" % (random.getrandbits(64), time.time())
            push = fh.encode(fh.Push(body))
            got = await _until(
                transport,
                inbox,
                [keepalive, push],
                lambda d: isinstance(d, fh.Deliver) and d.data == body,
            )
            assert isinstance(got, fh.Deliver) and got.seq >= 1
    finally:
        transport.close()
