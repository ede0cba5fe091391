"""The Lumberjack writer side: frames as a shipper sends them, for tests, the bench and fuzz.

Each function returns the frame's bytes (docs/lumberjack.md, "Wire format"). ``batch``
writes one ``W`` and its events; the caller picks the sequence numbers, so both patterns of
real shippers are expressible: go-lumber (Beats) restarts at 1 each batch
(``batch(p, first_seq=1)`` every time), pylogbeat counts over the connection
(``first_seq = previous last + 1``). :class:`AckReader` splits the reader's ``A`` frames
out of a byte stream, and :func:`sample_frames` makes valid frames of every type for the
fuzzer to send and mutate.
"""

from __future__ import annotations

import json
import random
import struct
import zlib

__all__ = [
    "AckReader",
    "batch",
    "compressed",
    "data_frame",
    "json_frame",
    "sample_frames",
    "window",
]

_U32 = struct.Struct(">I")
_U32X2 = struct.Struct(">II")


def _version_byte(version: int) -> int:
    if version not in (1, 2):
        raise ValueError(f"Lumberjack version must be 1 or 2, not {version}")
    return 0x30 + version


def window(version: int, n: int) -> bytes:
    """``W``: ``n`` events follow."""
    return bytes((_version_byte(version), 0x57)) + _U32.pack(n)


def json_frame(seq: int, payload: bytes) -> bytes:
    """``2J``: one event as JSON bytes."""
    return b"2J" + _U32X2.pack(seq, len(payload)) + payload


def data_frame(seq: int, pairs: dict[str, str]) -> bytes:
    """``1D``: one event as string pairs (UTF-8)."""
    parts = [b"1D", _U32X2.pack(seq, len(pairs))]
    for key, value in pairs.items():
        for text in (key.encode(), value.encode()):
            parts.append(_U32.pack(len(text)))
            parts.append(text)
    return b"".join(parts)


def compressed(version: int, frames: bytes, level: int = 6) -> bytes:
    """``C``: ``frames`` (whole frames of ``version``) in one zlib stream."""
    body = zlib.compress(frames, level)
    return bytes((_version_byte(version), 0x43)) + _U32.pack(len(body)) + body


def batch(
    payloads: list[bytes] | list[dict[str, str]],
    first_seq: int = 1,
    version: int = 2,
    compress: bool = True,
) -> bytes:
    """``W(len)`` then one data frame per payload, seq ``first_seq`` up, maybe in one ``C``.

    Version 2 takes JSON bytes (``J`` frames), version 1 string dicts (``D`` frames).
    """
    parts: list[bytes] = []
    for i, p in enumerate(payloads):
        if version == 2 and isinstance(p, bytes):
            parts.append(json_frame(first_seq + i, p))
        elif version == 1 and isinstance(p, dict):
            parts.append(data_frame(first_seq + i, p))
        else:
            _version_byte(version)
            want = "bytes" if version == 2 else "dict"
            raise TypeError(f"a version-{version} batch takes {want} payloads, not {type(p)}")
    frames = b"".join(parts)
    body = compressed(version, frames) if compress else frames
    return window(version, len(payloads)) + body


class AckReader:
    """Splits ``A`` frames out of what a reader sends back."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, int]]:
        """``(version, seq)`` of each whole ACK in the bytes so far; raises on anything else."""
        self._buf += data
        acks: list[tuple[int, int]] = []
        pos = 0
        buf = self._buf
        while len(buf) - pos >= 6:
            v, kind = buf[pos], buf[pos + 1]
            if v not in (0x31, 0x32) or kind != 0x41:
                raise ValueError(f"not an ACK frame: {bytes(buf[pos : pos + 6]).hex()}")
            acks.append((v - 0x30, _U32.unpack_from(buf, pos + 2)[0]))
            pos += 6
        del buf[:pos]
        return acks


_WORDS = ["GET", "/index.html", "200", "nginx", "ünïcödé", "x" * 40, "", "a.b.c", "\n"]


def _random_event(rng: random.Random) -> dict[str, str]:
    event = {f"k{i}": rng.choice(_WORDS) for i in range(rng.randint(0, 4))}
    if rng.random() < 0.5:
        event["type"] = rng.choice(["nginx", "syslog", "app.log"])
    return event


def sample_frames(rng: random.Random) -> bytes:
    """A valid stream of one version: windows, plain and compressed data frames.

    Sequence numbers follow one of the real patterns (restarting per batch or cumulative),
    some ``W`` frames announce more events than follow (as lumberjack-protocol's single
    window does), and ``C`` frames come at several levels, some holding the ``W`` and
    another ``C``, so a fuzzer mutating this reaches every branch of the decoder.
    """
    version = rng.choice((1, 2))
    cumulative = rng.random() < 0.5
    seq = 1
    out: list[bytes] = []
    for _ in range(rng.randint(1, 4)):
        if not cumulative:
            seq = 1
        events = [_random_event(rng) for _ in range(rng.randint(0, 6))]
        out.append(window(version, len(events) + (rng.randint(0, 3) if rng.random() < 0.2 else 0)))
        frames = b"".join(
            data_frame(seq + i, e)
            if version == 1
            else json_frame(seq + i, json.dumps(e, ensure_ascii=False).encode())
            for i, e in enumerate(events)
        )
        seq += len(events)
        how = rng.random()
        if how < 0.4:
            out.append(frames)
        elif how < 0.8:
            out.append(compressed(version, frames, rng.choice((0, 1, 6, 9))))
        elif how < 0.9:  # some plain, the rest compressed: a C may sit among plain frames
            cut = _frame_boundary(frames, rng)
            out.append(frames[:cut])
            out.append(compressed(version, frames[cut:]))
        else:  # the W and a C inside a C, as the protocol text allows
            out[-1] = compressed(version, out[-1] + compressed(version, frames))
    return b"".join(out)


def _frame_boundary(frames: bytes, rng: random.Random) -> int:
    """A random offset in ``frames`` that falls between two frames."""
    bounds = [0]
    pos = 0
    while pos < len(frames):
        if frames[pos + 1] == 0x4A:
            pos += 10 + _U32.unpack_from(frames, pos + 6)[0]
        else:
            count = _U32.unpack_from(frames, pos + 6)[0]
            pos += 10
            for _ in range(2 * count):
                pos += 4 + _U32.unpack_from(frames, pos)[0]
        bounds.append(pos)
    return rng.choice(bounds)
