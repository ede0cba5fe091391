"""One Lumberjack connection's rules, sans I/O: bytes in, batches and ACK bytes out
(docs/lumberjack.md).

The machine turns a shipper's events into batches of fq messages, marks the points to
acknowledge, and writes each ACK once the shell says its events are routed and durable;
its timers are inputs. Its asyncio shell is :mod:`.session`; its theory of operation is
:class:`Machine`'s docstring.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fqbroker.core.frames import encode_peer
from fqbroker.frontends.kit.acks import AckingMachine, BadInput, Batch
from fqbroker.frontends.lumberjack.mapping import RouteTemplate
from fqbroker.protocols.lumberjack.wire import Event, Events, Limits, Receiver, Window, encode_ack

if TYPE_CHECKING:
    from fqbroker.core.message import Run

__all__ = ["Config", "Machine"]

# Messages' bytes in one batch: a read's events are handed on in batches of about this
# much, so what compressed frames inflate to enters the queues a batch at a time, each
# after the shell found the memory budget not spent.
BATCH_OCTETS = 1 << 20


@dataclass(frozen=True, slots=True)
class Config:
    """What every connection of one listener shares, made once from the settings."""

    exchange: bytes
    template: RouteTemplate
    limits: Limits
    ack_idle: float  # seconds
    keepalive: float  # seconds


class Machine(AckingMachine[tuple[int, int]]):
    """One shipper's connection: frames in, batches and ACKs out; it owes (version, seq).

    :meth:`receive_data` feeds what a read brought to the
    :class:`~fqbroker.protocols.lumberjack.wire.Receiver`, with the time it came;
    :meth:`next_event` hands back the events decoded since as a
    :class:`~fqbroker.frontends.kit.acks.Batch` of fq messages, of about
    :data:`BATCH_OCTETS` at most, the rest in the next ones (the configured exchange, the
    route the template picks, the event's JSON bytes, sender ``lumberjack/ip:port`` and our
    node id as the only hop, as HTTP ``/submit`` stamps them), then a
    :class:`~fqbroker.frontends.kit.acks.BadInput` if the input broke the protocol or a limit
    (events decoded before it are still published, never acknowledged), then None.

    **ACK points.** An ACK names the last sequence number received (not a count; pylogbeat's
    numbers run on across batches, go-lumber's restart at 1). A point to acknowledge is
    marked, in arrival order, when a window's worth of events has arrived since its ``W``,
    when a new ``W`` ends a batch that was not full (an empty one is acknowledged with seq 0,
    as Logstash does), at EOF, and when input has been idle for ``ack_idle`` with events
    unmarked (lumberjack-protocol sends one ``W`` and then streams). Each point is due once
    the events up to it are handled: the shell's publishing tail calls :meth:`acknowledge`
    with how many are routed and durable, and the machine writes the ACKs due, in order.

    **Timers are inputs.** :attr:`deadline` is when the idle mark is due (None while nothing
    is unmarked); the shell calls :meth:`tick` with the time then. While the shell is held
    back (by whatever but the shipper not reading) or waits for an fsync, it calls
    :meth:`keepalive` every ``keepalive_seconds``, which writes ``ACK(0)`` to a v2 shipper
    (Beats and go-lumber read it as "still working"; v1 has none).
    """

    __slots__ = (
        "_ack_idle",
        "_drained",
        "_eof",
        "_exchange",
        "_hops",
        "_in_window",
        "_last_read",
        "_last_seq",
        "_mapped",
        "_next_id",
        "_receiver",
        "_route_of",
        "_sender",
        "_spoken",
        "_unmarked",
        "_violation",
        "_window",
        "acked",
        "version",
    )

    def __init__(
        self, config: Config, sender: bytes, hops: bytes, next_id: Callable[[], bytes]
    ) -> None:
        """``sender`` and ``hops`` stamp every message; ``next_id`` gives its id."""
        super().__init__()
        self._receiver = Receiver(config.limits)
        self._exchange = config.exchange
        self._route_of = config.template.route
        self._ack_idle = config.ack_idle
        self._sender = sender
        self._hops = hops
        self._next_id = next_id
        # The batch being read: its version, window, events since its W (or since the
        # window last filled), the last seq received, and events not yet in a mark.
        self.version = 2
        self._window = 0
        self._in_window = 0
        self._last_seq = 0
        self._unmarked = 0
        self._mapped = 0  # events made into messages so far
        self._last_read = 0.0
        self._eof = False
        self._spoken = False  # a frame came: the shipper may be waiting for an ACK
        self._violation: BadInput | None = None
        # Every event received is handed on: the call that ends a read's events needs
        # no decoding.
        self._drained = True
        self.acked = 0  # the last seq acknowledged

    @property
    def buffered(self) -> int:
        """Bytes received and not yet decoded (a partial frame), for the memory budget."""
        return self._receiver.buffered

    @property
    def in_flight(self) -> int:
        """What the partial frame will take once whole, as far as its head says."""
        return self._receiver.in_flight

    @property
    def events(self) -> int:
        """Events made into messages so far."""
        return self._mapped

    def receive_data(self, data: bytes, now: float) -> None:
        self._receiver.receive_data(data)
        self._last_read = now
        self._drained = False

    def receive_eof(self) -> None:
        """Nothing more is coming: what is unmarked is marked, now and from now on."""
        self._eof = True
        self._mark()

    def next_event(self) -> Batch | BadInput | None:
        """The events decoded since the last call as one batch, then bad input, if any,
        then None until more input."""
        if self._violation is not None:
            return self._violation
        if self._drained:
            return None
        receiver = self._receiver
        runs: list[Run] = []
        octets = 0
        while (event := receiver.next_event()) is not None:
            if isinstance(event, Events):
                if event.events:
                    octets += self._add(event.version, event.events, runs)
                    if octets >= BATCH_OCTETS:
                        break  # the rest next call
            elif isinstance(event, Window):
                self._new_window(event)
            else:
                self._violation = BadInput(event.reason)
                break
        else:
            self._drained = True
        if self._eof:
            self._mark()
        if runs:
            return Batch(runs, octets)
        return self._violation

    def _new_window(self, window: Window) -> None:
        """A W: the batch before it ends, acknowledged as far as it got (as Logstash)."""
        self._spoken = True
        self._mark()
        self.version = window.version
        self._window = window.size
        self._in_window = 0
        if window.size == 0:
            self.owe((window.version, 0), self._mapped)

    def _add(self, version: int, events: list[Event], runs: list[Run]) -> int:
        """Make ``events`` into messages appended to ``runs`` (a run per route in a row),
        mark the windows they fill; returns their frames' bytes."""
        exchange = self._exchange
        route_of = self._route_of
        next_id = self._next_id
        sender = self._sender
        hops = self._hops
        octets = 0
        route: bytes | None = None
        frames: list[bytes] = []
        for event in events:
            payload = event.payload
            this = route_of(event)
            frame = encode_peer(exchange, this, next_id(), sender, hops, payload)
            octets += len(frame)
            if this != route:
                route = this
                frames = [frame]
                runs.append((exchange, this, frames, len(frame) - len(payload)))
            else:
                frames.append(frame)
        self._count(version, events)
        return octets

    def _count(self, version: int, events: list[Event]) -> None:
        """Move the batch's counters over ``events``, marking each window they fill."""
        self.version = version
        self._spoken = True
        n = len(events)
        start = self._mapped
        window = self._window
        done = 0
        if window > 0:
            while n - done >= window - self._in_window:
                done += window - self._in_window
                self._in_window = 0
                self.owe((version, events[done - 1].seq), start + done)
        self._in_window += n - done
        self._unmarked = n - done if done else self._unmarked + n
        self._last_seq = events[-1].seq
        self._mapped = start + n

    def _mark(self) -> None:
        """Mark the events received and not yet marked (a W, idle input, EOF)."""
        if self._unmarked:
            self.owe((self.version, self._last_seq), self._mapped)
            self._unmarked = 0

    # --- ACKs -----------------------------------------------------------------------------

    def _encode_acks(self, due: list[tuple[int, int]]) -> bytes:
        """An ACK for each mark now due, in order."""
        self.acked = due[-1][1]
        return b"".join([encode_ack(version, seq) for version, seq in due])

    # --- timers ---------------------------------------------------------------------------

    @property
    def last_read(self) -> float:
        """The time of the last input given (0.0 before any)."""
        return self._last_read

    @property
    def deadline(self) -> float | None:
        """When input will have been idle for ``ack_idle`` with events unmarked; None
        while every event is marked."""
        return self._last_read + self._ack_idle if self._unmarked else None

    def tick(self, now: float) -> bool:
        """The idle timer at ``now``: mark the events unmarked once input has been idle
        for ``ack_idle`` (a millisecond early counts); whether it did."""
        if not self._unmarked or self._last_read + self._ack_idle - now > 0.001:
            return False
        self._mark()
        return True

    def keepalive(self) -> None:
        """The shell is held back: ``ACK(0)`` to a v2 shipper.

        Not only while a batch read is unacknowledged: with reading paused, the batch the
        shipper waits for may be unread in the socket, or partly read (a memory budget
        spent holds a connection back between frames or within one); an ACK(0) the
        shipper did not wait for is read as the keepalive it is by Beats and pylogbeat.
        A connection that has not sent a whole frame yet (a shipper starts with a W) is
        no shipper waiting for an ACK.
        """
        if self.version == 2 and self._spoken:
            self._out.append(encode_ack(2, 0))
