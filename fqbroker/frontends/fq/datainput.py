"""The data channel's input side: decode, publish, and reserve the memory budget for it.

:class:`InputSide` is the half of :class:`~fqbroker.frontends.fq.data.DataSession` that
reads: it hands what the channel decodes to the session's publisher, holds the publisher
(and reading) while a block-policy queue is full, reserves against the broker's memory
budget what the decoder holds or has been told to expect, and closes a channel whose
partial message stopped arriving (docs/memory.md). A mixin rather than an object the
session calls into, so a read makes no call more than one class would.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Protocol

from fqbroker.frontends.fq.datachannel import (
    PEER_COPIES,
    BadInput,
    Batch,
    DataChannel,
    Hello,
    Oversized,
    Phase,
)
from fqbroker.frontends.kit.reservations import StallWatch
from fqbroker.protocols.fq.largeframe import LARGE_FRAME
from fqbroker.protocols.fq.msgdecoder import BIG_READ

if TYPE_CHECKING:
    from fqbroker.core.budget import MemoryBudget, Share
    from fqbroker.core.permissions import Permissions
    from fqbroker.core.publisher import Publisher
    from fqbroker.core.router import ClientStats
    from fqbroker.frontends.fq.command import CommandSession
    from fqbroker.frontends.kit.limits import Limits
    from fqbroker.settings.broker import Settings

__all__ = ["BULK_FROM", "InputHost", "InputSide"]

# A batch ending in a message this large marks a stream of large messages, which the
# session reads up to BULK_READ at a time (data.py says why, and why not for small ones).
BULK_FROM = 2048


class InputHost(Protocol):
    """What the input side needs of the broker that accepted its session."""

    node_id: bytes
    settings: Settings  # max_message_size, partial_message_seconds
    budget: MemoryBudget
    limits: Limits

    def make_publisher(
        self, stats: ClientStats | None = None, permissions: Permissions | None = None
    ) -> Publisher: ...


class _Input:
    """The publishing side of a session, made when it first sends or confirms: most
    consumers never do, and ten thousand idle ones should not carry it."""

    __slots__ = ("bulk", "eof", "publisher", "reserved_at", "share", "stall", "waiting")

    def __init__(self, publisher: Publisher, share: Share) -> None:
        self.publisher = publisher
        # Waiting for room in a block-policy queue, or for budget; reading is paused.
        self.waiting: asyncio.Task[None] | None = None
        self.eof = False  # the client hung up while it waited: close once it is done
        self.share = share  # its share of the memory budget: what its input holds
        self.stall: StallWatch | None = None  # made when it first holds a partial message
        self.reserved_at = 0  # messages handled when it was made
        self.bulk = False  # its last batch ended in a message of BULK_FROM or more


class InputSide:
    """What a :class:`~fqbroker.frontends.fq.data.DataSession` does with what it reads
    (its docstring's "In"). Its state is :class:`_Input`, in its one slot; the session
    owns the rest, and these are what the input side uses of it."""

    __slots__ = ("_in",)
    _in: _Input | None
    broker: InputHost
    transport: asyncio.Transport
    channel: DataChannel
    owner: CommandSession | None

    if TYPE_CHECKING:

        @property
        def phase(self) -> Phase: ...
        @property
        def is_peer(self) -> bool: ...
        @property
        def remote_addr(self) -> str: ...
        def _name(self) -> str: ...
        def _pair(self, hello: Hello) -> None: ...
        def close(self) -> None: ...

    def _start_reading(self) -> None:
        host = self.broker
        # A message the whole budget could never hold is refused (skipped, size_dropped)
        # rather than waited for forever; the margin covers its head and our stamp.
        # So is one over what a connection may reserve (max_reserved_per_connection).
        budget = host.budget.per_connection // (PEER_COPIES if self.is_peer else 1) - 1024
        max_payload = min(host.settings.max_message_size, budget)
        channel = self.channel
        channel.start_reading(host.node_id, self.remote_addr, max_payload)
        self._input().publisher.stamp_size = channel.stamp_size

    def _input(self) -> _Input:
        input_ = self._in
        if input_ is None:
            assert self.owner is not None
            publisher = self.broker.make_publisher(self.owner.stats, self.owner.permissions)
            publisher.closed = self.phase is Phase.CLOSED
            publisher.dedup = self.owner.dedup
            input_ = self._in = _Input(publisher, self.broker.budget.share(self.owner.user))
        return input_

    def _pump(self) -> None:
        """Handle the channel's events until it has none, or a full block-policy queue
        holds this publisher (``_wait_for_room`` carries on)."""
        channel = self.channel
        while (event := channel.next_event()) is not None:
            if isinstance(event, Batch):
                input_ = self._input()
                publisher = input_.publisher
                if event.runs and (last := event.runs[-1][2]):
                    input_.bulk = len(last[-1]) >= BULK_FROM
                if event.octets < 0:
                    publisher.received(event.read, event.read_octets)
                if not publisher.publish(event.runs, event.octets):
                    self._hold()
                    return
                if event.last:
                    return  # nothing follows it until more is read: no need to ask
            elif isinstance(event, Oversized):
                # The line shares the bad-input rate limit, so a publisher of oversized
                # messages cannot flood the log.
                self.broker.limits.log.log(
                    logging.INFO, "data", "dropped %d message(s) from %s over the size limit of %d",
                    event.count, self._name(), event.limit,
                )  # fmt: skip
                self._input().publisher.size_dropped(event.count)
            elif isinstance(event, Hello):
                self._pair(event)
                return
            else:
                assert isinstance(event, BadInput)
                self.broker.limits.bad(
                    "data", "closing data channel of %s: %s", self._name(), event.reason
                )
                self.close()
                return

    def _hold(self) -> None:
        """Block policy: hold this publisher, and only it, until there is room."""
        self.transport.pause_reading()
        self._input().waiting = asyncio.ensure_future(self._wait_for_room())

    async def _wait_for_room(self) -> None:
        input_ = self._input()
        publisher = input_.publisher
        await publisher.wait_for_room()
        input_.waiting = None
        if not publisher.carry_on():
            self._hold()
            return
        self._pump()
        if input_.waiting is not None or self.phase is Phase.CLOSED:
            return
        if input_.eof:
            self.close()
        elif self._reserve():
            self.transport.resume_reading()

    def _reserve(self) -> bool:
        """Hold budget for what the decoder holds or expects; False: reading waits for it.

        A channel still reading the message its reservation covers reads on even while the
        budget is spent, so a message it started always completes (and frees the budget);
        once messages have come in, what is left is a new reservation.
        """
        need = self.channel.in_flight
        input_ = self._input()
        share = input_.share
        handled = input_.publisher.handled
        if handled != input_.reserved_at:
            # The message reserved for is in a queue now, which counts it.
            input_.reserved_at = handled
            if share.held:
                share.release()
        held = share.held
        if not need and not held:
            budget = self.broker.budget
            if budget.used <= budget.limit:
                return True  # a read decoded whole, nothing held: what resize would answer
        if need - held > BIG_READ and not self._may_publish_announced():
            return False
        grow = share.resize(need, behind_waiters=need - held >= LARGE_FRAME)
        if grow is None:
            if share.held:
                self._watch(input_)
            return True
        self.transport.pause_reading()
        input_.waiting = asyncio.ensure_future(self._wait_for_budget(grow))
        return False

    def _may_publish_announced(self) -> bool:
        """Nothing is reserved for a message its user may not publish: the exchange comes
        before the payload, so a large one is refused (and the channel closed) from its
        head, before its size is held."""
        owner = self.owner
        assert owner is not None
        permissions = owner.permissions
        if permissions is None or permissions.everything:
            return True
        exchange = self.channel.announced_exchange()
        if exchange is None or permissions.may_publish(exchange):
            return True
        self.broker.limits.bad(
            "data", "closing data channel of %s: a %d-byte message announced on exchange %r, "
            "which it may not publish to", self._name(), self.channel.in_flight, exchange,
        )  # fmt: skip
        self.close()
        return False

    def _watch(self, input_: _Input) -> None:
        """A partial message holds budget: close the channel if it stops arriving."""
        stall = input_.stall
        if stall is None:
            seconds = self.broker.settings.partial_message_seconds
            stall = input_.stall = StallWatch(seconds, self._progress, self._stalled)
        stall.arm()

    def _progress(self) -> tuple[int, int] | None:
        input_ = self._in
        if input_ is None or input_.waiting is not None or not input_.share.held:
            return None  # nothing held, or held back by us: not the sender's fault
        if self.phase is not Phase.STREAMING:
            return None
        return self.channel.received, input_.publisher.handled

    def _stalled(self) -> None:
        self.broker.limits.bad(
            "data", "closing data channel of %s: a partial message stalled for %g s "
            "(partial_message_seconds), %d bytes reserved", self._name(),
            self.broker.settings.partial_message_seconds, self.channel.in_flight,
        )  # fmt: skip
        self.close()

    async def _acquire(self, grow: int) -> _Input | None:
        """Wait for ``grow`` more of the share; the input, or None if the channel closed
        meanwhile (what was granted is given back)."""
        input_ = self._input()
        await input_.share.acquire(grow)
        input_.waiting = None
        if self.phase is Phase.CLOSED:
            input_.share.release()  # closed between its wake-up and now
            return None
        return input_

    async def _wait_for_budget(self, grow: int) -> None:
        input_ = await self._acquire(grow)
        if input_ is None:
            return
        self._watch(input_)
        if input_.eof:
            self.close()
        else:
            self.transport.resume_reading()

    def _reserve_decode(self) -> bool:
        """A peer's large message is whole: hold what decoding it takes before it is
        decoded; False: reading waits, and the decode with it, until it is granted."""
        need = self.channel.decode_size()
        input_ = self._input()
        share = input_.share
        if need <= share.held:
            return True
        grow = share.resize(min(need, share.cap), behind_waiters=True)
        if grow is None:
            return True
        self.transport.pause_reading()
        input_.waiting = asyncio.ensure_future(self._wait_to_decode(grow))
        return False

    async def _wait_to_decode(self, grow: int) -> None:
        input_ = await self._acquire(grow)
        if input_ is None:
            return
        self._pump()  # decoded now; the queues count what it published
        if input_.waiting is not None or self.phase is not Phase.STREAMING:
            return
        if input_.eof:
            self.close()
        elif self._reserve():
            self.transport.resume_reading()

    def deduplicate(self) -> None:
        """Its messages from now on are de-duplicated by id (core/dedup.py)."""
        if self._in is not None:
            self._in.publisher.dedup = True

    async def confirm(self, count: int) -> str | None:
        """Wait until the first ``count`` messages are routed and durable; None, or why not."""
        return await self._input().publisher.confirm(count)
