"""The Lumberjack protocol (Elastic Beats, logstash-forwarder), reader side, sans I/O.

A :class:`Receiver` is fed the bytes a shipper writes and hands back what they mean: a
window, a run of events, or a final :class:`Violation`; :func:`encode_ack` writes the one
frame a reader sends, ``A``. Its decisions are docs/lumberjack.md's "Wire format", each
given with its reason in :class:`Receiver`'s docstring.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections import deque
from dataclasses import dataclass
from typing import cast

__all__ = [
    "Event",
    "Events",
    "Limits",
    "Receiver",
    "Violation",
    "Window",
    "encode_ack",
]

_U32 = struct.Struct(">I")
_U32X2 = struct.Struct(">II")
_u32_from = _U32.unpack_from
_u32x2_from = _U32X2.unpack_from

# Frame bytes as ints, for comparing with bytearray items.
_V1 = 0x31  # '1'
_V2 = 0x32  # '2'
_W = 0x57
_D = 0x44
_J = 0x4A
_C = 0x43
_A = 0x41

_HEADER = 2
# Events after which a run is answered at the end of a C frame, the rest next call.
_RUN = 4096
_DATA_OF = {_V1: _D, _V2: _J}  # the data frame type each version carries


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-connection bounds; exceeding one is a :class:`Violation`."""

    max_window: int = 0xFFFFFFFF  # a W larger than this (the default: any u32)
    max_frame: int = 16 << 20  # a J payload, a whole D frame or a C frame's compressed bytes
    max_decompressed: int = 64 << 20  # bytes inflated out of one C frame, nested ones included
    max_fields: int = 1024  # pairs in one D frame
    max_nesting: int = 4  # C frames one inside another, the outermost included


@dataclass(frozen=True, slots=True)
class Window:
    """A ``W`` frame: ``size`` events follow. ``version`` is 1 or 2."""

    version: int
    size: int


@dataclass(frozen=True, slots=True)
class Event:
    """One data frame.

    ``payload`` is the JSON object's bytes: for v2 as received, for v1 the ``D`` pairs
    re-encoded as a JSON object. ``fields`` is v1's pairs, ``None`` for v2.
    """

    seq: int
    payload: bytes
    fields: dict[str, str] | None


@dataclass(frozen=True, slots=True)
class Events:
    """Whole data frames decoded so far, in order, all of one ``version``."""

    version: int
    events: list[Event]


@dataclass(frozen=True, slots=True)
class Violation:
    """Malformed input or a limit exceeded; the connection must be closed."""

    reason: str


# Building a frozen dataclass through its __init__ costs an object.__setattr__ per field;
# the decoder makes one Event per event, so it fills the slots through their descriptors.
_new_event = Event.__new__
_set_seq = Event.__dict__["seq"].__set__
_set_payload = Event.__dict__["payload"].__set__
_set_fields = Event.__dict__["fields"].__set__


def _event(seq: int, payload: bytes, fields: dict[str, str] | None) -> Event:
    e = _new_event(Event)
    _set_seq(e, seq)
    _set_payload(e, payload)
    _set_fields(e, fields)
    return e


def _byte_name(b: int) -> str:
    return f"0x{b:02x} ({chr(b)!r})" if 0x20 <= b < 0x7F else f"0x{b:02x}"


class _Bad(Exception):
    """Raised inside decoding with the Violation's reason."""


def _check_header(version: int, kind: int) -> None:
    """Raise _Bad for an unknown version or a type this version does not send."""
    if version != _V1 and version != _V2:
        raise _Bad(f"unknown protocol version byte {_byte_name(version)}")
    if kind in (_W, _C) or kind == _DATA_OF[version]:
        return
    if kind == _A:
        raise _Bad(f"ACK frame {_byte_name(kind)} from a writer (only readers send ACKs)")
    if kind in (_D, _J):
        raise _Bad(f"frame type {_byte_name(kind)} is not a version-{version - 0x30} frame")
    raise _Bad(f"unknown frame type {_byte_name(kind)} (version {version - 0x30})")


def _d_string(
    buf: bytes | bytearray, p: int, end: int, start: int, max_frame: int
) -> tuple[str, int]:
    """One length-prefixed string at ``p`` of the D frame at ``start``, up to ``max_frame``."""
    if p + 4 > end:
        raise IndexError
    n = _u32_from(buf, p)[0]
    p += 4
    if p + n - start > max_frame:
        raise _Bad(f"D frame longer than {max_frame} bytes (the frame limit)")
    if p + n > end:
        raise IndexError
    return bytes(buf[p : p + n]).decode("utf-8", "replace"), p + n


