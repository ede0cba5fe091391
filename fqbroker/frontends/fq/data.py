"""The data channel: messages in from a client, messages out of its queue (fqd_dss.c).

Phases: AWAIT_KEY -> STREAMING -> CLOSED. Once paired with its command session by key
(§1.4), the session is a protocol with two independent sides, and no task of its own:

* In (:meth:`DataSession._route_buffered`): whatever arrives is decoded, every whole
  frame at once, into runs of peer frames stamped with sender and hops as fqd does
  (§1.11), and published into the router a run at a time (a peer's are decoded into
  messages first, whose hops are checked for loops). After a block-policy queue fills
  up, reading pauses and a task waits for room; then the rest of the batch is published
  and reading resumes. That pushes back on this publisher only. What the decoder holds or
  has been told to expect (the rest of a large message) is reserved against the broker's
  memory budget before more is read; when the budget cannot grant it, or is spent while
  this publisher holds nothing, reading pauses until consumers drain (docs/memory.md).
* Out (:meth:`DataSession.queue_ready`): the queue calls back when it has messages; they
  are taken, those that already passed through the peer at the other end are dropped
  (loop prevention, §5.3), and the rest written in peer format, one write per batch,
  until the transport asks to pause. Messages are only taken to be written at once, so
  none are ever held: nothing needs putting back when the channel closes. A batch larger
  than ``OUT_CHUNK`` (a large message) is handed to the transport a chunk at a time as it
  drains, and held against the memory budget meanwhile, so the transport never copies
  all of it into its buffer.

A bad frame closes this data channel only; the command session survives and can pair a
new one (§1.9).
"""

from __future__ import annotations

import asyncio
import logging
from enum import Enum
from typing import TYPE_CHECKING

from fqbroker.core.frames import frame_hops
from fqbroker.core.message import Message, Run, accept_from_peer, has_hop, ipv4_bytes, runs_of
from fqbroker.errors import ProtocolError
from fqbroker.frontends.fq import wire
from fqbroker.frontends.fq.largeframe import LARGE_FRAME
from fqbroker.frontends.fq.msgdecoder import MessageDecoder
from fqbroker.server.connections import RemotePeer

if TYPE_CHECKING:
    from fqbroker.core.queue import Notify
    from fqbroker.core.router import Target
    from fqbroker.frontends.fq.command import CommandSession
    from fqbroker.server.broker import Broker
    from fqbroker.storage.store import DiskStore

__all__ = ["DataSession", "Phase"]

log = logging.getLogger(__name__)

BATCH = 1024
OUT_CHUNK = 256 << 10  # a larger batch goes to the transport in pieces of this size
# A peer's messages are decoded into Message objects and built into frames again: while
# one is, it is in memory about this many times (measured), so it reserves that much.
PEER_COPIES = 3
NO_PEER = wire.NO_PEER


class Phase(Enum):
    AWAIT_KEY = "await_key"
    STREAMING = "streaming"
    CLOSED = "closed"


