"""The command channel's protocol without I/O: bytes in; events, replies and bytes out
(fqd_ccs.c; docs/fq-protocol.md §1.3-§1.8).

:class:`CommandMachine` (whose docstring is the theory of operation) goes AWAIT_AUTH ->
READY -> CLOSED. Requests that need the broker come out as events, and the caller answers
each; replies go out in request order however many a client pipelines. Time is passed in,
never read, and scheduling the next heartbeat check is the caller's: one clock serves
every session (:mod:`fqbroker.frontends.kit.heartbeats`).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Final, Generic, TypeVar

from fqbroker.core.queuespec import QueueSpec, parse_queue_field
from fqbroker.errors import AuthError, ProtocolError, QueueError
from fqbroker.protocols.fq import wire

if TYPE_CHECKING:
    from fqbroker.core.router import ClientStats

__all__ = [
    "Authenticate",
    "Broken",
    "CommandEvent",
    "CommandMachine",
    "EndOfInput",
    "HeartbeatsAsked",
    "Phase",
    "Refused",
]

T = TypeVar("T")

HEARTBEAT = wire.encode(wire.Heartbeat())
HEARTBEAT_FAILED = wire.encode(wire.ErrorReply("client heartbeat failed"))
# The decoder of every session past auth with nothing buffered, never fed: a session's own
# decoder, buffer and bytearray are 150 bytes in each of 10,000 idle clients.
_IDLE: Final = wire.ServerCommandDecoder(authed=True)
_INTERVALS: dict[int, int] = {}


class Phase(Enum):
    AWAIT_AUTH = "await_auth"
    READY = "ready"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Authenticate:
    """The auth request: answer with :meth:`CommandMachine.accept` or ``refuse``."""

    user: bytes
    spec: QueueSpec
    # Checked only under auth = "password"; kept out of repr (logs) and equality.
    password: bytes = field(default=b"", repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class HeartbeatsAsked:
    """The client asked for heartbeats: look at it at ``when``; ``None`` stops them."""

    when: float | None


@dataclass(frozen=True, slots=True)
class Refused:
    """Input the broker answers with an error frame (queued) and then lingers
    (docs/fq-protocol.md §1.8)."""

    error: AuthError | QueueError


@dataclass(frozen=True, slots=True)
class Broken:
    """Input no answer fits: the connection is closed without one."""

    error: ProtocolError


@dataclass(frozen=True, slots=True)
class EndOfInput:
    """The client hung up with nothing left to answer."""


CommandEvent = (
    Authenticate
    | HeartbeatsAsked
    | wire.StatusRequest
    | wire.BindRequest
    | wire.UnbindRequest
    | wire.ConfirmRequest
    | wire.DedupRequest
    | Refused
    | Broken
)


class CommandMachine(Generic[T]):
    """One command connection's protocol state; ``T`` is the caller's confirm token.

    Three phases::

        AWAIT_AUTH --auth request read--> READY
        AWAIT_AUTH or READY --refused, bad input, heartbeat failed, end of input,
                              close()--> CLOSED

    The first frame must be the plain-auth request; the decoder knows that grammar, and
    its one "auth read" flag is the only record of having passed it, so the phase is read
    off the decoder (and CLOSED is having none: a closed machine reads nothing more; READY
    with nothing buffered is the shared ``_IDLE`` decoder, an idle session's own let go).
    Reading the auth request yields :class:`Authenticate`; the caller answers it with
    :meth:`accept` or :meth:`refuse` before it asks for the next event.

    The machine closes itself on what it cannot answer, and says so with the event: after
    :class:`Refused` its error frame (fq's text) waits in :meth:`data_to_send` and the
    caller lingers so a reset cannot destroy it; after :class:`Broken` it closes without a
    word; :meth:`receive_eof` returns one of :class:`Refused` (an auth request cut short)
    and :class:`EndOfInput`.

    Bind, unbind, status and confirm come out as events, the wire frames themselves; the
    caller answers each with the matching method, and the replies go out in request order
    (docs/fq-protocol.md §1.5). Only a confirm cannot be answered at once: :meth:`defer`
    holds its place, with a token of the caller's, and every reply behind it waits until
    :meth:`settle` fills it.

    Time is passed in, never read: ``next_event(now)`` stamps the last read,
    ``data_to_send(now)`` the last write, and ``heartbeat_due(now)`` says whether a
    heartbeat goes out or the client has failed (3x the interval silent,
    docs/fq-protocol.md §1.7) and when to look again.
    """

    __slots__ = (
        "_beat_time",
        "_decoder",
        "_interval_ms",
        "_last_read",
        "_outbox",
        "_replies",
    )

    def __init__(self, now: float) -> None:
        self._decoder: wire.ServerCommandDecoder | None = wire.ServerCommandDecoder()
        self._outbox = b""
        # Replies held behind a confirm still being settled: [token, frame bytes], where
        # a reply answered at once has no token and an unsettled confirm has no bytes yet.
        # None, not an empty deque, whenever nothing waits: most clients never confirm.
        self._replies: collections.deque[list[T | bytes | None]] | None = None
        self._last_read = now
        # Heartbeats: None until first asked for, then the interval (0: stopped). One time
        # serves two ends, which never overlap, in one slot (10,000 idle sessions make
        # every slot count): until heartbeats are first asked for, when the broker last
        # wrote (the first beat is due one interval after it, usually auth's own beat);
        # from then on, when the next beat is due.
        self._interval_ms: int | None = None
        self._beat_time = now

    @property
    def phase(self) -> Phase:
        decoder = self._decoder
        if decoder is None:
            return Phase.CLOSED
        if decoder is _IDLE:
            return Phase.READY
        return Phase.READY if decoder.authed else Phase.AWAIT_AUTH

    @property
    def closed(self) -> bool:
        return self._decoder is None

    # --- bytes in, events out -----------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        decoder = self._decoder
        if decoder is _IDLE:
            decoder = self._decoder = wire.ServerCommandDecoder(authed=True)
        if decoder is not None:  # closed: input is read and thrown away
            decoder.feed(data)

    def receive_eof(self) -> Refused | EndOfInput:
        """The client hung up; call once ``next_event`` has nothing more. An auth request
        cut short is refused with its own error text (the client may still read it)."""
        decoder = self._decoder
        if decoder is _IDLE:
            self.close()  # nothing was cut short: what a fresh decoder would say
        elif decoder is not None:
            decoder.feed_eof()
            try:
                decoder.next_frame()
            except AuthError as exc:
                self.refuse(exc.text)
                return Refused(exc)
            self.close()
        return EndOfInput()

    def next_event(self, now: float) -> CommandEvent | None:
        """The next request to act on, or ``None`` until more bytes arrive.

        ``now`` is when the bytes were read: a whole frame counts as hearing from the client.
        """
        decoder = self._decoder
        if decoder is None or decoder is _IDLE:
            return None
        try:
            while (frame := decoder.next_frame()) is not None:
                self._last_read = now
                match frame:
                    case wire.AuthPlain(user, queue_field, password):
                        # fq reads the password and ignores it (docs/fq-protocol.md §1.3);
                        # the shell checks it when the broker has users (auth = "password").
                        return Authenticate(user, parse_queue_field(queue_field), password)
                    case wire.Heartbeat():
                        continue
                    case wire.HeartbeatRequest(interval_ms):
                        return HeartbeatsAsked(self._ask_heartbeats(interval_ms))
                    case _:
                        return frame
            if decoder.authed and not decoder.buffered:
                # All read: let the decoder and its buffer go until more bytes come.
                self._decoder = _IDLE
            return None
        except (AuthError, QueueError) as exc:
            self.refuse(exc.text)
            return Refused(exc)
        except ProtocolError as exc:
            self.close()
            return Broken(exc)

    # --- answers ------------------------------------------------------------------------

    def accept(self, key: bytes) -> None:
        """The auth request is granted under ``key``: the key, then a first heartbeat."""
        self._outbox += wire.encode(wire.AuthResponse(key)) + HEARTBEAT

    def refuse(self, text: str) -> None:
        """Answer with fq's error text and close: nothing is read or answered after it."""
        self._outbox += wire.encode(wire.ErrorReply(text))
        self.close()

    def bound(self, route_id: int) -> None:
        self._reply(wire.encode(wire.BindResponse(route_id)))

    def unbound(self, route_id: int, ok: bool) -> None:
        self._reply(wire.encode(wire.UnbindResponse(route_id if ok else wire.BIND_ILLEGAL)))

    def status(self, dropped_in: int, stats: ClientStats | None) -> None:
        """The status reply; a client's traffic counters only once its data socket paired."""
        items: list[tuple[str, int]] = [("dropped_in", dropped_in)]
        if stats is not None:
            s = stats
            items += [
                ("no_exchange", s.no_exchange),
                ("no_route", s.no_route),
                ("routed", s.routed),
                ("dropped", s.dropped),
                ("size_dropped", s.size_dropped),
                ("msgs_in", s.msgs_in),
                ("msgs_out", s.msgs_out),
                ("octets_in", s.octets_in),
                ("octets_out", s.octets_out),
            ]
        # Last, so fq clients reading the keys they know see no change: the broker
        # takes confirm requests (docs/confirms.md).
        items.append((wire.CONFIRM_STATUS_KEY, wire.CONFIRM_VERSION))
        # ... and de-duplication requests (docs/confirms.md, "Exactly once").
        items.append((wire.DEDUP_STATUS_KEY, wire.DEDUP_VERSION))
        self._reply(wire.encode(wire.Status(tuple(items))))

    def deduplicating(self) -> None:
        """The answer to a de-duplication request: from now on."""
        self._reply(wire.encode(wire.DedupOn()))

    def defer(self, token: T) -> None:
        """Hold the place of a confirm's reply; every later reply waits behind it."""
        if self._decoder is None:
            return
        if self._replies is None:
            self._replies = collections.deque()
        self._replies.append([token, None])

    def settle(self, token: T, count: int, why: str | None) -> None:
        """The confirm held by ``token`` is answered: ``why`` it failed, or ``None``."""
        frame = wire.Confirmed(count) if why is None else wire.ConfirmFailed(count, why)
        self._fill(token, wire.encode(frame))

    def drop(self, token: T) -> None:
        """The confirm held by ``token`` gets no reply (its work failed); later ones go."""
        self._fill(token, b"")

    def _reply(self, reply: bytes) -> None:
        if self._decoder is None:
            return
        if self._replies:
            self._replies.append([None, reply])
        else:
            self._outbox += reply

    def _fill(self, token: T, reply: bytes) -> None:
        replies = self._replies
        if replies is None:
            return  # closed meanwhile
        for entry in replies:
            if entry[0] is token and entry[1] is None:
                entry[1] = reply
                break
        while replies and replies[0][1] is not None:
            ready = replies.popleft()[1]
            assert isinstance(ready, bytes)
            self._outbox += ready
        if not replies:
            self._replies = None

    # --- bytes out ----------------------------------------------------------------------

    def data_to_send(self, now: float) -> bytes:
        """What to write now; ``now`` is when it goes out (the heartbeat grid counts from it)."""
        out = self._outbox
        if out:
            self._outbox = b""
            if self._interval_ms is None:
                self._beat_time = now
        return out

    def close(self) -> list[T]:
        """No more reading or replies; returns the tokens of confirms left unsettled."""
        self._decoder = None
        replies, self._replies = self._replies, None
        tokens: list[T] = []
        for token, _reply in replies or ():
            if token is not None:
                tokens.append(token)  # type: ignore[arg-type]  # only tokens sit there
        return tokens

    # --- heartbeats (docs/fq-protocol.md §1.7) ------------------------------------------

    @property
    def heartbeat_ms(self) -> int:
        """The heartbeat interval the client asked for; 0 for none."""
        return self._interval_ms or 0

    def _ask_heartbeats(self, interval_ms: int) -> float | None:
        if interval_ms == 0:
            if self._interval_ms is not None:
                self._interval_ms = 0
            return None
        interval = interval_ms / 1000
        if self._interval_ms is None:
            self._beat_time += interval  # one interval after the last write
        # One int object per interval in use (1000 is no cached small int): 28 bytes in
        # every idle client otherwise. Up to a few dozen intervals; any more are kept as read.
        self._interval_ms = _INTERVALS.get(interval_ms, interval_ms)
        if len(_INTERVALS) < 64:
            _INTERVALS.setdefault(interval_ms, interval_ms)
        return min(self._beat_time, self._last_read + 3 * interval)

    def heartbeat_due(self, now: float) -> float | None:
        """Queue the heartbeat due at ``now``, or fail the client after 3x the interval of
        silence (an error frame, then closed); returns when to look again, if ever."""
        if not self._interval_ms or self.phase is not Phase.READY:
            return None
        interval = self._interval_ms / 1000
        deadline = self._last_read + 3 * interval
        if now >= deadline:
            self._outbox += HEARTBEAT_FAILED
            self.close()
            return None
        if now >= self._beat_time:
            self._outbox += HEARTBEAT
            # Due one interval after the last one was *due*, not after it went out:
            # with thousands of sessions the loop runs a wave of timers late, and
            # counting from the send time added that lateness to every period.
            self._beat_time += interval
            if self._beat_time <= now:
                self._beat_time = now + interval
        return min(self._beat_time, deadline)
