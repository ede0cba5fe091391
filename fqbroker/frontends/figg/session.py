"""The Figg listener's asyncio shell: one client's connection (docs/figg-protocol.md).

The rules are :class:`~.machine.Machine`'s; this module moves bytes into it, publishes and
acknowledges the batches it makes through the shared tail
(:class:`~fqbroker.frontends.kit.publishing.PublishingSession`) and serves subscriptions
(:mod:`.subscription`). It owns no task while a connection only publishes and pings; its
theory of operation is :class:`FiggSession`'s docstring.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Protocol

from fqbroker.core.permissions import Permissions
from fqbroker.frontends.figg.machine import Config, Machine, sender_for
from fqbroker.frontends.figg.subscription import Subscription
from fqbroker.frontends.kit.acks import Batch
from fqbroker.frontends.kit.certs import refuse
from fqbroker.frontends.kit.connections import WRITE, peer_address
from fqbroker.frontends.kit.publishing import PublishingSession
from fqbroker.protocols.figg import wire

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
    from fqbroker.storage.topics.retained import Topics

__all__ = ["Config", "FiggHost", "FiggSession", "sender_for"]


class FiggHost(Protocol):
    """What a Figg session needs of the broker that accepted it."""

    node_id: bytes
    settings: Settings
    budget: MemoryBudget
    limits: BrokerLimits
    msgids: MsgIdCounter

    topics: Topics | None
    users: Users | None
    disk_alarm: DiskAlarm

    def closed(self, transport: asyncio.Transport) -> None: ...

    def make_publisher(self, stats: ClientStats | None = None) -> Publisher: ...


class FiggSession(PublishingSession, asyncio.Protocol):
    """One Figg client's connection: decode, publish and acknowledge, deliver, answer.

    A task exists per subscription, while the session waits for room in a full queue or for
    the memory budget, and while it waits for an fsync before an ACK; none otherwise. The
    listeners' idle limit reads :meth:`last_input`.

    **Publishing.** A read's PUBLISH frames are one batch of fq messages on the Figg
    exchange, published in one call; the broker's topic sink on that exchange appends them to
    their topics (and fq queues bound there get them too). A block-policy queue that is full
    stops the batch: reading pauses until it has room.

    **ACK.** A batch is acknowledged with ACK(the highest seq in it) once all of it is routed
    and what went to disk (the topics' stores among it) is durable under the broker's fsync
    policy, strictly in order. A failed disk write or fsync closes the connection without
    the ACK: the client sends those messages again.

    **Subscriptions.** ATTACH opens (creates) the topic, answers ATTACHED with where delivery
    starts, and starts a :class:`~.subscription.Subscription` there; a second ATTACH of the
    same topic replaces the first. DETACH stops it and is answered by DETACHED, attached or
    not. While the client does not read what we write (``pause_writing``), subscriptions
    stop reading their topics and the session stops reading its input. What the machine
    buffers (up to a frame of ``max_frame``) is held against the broker's memory budget.

    **Rights.** Under auth = "password" the client's certificate named its user: a
    PUBLISH to topic T needs that user's publish right on T, an ATTACH of T its consume
    right on T (docs/permissions.md's globs, over topic names). Figg has no error frame: a
    frame asking for what the user may not do closes the connection, logged and counted
    as a refused login, and what the batch held is not acknowledged.

    **Ending.** Bad input (a bad frame, a topic name empty or over 127 bytes, a server's
    frame) is logged, counted as bad input and closes the connection; so does a topic the
    broker cannot create (past ``max_topics``). ``idle_seconds`` without a byte from the
    client while we read, and no DATA to it, closes it too: the listeners' idle limit,
    told by ``last_input``.
    """

    __slots__ = ("_looked", "config", "delivered", "permissions", "subscriptions", "writable")

    FRONTEND = "figg"
    TITLE = "Figg"

    broker: FiggHost
    machine: Machine

    def __init__(
        self,
        host: FiggHost,
        live: LiveFrontEnd,
        transport: asyncio.Transport,
        config: Config,
        user: str | None = None,
        permissions: Permissions = Permissions.ALL,
    ) -> None:
        loop = asyncio.get_running_loop()
        sender = sender_for(*peer_address(transport))
        machine = Machine(config, sender, host.node_id, host.msgids.next, loop.time())
        super().__init__(host, live, transport, machine)
        self.config = config
        self.user = user
        self.permissions = permissions
        self.subscriptions: dict[bytes, Subscription] = {}
        self.writable = asyncio.Event()
        self.writable.set()
        self.delivered = 0  # DATA frames sent, for /frontends.json
        self._looked = 0  # ``delivered`` when the idle limit last looked

    # --- what /frontends.json shows -------------------------------------------------------

    @property
    def published(self) -> int:
        """Messages published (routed)."""
        return self.publisher.handled

    @property
    def acked(self) -> int:
        """The last seq acknowledged (-1: none yet)."""
        return self.machine.acked

    def last_input(self) -> float | None:
        """When input last came (loop time), or None while we are the ones not reading it:
        what the listeners' idle limit reads (server.frontend.Watched).

        DATA sent since the limit last looked counts as now: the Figg protocol has no
        PING, so a subscriber that only reads is not idle while messages reach it. The
        limit looks once a period, so this costs nothing per message."""
        if self._holds:
            return None
        delivered = self.delivered
        if delivered != self._looked:
            self._looked = delivered
            return asyncio.get_running_loop().time()
        return self.machine.last_input

    # --- protocol -------------------------------------------------------------------------

    def eof_received(self) -> bool:
        # A client that half-closes may still wait for its ACKs: the connection closes
        # once they are sent (_finish). Subscriptions end: no Figg client half-closes to
        # go on reading.
        self._eof = True
        self._stop_subscriptions()
        self._finish()
        # A TLS transport closes at EOF whatever we answer (and warns if told otherwise).
        return self.transport.get_extra_info("ssl_object") is None

    def pause_writing(self) -> None:
        # The client does not keep up with what we write: no more reading of topics or
        # of its input until it does, so neither our buffer nor anything else grows.
        self.writable.clear()
        self._hold(WRITE)

    def resume_writing(self) -> None:
        self.writable.set()
        self._release(WRITE)

    def _end(self) -> bool:
        if not super()._end():
            return False
        self._stop_subscriptions()
        return True

    def _stop_subscriptions(self) -> None:
        for sub in self.subscriptions.values():
            sub.stop()
        self.subscriptions.clear()

    # --- the machine's own events ---------------------------------------------------------

    def _control(self, event: object) -> None:
        if isinstance(event, wire.Attach):
            self._attach(event.topic, event.offset)
        else:
            assert isinstance(event, wire.Detach)  # the machine answers it DETACHED
            sub = self.subscriptions.pop(event.topic, None)
            if sub is not None:
                sub.stop()

    def _publish(self, batch: Batch) -> None:
        permissions = self.permissions
        if not permissions.everything:
            for run in batch.runs:
                if not permissions.may_publish(run[1]):
                    self._denied("publish to", run[1])
                    return
        super()._publish(batch)

    def _denied(self, what: str, topic: bytes) -> None:
        why = f"user {self.user!r} may not {what} topic {topic.decode('utf-8', 'replace')!r}"
        refuse(self.broker, self.live, self.transport, why)
        self.close()

    def _attach(self, name: bytes, offset: int | None) -> None:
        if not self.permissions.may_consume(name):
            self._denied("attach", name)
            return
        topics = self.broker.topics
        topic = topics.open(name) if topics is not None else None
        if topic is None:
            self.broker.limits.log.log(
                logging.WARNING, "figg", "closing Figg connection from %s: topic %r cannot be "
                "created (max_topics reached)", self._name(), name,
            )  # fmt: skip
            self.close()
            return
        old = self.subscriptions.pop(name, None)
        if old is not None:
            old.stop()
        start = topic.start_offset(offset)
        self.machine.attached(name, start)
        # Its first write comes in a later turn, after this read's replies (ATTACHED).
        self.subscriptions[name] = Subscription(topic, start, self._name(), self, self._failed)

    def _failed(self, exc: BaseException) -> None:
        """A subscription's task raised: a bug or a disk read error; this connection ends."""
        if not self.closing:
            self.broker.limits.bug(exc, f"Figg subscription of {self._name()}")
            self.close()
