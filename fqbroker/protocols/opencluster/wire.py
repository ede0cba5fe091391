"""The OpenCluster binary protocol (:mod:`~fqbroker.protocols.opencluster.commands`: its
frames and commands), both directions, sans I/O: encoders, payload decoders, framing.

Hashes are returned unsigned by the decoders; the encoders take them signed or unsigned
and write the 32 bits the C client's ``int`` has. A :class:`FrameDecoder` is fed bytes in
any split and hands back whole frames, checking the framing only, with a final error; the
payload decoders (``decode_*``) are strict: fields must add up to the payload exactly.
The encoders check nothing beyond what ``struct`` refuses, so tests can build bad frames.
"""

from __future__ import annotations

import struct
from typing import Final

from fqbroker.errors import OpenClusterProtocolError
from fqbroker.protocols.opencluster.commands import (
    ACK,
    CAPABILITIES,
    DATA_INT,
    DATA_STR,
    FAIL,
    FAILINFO,
    GET_INT,
    GET_LONG,
    GET_STRING,
    GET_TYPE,
    GOODBYE,
    HASHMASK,
    HASHMASKS,
    HEADER_SIZE,
    HELLO,
    LOADLEVEL,
    LOCK,
    NEVER_SPECIFIED,
    NEWSERVER,
    PING,
    PROTOCOL_NAMES,
    SERVERHELLO,
    SERVERLIST,
    SET_INT,
    SET_LONG,
    SET_STRING,
    SHUTTINGDOWN,
    TRYELSEWHERE,
    UNKNOWN,
    UNLOCK,
    Frame,
    SetValue,
)

# Framing: a negative payload length, or one over max_payload (checked on the header, before
# the payload is waited for), raises OpenClusterProtocolError, and every later call raises it
# again. Any command id is framed (an unknown one is answered ``unknown`` by the session).
# A payload decoder raises the same error for a string length that is negative or runs past
# the payload. Beyond the protocol's own frames this module offers, for the server's hot path
# (which walks frames where they lie) and the tools: FrameDecoder.take (frames as tuples, no
# object each), FrameDecoder.window, consumed, bad_header and buffered; decode_tryelsewhere,
# decode_string, encode_string, set_fields (decode_set as a tuple); tryelsewhere,
# shuttingdown, serverhello and PROTOCOL_NAMES.
__all__ = [
    "ACK",
    "CAPABILITIES",
    "DATA_INT",
    "DATA_STR",
    "FAIL",
    "FAILINFO",
    "GET_INT",
    "GET_LONG",
    "GET_STRING",
    "GET_TYPE",
    "GOODBYE",
    "HASHMASK",
    "HASHMASKS",
    "HEADER_SIZE",
    "HELLO",
    "LOADLEVEL",
    "LOCK",
    "NEVER_SPECIFIED",
    "NEWSERVER",
    "PING",
    "PROTOCOL_NAMES",
    "SERVERHELLO",
    "SERVERLIST",
    "SET_INT",
    "SET_LONG",
    "SET_STRING",
    "SHUTTINGDOWN",
    "TRYELSEWHERE",
    "UNKNOWN",
    "UNLOCK",
    "Frame",
    "FrameDecoder",
    "OpenClusterProtocolError",
    "SetValue",
    "ack",
    "capabilities",
    "data_int",
    "data_str",
    "decode_capabilities",
    "decode_data_int",
    "decode_data_str",
    "decode_failinfo",
    "decode_get",
    "decode_hashmasks",
    "decode_serverhello",
    "decode_serverlist",
    "decode_set",
    "decode_string",
    "decode_tryelsewhere",
    "encode_frame",
    "encode_string",
    "fail",
    "failinfo",
    "fnv1a32",
    "get_int",
    "get_string",
    "goodbye",
    "hashmasks",
    "hello",
    "ping",
    "serverhello",
    "serverlist",
    "set_fields",
    "set_int",
    "set_string",
    "shuttingdown",
    "tryelsewhere",
    "unknown",
]

