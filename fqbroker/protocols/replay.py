"""The body of a replay read (``/queue/read``, ``/topic/read``): entries both ends share.

An entry is ``u64 seq, u64 arrival time in microseconds (0: not recorded), u32 length``
and then the message as the data socket delivers it: fq's peer-format frame
(docs/http.md). The broker writes entries with :func:`encode_entry`; readers (the replay
client, the Spark source) read them with :func:`decode_entries`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from fqbroker.core.message import Message
from fqbroker.protocols.fq.msgdecoder import MessageDecoder

__all__ = ["CONTENT_TYPE", "DEFAULT_READ_BYTES", "ENTRY", "Entry", "decode_entries", "encode_entry"]

CONTENT_TYPE = "application/x-fq-entries"
ENTRY = struct.Struct(">QQI")
DEFAULT_READ_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class Entry:
    seq: int
    arrival_us: int | None
    message: Message


def encode_entry(seq: int, arrival_us: int | None, frame: bytes) -> bytes:
    return ENTRY.pack(seq, arrival_us or 0, len(frame)) + frame


def decode_entries(body: bytes) -> list[Entry]:
    """The entries of a ``/queue/read`` body; ``ValueError`` if it is cut short or bad."""
    out: list[Entry] = []
    pos, end = 0, len(body)
    while pos < end:
        if end - pos < ENTRY.size:
            raise ValueError(f"entry header cut short at byte {pos}")
        seq, arrival, n = ENTRY.unpack_from(body, pos)
        pos += ENTRY.size
        if end - pos < n:
            raise ValueError(f"entry {seq} cut short")
        decoder = MessageDecoder(peer_format=True)
        decoder.feed(body[pos : pos + n])
        msg = decoder.next_message()
        if msg is None:
            raise ValueError(f"entry {seq} does not hold a message")
        pos += n
        out.append(Entry(seq, arrival or None, msg))
    return out
