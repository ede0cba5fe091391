"""The command channel: auth, then bind/unbind/status/heartbeats (fqd_ccs.c).

Phases: AWAIT_AUTH -> READY -> CLOSED. The session is a protocol, not a task: whatever
arrives is decoded and every whole command handled at once, in order, so replies go out
in request order however many a client pipelines (§1.5). Only a confirm waits; its reply,
and the replies behind it, go out when it is settled. Heartbeats come from the broker's
one :class:`~fqbroker.server.heartbeats.HeartbeatClock` once a client asked for them with
``HeartbeatRequest`` (§1.7): an idle session costs no task and no timer of its own.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Coroutine
from enum import Enum
from typing import TYPE_CHECKING

from fqbroker.core.queuespec import parse_queue_field
from fqbroker.core.router import ClientStats
from fqbroker.errors import AuthError, ProtocolError, QueueError
from fqbroker.frontends.fq import wire
from fqbroker.server.connections import RemotePeer

if TYPE_CHECKING:
    from fqbroker.core.queue import Queue
    from fqbroker.frontends.fq.data import DataSession
    from fqbroker.server.broker import Broker
    from fqbroker.server.heartbeats import Entry

__all__ = ["CommandSession", "Phase"]

log = logging.getLogger(__name__)

LINGER_SECONDS = 1.0
HEARTBEAT = wire.encode(wire.Heartbeat())


class Phase(Enum):
    AWAIT_AUTH = "await_auth"
    READY = "ready"
    CLOSED = "closed"


class CommandSession(RemotePeer, asyncio.Protocol):
    """One authenticated client: its queue, key, counters and (paired) data channel."""

    __slots__ = (
        "_beat",
        "_last_read",
        "_last_sent",
        "_next_beat",
        "_pairing",
        "_replies",
        "broker",
        "data",
        "decoder",
        "heartbeat_ms",
        "key",
        "phase",
        "queue",
        "stats",
        "transport",
        "user",
    )

    def __init__(self, broker: Broker, transport: asyncio.Transport) -> None:
        self.broker = broker
        self.transport = transport
        self.phase = Phase.AWAIT_AUTH
        self.decoder = wire.ServerCommandDecoder()
        self.user = b""
        self.queue: Queue | None = None
        self.key = b""
        self.stats = ClientStats()
        self.data: DataSession | None = None
        # The data socket's first pairing: False before it, a future while a confirm waits
        # for it, True once it has paired (a missing channel is then an answer at once).
        self._pairing: asyncio.Future[None] | bool = False
        self.heartbeat_ms = 0
        now = broker.heartbeats.time()
        self._last_read = now
        self._last_sent = now
        self._next_beat = 0.0
        self._beat: Entry | None = None
        # Replies not yet sent because an earlier one (a confirm) is still pending.
        self._replies: collections.deque[asyncio.Future[wire.Frame]] | None = None

    def __lt__(self, other: object) -> bool:
        # Heartbeat entries of one time compare their sessions; any fixed order will do.
        return id(self) < id(other)

    @property
    def pretty(self) -> str:
        queue = self.queue.name.decode(errors="replace") if self.queue else "?"
        return f"{self.user.decode(errors='replace')}/{queue}@{self.remote_addr}:{self.remote_port}"

    def _send(self, frame: wire.Frame) -> None:
        self._write(wire.encode(frame))

    def _write(self, data: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(data)
            self._last_sent = self.broker.heartbeats.time()

    def _reply(self, frame: wire.Frame) -> None:
        """Answer a request, after any earlier answer still being worked out (confirms)."""
        if not self._replies:
            self._send(frame)
            return
        done: asyncio.Future[wire.Frame] = asyncio.get_running_loop().create_future()
        done.set_result(frame)
        self._replies.append(done)

    def _reply_later(self, work: Coroutine[None, None, wire.Frame]) -> None:
        task = asyncio.ensure_future(work)
        if self._replies is None:
            self._replies = collections.deque()
        self._replies.append(task)
        task.add_done_callback(lambda _: self._send_ready_replies())

    def _send_ready_replies(self) -> None:
        replies = self._replies
        while replies and replies[0].done():
            future = replies.popleft()
            if not future.cancelled() and future.exception() is None:
                self._send(future.result())

    # --- protocol -------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.phase is Phase.CLOSED

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return  # lingering after an error: input is read and thrown away
        decoder = self.decoder
        decoder.feed(data)
        try:
            while (frame := decoder.next_frame()) is not None:
                self._last_read = self.broker.heartbeats.time()
                self._handle(frame)
                if self.phase is Phase.CLOSED:
                    return
        except (AuthError, QueueError) as exc:
            self._refuse(exc)
        except ProtocolError as exc:
            self.broker.limits.bad("command", "closing %s: %s", self.pretty, exc)
            self.close()

    def eof_received(self) -> bool:
        if self.closed:
            return False  # the client saw our error frame and hung up: close now
        self.decoder.feed_eof()
        try:
            self.decoder.next_frame()  # an auth request cut short raises its error text
        except AuthError as exc:
            self._refuse(exc)
            return False
        self.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.broker.closed(self.transport)
        if self.phase is not Phase.CLOSED:
            log.debug("connection lost: %s", self.pretty)
            self._end()

    def pause_writing(self) -> None:
        # A client that does not read its replies is not read from either.
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.phase is not Phase.CLOSED:
            self.transport.resume_reading()

    def _refuse(self, exc: AuthError | QueueError) -> None:
        if isinstance(exc, AuthError):
            self.broker.limits.bad("command", "refusing %s: %r", self.pretty, exc.text)
        else:  # not bad input; a limit's refusal is counted where it is raised
            log.info("refusing %s: %r", self.pretty, exc.text)
        self._send(wire.ErrorReply(exc.text))
        self._end()
        self._linger()

    def _linger(self) -> None:
        """Close without a reset once the error frame is out (as Broker.linger_close).

        Closing with unread input makes the kernel send RST, which can destroy the error
        frame before the client reads it (§1.8). So: half-close after what is queued,
        discard input until the client hangs up or for a moment, then close.
        """
        transport = self.transport
        if transport.is_closing():
            return
        if transport.can_write_eof():
            with contextlib.suppress(OSError):  # ENOTCONN: the client reset already
                transport.write_eof()
        transport.resume_reading()
        asyncio.get_running_loop().call_later(LINGER_SECONDS, transport.close)

    def _end(self) -> None:
        """The session is over: no more heartbeats or replies, the client is deregistered."""
        self.phase = Phase.CLOSED
        if self._beat is not None:
            self.broker.heartbeats.cancel(self._beat)
            self._beat = None
        for reply in self._replies or ():
            reply.cancel()
        self.broker.deregister(self)

    def close(self) -> None:
        """End the session and close the connection after what is queued for it."""
        if self.phase is not Phase.CLOSED:
            self._end()
        self.transport.close()

    def _handle(self, frame: wire.ClientRequest) -> None:
        broker = self.broker
        match frame:
            case wire.AuthPlain(user, queue_field, _password):
                # The password is read and ignored: fq authenticates nobody (§1.3).
                spec = parse_queue_field(queue_field)
                self.user = user
                self.queue = broker.attach(spec, self)
                self.key = broker.register(self)
                self.phase = Phase.READY
                self._send(wire.AuthResponse(self.key))
                self._send(wire.Heartbeat())
                log.info("client %s authenticated", self.pretty)
            case wire.Heartbeat():
                pass
            case wire.HeartbeatRequest(interval_ms):
                self._heartbeats(interval_ms)
            case wire.StatusRequest():
                self._reply(wire.Status(self.status_items()))
            case wire.BindRequest(flags, exchange, program):
                assert self.queue is not None
                route_id = broker.bind(exchange, program, self.queue, flags)
                self._reply(wire.BindResponse(route_id))
            case wire.UnbindRequest(route_id, exchange):
                assert self.queue is not None
                ok = broker.unbind(exchange, route_id, self.queue)
                self._reply(wire.UnbindResponse(route_id if ok else wire.BIND_ILLEGAL))
            case wire.ConfirmRequest(count):
                self._reply_later(self._confirm(count))

    def paired(self, data: DataSession) -> None:
        """The data socket presenting this session's key has paired with it."""
        self.data = data
        if isinstance(self._pairing, asyncio.Future) and not self._pairing.done():
            self._pairing.set_result(None)
        self._pairing = True

    async def _confirm(self, count: int) -> wire.Frame:
        if self.data is None and self._pairing is not True:
            await self._wait_for_pairing()
        data = self.data
        why = "no data channel" if data is None else await data.confirm(count)
        return wire.Confirmed(count) if why is None else wire.ConfirmFailed(count, why)

    async def _wait_for_pairing(self) -> None:
        # A client writes its first messages on the data socket and then confirms on the
        # command socket; the broker may read the confirm before it has even accepted the
        # data socket. Failing it would make a retrying publisher send duplicates.
        if not isinstance(self._pairing, asyncio.Future):
            self._pairing = asyncio.get_running_loop().create_future()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.broker.settings.confirm_pair_timeout):
                await asyncio.shield(self._pairing)

    def status_items(self) -> tuple[tuple[str, int], ...]:
        assert self.queue is not None
        items: list[tuple[str, int]] = [("dropped_in", self.queue.dropped_to)]
        if self.data is not None:
            s = self.stats
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
        return tuple(items)

    # --- heartbeats (§1.7) -----------------------------------------------------------------

    def _heartbeats(self, interval_ms: int) -> None:
        self.heartbeat_ms = interval_ms
        clock = self.broker.heartbeats
        if interval_ms == 0:
            if self._beat is not None:
                clock.cancel(self._beat)
                self._beat = None
            return
        interval = interval_ms / 1000
        if not self._next_beat:
            self._next_beat = self._last_sent + interval  # one interval after auth's beat
        when = min(self._next_beat, self._last_read + 3 * interval)
        if self._beat is not None:
            if self._beat[0] <= when:
                return  # it comes up first anyway and then looks again
            clock.cancel(self._beat)
        self._beat = clock.schedule(self, when)

    def heartbeat_due(self, now: float) -> None:
        """Send the heartbeat due, or fail the client after 3x the interval of silence."""
        self._beat = None
        if self.heartbeat_ms == 0 or self.phase is not Phase.READY:
            return
        interval = self.heartbeat_ms / 1000
        deadline = self._last_read + 3 * interval
        if now >= deadline:
            log.info("client %s heartbeat failed", self.pretty)
            self._send(wire.ErrorReply("client heartbeat failed"))
            self.close()
            return
        if now >= self._next_beat:
            self._write(HEARTBEAT)
            # Due one interval after the last one was *due*, not after it went out:
            # with thousands of sessions the loop runs a wave of timers late, and
            # counting from the send time added that lateness to every period.
            self._next_beat += interval
            if self._next_beat <= now:
                self._next_beat = now + interval
        self._beat = self.broker.heartbeats.schedule(self, min(self._next_beat, deadline))
