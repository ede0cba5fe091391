"""The client's side of a Figg connection, sans I/O (docs/figg-client.md).

:class:`FiggMachine` holds everything a Figg client must remember across connections (the
publish window, each subscription's position, the pings), so a reconnect is only "new
socket, ``connection_made()``, write ``data_to_send()``". :meth:`FiggMachine.next_event`
returns :class:`Message` (a DATA for a live subscription), :class:`Acked` (the window
moved), ``wire.Attached`` and ``wire.Detached``; :class:`Backoff` is the delay between
reconnect attempts.
"""

from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import dataclass

from fqbroker.errors import FiggProtocolError
from fqbroker.protocols.figg import wire

__all__ = ["Acked", "Backoff", "FiggMachine", "Message", "as_topic"]

WINDOW = 256
PING_INTERVAL = 2.0
MISSED_PINGS = 2


@dataclass(frozen=True, slots=True)
class Message:
    """One message of a topic: ``offset`` is the position just past it (resume from it)."""

    topic: bytes
    offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Acked:
    """Every publish with seq <= ``seq`` is acknowledged; ``in_flight`` are still not."""

    seq: int
    in_flight: int


def as_topic(topic: bytes | str) -> bytes:
    name = topic.encode() if isinstance(topic, str) else bytes(topic)
    if not name:
        raise ValueError("a topic name is not empty")
    if len(name) > wire.MAX_TOPIC:
        raise ValueError(f"a topic name is at most {wire.MAX_TOPIC} bytes")
    return name


class Backoff:
    """Reconnect delays: ``start`` doubling up to ``cap``, each spread by +-``jitter`` (a
    fraction) so that clients dropped together do not come back together."""

    def __init__(self, start: float = 0.1, cap: float = 5.0, jitter: float = 0.2) -> None:
        self.start, self.cap, self.jitter = start, cap, jitter
        self._next = start

    def next(self) -> float:
        delay = self._next
        self._next = min(self._next * 2, self.cap)
        return delay * random.uniform(1 - self.jitter, 1 + self.jitter)

    def reset(self) -> None:
        self._next = self.start


@dataclass(eq=False, slots=True)
class _Subscription:
    topic: bytes
    position: int | None  # where a re-attach resumes; None: from the latest message
    detaching: int = 0  # DETACHes sent on this connection and not yet answered