_FNV_OFFSET: Final = 2166136261
_FNV_PRIME: Final = 16777619
_M32: Final = 0xFFFFFFFF

_HEADER = struct.Struct(">hhii")
_pack_header = _HEADER.pack
_header_from = _HEADER.unpack_from
_I32 = struct.Struct(">i")
_pack_i32 = _I32.pack
_i32_from = _I32.unpack_from
_U32 = struct.Struct(">I")
_u32_from = _U32.unpack_from
_HASHES = struct.Struct(">II")  # map_hash, key_hash
_hashes_from = _HASHES.unpack_from
_pack_hashes = _HASHES.pack
_SET_HEAD = struct.Struct(">IIiii")  # map_hash, key_hash, expires, full_wait, name length
_set_head_from = _SET_HEAD.unpack_from
_pack_set_head = _SET_HEAD.pack
_DATA_INT = struct.Struct(">IIi")
_I16 = struct.Struct(">h")


def fnv1a32(name: bytes) -> int:
    """FNV-1a, 32 bits, as the 2011 C client computes it: ``hash ^= (int)str[i]`` on a
    signed ``char`` sign-extends a byte >= 0x80 to 0xFFFFFFxx before the xor, so those bytes
    flip the top 24 bits as well (standard FNV-1a would not). Unsigned result."""
    h = _FNV_OFFSET
    for b in name:
        h = ((h ^ (b | 0xFFFFFF00 if b & 0x80 else b)) * _FNV_PRIME) & _M32
    return h


# --- encoding ------------------------------------------------------------------------------


def encode_frame(command: int, repcmd: int, userid: int, payload: bytes = b"") -> bytes:
    return _pack_header(command, repcmd, userid, len(payload)) + payload


def encode_string(value: bytes) -> bytes:
    return _pack_i32(len(value)) + value


def ack(repcmd: int, userid: int) -> bytes:
    return _pack_header(ACK, repcmd, userid, 0)


def fail(repcmd: int, userid: int) -> bytes:
    return _pack_header(FAIL, repcmd, userid, 0)


def failinfo(repcmd: int, userid: int, code: int, text: bytes) -> bytes:
    return encode_frame(FAILINFO, repcmd, userid, _pack_i32(code) + encode_string(text))


def tryelsewhere(repcmd: int, userid: int, where: bytes) -> bytes:
    return encode_frame(TRYELSEWHERE, repcmd, userid, encode_string(where))


def unknown(repcmd: int, userid: int) -> bytes:
    """The original server's unknown: an empty payload (``repcmd`` names the command)."""
    return _pack_header(UNKNOWN, repcmd, userid, 0)


def data_int(userid: int, map_hash: int, key_hash: int, value: int) -> bytes:
    return _pack_header(DATA_INT, GET_INT, userid, 12) + _DATA_INT.pack(
        map_hash & _M32, key_hash & _M32, value
    )


def data_str(userid: int, map_hash: int, key_hash: int, value: bytes) -> bytes:
    return (
        _pack_header(DATA_STR, GET_STRING, userid, 12 + len(value))
        + _pack_hashes(map_hash & _M32, key_hash & _M32)
        + _pack_i32(len(value))
        + value
    )


def serverlist(userid: int, servers: list[bytes]) -> bytes:
    body = _pack_i32(len(servers)) + b"".join(encode_string(s) for s in servers)
    return encode_frame(SERVERLIST, 0, userid, body)


def hashmasks(userid: int, mask: int, buckets: list[tuple[int, int]]) -> bytes:
    body = struct.pack(
        f">ii{2 * len(buckets)}i", mask, len(buckets), *(x for b in buckets for x in b)
    )
    return encode_frame(HASHMASKS, 0, userid, body)


def _set(command: int, userid: int, name: bytes, tail: bytes, expires: int, map_hash: int) -> bytes:
    body = _pack_set_head(map_hash & _M32, fnv1a32(name), expires, 0, len(name)) + name + tail
    return _pack_header(command, 0, userid, len(body)) + body


