"""The data-frame format of fq: one message on a data channel and in a queue (fq.h,
docs/fq-protocol.md §1.10, §1.11).

A broker stamps its sender and hops on each publisher frame as it arrives, which makes it
the peer frame that queues hold, disk records store and consumers receive. This module is
the one place that knows that layout, and holds the data path's decoding loops, the
broker's hottest code: each reads a whole buffer with local names and slices, and builds
nothing per message but what it returns. Value types: :mod:`fqbroker.core.message`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final, Protocol, TypeVar

from fqbroker.errors import FrameTooLarge

__all__ = [
    "ID_SIZE",
    "MAX_HOPS",
    "MAX_MESSAGE_SIZE",
    "MAX_RK_LEN",
    "PEER_OVERHEAD",
    "PUBLISH_OVERHEAD",
    "FieldReader",
    "encode_peer",
    "encode_publish",
    "frame_hops",
    "frame_length",
    "frame_seq",
    "peer_fields",
    "place_seq",
    "publish_head",
    "read_head",
    "scan_messages",
    "scan_runs",
    "split_run",
    "stamp",
]

MAX_RK_LEN: Final = 127  # exchange, route and sender (fq's user and queue names too)
MAX_HOPS: Final = 32  # FQ_MAX_HOPS: older hops fall off the end
MAX_MESSAGE_SIZE: Final = 1 << 28  # the largest payload a data channel takes by default
ID_SIZE: Final = 16
# Frame bytes besides the names, hops and payload: two (or four) u8 lengths, id, u32.
PUBLISH_OVERHEAD: Final = 22
PEER_OVERHEAD: Final = 24

_U32 = struct.Struct(">I")
_SEQ = struct.Struct(">Q")

_T = TypeVar("_T")
# (exchange, route, peer frames, head size): the shape of message.Run, spelled out here
# because the value types import this module, not the other way round.
_Run = tuple[bytes, bytes, list[bytes], int]


# --- building -----------------------------------------------------------------------------


def _name_pair(first: bytes, second: bytes, count: int = -1) -> bytes:
    """u8 length + first, u8 length (or ``count``) + second."""
    return b"".join(
        (bytes((len(first),)), first, bytes((len(second) if count < 0 else count,)), second)
    )


def stamp(sender: bytes, hops: bytes) -> bytes:
    """What a broker splices in after the id to make a publisher frame a peer frame."""
    return _name_pair(sender, hops, len(hops) // 4)


# (exchange, route) -> its frame head; (sender, hops) -> its stamp. Both repeat across
# messages, so each is built once (and the caches are emptied when names keep changing).
_heads: dict[tuple[bytes, bytes], bytes] = {}
_stamps: dict[tuple[bytes, bytes], bytes] = {}
# Bound once: encode_peer runs once per message a broker builds from fields, and these
# save it the lookups that its being a function of its own (not a method) costs.
_head_of = _heads.get
_stamp_of = _stamps.get
_pack_u32 = _U32.pack
_join = b"".join
# From this payload size on, a frame is joined from a view of the read rather than from
# slices of it: one copy of the payload instead of two, worth the view's cost.
_VIEW_FROM: Final = 1024


def _cached(
    cache: dict[tuple[bytes, bytes], bytes], key: tuple[bytes, bytes], value: bytes
) -> bytes:
    if len(cache) >= 4096:
        cache.clear()
    cache[key] = value
    return value


def encode_peer(
    exchange: bytes, route: bytes, msgid: bytes, sender: bytes, hops: bytes, payload: bytes
) -> bytes:
    """The peer frame of a message's fields."""
    head = _head_of((exchange, route))
    if head is None:
        head = _cached(_heads, (exchange, route), _name_pair(exchange, route))
    after_id = _stamp_of((sender, hops))
    if after_id is None:
        after_id = _cached(_stamps, (sender, hops), stamp(sender, hops))
    return b"".join((head, msgid, after_id, _pack_u32(len(payload)), payload))


def encode_publish(exchange: bytes, route: bytes, msgid: bytes, payload: bytes) -> bytes:
    """The publisher frame of a message's fields."""
    return b"".join(
        (
            bytes((len(exchange),)),
            exchange,
            bytes((len(route),)),
            route,
            msgid,
            _pack_u32(len(payload)),
            payload,
        )
    )


# --- reading whole frames -----------------------------------------------------------------


def _id_offset(frame: bytes) -> int:
    """Where the 16-byte message id starts in a peer (or publisher) frame."""
    return 2 + frame[0] + frame[1 + frame[0]]


def frame_length(data: bytes | bytearray, pos: int = 0, *, peer: bool = True) -> int:
    """The length the frame at ``pos`` says it has, read from its length fields.

    ``peer``: the peer format, with sender and hops; else the publisher format. Raises
    IndexError or struct.error when ``data`` is too short to say.
    """
    at = pos + 1 + data[pos]
    at += 1 + data[at] + ID_SIZE
    if peer:
        at += 1 + data[at]
        at += 1 + 4 * data[at]
    size: int = _U32.unpack_from(data, at)[0]
    return at + 4 + size - pos


