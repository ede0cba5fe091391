"""The Lumberjack listener's asyncio shell: one shipper's connection (docs/lumberjack.md).

The wire format is the sans-I/O :class:`~fqbroker.frontends.lumberjack.protocol.Receiver`;
this module moves bytes into it, publishes the events it decodes, and writes ACKs. It has
no task of its own while a connection is idle: the idle-ACK and keepalive timers are
loop timers, and a task exists only while the session waits for room in a queue, for the
memory budget, or for a disk queue's fsync.

Theory of operation
-------------------
**Publishing.** Each read is fed to the receiver and every event it yields becomes one fq
message: the configured exchange, the route its template picks, the event's JSON bytes,
sender ``lumberjack/ip:port`` and our node id as the only hop, as HTTP ``/submit`` stamps
them. A read's events go to the connection's
:class:`~fqbroker.core.publisher.Publisher` as runs in one call, never one await per
event.

**ACK points.** An ACK names the last sequence number received (not a count; pylogbeat's
numbers run on across batches, go-lumber's restart at 1). A point to acknowledge is
marked, in arrival order, when a window's worth of events has arrived since its ``W``,
when a new ``W`` ends a batch that was not full, and when input has been idle for
``ack_idle_ms`` with events unmarked (lumberjack-protocol sends one ``W`` and then
streams). A point is sent once every event up to it is in every matching queue
(``Publisher.handled``) and what went to disk queues is durable under their fsync policy
(``Publisher.durable``), strictly in order, so pipelined batches are acknowledged one
after the other.

**Backpressure.** When a block-policy queue is full the publisher stops; the session
pauses reading (the shipper's TCP window closes, and its batch's ACK waits) and, while
a v2 batch is unacknowledged, sends ``ACK(0)`` every ``keepalive_seconds``, which Beats
and go-lumber read as "still working". v1 has no keepalive. What the receiver holds is
reserved against the broker's memory budget, and reading also pauses while the budget is
spent or the shipper does not read its ACKs (the transport asks us to pause writing).

**Bad input.** A :class:`Violation` (a limit exceeded, a malformed frame) closes this
connection with one rate-limited log line and ``fq_bad_input_total{frontend="lumberjack"}``.
Events decoded before it are still routed but never acknowledged, so the shipper sends
them again; what was acknowledged is in its queues already.

**End.** At EOF the session marks what is unacknowledged, sends the ACKs it owes once
their events are routed and durable (a shipper may half-close and wait for them), then
closes.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from fqbroker.core.frames import encode_peer
from fqbroker.frontends.acks import DurableAcks
from fqbroker.frontends.lumberjack.mapping import RouteTemplate, sender_for
from fqbroker.frontends.lumberjack.protocol import (
    Event,
    Events,
    Limits,
    Receiver,
    Violation,
    Window,
    encode_ack,
)
from fqbroker.server.connections import WRITE, HeldReading, RemotePeer, peer_address

if TYPE_CHECKING:
    from fqbroker.config import Settings
    from fqbroker.core.budget import MemoryBudget
    from fqbroker.core.message import MsgIdCounter, Run
    from fqbroker.core.publisher import Publisher
    from fqbroker.core.router import ClientStats
    from fqbroker.server.frontend import LiveFrontEnd
    from fqbroker.server.limits import Limits as BrokerLimits

__all__ = ["Config", "LumberjackHost", "LumberjackSession"]

log = logging.getLogger(__name__)

# Why reading is paused; reading resumes when none is left.
_ROOM = 1  # a block-policy queue is full
_BUDGET = 2  # the memory budget is spent
_WRITE = WRITE  # the client does not read what we write


class LumberjackHost(Protocol):
    """What a Lumberjack session needs of the broker that accepted it."""

    node_id: bytes
    settings: Settings
    budget: MemoryBudget
    limits: BrokerLimits
    msgids: MsgIdCounter

    def closed(self, transport: asyncio.Transport) -> None: ...

    def make_publisher(self, stats: ClientStats | None = None) -> Publisher: ...


@dataclass(frozen=True, slots=True)
class Config:
    """What every connection of one listener shares, made once from the settings."""

    exchange: bytes
    template: RouteTemplate
    limits: Limits
    ack_idle: float  # seconds
    keepalive: float  # seconds


class LumberjackSession(HeldReading, RemotePeer, asyncio.Protocol):
    """One shipper's connection: decode, publish, acknowledge."""

    __slots__ = (
        "_acks",
        "_eof",
        "_holds",
        "_idle",
        "_in_window",
        "_keepalive",
        "_last_read",
        "_last_seq",
        "_mapped",
        "_reserved",
        "_room",
        "_sender",
        "_unmarked",
        "_version",
        "_waiting_bytes",
        "_window",
        "acked",
        "broker",
        "closing",
        "config",
        "live",
        "publisher",
        "receiver",
        "transport",
    )

    def __init__(
        self,
        host: LumberjackHost,
        live: LiveFrontEnd,
        transport: asyncio.Transport,
        config: Config,
    ) -> None:
        # Named so because the loop's exception handler asks a protocol for its broker.
        self.broker = host
        self.live = live
        self.transport = transport
        self.config = config
        self.receiver = Receiver(config.limits)
        self.publisher = host.make_publisher()
        self._sender = sender_for(*peer_address(transport))
        # The batch being read: its version, window, events since its W (or since the
        # window last filled), the last seq received, and events not yet in a mark.
        self._version = 2
        self._window = 0
        self._in_window = 0
        self._last_seq = 0
        self._unmarked = 0
        self._mapped = 0  # events made into messages so far
        # Points to acknowledge, in order: (version, seq), each due once the events up
        # to it are routed and durable.
        self._acks: DurableAcks[tuple[int, int]] = DurableAcks(
            self.publisher, self._send, self._disk_failed, self._ack_ready
        )
        self.acked = 0  # the last seq acknowledged, for /frontends.json
        self._holds = 0
        self._room: asyncio.Task[None] | None = None  # waiting for room or budget
        self._idle: asyncio.TimerHandle | None = None
        self._keepalive: asyncio.TimerHandle | None = None
        self._last_read = 0.0
        self._reserved = 0  # bytes of the memory budget the receiver's buffer holds
        # Bytes of messages held while a full queue makes them wait, counted against the
        # budget (they are in memory and in no queue yet) until they are published.
        self._waiting_bytes = 0
        self._eof = False
        self.closing = False
        counters = live.counters
        if counters.bytes_in is None:
            counters.bytes_in = counters.bytes_out = 0

    # --- what /frontends.json shows -------------------------------------------------------

    @property
    def held(self) -> str:
        """Why reading is paused: "room", "budget", "write", or "" while it reads."""
        return ",".join(
            name for bit, name in ((_ROOM, "room"), (_BUDGET, "budget"), (_WRITE, "write"))
            if self._holds & bit
        )  # fmt: skip

    @property
    def events(self) -> int:
        return self._mapped

    @property
    def version(self) -> int:
        return self._version

    # --- protocol -------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        counters = self.live.counters
        counters.bytes_in += len(data)  # type: ignore[operator]  # set in __init__
        self.receiver.receive_data(data)
        self._last_read = asyncio.get_running_loop().time()
        if self._room is None:
            self._pump()

    def eof_received(self) -> bool:
        # The shipper may half-close and wait for its ACKs: what it sent is routed and
        # acknowledged first, then the connection closes (_finish).
        self._eof = True
        if not self.closing:
            if self.receiver.buffered:
                log.debug("lumberjack %s: %d bytes of a frame cut off at EOF", self._name(),
                          self.receiver.buffered)  # fmt: skip
            self._mark()
            self._ack_ready()  # and close once nothing is owed
        # A TLS transport closes at EOF whatever we answer (and warns if told otherwise):
        # the ACKs owed are lost with it, and the shipper sends those events again.
        return self.transport.get_extra_info("ssl_object") is None

    def connection_lost(self, exc: Exception | None) -> None:
        self._end()
        self.broker.closed(self.transport)

    def close(self) -> None:
        self._end()
        self.transport.close()

    def _end(self) -> None:
        if self.closing:
            return
        self.closing = True
        self.publisher.close()
        for handle in (self._idle, self._keepalive):
            if handle is not None:
                handle.cancel()
        self._idle = self._keepalive = None
        if self._room is not None:
            self._room.cancel()
            self._room = None
        self._acks.close()
        if self._reserved or self._waiting_bytes:
            self.broker.budget.release(self._reserved + self._waiting_bytes)
            self._reserved = self._waiting_bytes = 0

    def _name(self) -> str:
        return "{}:{}".format(*peer_address(self.transport))

    # --- in: decode and publish -----------------------------------------------------------

    def _pump(self) -> None:
        """Publish every event the receiver has whole; mark what to acknowledge."""
        receiver = self.receiver
        runs: list[Run] = []
        octets = 0
        violation: Violation | None = None
        while (event := receiver.next_event()) is not None:
            if isinstance(event, Events):
                if event.events:
                    octets += self._add(event.version, event.events, runs)
            elif isinstance(event, Window):
                self._new_window(event)
            else:
                assert isinstance(event, Violation)
                violation = event
                break
        if runs and not self.publisher.publish(runs, octets):
            self._wait_for_room(octets)
        if violation is not None:
            self.broker.limits.bad(
                "lumberjack", "closing Lumberjack connection from %s: %s", self._name(),
                violation.reason,
            )  # fmt: skip
            self.close()
            return
        if self._unmarked:
            if self._eof:
                self._mark()  # nothing more is coming
            else:
                self._arm_idle()
        # Earlier batches are acknowledged even while a later one waits for room.
        self._ack_ready()
        if self._room is None and not self.closing:
            self._reserve()

    def _new_window(self, window: Window) -> None:
        """A W: the batch before it ends, acknowledged as far as it got (as Logstash)."""
        self._mark()
        self._version = window.version
        self._window = window.size
        self._in_window = 0
        if window.size == 0:
            # An empty batch is acknowledged at once with seq 0, as Logstash does.
            self._acks.owe((window.version, 0), self._mapped)

    def _add(self, version: int, events: list[Event], runs: list[Run]) -> int:
        """Make ``events`` into messages appended to ``runs`` (a run per route in a row),
        mark the windows they fill; returns their frames' bytes."""
        config = self.config
        exchange = config.exchange
        route_of = config.template.route
        next_id = self.broker.msgids.next
        sender = self._sender
        hops = self.broker.node_id
        octets = 0
        route: bytes | None = None
        frames: list[bytes] = []
        for event in events:
            payload = event.payload
            this = route_of(event)
            frame = encode_peer(exchange, this, next_id(), sender, hops, payload)
            octets += len(frame)
            if this != route:
                route = this
                frames = [frame]
                runs.append((exchange, this, frames, len(frame) - len(payload)))
            else:
                frames.append(frame)
        self._count(version, events)
        return octets

    def _count(self, version: int, events: list[Event]) -> None:
        """Move the batch's counters over ``events``, marking each window they fill."""
        self._version = version
        n = len(events)
        start = self._mapped
        window = self._window
        done = 0
        if window > 0:
            while n - done >= window - self._in_window:
                done += window - self._in_window
                self._in_window = 0
                self._acks.owe((version, events[done - 1].seq), start + done)
        self._in_window += n - done
        self._unmarked = n - done if done else self._unmarked + n
        self._last_seq = events[-1].seq
        self._mapped = start + n

    def _mark(self) -> None:
        """Mark the events received and not yet marked (a W, idle input, EOF)."""
        if self._unmarked:
            self._acks.owe((self._version, self._last_seq), self._mapped)
            self._unmarked = 0

    def _arm_idle(self) -> None:
        if self._idle is None:
            loop = asyncio.get_running_loop()
            self._idle = loop.call_later(self.config.ack_idle, self._on_idle)

    def _on_idle(self) -> None:
        """The idle timer: one per connection with events unmarked, moved on by reads."""
        self._idle = None
        if self.closing or not self._unmarked:
            return
        loop = asyncio.get_running_loop()
        wait = self._last_read + self.config.ack_idle - loop.time()
        if wait > 0.001:
            self._idle = loop.call_later(wait, self._on_idle)
            return
        self._mark()
        self._ack_ready()

    # --- holding back ---------------------------------------------------------------------

    def _hold(self, why: int) -> None:
        super()._hold(why)
        if why != _WRITE and self._keepalive is None and not self.closing:
            loop = asyncio.get_running_loop()
            self._keepalive = loop.call_later(self.config.keepalive, self._send_keepalive)

    def _send_keepalive(self) -> None:
        """ACK(0) while held back with a v2 batch unacknowledged: Beats keep waiting."""
        self._keepalive = None
        if self.closing or not self._holds & (_ROOM | _BUDGET):
            return
        if self._version == 2 and (self._acks or self._unmarked) and not self._holds & _WRITE:
            self._write(encode_ack(2, 0))
        loop = asyncio.get_running_loop()
        self._keepalive = loop.call_later(self.config.keepalive, self._send_keepalive)

    def _wait_for_room(self, octets: int) -> None:
        """Block policy: stop reading until every full queue has room, then go on."""
        self._hold(_ROOM)
        # Already in memory, so taken from the budget without waiting (the read's whole
        # size: what was published of it is in queues, which count it too, for a while).
        self._waiting_bytes = octets
        self.broker.budget.used += octets
        self._room = asyncio.ensure_future(self._room_then_carry_on())

    async def _room_then_carry_on(self) -> None:
        await self.publisher.finish()
        self._room = None
        self.broker.budget.release(self._waiting_bytes)
        self._waiting_bytes = 0
        self._release(_ROOM)
        self._pump()  # what was read meanwhile (a read may have been under way)

    def _reserve(self) -> None:
        """Hold budget for what the receiver buffers; pause reading while it cannot."""
        self._reserved, grow = self.broker.budget.resize(self._reserved, self.receiver.buffered)
        if grow is None:
            return
        self._hold(_BUDGET)
        self._room = asyncio.ensure_future(self._wait_for_budget(grow))

    async def _wait_for_budget(self, grow: int) -> None:
        await self.broker.budget.acquire(grow)
        self._room = None
        if self.closing:
            self.broker.budget.release(grow)  # closed between its wake-up and now
            return
        self._reserved += grow
        self._release(_BUDGET)
        self._pump()  # whatever arrived while reading was being paused

    # --- out: acknowledge -----------------------------------------------------------------

    def _ack_ready(self) -> None:
        """Send the marks whose events are routed, once what went to disk is durable."""
        if self.closing:
            return
        self._acks.ready()
        self._finish()

    def _disk_failed(self) -> None:
        # Unacknowledged, so the shipper sends the events again: to this broker once its
        # disk works, or to another.
        self.broker.limits.log.log(
            logging.WARNING, "lumberjack", "closing Lumberjack connection from %s: a disk queue "
            "write failed; its events are not acknowledged", self._name(),
        )  # fmt: skip
        self.close()

    def _send(self, due: list[tuple[int, int]]) -> None:
        """Write an ACK for each mark now due, in order."""
        self.acked = due[-1][1]
        self._write(b"".join([encode_ack(version, seq) for version, seq in due]))

    def _write(self, data: bytes) -> None:
        self.live.counters.bytes_out += len(data)  # type: ignore[operator]  # set in __init__
        self.transport.write(data)

    def _finish(self) -> None:
        """After EOF: close once nothing is left to publish or acknowledge."""
        if self._eof and not self.closing and not self._acks and self._room is None:
            self.close()
