"""The asyncio tail every publishing session shares: room, budget, ACKs once durable.

A Lumberjack or Figg connection hands what it reads to its sans-IO machine and publishes
the :class:`~fqbroker.frontends.kit.acks.Batch` events it makes through its own
:class:`~fqbroker.core.publisher.Publisher`. :class:`PublishingSession` is the part of
their asyncio shells that is the same for both, written once; its docstring says what it
does.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, ClassVar, Protocol

from fqbroker.core.publisher import WRITE_FAILED
from fqbroker.frontends.kit.acks import BadInput, Batch
from fqbroker.frontends.kit.connections import WRITE, HeldReading, RemotePeer, peer_address
from fqbroker.frontends.kit.reservations import UNRESERVED, StallWatch, may_reserve

if TYPE_CHECKING:
    from fqbroker.core.budget import MemoryBudget, Share
    from fqbroker.core.publisher import Publisher
    from fqbroker.core.router import ClientStats
    from fqbroker.frontends.kit.component import LiveFrontEnd
    from fqbroker.frontends.kit.limits import Limits as BrokerLimits
    from fqbroker.settings.broker import Settings
    from fqbroker.storage.diskalarm import DiskAlarm

__all__ = [
    "BUDGET",
    "DISK",
    "HELD_BACK",
    "ROOM",
    "PublishingHost",
    "PublishingMachine",
    "PublishingSession",
]

# Why reading is paused (bits of HeldReading._holds, beside WRITE).
ROOM = 1  # a block-policy queue is full
BUDGET = 2  # the memory budget is spent
DISK = 4  # the disk alarm is raised: free space below disk_free_limit
HELD_BACK = ROOM | BUDGET | DISK  # held by the broker, not by the client


class PublishingHost(Protocol):
    """What a publishing session needs of the broker that accepted it."""

    settings: Settings
    budget: MemoryBudget
    limits: BrokerLimits
    disk_alarm: DiskAlarm

    def closed(self, transport: asyncio.Transport) -> None: ...

    def make_publisher(self, stats: ClientStats | None = None) -> Publisher: ...


class PublishingMachine(Protocol):
    """What the tail needs of a front end's sans-IO machine."""

    @property
    def buffered(self) -> int:
        """Bytes received and not yet decoded."""
        ...

    @property
    def in_flight(self) -> int:
        """What those bytes will take once the frame they start is whole, as far as its
        head announces it (at least :attr:`buffered`): what is reserved."""
        ...

    @property
    def ack_due(self) -> int | None:
        """How many messages the oldest ACK owed waits for; None when none is owed."""
        ...

    def receive_data(self, data: bytes, now: float) -> None: ...

    def next_event(self) -> object | None: ...

    def acknowledge(self, handled: int) -> None:
        """The first ``handled`` messages are routed and durable: owe their ACKs no more."""
        ...

    def data_to_send(self) -> bytes: ...


