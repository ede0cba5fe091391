"""The fuzzer's OpenCluster entry (bench/frontends.py): Nov-2011 frames over TCP, and a round trip.

Frames are those of fqbroker/protocols/opencluster/wire.py, every command valid and mutated
(docs/reliability.md, "make fuzz", the opencluster row). Names come from a small pool and
most sets expire within seconds, so a long run does not grow the store without bound (the
fuzzer checks that the broker's RSS stays flat); a mutated hash still makes a new key now
and then, which the expiry reclaims too.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import struct

from fqbroker.errors import OpenClusterProtocolError
from fqbroker.protocols.opencluster import wire as oc

from .child import OC_MAX_NAME, OC_MAX_PAYLOAD, OC_MAX_VALUE
from .fuzzconn import ROUND_TRIP_SECONDS, Conn, Target, connect_tcp, mutate_bytes

__all__ = ["mutate_opencluster", "open_opencluster", "opencluster_frame", "round_trip_opencluster"]

# The limits the fuzzed broker child runs with (bench/child.py): what "past the limit" means.
MAX_NAME = OC_MAX_NAME
MAX_VALUE = OC_MAX_VALUE
MAX_PAYLOAD = OC_MAX_PAYLOAD

NAMES = [b"fz%d" % i for i in range(48)] + [b"", b"\xff\xfe\x80", b"n" * MAX_NAME]
# The command ids a frame may carry: every one the protocol names, and some it does not.
COMMANDS = (
    oc.ACK, oc.FAIL, oc.FAILINFO, oc.TRYELSEWHERE, oc.UNKNOWN, oc.HELLO, oc.CAPABILITIES,
    oc.SHUTTINGDOWN, oc.GOODBYE, oc.PING, oc.SERVERHELLO, oc.SERVERLIST, oc.HASHMASKS,
    oc.HASHMASK, oc.NEWSERVER, oc.LOADLEVEL, oc.LOCK, oc.UNLOCK, oc.SET_INT, oc.SET_LONG,
    oc.SET_STRING, oc.GET_INT, oc.DATA_INT, oc.GET_LONG, oc.GET_STRING, oc.DATA_STR,
    oc.GET_TYPE, 0, 5, 99, 2001, 4096, 0x7FFF, -1, -32768,
)  # fmt: skip
LENGTHS = (
    -1, -0x80000000, -12, 0, 1, 3, 4, 7, 8, 15, 16, 17, 100, MAX_PAYLOAD, MAX_PAYLOAD + 1,
    0x7FFFFFFF,
)  # fmt: skip
_HEADER = struct.Struct(">hhii")
_I32 = struct.Struct(">i")
# Where a set's name length sits: the header, then map_hash, key_hash, expires, full_wait.
_NAME_AT = oc.HEADER_SIZE + 16


def _userid(rng: random.Random) -> int:
    return rng.choice((0, 0, 0, 1, rng.randrange(1 << 16), -1, 0x7FFFFFFF))


def _value(rng: random.Random) -> bytes:
    size = rng.choice((0, 1, 10, 100, 100, 1000, 4000))
    if rng.random() < 0.003:
        size = 60000
    return rng.randbytes(size)


def _expires(rng: random.Random) -> int:
    # Mostly soon: keys the fuzzer makes are reclaimed while it runs.
    return rng.choice((1, 1, 2, 3, 5, 5, 0))


def _set(rng: random.Random, uid: int, name: bytes) -> bytes:
    map_hash = rng.choice((0, 0, 0, 1, oc.fnv1a32(b"fzmap")))
    if rng.random() < 0.5:
        value = rng.choice((0, 1, -1, 45, 0x7FFFFFFF, -0x80000000, rng.getrandbits(31)))
        return oc.set_int(uid, name, value, expires=_expires(rng), map_hash=map_hash)
    return oc.set_string(uid, name, _value(rng), expires=_expires(rng), map_hash=map_hash)


def _one(rng: random.Random) -> bytes:
    """One valid frame, mostly sets and gets."""
    uid = _userid(rng)
    name = rng.choice(NAMES)
    roll = rng.random()
    if roll < 0.3:
        return _set(rng, uid, name)
    if roll < 0.55:
        get = oc.get_int if rng.random() < 0.5 else oc.get_string
        return get(uid, name, map_hash=rng.choice((0, 0, 1)))
    if roll < 0.6:
        return oc.hello(uid)
    if roll < 0.65:
        return oc.ping(uid)
    if roll < 0.7:
        return oc.capabilities(uid, rng.choice(COMMANDS))
    if roll < 0.73:
        return oc.encode_frame(oc.SHUTTINGDOWN, 0, uid)
    if roll < 0.76:
        text = b"127.0.0.1:%d" % rng.randrange(1 << 16) if rng.random() < 0.8 else b""
        return oc.serverhello(uid, text)
    if roll < 0.82:  # the commands that never had a format, unknown ids
        command = rng.choice((*sorted(oc.NEVER_SPECIFIED), 0, 5, 99, 2001, 4096, 0x7FFF, -1))
        return oc.encode_frame(command, 0, uid, rng.randbytes(rng.choice((0, 0, 4, 8))))
    if roll < 0.9:  # a client's replies to pushes: ack (2011: repcmd 100 for hashmasks), fail
        repcmd = rng.choice((oc.SERVERLIST, oc.HASHMASKS, oc.HASHMASK, 0, 7))
        return (oc.ack if rng.random() < 0.8 else oc.fail)(repcmd, uid)
    if roll < 0.998:  # what only a server sends
        return rng.choice(
            (
                oc.serverlist(uid, [b"127.0.0.1:13600"] * rng.randrange(3)),
                oc.hashmasks(uid, 0x0F, [(i, 0) for i in range(16)]),
                oc.data_int(uid, 0, oc.fnv1a32(name), 45),
                oc.data_str(uid, 0, oc.fnv1a32(name), b"v"),
                oc.failinfo(oc.GET_INT, uid, 1, b"wrong type"),
                oc.unknown(oc.LOCK, uid),
            )
        )
    return oc.goodbye(uid)  # the broker closes after its ack: the session ends


def opencluster_frame(rng: random.Random) -> bytes:
    """A few valid frames, as a pipelining client writes them."""
    return b"".join(_one(rng) for _ in range(rng.randint(1, 8)))


def _oversize(rng: random.Random) -> bytes:
    """A set one byte past a limit (name or value), or whose header claims past max_payload."""
    roll = rng.random()
    if roll < 0.4:
        return oc.set_string(0, b"N" * (MAX_NAME + 1), b"v", expires=1)
    if roll < 0.6:
        return oc.set_string(0, b"big", b"V" * (MAX_VALUE + 1), expires=1)
    return _HEADER.pack(oc.SET_STRING, 0, 0, rng.choice((MAX_PAYLOAD + 1, 0x7FFFFFFF)))


def mutate_opencluster(rng: random.Random, frame: bytes) -> bytes:
    roll = rng.random()
    b = bytearray(frame)
    if roll < 0.12 and b:
        return bytes(b[: rng.randrange(len(b))])  # truncated
    if roll < 0.3 and len(b) >= oc.HEADER_SIZE:
        struct.pack_into(">i", b, 8, rng.choice(LENGTHS))  # the header's length
        return bytes(b)
    if roll < 0.42 and len(b) >= _NAME_AT + 4:
        # A string's length inside a set: the name's, or the value's after it.
        at = _NAME_AT
        if rng.random() < 0.5:
            at += 4 + max(0, _I32.unpack_from(b, _NAME_AT)[0])
        if at + 4 <= len(b):
            struct.pack_into(">i", b, at, rng.choice(LENGTHS))
        return bytes(b)
    if roll < 0.5 and len(b) >= oc.HEADER_SIZE:
        # Fields that do not add up: bytes past them, counted in the header's length.
        extra = rng.randbytes(rng.randint(1, 16))
        head = _HEADER.unpack_from(b)
        return _HEADER.pack(*head[:3], head[3] + len(extra)) + bytes(b[12:]) + extra
    if roll < 0.6 and len(b) >= 2:
        struct.pack_into(">h", b, 0, rng.choice(COMMANDS))  # another command's body
        return bytes(b)
    if roll < 0.62:
        return frame + _oversize(rng)
    return mutate_bytes(rng, frame)


async def open_opencluster(t: Target, rng: random.Random, mutate_opening: bool) -> Conn:
    conn = await connect_tcp(t.host, t.ports["opencluster"])
    opening = oc.hello(_userid(rng))
    if mutate_opening:
        opening = mutate_opencluster(rng, opening)
    await conn.send(opening)
    return conn


class _Replies:
    """The broker's frames on one connection, in order."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader
        self.decoder = oc.FrameDecoder(MAX_PAYLOAD)

    async def next(self) -> oc.Frame:
        while True:
            try:
                frame = self.decoder.next_frame()
            except OpenClusterProtocolError as exc:
                raise AssertionError(f"the broker sent a malformed frame: {exc}") from None
            if frame is not None:
                return frame
            data = await self.reader.read(65536)
            if not data:
                raise AssertionError("the broker closed the connection")
            self.decoder.receive_data(data)


