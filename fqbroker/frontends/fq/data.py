"""The data channel's asyncio shell: one socket, its flow control and its waits (fqd_dss.c).

The protocol itself (phases, hello, message format, stamp, loop prevention) is the sans-I/O
:class:`~fqbroker.frontends.fq.datachannel.DataChannel`; this module moves bytes between it
and the transport, publishes what it decodes (the input side,
:class:`~fqbroker.frontends.fq.datainput.InputSide`), and writes what the queue holds. Its
theory of operation is :class:`DataSession`'s docstring.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
from typing import TYPE_CHECKING, Protocol

from fqbroker.frontends.fq.datachannel import DataChannel, Hello, Phase
from fqbroker.frontends.fq.datainput import InputHost, InputSide
from fqbroker.frontends.kit.connections import RemotePeer
from fqbroker.protocols.fq import wire
from fqbroker.protocols.fq.msgdecoder import BIG_READ, SMALL_READ

if TYPE_CHECKING:
    from fqbroker.core.queue import Buffer, Notify
    from fqbroker.frontends.fq.command import CommandSession

__all__ = ["DataHost", "DataSession", "Phase"]

log = logging.getLogger(__name__)

BATCH = 1024
OUT_CHUNK = 256 << 10  # a larger batch goes to the transport in pieces of this size
# Frames of a large batch handed on together, up to this size (one writev): a stream of
# large messages goes out several a syscall instead of one each (the batch holds them
# anyway). The figures behind these sizes: bench/RESULTS.md, "Figures behind comments".
WRITE_GROUP = 1 << 20
# An ordinary read of a stream of large messages (its last batch ended in one of BULK_FROM
# or more, datainput.py) takes up to this much, four times uvloop's 256 KiB, so several
# large messages a read instead of two. Each read of a loopback socket also runs the
# publisher's transmit in the broker's context (the window update), so fewer reads cost
# less in the kernel, not only in syscalls; and the partial frame a read ends with, copied
# into the decoder's buffer, is copied once per read. Not for small messages: they gain no
# CPU from it, and reads this large cost the memory row (a million queued 100-byte
# messages) a few bytes of RSS a message.
BULK_READ = 1 << 20
# A batch whose first frame has this size is written as it is (writev); else joined.
SCATTER_FROM = 2048


class DataHost(InputHost, Protocol):
    """What a data session needs of the broker that accepted it: what its input side
    needs (:class:`~fqbroker.frontends.fq.datainput.InputHost`), and these."""

    clients: dict[bytes, CommandSession]  # key -> the command session it pairs with

    def closed(self, transport: asyncio.Transport) -> None: ...


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


class DataSession(InputSide, RemotePeer, asyncio.BufferedProtocol):
    """One fq data channel: publishes what it reads, writes what its queue holds.

    Once paired with its command session by key (docs/fq-protocol.md §1.4), the session is
    a protocol with two independent sides, and no task of its own while idle:

    * In (:class:`~fqbroker.frontends.fq.datainput.InputSide`): whatever arrives is fed
      to the channel and its events handled; each batch goes to this channel's
      :class:`~fqbroker.core.publisher.Publisher`. After a block-policy queue fills up,
      reading pauses and a task waits for room; then the rest of the batch is published
      and reading resumes. That pushes back on this publisher only. What the decoder holds
      or has been told to expect (the rest of a large message) is reserved against the
      broker's memory budget before more is read; when the budget cannot grant it, or is
      spent while this publisher holds nothing, reading pauses until consumers drain
      (docs/memory.md).
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
        self.broker: DataHost = host
        self.transport = transport
        self.channel = DataChannel(mode)
        self.owner: CommandSession | None = None
        self._in = None  # the input side's state (datainput.py), made when first needed
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
