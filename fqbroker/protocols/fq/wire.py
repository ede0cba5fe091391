"""The fq wire protocol, sans I/O (fq.h, fq_utils.c, fqd_listener.c, fqd_ccs.c).

Every connection starts with a 4-byte :class:`Mode` (docs/fq-protocol.md §1.2); what follows
is read by :class:`ServerCommandDecoder` (auth, then heartbeats, status, bind, unbind),
:class:`ClientCommandDecoder` (a client's replies) or :class:`DataHelloDecoder` (the key,
and peer id, that pair a data socket); message frames are :mod:`.msgdecoder`'s. Each buffers
only what it is fed and returns a whole frame or ``None``; bad input raises a
``ProtocolError`` naming the field, and limits are checked before the bytes arrive.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

# The limits of message frames and the bind flags belong to the routing core; they are
# named here too because the command channel speaks them.
from fqbroker.core.bindflags import BIND_ILLEGAL, BindFlags
from fqbroker.core.frames import MAX_HOPS, MAX_MESSAGE_SIZE, MAX_RK_LEN
from fqbroker.errors import AuthError, FrameTooLarge, ProtocolError
from fqbroker.protocols.decoding import Decoder, NeedData, ReceiveBuffer

__all__ = [
    "BIND_ILLEGAL",
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
    "DedupOn",
    "DedupRequest",
    "ErrorReply",
    "Frame",
    "Heartbeat",
    "HeartbeatRequest",
    "Mode",
    "ServerCommandDecoder",
    "ServerReply",
    "Status",
    "StatusRequest",
    "UnbindRequest",
    "UnbindResponse",
    "encode",
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
    # fqbroker extension (docs/confirms.md, "Exactly once"): de-duplication by message id.
    DEDUP = 0xC0F4
    DEDUP_ON = 0xC0F5


AUTH_PLAIN: Final = 0
KEY_LEN: Final = 127
MAX_KEY_LEN: Final = 127
MAX_QUEUE_FIELD: Final = 1023
MAX_PASSWORD: Final = 10240

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U16U16 = struct.Struct(">HH")
_U16U32 = struct.Struct(">HI")
_U16U64 = struct.Struct(">HQ")
# The status key that announces publisher confirms, and the extension's version.
NO_PEER: Final = bytes(4)  # the peer id of a data channel that is no peer
CONFIRM_STATUS_KEY: Final = "confirm"
CONFIRM_VERSION: Final = 1
# The status key that announces de-duplication by message id, and its version.
DEDUP_STATUS_KEY: Final = "dedup"
DEDUP_VERSION: Final = 1


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
class DedupRequest:
    """Extension: drop my data channel's messages whose ids a queue already took."""


@dataclass(frozen=True, slots=True)
class DedupOn:
    """The answer to :class:`DedupRequest`: every message on the data channel paired after
    it (or already paired) is de-duplicated."""


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
    | DedupRequest
    | DedupOn
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
    | DedupRequest
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
    | DedupOn
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
        case DedupRequest():
            return _U16.pack(Cmd.DEDUP)
        case DedupOn():
            return _U16.pack(Cmd.DEDUP_ON)
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


# --- reading ------------------------------------------------------------------------------


def _limited(buf: ReceiveBuffer, field: str, limit: int) -> bytes:
    n = buf.u16()
    if n > limit:
        raise FrameTooLarge(field, n, limit)
    return buf.take(n)


# --- command channel ----------------------------------------------------------------------


class ServerCommandDecoder(Decoder):
    """Frames a client sends on its command socket, after the 4-byte magic.

    The first frame must be the plain-auth request; its failures raise ``AuthError`` with
    fq's error text, in the order fqd checks the fields (fqd_ccs.c).
    """

    __slots__ = ("_authed",)

    def __init__(self, authed: bool = False) -> None:
        # authed: past the auth request already (a command machine lets an idle session's
        # decoder go, and makes another when bytes come).
        super().__init__()
        self._authed = authed

    @property
    def authed(self) -> bool:
        """Whether the auth request was read: the one record of it, which the server's
        command session reads its phase from (fqbroker.frontends.fq.commandmachine)."""
        return self._authed

    def next_frame(self) -> ClientRequest | None:
        buf = self._buf
        start = buf.pos
        try:
            if not self._authed:
                auth = self._auth(buf)
                self._authed = True
                return auth
            return self._command(buf)
        except NeedData:
            buf.pos = start
            if self._eof and not self._authed and len(buf) < 4:
                raise AuthError("auth method read failed") from None
            buf.release_if_read()
            return None

    @staticmethod
    def _auth(buf: ReceiveBuffer) -> AuthPlain:
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
            # fqd answers "queue name is too long" here, a copy-and-paste slip
            # (docs/fq-protocol.md §1.8).
            raise AuthError("pass field is too long")
        return AuthPlain(user, queue_field, buf.take(n))

    @staticmethod
    def _command(buf: ReceiveBuffer) -> ClientRequest:
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
        if code == Cmd.DEDUP:
            return DedupRequest()
        raise ProtocolError(f"unknown command 0x{code:04x}")


class ClientCommandDecoder(Decoder):
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
            if code == Cmd.DEDUP_ON:
                return DedupOn()
            raise ProtocolError(f"unknown reply 0x{code:04x}")
        except NeedData:
            buf.pos = start
            return None


# --- data channel -------------------------------------------------------------------------


class DataHelloDecoder(Decoder):
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
        except NeedData:
            buf.pos = start
            return None
