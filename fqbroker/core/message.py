"""Message and hop-list value types (fq_msg.c).

A message carries the exchange and route it was published on, a 16-byte opaque id, the
sender's name, its hops (IPv4 addresses, 4 raw bytes each, nearest broker first) and the
payload. Everything is ``bytes`` because that is what the wire carries; names become text
only at the edges (stats, logs). How a message is laid out in a frame is
:mod:`fqbroker.core.frames`'s business; a message builds its frames through it.
"""

from __future__ import annotations

import ipaddress
import itertools
import struct

from fqbroker.core.frames import (
    MAX_HOPS,
    PEER_OVERHEAD,
    PUBLISH_OVERHEAD,
    encode_peer,
    encode_publish,
    peer_fields,
)

__all__ = [
    "ZERO_MSGID",
    "Message",
    "MsgIdCounter",
    "Run",
    "accept_from_peer",
    "has_hop",
    "hop_addresses",
    "ipv4_bytes",
    "message_from_frame",
    "runs_of",
]

ZERO_MSGID = bytes(16)
_LE4 = struct.Struct("<IIII")


def ipv4_bytes(address: str) -> bytes:
    """The 4 network-order bytes of an IPv4 address; 0.0.0.0 for anything else."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return bytes(4)
    if isinstance(ip, ipaddress.IPv6Address):
        ip = ip.ipv4_mapped or ipaddress.IPv4Address(0)
    return ip.packed


def hop_addresses(hops: bytes) -> list[str]:
    """Dotted-quad form of a raw hop list, for JSON and logs."""
    return [str(ipaddress.IPv4Address(hops[i : i + 4])) for i in range(0, len(hops), 4)]


def has_hop(hops: bytes, hop: bytes) -> bool:
    return any(hops[i : i + 4] == hop for i in range(0, len(hops), 4))


def accept_from_peer(msg: Message, node_id: bytes) -> bool:
    """Drop a message that already passed through us; else put us first in its hops
    (docs/fq-protocol.md §5.2).

    fqd never compares the first hop it receives; we compare them all, which only differs
    when two brokers share a node id, and then refusing the message is the safe answer.
    """
    if has_hop(msg.hops, node_id):
        return False
    msg.stamp(msg.sender, (node_id + msg.hops)[: 4 * MAX_HOPS])
    return True


class Message:
    """One fq message. Mutable only while a broker stamps sender and hops on arrival."""

    __slots__ = ("_frame", "exchange", "hops", "msgid", "payload", "route", "sender")

    def __init__(
        self,
        exchange: bytes,
        route: bytes,
        payload: bytes,
        msgid: bytes = ZERO_MSGID,
        sender: bytes = b"",
        hops: bytes = b"",
    ) -> None:
        self.exchange = exchange
        self.route = route
        self.payload = payload
        self.msgid = msgid
        self.sender = sender
        self.hops = hops
        self._frame: bytes | None = None

    def peer_frame(self) -> bytes:
        """The peer-format frame every consumer receives (docs/fq-protocol.md §1.10), built
        once per message.

        A message fanned out to many queues is encoded once, not once per consumer.
        """
        frame = self._frame
        if frame is None:
            frame = self._frame = encode_peer(
                self.exchange, self.route, self.msgid, self.sender, self.hops, self.payload
            )
        return frame

    def preset_frame(self, frame: bytes) -> None:
        """Give the peer frame a reader already holds (a disk record), to save building it."""
        self._frame = frame

    def publish_frame(self) -> bytes:
        """The publisher-format frame a client sends on a plain data channel
        (docs/fq-protocol.md §1.10)."""
        return encode_publish(self.exchange, self.route, self.msgid, self.payload)

    def stamp(self, sender: bytes, hops: bytes) -> None:
        self.sender = sender
        self.hops = hops
        self._frame = None

    @property
    def publish_octets(self) -> int:
        """Wire size in publisher format: what ``octets_in`` counts for a data client."""
        return PUBLISH_OVERHEAD + len(self.exchange) + len(self.route) + len(self.payload)

    @property
    def peer_octets(self) -> int:
        """Wire size in peer format: what ``octets_out`` counts."""
        return (
            PEER_OVERHEAD
            + len(self.exchange)
            + len(self.route)
            + len(self.sender)
            + len(self.hops)
            + len(self.payload)
        )

    def __repr__(self) -> str:
        return (
            f"Message(exchange={self.exchange!r}, route={self.route!r}, "
            f"sender={self.sender!r}, hops={hop_addresses(self.hops)}, "
            f"payload={self.payload[:32]!r}{'...' if len(self.payload) > 32 else ''})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return (
            self.exchange == other.exchange
            and self.route == other.route
            and self.payload == other.payload
            and self.msgid == other.msgid
            and self.sender == other.sender
            and self.hops == other.hops
        )

    __hash__ = None  # type: ignore[assignment]


# Consecutive messages on one exchange and route, as peer frames, and the size of their
# heads (all of a frame but its payload, the same for each): the unit the data path routes
# in. A publisher sending on one route routes once per read, not once per message.
Run = tuple[bytes, bytes, list[bytes], int]


def message_from_frame(frame: bytes) -> Message:
    """The :class:`Message` of a whole peer frame (for rule programs and peers)."""
    msg = Message(*peer_fields(frame))
    msg._frame = frame
    return msg


def runs_of(msgs: list[Message]) -> list[Run]:
    """Messages (from a peer, say) as the runs the router publishes."""
    runs: list[Run] = []
    last: Run | None = None
    for msg in msgs:
        frame = msg.peer_frame()
        head = len(frame) - len(msg.payload)
        if last and last[3] == head and last[1] == msg.route and last[0] == msg.exchange:
            last[2].append(frame)
        else:
            last = (msg.exchange, msg.route, [frame], head)
            runs.append(last)
    return runs


class MsgIdCounter:
    """A process-wide 128-bit id counter laid out like libfq's (docs/fq-protocol.md §1.11).

    libfq keeps four u32s in host byte order and carries from the first into the next; on
    x86 the first id is ``01000000 00000000 ...``. We always write little-endian so the ids
    look the same as fqd's on the hardware fq runs on.
    """

    def __init__(self) -> None:
        self._count = itertools.count(1)

    def next(self) -> bytes:
        n = next(self._count)
        mask = 0xFFFFFFFF
        return _LE4.pack(n & mask, (n >> 32) & mask, (n >> 64) & mask, (n >> 96) & mask)
