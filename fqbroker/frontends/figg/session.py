"""The Figg listener's asyncio shell: one client's connection (docs/figg-protocol.md).

The wire format is :mod:`fqbroker.frontends.figg.wire`; this module moves bytes into its
decoder, publishes what clients publish, serves their subscriptions
(:mod:`.subscription`) and answers PING. It owns no task while a connection only
publishes and pings: a task exists per subscription, while the session waits for room in
a full queue, and while it waits for an fsync before an ACK.

Theory of operation
-------------------
**Publishing.** Every PUBLISH frame of a read becomes one fq message on the Figg exchange
with route = topic, sender ``figg/ip:port`` and our node id as its one hop, and the read's
messages go to the connection's :class:`~fqbroker.core.publisher.Publisher` as runs in
one call. The broker's topic sink on that exchange appends them to their topics (and fq
queues bound there get them too). A block-policy queue that is full stops the batch:
reading pauses until it has room.

**ACK.** A read's batch is acknowledged with ACK(the highest seq in it) once all of it is
routed and what went to disk (the topics' stores among it) is durable under the broker's
fsync policy (``Publisher.durable``), strictly in order. ACK is cumulative for the client,
so one per batch is all it needs. A failed disk write or fsync closes the connection
without the ACK: the client sends those messages again.

**Subscriptions.** ATTACH opens (creates) the topic, answers ATTACHED with where delivery
starts, and starts a :class:`~.subscription.Subscription` there; a second ATTACH of the
same topic replaces the first. DETACH stops it and is answered by DETACHED, attached or
not. While the client does not read what we write (``pause_writing``), subscriptions
stop reading their topics and the session stops reading its input. What the decoder
buffers (up to a frame of ``max_frame``) is held against the broker's memory budget, and
reading pauses while the budget is spent, as the Lumberjack session does.

**Ending.** Bad input (:class:`~fqbroker.errors.FiggProtocolError`: a bad frame, a topic
name empty or over 127 bytes) is logged, counted as bad input and closes the connection;
so does a topic the broker cannot create (past ``max_topics``). Publishes decoded before
bad input in the same read are not published: unacknowledged, the client sends them again
anyway. ``idle_seconds`` without a byte from the client closes it too: the listeners'
idle limit, told by ``last_input``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from fqbroker.core.frames import encode_peer
from fqbroker.errors import FiggProtocolError
from fqbroker.frontends.acks import DurableAcks
from fqbroker.frontends.figg import wire
from fqbroker.frontends.figg.subscription import Subscription
from fqbroker.server.connections import WRITE, HeldReading, RemotePeer, peer_address

if TYPE_CHECKING:
    from fqbroker.config import Settings
    from fqbroker.core.budget import MemoryBudget
    from fqbroker.core.message import MsgIdCounter, Run
    from fqbroker.core.publisher import Publisher
    from fqbroker.core.router import ClientStats
    from fqbroker.server.frontend import LiveFrontEnd
    from fqbroker.server.limits import Limits as BrokerLimits
    from fqbroker.storage.topics import Topics

__all__ = ["Config", "FiggHost", "FiggSession", "sender_for"]

log = logging.getLogger(__name__)

# Why reading is paused; reading resumes when none is left.
_ROOM = 1  # a block-policy queue is full
_BUDGET = 2  # the memory budget is spent
_WRITE = WRITE  # the client does not read what we write

_SENDER_PREFIX = b"figg/"


class FiggHost(Protocol):
    """What a Figg session needs of the broker that accepted it."""

    node_id: bytes
    settings: Settings
    budget: MemoryBudget
    limits: BrokerLimits
    msgids: MsgIdCounter

    topics: Topics | None

    def closed(self, transport: asyncio.Transport) -> None: ...

    def make_publisher(self, stats: ClientStats | None = None) -> Publisher: ...


@dataclass(frozen=True, slots=True)
class Config:
    """What every connection of one listener shares, made once from the settings."""

    exchange: bytes
    max_frame: int


def sender_for(remote_addr: str, remote_port: int) -> bytes:
    """``b"figg/ip:port"`` (IPv6 in brackets); at most 5 + 47 bytes, within fq's 127."""
    host = f"[{remote_addr}]" if ":" in remote_addr else remote_addr
    return _SENDER_PREFIX + f"{host}:{remote_port}".encode()


