"""The client's side of the fyrehose backbone, sans I/O (docs/fyrehose-client.md).

:class:`FyrehoseMachine` takes datagrams in (with their source address and the time) and
gives datagrams out (with their destination) and events: KEEPALIVEs (the final form, with
a random token), in-order delivery with gaps held and REQUESTed, the tail probe (chased
while its answers come back, so a replay runs at the speed of the wire), the journal that
answers FORWARDs, and PUSHes confirmed when their bytes come back in the stream. Every timer
runs off the ``now`` its caller passes, so tests drive hours of protocol in microseconds.
Events: :class:`Delivered`, :class:`Lost`, :class:`Confirmed`.
"""

from __future__ import annotations

import bisect
import os
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Final

from fqbroker.errors import FyrehoseProtocolError
from fqbroker.protocols.fyrehose import wire

__all__ = [
    "Address",
    "Confirmed",
    "Delivered",
    "FyrehoseMachine",
    "Lost",
    "Stats",
]

Address = tuple[str, int]

KEEPALIVE_INTERVAL: Final = 1.0
REQUEST_DELAY: Final = 0.05
REQUEST_INTERVAL: Final = 0.2
ROUND_SPACING: Final = 0.02  # request rounds are at least this far apart
PROBE_AFTER: Final = 1.0
PROBE_SPAN: Final = 64
REQUEST_LIMIT: Final = 4096  # the broker's default request_limit
HOLD_LIMIT: Final = 2 * 65536  # twice the broker's default window
ANY: Final = ("0.0.0.0", 0)


@dataclass(frozen=True, slots=True)
class Delivered:
    """Message ``seq`` of the stream, in order and once."""

    seq: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Lost:
    """Messages ``from_seq`` to ``to_seq`` (inclusive) were given up on."""

    from_seq: int
    to_seq: int


@dataclass(frozen=True, slots=True)
class Confirmed:
    """Publish ``publish_id`` came back as message ``seq`` (None: not subscribed)."""

    publish_id: int
    seq: int | None


@dataclass(slots=True)
class Stats:
    delivered: int = 0  # messages handed to the application
    duplicates: int = 0  # DELIVERs for a message already delivered or held
    reordered: int = 0  # messages that filled a gap before it was requested
    recovered: int = 0  # messages that filled a gap after it was requested
    lost: int = 0  # messages given up on (in Lost events)
    ignored: int = 0  # messages before ``start``
    requests: int = 0  # REQUEST datagrams sent (gaps and probes)
    requested: int = 0  # messages asked for by those REQUESTs
    probes: int = 0  # tail probes among them
    keepalives: int = 0
    acks: int = 0  # KEEPALIVE-ACKs with our token
    forwards: int = 0  # FORWARDs received
    forwards_answered: int = 0  # FORWARDs answered with at least one DELIVER
    forwarded_messages: int = 0  # DELIVERs sent for FORWARDs
    published: int = 0
    resent: int = 0  # PUSHes sent again after publish_timeout
    confirmed: int = 0
    malformed: int = 0  # datagrams the codec refused
    unexpected: int = 0  # datagrams a client never expects (PUSH, REQUEST, foreign ACK...)


@dataclass(eq=False, slots=True)
class _Gap:
    start: int
    end: int  # inclusive
    since: float  # when it appeared: given up at since + gap_seconds
    due: float  # next REQUEST
    requested: bool = False
    asked_to: int = 0  # asked up to here since ``due`` was set: the rest need not wait for it


@dataclass(eq=False, slots=True)
class _Pending:
    publish_id: int
    data: bytes
    datagram: bytes
    sent_at: float


