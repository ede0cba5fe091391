"""The client's side of an fq command connection, sans I/O (fq_client.c).

:class:`CommandChannel` builds the auth request, pairs each reply with its request first in,
first out (fq answers in request order, docs/fq-protocol.md §1.5) and answers every server
heartbeat with one of its own, which keeps a libfq client alive (docs/fq-protocol.md §1.7).
Its interface is h11's: ``receive_data()``, ``next_event()`` (an event or ``None``) and
``data_to_send()``. Two shells drive it: the asyncio :class:`~fqbroker.clients.fq.client.Client`
and the blocking :class:`~fqbroker.clients.http.replay.ReplayClient`.
"""

from __future__ import annotations

import uuid
from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

from fqbroker.errors import ProtocolError
from fqbroker.protocols.fq import wire

__all__ = [
    "Authenticated",
    "CommandChannel",
    "ConfirmReply",
    "Name",
    "Refused",
    "Reply",
    "Request",
    "as_bytes",
    "parse_source",
]

T = TypeVar("T")

# Exchanges, routes, programs, queues and users are bytes on the wire; people write str.
Name = str | bytes


def as_bytes(name: Name) -> bytes:
    """A name as the wire carries it: str as UTF-8, bytes as they are."""
    return name.encode() if isinstance(name, str) else bytes(name)


def parse_source(source: Name) -> tuple[bytes, bytes]:
    """``USER[/QUEUE[/TYPE_AND_PARAMS]]`` to (user, queue field), as fq_client_creds does.

    A missing or empty queue gets a fresh ``q-<uuid>`` name; a missing type is ``mem``, but
    an empty one stays empty (fqd reads ``name\\0`` as ``mem`` too). libfq cuts queue and
    type to 127 bytes each; the user is sent whole, so fqd can refuse it with its own text.
    """
    user, _, rest = as_bytes(source).partition(b"/")
    queue, has_type, kind = rest.partition(b"/")
    if not queue:
        queue = f"q-{uuid.uuid4()}".encode()
    if not has_type:
        kind = b"mem"
    return user, queue[: wire.MAX_RK_LEN] + b"\0" + kind[: wire.MAX_RK_LEN]


@dataclass(frozen=True, slots=True)
class Authenticated:
    key: bytes


@dataclass(frozen=True, slots=True)
class Refused:
    text: str


@dataclass(frozen=True, slots=True)
class Reply(Generic[T]):
    token: T
    frame: wire.BindResponse | wire.UnbindResponse | wire.Status | ConfirmReply | wire.DedupOn


ConfirmReply = wire.Confirmed | wire.ConfirmFailed
Request = (
    wire.BindRequest
    | wire.UnbindRequest
    | wire.StatusRequest
    | wire.ConfirmRequest
    | wire.DedupRequest
)
_REPLY_TYPE: dict[type, type | tuple[type, ...]] = {
    wire.BindRequest: wire.BindResponse,
    wire.UnbindRequest: wire.UnbindResponse,
    wire.StatusRequest: wire.Status,
    wire.ConfirmRequest: (wire.Confirmed, wire.ConfirmFailed),
    wire.DedupRequest: wire.DedupOn,
}


class CommandChannel(Generic[T]):
    """The client's side of one command connection, without I/O.

    ``hello()`` and ``request()`` return bytes to write; ``receive_data()`` buffers what was
    read and ``next_event()`` returns the next event or ``None``. A ``token`` rides along
    with each request and comes back on its :class:`Reply`. Server heartbeats are not
    events: each one queues an answer for ``data_to_send()``. Anything out of order (a reply
    nobody asked for, an error frame after auth) raises ``ProtocolError``; libfq treats both
    as a protocol violation and reconnects.
    """

    def __init__(self) -> None:
        self._decoder = wire.ClientCommandDecoder()
        self._waiting: deque[tuple[type | tuple[type, ...], T]] = deque()
        self._outbox = bytearray()
        self.key: bytes | None = None

    def hello(self, user: bytes, queue_field: bytes, password: bytes) -> bytes:
        auth = wire.encode(wire.AuthPlain(user, queue_field, password))
        return wire.Mode.CMD.to_bytes(4, "big") + auth

    def request(self, frame: Request, token: T) -> bytes:
        self._waiting.append((_REPLY_TYPE[type(frame)], token))
        return wire.encode(frame)

    def receive_data(self, data: bytes) -> None:
        self._decoder.feed(data)

    def next_event(self) -> Authenticated | Refused | Reply[T] | None:
        while (frame := self._decoder.next_frame()) is not None:
            if self.key is None:
                if isinstance(frame, wire.AuthResponse):
                    self.key = frame.key
                    return Authenticated(frame.key)
                if isinstance(frame, wire.ErrorReply):
                    return Refused(frame.text)
            elif isinstance(frame, wire.Heartbeat):
                self._outbox += wire.encode(frame)
                continue
            elif (
                isinstance(
                    frame,
                    wire.BindResponse
                    | wire.UnbindResponse
                    | wire.Status
                    | wire.Confirmed
                    | wire.ConfirmFailed
                    | wire.DedupOn,
                )
                and self._waiting
                and isinstance(frame, self._waiting[0][0])
            ):
                return Reply(self._waiting.popleft()[1], frame)
            raise ProtocolError(f"unexpected {frame!r} from the broker")
        return None

    def data_to_send(self) -> bytes:
        """Bytes the protocol itself wants written (heartbeat answers)."""
        out = bytes(self._outbox)
        self._outbox.clear()
        return out

    def abandon(self) -> list[T]:
        """The tokens of every unanswered request; the connection is gone."""
        tokens = [token for _, token in self._waiting]
        self._waiting.clear()
        return tokens
