"""The Lumberjack listener's asyncio shell: one shipper's connection (docs/lumberjack.md).

The rules (decoding, messages, ACK points) are :class:`~.machine.Machine`'s; this module
moves bytes into it, publishes and acknowledges the batches it makes through the shared
tail (:class:`~fqbroker.frontends.kit.publishing.PublishingSession`), and owns the timers
the machine asks for. Its theory of operation is :class:`LumberjackSession`'s docstring.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Protocol

from fqbroker.frontends.kit.connections import WRITE, peer_address
from fqbroker.frontends.kit.publishing import BUDGET, DISK, ROOM, PublishingSession
from fqbroker.frontends.lumberjack.machine import Config, Machine
from fqbroker.frontends.lumberjack.mapping import sender_for

if TYPE_CHECKING:
    from fqbroker.core.budget import MemoryBudget
    from fqbroker.core.message import MsgIdCounter
    from fqbroker.core.publisher import Publisher
    from fqbroker.core.router import ClientStats
    from fqbroker.frontends.kit.component import LiveFrontEnd
    from fqbroker.frontends.kit.limits import Limits as BrokerLimits
    from fqbroker.settings.broker import Settings
    from fqbroker.storage.configdb.users import Users
    from fqbroker.storage.diskalarm import DiskAlarm

__all__ = ["Config", "LumberjackHost", "LumberjackSession"]

log = logging.getLogger(__name__)


class LumberjackHost(Protocol):
    """What a Lumberjack session needs of the broker that accepted it."""

    node_id: bytes
    settings: Settings
    budget: MemoryBudget
    limits: BrokerLimits
    msgids: MsgIdCounter
    users: Users | None
    disk_alarm: DiskAlarm

    def closed(self, transport: asyncio.Transport) -> None: ...

    def make_publisher(self, stats: ClientStats | None = None) -> Publisher: ...


class LumberjackSession(PublishingSession, asyncio.Protocol):
    """One shipper's connection: decode, publish, acknowledge.

    It has no task of its own while a connection is idle: the idle-ACK and keepalive timers
    are loop timers, and a task exists only while the session waits for room in a queue, for
    the memory budget, or for a disk queue's fsync.

    **Publishing.** A read's events go to the connection's
    :class:`~fqbroker.core.publisher.Publisher` as runs in one call, never one await per
    event. An ACK point is sent once every event up to it is in every matching queue and what
    went to disk queues is durable under their fsync policy, strictly in order, so pipelined
    batches are acknowledged one after the other.

    **Backpressure.** When a block-policy queue is full the publisher stops; the session
    pauses reading (the shipper's TCP window closes, and its batch's ACK waits). What the
    machine holds is reserved against the broker's memory budget, and reading also pauses
    while the budget is spent, while the disk alarm is raised, or while the shipper does not
    read its ACKs (the transport asks us to pause writing). Whatever holds it back but the
    latter, and while an ACK waits for a disk queue's fsync, a v2 shipper gets ``ACK(0)``
    every ``keepalive_seconds`` (the kit's keepalive timer).

    **Bad input.** A :class:`~fqbroker.protocols.lumberjack.wire.Violation` (a limit
    exceeded, a malformed frame) closes this connection with one rate-limited log line and
    ``fq_bad_input_total{frontend="lumberjack"}``. Events decoded before it are still routed
    but never acknowledged, so the shipper sends them again.

    **End.** At EOF the session marks what is unacknowledged, sends the ACKs it owes once
    their events are routed and durable (a shipper may half-close and wait for them), then
    closes.
    """

    __slots__ = ("_idle", "_opened", "config")

    FRONTEND = "lumberjack"
    TITLE = "Lumberjack"
    HOLD_WAITING = True

    broker: LumberjackHost
    machine: Machine

    def __init__(
        self,
        host: LumberjackHost,
        live: LiveFrontEnd,
        transport: asyncio.Transport,
        config: Config,
    ) -> None:
        sender = sender_for(*peer_address(transport))
        machine = Machine(config, sender, host.node_id, host.msgids.next)
        super().__init__(host, live, transport, machine)
        self.config = config
        self._idle: asyncio.TimerHandle | None = None
        self._opened = asyncio.get_running_loop().time()

    def last_input(self) -> float | None:
        """When input last came (loop time), for the listeners' idle limit; None while
        reading is held back (the shipper waits for us, not we for it)."""
        return None if self._holds else max(self.machine.last_read, self._opened)

    # --- what /frontends.json shows -------------------------------------------------------

    @property
    def held(self) -> str:
        """Why reading is paused: "room", "budget", "disk", "write", or "" while it reads."""
        return ",".join(
            name
            for bit, name in ((ROOM, "room"), (BUDGET, "budget"), (DISK, "disk"), (WRITE, "write"))
            if self._holds & bit
        )  # fmt: skip

    @property
    def events(self) -> int:
        return self.machine.events

    @property
    def version(self) -> int:
        return self.machine.version

    @property
    def acked(self) -> int:
        """The last seq acknowledged."""
        return self.machine.acked

    # --- protocol -------------------------------------------------------------------------

    def eof_received(self) -> bool:
        # The shipper may half-close and wait for its ACKs: what it sent is routed and
        # acknowledged first, then the connection closes (_finish).
        self._eof = True
        if not self.closing:
            if self.machine.buffered:
                log.debug("lumberjack %s: %d bytes of a frame cut off at EOF", self._name(),
                          self.machine.buffered)  # fmt: skip
            self.machine.receive_eof()
            self._ack_ready()  # and close once nothing is owed
        # A TLS transport closes at EOF whatever we answer (and warns if told otherwise):
        # the ACKs owed are lost with it, and the shipper sends those events again.
        return self.transport.get_extra_info("ssl_object") is None

    def _end(self) -> bool:
        if not super()._end():
            return False
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        return True

    # --- timers ---------------------------------------------------------------------------

    def _pumped(self) -> None:
        # One idle timer per connection with events unmarked, moved on by reads.
        if self._idle is None and self.machine.deadline is not None:
            loop = asyncio.get_running_loop()
            self._idle = loop.call_later(self.config.ack_idle, self._on_idle)

    def _on_idle(self) -> None:
        self._idle = None
        if self.closing:
            return
        loop = asyncio.get_running_loop()
        machine = self.machine
        if machine.tick(loop.time()):
            self._ack_ready()
        elif (deadline := machine.deadline) is not None:
            self._idle = loop.call_at(deadline, self._on_idle)

    def _keepalive_every(self) -> float:
        return self.config.keepalive

    def _send_keepalive(self) -> None:
        self.machine.keepalive()