class FyrehoseMachine:
    """One fyrehose client's state, without I/O.

    Feed it :meth:`receive` (a datagram, its source and the time) and :meth:`tick` (the
    time, at :meth:`next_tick` or later); take :meth:`datagrams_to_send` and
    :meth:`next_event` after each.
    """

    def __init__(
        self,
        broker: Address,
        *,
        now: float,
        subscribe: bool = True,
        journal_messages: int = 0,
        start: int | None = None,
        gap_seconds: float = 10.0,
        publish_timeout: float = 2.0,
        advertise: Address | None = None,
        token: bytes | None = None,
        keepalive_interval: float = KEEPALIVE_INTERVAL,
        request_delay: float = REQUEST_DELAY,
        request_interval: float = REQUEST_INTERVAL,
        probe_after: float = PROBE_AFTER,
        request_limit: int = REQUEST_LIMIT,
        request_budget: int = REQUEST_LIMIT,
        hold_limit: int = HOLD_LIMIT,
    ) -> None:
        if journal_messages < 0:
            raise ValueError("journal_messages is 0 (no journal) or more")
        if journal_messages and not subscribe:
            raise ValueError("a journal needs a subscription: the broker FORWARDs to subscribers")
        if start is not None and not 1 <= start <= wire.MAX_SEQUENCE:
            raise ValueError(f"start {start} is not a sequence (1 to {wire.MAX_SEQUENCE})")
        if min(request_limit, request_budget, hold_limit) < 1:
            raise ValueError("request_limit, request_budget and hold_limit are at least 1")
        self.broker = broker
        self.subscribe = subscribe
        self.journal_messages = journal_messages
        self.start = start
        self.gap_seconds = gap_seconds
        self.publish_timeout = publish_timeout
        self.advertise = advertise or ANY
        self.token = os.urandom(wire.TOKEN_SIZE) if token is None else token
        self.keepalive_interval = keepalive_interval
        self.request_delay = request_delay
        self.request_interval = request_interval
        self.probe_after = probe_after
        self.request_limit = request_limit
        self.request_budget = request_budget
        self.hold_limit = hold_limit
        self.stats = Stats()
        self.lost: list[tuple[int, int]] = []
        # The stream: ``next`` is the next sequence to deliver (None: not known yet), every
        # sequence in [next, top] is either held or in exactly one gap (sorted, disjoint).
        self.next: int | None = start
        self.top = 0 if start is None else start - 1
        self._held: dict[int, bytes] = {}
        self._gaps: list[_Gap] = []
        self._recovered = 0  # requested messages come back since the last request round
        self._round_at = float("inf")
        self._heard_at = float("-inf")  # the last DELIVER: the probe waits for silence
        self._probe_at = now  # with ``start`` the first tick asks for history at once
        # The last tail REQUEST (probe or chase) and its span. Once half of it has come
        # back the broker has more history than we have seen: the next one goes at once,
        # up to twice as long, so a replay keeps a REQUEST in flight instead of waiting a
        # second of silence per probe.
        self._tail = (0, -1)
        self._tail_span = PROBE_SPAN
        self._chased = True  # the last tail REQUEST's successor is asked (or never will be)
        self._tail_limit = request_limit  # lowered when the broker cuts a tail REQUEST short
        self._keepalive_at = now
        self._journal: dict[int, bytes] = {}
        self._journal_order: deque[int] = deque()
        self._next_id = 0
        self._pending: OrderedDict[int, _Pending] = OrderedDict()  # oldest send first
        self._by_data: dict[bytes, deque[int]] = {}
        self._events: deque[Delivered | Lost | Confirmed] = deque()
        self._out: list[tuple[bytes, Address]] = []

    # --- what the shell reads ---------------------------------------------------------------

    def datagrams_to_send(self) -> list[tuple[bytes, Address]]:
        out, self._out = self._out, []
        return out

    def next_event(self) -> Delivered | Lost | Confirmed | None:
        return self._events.popleft() if self._events else None

    @property
    def held(self) -> int:
        return len(self._held)

    @property
    def gaps(self) -> list[tuple[int, int]]:
        """The missing ranges now (inclusive), oldest first."""
        return [(g.start, g.end) for g in self._gaps]

    @property
    def in_flight(self) -> int:
        """Publishes not confirmed yet."""
        return len(self._pending)

    def keepalive(self, flags: wire.Flags | None = None) -> bytes:
        """This client's KEEPALIVE (``flags`` None: the ones its settings say)."""
        if flags is None:
            flags = wire.NO_FLAGS
            if not self.subscribe:
                flags |= wire.Flags.NOSUBSCRIBE
            if not self.journal_messages:
                flags |= wire.Flags.NOJOURNAL
        addr, port = self.advertise
        return wire.encode(wire.Keepalive(addr, port, flags, self.token))

    def goodbye(self) -> None:
        """Queue a NOSUBSCRIBE KEEPALIVE: the broker stops sending now, not in 5 s."""
        self._out.append(
            (self.keepalive(wire.Flags.NOSUBSCRIBE | wire.Flags.NOJOURNAL), self.broker)
        )

    # --- timers -----------------------------------------------------------------------------

    def next_tick(self) -> float:
        """When :meth:`tick` has something to do next (the clock of ``now``)."""
        at = min(self._keepalive_at, self._round_at)
        if self._gaps:
            at = min(at, self._gaps[0].since + self.gap_seconds)
        if self.next is not None and self.subscribe:
            at = min(at, max(self._probe_at, self._heard_at + self.probe_after))
        if self._pending:
            at = min(at, next(iter(self._pending.values())).sent_at + self.publish_timeout)
        return at

    def tick(self, now: float) -> None:
        if now >= self._keepalive_at:
            self._out.append((self.keepalive(), self.broker))
            self.stats.keepalives += 1
            self._keepalive_at = now + self.keepalive_interval
        self._expire(now)
        if now >= self._round_at:
            self._request_round(now)
        if (
            self.next is not None
            and self.subscribe
            and now >= max(self._probe_at, self._heard_at + self.probe_after)
        ):
            low, high = self._tail
            if not self._chased and low + PROBE_SPAN <= self.top < high:
                # The chase stalled part way: the broker's request_limit is below ours (or
                # the stream ended there). Asking no more than it gave keeps the chase going.
                self._tail_limit = self.top - low + 1
            self._ask_tail(self.top + 1, PROBE_SPAN)
            self.stats.probes += 1
            self._probe_at = now + self.probe_after
        self._resend(now)

    def _expire(self, now: float) -> None:
        gaps = self._gaps
        # Gaps appear in sequence order, so the first is the oldest: give up from the front.
        while gaps and (
            gaps[0].since + self.gap_seconds <= now or len(self._held) > self.hold_limit
        ):
            self._give_up(gaps[0])

    def _give_up(self, gap: _Gap) -> None:
        assert self.next == gap.start and self._gaps[0] is gap
        del self._gaps[0]
        self._events.append(Lost(gap.start, gap.end))
        self.lost.append((gap.start, gap.end))
        self.stats.lost += gap.end - gap.start + 1
        self.next = gap.end + 1
        self._drain()

    def _request_round(self, now: float) -> None:
        budget = self.request_budget
        soonest = float("inf")
        self._recovered = 0
        for gap in self._gaps:
            if budget > 0:
                if gap.due <= now:
                    low = gap.start
                    gap.due = now + self.request_interval
                elif gap.requested:  # asked in part, the budget spent: the rest need not wait
                    low = max(gap.start, gap.asked_to + 1)
                    if low <= gap.end:  # answers are coming: ask its start again only later
                        gap.due = now + self.request_interval
                else:  # new: it waits request_delay, for reordered datagrams to fill it
                    low = gap.end + 1
                while low <= gap.end and budget > 0:
                    high = min(gap.end, low + min(self.request_limit, budget) - 1)
                    self._request(low, high)
                    budget -= high - low + 1
                    gap.asked_to = high
                    gap.requested = True
                    low = high + 1
            soonest = min(soonest, gap.due)
        # Out of budget with gaps still due: the rest waits a whole interval, not a spin.
        spacing = self.request_interval if budget <= 0 else ROUND_SPACING
        self._round_at = max(soonest, now + spacing) if self._gaps else float("inf")

    def _ask_tail(self, low: int, span: int) -> None:
        if low > wire.MAX_SEQUENCE:
            return
        high = min(low + span - 1, wire.MAX_SEQUENCE)
        self._request(low, high)
        self._tail = (low, high)
        self._tail_span = span
        self._chased = False

    def _chase(self, seq: int) -> None:
        """``seq`` arrived: if it answers the upper half of the last tail REQUEST, ask for
        the range after it now (the broker cuts each REQUEST at its request_limit)."""
        low, high = self._tail
        if seq > high:
            self._chased = True  # the live stream is past it: gaps ask for the rest
        elif seq >= low + self._tail_span // 2:
            self._chased = True
            self._ask_tail(high + 1, min(2 * self._tail_span, self._tail_limit))

    def _request(self, low: int, high: int) -> None:
        addr, port = self.advertise
        self._out.append((wire.encode(wire.Request(addr, port, low, high)), self.broker))
        self.stats.requests += 1
        self.stats.requested += high - low + 1

    # --- datagrams in -----------------------------------------------------------------------

    def receive(self, data: bytes, source: Address, now: float) -> None:
        """One datagram from ``source``; a bad one is counted and dropped (UDP: no answer)."""
        try:
            d = wire.decode(data)
        except FyrehoseProtocolError:
            self.stats.malformed += 1
            return
        if isinstance(d, wire.Deliver):
            self._deliver(d.seq, d.data, now)
        elif isinstance(d, wire.KeepaliveAck) and d.token == self.token:
            self.stats.acks += 1
        elif isinstance(d, wire.Forward):
            self._forward(d)
        else:
            self.stats.unexpected += 1

    def _deliver(self, seq: int, data: bytes, now: float) -> None:
        self._heard_at = now
        if not self.subscribe:
            self.stats.unexpected += 1
            return
        if self.next is None:
            self.next = seq  # the stream starts where we came in
            self.top = seq - 1
        if seq < self.next:
            if self.start is not None and seq < self.start:
                self.stats.ignored += 1
            else:
                self.stats.duplicates += 1
            return
        if seq in self._held:
            self.stats.duplicates += 1
            return
        if not self._chased:
            self._chase(seq)
        if seq > self.top:
            if seq > self.top + 1:
                gap = _Gap(self.top + 1, seq - 1, now, now + self.request_delay)
                self._gaps.append(gap)
                self._round_at = min(self._round_at, gap.due)
            self.top = seq
        else:
            self._fill(seq)
            # Half a round's budget came back: the next round goes now, not after a whole
            # request_interval, so a large gap is recovered as fast as its answers come.
            if self._recovered >= self.request_budget // 2:
                self._round_at = min(self._round_at, now)
        self._held[seq] = data
        if seq == self.next:
            self._drain()
        elif len(self._held) > self.hold_limit:
            self._expire(now)

    def _fill(self, seq: int) -> None:
        """``seq`` arrived inside a gap: take it out (the invariant says one holds it)."""
        gaps = self._gaps
        i = bisect.bisect_right(gaps, seq, key=lambda g: g.start) - 1
        gap = gaps[i]
        assert gap.start <= seq <= gap.end, (seq, gap)
        if gap.requested:
            self.stats.recovered += 1
            self._recovered += 1
        else:
            self.stats.reordered += 1
        if gap.start == gap.end:
            del gaps[i]
        elif seq == gap.start:
            gap.start += 1
        elif seq == gap.end:
            gap.end -= 1
        else:
            after = _Gap(seq + 1, gap.end, gap.since, gap.due, gap.requested, gap.asked_to)
            gap.end = seq - 1
            gaps.insert(i + 1, after)
        if not gaps:
            self._round_at = float("inf")

    def _drain(self) -> None:
        held = self._held
        seq = self.next
        assert seq is not None
        while (data := held.pop(seq, None)) is not None:
            self._events.append(Delivered(seq, data))
            self.stats.delivered += 1
            self._journal_add(seq, data)
            self._confirm(seq, data)
            seq += 1
        self.next = seq

    # --- the journal ------------------------------------------------------------------------

    def _journal_add(self, seq: int, data: bytes) -> None:
        if not self.journal_messages:
            return
        self._journal[seq] = data
        self._journal_order.append(seq)
        if len(self._journal_order) > self.journal_messages:
            del self._journal[self._journal_order.popleft()]

    def _forward(self, f: wire.Forward) -> None:
        self.stats.forwards += 1
        if not self.journal_messages or f.addr == "0.0.0.0" or f.port == 0:
            # NOJOURNAL was sent, so the broker should not ask; and no address, no answer.
            self.stats.unexpected += 1
            return
        to = (f.addr, f.port)
        journal = self._journal
        sent = 0
        for seq in range(f.from_seq, min(f.to_seq, f.from_seq + self.request_limit - 1) + 1):
            if (data := journal.get(seq)) is not None:
                self._out.append((wire.encode(wire.Deliver(seq, data)), to))
                sent += 1
        if sent:
            self.stats.forwards_answered += 1
            self.stats.forwarded_messages += sent

    # --- publishing -------------------------------------------------------------------------

    def publish(self, data: bytes, now: float) -> int:
        """Queue a PUSH of ``data``; its publish id (see :class:`Confirmed`)."""
        if len(data) > wire.MAX_DATA:
            raise ValueError(f"{len(data)} bytes of data are over the limit of {wire.MAX_DATA}")
        publish_id = self._next_id
        self._next_id += 1
        datagram = wire.encode(wire.Push(data))
        self._out.append((datagram, self.broker))
        self.stats.published += 1
        if not self.subscribe:
            self._events.append(Confirmed(publish_id, None))
            self.stats.confirmed += 1
            return publish_id
        self._pending[publish_id] = _Pending(publish_id, data, datagram, now)
        self._by_data.setdefault(data, deque()).append(publish_id)
        return publish_id

    def _confirm(self, seq: int, data: bytes) -> None:
        ids = self._by_data.get(data)
        if ids is None:
            return
        publish_id = ids.popleft()
        if not ids:
            del self._by_data[data]
        del self._pending[publish_id]
        self._events.append(Confirmed(publish_id, seq))
        self.stats.confirmed += 1

    def _resend(self, now: float) -> None:
        pending = self._pending
        while pending:
            first = next(iter(pending.values()))
            if first.sent_at + self.publish_timeout > now:
                break
            self._out.append((first.datagram, self.broker))
            first.sent_at = now
            pending.move_to_end(first.publish_id)
            self.stats.resent += 1
