"""The fq durable generator's frames are what the broker reads: numbered, one route."""

from __future__ import annotations

import struct

from bench.fqdurable import frames
from fqbroker.core.frames import peer_fields, scan_runs, stamp


def test_frames_are_publisher_frames_numbered_in_their_payloads() -> None:
    data = frames(b"ex", 100, 7, 3)
    out: list[tuple[bytes, bytes, list[bytes], int]] = []
    after_id = stamp(b"pub", b"\x0a\x00\x00\x01")
    assert scan_runs(data, out, after_id, {}, 1 << 20) == len(data)
    [(exchange, route, delivered, _)] = out
    assert (exchange, route, len(delivered)) == (b"ex", b"r.k", 3)
    for seq, frame in enumerate(delivered, 7):
        payload = peer_fields(frame)[2]
        assert len(payload) == 100
        assert struct.unpack_from(">Q", payload)[0] == seq