def _decode_d(buf: bytes | bytearray, pos: int, end: int, limits: Limits) -> tuple[Event, int]:
    """Decode a D frame whose 2-byte header is at ``pos``.

    Returns the event and the position after it; raises IndexError when the frame runs past
    ``end`` (more bytes needed, or a cut-short frame inside a C) and _Bad on a limit.
    """
    start = pos
    p = pos + _HEADER
    if p + 8 > end:
        raise IndexError
    seq, count = _u32x2_from(buf, p)
    if count > limits.max_fields:
        raise _Bad(f"D frame with {count} fields (limit {limits.max_fields})")
    p += 8
    fields: dict[str, str] = {}
    max_frame = limits.max_frame
    for _ in range(count):
        key, p = _d_string(buf, p, end, start, max_frame)
        fields[key], p = _d_string(buf, p, end, start, max_frame)
    payload = json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode()
    return _event(seq, payload, fields), p


class _PartialD:
    """Where the decode of a D frame that has not wholly arrived stopped."""

    __slots__ = ("fields", "key", "left", "offset", "seq")

    def __init__(self, seq: int, strings: int) -> None:
        self.seq = seq
        self.left = strings  # keys and values still to read
        self.offset = 10  # from the frame's start: it moves in the buffer, not in the frame
        self.fields: dict[str, str] = {}
        self.key = ""