class DataSession(RemotePeer, asyncio.Protocol):
    __slots__ = (
        "_decoder",
        "_draining",
        "_eof",
        "_first",
        "_octets",
        "_out",
        "_out_held",
        "_out_pos",
        "_paused",
        "_progress",
        "_ready",
        "_reserved",
        "_reserved_at",
        "_room",
        "_stamp",
        "_stamp_size",
        "_unacked",
        "broker",
        "failed_from",
        "handled",
        "hello",
        "is_peer",
        "mode",
        "owner",
        "peer_id",
        "phase",
        "transport",
        "written",
    )

    def __init__(self, broker: Broker, mode: wire.Mode, transport: asyncio.Transport) -> None:
        self.broker = broker
        self.mode = mode
        self.transport = transport
        self.phase = Phase.AWAIT_KEY
        self.hello: wire.DataHelloDecoder | None = wire.DataHelloDecoder(mode)
        self.is_peer = mode in (wire.Mode.PEER, wire.Mode.OLD_PEER)
        self.peer_id = NO_PEER
        self.owner: CommandSession | None = None
        self._decoder: MessageDecoder | None = None  # made when the first bytes come
        self._stamp = b""  # the hops a publisher's messages get: our node id, its address
        self._stamp_size = 0  # what sender and hops add to each of its frames
        self._draining = False
        self._eof = False
        # Input waiting for room in a block-policy queue: the task, and where it stands.
        self._room: asyncio.Task[None] | None = None
        self._first = 0
        self._octets = 0
        self._reserved = 0  # bytes of the memory budget this channel's input holds
        self._reserved_at = 0  # messages handled when it was made
        # Output: the queue's wake-up while it is empty, the write side's pause, and the
        # last batch written while the transport said pause (acked once it takes more).
        self._ready: Notify | None = None
        self._paused = False
        self._unacked: list[bytes] | None = None
        # A large batch being written as the transport drains, and how far it got.
        self._out: memoryview | None = None
        self._out_pos = 0
        # Budget it holds until the batch's frames are let go, not just handed on.
        self._out_held = 0
        # Publisher confirms (docs/confirms.md): messages handled so far on this channel,
        # the disk stores they went to with the last seq written, and the number of the
        # first message a disk write failed for.
        self.handled = 0
        self.written: dict[DiskStore, int] | None = None  # made by the first disk write
        self.failed_from: int | None = None
        self._progress: asyncio.Event | None = None  # made by the first confirm to wait

    def _name(self) -> str:
        return self.owner.pretty if self.owner else f"{self.remote_addr}:{self.remote_port}"

    # --- protocol -------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.phase is Phase.STREAMING:
            decoder = self._decoder
            if decoder is None:
                decoder = self._decoder = self._new_decoder()
            decoder.feed(data)
            if self._room is None:
                self._route_buffered()
                if self._room is None and self.phase is Phase.STREAMING:
                    self._reserve(decoder)
        elif self.phase is Phase.AWAIT_KEY:
            assert self.hello is not None
            self.hello.feed(data)
            try:
                self._pair()
            except ProtocolError as exc:  # a key over 127 bytes (docs/limits.md)
                self.broker.limits.bad("data", "closing data channel of %s: %s", self._name(), exc)
                self.close()

    def eof_received(self) -> bool:
        if self._room is not None:
            self._eof = True  # what is buffered is routed first
            return True
        self.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.broker.closed(self.transport)
        if self.phase is not Phase.CLOSED:
            log.debug("data channel of %s lost", self._name())
            self._end()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._out is not None and not self._write_out():
            return  # paused again, or gone
        taken, self._unacked = self._unacked, None
        if taken and self.phase is Phase.STREAMING and not self._draining:
            assert self.owner is not None and self.owner.queue is not None
            self.owner.queue.ack(taken)  # in the kernel's hands now
        del taken
        self._drop_out()
        if self._ready is None:
            self.queue_ready()

    def close(self) -> None:
        if self.phase is not Phase.CLOSED:
            self._end()
        self.transport.close()

    def drain_then_close(self, linger: float) -> None:
        """The command session ended: send nothing more, read to EOF, close after ``linger``.

        What the client sent before it hung up is still routed, as fqd_dss.c reads to EOF.
        """
        self._draining = True
        self._unacked = None
        self._drop_out()
        if self._ready is not None:
            self._ready.cancel()
            self._ready = None
        asyncio.get_running_loop().call_later(linger, self.close)

    def _end(self) -> None:
        self.phase = Phase.CLOSED
        if self._progress is not None:
            self._progress.set()  # confirms still waiting learn the channel is gone
        if self._ready is not None:
            self._ready.cancel()
            self._ready = None
        if self._room is not None:
            self._room.cancel()
            self._room = None
        if self._reserved:
            self.broker.budget.release(self._reserved)
            self._reserved = 0
        self._unacked = None
        self._drop_out()
        if self.owner is not None and self.owner.data is self:
            self.owner.data = None

    def _pair(self) -> None:
        assert self.hello is not None
        hello = self.hello.next_hello()
        if hello is None:
            return
        owner = self.broker.clients.get(hello.key)
        if owner is None or owner.data is not None:
            self.broker.limits.bad(
                "data", "data channel from %s:%s: unknown or taken key", *self._addr()
            )
            self.close()
            return
        self.owner = owner
        self.peer_id = hello.peer_id
        owner.paired(self)
        leftover = self.hello.unconsumed()
        self.hello = None
        self.phase = Phase.STREAMING
        log.debug("data channel paired for %s (peer=%s)", owner.pretty, self.is_peer)
        self.queue_ready()
        if leftover and self.phase is Phase.STREAMING:
            self.data_received(leftover)

    def _addr(self) -> tuple[str, int]:
        return self.remote_addr, self.remote_port

    # --- in: decode and publish -----------------------------------------------------------

    def _new_decoder(self) -> MessageDecoder:
        """The decoder, and for a publisher its stamp: made when it first sends, as most
        consumers never do."""
        if not self.is_peer:
            assert self.owner is not None
            self._stamp = self.broker.node_id + ipv4_bytes(self.remote_addr)
            self._stamp_size = 2 + len(self.owner.user) + len(self._stamp)
        # A message the whole budget could never hold is refused (skipped, size_dropped)
        # rather than waited for forever; the margin covers its head and our stamp.
        budget = self.broker.budget.limit // (PEER_COPIES if self.is_peer else 1) - 1024
        return MessageDecoder(
            peer_format=self.is_peer,
            max_payload=min(self.broker.settings.max_message_size, budget),
        )

    def _route_buffered(self) -> None:
        """Route every whole frame buffered, unless a full block-policy queue stops it."""
        decoder = self._decoder
        assert decoder is not None
        try:
            while True:
                self._first = self.handled + 1
                runs = self._decode(decoder)
                if not self._publish(runs, 0):
                    return  # _wait_for_room carries on
                self._batch_done(decoder)
                if not decoder.error_pending:
                    return
                # the next messages() raises it
        except ProtocolError as exc:
            self.broker.limits.bad("data", "closing data channel of %s: %s", self._name(), exc)
            self.close()

    def _decode(self, decoder: MessageDecoder) -> list[Run]:
        """Every whole frame buffered, as runs; sets ``_octets`` to those not counted yet.

        A publisher's are decoded into runs of peer frames stamped with sender and hops
        (§1.11). A peer's are decoded into messages first and counted as read, looped
        ones too; those that did not pass through us go on like any other.
        """
        owner = self.owner
        assert owner is not None
        if not self.is_peer:
            runs = decoder.runs(owner.user, self._stamp)
            self._octets, decoder.octets = decoder.octets, 0
            return runs
        msgs = decoder.messages()
        stats = owner.stats
        self.handled += len(msgs)
        stats.msgs_in += len(msgs)
        stats.octets_in += decoder.octets
        decoder.octets = self._octets = 0
        node_id = self.broker.node_id
        return runs_of([m for m in msgs if _accept(m, node_id)])

    def _publish(self, runs: list[Run], i: int) -> bool:
        """Publish ``runs[i:]``; False when a full block-policy queue made it wait."""
        assert self.owner is not None
        stats = self.owner.stats
        publish_runs = self.broker.router.publish_runs
        while i < len(runs):
            i, done, blocked = publish_runs(runs, i, stats)
            if not self.is_peer:  # a peer's were counted as read
                self.handled += done
                stats.msgs_in += done
            if blocked:
                if not self.is_peer:
                    # What went out so far counts now: a publisher frame is its peer
                    # frame less the stamp.
                    stamp = self._stamp_size
                    left = sum(sum(map(len, r[2])) - len(r[2]) * stamp for r in runs[i:])
                    stats.octets_in += self._octets - left
                    self._octets = left
                self._hold(blocked, runs, i)
                return False
        stats.octets_in += self._octets
        self._octets = 0
        return True

    def _hold(self, blocked: list[Target], runs: list[Run], i: int) -> None:
        """Block policy: hold this publisher, and only it, until there is room."""
        self._flush(self._first)
        self._first = self.handled + 1
        self.transport.pause_reading()
        self._room = asyncio.ensure_future(self._wait_for_room(blocked, runs, i))

    def _batch_done(self, decoder: MessageDecoder) -> None:
        if decoder.oversized:
            assert self.owner is not None
            # Counted as size_dropped below; the line shares the bad-input rate limit, so a
            # publisher of oversized messages cannot flood the log.
            self.broker.limits.log.log(
                logging.INFO, "data", "dropped %d message(s) from %s over the size limit of %d",
                decoder.oversized, self._name(), decoder.max_payload,
            )  # fmt: skip
            self.owner.stats.size_dropped += decoder.oversized
            self.broker.router.aggregate.size_dropped += decoder.oversized
            decoder.oversized = 0
        self._flush(self._first)

    async def _wait_for_room(self, blocked: list[Target], runs: list[Run], i: int) -> None:
        for queue in blocked:
            await queue.wait_not_full()
        self._room = None
        decoder = self._decoder
        assert decoder is not None
        if self._publish(runs, i):
            self._batch_done(decoder)
            self._route_buffered()
        if self._room is not None or self.phase is Phase.CLOSED:
            return
        if self._eof:
            self.close()
        elif self._reserve(decoder):
            self.transport.resume_reading()

    def _reserve(self, decoder: MessageDecoder) -> bool:
        """Hold budget for what the decoder holds or expects; False: reading waits for it.

        A channel still reading the message its reservation covers reads on even while the
        budget is spent, so a message it started always completes (and frees the budget);
        once messages have come in, what is left is a new reservation.
        """
        need = decoder.in_flight
        if self.is_peer:
            need *= PEER_COPIES
        budget = self.broker.budget
        if self.handled != self._reserved_at:
            # The message reserved for is in a queue now, which counts it.
            self._reserved_at = self.handled
            if self._reserved:
                budget.release(self._reserved)
                self._reserved = 0
        grow = need - self._reserved
        if grow <= 0:
            if grow:
                self._reserved = need
                budget.release(-grow)
            if need or budget.used <= budget.limit:
                return True
            grow = 0  # holds nothing and the budget is spent: wait until it is not
        elif budget.fits(grow) and (grow < LARGE_FRAME or not budget.waiting):
            # A large message queues behind those waiting before it; small ones may pass.
            budget.used += grow
            self._reserved = need
            return True
        self.transport.pause_reading()
        self._room = asyncio.ensure_future(self._wait_for_budget(decoder, grow))
        return False

    async def _wait_for_budget(self, decoder: MessageDecoder, grow: int) -> None:
        budget = self.broker.budget
        await budget.acquire(grow)
        self._room = None
        if self.phase is Phase.CLOSED:
            budget.release(grow)  # closed between its wake-up and now
            return
        self._reserved += grow
        if self._eof:
            self.close()
        else:
            self.transport.resume_reading()

    def _flush(self, first: int) -> None:
        """Write what this publisher appended to disk queues, before it next waits."""
        assert self.owner is not None
        flushed, lost = self.broker.catalog.flush_dirty(self.owner.stats)
        for store in flushed:
            if self.written is None:
                self.written = {}
            self.written[store] = store.written_seq
        if lost and self.failed_from is None:
            self.failed_from = first
        if self._progress is not None:
            self._progress.set()
            self._progress = None

    async def confirm(self, count: int) -> str | None:
        """Wait until the first ``count`` messages are routed and durable; None, or why not."""
        while self.handled < count:
            if self.phase is Phase.CLOSED:
                return "data channel closed"
            if self._progress is None:
                self._progress = asyncio.Event()
            await self._progress.wait()
        if self.failed_from is not None and self.failed_from <= count:
            return "disk queue write failed"
        for store, seq in list((self.written or {}).items()):
            if not await store.wait_durable(seq):
                return "disk queue write failed"  # an fsync failed
            if self.written is not None and self.written.get(store) == seq:
                del self.written[store]
        return None

    # --- out: take and write --------------------------------------------------------------

    def queue_ready(self) -> bool:
        """Write what the queue holds until it is empty or the transport asks to pause.

        The queue's callback: False tells it this consumer is gone, so the wake-up goes
        to another.
        """
        self._ready = None
        transport = self.transport
        if self.phase is not Phase.STREAMING or self._draining or transport.is_closing():
            return False
        owner = self.owner
        assert owner is not None and owner.queue is not None
        queue = owner.queue
        stats = owner.stats
        peer_id = self.peer_id
        while not self._paused:
            batch = taken = queue.take(BATCH)
            if not batch:
                self._ready = queue.notify_ready(self)
                break
            if peer_id != NO_PEER:
                batch = [f for f in batch if not has_hop(frame_hops(f), peer_id)]
            data = b"".join(batch)  # one message: that message, not a copy
            stats.msgs_out += len(batch)
            stats.octets_out += len(data)
            if len(data) > OUT_CHUNK:
                self._out = memoryview(data)
                self._out_pos = 0
                self._out_held = len(data)
                self.broker.budget.used += len(data)
                self._unacked = taken
                del batch, data
                if not self._write_out():
                    break  # the rest, the ack and the release when it resumes
                self._unacked = None
                queue.ack(taken)
                # Waiters it wakes run after this turn, when the frames are gone.
                self._drop_out()
                continue
            transport.write(data)
            if self._paused:
                self._unacked = taken  # acked when the transport has room again
                break
            # In the kernel's hands now: a disk queue may move its read checkpoint.
            queue.ack(taken)
        return True

    def _write_out(self) -> bool:
        """Hand the large batch on a chunk at a time while the transport takes more; True
        once it is all written and the transport has room for more."""
        out = self._out
        assert out is not None
        pos, transport = self._out_pos, self.transport
        while pos < len(out):
            if self._paused or transport.is_closing():
                self._out_pos = pos
                return False
            transport.write(out[pos : pos + OUT_CHUNK])
            pos += OUT_CHUNK
        self._out = None
        return not self._paused

    def _drop_out(self) -> None:
        """Give back what a large batch held of the budget (written, or never to be)."""
        self._out = None
        if self._out_held:
            self.broker.budget.release(self._out_held)
            self._out_held = 0


def _accept(msg: Message, node_id: bytes) -> bool:
    if accept_from_peer(msg, node_id):
        return True
    log.debug("received looped message %r", msg)
    return False
