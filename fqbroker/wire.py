"""The fq wire protocol, sans I/O (fq.h, fq_utils.c, fqd_listener.c, fqd_ccs.c).

Theory of operation
-------------------
Every connection starts with 4 big-endian bytes that say what it is (:func:`sniff`):
``0xcc50cafe`` command, ``0xcc50face`` data, ``0xcc50feed`` peer data (4-byte peer id
follows), ``0xcc50fade`` old peer data (no peer id), or the first 4 bytes of an HTTP
request. What follows the magic is decoded by one of the decoders here:

* :class:`ServerCommandDecoder`: an ``AuthPlain`` first, then ``Heartbeat``,
  ``HeartbeatRequest``, ``StatusRequest``, ``BindRequest`` and ``UnbindRequest``.
* :class:`ClientCommandDecoder`: the replies a client reads on its command socket.
* :class:`DataHelloDecoder`: the key (and peer id) that pairs a data socket.
* :class:`MessageDecoder`: message frames, in publisher format (u8 exchange, u8 route,
  16-byte id, u32 payload) or peer format (sender and hops between id and payload).

Decoders only buffer what they are fed. ``next_*()`` returns a whole frame, or ``None``
when more bytes are needed, and then consumes nothing: any split of the input yields the
same frames. Bad input raises a :class:`~fqbroker.errors.ProtocolError` naming the field;
on the auth frame it is an :class:`~fqbroker.errors.AuthError` whose text is fq's exact
error text (§1.8). Limits are checked on the length field, before the bytes arrive, so a
hostile length never makes us buffer.

Encoders are pure functions returning bytes. All integers are big-endian.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Final, Literal, TypeVar

from .errors import AuthError, FrameTooLarge, ProtocolError
from .largeframe import LargeFrame
from .message import MAX_HOPS, Message, Run, frame_length, runs_of

__all__ = [
    "BIND_ILLEGAL",
    "HTTP_METHODS",
    "KEY_LEN",
    "MAX_HOPS",
    "MAX_MESSAGE_SIZE",
    "MAX_RK_LEN",
    "AuthPlain",
    "AuthResponse",
    "BindFlags",
    "BindRequest",
    "BindResponse",
    "ClientCommandDecoder",
    "ClientRequest",
    "Cmd",
    "ConfirmFailed",
    "ConfirmRequest",
    "Confirmed",
    "DataHello",
    "DataHelloDecoder",
    "ErrorReply",
    "Frame",
    "Heartbeat",
    "HeartbeatRequest",
    "MessageDecoder",
    "Mode",
    "ServerCommandDecoder",
    "ServerReply",
    "Status",
    "StatusRequest",
    "UnbindRequest",
    "UnbindResponse",
    "encode",
    "sniff",
]


class Mode(IntEnum):
    """The 4-byte magic that opens a connection (``FQ_PROTO_*_MODE``)."""

    CMD = 0xCC50CAFE
    DATA = 0xCC50FACE
    PEER = 0xCC50FEED
    OLD_PEER = 0xCC50FADE


class Cmd(IntEnum):
    """Command-channel codes (``FQ_PROTO_*``)."""

    AUTH_CMD = 0xAAAA
    AUTH_RESP = 0xAA00
    HBREQ = 0x4848
    HB = 0xBEA7
    BIND = 0xB170
    BINDRESP = 0xB171
    UNBIND = 0x071B
    UNBINDRESP = 0x171B
    STATUS = 0xC7A7
    STATUSRESP = 0x57A7
    ERROR = 0xEEEE
    # fqbroker extension (docs/confirms.md): publisher confirms.
    CONFIRM = 0xC0F1
    CONFIRMED = 0xC0F2
    CONFIRM_FAILED = 0xC0F3


class BindFlags:
    """Bind flag bits (``FQ_BIND_*``); PERM and TRANS share bit 0x0100."""

    PEER: Final = 0x0001
    PERM: Final = 0x0110
    TRANS: Final = 0x0100


AUTH_PLAIN: Final = 0
MAX_RK_LEN: Final = 127  # exchange, route, sender, user and queue name
KEY_LEN: Final = 127
MAX_KEY_LEN: Final = 127
MAX_QUEUE_FIELD: Final = 1023
MAX_PASSWORD: Final = 10240
MAX_MESSAGE_SIZE: Final = 1 << 28
BIND_ILLEGAL: Final = 0xFFFFFFFF
HTTP_METHODS: Final = frozenset({b"GET ", b"PUT ", b"POST", b"HEAD"})

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U16U16 = struct.Struct(">HH")
_U16U32 = struct.Struct(">HI")
_U16U64 = struct.Struct(">HQ")
_U64 = struct.Struct(">Q")
# The status key that announces publisher confirms, and the extension's version.
NO_PEER: Final = bytes(4)  # the peer id of a data channel that is no peer
CONFIRM_STATUS_KEY: Final = "confirm"
CONFIRM_VERSION: Final = 1


def sniff(first4: bytes) -> Mode | Literal["http"] | None:
    """What a connection is, from its first 4 bytes; ``None`` means close it."""
    if first4 in HTTP_METHODS:
        return "http"
    if len(first4) != 4:
        return None
    try:
        return Mode(_U32.unpack(first4)[0])
    except ValueError:
        return None


# --- frames -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AuthPlain:
    user: bytes
    queue_field: bytes
    password: bytes = b""


@dataclass(frozen=True, slots=True)
class AuthResponse:
    key: bytes


@dataclass(frozen=True, slots=True)
class ErrorReply:
    text: str


@dataclass(frozen=True, slots=True)
class Heartbeat:
    pass


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    interval_ms: int


@dataclass(frozen=True, slots=True)
class StatusRequest:
    pass


@dataclass(frozen=True, slots=True)
class Status:
    items: tuple[tuple[str, int], ...]

    def as_dict(self) -> dict[str, int]:
        return dict(self.items)


@dataclass(frozen=True, slots=True)
class BindRequest:
    flags: int
    exchange: bytes
    program: bytes


@dataclass(frozen=True, slots=True)
class BindResponse:
    route_id: int


@dataclass(frozen=True, slots=True)
class UnbindRequest:
    route_id: int
    exchange: bytes


@dataclass(frozen=True, slots=True)
class UnbindResponse:
    route_id: int


@dataclass(frozen=True, slots=True)
class ConfirmRequest:
    """Extension: answer once the first ``count`` messages of my data channel are safe."""

    count: int


@dataclass(frozen=True, slots=True)
class Confirmed:
    count: int


@dataclass(frozen=True, slots=True)
class ConfirmFailed:
    count: int
    text: str


@dataclass(frozen=True, slots=True)
class DataHello:
    key: bytes
    peer_id: bytes = bytes(4)


Frame = (
    AuthPlain
    | AuthResponse
    | ErrorReply
    | Heartbeat
    | HeartbeatRequest
    | StatusRequest
    | Status
    | BindRequest
    | BindResponse
    | UnbindRequest
    | UnbindResponse
    | ConfirmRequest
    | Confirmed
    | ConfirmFailed
)

# What a client may send on its command socket.
ClientRequest = (
    AuthPlain
    | Heartbeat
    | HeartbeatRequest
    | StatusRequest
    | BindRequest
    | UnbindRequest
    | ConfirmRequest
)
# What a broker may send on a command socket.
ServerReply = (
    AuthResponse
    | ErrorReply
    | Heartbeat
    | BindResponse
    | UnbindResponse
    | Status
    | Confirmed
    | ConfirmFailed
)


def _short(data: bytes) -> bytes:
    return _U16.pack(len(data)) + data


def encode(frame: Frame) -> bytes:
    """The bytes of one command-channel frame (either direction), without the mode magic."""
    match frame:
        case Heartbeat():
            return b"\xbe\xa7"
        case HeartbeatRequest(interval_ms):
            return _U16U16.pack(Cmd.HBREQ, interval_ms)
        case StatusRequest():
            return b"\xc7\xa7"
        case BindRequest(flags, exchange, program):
            return _U16U16.pack(Cmd.BIND, flags) + _short(exchange) + _short(program)
        case BindResponse(route_id):
            return _U16U32.pack(Cmd.BINDRESP, route_id)
        case UnbindRequest(route_id, exchange):
            return _U16U32.pack(Cmd.UNBIND, route_id) + _short(exchange)
        case UnbindResponse(route_id):
            return _U16U32.pack(Cmd.UNBINDRESP, route_id)
        case AuthPlain(user, queue_field, password):
            return (
                _U16U16.pack(Cmd.AUTH_CMD, AUTH_PLAIN)
                + _short(user)
                + _short(queue_field)
                + _short(password)
            )
        case AuthResponse(key):
            return _U16.pack(Cmd.AUTH_RESP) + _short(key)
        case ErrorReply(text):
            return _U16.pack(Cmd.ERROR) + _short(text.encode())
        case ConfirmRequest(count):
            return _U16U64.pack(Cmd.CONFIRM, count)
        case Confirmed(count):
            return _U16U64.pack(Cmd.CONFIRMED, count)
        case ConfirmFailed(count, text):
            return _U16U64.pack(Cmd.CONFIRM_FAILED, count) + _short(text.encode())
        case Status(items):
            parts = [_U16.pack(Cmd.STATUSRESP)]
            for name, value in items:
                parts.append(_short(name.encode()) + _U32.pack(value & 0xFFFFFFFF))
            parts.append(b"\x00\x00")
            return b"".join(parts)
    raise TypeError(f"not a frame: {frame!r}")


def encode_hello(mode: Mode, key: bytes, peer_id: bytes = bytes(4)) -> bytes:
    """The opening bytes of a data connection: magic, [peer id], key."""
    head = _U32.pack(mode)
    if mode is Mode.PEER:
        head += peer_id
    return head + _short(key)


# --- incremental reading ------------------------------------------------------------------


class _NeedData(Exception):
    """Raised inside a decode step when the buffer runs out; the step is rolled back."""


class _Buffer:
    """A receive buffer read with a cursor; a failed step rolls back to its start."""

    __slots__ = ("data", "pos")

    def __init__(self) -> None:
        self.data = bytearray()
        self.pos = 0

    def feed(self, chunk: bytes) -> None:
        if self.pos:
            # Compact only when there is something to drop: the buffer stays small, and a
            # byte-at-a-time feed does not copy the whole tail each time.
            if self.pos >= len(self.data):
                self.data.clear()
            else:
                del self.data[: self.pos]
            self.pos = 0
        self.data += chunk

    def __len__(self) -> int:
        return len(self.data) - self.pos

    def u8(self) -> int:
        if self.pos >= len(self.data):
            raise _NeedData
        value = self.data[self.pos]
        self.pos += 1
        return value

    def u16(self) -> int:
        if self.pos + 2 > len(self.data):
            raise _NeedData
        value: int = _U16.unpack_from(self.data, self.pos)[0]
        self.pos += 2
        return value

    def u32(self) -> int:
        if self.pos + 4 > len(self.data):
            raise _NeedData
        value: int = _U32.unpack_from(self.data, self.pos)[0]
        self.pos += 4
        return value

    def u64(self) -> int:
        if self.pos + 8 > len(self.data):
            raise _NeedData
        value: int = _U64.unpack_from(self.data, self.pos)[0]
        self.pos += 8
        return value

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise _NeedData
        value = bytes(self.data[self.pos : end])
        self.pos = end
        return value

    def skip(self, n: int) -> int:
        """Drop up to ``n`` buffered bytes; returns how many were dropped."""
        n = min(n, len(self.data) - self.pos)
        self.pos += n
        return n

    def release_if_read(self) -> None:
        """Drop the buffer once all of it is read: an idle session then holds none."""
        if self.pos and self.pos >= len(self.data):
            self.data = bytearray()
            self.pos = 0

    def rest(self) -> bytes:
        value = bytes(self.data[self.pos :])
        self.pos = len(self.data)
        return value


class _Decoder:
    __slots__ = ("_buf", "_eof")

    def __init__(self) -> None:
        self._buf = _Buffer()
        self._eof = False

    def feed(self, data: bytes) -> None:
        self._buf.feed(data)

    def feed_eof(self) -> None:
        self._eof = True

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def unconsumed(self) -> bytes:
        """Bytes fed but not yet decoded (for handing a connection to another protocol)."""
        return self._buf.rest()


def _limited(buf: _Buffer, field: str, limit: int) -> bytes:
    n = buf.u16()
    if n > limit:
        raise FrameTooLarge(field, n, limit)
    return buf.take(n)


# --- command channel ----------------------------------------------------------------------


class ServerCommandDecoder(_Decoder):
    """Frames a client sends on its command socket, after the 4-byte magic.

    The first frame must be the plain-auth request; its failures raise ``AuthError`` with
    fq's error text, in the order fqd checks the fields (fqd_ccs.c).
    """

    __slots__ = ("_authed",)

    def __init__(self) -> None:
        super().__init__()
        self._authed = False

    def next_frame(self) -> ClientRequest | None:
        buf = self._buf
        start = buf.pos
        try:
            if not self._authed:
                auth = self._auth(buf)
                self._authed = True
                return auth
            return self._command(buf)
        except _NeedData:
            buf.pos = start
            if self._eof and not self._authed and len(buf) < 4:
                raise AuthError("auth method read failed") from None
            buf.release_if_read()
            return None

    @staticmethod
    def _auth(buf: _Buffer) -> AuthPlain:
        if buf.u16() != Cmd.AUTH_CMD:
            raise AuthError("auth command expected")
        if buf.u16() != AUTH_PLAIN:
            raise AuthError("unsupported auth method")
        n = buf.u16()
        if n > MAX_RK_LEN:
            raise AuthError("user name is too long")
        user = buf.take(n)
        n = buf.u16()
        if n > MAX_QUEUE_FIELD:
            raise AuthError("queue detail is too long")
        queue_field = buf.take(n)
        n = buf.u16()
        if n > MAX_PASSWORD:
            # fqd answers "queue name is too long" here, a copy-and-paste slip (§1.8).
            raise AuthError("pass field is too long")
        return AuthPlain(user, queue_field, buf.take(n))

    @staticmethod
    def _command(buf: _Buffer) -> ClientRequest:
        code = buf.u16()
        if code == Cmd.HB:
            return Heartbeat()
        if code == Cmd.HBREQ:
            return HeartbeatRequest(buf.u16())
        if code == Cmd.STATUS:
            return StatusRequest()
        if code == Cmd.BIND:
            flags = buf.u16()
            exchange = _limited(buf, "exchange", MAX_RK_LEN)
            program = buf.take(buf.u16())
            # fqd reads the program as a C string: an embedded NUL ends it.
            nul = program.find(0)
            if nul >= 0:
                program = program[:nul]
            return BindRequest(flags, exchange, program)
        if code == Cmd.UNBIND:
            route_id = buf.u32()
            return UnbindRequest(route_id, _limited(buf, "exchange", MAX_RK_LEN))
        if code == Cmd.CONFIRM:
            return ConfirmRequest(buf.u64())
        raise ProtocolError(f"unknown command 0x{code:04x}")


class ClientCommandDecoder(_Decoder):
    """Replies a broker sends on the command socket (the client's side of fq_client.c)."""

    __slots__ = ()

    def next_frame(self) -> ServerReply | None:
        buf = self._buf
        start = buf.pos
        try:
            code = buf.u16()
            if code == Cmd.HB:
                return Heartbeat()
            if code == Cmd.BINDRESP:
                return BindResponse(buf.u32())
            if code == Cmd.UNBINDRESP:
                return UnbindResponse(buf.u32())
            if code == Cmd.STATUSRESP:
                items: list[tuple[str, int]] = []
                while True:
                    n = buf.u16()
                    if n == 0:
                        return Status(tuple(items))
                    name = buf.take(n).decode("latin-1")
                    items.append((name, buf.u32()))
            if code == Cmd.AUTH_RESP:
                return AuthResponse(_limited(buf, "key", MAX_KEY_LEN))
            if code == Cmd.ERROR:
                return ErrorReply(buf.take(buf.u16()).decode("latin-1"))
            if code == Cmd.CONFIRMED:
                return Confirmed(buf.u64())
            if code == Cmd.CONFIRM_FAILED:
                count = buf.u64()
                return ConfirmFailed(count, buf.take(buf.u16()).decode("latin-1"))
            raise ProtocolError(f"unknown reply 0x{code:04x}")
        except _NeedData:
            buf.pos = start
            return None


# --- data channel -------------------------------------------------------------------------


class DataHelloDecoder(_Decoder):
    """The bytes after a data-channel magic: [4-byte peer id], u16 key length, key."""

    __slots__ = ("_with_peer_id",)

    def __init__(self, mode: Mode) -> None:
        super().__init__()
        self._with_peer_id = mode is Mode.PEER

    def next_hello(self) -> DataHello | None:
        buf = self._buf
        start = buf.pos
        try:
            peer_id = buf.take(4) if self._with_peer_id else NO_PEER
            return DataHello(_limited(buf, "key", MAX_KEY_LEN), peer_id)
        except _NeedData:
            buf.pos = start
            return None


_Cache = TypeVar("_Cache", bound=dict[Any, Any])


def _bounded(cache: _Cache) -> _Cache:
    """``cache``, emptied first if it grew past 4096 names: a stream of new names stays cheap."""
    if len(cache) > 4096:
        cache.clear()
    return cache


class MessageDecoder(_Decoder):
    """Message frames on a data channel (§1.10).

    ``peer_format`` selects the frame with sender and hops. A payload over ``max_payload``
    is not buffered: its bytes are skipped as they arrive and ``oversized`` counts it. fqd
    truncates such payloads instead; we drop them, because a truncated message is a corrupt
    one, and count them as ``size_dropped``, the counter fq has for exactly this.

    A large publisher frame (``LARGE_FRAME`` bytes or more) is not grown in the receive
    buffer and copied out of it but assembled in place (:class:`LargeFrame`), from the
    next feed after :meth:`runs` has seen its head: by then the reader has reserved its
    size, which :attr:`in_flight` announces before the bytes arrive (docs/memory.md).
    """

    __slots__ = (
        "_error",
        "_heads",
        "_large",
        "_large_done",
        "_large_stamp",
        "_names",
        "_skipping",
        "max_payload",
        "octets",
        "oversized",
        "peer_format",
    )

    def __init__(self, *, peer_format: bool, max_payload: int = MAX_MESSAGE_SIZE) -> None:
        super().__init__()
        self.peer_format = peer_format
        self.max_payload = max_payload
        self.oversized = 0
        self.octets = 0
        self._skipping = 0
        self._names: dict[bytes, bytes] = {}
        self._heads: dict[bytes, tuple[bytes, bytes]] = {}
        self._error: ProtocolError | None = None
        # A large frame being assembled; once whole, until runs() returns it; the stamp
        # to assemble the next one with, set by runs() for the next feed.
        self._large: LargeFrame | None = None
        self._large_done: LargeFrame | None = None
        self._large_stamp: bytes | None = None

    def feed(self, data: bytes) -> None:
        stamp = self._large_stamp
        if stamp is not None:
            # Only now: more bytes coming means the reader has granted the frame's size.
            self._large_stamp = None
            buf = self._buf
            buf.feed(data)
            self._large = LargeFrame.start(buf.data, buf.pos, stamp)
            if self._large is not None:
                buf.data = bytearray()
                buf.pos = 0
            return
        large = self._large
        if large is not None:
            rest = large.feed(data)
            if rest is None:
                return
            self._large, self._large_done = None, large
            if not rest:
                return
            data = rest
        self._buf.feed(data)

    @property
    def in_flight(self) -> int:
        """Bytes held or announced: what is buffered, or the frame it starts if longer."""
        if self._large is not None:
            return self._large.size
        extra = 0 if self._large_done is None else self._large_done.size
        buf = self._buf
        n = len(buf)
        if not n or self._skipping:
            return n + extra
        try:
            length = frame_length(buf.data, buf.pos, peer=self.peer_format)
        except (IndexError, struct.error):
            return n + extra
        return max(n, min(length, self.max_payload + 1024)) + extra

    def _first_is_whole(self) -> bool:
        buf = self._buf
        try:
            return frame_length(buf.data, buf.pos, peer=self.peer_format) <= len(buf)
        except (IndexError, struct.error):
            return False

    def next_message(self) -> Message | None:
        buf = self._buf
        if self._skipping:
            self._skipping -= buf.skip(self._skipping)
            if self._skipping:
                return None
        while True:
            start = buf.pos
            try:
                n = buf.u8()
                if n > MAX_RK_LEN:
                    raise FrameTooLarge("exchange", n, MAX_RK_LEN)
                exchange = buf.take(n)
                n = buf.u8()
                if n > MAX_RK_LEN:
                    raise FrameTooLarge("route", n, MAX_RK_LEN)
                route = buf.take(n)
                msgid = buf.take(16)
                sender = hops = b""
                if self.peer_format:
                    n = buf.u8()
                    if n > MAX_RK_LEN:
                        raise FrameTooLarge("sender", n, MAX_RK_LEN)
                    sender = buf.take(n)
                    n = buf.u8()
                    if n > MAX_HOPS:
                        raise FrameTooLarge("hops", n, MAX_HOPS)
                    hops = buf.take(4 * n)
                n = buf.u32()
                if n > self.max_payload:
                    self.oversized += 1
                    self._skipping = n - buf.skip(n)
                    if self._skipping:
                        return None
                    continue
                payload = buf.take(n)
            except _NeedData:
                buf.pos = start
                return None
            return Message(exchange, route, payload, msgid, sender, hops)

    def messages(self) -> list[Message]:
        """Every whole message buffered so far, in one pass over the buffer.

        The decoder of peers' and clients' reads (a publisher's go through :meth:`runs`):
        local names for everything, one copy of the buffer, slices for the fields,
        exchange and route names shared between messages. Anything unusual (a limit
        broken, a payload over ``max_payload``, a skip in progress) is left to
        :meth:`next_message`, which raises or skips exactly as it always does.
        ``octets`` counts the frame bytes of the messages returned.
        """
        self._raise_pending()
        out: list[Message] = []
        self._decode_fast(lambda data: self._fast(data, out))
        try:
            while (msg := self.next_message()) is not None:
                self.octets += msg.peer_octets if self.peer_format else msg.publish_octets
                out.append(msg)
        except ProtocolError as exc:
            if not out:
                raise
            # The messages before a bad frame are delivered; the error comes next call.
            self._error = exc
        return out

    def runs(self, sender: bytes, hops: bytes) -> list[Run]:
        """Every whole publisher-format message buffered so far, as stamped peer frames.

        The data path's decoder. Frames come grouped in runs of consecutive messages on
        one exchange and route, so the router looks a route up once per run; each frame
        is the peer frame consumers receive (§1.10), with ``sender`` and ``hops`` (the
        broker's stamp, §1.11) spliced in, so no per-message object is built. Anything
        unusual is left to :meth:`next_message`, as in :meth:`messages`.
        """
        if self.peer_format:
            raise TypeError("runs() decodes publisher-format frames")
        self._raise_pending()
        out: list[Run] = []
        if self._large_done is not None:
            done, self._large_done = self._large_done, None
            out.append(done.run)
            self.octets += done.length
        stamp = b"".join((bytes((len(sender),)), sender, bytes((len(hops) // 4,)), hops))
        self._decode_fast(lambda data: self._fast_runs(data, out, stamp))
        slow: list[Message] = []
        try:
            while (msg := self.next_message()) is not None:
                msg.stamp(sender, hops)
                self.octets += msg.publish_octets
                slow.append(msg)
        except ProtocolError as exc:
            if not out and not slow:
                raise
            self._error = exc
        if self._error is None and not self._skipping and self._large is None:
            self._large_stamp = stamp
        return out + runs_of(slow) if slow else out

    def _raise_pending(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _decode_fast(self, fast: Callable[[bytes], int]) -> None:
        """Run ``fast`` over a copy of the buffer; it returns how many bytes it decoded."""
        buf = self._buf
        # Never copy a buffer holding only part of a (big) message.
        if self._skipping or not len(buf) or not self._first_is_whole():
            return
        pos = fast(bytes(memoryview(buf.data)[buf.pos :]))
        buf.pos += pos
        self.octets += pos

    def _fast_runs(self, data: bytes, out: list[Run], stamp: bytes) -> int:
        names = _bounded(self._heads)
        unpack = _U32.unpack_from
        max_payload = self.max_payload
        startswith = data.startswith
        extra = 16 + len(stamp) + 4  # what a frame's head has past exchange and route
        n = len(data)
        pos = 0
        head = b""  # u8 + exchange + u8 + route of the run being filled
        frames: list[bytes] = []
        append = frames.append
        while pos < n:
            if head and startswith(head, pos):
                q = pos + len(head)
            else:
                size = data[pos]
                p = pos + 1 + size  # route length
                if size > MAX_RK_LEN or p >= n or data[p] > MAX_RK_LEN:
                    break
                q = p + 1 + data[p]
                head = data[pos:q]
                pair = names.get(head)
                if pair is None:
                    # One copy of each name however many messages and queues hold it.
                    pair = names[head] = (data[pos + 1 : p], data[p + 1 : q])
                frames = []
                append = frames.append
                out.append((pair[0], pair[1], frames, q - pos + extra))
            q += 16  # the message id
            if q + 4 > n:
                break
            size = unpack(data, q)[0]
            end = q + 4 + size
            if size > max_payload or end > n:
                break
            append(data[pos:q] + stamp + data[q:end])
            pos = end
        if out and not out[-1][2]:
            out.pop()  # a run opened for a frame that is not whole
        return pos

    @property
    def error_pending(self) -> bool:
        """A bad frame follows the messages last returned: the next call raises."""
        return self._error is not None

    def _fast(self, data: bytes, out: list[Message]) -> int:
        sender = hops = b""  # publisher format has none
        intern = _bounded(self._names).setdefault
        append = out.append
        unpack = _U32.unpack_from
        max_payload = self.max_payload
        peer = self.peer_format
        n = len(data)
        pos = 0
        while pos < n:
            size = data[pos]
            p = pos + 1 + size  # route length
            if size > MAX_RK_LEN or p >= n:
                break
            size = data[p]
            q = p + 1 + size  # message id
            if size > MAX_RK_LEN:
                break
            exchange = data[pos + 1 : p]
            route = data[p + 1 : q]
            msgid = q
            q += 16
            if peer:
                if q >= n or data[q] > MAX_RK_LEN:
                    break
                s = q + 1 + data[q]  # hop count
                if s >= n or data[s] > MAX_HOPS:
                    break
                sender = data[q + 1 : s]
                q = s + 1 + 4 * data[s]
                hops = data[s + 1 : q]
            if q + 4 > n:
                break
            size = unpack(data, q)[0]
            end = q + 4 + size
            if size > max_payload or end > n:
                break
            append(
                Message(
                    intern(exchange, exchange),
                    intern(route, route),
                    data[q + 4 : end],
                    data[msgid : msgid + 16],
                    sender,
                    hops,
                )
            )
            pos = end
        return pos