def set_int(userid: int, name: bytes, value: int, *, expires: int = 0, map_hash: int = 0) -> bytes:
    return _set(SET_INT, userid, name, _pack_i32(value), expires, map_hash)


def set_string(
    userid: int, name: bytes, value: bytes, *, expires: int = 0, map_hash: int = 0
) -> bytes:
    return _set(SET_STRING, userid, name, encode_string(value), expires, map_hash)


def get_int(userid: int, name: bytes, *, map_hash: int = 0) -> bytes:
    return _pack_header(GET_INT, 0, userid, 8) + _pack_hashes(map_hash & _M32, fnv1a32(name))


def get_string(userid: int, name: bytes, *, map_hash: int = 0) -> bytes:
    return _pack_header(GET_STRING, 0, userid, 8) + _pack_hashes(map_hash & _M32, fnv1a32(name))


def hello(userid: int) -> bytes:
    return _pack_header(HELLO, 0, userid, 0)


def ping(userid: int) -> bytes:
    return _pack_header(PING, 0, userid, 0)


def goodbye(userid: int) -> bytes:
    return _pack_header(GOODBYE, 0, userid, 0)


def shuttingdown(userid: int) -> bytes:
    return _pack_header(SHUTTINGDOWN, 0, userid, 0)


def capabilities(userid: int, command: int) -> bytes:
    return encode_frame(CAPABILITIES, 0, userid, _I16.pack(command))


def serverhello(userid: int, info: bytes) -> bytes:
    return encode_frame(SERVERHELLO, 0, userid, encode_string(info))


# --- decoding payloads ---------------------------------------------------------------------


def _bad(what: str, payload: bytes) -> OpenClusterProtocolError:
    return OpenClusterProtocolError(f"{what} payload of {len(payload)} bytes does not add up")


def _string_at(what: str, payload: bytes, at: int) -> tuple[bytes, int]:
    """The string at ``at`` and where it ends."""
    if len(payload) - at < 4:
        raise _bad(what, payload)
    n = _i32_from(payload, at)[0]
    at += 4
    if n < 0:
        raise OpenClusterProtocolError(f"{what} string of negative length {n}")
    if len(payload) - at < n:
        raise OpenClusterProtocolError(f"{what} string of {n} bytes runs past its payload")
    return payload[at : at + n], at + n


def decode_string(payload: bytes) -> bytes:
    """A payload that is one string and nothing else."""
    value, at = _string_at("string", payload, 0)
    if at != len(payload):
        raise _bad("string", payload)
    return value


def decode_set(command: int, payload: bytes) -> SetValue:
    """A set_int or set_string payload."""
    return SetValue(*set_fields(command, payload))


def set_fields(command: int, payload: bytes) -> tuple[int, int, int, int, bytes, int | bytes]:
    """:func:`decode_set` as a tuple (map_hash, key_hash, expires, full_wait, name, value):
    the server's hot path, without a frozen dataclass's slow ``__init__`` per set."""
    size = len(payload)
    if size < 20:
        raise _bad(PROTOCOL_NAMES.get(command, str(command)), payload)
    map_hash, key_hash, expires, full_wait, n = _set_head_from(payload, 0)
    end = 20 + n
    if command == SET_INT:
        if n < 0 or size != end + 4:
            raise _bad_set(command, payload, n)
        return map_hash, key_hash, expires, full_wait, payload[20:end], _i32_from(payload, end)[0]
    if command != SET_STRING:
        raise OpenClusterProtocolError(f"{PROTOCOL_NAMES.get(command, command)} is not a set")
    if n < 0 or size < end + 4:
        raise _bad_set(command, payload, n)
    v = _i32_from(payload, end)[0]
    if v < 0 or size != end + 4 + v:
        raise _bad_set(command, payload, n)
    return map_hash, key_hash, expires, full_wait, payload[20:end], payload[end + 4 :]


