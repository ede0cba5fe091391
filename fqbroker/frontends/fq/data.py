"""The data channel's asyncio shell: one socket, its flow control and its waits (fqd_dss.c).

The protocol itself (phases, hello, message format, stamp, loop prevention) is the sans-I/O
:class:`~fqbroker.frontends.fq.datachannel.DataChannel`; this module moves bytes between it
and the transport, publishes what it decodes, and writes what the queue holds. Its theory
of operation is :class:`DataSession`'s docstring.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
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
from fqbroker.frontends.kit.connections import RemotePeer
from fqbroker.frontends.kit.reservations import StallWatch
from fqbroker.protocols.fq import wire
from fqbroker.protocols.fq.largeframe import LARGE_FRAME
from fqbroker.protocols.fq.msgdecoder import BIG_READ, SMALL_READ

if TYPE_CHECKING:
    from fqbroker.core.budget import MemoryBudget, Share
    from fqbroker.core.permissions import Permissions
    from fqbroker.core.publisher import Publisher
    from fqbroker.core.queue import Buffer, Notify
    from fqbroker.core.router import ClientStats
    from fqbroker.frontends.fq.command import CommandSession
    from fqbroker.frontends.kit.limits import Limits
    from fqbroker.settings.broker import Settings

__all__ = ["DataHost", "DataSession", "Phase"]

log = logging.getLogger(__name__)

BATCH = 1024
OUT_CHUNK = 256 << 10  # a larger batch goes to the transport in pieces of this size
# Frames of a large batch handed on together, up to this size (one writev): a stream of
# large messages goes out several a syscall instead of one each (the batch holds them
# anyway). The figures behind these sizes: bench/RESULTS.md, "Figures behind comments".
WRITE_GROUP = 1 << 20
# An ordinary read takes up to this much, four times uvloop's 256 KiB, so several large
# messages a read instead of two. Each read of a loopback socket also runs the publisher's
# transmit in the broker's context (the window update), so fewer reads cost less in the
# kernel, not only in syscalls; and the partial frame a read ends with, copied into the
# decoder's buffer, is copied once per read.
BULK_READ = 1 << 20
# ... for a stream of messages this large. Not for small ones: they gain no CPU from it,
# and reads this large cost the memory row (a million queued 100-byte messages) a few
# bytes of RSS a message.
BULK_FROM = 2048
# A batch whose first frame has this size is written as it is (writev); else joined.
SCATTER_FROM = 2048


class DataHost(Protocol):
    """What a data session needs of the broker that accepted it."""

    node_id: bytes
    settings: Settings  # max_message_size
    budget: MemoryBudget
    limits: Limits
    clients: dict[bytes, CommandSession]  # key -> the command session it pairs with

    def closed(self, transport: asyncio.Transport) -> None: ...

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


class _LargeBatch:
    """A batch larger than OUT_CHUNK, handed to the transport as it drains: frames up to
    that size as they are (scatter writes of up to WRITE_GROUP, no copy), a larger frame a
    copied chunk at a time. It holds its size of the budget until its frames are
    let go, not just handed on."""

    __slots__ = ("frames", "held", "next", "pos")

    def __init__(self, frames: list[Buffer], held: int) -> None:
        self.frames: list[Buffer] | None = frames  # None once it is all written
        self.next = 0  # the frame to write next
        self.pos = 0  # where in it, for a frame larger than OUT_CHUNK
        self.held = held


# Ordinary reads land here and leave as bytes at once (as uvloop's own reads do), so one
# buffer serves every session of the process: a loop reads into the buffer get_buffer()
# gave and calls buffer_updated() before it reads anything else. Anonymous memory, not a
# bytearray (which is zeroed): its pages are resident only once reads have reached them,
# so a broker of small reads (the idle row) holds no more of it than they touch.
_SCRATCH = memoryview(mmap.mmap(-1, BULK_READ))
_BIG = _SCRATCH[:BIG_READ]
_SMALL = _SCRATCH[:SMALL_READ]


class DataSession(RemotePeer, asyncio.BufferedProtocol):
    """One fq data channel: publishes what it reads, writes what its queue holds.

    Once paired with its command session by key (docs/fq-protocol.md §1.4), the session is
    a protocol with two independent sides, and no task of its own while idle:

    * In (:meth:`_pump`): whatever arrives is fed to the channel and its events handled;
      each batch goes to this channel's :class:`~fqbroker.core.publisher.Publisher`. After
      a block-policy queue fills up, reading pauses and a task waits for room; then the
      rest of the batch is published and reading resumes. That pushes back on this
      publisher only. What the decoder holds or has been told to expect (the rest of a
      large message) is reserved against the broker's memory budget before more is read;
      when the budget cannot grant it, or is spent while this publisher holds nothing,
      reading pauses until consumers drain (docs/memory.md).
    * Out (:meth:`queue_ready`): the queue calls back when it has messages; they are
      taken, those the peer at the other end already saw are dropped
      (docs/fq-protocol.md §5.3), and the rest written in peer format, one write per batch
      (a memory queue's chunks of small frames as they are, a few small buffers joined,
      large frames as they are, a scatter write), until the transport asks to pause.
      Messages are only taken to be written at once, so none are ever held: nothing needs
      putting back when the channel closes. A batch larger than ``OUT_CHUNK`` is handed to
      the transport as it drains, up to ``WRITE_GROUP`` a write (a frame larger than
      ``OUT_CHUNK`` in copied pieces), and held against the memory budget meanwhile.

    A bad frame closes this data channel only; the command session survives and can pair
    a new one (docs/fq-protocol.md §1.9).

    The session is given its host (:class:`DataHost`), the few things it needs of the
    broker, not the broker's parts.
    """

    # A BufferedProtocol, not a Protocol: uvloop reads into get_buffer() only for a
    # protocol that is not an asyncio.Protocol. data_received is kept, for the bytes the
    # sniffer read before handing the connection over.
    __slots__ = (
        "_draining",
        "_in",
        "_into_room",
        "_out",
        "_paused",
        "_ready",
        "_unacked",
        "broker",
        "channel",
        "owner",
        "transport",
    )

    def __init__(self, host: DataHost, mode: wire.Mode, transport: asyncio.Transport) -> None:
        # Named so because the loop's exception handler asks a protocol for its broker.
        self.broker = host
        self.transport = transport
        self.channel = DataChannel(mode)
        self.owner: CommandSession | None = None
        self._in: _Input | None = None
        self._draining = False
        # Output: the queue's wake-up while it is empty, the write side's pause, and the
        # last batch written while the transport said pause (acked once it takes more).
        self._ready: Notify | None = None
        self._paused = False
        self._unacked: list[Buffer] | None = None
        self._out: _LargeBatch | None = None
        self._into_room = False  # the read in progress goes into a message's own bytes

    @property
    def phase(self) -> Phase:
        return self.channel.phase

    @property
    def is_peer(self) -> bool:
        return self.channel.is_peer

    def _name(self) -> str:
        return self.owner.pretty if self.owner else f"{self.remote_addr}:{self.remote_port}"

    # --- protocol -------------------------------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        """Where the next read goes: into a large message's own bytes, where it stays,
        or else an ordinary read into scratch, handed on as bytes."""
        channel = self.channel
        room = channel.room()
        if room is not None:
            self._into_room = True
            return room
        self._into_room = False
        if channel.read_size != BIG_READ:
            return _SMALL
        # More than 256 KiB only for a stream of large messages, and only while the
        # budget has room for it: what is read is counted only once decoded, so one
        # read is what the budget may be overshot by (docs/memory.md).
        input_ = self._in
        if input_ is None or not input_.bulk:
            return _BIG
        budget = self.broker.budget
        return _SCRATCH if budget.limit - budget.used >= BULK_READ else _BIG

    def buffer_updated(self, nbytes: int) -> None:
        if self._into_room:
            # Read into a message in place: in_flight announced its whole size when it
            # started, and until it is whole there is nothing to decode.
            if self.channel.filled_in(nbytes):
                self._fed()
            return
        self.data_received(_SCRATCH[:nbytes].tobytes())

    def data_received(self, data: bytes) -> None:
        channel = self.channel
        if channel.phase is Phase.STREAMING:
            input_ = self._in
            if input_ is None or not channel.reading:
                if not channel.reading:
                    self._start_reading()
                input_ = self._input()
            channel.receive_data(data)
            # _fed(), inline: the latency row's every read comes this way.
            if input_.waiting is None:
                if input_.share.held and channel.is_peer and not self._reserve_decode():
                    return  # a large peer message is whole: decoded once granted
                self._pump()
                if input_.waiting is None and channel.phase is Phase.STREAMING:
                    self._reserve()
        elif channel.phase is Phase.AWAIT_KEY:
            channel.receive_data(data)
            self._pump()

    def _fed(self) -> None:
        """The channel has new input: publish it, and reserve for what it holds."""
        input_ = self._input()
        if input_.waiting is None:
            self._pump()
            if input_.waiting is None and self.channel.phase is Phase.STREAMING:
                self._reserve()

    def eof_received(self) -> bool:
        input_ = self._in
        if input_ is not None and input_.waiting is not None:
            input_.eof = True  # what is buffered is routed first
            # (over TLS the transport closes at EOF whatever we answer, and warns if
            # told otherwise: what is buffered is routed all the same)
            return self.transport.get_extra_info("ssl_object") is None
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
        if self._out is not None and self._out.frames is not None and not self._write_out():
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
        self.channel.close()
        input_ = self._in
        if input_ is not None:
            input_.publisher.close()  # confirms still waiting learn the channel is gone
            if input_.waiting is not None:
                input_.waiting.cancel()
                input_.waiting = None
            input_.share.close()
            if input_.stall is not None:
                input_.stall.cancel()
        if self._ready is not None:
            self._ready.cancel()
            self._ready = None
        self._unacked = None
        self._drop_out()
        if self.owner is not None and self.owner.data is self:
            self.owner.data = None

    def _pair(self, hello: Hello) -> None:
        owner = self.broker.clients.get(hello.key)
        if owner is None or owner.data is not None:
            self.broker.limits.bad(
                "data",
                "data channel from %s:%s: unknown or taken key",
                self.remote_addr,
                self.remote_port,
            )
            self.close()
            return
        self.owner = owner
        owner.paired(self)
        permissions = owner.permissions
        trusted = permissions is not None and permissions.may_peer
        leftover = self.channel.paired(owner.user, hello.peer_id, trusted)
        log.debug("data channel paired for %s (peer=%s)", owner.pretty, self.is_peer)
        self.queue_ready()
        if leftover and self.phase is Phase.STREAMING:
            self.data_received(leftover)

    # --- in: decode and publish -----------------------------------------------------------

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

    async def _wait_for_budget(self, grow: int) -> None:
        input_ = self._input()
        share = input_.share
        await share.acquire(grow)
        input_.waiting = None
        if self.phase is Phase.CLOSED:
            share.release()  # closed between its wake-up and now
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
        input_ = self._input()
        share = input_.share
        await share.acquire(grow)
        input_.waiting = None
        if self.phase is Phase.CLOSED:
            share.release()  # closed between its wake-up and now
            return
        self._pump()  # decoded now; the queues count what it published
        if input_.waiting is not None or self.phase is not Phase.STREAMING:
            return
        if input_.eof:
            self.close()
        elif self._reserve():
            self.transport.resume_reading()

    async def confirm(self, count: int) -> str | None:
        """Wait until the first ``count`` messages are routed and durable; None, or why not."""
        return await self._input().publisher.confirm(count)

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
        channel = self.channel
        peer = channel.peer_id != wire.NO_PEER
        took = False
        while not self._paused:
            # Others woken for what is held get their share: we queue up behind them.
            taken: list[Buffer]
            if took and queue.contended:
                count = 0
            elif peer:
                # Frame by frame: not those the peer saw already. All are acked.
                frames = queue.take(BATCH)
                count = len(frames)
                taken = list(frames)
                out: list[Buffer] = list(channel.outgoing(frames))
            else:
                count, taken = queue.take_out(BATCH)
                out = taken
            if not count:
                self._ready = queue.notify_ready(self)
                break
            took = True
            # Small frames come packed in chunks (MemoryStore), written as they are; a
            # few of them are joined, large frames scattered as they are.
            data: Buffer | None = None
            if len(out) == 1:
                data = out[0]
                size = len(data)
            else:
                size = sum(map(len, out))
                if size <= SCATTER_FROM * len(out):
                    data = b"".join(out)  # one copy beats many small iovecs
            # Asked for only once there is something to count: an idle client has none.
            stats = owner.stats
            stats.msgs_out += len(out) if peer else count
            stats.octets_out += size
            if size > OUT_CHUNK:
                self._out = _LargeBatch(out if data is None else [data], size)
                self.broker.budget.used += size
                self._unacked = taken
                del out, data
                if not self._write_out():
                    break  # the rest, the ack and the release when it resumes
                self._unacked = None
                queue.ack(taken)
                # Waiters it wakes run after this turn, when the frames are gone.
                self._drop_out()
                continue
            if data is None:
                transport.writelines(out)
            else:
                transport.write(data)
            if self._paused:
                self._unacked = taken  # acked when the transport has room again
                break
            # In the kernel's hands now: a disk queue may move its read checkpoint.
            queue.ack(taken)
        return True

    def _write_out(self) -> bool:
        """Hand the large batch on while the transport takes more; True
        once it is all written and the transport has room for more."""
        out = self._out
        assert out is not None and out.frames is not None
        frames, i, transport = out.frames, out.next, self.transport
        while i < len(frames):
            if self._paused or transport.is_closing():
                out.next = i
                return False
            frame = frames[i]
            if len(frame) > OUT_CHUNK:
                # A copy, not a slice: a slice the transport still buffers (uvloop keeps
                # the object) would keep the whole message alive after its budget is
                # given back, and the next large message read meanwhile would double
                # what RSS holds.
                pos = out.pos
                with memoryview(frame) as view:
                    transport.write(bytes(view[pos : pos + OUT_CHUNK]))
                pos += OUT_CHUNK
                if pos < len(frame):
                    out.pos = pos
                    continue
                out.pos = 0
                i += 1
                continue
            # Frames as they are, up to WRITE_GROUP of them (the batch holds them and their
            # budget until it is all written, so the transport holding them costs nothing
            # more), copying none.
            j, size = i + 1, len(frame)
            while j < len(frames) and size + len(frames[j]) <= WRITE_GROUP:
                size += len(frames[j])
                j += 1
            if j == i + 1:
                transport.write(frame)
            else:
                transport.writelines(frames[i:j])
            i = j
        out.frames = None
        return not self._paused

    def _drop_out(self) -> None:
        """Give back what a large batch held of the budget (written, or never to be)."""
        out, self._out = self._out, None
        if out is not None:
            self.broker.budget.release(out.held)