class Receiver:
    """Decodes a shipper's byte stream into windows and events.

    Fed the bytes a shipper writes (:meth:`receive_data`), it hands back, one at a time
    (:meth:`next_event`), what they mean:

    - :class:`Window` for each ``W`` frame: the shipper is about to send that many events;
    - :class:`Events` for every whole data frame decoded since the previous answer (``D`` in
      version 1, ``J`` in version 2, whether plain or inside a ``C`` frame), in wire order, all of
      one version (a run of frames is cut where the version changes, and before each ``W``, so
      the shell can tie a ``W`` to the events that follow it; and after a ``C`` frame once it
      holds 4,096 events, so what a read's compressed frames inflate to comes in parts);
    - :class:`Violation` when the input breaks the protocol or one of the :class:`Limits`; it is
      final: the receiver answers it again on every later call and ignores further input, and
      the shell logs it, counts it and closes the connection;
    - ``None`` when it needs more bytes.

    Any split of the input gives the same answers: a frame that has not wholly arrived is left
    in the buffer untouched.

    Decisions (docs/lumberjack.md, "Wire format"):

    - ``D`` is a version-1 frame and ``J`` a version-2 frame; ``1J`` or ``2D`` is a Violation,
      as is any version byte other than ``'1'``/``'2'`` and any type other than ``W D J C``
      (``A`` included: only a reader sends it). The Violation names the byte.
    - A ``C`` frame holds zlib (RFC 1950) of whole frames of its own version: data frames,
      and, as the protocol text allows though no known shipper sends them, ``W`` frames (a
      new window, answered in order with the events around it) and ``C`` frames, at most
      ``max_nesting`` deep. A frame cut short, bytes after the zlib stream, another version
      or an ``A`` inside is a Violation.
    - A ``J`` payload is kept as the bytes received and not parsed here: parsing costs more than
      the rest of the decode, and only a route template that reads fields needs it
      (:mod:`fqbroker.frontends.lumberjack.mapping`). A payload that is not a JSON object is
      still published; its route falls back to the template's constant.
    - ``D`` strings are UTF-8; undecodable bytes become U+FFFD, as Logstash does, rather than
      closing the connection of a shipper that tails a file with a stray Latin-1 line.
    - Limits are checked on the length fields, before the bytes they announce are waited for:
      ``max_window`` on ``W``; ``max_frame`` on a ``J`` payload, a ``C`` frame's compressed
      length and a whole ``D`` frame; ``max_fields`` on a ``D`` frame's pair count. Inflating is
      bounded (``decompressobj().decompress(data, max_length)``), so a zip bomb stops at
      ``max_decompressed`` bytes, counted over a ``C`` frame and every one nested in it
      (each inflated layer is in memory while the next inflates).
    """

    __slots__ = ("_buf", "_d", "_left", "_limits", "_pending", "_pos", "_violation")

    def __init__(self, limits: Limits = Limits()) -> None:
        self._limits = limits
        self._buf = bytearray()
        self._pos = 0
        self._violation: Violation | None = None
        self._d: _PartialD | None = None
        # Answers out of a C frame that held a W, after the first: they come before
        # anything the buffer holds.
        self._pending: deque[Window | Events] = deque()
        self._left = 0  # what a C frame and those nested in it may still inflate to

    @property
    def buffered(self) -> int:
        """Bytes received and not yet decoded (a partial frame), for the memory budget."""
        return len(self._buf) - self._pos

    @property
    def in_flight(self) -> int:
        """What the partial frame will take once whole, from its length field when that
        has arrived (a J or C frame's; a D frame has none): what the shell reserves before
        more of it is read. Within ``max_frame``, which the frame is checked against first."""
        buf, pos = self._buf, self._pos
        have = len(buf) - pos
        if have < 6 or self._violation is not None:
            return have
        kind = buf[pos + 1]
        n: int
        if kind == _C:
            n = 6 + _u32_from(buf, pos + 2)[0]
        elif kind == _J and have >= 10:
            n = 10 + _u32x2_from(buf, pos + 2)[1]
        else:
            return have
        return max(have, min(n, 10 + self._limits.max_frame))

    def receive_data(self, data: bytes) -> None:
        if self._violation is not None:
            return
        if self._pos:
            # Drop what was decoded only when new bytes come: a byte-at-a-time feed then
            # moves the tail once per call, not once per frame.
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def next_event(self) -> Window | Events | Violation | None:
        if self._violation is not None:
            return self._violation
        if self._pending:
            return self._pending.popleft()
        events: list[Event] = []
        version = 0
        try:
            while True:
                buf = self._buf
                pos = self._pos
                end = len(buf)
                if end - pos < _HEADER:
                    break
                v = buf[pos]
                kind = buf[pos + 1]
                _check_header(v, kind)
                if kind == _W:
                    if events:
                        break  # the W belongs to the events after it
                    if end - pos < 6:
                        break
                    size = _u32_from(buf, pos + 2)[0]
                    if size > self._limits.max_window:
                        raise _Bad(f"window of {size} events (limit {self._limits.max_window})")
                    self._pos = pos + 6
                    return Window(v - 0x30, size)
                if events and v != version:
                    break  # one version per Events, so its ACK has one version byte
                version = v
                if kind == _J:
                    if end - pos < 10:
                        break
                    seq, n = _u32x2_from(buf, pos + 2)
                    if n > self._limits.max_frame:
                        raise _Bad(f"J frame of {n} bytes (limit {self._limits.max_frame})")
                    stop = pos + 10 + n
                    if stop > end:
                        break
                    events.append(_event(seq, bytes(buf[pos + 10 : stop]), None))
                    self._pos = stop
                elif kind == _D:
                    done = self._resume_d(buf, pos, end)
                    if done is None:
                        break
                    events.append(done[0])
                    self._pos = done[1]
                else:  # C
                    if end - pos < 6:
                        break
                    n = _u32_from(buf, pos + 2)[0]
                    if n > self._limits.max_frame:
                        raise _Bad(f"C frame of {n} bytes (limit {self._limits.max_frame})")
                    stop = pos + 6 + n
                    if stop > end:
                        break
                    self._left = self._limits.max_decompressed
                    inner, windows = self._inflate(v, memoryview(buf)[pos + 6 : stop], 1)
                    self._pos = stop
                    if not windows:
                        events += cast("list[Event]", inner)  # no W: events only
                        if len(events) >= _RUN:
                            break  # a read's C frames may inflate to far more than it
                        continue
                    answers = _answers(v - 0x30, inner)
                    first = answers[0]
                    if events and isinstance(first, Events):
                        events += first.events
                        del answers[0]
                    self._pending.extend(answers)
                    if events:
                        break
                    return self._pending.popleft()
        except _Bad as e:
            self._violation = Violation(str(e))
            self._buf = bytearray()
            self._pos = 0
            self._d = None
            if not events:
                return self._violation
            # The whole frames before the bad one are good: the shell may still publish
            # and acknowledge them before it closes; the Violation comes next call.
        if events:
            return Events(version - 0x30, events)
        return None

    def _resume_d(self, buf: bytearray, pos: int, end: int) -> tuple[Event, int] | None:
        """Decode the D frame at ``pos`` as far as the bytes go; the event and its end once
        whole, else None.

        A D frame arriving in pieces is decoded where the last attempt stopped, not from
        its start again: a shipper dripping a frame of many pairs costs each pair once.
        """
        d = self._d
        if d is None:
            if end - pos < 10:
                return None
            seq, count = _u32x2_from(buf, pos + 2)
            if count > self._limits.max_fields:
                raise _Bad(f"D frame with {count} fields (limit {self._limits.max_fields})")
            d = self._d = _PartialD(seq, 2 * count)
        max_frame = self._limits.max_frame
        p = pos + d.offset
        left = d.left
        fields = d.fields
        while left:
            if p + 4 > end:
                break
            n = _u32_from(buf, p)[0]
            if p + 4 + n - pos > max_frame:
                raise _Bad(f"D frame longer than {max_frame} bytes (the frame limit)")
            if p + 4 + n > end:
                break
            text = bytes(buf[p + 4 : p + 4 + n]).decode("utf-8", "replace")
            p += 4 + n
            if left & 1:
                fields[d.key] = text
            else:
                d.key = text
            left -= 1
        d.offset = p - pos
        d.left = left
        if left:
            return None
        self._d = None
        payload = json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode()
        return _event(d.seq, payload, fields), p

    def _inflate(
        self, version: int, data: memoryview, depth: int
    ) -> tuple[list[Event | Window], bool]:
        """The frames of one C frame's zlib stream (all or a _Bad), ``depth`` C frames
        deep, and whether a W is among them. What it inflates is taken off ``_left``: a
        C frame and those nested in it inflate to ``max_decompressed`` bytes in all."""
        limit = self._limits.max_decompressed
        left = self._left
        z = zlib.decompressobj()
        try:
            # One byte past the limit tells "exactly the limit" from "more".
            raw = z.decompress(data, left + 1)
        except zlib.error as e:
            raise _Bad(f"C frame is not a zlib stream: {e}") from None
        finally:
            data.release()
        if len(raw) > left:
            if depth == 1:
                raise _Bad(f"C frame inflates past {limit} bytes")
            raise _Bad(f"nested C frames inflate past {limit} bytes in all")
        if not z.eof:
            raise _Bad("C frame's zlib stream is cut short")
        if z.unused_data:
            raise _Bad(f"{len(z.unused_data)} bytes after the zlib stream in a C frame")
        self._left = left - len(raw)
        return self._decode_inner(version, raw, depth)

    def _decode_inner(
        self, version: int, raw: bytes, depth: int
    ) -> tuple[list[Event | Window], bool]:
        # The hot loop of Beats traffic: one pass over the inflated bytes, J frames read
        # with one unpack each and sliced out; D, W and nested C frames take the general
        # path.
        items: list[Event | Window] = []
        append = items.append
        windows = False
        limits = self._limits
        max_frame = limits.max_frame
        data_kind = _DATA_OF[version]
        pos = 0
        end = len(raw)
        while pos < end:
            if end - pos < _HEADER:
                raise _Bad("C frame ends inside a frame header")
            v = raw[pos]
            kind = raw[pos + 1]
            if v != version or kind != data_kind:
                _check_header(v, kind)
                if v != version:
                    raise _Bad(
                        f"version {v - 0x30} frame inside a version {version - 0x30} C frame"
                    )
            if kind == _J:
                if end - pos < 10:
                    raise _Bad("C frame ends inside a J frame")
                seq, n = _u32x2_from(raw, pos + 2)
                if n > max_frame:
                    raise _Bad(f"J frame of {n} bytes (limit {max_frame})")
                stop = pos + 10 + n
                if stop > end:
                    raise _Bad("C frame ends inside a J frame")
                e = _new_event(Event)
                _set_seq(e, seq)
                _set_payload(e, raw[pos + 10 : stop])
                _set_fields(e, None)
                append(e)
                pos = stop
            elif kind == _D:
                try:
                    event, pos = _decode_d(raw, pos, end, limits)
                except IndexError:
                    raise _Bad("C frame ends inside a D frame") from None
                append(event)
            elif kind == _W:
                if end - pos < 6:
                    raise _Bad("C frame ends inside a W frame")
                size = _u32_from(raw, pos + 2)[0]
                if size > limits.max_window:
                    raise _Bad(f"window of {size} events (limit {limits.max_window})")
                append(Window(version - 0x30, size))
                windows = True
                pos += 6
            else:  # C
                if depth >= limits.max_nesting:
                    raise _Bad(f"C frames nested more than {limits.max_nesting} deep")
                if end - pos < 6:
                    raise _Bad("C frame ends inside a C frame's header")
                n = _u32_from(raw, pos + 2)[0]
                if n > max_frame:
                    raise _Bad(f"C frame of {n} bytes (limit {max_frame})")
                stop = pos + 6 + n
                if stop > end:
                    raise _Bad("C frame ends inside a C frame")
                inner, more = self._inflate(version, memoryview(raw)[pos + 6 : stop], depth + 1)
                items += inner
                windows = windows or more
                pos = stop
        return items, windows


def _answers(version: int, items: list[Event | Window]) -> list[Window | Events]:
    """The answers for a C frame's frames that hold a W: each W, and the runs of events
    between them."""
    answers: list[Window | Events] = []
    run: list[Event] = []
    for item in items:
        if isinstance(item, Window):
            if run:
                answers.append(Events(version, run))
                run = []
            answers.append(item)
        else:
            run.append(item)
    if run:
        answers.append(Events(version, run))
    return answers


def encode_ack(version: int, seq: int) -> bytes:
    """The ``A`` frame acknowledging every event up to ``seq``, in the batch's ``version``."""
    if version not in (1, 2):
        raise ValueError(f"Lumberjack version must be 1 or 2, not {version}")
    return bytes((0x30 + version, _A)) + _U32.pack(seq)
