"""The bulk reader's walk over a buffer of segment records: each checked, payloads out.

One function, compiled by the accelerator (docs/accel.md): a replay of a retained topic
reads a million records through it, and interpreted, its loop was a third of the
broker's time in the Figg replay row (bench/RESULTS.md, figures behind comments). The
header's fields are read by indexing the bytes, no tuple a record; the crc is zlib's.
"""

from __future__ import annotations

import zlib

from fqbroker.storage.segments.records import HEADER_SIZE

__all__ = ["checked_payloads"]


def checked_payloads(
    buf: bytes, seq: int, stop: int, skip: int, out: list[bytes]
) -> tuple[int, int]:
    """Append to ``out`` the payloads, less their first ``skip`` bytes, of the records
    at the start of ``buf``, which should be ``seq``, ``seq + 1``, ... up to ``stop``
    (excluded); returns (the bytes walked, the next seq). Stops before a record that is
    cut off by the end of ``buf`` or is not the one expected: a crc or seq that does not
    match is damage, for the careful reader to step over."""
    size = len(buf)
    pos = 0
    head = HEADER_SIZE  # crc32, payload length, seq (big-endian): read once a call
    cut = head + skip
    crc32 = zlib.crc32
    with memoryview(buf) as view:
        while pos + head <= size and seq < stop:
            crc = buf[pos] << 24 | buf[pos + 1] << 16 | buf[pos + 2] << 8 | buf[pos + 3]
            length = buf[pos + 4] << 24 | buf[pos + 5] << 16 | buf[pos + 6] << 8 | buf[pos + 7]
            end = pos + head + length
            if end > size:
                break  # cut off: read on next time
            high = buf[pos + 8] << 24 | buf[pos + 9] << 16 | buf[pos + 10] << 8 | buf[pos + 11]
            low = buf[pos + 12] << 24 | buf[pos + 13] << 16 | buf[pos + 14] << 8 | buf[pos + 15]
            if (high << 32 | low) != seq or crc32(view[pos + 4 : end]) != crc:
                break
            out.append(buf[pos + cut : end])
            pos = end
            seq += 1
    return pos, seq
