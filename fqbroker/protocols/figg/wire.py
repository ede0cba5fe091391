"""The Figg wire format (andydunstall/figg ``utils/codec.go``), both directions, sans I/O.

Every frame is an 8-byte header (u16 type, u16 version, u32 payload length) and a payload
of fixed fields; docs/figg-protocol.md, "Wire format", has the table of frames. The
dataclasses and :func:`encode` serve tests and the client; :func:`encode_publish`,
:func:`encode_data`, :func:`encode_ack` and :func:`data_head` are the fast paths of the
publisher and the server, which build no object per message. :class:`FrameDecoder` reads
frames back, strictly.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from fqbroker.core.frames import ID_SIZE
from fqbroker.errors import FiggProtocolError
from fqbroker.protocols.decoding import CompactingBuffer

__all__ = [
    "ACK",
    "ATTACH",
    "ATTACHED",
    "DATA",
    "DETACH",
    "DETACHED",
    "FLAG_USE_OFFSET",
    "HEADER_SIZE",
    "MAX_TOPIC",
    "PING",
    "PONG",
    "PUBLISH",
    "VERSION",
    "Ack",
    "Attach",
    "Attached",
    "Data",
    "Detach",
    "Detached",
    "FiggProtocolError",
    "Frame",
    "FrameDecoder",
    "Ping",
    "Pong",
    "Publish",
    "data_frames",
    "data_head",
    "encode",
    "encode_ack",
    "encode_data",
    "encode_publish",
]

ATTACH, ATTACHED, DETACH, DETACHED, PUBLISH, ACK, DATA, PING, PONG = range(1, 10)
FLAG_USE_OFFSET: Final = 0x8000
VERSION: Final = 1
HEADER_SIZE: Final = 8
MAX_TOPIC: Final = 127
MAX_FRAME: Final = 16 << 20

_NAMES = {
    ATTACH: "ATTACH",
    ATTACHED: "ATTACHED",
    DETACH: "DETACH",
    DETACHED: "DETACHED",
    PUBLISH: "PUBLISH",
    ACK: "ACK",
    DATA: "DATA",
    PING: "PING",
    PONG: "PONG",
}

_HEADER = struct.Struct(">HHI")
_HEADER_U32 = struct.Struct(">HHII")  # a header and the length of the first field
_HEADER_U16_U32 = struct.Struct(">HHIHI")  # ATTACH: header, flags, topic length
_HEADER_U64 = struct.Struct(">HHIQ")
_U16_U32 = struct.Struct(">HI")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_U64_U32 = struct.Struct(">QI")
_pack_header_u32 = _HEADER_U32.pack
_pack_u64_u32 = _U64_U32.pack
_pack_u64 = _U64.pack
_header_from = _HEADER.unpack_from
_u32_from = _U32.unpack_from
_u64_from = _U64.unpack_from
_u64_u32_from = _U64_U32.unpack_from


@dataclass(frozen=True, slots=True)
class Attach:
    """Subscribe to ``topic``: from ``offset``, or from the latest when it is None."""

    topic: bytes
    offset: int | None


@dataclass(frozen=True, slots=True)
class Attached:
    topic: bytes
    offset: int


@dataclass(frozen=True, slots=True)
class Detach:
    topic: bytes


@dataclass(frozen=True, slots=True)
class Detached:
    topic: bytes


@dataclass(frozen=True, slots=True)
class Publish:
    topic: bytes
    seq: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Ack:
    seq: int


@dataclass(frozen=True, slots=True)
class Data:
    topic: bytes
    offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Ping:
    timestamp: int


@dataclass(frozen=True, slots=True)
class Pong:
    timestamp: int


Frame = Attach | Attached | Detach | Detached | Publish | Ack | Data | Ping | Pong


# --- encoding ------------------------------------------------------------------------------

# The encoders check nothing: tests and the fuzzer build bad frames with them.


def encode_publish(topic: bytes, seq: int, data: bytes) -> bytes:
    """The PUBLISH frame of ``data`` on ``topic``."""
    t, d = len(topic), len(data)
    return b"".join(
        (_pack_header_u32(PUBLISH, VERSION, 16 + t + d, t), topic, _pack_u64_u32(seq, d), data)
    )


def encode_data(topic: bytes, offset: int, data: bytes) -> bytes:
    """The DATA frame of ``data`` at ``offset`` (the position just past it) on ``topic``."""
    return b"".join((data_head(topic, offset, len(data)), data))


def data_head(topic: bytes, offset: int, size: int) -> bytes:
    """A DATA frame but its data: what goes before ``size`` bytes of data.

    The server sends a stored fq frame's tail (its u32 payload length and payload) after
    ``data_head(...)[:-4]``, so a replayed message is never copied out of its frame.
    """
    t = len(topic)
    return b"".join(
        (_pack_header_u32(DATA, VERSION, 16 + t + size, t), topic, _pack_u64_u32(offset, size))
    )


def data_frames(topic: bytes, first: int, frames: list[bytes]) -> bytes:
    """The DATA frames of ``frames``, stored peer frames at offsets ``first``, ``first +
    1``, ... on ``topic``, joined: a replay's batch, written at once.

    Each is a DATA head (packed again only when the size changes) and the offset, then the
    stored frame's tail from its u32 payload length on, which is byte for byte the tail of
    a DATA frame: no payload is copied out on its own. Compiled, the walk to the payload
    length is indexing on bytes, and the offset one ``to_bytes``, where the interpreted
    loop packed a struct a message (bench/RESULTS.md, figures behind comments).
    """
    t = len(topic)
    parts: list[bytes] = []
    size = -1
    prefix = b""
    offset = first
    for frame in frames:
        # Past exchange, route and id, then the sender and the hops: the payload length.
        at = 2 + frame[0] + frame[1 + frame[0]] + ID_SIZE
        at += 1 + frame[at]
        at += 1 + 4 * frame[at]
        n = len(frame) - at - 4
        if n != size:
            size = n
            prefix = _pack_header_u32(DATA, VERSION, 16 + t + n, t) + topic
        parts.append(prefix)
        parts.append(offset.to_bytes(8, "big"))
        parts.append(frame[at:])
        offset += 1
    return b"".join(parts)


def encode_ack(seq: int) -> bytes:
    return _HEADER_U64.pack(ACK, VERSION, 8, seq)


def _topic_frame(kind: int, topic: bytes, tail: bytes = b"") -> bytes:
    t = len(topic)
    return b"".join((_pack_header_u32(kind, VERSION, 4 + t + len(tail), t), topic, tail))


def encode(frame: Frame) -> bytes:
    """The bytes of any frame."""
    match frame:
        case Publish(topic, seq, data):
            return encode_publish(topic, seq, data)
        case Data(topic, offset, data):
            return encode_data(topic, offset, data)
        case Ack(seq):
            return encode_ack(seq)
        case Attach(topic, offset):
            flags = 0 if offset is None else FLAG_USE_OFFSET
            t = len(topic)
            head = _HEADER_U16_U32.pack(ATTACH, VERSION, 14 + t, flags, t)
            return b"".join((head, topic, _pack_u64(offset or 0)))
        case Attached(topic, offset):
            return _topic_frame(ATTACHED, topic, _pack_u64(offset))
        case Detach(topic):
            return _topic_frame(DETACH, topic)
        case Detached(topic):
            return _topic_frame(DETACHED, topic)
        case Ping(timestamp):
            return _HEADER_U64.pack(PING, VERSION, 8, timestamp)
        case Pong(timestamp):
            return _HEADER_U64.pack(PONG, VERSION, 8, timestamp)
    raise TypeError(f"not a Figg frame: {frame!r}")


# --- decoding ------------------------------------------------------------------------------


class FrameDecoder(CompactingBuffer):
    """Whole frames out of a byte stream, in either direction.

    Fed bytes (``receive_data``) in any split, it hands back whole frames (``next_frame``),
    or, on the server's hot path, the PUBLISH frames at the front of its buffer as tuples
    (``take_publishes``). It is strict, since a peer that gets one length wrong gets every
    later frame wrong too: an unknown type, a length over ``max_frame`` (checked on the
    header, before its bytes are waited for), fields that do not add up to the payload length
    exactly, and an empty topic or one over :data:`MAX_TOPIC` bytes raise
    :class:`~fqbroker.errors.FiggProtocolError`. The error is final: every later call raises
    it again. The version field (written as :data:`VERSION`) is ignored on read, as the
    reference server does; ATTACH flags other than :data:`FLAG_USE_OFFSET` are ignored
    likewise.
    """

    __slots__ = ("max_frame",)

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self.max_frame = max_frame
        super().__init__()

    def _fail(self, reason: str) -> FiggProtocolError:
        self._error = error = FiggProtocolError(reason)
        return error

    def _header(self) -> tuple[int, int] | None:
        """(type, payload length) of the next frame once it has all arrived; else None."""
        if self._error is not None:
            raise self._error
        buf, pos = self._buf, self._pos
        if len(buf) - pos < HEADER_SIZE:
            return None
        kind, _version, size = _header_from(buf, pos)
        if kind not in _NAMES:
            raise self._fail(f"unknown frame type {kind}")
        if size > self.max_frame:
            raise self._fail(
                f"{_NAMES[kind]} payload of {size} bytes is over the limit of {self.max_frame}"
            )
        if len(buf) - pos - HEADER_SIZE < size:
            return None
        return kind, size

    def _topic(self, kind: int, at: int, end: int) -> tuple[bytes, int]:
        """The topic field at ``at`` and where it ends, within a payload ending at ``end``."""
        buf = self._buf
        if end - at < 4:
            raise self._fail(f"{_NAMES[kind]} payload too short for its topic length")
        t = _u32_from(buf, at)[0]
        at += 4
        if t > MAX_TOPIC or t == 0:
            raise self._fail(f"{_NAMES[kind]} topic of {t} bytes (1 to {MAX_TOPIC} allowed)")
        if end - at < t:
            raise self._fail(f"{_NAMES[kind]} topic runs past its payload")
        return bytes(buf[at : at + t]), at + t

    def next_frame(self) -> Frame | None:
        """The next whole frame, or None until more bytes arrive."""
        head = self._header()
        if head is None:
            return None
        kind, size = head
        buf = self._buf
        at = self._pos + HEADER_SIZE
        end = at + size
        frame: Frame
        if kind in (ACK, PING, PONG):
            if size != 8:
                raise self._fail(f"{_NAMES[kind]} payload of {size} bytes, not 8")
            value = _u64_from(buf, at)[0]
            frame = Ack(value) if kind == ACK else Ping(value) if kind == PING else Pong(value)
            at = end
        elif kind == ATTACH:
            if size < 2:
                raise self._fail("ATTACH payload too short for its flags")
            flags = buf[at] << 8 | buf[at + 1]
            topic, at = self._topic(kind, at + 2, end)
            if end - at < 8:
                raise self._fail("ATTACH payload too short for its offset")
            offset = _u64_from(buf, at)[0]
            frame = Attach(topic, offset if flags & FLAG_USE_OFFSET else None)
            at += 8
        else:
            topic, at = self._topic(kind, at, end)
            if kind == DETACH:
                frame = Detach(topic)
            elif kind == DETACHED:
                frame = Detached(topic)
            elif kind == ATTACHED:
                if end - at < 8:
                    raise self._fail("ATTACHED payload too short for its offset")
                frame = Attached(topic, _u64_from(buf, at)[0])
                at += 8
            else:  # PUBLISH, DATA
                if end - at < 12:
                    raise self._fail(f"{_NAMES[kind]} payload too short for its data length")
                number, d = _u64_u32_from(buf, at)
                at += 12
                if end - at != d:
                    raise self._fail(f"{_NAMES[kind]} data of {d} bytes in {end - at} left")
                data = bytes(buf[at:end])
                at = end
                frame = (
                    Publish(topic, number, data) if kind == PUBLISH else Data(topic, number, data)
                )
        if at != end:
            raise self._fail(f"{_NAMES[kind]} payload has {end - at} bytes past its fields")
        self._pos = end
        return frame

    def take_publishes(self, out: list[tuple[bytes, int, bytes]], limit: int = 1 << 30) -> int:
        """Append the whole PUBLISH frames at the front of the buffer to ``out`` as
        (topic, seq, data), at most ``limit``; returns how many. Stops at any other frame
        (``next_frame`` reads it) and at one that has not all arrived."""
        if self._error is not None:
            raise self._error
        buf = self._buf
        pos = self._pos
        have = len(buf)
        max_frame = self.max_frame
        append = out.append
        count = 0
        while count < limit and have - pos >= 12:
            kind, _version, size, t = _HEADER_U32.unpack_from(buf, pos)
            if kind != PUBLISH or size > max_frame or t > MAX_TOPIC or t == 0 or size < 16 + t:
                break  # not ours, or bad: next_frame says which
            end = pos + HEADER_SIZE + size
            if end > have:
                break
            at = pos + 12 + t
            seq, d = _u64_u32_from(buf, at)
            if at + 12 + d != end:
                break
            append((bytes(buf[pos + 12 : at]), seq, bytes(buf[at + 12 : end])))
            pos = end
            count += 1
        self._pos = pos
        return count