def peer_fields(frame: bytes) -> tuple[bytes, bytes, bytes, bytes, bytes, bytes]:
    """(exchange, route, payload, id, sender, hops) of a whole peer frame, in the order
    :class:`~fqbroker.core.message.Message` takes them."""
    at = 1 + frame[0]
    exchange = frame[1:at]
    end = at + 1 + frame[at]
    route = frame[at + 1 : end]
    msgid = frame[end : end + ID_SIZE]
    at = end + ID_SIZE
    end = at + 1 + frame[at]
    sender = frame[at + 1 : end]
    at = end + 1 + 4 * frame[end]
    return exchange, route, frame[at + 4 :], msgid, sender, frame[end + 1 : at]


def frame_hops(frame: bytes) -> bytes:
    """The raw hop list of a peer frame."""
    at = _id_offset(frame) + ID_SIZE
    at += 1 + frame[at]
    return frame[at + 1 : at + 1 + 4 * frame[at]]


def place_seq(frame: bytes, seq: int) -> bytes:
    """``frame`` with ``seq`` in bytes 8-15 of its message id (a disk queue's position)."""
    at = _id_offset(frame) + 8
    return frame[:at] + _SEQ.pack(seq) + frame[at + 8 :]


def frame_seq(frame: bytes) -> int:
    """The position :func:`place_seq` put in ``frame``."""
    seq: int = _SEQ.unpack_from(frame, _id_offset(frame) + 8)[0]
    return seq


def publish_head(data: bytes | bytearray, pos: int) -> tuple[bytes, bytes, int, int]:
    """(exchange, route, where the id ends, payload length) of the publisher frame at
    ``pos``, whose head (all of it but the payload) must be in ``data``."""
    p = pos + 1 + data[pos]  # route length
    after_id = p + 1 + data[p] + ID_SIZE
    exchange, route = bytes(data[pos + 1 : p]), bytes(data[p + 1 : after_id - ID_SIZE])
    size: int = _U32.unpack_from(data, after_id)[0]
    return exchange, route, after_id, size


# --- decoding a stream --------------------------------------------------------------------


class FieldReader(Protocol):
    """What :func:`read_head` reads with: a buffer that raises when it runs out."""

    def u8(self) -> int: ...

    def u32(self) -> int: ...

    def take(self, n: int) -> bytes: ...


def read_head(buf: FieldReader, peer: bool) -> tuple[bytes, bytes, bytes, bytes, bytes, int]:
    """(exchange, route, id, sender, hops, payload length): a frame's fields up to its
    payload, each length checked against its limit before its bytes are read.

    Raises :class:`~fqbroker.errors.FrameTooLarge` naming the field; running out of bytes
    is the reader's to signal (the caller rolls back and waits for more).
    """
    n = buf.u8()
    if n > MAX_RK_LEN:
        raise FrameTooLarge("exchange", n, MAX_RK_LEN)
    exchange = buf.take(n)
    n = buf.u8()
    if n > MAX_RK_LEN:
        raise FrameTooLarge("route", n, MAX_RK_LEN)
    route = buf.take(n)
    msgid = buf.take(ID_SIZE)
    sender = hops = b""
    if peer:
        n = buf.u8()
        if n > MAX_RK_LEN:
            raise FrameTooLarge("sender", n, MAX_RK_LEN)
        sender = buf.take(n)
        n = buf.u8()
        if n > MAX_HOPS:
            raise FrameTooLarge("hops", n, MAX_HOPS)
        hops = buf.take(4 * n)
    return exchange, route, msgid, sender, hops, buf.u32()


