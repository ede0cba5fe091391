"""The fyrehose datagram format (seed 000 and its later revisions), both directions, sans I/O.

Every datagram is one UDP datagram over IPv4 whose first byte is its type;
docs/fyrehose-protocol.md has the table of datagrams, and says where the seed and its
revisions disagree and how this module settles it (both PUSH and KEEPALIVE forms are read,
told apart by size). :func:`decode` raises :class:`~fqbroker.errors.FyrehoseProtocolError`
for anything that breaks those rules, and the listener drops such a datagram unanswered;
:func:`encode` raises ``ValueError`` for a field out of range, a bug of the caller.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass
from enum import IntFlag
from typing import Final

from fqbroker.errors import FyrehoseProtocolError

__all__ = [
    "DELIVER",
    "FORWARD",
    "HEADER_SIZE",
    "KEEPALIVE",
    "KEEPALIVE_ACK",
    "KEEPALIVE_ACK_SIZE",
    "KEEPALIVE_SEED_SIZE",
    "KEEPALIVE_SIZE",
    "MAX_DATA",
    "MAX_DATAGRAM",
    "MAX_SEQUENCE",
    "NO_FLAGS",
    "PUSH",
    "RANGE_SIZE",
    "REQUEST",
    "SEED_PUSH_HEADER_SIZE",
    "TOKEN_SIZE",
    "ZERO_TOKEN",
    "Datagram",
    "Deliver",
    "Flags",
    "Forward",
    "FyrehoseProtocolError",
    "Keepalive",
    "KeepaliveAck",
    "Push",
    "Request",
    "decode",
    "encode",
]

DELIVER: Final = 0x01
PUSH: Final = 0x02
REQUEST: Final = 0x04
FORWARD: Final = 0x08
KEEPALIVE: Final = 0x10
KEEPALIVE_ACK: Final = 0x20

MAX_DATAGRAM: Final = 65507  # IPv4 UDP payload: 65535 - 20 (IP header) - 8 (UDP header)
HEADER_SIZE: Final = 9  # DELIVER and the final PUSH
SEED_PUSH_HEADER_SIZE: Final = 3
MAX_DATA: Final = MAX_DATAGRAM - HEADER_SIZE
MAX_SEQUENCE: Final = (1 << 48) - 1
TOKEN_SIZE: Final = 16
ZERO_TOKEN: Final = bytes(TOKEN_SIZE)
RANGE_SIZE: Final = 19  # REQUEST and FORWARD
KEEPALIVE_SIZE: Final = 29
KEEPALIVE_SEED_SIZE: Final = 7
KEEPALIVE_ACK_SIZE: Final = 17


class Flags(IntFlag):
    """The FLAGS of a final-form KEEPALIVE."""

    NOSUBSCRIBE = 0x1  # not a subscriber: no DELIVER for this KEEPALIVE
    NOJOURNAL = 0x2  # never FORWARDed a REQUEST


_KNOWN_FLAGS: Final = int(Flags.NOSUBSCRIBE | Flags.NOJOURNAL)
NO_FLAGS: Final = Flags(0)


@dataclass(frozen=True, slots=True)
class Deliver:
    """Message ``seq`` of the stream, from the backbone or a journaling client."""

    seq: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Push:
    """Publish ``data`` on the backbone; ``seed`` is the seed's 3-byte-header form."""

    data: bytes
    seed: bool = False


@dataclass(frozen=True, slots=True)
class Request:
    """Send messages ``from_seq`` to ``to_seq`` (inclusive) to ``addr``:``port``."""

    addr: str
    port: int
    from_seq: int
    to_seq: int


@dataclass(frozen=True, slots=True)
class Forward:
    """The backbone passes a REQUEST it cannot serve on to a journaling client."""

    addr: str
    port: int
    from_seq: int
    to_seq: int


@dataclass(frozen=True, slots=True)
class Keepalive:
    """Subscribe (for 5 s) with DELIVER to ``addr``:``port``; 0.0.0.0 is the source.

    ``seed`` is the seed's 7-byte form, which has neither flags nor a token.
    """

    addr: str
    port: int
    flags: Flags = NO_FLAGS
    token: bytes = ZERO_TOKEN
    seed: bool = False

    def ack(self) -> KeepaliveAck:
        """The KEEPALIVE-ACK that answers this KEEPALIVE (zeros for the seed form)."""
        return KeepaliveAck(self.token)


@dataclass(frozen=True, slots=True)
class KeepaliveAck:
    token: bytes


Datagram = Deliver | Push | Request | Forward | Keepalive | KeepaliveAck

_LENGTH = struct.Struct(">BH")  # type, LENGTH
_ADDR_PORT = struct.Struct(">B4sH")  # type, ADDR, PORT


# --- encoding ------------------------------------------------------------------------------


def _u48(value: int, what: str, low: int = 0) -> bytes:
    if not low <= value <= MAX_SEQUENCE:
        raise ValueError(f"{what} {value} is not in {low}..{MAX_SEQUENCE} (48 bits)")
    return value.to_bytes(6, "big")


def _data(data: bytes) -> int:
    if len(data) > MAX_DATA:
        raise ValueError(f"{len(data)} bytes of data are over the limit of {MAX_DATA}")
    return len(data)


def _addr_port(kind: int, addr: str, port: int) -> bytes:
    if not 0 <= port <= 0xFFFF:
        raise ValueError(f"port {port} is not in 0..65535")
    return _ADDR_PORT.pack(kind, ipaddress.IPv4Address(addr).packed, port)


