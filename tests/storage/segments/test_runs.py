"""The bulk reader's walk: payloads of checked records, stopping before the first bad one."""

from __future__ import annotations

import zlib

from fqbroker.storage.segments.records import HEADER, LENSEQ
from fqbroker.storage.segments.runs import checked_payloads


def record(seq: int, payload: bytes) -> bytes:
    tail = LENSEQ.pack(len(payload), seq) + payload
    return HEADER.pack(zlib.crc32(tail), len(payload), seq) + payload


def test_whole_records_from_seq_on_less_their_skipped_bytes() -> None:
    buf = b"".join(record(seq, b"T%d-payload" % seq) for seq in range(5, 10))
    out: list[bytes] = []
    assert checked_payloads(buf, 5, 10, 1, out) == (len(buf), 10)
    assert out == [b"%d-payload" % seq for seq in range(5, 10)]


def test_it_stops_at_stop_at_a_cut_record_and_before_damage() -> None:
    records = [record(seq, b"p" * seq) for seq in range(1, 6)]
    buf = b"".join(records)
    at = [sum(map(len, records[:i])) for i in range(6)]
    out: list[bytes] = []
    assert checked_payloads(buf, 1, 3, 0, out) == (at[2], 3)  # stop (excluded)
    out = []
    assert checked_payloads(buf[:-1], 1, 99, 0, out) == (at[4], 5)  # the last one cut
    assert out == [b"p" * seq for seq in range(1, 5)]
    rotten = bytearray(buf)
    rotten[at[2] + 17] ^= 1  # the third record's payload: its crc no longer matches
    out = []
    assert checked_payloads(bytes(rotten), 1, 99, 0, out) == (at[2], 3)
    out = []
    assert checked_payloads(buf, 2, 99, 0, out) == (0, 2)  # not the seq expected
    assert out == []
    big = record((1 << 40) + 3, b"far")  # a seq past 32 bits
    assert checked_payloads(big, (1 << 40) + 3, 1 << 41, 0, out) == (len(big), (1 << 40) + 4)
