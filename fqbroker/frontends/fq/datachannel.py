"""The data channel's protocol, sans I/O: bytes in, events out (fqd_dss.c,
docs/fq-protocol.md §1.4, §1.10).

:class:`DataChannel` is the broker's side of one fq data socket, in the shape of the
client's :class:`~fqbroker.clients.fq.channel.CommandChannel` (and of h11 and websockets). It
knows the phases (AWAIT_KEY, STREAMING, CLOSED), the hello, the message format and the
stamp; it owns no socket, task, timer or budget, and publishes nothing itself: the shell in
:mod:`fqbroker.frontends.fq.data` does that.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum

from fqbroker.core.frames import frame_hops
from fqbroker.core.message import Message, Run, accept_from_peer, has_hop, ipv4_bytes, runs_of
from fqbroker.errors import ProtocolError
from fqbroker.protocols.fq import wire
from fqbroker.protocols.fq.msgdecoder import BIG_READ, MessageDecoder

__all__ = ["PEER_COPIES", "BadInput", "Batch", "DataChannel", "Hello", "Oversized", "Phase"]

log = logging.getLogger("fqbroker.frontends.fq.data")

# A peer's messages are decoded into Message objects and built into frames again: while
# one is, it is in memory about this many times (measured). It reserves what its frame
# announces while it arrives, and this many times that only once it is whole, to decode.
PEER_COPIES = 3
NO_PEER = wire.NO_PEER


class Phase(Enum):
    AWAIT_KEY = "await_key"
    STREAMING = "streaming"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Hello:
    key: bytes
    peer_id: bytes


class Batch:
    """Not a dataclass: one is made every read, and a compiled dataclass's ``__init__`` is
    the one the dataclasses module writes, interpreted, many times a compiled one's cost
    (bench/RESULTS.md, figures behind comments)."""

    __slots__ = ("last", "octets", "read", "read_octets", "runs")

    def __init__(
        self, runs: list[Run], octets: int, read: int = 0, read_octets: int = 0, last: bool = True
    ) -> None:
        self.runs = runs
        # Bytes read for the runs, counted as they are published; -1: see read.
        self.octets = octets
        self.read = read  # a peer's: messages read, looped ones too
        self.read_octets = read_octets
        # No event follows until more is read: the shell need not ask again.
        self.last = last

    def __repr__(self) -> str:
        return (
            f"Batch(runs={self.runs!r}, octets={self.octets}, read={self.read}, "
            f"read_octets={self.read_octets}, last={self.last})"
        )


@dataclass(frozen=True, slots=True)
class Oversized:
    count: int
    limit: int


@dataclass(frozen=True, slots=True)
class BadInput:
    reason: str


Event = Hello | Batch | Oversized | BadInput


class DataChannel:
    """One data socket's protocol state: hello, decoder, stamp.

    The shell feeds it what it read with :meth:`receive_data` and handles
    :meth:`next_event` until it returns None (or a batch that says it is the ``last``
    event until more is read: one call a read). The events:

    * :class:`Hello`: the key the socket presented (after a peer id, for a peer); the
      shell pairs it with its command session and calls :meth:`paired`, or closes.
    * :class:`Batch`: every whole message read so far, as runs of peer frames stamped with
      sender and hops as fqd does (docs/fq-protocol.md §1.11). A peer's messages were
      decoded, counted as read (``read``, ``read_octets``), and those that already passed
      through this broker left out (loop prevention, docs/fq-protocol.md §5.3).
    * :class:`Oversized`: messages skipped for their size while decoding the batch before.
    * :class:`BadInput`: the input is not the fq data protocol; the channel must close.

    Out, :meth:`outgoing` drops from what the queue gives the messages the peer at the
    other end already saw (docs/fq-protocol.md §5.3).
    """

    __slots__ = (
        "_batch_due",
        "_decoder",
        "_hello",
        "_stamp",
        "_user",
        "is_peer",
        "peer_id",
        "phase",
        "trusted",
    )

    def __init__(self, mode: wire.Mode) -> None:
        self.phase = Phase.AWAIT_KEY
        self.is_peer = mode in (wire.Mode.PEER, wire.Mode.OLD_PEER)
        self.peer_id = NO_PEER
        # A peer's messages keep the sender and hops they carry only for a user with the
        # peer right; else each is the user's own, stamped as a publisher's.
        self.trusted = True
        self._hello: wire.DataHelloDecoder | None = wire.DataHelloDecoder(mode)
        self._decoder: MessageDecoder | None = None  # made when the first message comes
        self._batch_due = False  # bytes came since the last batch, or an error waits
        self._user = b""
        # A publisher's: the hops its messages get, our node id and its address. A peer's:
        # our node id, which its messages must not have passed through.
        self._stamp = b""

    # --- in -------------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        if self.phase is Phase.STREAMING:
            assert self._decoder is not None, "start_reading() first"
            self._decoder.feed(data)
            self._batch_due = True
        elif self.phase is Phase.AWAIT_KEY:
            assert self._hello is not None
            self._hello.feed(data)

    def room(self) -> memoryview | None:
        """Where the next read should go, for a reader that reads into our memory: a
        large message's own bytes; None: an ordinary read of :attr:`read_size` bytes
        for :meth:`receive_data` (docs/fq-protocol.md has no say in this: any split of
        the input reads the same)."""
        decoder = self._decoder
        if self.phase is not Phase.STREAMING or decoder is None:
            return None
        return decoder.room()

    def filled_in(self, n: int) -> bool:
        """``n`` bytes were read into :meth:`room`; True: a message is whole, and
        :meth:`next_event` has a batch."""
        assert self._decoder is not None
        if not self._decoder.filled_in(n):
            return False
        self._batch_due = True
        return True

    @property
    def read_size(self) -> int:
        decoder = self._decoder
        return BIG_READ if decoder is None else decoder.read_size

    def next_event(self) -> Event | None:
        if self.phase is Phase.AWAIT_KEY:
            assert self._hello is not None
            try:
                hello = self._hello.next_hello()
            except ProtocolError as exc:  # a key over 127 bytes (docs/limits.md)
                return BadInput(str(exc))
            return None if hello is None else Hello(hello.key, hello.peer_id)
        decoder = self._decoder
        if self.phase is not Phase.STREAMING or decoder is None:
            return None
        if decoder.oversized:
            count, decoder.oversized = decoder.oversized, 0
            return Oversized(count, decoder.max_payload)
        if not self._batch_due:
            return None
        self._batch_due = False
        try:
            batch = self._decode(decoder)
        except ProtocolError as exc:
            return BadInput(str(exc))
        # The good messages before a bad frame come first; the next event is its error.
        self._batch_due = decoder.error_pending
        batch.last = not (self._batch_due or decoder.oversized)
        return batch

    def paired(self, user: bytes, peer_id: bytes, trusted: bool = True) -> bytes:
        """The key was good: stream from now on; returns what came after the hello.
        ``trusted``: the user may relay as a peer (sender and hops as sent)."""
        assert self._hello is not None
        leftover = self._hello.unconsumed()
        self._hello = None
        self._user = user
        self.peer_id = peer_id
        self.trusted = trusted
        self.phase = Phase.STREAMING
        return leftover

    @property
    def reading(self) -> bool:
        return self._decoder is not None

    def start_reading(self, node_id: bytes, remote_addr: str, max_payload: int) -> None:
        """Make the decoder, and for a publisher its stamp: when it first sends, as most
        consumers never do."""
        relays = self.is_peer and self.trusted
        self._stamp = node_id if relays else node_id + ipv4_bytes(remote_addr)
        self._decoder = MessageDecoder(peer_format=self.is_peer, max_payload=max_payload)

    @property
    def stamp_size(self) -> int:
        """What sender and hops add to each frame a publisher sent."""
        return 0 if self.is_peer else 2 + len(self._user) + len(self._stamp)

    @property
    def in_flight(self) -> int:
        """Bytes of memory what the decoder holds or expects will take."""
        decoder = self._decoder
        return 0 if decoder is None else decoder.in_flight

    def decode_size(self) -> int:
        """A peer's: what decoding what is whole takes, when that is more than a read
        (the copies a decode makes, held only while it runs); else 0."""
        decoder = self._decoder
        if not self.is_peer or decoder is None:
            return 0
        ready = decoder.ready
        return ready * PEER_COPIES if ready > BIG_READ else 0

    @property
    def received(self) -> int:
        """Grows as a partial message arrives (:attr:`MessageDecoder.received`)."""
        decoder = self._decoder
        return 0 if decoder is None else decoder.received

    def announced_exchange(self) -> bytes | None:
        """The exchange of the message :attr:`in_flight` announces, before any of its
        payload is reserved for; None: none, or a peer's."""
        decoder = self._decoder
        return None if decoder is None else decoder.head_exchange()

    def _decode(self, decoder: MessageDecoder) -> Batch:
        if not self.is_peer:
            runs = decoder.runs(self._user, self._stamp)
            octets, decoder.octets = decoder.octets, 0
            return Batch(runs, octets)
        msgs = decoder.messages()
        octets, decoder.octets = decoder.octets, 0
        if not self.trusted:
            # Peer format from a user without the peer right: whatever sender and hops it
            # claims, the messages are its own, as on a plain data socket.
            user, stamp = self._user, self._stamp
            for msg in msgs:
                msg.stamp(user, stamp)
            return Batch(runs_of(msgs), -1, len(msgs), octets)
        node_id = self._stamp
        return Batch(runs_of([m for m in msgs if _accept(m, node_id)]), -1, len(msgs), octets)

    # --- out ------------------------------------------------------------------------------

    def outgoing(self, frames: list[bytes]) -> list[bytes]:
        """Of the frames a queue gave, those to write: not those the peer already saw."""
        peer_id = self.peer_id
        if peer_id == NO_PEER:
            return frames
        return [f for f in frames if not has_hop(frame_hops(f), peer_id)]

    def close(self) -> None:
        self.phase = Phase.CLOSED


def _accept(msg: Message, node_id: bytes) -> bool:
    if accept_from_peer(msg, node_id):
        return True
    log.debug("received looped message %r", msg)
    return False