def _expect(frame: oc.Frame, command: int, repcmd: int, userid: int) -> None:
    if (frame.command, frame.repcmd, frame.userid) != (command, repcmd, userid):
        raise AssertionError(
            f"expected command {command} repcmd {repcmd} userid {userid}, got {frame}"
        )


async def round_trip_opencluster(t: Target) -> None:
    """hello, then a set_string of a unique key and a get_string of it."""
    port = t.ports["opencluster"]  # before the socket: a KeyError must not leak it
    reader, writer = await asyncio.open_connection(t.host, port)
    try:
        async with asyncio.timeout(ROUND_TRIP_SECONDS - 2):
            replies = _Replies(reader)
            writer.write(oc.hello(0))
            _expect(await replies.next(), oc.ACK, oc.HELLO, 0)
            pushed = await replies.next()
            _expect(pushed, oc.SERVERLIST, 0, pushed.userid)
            if oc.decode_serverlist(pushed.payload) != []:
                raise AssertionError(f"serverlist: {pushed}")
            pushed = await replies.next()
            _expect(pushed, oc.HASHMASKS, 0, pushed.userid)
            if oc.decode_hashmasks(pushed.payload) != (0x0F, [(i, 0) for i in range(16)]):
                raise AssertionError(f"hashmasks: {pushed}")
            writer.write(oc.ack(oc.SERVERLIST, 0) + oc.ack(oc.SERVERLIST, 1))  # as 2011's
            name = b"rt.%x" % random.getrandbits(64)
            value = b"round trip %x" % random.getrandbits(64)
            # Expiring: a long run's round trips do not pile up keys.
            writer.write(oc.set_string(1, name, value, expires=60) + oc.get_string(2, name))
            _expect(await replies.next(), oc.ACK, oc.SET_STRING, 1)
            got = await replies.next()
            _expect(got, oc.DATA_STR, oc.GET_STRING, 2)
            if oc.decode_data_str(got.payload) != (0, oc.fnv1a32(name), value):
                raise AssertionError(f"get_string of {name!r}: {got}")
            writer.write(oc.goodbye(3))
            _expect(await replies.next(), oc.ACK, oc.GOODBYE, 3)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()