class FiggMachine:
    """A Figg client's state across connections, without I/O.

    ``publish()``, ``subscribe()`` and ``unsubscribe()`` queue frames; ``data_to_send()``
    returns what to write (nothing while disconnected: ``connection_made()`` queues what a
    new connection needs). ``receive_data()`` and ``next_event()`` read the broker's frames
    and raise ``FiggProtocolError`` on garbage; drop the connection then.
    """

    def __init__(
        self,
        window: int = WINDOW,
        ping_interval: float = PING_INTERVAL,
        missed_pings: int = MISSED_PINGS,
        max_frame: int = 16 << 20,
    ) -> None:
        if window < 1:
            raise ValueError("the publish window holds at least one message")
        self.window = window
        self.ping_interval = ping_interval
        self.missed_pings = missed_pings
        self.max_frame = max_frame
        self.next_seq = 0
        self.acked = -1  # the highest seq acknowledged
        self.connected = False
        self._unacked: deque[tuple[int, bytes]] = deque()
        self._subs: dict[bytes, _Subscription] = {}
        self._detaching: dict[bytes, int] = {}  # topics unsubscribed with DETACHED to come
        self._decoder = wire.FrameDecoder(max_frame)
        self._outbox: list[bytes] = []
        self._unanswered = 0
        self._next_ping = 0.0
        self.resent = range(0)  # the seqs the latest connection_made() queued again

    # --- publishing -------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Publishes not yet acknowledged."""
        return len(self._unacked)

    @property
    def window_full(self) -> bool:
        return len(self._unacked) >= self.window

    def publish(self, topic: bytes, data: bytes) -> int:
        """Queue one PUBLISH; its seq. The caller waits while ``window_full``."""
        if self.window_full:
            raise RuntimeError("the publish window is full")
        seq = self.next_seq
        self.next_seq += 1
        frame = wire.encode_publish(topic, seq, data)
        self._unacked.append((seq, frame))
        if self.connected:
            self._outbox.append(frame)
        return seq

    def _ack(self, seq: int) -> Acked:
        unacked = self._unacked
        while unacked and unacked[0][0] <= seq:
            unacked.popleft()
        self.acked = max(self.acked, seq)
        return Acked(seq, len(unacked))

    # --- subscriptions ----------------------------------------------------------------------

    @property
    def topics(self) -> list[bytes]:
        return list(self._subs)

    def position(self, topic: bytes) -> int | None:
        """Where ``topic``'s subscription would resume; None: latest (or not subscribed)."""
        sub = self._subs.get(topic)
        return None if sub is None else sub.position

    def subscribe(self, topic: bytes, offset: int | None = None) -> None:
        """ATTACH from ``offset`` (the messages after it), or from the latest with None."""
        if topic in self._subs:
            raise ValueError(f"already subscribed to {topic!r}")
        if offset is not None and not 0 <= offset < 1 << 64:
            raise ValueError("an offset is a u64")
        self._subs[topic] = _Subscription(topic, offset)
        if self.connected:
            self._outbox.append(wire.encode(wire.Attach(topic, offset)))

    def unsubscribe(self, topic: bytes) -> bool:
        """DETACH; what is still in flight for ``topic`` is dropped. False if not subscribed."""
        if self._subs.pop(topic, None) is None:
            return False
        if self.connected:
            self._outbox.append(wire.encode(wire.Detach(topic)))
            # Until DETACHED, DATA for the topic belongs to the old attachment, even when
            # the application subscribes again meanwhile (the broker answers in order).
            self._detaching[topic] = self._detaching.get(topic, 0) + 1
        return True

    # --- the connection ---------------------------------------------------------------------

    def connection_made(self, now: float) -> None:
        """A new connection: re-attach every subscription, re-send every unacknowledged
        publish in seq order, and start the ping clock."""
        self.connected = True
        self._decoder = wire.FrameDecoder(self.max_frame)
        self._detaching.clear()
        self._unanswered = 0
        self._next_ping = now + self.ping_interval
        out = [wire.encode(wire.Attach(s.topic, s.position)) for s in self._subs.values()]
        out += [frame for _, frame in self._unacked]
        self._outbox = out
        first = self._unacked[0][0] if self._unacked else self.next_seq
        self.resent = range(first, first + len(self._unacked))

    def connection_lost(self) -> None:
        self.connected = False
        self._outbox = []
        self._detaching.clear()

    def data_to_send(self) -> bytes:
        if not self._outbox:
            return b""
        out = b"".join(self._outbox)
        self._outbox = []
        return out

    def tick(self, now: float, timestamp: int | None = None) -> bool:
        """Send a PING when one is due; False once ``missed_pings`` in a row went unanswered
        (the connection is dead: drop it and reconnect). The PING carries ``timestamp``,
        by default the time in ns since the epoch, as the Go SDK sends."""
        if not self.connected or now < self._next_ping:
            return True
        if self._unanswered >= self.missed_pings:
            return False
        self._outbox.append(
            wire.encode(wire.Ping(time.time_ns() if timestamp is None else timestamp))
        )
        self._unanswered += 1
        self._next_ping = now + self.ping_interval
        return True

    def next_tick(self) -> float:
        """When :meth:`tick` has something to do next (a monotonic time, as ``now``)."""
        return self._next_ping

    def heard(self) -> None:
        """The broker is alive: anything it sends counts as an answer to a PING, since a
        PONG queued behind a burst of DATA proves no more than the DATA does."""
        self._unanswered = 0

    def receive_data(self, data: bytes) -> None:
        if data:
            self._unanswered = 0
            self._decoder.receive_data(data)

    def next_event(self) -> Message | Acked | wire.Attached | wire.Detached | None:
        decoder = self._decoder
        while (frame := decoder.next_frame()) is not None:
            if isinstance(frame, wire.Data):
                if (msg := self._data(frame)) is not None:
                    return msg
            elif isinstance(frame, wire.Ack):
                return self._ack(frame.seq)
            elif isinstance(frame, wire.Attached):
                if not self._detaching.get(frame.topic) and (sub := self._subs.get(frame.topic)):
                    # The broker's answer is the truth: an expired offset moved up to the
                    # oldest message, one past the end down to the end, latest resolved.
                    sub.position = frame.offset
                    return frame
            elif isinstance(frame, wire.Detached):
                if (left := self._detaching.get(frame.topic, 0)) > 1:
                    self._detaching[frame.topic] = left - 1
                else:
                    self._detaching.pop(frame.topic, None)
                return frame
            elif isinstance(frame, wire.Pong):
                pass  # receive_data() already counted it
            else:
                raise FiggProtocolError(f"a broker does not send {type(frame).__name__}")
        return None

    def _data(self, frame: wire.Data) -> Message | None:
        topic = frame.topic
        if self._detaching.get(topic):
            return None
        sub = self._subs.get(topic)
        if sub is None or (sub.position is not None and frame.offset <= sub.position):
            return None
        sub.position = frame.offset
        return Message(topic, frame.offset, frame.data)
