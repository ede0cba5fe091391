"""The fyrehose backbone, sans I/O: sequence, retained window, subscribers, requests
(docs/fyrehose.md, "How it works").

The asyncio shell (:mod:`.endpoint`) decodes datagrams and hands them here with the
datagram's source and the time; every method returns the datagrams to send as
``(bytes, (addr, port))`` pairs, and the shell sends them. Nothing here owns a socket, a
task or a clock of its own (the time given is read only by :meth:`Backbone.subscribers`,
for whoever shows them).
"""

from __future__ import annotations

import random
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from fqbroker.frontends.fyrehose.sequence import LAST, MASK, Mark
from fqbroker.protocols.fyrehose import wire

__all__ = ["DROP_REASONS", "SUBSCRIBED_SECONDS", "Address", "Backbone", "Out", "Subscriber"]

SUBSCRIBED_SECONDS: Final = 5.0  # a KEEPALIVE subscribes for this long (the revisions' 5 s)
ANY: Final = "0.0.0.0"
DROP_REASONS: Final = (
    "malformed",  # a datagram the codec refused (never answered)
    "unexpected",  # well formed, but a broker never gets one (DELIVER, FORWARD, ACK)
    "too_large",  # a message on the exchange over wire.MAX_DATA: cannot be a DELIVER
    "busy",  # a PUSH while a block-policy queue on the exchange is full
    "congested",  # a DELIVER while the socket's send buffer is full
    "subscribers_full",  # a KEEPALIVE from a new address past max_subscribers
    "elsewhere",  # a KEEPALIVE or REQUEST naming another host than its source's
)

Address = tuple[str, int]
Out = tuple[bytes, Address]  # a datagram and where it goes

_DELIVER_HEAD = struct.Struct(">BHHI")  # type, LENGTH, SEQUENCE as 16 + 32 bits
_store_last: Final = LAST.pack_into  # the last number given and its complement


@dataclass(slots=True)
class Subscriber:
    """A live subscriber as stats show it."""

    addr: str
    port: int
    journaling: bool
    expires_in: float  # seconds


def deliver(seq: int, data: bytes) -> bytes:
    """DELIVER ``seq`` ``data``: wire.encode's bytes, without its checks (the caller's)."""
    return _DELIVER_HEAD.pack(wire.DELIVER, len(data), seq >> 32, seq & 0xFFFFFFFF) + data


def _no_lease(seq: int) -> int:
    return wire.MAX_SEQUENCE + 1


