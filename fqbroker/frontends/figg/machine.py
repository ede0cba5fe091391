"""One Figg connection's rules, sans I/O: bytes in, events and reply bytes out
(docs/figg-protocol.md).

The machine answers PING itself, hands ATTACH and DETACH to the shell, makes a read's
PUBLISH frames one batch of fq messages and owes each batch one ACK. Its asyncio shell is
:mod:`.session`; its theory of operation is :class:`Machine`'s docstring.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fqbroker.core.frames import encode_peer
from fqbroker.errors import FiggProtocolError
from fqbroker.frontends.kit.acks import AckingMachine, BadInput, Batch
from fqbroker.protocols.figg import wire

if TYPE_CHECKING:
    from fqbroker.core.message import Run

__all__ = ["Config", "Event", "Machine", "sender_for"]

_SENDER_PREFIX = b"figg/"
_encode = wire.encode

Event = Batch | BadInput | wire.Attach | wire.Detach


@dataclass(frozen=True, slots=True)
class Config:
    """What every connection of one listener shares, made once from the settings."""

    exchange: bytes
    max_frame: int


def sender_for(remote_addr: str, remote_port: int) -> bytes:
    """``b"figg/ip:port"`` (IPv6 in brackets); at most 5 + 47 bytes, within fq's 127."""
    host = f"[{remote_addr}]" if ":" in remote_addr else remote_addr
    return _SENDER_PREFIX + f"{host}:{remote_port}".encode()


class Machine(AckingMachine[int]):
    """One Figg client's connection: frames in, batches and replies out; it owes each
    batch's highest seq.

    :meth:`receive_data` buffers what a read brought, with the time it came;
    :meth:`next_event` then hands back, one at a time, what the shell has to act on,
    and None once the buffer holds no whole frame:

    * PING is answered by the machine itself (PONG, in :meth:`data_to_send`), no event;
    * ATTACH is handed on as the :class:`~fqbroker.protocols.figg.wire.Attach` frame: the shell
    opens the topic,   starts the subscription and tells the machine where delivery starts
      (:meth:`attached`, which answers ATTACHED);
    * DETACH is answered DETACHED and handed on as the
    :class:`~fqbroker.protocols.figg.wire.Detach` frame, for the   shell to stop the subscription;
    * the PUBLISH frames of the read become one :class:`~fqbroker.frontends.kit.acks.Batch`,
      last: each one fq message on the Figg exchange with route = topic, sender
      ``figg/ip:port`` and our node id as its one hop, made into runs as they come (a run per
      topic in a row);
    * a malformed frame, or a frame only a server sends, is a
      :class:`~fqbroker.frontends.kit.acks.BadInput`, answered to every later call; the
      PUBLISH frames of that read are dropped (unacknowledged, the client sends them again).

    **ACK.** Each batch is owed one ACK (its highest seq), due once its messages are handled:
    the shell's publishing tail calls :meth:`acknowledge` with how many messages are routed
    and durable, and the ACKs due become one ACK (the client's is cumulative).

    **Idle.** The machine knows when input last came (:attr:`last_input`); the listeners'
    idle limit reads it through the shell, which owns no timer of its own.
    """

    __slots__ = (
        "_bad",
        "_decoder",
        "_drained",
        "_exchange",
        "_hops",
        "_mapped",
        "_next_id",
        "_publishes",
        "_sender",
        "acked",
        "last_input",
    )

    def __init__(
        self,
        config: Config,
        sender: bytes,
        hops: bytes,
        next_id: Callable[[], bytes],
        now: float,
    ) -> None:
        """``sender`` and ``hops`` stamp every message; ``next_id`` gives its id; ``now``
        starts the idle time."""
        super().__init__()
        self._decoder = wire.FrameDecoder(config.max_frame)
        self._exchange = config.exchange
        self._sender = sender
        self._hops = hops
        self._next_id = next_id
        self.last_input = now  # loop time input last came
        self._mapped = 0  # messages made so far
        self._publishes: list[tuple[bytes, int, bytes]] = []  # (topic, seq, data)
        self._bad: BadInput | None = None  # final: answered to every later call
        # Every whole frame received is acted on: the call that ends a read's events
        # needs no decoding.
        self._drained = True
        self.acked = -1  # the last seq acknowledged (-1: none yet)

    @property
    def buffered(self) -> int:
        """Bytes received and not yet decoded (up to a frame of ``max_frame``)."""
        return self._decoder.buffered

    @property
    def in_flight(self) -> int:
        """What to reserve for: what is buffered (a frame's size is not announced)."""
        return self._decoder.buffered

    @property
    def messages(self) -> int:
        """Messages made so far."""
        return self._mapped

    def receive_data(self, data: bytes, now: float) -> None:
        self.last_input = now
        self._drained = False
        self._decoder.receive_data(data)

    def next_event(self) -> Event | None:
        """What the shell acts on next (see the module docstring); None: more input."""
        if self._drained:
            return None
        if self._bad is not None:
            return self._bad
        decoder = self._decoder
        publishes = self._publishes
        out = self._out
        try:
            while True:
                if decoder.take_publishes(publishes):
                    continue
                frame = decoder.next_frame()
                if frame is None:
                    break
                if isinstance(frame, wire.Ping):
                    out.append(_encode(wire.Pong(frame.timestamp)))
                elif isinstance(frame, wire.Attach):
                    return frame
                elif isinstance(frame, wire.Detach):
                    out.append(_encode(wire.Detached(frame.topic)))
                    return frame
                else:
                    # A server's frame (ATTACHED, DATA, ...): well formed, not ours to get.
                    name = type(frame).__name__.upper()
                    return self._fail(f"it sent {name}, a server's frame")
        except FiggProtocolError as exc:
            return self._fail(str(exc))
        self._drained = True
        if publishes:
            return self._batch(publishes)
        return None

    def _fail(self, reason: str) -> BadInput:
        self._publishes.clear()
        self._bad = BadInput(reason)
        return self._bad

    def _batch(self, publishes: list[tuple[bytes, int, bytes]]) -> Batch:
        exchange = self._exchange
        next_id = self._next_id
        sender = self._sender
        hops = self._hops
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
        self._mapped += len(publishes)
        self.owe(high, self._mapped)
        publishes.clear()
        return Batch(runs, octets)

    def attached(self, topic: bytes, offset: int) -> None:
        """The shell attached ``topic``: delivery starts after ``offset``."""
        self._out.append(_encode(wire.Attached(topic, offset)))

    # --- ACKs -----------------------------------------------------------------------------

    def _encode_acks(self, due: list[int]) -> bytes:
        """One ACK for the batches now due: the client's is cumulative."""
        self.acked = due[-1]
        return wire.encode_ack(self.acked)
