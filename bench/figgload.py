"""The Figg load generator: a lean publisher or subscriber in a process of its own.

    python -m bench.figgload figgpub --figg-port P --topic T --count N --size 100 --window 256
    python -m bench.figgload figgsub --figg-port P --topic T --count N [--offset 0]

Frames are walked with struct over one buffer, no object per message, so the generator
spends its time on the socket. Like bench/loadgen.py it prints ``READY``, waits for ``go``
on stdin, and prints one JSON line (docs/bench.md, "Figg rows").
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import time

from fqbroker.protocols.figg import wire

_HEADER = struct.Struct(">HHI")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
READ_SIZE = 1 << 20


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def run_pub(args: argparse.Namespace) -> None:
    topic, count, window = args.topic.encode(), args.count, args.window
    payload = b"x" * args.size
    sock = _connect(args.figg_port)
    print("READY", flush=True)
    sys.stdin.readline()
    start = time.monotonic_ns()
    encode = wire.encode_publish
    next_seq = 0
    acked = -1
    buf = b""
    while acked < count - 1:
        room = min(window - (next_seq - acked - 1), count - next_seq)
        if room > 0:
            sock.sendall(
                b"".join([encode(topic, s, payload) for s in range(next_seq, next_seq + room)])
            )
            next_seq += room
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"the broker closed the connection at ACK {acked}")
        buf += chunk
        # Only ACKs come back (no PINGs are sent), 16 bytes each and cumulative: the last
        # whole one says it all.
        whole = len(buf) - len(buf) % 16
        if whole:
            kind, _v, _size = _HEADER.unpack_from(buf, whole - 16)
            if kind != wire.ACK:
                raise ConnectionError(f"frame type {kind} where an ACK was expected")
            acked = _U64.unpack_from(buf, whole - 8)[0]
            buf = buf[whole:]
    end = time.monotonic_ns()
    print(json.dumps({"sent": count, "start_ns": start, "end_ns": end}), flush=True)
    sys.stdin.readline()  # keep the connection until the harness is done with the run
    sock.close()


def _attach(sock: socket.socket, topic: bytes, offset: int | None) -> tuple[int, bytearray]:
    """ATTACH and read the ATTACHED; its offset and whatever came after it."""
    sock.sendall(wire.encode(wire.Attach(topic, offset)))
    buf = bytearray()
    while True:
        if len(buf) >= 8 and len(buf) >= (size := 8 + _HEADER.unpack_from(buf, 0)[2]):
            decoder = wire.FrameDecoder()
            decoder.receive_data(bytes(buf[:size]))
            reply = decoder.next_frame()
            if not isinstance(reply, wire.Attached):
                raise ConnectionError(f"{reply!r} where ATTACHED was expected")
            return reply.offset, buf[size:]
        chunk = sock.recv(READ_SIZE)
        if not chunk:
            raise ConnectionError("the broker closed the connection before ATTACHED")
        buf += chunk


def run_sub(args: argparse.Namespace) -> None:
    topic, count = args.topic.encode(), args.count
    sock = _connect(args.figg_port)
    start_ns = 0
    if args.offset is None:
        # Live: attached before READY, so the publisher's first message is ours too.
        attached, buf = _attach(sock, topic, None)
        print("READY", flush=True)
        sys.stdin.readline()
    else:
        # Replay: the clock starts at go, with the ATTACH.
        print("READY", flush=True)
        sys.stdin.readline()
        start_ns = time.monotonic_ns()
        attached, buf = _attach(sock, topic, args.offset)
    received = 0
    whole = True
    expected = attached + 1
    first_ns = 0
    header = _HEADER.unpack_from
    u32 = _U32.unpack_from
    u64 = _U64.unpack_from
    data_kind = wire.DATA
    pos = 0
    while received < count:
        if pos:
            del buf[:pos]
            pos = 0
        chunk = sock.recv(READ_SIZE)
        if not chunk:
            raise ConnectionError(f"the broker closed the connection after {received}")
        if not first_ns:
            first_ns = time.monotonic_ns()
        buf += chunk
        have = len(buf)
        while have - pos >= 8:
            kind, _v, size = header(buf, pos)
            end = pos + 8 + size
            if end > have:
                break
            if kind == data_kind:
                offset = u64(buf, pos + 12 + u32(buf, pos + 8)[0])[0]
                if offset != expected:
                    whole = False
                expected = offset + 1
                received += 1
            pos = end
    last_ns = time.monotonic_ns()
    result = {
        "received": received,
        "start_ns": start_ns,
        "first_ns": first_ns,
        "last_ns": last_ns,
        "whole": whole,
        "attached": attached,
    }
    print(json.dumps(result), flush=True)
    sys.stdin.readline()
    sock.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.figgload")
    p.add_argument("role", choices=["figgpub", "figgsub"])
    p.add_argument("--proto", default="fq", help="ignored: the harness passes it to every role")
    p.add_argument("--port", type=int, help="the broker's fq port (unused)")
    p.add_argument("--figg-port", type=int, required=True)
    p.add_argument("--topic", default="bench")
    p.add_argument("--count", type=int, default=300_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--offset", type=int, help="figgsub: attach from this offset (else latest)")
    args = p.parse_args(argv)
    if args.role == "figgpub":
        run_pub(args)
    else:
        run_sub(args)


if __name__ == "__main__":
    main()