def _bad_set(command: int, payload: bytes, n: int) -> OpenClusterProtocolError:
    what = PROTOCOL_NAMES.get(command, str(command))
    if n < 0:
        return OpenClusterProtocolError(f"{what} name of negative length {n}")
    if len(payload) < 20 + n:
        return OpenClusterProtocolError(f"{what} name of {n} bytes runs past its payload")
    return _bad(what, payload)


def decode_get(payload: bytes) -> tuple[int, int]:
    """(map_hash, key_hash) of a get_int or get_string."""
    if len(payload) != 8:
        raise _bad("get", payload)
    return _hashes_from(payload, 0)


def decode_capabilities(payload: bytes) -> int:
    if len(payload) != 2:
        raise _bad("capabilities", payload)
    return int(_I16.unpack(payload)[0])


def decode_serverhello(payload: bytes) -> bytes:
    return decode_string(payload)


def decode_tryelsewhere(payload: bytes) -> bytes:
    return decode_string(payload)


def decode_failinfo(payload: bytes) -> tuple[int, bytes]:
    if len(payload) < 4:
        raise _bad("failinfo", payload)
    text, at = _string_at("failinfo", payload, 4)
    if at != len(payload):
        raise _bad("failinfo", payload)
    return int(_i32_from(payload, 0)[0]), text


def decode_data_int(payload: bytes) -> tuple[int, int, int]:
    if len(payload) != 12:
        raise _bad("data_int", payload)
    return _DATA_INT.unpack(payload)


def decode_data_str(payload: bytes) -> tuple[int, int, bytes]:
    if len(payload) < 8:
        raise _bad("data_str", payload)
    map_hash, key_hash = _hashes_from(payload, 0)
    value, at = _string_at("data_str", payload, 8)
    if at != len(payload):
        raise _bad("data_str", payload)
    return map_hash, key_hash, value


def decode_serverlist(payload: bytes) -> list[bytes]:
    if len(payload) < 4:
        raise _bad("serverlist", payload)
    count = _i32_from(payload, 0)[0]
    if count < 0:
        raise OpenClusterProtocolError(f"serverlist count of {count}")
    at = 4
    servers = []
    for _ in range(count):
        server, at = _string_at("serverlist", payload, at)
        servers.append(server)
    if at != len(payload):
        raise _bad("serverlist", payload)
    return servers


def decode_hashmasks(payload: bytes) -> tuple[int, list[tuple[int, int]]]:
    """(mask, [(bucket, level), ...])."""
    if len(payload) < 8:
        raise _bad("hashmasks", payload)
    mask, n = struct.unpack_from(">ii", payload, 0)
    if n < 0 or len(payload) != 8 + 8 * n:
        raise _bad("hashmasks", payload)
    flat = struct.unpack_from(f">{2 * n}i", payload, 8)
    return mask, list(zip(flat[0::2], flat[1::2], strict=True))


# --- framing -------------------------------------------------------------------------------