class Backbone:
    """One listener's sequence, window and subscribers, and what it counts.

    :meth:`sequence` numbers a message and returns its DELIVER for every live subscriber.
    Before number ``lease`` would be given, ``renew(n)`` is called with the number about
    to be given and returns the new lease (:mod:`.sequence`): a synchronous file write
    once per lease, which makes sure a crashed broker never gives a number twice; and
    every number given is stored into ``mark`` (a shared file mapping: a memory store) so
    that a start after a killed process continues right after it. The
    window keeps messages as their DELIVER datagrams, so re-sending one costs no
    encoding. A REQUEST is cut to ``request_limit`` messages from its ``from`` on, since a
    19-byte datagram from a spoofed source must not buy unbounded traffic toward a victim;
    and unless ``send_elsewhere``, a KEEPALIVE or REQUEST naming an address on another
    host than the datagram's source is dropped (``elsewhere``): a client may have
    datagrams sent to itself only, never aim them at a third party.
    """

    def __init__(
        self,
        *,
        next_sequence: int = 1,
        window_messages: int = 65536,
        window_bytes: int = 32 << 20,
        request_limit: int = 4096,
        max_subscribers: int = 1024,
        send_elsewhere: bool = False,
        renew: Callable[[int], int] = _no_lease,
        lease: int | None = None,
        mark: Mark | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sequence = next_sequence - 1  # the last number given (0: none yet)
        self.window_messages = window_messages
        self.window_bytes = window_bytes
        self.request_limit = request_limit
        self.max_subscribers = max_subscribers
        self.send_elsewhere = send_elsewhere
        self._renew = renew
        # The first number that needs a new lease before it is given.
        self.lease = renew(next_sequence) if lease is None else lease
        self.mark: Mark = bytearray(LAST.size) if mark is None else mark
        self._rng = rng if rng is not None else random.Random()
        self._clock = clock
        # The window: DELIVER datagrams of sequences first_retained..sequence, as
        # _window[_head:] (a list indexes in O(1) where a deque walks its blocks; the
        # evicted head is cut off once it is half the list).
        self._window: list[bytes] = []
        self._head = 0
        self.retained_bytes = 0  # DATA bytes in the window
        # Subscribers: address -> (expiry on the clock, journaling).
        self._subs: dict[Address, tuple[float, bool]] = {}
        self._live: list[Address] | None = None  # cached live addresses, until one changes
        self._live_until = 0.0  # when the cache must be rebuilt (the next expiry)
        self.pushed = 0
        self.sequenced = 0
        self.delivered = 0
        self.keepalives = 0
        self.requests = 0
        self.served = 0
        self.forwarded = 0
        self.unserved = 0
        self.dropped: dict[str, int] = dict.fromkeys(DROP_REASONS, 0)

    # --- what stats read ------------------------------------------------------------------

    @property
    def first_retained(self) -> int:
        """The oldest sequence in the window (0: the window is empty)."""
        n = len(self._window) - self._head
        return self.sequence - n + 1 if n else 0

    @property
    def retained_messages(self) -> int:
        return len(self._window) - self._head

    def subscribers(self, now: float | None = None) -> list[Subscriber]:
        """The live subscribers, and for how long each stays one without a KEEPALIVE."""
        if now is None:
            now = self._clock()
        return [
            Subscriber(addr, port, journaling, expires - now)
            for (addr, port), (expires, journaling) in self._subs.items()
            if expires > now
        ]

    # --- the stream -----------------------------------------------------------------------

    def targets(self, now: float) -> list[Address]:
        """Where a DELIVER goes now: every live subscriber (expired ones are forgotten)."""
        live = self._live
        if live is not None and now < self._live_until:
            return live
        subs = self._subs
        for address in [a for a, (expires, _) in subs.items() if expires <= now]:
            del subs[address]
        live = self._live = list(subs)
        self._live_until = min((e for e, _ in subs.values()), default=float("inf"))
        return live

    def sequence_message(self, data: bytes) -> bytes | None:
        """Give ``data`` the next number and keep it: its DELIVER datagram, or None for
        data over wire.MAX_DATA (not sequenced; counted ``too_large``)."""
        if len(data) > wire.MAX_DATA:
            self.dropped["too_large"] += 1
            return None
        seq = self.sequence + 1
        if seq >= self.lease:
            self.lease = self._renew(seq)
        self.sequence = seq
        # Before the DELIVER goes anywhere: a number sent is a number a restart skips.
        _store_last(self.mark, 0, seq, seq ^ MASK)
        self.sequenced += 1
        datagram = deliver(seq, data)
        window = self._window
        window.append(datagram)
        self.retained_bytes += len(data)
        head = self._head
        while len(window) - head > self.window_messages or (
            self.retained_bytes > self.window_bytes and head < len(window)
        ):
            self.retained_bytes -= len(window[head]) - wire.HEADER_SIZE
            window[head] = b""  # its memory goes now, not at the next cut
            head += 1
        if head > 1024 and head * 2 > len(window):
            del window[:head]
            head = 0
        self._head = head
        return datagram

    # --- datagrams in ---------------------------------------------------------------------

    def keepalive(self, k: wire.Keepalive, source: Address, now: float) -> list[Out]:
        """Subscribe or unsubscribe ``k``'s address; its KEEPALIVE-ACK, to the source."""
        self.keepalives += 1
        address = _destination(k.addr, k.port, source)
        if address[0] != source[0] and not self.send_elsewhere:
            self.dropped["elsewhere"] += 1
            return []
        subs = self._subs
        if k.flags & wire.Flags.NOSUBSCRIBE:
            if subs.pop(address, None) is not None:
                self._live = None
        else:
            journaling = not k.flags & wire.Flags.NOJOURNAL
            known = subs.get(address)
            if known is None and len(subs) >= self.max_subscribers:
                self.targets(now)  # forget the expired before refusing
            if known is None and len(subs) >= self.max_subscribers:
                self.dropped["subscribers_full"] += 1
            else:
                subs[address] = (now + SUBSCRIBED_SECONDS, journaling)
                if known is None or known[1] != journaling or known[0] <= now:
                    self._live = None
        return [(wire.encode(k.ack()), source)]

    def request(self, r: wire.Request, source: Address, now: float) -> list[Out]:
        """The DELIVERs (and the FORWARD) that answer REQUEST ``r``."""
        self.requests += 1
        dest = _destination(r.addr, r.port, source)
        if dest[0] != source[0] and not self.send_elsewhere:
            self.dropped["elsewhere"] += 1
            return []
        to_seq = min(r.to_seq, self.sequence, r.from_seq + self.request_limit - 1)
        if r.from_seq > to_seq:
            return []  # all of it above the sequence: nothing yet
        out: list[Out] = []
        first = self.first_retained or self.sequence + 1
        if r.from_seq < first:
            old_to = min(to_seq, first - 1)
            journal = self._journal(dest, now)
            if journal is None:
                self.unserved += old_to - r.from_seq + 1
            else:
                fwd = wire.Forward(dest[0], dest[1], r.from_seq, old_to)
                out.append((wire.encode(fwd), journal))
                self.forwarded += 1
        start = max(r.from_seq, first)
        if start <= to_seq:
            at = self._head + start - first
            out.extend((datagram, dest) for datagram in self._window[at : at + to_seq - start + 1])
            self.served += to_seq - start + 1
        return out

    def _journal(self, requester: Address, now: float) -> Address | None:
        """A random live subscriber without NOJOURNAL that is not ``requester``."""
        choices = [a for a in self.targets(now) if a != requester and self._subs[a][1]]
        return self._rng.choice(choices) if choices else None


def _destination(addr: str, port: int, source: Address) -> Address:
    """Where a KEEPALIVE's or REQUEST's ADDR:PORT points: 0.0.0.0 is the source's address
    (and a port of 0 there the source's port)."""
    if addr == ANY:
        return (source[0], port or source[1])
    return (addr, port)