class PublishingSession(HeldReading, RemotePeer):
    """The shared tail of a session that publishes what it reads and acknowledges it.

    * **Room.** A block-policy queue that is full stops the publisher: reading pauses
      (:data:`ROOM`) and a task waits for room, publishes the rest of the batch, and goes on
      with what was read meanwhile. Earlier batches are acknowledged while a later one waits.
    * **Budget.** A machine may hand one read's messages in several batches: the next is
      asked for only once there is room in the queues and, for a connection that waits for
      the budget, while the budget is not spent.
      What the machine buffers (a partial frame) is reserved against the broker's
      memory budget, through the connection's share of it (kit/reservations.py: within the
      per-connection and per-user caps, not at all for a connection with no user under
      ``auth = "password"``, and closed if the frame stalls); while the budget cannot
      take it, reading pauses (:data:`BUDGET`) and a task waits for it.
    * **Disk alarm.** While free space is below ``disk_free_limit`` a batch is not
      published: reading pauses (:data:`DISK`), and a task waits for the alarm to clear,
      then publishes the batch and goes on (docs/reliability.md, "Disk alarm"). Nothing
      is acknowledged meanwhile; earlier batches are.
    * **ACKs.** The machine's ACKs are sent strictly in order, each once the messages it
      covers are handled by the publisher and, where disk stores took them, durable under
      the broker's fsync policy (``Publisher.durable``: a task waits for the fsync).
    * **Disk failure.** A failed write or fsync closes the connection without the ACK: the
      client sends those messages again.
    * **Refused.** So does a message a full reject-policy queue refused (docs/queues.md),
      with its own log line.
    * **Keepalives.** A protocol with a keepalive frame (:meth:`_keepalive_every` above 0)
      sends it every so often while reading is held back for any reason but :data:`WRITE`
      (the client not reading: nothing could be written) and while an ACK waits for an
      fsync: whatever holds the connection, the client keeps waiting instead of timing
      out and sending it all again.

    It owns no task while nothing waits. The front end's session adds its own events
    (:meth:`_control`), timers and what /frontends.json shows.
    """

    __slots__ = (
        "_durable",
        "_eof",
        "_holds",
        "_keepalive",
        "_room",
        "_share",
        "_stall",
        "_waiting_bytes",
        "broker",
        "closing",
        "live",
        "machine",
        "publisher",
        "transport",
        "user",
    )

    # The front end's name (its bad-input counter and log kind) and its name in log lines.
    FRONTEND: ClassVar[str]
    TITLE: ClassVar[str]
    # Whether a batch that waits for room counts against the memory budget meanwhile.
    HOLD_WAITING: ClassVar[bool] = False

    broker: PublishingHost
    machine: PublishingMachine

    def __init__(
        self,
        host: PublishingHost,
        live: LiveFrontEnd,
        transport: asyncio.Transport,
        machine: PublishingMachine,
    ) -> None:
        # Named so because the loop's exception handler asks a protocol for its broker.
        self.broker = host
        self.live = live
        self.transport = transport
        self.machine = machine
        self.publisher = host.make_publisher()
        self._holds = 0  # ROOM, BUDGET, WRITE and the session's own: why reading is paused
        self._room: asyncio.Task[None] | None = None  # waiting for room or budget
        self._durable: asyncio.Task[None] | None = None  # waiting for an fsync to ACK
        self._keepalive: asyncio.TimerHandle | None = None
        # Who the connection is (None: it has not said; a client certificate names it),
        # and its share of the memory budget, made when it first reserves: what the
        # machine's buffer holds.
        self.user: str | None = None
        self._share: Share | None = None
        self._stall: StallWatch | None = None
        # Bytes of a batch held while a full queue makes it wait, counted against the
        # budget (in memory and in no queue yet) until it is published (HOLD_WAITING).
        self._waiting_bytes = 0
        self._eof = False
        self.closing = False

    # --- protocol -------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.live.counters.bytes_in += len(data)  # type: ignore[operator]  # counts_bytes
        self.machine.receive_data(data, asyncio.get_running_loop().time())
        if self._room is None:
            self._pump()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end()
        self.broker.closed(self.transport)

    def close(self) -> None:
        if not self.closing:
            self._flush()  # replies to the frames before the one that ends it
        self._end()
        self.transport.close()

    def write(self, data: bytes) -> None:
        self.live.counters.bytes_out += len(data)  # type: ignore[operator]  # counts_bytes
        self.transport.write(data)

    def _end(self) -> bool:
        """Let go of everything the connection holds; False if it was let go already."""
        if self.closing:
            return False
        self.closing = True
        self.publisher.close()
        for task in (self._room, self._durable):
            if task is not None:
                task.cancel()
        self._room = self._durable = None
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        if self._share is not None:
            self._share.close()
        if self._stall is not None:
            self._stall.cancel()
        if self._waiting_bytes:
            self.broker.budget.release(self._waiting_bytes)
            self._waiting_bytes = 0
        return True

    def _name(self) -> str:
        return "{}:{}".format(*peer_address(self.transport))

    def _flush(self) -> None:
        data = self.machine.data_to_send()
        if data:
            self.write(data)

    # --- keepalives while held back ------------------------------------------------------

    def _keepalive_every(self) -> float:
        """Seconds between keepalives while held back; 0: the protocol has none."""
        return 0.0

    def _send_keepalive(self) -> None:
        """Have the machine write its keepalive, if the client may be waiting for one."""

    def _hold(self, why: int) -> None:
        super()._hold(why)
        if why != WRITE:
            self._arm_keepalive()

    def _arm_keepalive(self) -> None:
        if self._keepalive is None and not self.closing:
            seconds = self._keepalive_every()
            if seconds > 0:
                loop = asyncio.get_running_loop()
                self._keepalive = loop.call_later(seconds, self._on_keepalive)

    def _on_keepalive(self) -> None:
        self._keepalive = None
        if self.closing or not (self._holds & ~WRITE or self._durable is not None):
            return  # neither held back nor waiting for an fsync: the timer stops
        if not self._holds & WRITE:
            self._send_keepalive()
            self._flush()
        self._arm_keepalive()

    # --- in: the machine's events ---------------------------------------------------------

    def _pump(self) -> None:
        """Act on every event the machine has: publish its batches, close on bad input,
        hand the others to :meth:`_control`; then acknowledge and reserve."""
        machine = self.machine
        spent = False
        while (event := machine.next_event()) is not None:
            if isinstance(event, Batch):
                self._publish(event)
                if self.closing:
                    return  # refused by the session (a right its user lacks)
                if self._room is not None:
                    break  # the machine's next batch once there is room, or no alarm
                if self._spent():
                    spent = True  # and once the budget is not spent
                    break
            elif isinstance(event, BadInput):
                self.broker.limits.bad(
                    self.FRONTEND, f"closing {self.TITLE} connection from %s: %s",
                    self._name(), event.reason,
                )  # fmt: skip
                self.close()
                return
            else:
                self._control(event)
                if self.closing:
                    return
        self._pumped()
        # Earlier batches are acknowledged even while a later one waits for room.
        self._ack_ready()
        if self._room is None and not self.closing:
            self._reserve()
            if spent and self._room is None and not self.closing:
                self._hold(BUDGET)
                self._room = asyncio.ensure_future(self._budget_then_carry_on())

    def _control(self, event: object) -> None:
        """An event of the front end's own (Figg's ATTACH and DETACH)."""
        raise TypeError(f"{type(self).__name__} has no events like {event!r}")

    def _pumped(self) -> None:
        """After the machine's events of a read: the session's timers."""

    def _publish(self, batch: Batch) -> None:
        if self.broker.disk_alarm.raised:
            self._hold(DISK)
            self._hold_waiting(batch)
            self._room = asyncio.ensure_future(self._alarm_then_carry_on(batch))
            return
        if self.publisher.publish(batch.runs, batch.octets):
            return
        # Block policy: stop reading until every full queue has room, then go on.
        self._hold(ROOM)
        self._hold_waiting(batch)
        self._room = asyncio.ensure_future(self._room_then_carry_on())

    def _hold_waiting(self, batch: Batch) -> None:
        if self.HOLD_WAITING:
            # Already in memory, so taken from the budget without waiting (the batch's
            # whole size: what was published of it is in queues, which count it too).
            self._waiting_bytes = batch.octets
            self.broker.budget.used += batch.octets

    async def _alarm_then_carry_on(self, batch: Batch) -> None:
        await self.broker.disk_alarm.wait_clear()
        self._room = None
        if self._waiting_bytes:
            self.broker.budget.release(self._waiting_bytes)
            self._waiting_bytes = 0
        self._release(DISK)
        self._publish(batch)  # which may wait again: for room, or a new alarm
        if self._room is None:
            self._pump()

    async def _room_then_carry_on(self) -> None:
        await self.publisher.finish()
        self._room = None
        if self._waiting_bytes:
            self.broker.budget.release(self._waiting_bytes)
            self._waiting_bytes = 0
        self._release(ROOM)
        self._send_acks()  # the batches published, before what was read meanwhile
        self._pump()

    def _spent(self) -> bool:
        """Whether the budget is spent for a connection that waits for it: a machine
        that hands a read's events in several batches (an inflated one can be far larger
        than the read) is then not asked for the next until it has room."""
        budget = self.broker.budget
        return budget.used > budget.limit and may_reserve(self.broker.settings, self.user)

    def _reserve(self) -> None:
        """Hold budget for what the machine buffers; pause reading while it cannot."""
        machine = self.machine
        need = machine.in_flight
        share = self._share
        if share is None:
            budget = self.broker.budget
            if not need and budget.used <= budget.limit:
                return  # nothing to hold, nothing to wait for: the common case
            if not may_reserve(self.broker.settings, self.user):
                # Reserves nothing: a partial frame of one read is all it may hold.
                if need > UNRESERVED:
                    self._refuse(f"a partial frame of {need} bytes, and no user to reserve for")
                return
            # Keyed as fq and HTTP key their users, so that one user's connections on
            # every front end share its cap.
            user = self.user
            share = self._share = budget.share(None if user is None else user.encode())
        if need > share.cap:
            self._refuse(f"a frame of {need} bytes or more, over max_reserved_per_connection")
            return
        # An announced size is reserved before its bytes are read; otherwise the bytes
        # are in memory already and the reservation grows with them.
        grow = share.resize(need, gradual=need <= machine.buffered)
        if grow is None:
            if share.held:
                self._watch()
            return
        self._hold(BUDGET)
        self._room = asyncio.ensure_future(self._wait_for_budget(share, grow))

    async def _wait_for_budget(self, share: Share, grow: int) -> None:
        await share.acquire(grow)
        self._room = None
        if self.closing:
            share.release()  # closed between its wake-up and now
            return
        self._release(BUDGET)
        self._pump()  # whatever arrived while reading was paused

    async def _budget_then_carry_on(self) -> None:
        await self.broker.budget.wait(0)
        self._room = None
        if not self.closing:
            self._release(BUDGET)
            self._pump()  # the machine's next batch

    def _refuse(self, what: str) -> None:
        """Close for a reservation the connection may not have (no one else's share)."""
        self.broker.limits.bad(
            self.FRONTEND, f"closing {self.TITLE} connection from %s: %s", self._name(), what
        )
        self.close()

    def _watch(self) -> None:
        """A partial frame holds budget: close the connection if it stops arriving."""
        stall = self._stall
        if stall is None:
            seconds = self.broker.settings.partial_message_seconds
            stall = self._stall = StallWatch(seconds, self._progress, self._stalled)
        stall.arm()

    def _progress(self) -> tuple[int, int] | None:
        share = self._share
        if self.closing or self._holds & HELD_BACK or share is None or not share.held:
            # Nothing held, or held back by a full queue or the budget: not the sender's
            # fault. (One that does not read what we write is held back by its own.)
            return None
        return self.machine.buffered, self.publisher.handled

    def _stalled(self) -> None:
        self._refuse(
            f"a partial frame of {self.machine.buffered} bytes stalled for "
            f"{self.broker.settings.partial_message_seconds:g} s (partial_message_seconds)"
        )

    # --- out: acknowledge -----------------------------------------------------------------

    def _ack_ready(self) -> None:
        """Send the ACKs whose messages are handled and durable; after EOF, close once
        nothing is left to publish or acknowledge."""
        if self.closing:
            return
        self._send_acks()
        self._finish()

    def _finish(self) -> None:
        """After EOF: close once nothing is left to publish or acknowledge."""
        if self._eof and not self.closing and self._room is None and self.machine.ack_due is None:
            self.close()

    def _send_acks(self) -> None:
        """ACK what is handled, or start waiting until it is durable, or fail; and write
        what the machine has to send."""
        machine = self.machine
        due = machine.ack_due
        if self._durable is None and due is not None:
            publisher = self.publisher
            handled = publisher.handled
            if due <= handled:
                why = publisher.refused(due)
                if why is not None:
                    self._not_acknowledged(why)
                    return
                # ACKs up to the first message refused or not written, never past it:
                # the batch that holds it fails in its turn, right after.
                whole = handled
                first = publisher.first_refused
                if first is not None and first <= handled:
                    handled = first - 1
                if publisher.written:
                    self._durable = asyncio.ensure_future(self._durable_then_ack(handled))
                    self._arm_keepalive()
                else:
                    machine.acknowledge(handled)
                    if handled < whole:
                        self._send_acks()
                        return
        self._flush()

    async def _durable_then_ack(self, handled: int) -> None:
        ok = await self.publisher.durable()
        self._durable = None
        if self.closing:
            return
        if not ok:
            self._not_acknowledged(WRITE_FAILED)  # an fsync failed
            return
        self.machine.acknowledge(handled)
        self._ack_ready()  # more may have been handled meanwhile

    def _not_acknowledged(self, why: str) -> None:
        """A failed write or fsync, or a message a full reject-policy queue refused:
        close without the ACK, so the client sends the batch again, later."""
        self.broker.limits.log.log(
            logging.WARNING, self.FRONTEND,
            f"closing {self.TITLE} connection from %s: %s; not acknowledged", self._name(), why,
        )  # fmt: skip
        self.close()