class FrameDecoder:
    """Whole frames out of a byte stream fed in any split; strict, and its error is final.

    ``_pos`` bytes of ``_buf`` are decoded. A read that starts at a frame's start (every
    read of a pipelining client, mostly) is the buffer itself, ``bytes``, so that a
    payload is one slice of it: one copy, where a slice of a bytearray and its ``bytes``
    would be two. A frame that runs on past a read goes on in a bytearray, grown by
    appends (a large one comes in many reads), and becomes ``bytes`` once a whole frame
    is in. A buffer decoded to its end is dropped: an idle connection holds none."""

    __slots__ = ("_buf", "_error", "_pos", "max_payload")

    def __init__(self, max_payload: int) -> None:
        self.max_payload = max_payload
        self._buf: bytes | bytearray = b""
        self._pos = 0
        self._error: OpenClusterProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received and not yet decoded."""
        return len(self._buf) - self._pos

    def receive_data(self, data: bytes) -> None:
        if self._error is not None:
            return
        buf, pos = self._buf, self._pos
        if pos >= len(buf):
            self._buf = data if type(data) is bytes else bytes(data)
        elif type(buf) is bytes:
            rest = bytearray(memoryview(buf)[pos:])
            rest += data
            self._buf = rest
        else:
            assert isinstance(buf, bytearray)
            if pos:
                del buf[:pos]
            buf += data
        self._pos = 0

    def _fail(self, command: int, size: int) -> OpenClusterProtocolError:
        what = PROTOCOL_NAMES.get(command, f"command {command}")
        if size < 0:
            reason = f"{what} frame with a negative payload length ({size})"
        else:
            reason = f"{what} payload of {size} bytes is over the limit of {self.max_payload}"
        self._error = error = OpenClusterProtocolError(reason)
        return error

    def _whole(self) -> bytes | None:
        """The buffer as bytes once a whole frame (or a bad header) is in it, else None
        (a frame that runs on stays in its bytearray)."""
        buf, pos = self._buf, self._pos
        if type(buf) is bytes:
            return buf
        if len(buf) - pos >= HEADER_SIZE:
            size = _header_from(buf, pos)[3]
            if size < 0 or size > self.max_payload or pos + HEADER_SIZE + size <= len(buf):
                self._buf = whole = bytes(memoryview(buf)[pos:])
                self._pos = 0
                return whole
        return None

    def next_frame(self) -> Frame | None:
        """The next whole frame, or None until more bytes arrive."""
        if self._error is not None:
            raise self._error
        buf = self._whole()
        if buf is None:
            return None
        pos = self._pos
        if len(buf) - pos < HEADER_SIZE:
            return None
        command, repcmd, userid, size = _header_from(buf, pos)
        if size < 0 or size > self.max_payload:
            raise self._fail(command, size)
        start = pos + HEADER_SIZE
        end = start + size
        if end > len(buf):
            return None
        self._advance(buf, end)
        return Frame(command, repcmd, userid, buf[start:end])

    def _advance(self, buf: bytes, pos: int) -> None:
        if pos >= len(buf):
            self._buf = b""
            self._pos = 0
        else:
            self._pos = pos

    def window(self) -> tuple[bytes, int] | None:
        """(buffer, offset of its first frame not taken), once a whole frame (or a bad
        header) is in it: for a reader that walks the frames itself (the listener's
        machine) and then says where it stopped (:meth:`consumed`, :meth:`bad_header`).
        Raises the final error of an earlier bad frame."""
        if self._error is not None:
            raise self._error
        buf = self._whole()
        if buf is None or len(buf) - self._pos < HEADER_SIZE:
            return None
        return buf, self._pos

    def consumed(self, pos: int) -> None:
        """The frames of :meth:`window`'s buffer before ``pos`` are taken."""
        self._advance(self._buf, pos)  # type: ignore[arg-type]  # window made it bytes

    def bad_header(self, pos: int, command: int, size: int) -> OpenClusterProtocolError:
        """The header at ``pos`` has a bad length: the error, final from now."""
        self._pos = pos
        return self._fail(command, size)

    def take(self, out: list[tuple[int, int, int, bytes]], limit: int = 1 << 30) -> int:
        """Append up to ``limit`` whole frames as (command, repcmd, userid, payload) tuples
        to ``out``; returns how many. The server's hot path: one pass over the buffer, no
        object per frame beyond the tuple. Raises as :meth:`next_frame` does, after
        appending the good frames before the bad one (so they can be answered first)."""
        if self._error is not None:
            raise self._error
        buf = self._whole()
        if buf is None:
            return 0
        pos = self._pos
        have = len(buf)
        max_payload = self.max_payload
        append = out.append
        count = 0
        while count < limit and have - pos >= HEADER_SIZE:
            command, repcmd, userid, size = _header_from(buf, pos)
            if size < 0 or size > max_payload:
                self._pos = pos
                raise self._fail(command, size)
            start = pos + HEADER_SIZE
            end = start + size
            if end > have:
                break
            append((command, repcmd, userid, buf[start:end]))
            pos = end
            count += 1
        self._advance(buf, pos)
        return count
