"""The fuzzer's sessions and byte mutations, shared by every entry of bench/frontends.py.

:class:`Target` is where the broker listens (its own ports read from /frontends.json),
:class:`Conn` one fuzzing session over TCP or UDP, :func:`mutate_bytes` the generic
byte-level mutations every front end's own mutations fall back on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import struct
from collections import Counter
from dataclasses import dataclass, field

from .child import http_reply

__all__ = [
    "MAX_FRAME",
    "NOTES",
    "ROUND_TRIP_SECONDS",
    "SEND_SECONDS",
    "Conn",
    "Target",
    "connect_tcp",
    "connect_udp",
    "mutate_bytes",
]

ROUND_TRIP_SECONDS = 20.0
# What the round trips met that is a bug but not a failed round trip, counted by what.
NOTES: Counter[str] = Counter()
SEND_SECONDS = 10.0
MAX_FRAME = 64 * 1024


@dataclass
class Target:
    """Where the broker listens; a front end picks its own port from here."""

    host: str
    fq_port: int
    ports: dict[str, int] = field(default_factory=dict)  # front ends' own ports, by name

    @classmethod
    async def of(cls, host: str, fq_port: int) -> Target:
        """The broker's ports as its table of front ends has them (/frontends.json): the
        main port, and each front end's own port by the front end's name."""
        reader, writer = await asyncio.open_connection(host, fq_port)
        try:
            writer.write(b"GET /frontends.json HTTP/1.1\r\nHost: fuzz\r\n\r\n")
            status, body = await http_reply(reader)
        finally:
            writer.close()
        if status != 200:
            raise AssertionError(f"/frontends.json: {status} {body[:200]!r}")
        ports = {
            fe["name"]: fe["port"]
            for fe in json.loads(body)["frontends"]
            if fe["transport"] != "main" and fe["port"] is not None
        }
        return cls(host, fq_port, ports)


class Conn:
    """One fuzzing session: bytes go out, whatever comes back is read and dropped.

    ``holds`` are other connections that must stay open as long as this one (the command
    socket a data socket is paired through). ``sent`` keeps every byte sent, for replays.
    Over UDP (``datagrams``) nothing closes a session but its end, and each frame is a
    datagram of its own (:meth:`send_frames`).
    """

    def __init__(
        self,
        reader: asyncio.StreamReader | None,
        writer: asyncio.DatagramTransport | asyncio.StreamWriter,
        holds: list[Conn] | None = None,
    ) -> None:
        self.writer = writer
        self.holds = holds or []
        self.sent = bytearray()
        self.eof = asyncio.Event()
        self.datagrams = not isinstance(writer, asyncio.StreamWriter)
        name = writer.get_extra_info("sockname")
        self.local_port = name[1] if isinstance(name, tuple) else 0
        self._reader = asyncio.create_task(self._read(reader)) if reader is not None else None

    async def _read(self, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while await reader.read(65536):
                pass
        self.eof.set()

    @property
    def closed_by_peer(self) -> bool:
        return self.eof.is_set()

    async def send(self, data: bytes) -> bool:
        """Write ``data``; False once the broker has closed this session."""
        if self.eof.is_set() or self.writer.is_closing():
            return False
        self.sent += data[: max(0, (1 << 20) - len(self.sent))]
        if isinstance(self.writer, asyncio.StreamWriter):
            self.writer.write(data)
            try:
                await asyncio.wait_for(self.writer.drain(), SEND_SECONDS)
            except (ConnectionError, OSError, TimeoutError):
                return False
        else:  # a datagram transport (uvloop's is no asyncio.DatagramTransport subclass)
            with contextlib.suppress(OSError):
                self.writer.sendto(data)  # type: ignore[union-attr]
        return True

    async def send_frames(self, frames: list[bytes]) -> bool:
        """Send ``frames``: as one write on a stream, as one datagram each over UDP."""
        if not self.datagrams:
            return await self.send(b"".join(frames))
        for frame in frames:
            if not await self.send(frame):
                return False
        await asyncio.sleep(0)  # a datagram never waits: let the round trips run
        return True

    async def close(self, wait_eof: float = 0.0) -> None:
        """Close; with ``wait_eof``, first half-close and wait that long for the broker's end."""
        if (
            wait_eof
            and isinstance(self.writer, asyncio.StreamWriter)
            and self.writer.can_write_eof()
        ):
            with contextlib.suppress(OSError):
                self.writer.write_eof()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.eof.wait(), wait_eof)
        for conn in [self, *self.holds]:
            conn.writer.close()
            if conn._reader is not None:
                conn._reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                    await conn._reader


class _Datagrams(asyncio.DatagramProtocol):
    pass


async def connect_tcp(host: str, port: int) -> Conn:
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), SEND_SECONDS)
    with contextlib.suppress(OSError):
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return Conn(reader, writer)


async def connect_udp(host: str, port: int) -> Conn:
    """A UDP "session": every :meth:`Conn.send` is one datagram; nothing is read back."""
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(_Datagrams, remote_addr=(host, port))
    return Conn(None, transport)


# --- mutation -----------------------------------------------------------------------------

INTERESTING8 = (0x00, 0x01, 0x7F, 0x80, 0xFF)
INTERESTING16 = (0x0000, 0x0001, 0x007F, 0x0080, 0x00FF, 0x0100, 0x03FF, 0x0400, 0x7FFF, 0xFFFF)
INTERESTING32 = (0, 1, 0x7F, 0xFFFF, 0x0FFFFFFF, 0x10000000, 0x10000001, 0x7FFFFFFF, 0xFFFFFFFF)


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    """One to a few byte-level mutations: flips, interesting values, inserts, cuts, splices."""
    b = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 3, 6))):
        if not b:
            b += rng.randbytes(rng.randint(1, 16))
            continue
        i = rng.randrange(len(b))
        op = rng.randrange(9)
        if op == 0:
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            b[i] = rng.choice(INTERESTING8)
        elif op == 2:
            b[i:i] = rng.randbytes(rng.randint(1, 32))
        elif op == 3:
            del b[i : i + rng.randint(1, 16)]
        elif op == 4:
            j = rng.randrange(len(b))
            b[i:i] = b[j : j + rng.randint(1, 64)]
        elif op == 5:
            del b[i:]
        elif op == 6:
            b[i : i + 2] = struct.pack(">H", rng.choice(INTERESTING16))
        elif op == 7:
            b[i : i + 4] = struct.pack(">I", rng.choice(INTERESTING32))
        else:
            b += rng.randbytes(rng.randint(1, 64))
    return bytes(b[:MAX_FRAME])