def scan_runs(
    data: bytes,
    out: list[_Run],
    after_id: bytes,
    names: dict[bytes, tuple[bytes, bytes]],
    max_payload: int,
    pos: int = 0,
) -> int:
    """Append the whole publisher frames of ``data`` from ``pos`` on to ``out`` as runs of
    peer frames, ``after_id`` (a :func:`stamp`) spliced into each; returns where it stopped.

    It stops at the first frame that is not whole or not ordinary (a name over its limit,
    a payload over ``max_payload``): the caller's careful reader takes it from there.
    ``names`` maps each frame head (u8 + exchange + u8 + route) to its two names, so
    every message on a route shares one copy of them.
    """
    # Indexing, slicing and comparing bytes are mypyc primitives, and a length read from
    # four of its bytes costs no call: struct's unpack_from and a try around the loop for
    # its error took half the time of a compiled read of small frames (bench/RESULTS.md,
    # latency at 10k msg/s). startswith is not one: a generic method call with its
    # arguments parsed, it was half of this loop's time (bench/RESULTS.md, figures behind
    # comments), so the run's head is compared as a slice.
    extra = ID_SIZE + len(after_id) + 4  # what a frame's head has past exchange and route
    n = len(data)
    head = b""  # u8 + exchange + u8 + route of the run being filled
    size_of_head = 0
    to_length = 0  # from a frame's start to its payload length: head and id
    frames: list[bytes] = []
    view: memoryview | None = None
    while pos < n:
        if size_of_head and data[pos : pos + size_of_head] == head:
            q = pos + to_length
        else:
            size = data[pos]
            p = pos + 1 + size  # route length
            if size > MAX_RK_LEN or p >= n or data[p] > MAX_RK_LEN:
                break
            q = p + 1 + data[p]
            head = data[pos:q]
            size_of_head = q - pos
            pair = names.get(head)
            if pair is None:
                # One copy of each name however many messages and queues hold it.
                pair = names[head] = (data[pos + 1 : p], data[p + 1 : q])
            frames = []
            out.append((pair[0], pair[1], frames, q - pos + extra))
            q += ID_SIZE
            to_length = q - pos
        if q + 4 > n:
            break  # a frame whose length field has not all arrived
        size = (data[q] << 24) | (data[q + 1] << 16) | (data[q + 2] << 8) | data[q + 3]
        end = q + 4 + size
        if size > max_payload or end > n:
            break
        if size < _VIEW_FROM:
            frames.append(data[pos:q] + after_id + data[q:end])
        else:
            # A large payload is copied once, into its frame, not sliced out first.
            if view is None:
                view = memoryview(data)
            frames.append(_join((data[pos:q], after_id, view[q:end])))
        pos = end
    if view is not None:
        view.release()
    if out and not out[-1][2]:
        out.pop()  # a run opened for a frame that is not whole
    return pos


def split_run(
    first: bytes | bytearray,
    pos: int,
    second: bytes,
    need: int,
    after_id: bytes,
    names: dict[bytes, tuple[bytes, bytes]],
    max_payload: int,
) -> _Run | None:
    """The run of the one publisher frame that starts at ``first[pos:]`` and ends with
    ``second[:need]``, made as :func:`scan_runs` would make it from the two joined, with
    one copy of each part instead of two. None if its head is not all in ``first`` or it
    is not ordinary: then join them and let :func:`scan_runs` (or the careful reader)
    have it."""
    size = first[pos]
    p = pos + 1 + size  # route length
    if size > MAX_RK_LEN or p >= len(first) or first[p] > MAX_RK_LEN:
        return None
    q = p + 1 + first[p]
    at = q + ID_SIZE  # the payload length
    if at + 4 > len(first) or _U32.unpack_from(first, at)[0] > max_payload:
        return None
    head = bytes(first[pos:q])
    pair = names.get(head)
    if pair is None:
        pair = names[head] = (head[1 : p - pos], head[p - pos + 1 :])
    with memoryview(first) as start, memoryview(second) as rest:
        frame = _join((start[pos:at], after_id, start[at:], rest[:need]))
    return pair[0], pair[1], [frame], q - pos + ID_SIZE + len(after_id) + 4


def scan_messages(
    data: bytes,
    out: list[_T],
    make: Callable[[bytes, bytes, bytes, bytes, bytes, bytes], _T],
    peer: bool,
    names: dict[bytes, bytes],
    max_payload: int,
) -> int:
    """Append ``make(exchange, route, payload, id, sender, hops)`` of each whole frame at
    the start of ``data`` to ``out``; returns the bytes read. Stops as :func:`scan_runs`.

    ``peer`` selects the format; ``names`` interns exchange and route names.
    """
    sender = hops = b""  # publisher format has none
    intern = names.setdefault
    append = out.append
    unpack = _U32.unpack_from
    n = len(data)
    pos = 0
    while pos < n:
        size = data[pos]
        p = pos + 1 + size  # route length
        if size > MAX_RK_LEN or p >= n:
            break
        size = data[p]
        q = p + 1 + size  # message id
        if size > MAX_RK_LEN:
            break
        exchange = data[pos + 1 : p]
        route = data[p + 1 : q]
        msgid = q
        q += 16
        if peer:
            if q >= n or data[q] > MAX_RK_LEN:
                break
            s = q + 1 + data[q]  # hop count
            if s >= n or data[s] > MAX_HOPS:
                break
            sender = data[q + 1 : s]
            q = s + 1 + 4 * data[s]
            hops = data[s + 1 : q]
        if q + 4 > n:
            break
        size = unpack(data, q)[0]
        end = q + 4 + size
        if size > max_payload or end > n:
            break
        append(
            make(
                intern(exchange, exchange),
                intern(route, route),
                data[q + 4 : end],
                data[msgid : msgid + 16],
                sender,
                hops,
            )
        )
        pos = end
    return pos