class FiggSession(HeldReading, RemotePeer, asyncio.Protocol):
    """One Figg client's connection: decode, publish and acknowledge, deliver, answer."""

    __slots__ = (
        "_acks",
        "_eof",
        "_holds",
        "_last_read",
        "_mapped",
        "_reserved",
        "_room",
        "_sender",
        "acked",
        "broker",
        "closing",
        "config",
        "decoder",
        "delivered",
        "live",
        "published",
        "publisher",
        "subscriptions",
        "transport",
        "writable",
    )

    def __init__(
        self, host: FiggHost, live: LiveFrontEnd, transport: asyncio.Transport, config: Config
    ) -> None:
        # Named so because the loop's exception handler asks a protocol for its broker.
        self.broker = host
        self.live = live
        self.transport = transport
        self.config = config
        self.decoder = wire.FrameDecoder(config.max_frame)
        self.publisher = host.make_publisher()
        self._sender = sender_for(*peer_address(transport))
        self.subscriptions: dict[bytes, Subscription] = {}
        self.writable = asyncio.Event()
        self.writable.set()
        # Counters for /frontends.json: messages published (routed), the last seq
        # acknowledged (-1: none yet), DATA frames sent.
        self.published = 0
        self.acked = -1
        self.delivered = 0
        self._mapped = 0  # messages handed to the publisher so far
        # ACKs owed, in order: each batch's highest seq, due once its messages are
        # routed and durable.
        self._acks = DurableAcks(self.publisher, self._send_ack, self._disk_failed, self._ack_ready)
        self._holds = 0  # _ROOM, _BUDGET, _WRITE: why reading is paused
        self._room: asyncio.Task[None] | None = None  # waiting for room or budget
        self._reserved = 0  # bytes of the memory budget the decoder's buffer holds
        self._last_read = asyncio.get_running_loop().time()
        self._eof = False
        self.closing = False
        counters = live.counters
        if counters.bytes_in is None:
            counters.bytes_in = counters.bytes_out = 0

    # --- protocol -------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.live.counters.bytes_in += len(data)  # type: ignore[operator]  # set in __init__
        self._last_read = asyncio.get_running_loop().time()
        self.decoder.receive_data(data)
        if self._room is None:
            self._pump()

    def eof_received(self) -> bool:
        # A client that half-closes may still wait for its ACKs: the connection closes
        # once they are sent (_finish). Subscriptions end: no Figg client half-closes to
        # go on reading.
        self._eof = True
        for sub in self.subscriptions.values():
            sub.stop()
        self.subscriptions.clear()
        self._finish()
        # A TLS transport closes at EOF whatever we answer (and warns if told otherwise).
        return self.transport.get_extra_info("ssl_object") is None

    def _finish(self) -> None:
        """After EOF: close once nothing is left to publish or acknowledge."""
        if self._eof and not self.closing and not self._acks and self._room is None:
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end()
        self.broker.closed(self.transport)

    def pause_writing(self) -> None:
        # The client does not keep up with what we write: no more reading of topics or
        # of its input until it does, so neither our buffer nor anything else grows.
        self.writable.clear()
        self._hold(_WRITE)

    def resume_writing(self) -> None:
        self.writable.set()
        self._release(_WRITE)

    def close(self) -> None:
        self._end()
        self.transport.close()

    def write(self, data: bytes) -> None:
        self.live.counters.bytes_out += len(data)  # type: ignore[operator]  # set in __init__
        self.transport.write(data)

    def _end(self) -> None:
        if self.closing:
            return
        self.closing = True
        self.publisher.close()
        if self._room is not None:
            self._room.cancel()
            self._room = None
        self._acks.close()
        if self._reserved:
            self.broker.budget.release(self._reserved)
            self._reserved = 0
        for sub in self.subscriptions.values():
            sub.stop()
        self.subscriptions.clear()

    def _name(self) -> str:
        return "{}:{}".format(*peer_address(self.transport))

    def last_input(self) -> float | None:
        """When input last came (loop time), or None while we are the ones not reading it:
        what the listeners' idle limit reads (server.frontend.Watched)."""
        return None if self._holds else self._last_read

    # --- in -------------------------------------------------------------------------------

    def _pump(self) -> None:
        """Act on every whole frame the decoder holds: publish a read's PUBLISH frames in
        one batch, answer the others in order."""
        decoder = self.decoder
        publishes: list[tuple[bytes, int, bytes]] = []
        try:
            while True:
                if decoder.take_publishes(publishes):
                    continue
                frame = decoder.next_frame()
                if frame is None:
                    break
                self._control(frame)
                if self.closing:
                    return
        except FiggProtocolError as exc:
            self.broker.limits.bad("figg", "closing Figg connection from %s: %s", self._name(), exc)
            self.close()
            return
        if publishes:
            self._publish(publishes)
        if self._room is None and not self.closing:
            self._reserve()

    def _control(self, frame: wire.Frame) -> None:
        if isinstance(frame, wire.Ping):
            self.write(wire.encode(wire.Pong(frame.timestamp)))
        elif isinstance(frame, wire.Attach):
            self._attach(frame.topic, frame.offset)
        elif isinstance(frame, wire.Detach):
            sub = self.subscriptions.pop(frame.topic, None)
            if sub is not None:
                sub.stop()
            self.write(wire.encode(wire.Detached(frame.topic)))
        else:
            # A server's frame (ATTACHED, DATA, ...): well formed, but not for us to get.
            self.broker.limits.bad(
                "figg", "closing Figg connection from %s: it sent %s, a server's frame",
                self._name(), type(frame).__name__.upper(),
            )  # fmt: skip
            self.close()

    def _attach(self, name: bytes, offset: int | None) -> None:
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
        self.write(wire.encode(wire.Attached(name, start)))
        remote = self._name()
        self.subscriptions[name] = Subscription(topic, start, remote, self, self._failed)

    def _failed(self, exc: BaseException) -> None:
        """A subscription's task raised: a bug or a disk read error; this connection ends."""
        if not self.closing:
            self.broker.limits.bug(exc, f"Figg subscription of {self._name()}")
            self.close()

    def _publish(self, publishes: list[tuple[bytes, int, bytes]]) -> None:
        exchange = self.config.exchange
        next_id = self.broker.msgids.next
        sender = self._sender
        hops = self.broker.node_id
        runs: list[Run] = []
        route = b""
        frames: list[bytes] = []
        octets = 0
        high = -1
        for topic, seq, data in publishes:
            frame = encode_peer(exchange, topic, next_id(), sender, hops, data)
            octets += len(frame)
            if seq > high:
                high = seq
            if topic != route:
                route = topic
                frames = [frame]
                runs.append((exchange, topic, frames, len(frame) - len(data)))
            else:
                frames.append(frame)
        n = len(publishes)
        self._mapped += n
        self._acks.owe(high, self._mapped)
        if not self.publisher.publish(runs, octets):
            self._hold(_ROOM)
            self._room = asyncio.ensure_future(self._room_then_carry_on())
        self._ack_ready()

    async def _room_then_carry_on(self) -> None:
        await self.publisher.finish()
        self._room = None
        self._release(_ROOM)
        self._ack_ready()
        self._pump()  # what was read meanwhile

    def _reserve(self) -> None:
        """Hold budget for what the decoder buffers (up to a frame of ``max_frame``);
        pause reading while the budget cannot take it."""
        self._reserved, grow = self.broker.budget.resize(self._reserved, self.decoder.buffered)
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
        self._pump()  # whatever arrived while reading was paused

    # --- out: acknowledge -----------------------------------------------------------------

    def _ack_ready(self) -> None:
        """ACK the batches that are routed, once what went to disk is durable."""
        if self.closing:
            return
        self.published = self.publisher.handled
        self._acks.ready()
        self._finish()

    def _disk_failed(self) -> None:
        self.broker.limits.log.log(
            logging.WARNING, "figg", "closing Figg connection from %s: a disk write failed; "
            "its publishes are not acknowledged", self._name(),
        )  # fmt: skip
        self.close()

    def _send_ack(self, seqs: list[int]) -> None:
        """One ACK for the batches now due: the client's is cumulative."""
        self.acked = seqs[-1]
        self.write(wire.encode_ack(self.acked))
