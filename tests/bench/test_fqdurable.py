"""The fq durable generator's frames are what the broker reads: numbered, one route."""

from __future__ import annotations

import struct

from bench.fqdurable import _payload_at, frames
from fqbroker.core.frames import scan_runs, stamp


def test_frames_are_publisher_frames_numbered_in_their_payloads() -> None:
    data = frames(b"ex", 100, 7, 3)
    out: list[tuple[bytes, bytes, list[bytes], int]] = []
    after_id = stamp(b"pub", b"\x0a\x00\x00\x01")
    assert scan_runs(data, out, after_id, {}, 1 << 20) == len(data)
    [(exchange, route, delivered, _)] = out
    assert (exchange, route, len(delivered)) == (b"ex", b"r.k", 3)
    for seq, frame in enumerate(delivered, 7):
        at = _payload_at(frame)
        assert len(frame) - at == 100
        assert struct.unpack_from(">Q", frame, at)[0] == seq