def _range(kind: int, d: Request | Forward) -> bytes:
    if d.from_seq > d.to_seq:
        raise ValueError(f"the range {d.from_seq}..{d.to_seq} is empty")
    return b"".join(
        (
            _addr_port(kind, d.addr, d.port),
            _u48(d.from_seq, "FROM_SEQ", 1),
            _u48(d.to_seq, "TO_SEQ", 1),
        )
    )


def _token(token: bytes) -> bytes:
    if len(token) != TOKEN_SIZE:
        raise ValueError(f"a token is {TOKEN_SIZE} bytes, not {len(token)}")
    return token


def encode(d: Datagram) -> bytes:
    """The bytes of datagram ``d``; ``ValueError`` for a field out of its range."""
    if isinstance(d, Deliver):
        return b"".join((_LENGTH.pack(DELIVER, _data(d.data)), _u48(d.seq, "SEQUENCE", 1), d.data))
    if isinstance(d, Push):
        head = _LENGTH.pack(PUSH, _data(d.data))
        return head + d.data if d.seed else b"".join((head, bytes(6), d.data))
    if isinstance(d, Request):
        return _range(REQUEST, d)
    if isinstance(d, Forward):
        return _range(FORWARD, d)
    if isinstance(d, Keepalive):
        head = _addr_port(KEEPALIVE, d.addr, d.port)
        if d.seed:
            if d.flags or d.token != ZERO_TOKEN:
                raise ValueError("the seed form of KEEPALIVE carries neither flags nor a token")
            return head
        return b"".join((head, _u48(int(d.flags), "FLAGS"), _token(d.token)))
    if isinstance(d, KeepaliveAck):
        return bytes((KEEPALIVE_ACK,)) + _token(d.token)
    raise TypeError(f"not a fyrehose datagram: {d!r}")


# --- decoding ------------------------------------------------------------------------------


def _bad(text: str) -> FyrehoseProtocolError:
    return FyrehoseProtocolError(text)


def _seq(datagram: bytes, at: int, what: str) -> int:
    value = int.from_bytes(datagram[at : at + 6], "big")
    if value == 0:
        raise _bad(f"{what} is 0 (sequences start at 1)")
    return value


def _decode_data(datagram: bytes) -> Deliver | Push:
    size = len(datagram)
    if size < SEED_PUSH_HEADER_SIZE:
        raise _bad(f"a datagram of type 0x{datagram[0]:02x} is truncated at {size} bytes")
    kind, length = _LENGTH.unpack_from(datagram)
    if length > MAX_DATA:
        raise _bad(f"LENGTH {length} is over the limit of {MAX_DATA}")
    if size == HEADER_SIZE + length:
        data = datagram[HEADER_SIZE:]
        if kind == DELIVER:
            return Deliver(_seq(datagram, 3, "SEQUENCE"), data)
        return Push(data)
    if kind == PUSH and size == SEED_PUSH_HEADER_SIZE + length:
        return Push(datagram[SEED_PUSH_HEADER_SIZE:], seed=True)
    name = "DELIVER" if kind == DELIVER else "PUSH"
    raise _bad(f"a {name} of {size} bytes does not agree with its LENGTH {length}")


def _decode_range(datagram: bytes) -> Request | Forward:
    kind = datagram[0]
    name = "REQUEST" if kind == REQUEST else "FORWARD"
    if len(datagram) != RANGE_SIZE:
        raise _bad(f"a {name} is {RANGE_SIZE} bytes, not {len(datagram)}")
    _, addr, port = _ADDR_PORT.unpack_from(datagram)
    from_seq = _seq(datagram, 7, "FROM_SEQ")
    to_seq = _seq(datagram, 13, "TO_SEQ")
    if from_seq > to_seq:
        raise _bad(f"a {name} for the empty range {from_seq}..{to_seq}")
    cls = Request if kind == REQUEST else Forward
    return cls(socket.inet_ntoa(addr), port, from_seq, to_seq)


def _decode_keepalive(datagram: bytes) -> Keepalive:
    size = len(datagram)
    if size not in (KEEPALIVE_SIZE, KEEPALIVE_SEED_SIZE):
        raise _bad(f"a KEEPALIVE is {KEEPALIVE_SIZE} or {KEEPALIVE_SEED_SIZE} bytes, not {size}")
    _, addr, port = _ADDR_PORT.unpack_from(datagram)
    if size == KEEPALIVE_SEED_SIZE:
        return Keepalive(socket.inet_ntoa(addr), port, seed=True)
    flags = Flags(int.from_bytes(datagram[7:13], "big") & _KNOWN_FLAGS)
    return Keepalive(socket.inet_ntoa(addr), port, flags, datagram[13:])


def decode(datagram: bytes) -> Datagram:
    """The datagram in ``datagram`` (one whole UDP datagram); FyrehoseProtocolError if bad."""
    size = len(datagram)
    if size == 0:
        raise _bad("an empty datagram")
    if size > MAX_DATAGRAM:
        raise _bad(f"a datagram of {size} bytes is over the limit of {MAX_DATAGRAM}")
    kind = datagram[0]
    if kind in (DELIVER, PUSH):
        return _decode_data(datagram)
    if kind in (REQUEST, FORWARD):
        return _decode_range(datagram)
    if kind == KEEPALIVE:
        return _decode_keepalive(datagram)
    if kind == KEEPALIVE_ACK:
        if size != KEEPALIVE_ACK_SIZE:
            raise _bad(f"a KEEPALIVE-ACK is {KEEPALIVE_ACK_SIZE} bytes, not {size}")
        return KeepaliveAck(datagram[1:])
    raise _bad(f"unknown datagram type 0x{kind:02x}")
