"""The fq side of the durable rows: confirmed publishes into a disk queue, and its consumer.

    python -m bench.fqdurable pub --port P --topic T --count N --size 100 --window 1000
    python -m bench.fqdurable sub --port P --topic T --count N [--queue-type disk]

The same roles and JSON lines as the durable peers' generators (bench/amqpload.py,
bench/jsload.py), so bench/durablesuite.py drives every system alike. ``pub`` writes
messages on its data socket and asks for a confirm (docs/confirms.md) after each quarter
of ``--window``, keeping at most ``--window`` messages unconfirmed, as a RabbitMQ or
JetStream publisher keeps that many unacknowledged; a run ends at the CONFIRMED of the last
message. ``sub`` binds a disk queue to the exchange before ``READY`` and drains it while
the publisher runs, checking the sequence number at the start of every payload. Like
bench/loadgen.py each prints ``READY``, waits for ``go``, and prints one JSON line
(docs/bench.md, "Durable rows").
"""

from __future__ import annotations

import argparse
import struct
import time

from fqbroker.core.frames import frame_length
from fqbroker.protocols.fq import wire

from .loadgen import FqClient, ready, report, wait_go

_CONFIRMED = struct.Struct(">HQ")
_SEQ = struct.Struct(">Q")
READ_SIZE = 1 << 20


def frames(topic: bytes, size: int, first: int, count: int) -> bytes:
    """``count`` fq data frames to exchange ``topic``, payloads numbered from ``first``."""
    head = b"".join((bytes((len(topic),)), topic, b"\x03r.k", bytes(16), struct.pack(">I", size)))
    pad = b"x" * (size - _SEQ.size)
    return b"".join(head + _SEQ.pack(seq) + pad for seq in range(first, first + count))


def run_pub(args: argparse.Namespace) -> None:
    client = FqClient(args.port, b"pub", b"", None)
    data = client.open_data()
    cmd = client.cmd
    topic, count, window = args.topic.encode(), args.count, args.window
    step = max(1, window // 4)
    ready()
    wait_go()
    start = time.monotonic_ns()
    sent = confirmed = 0
    buf = b""
    while confirmed < count:
        # Room in the window: write up to a step's worth and ask for its confirm.
        while sent < count and sent + min(step, count - sent) - confirmed <= window:
            n = min(step, count - sent)
            data.sendall(frames(topic, args.size, sent, n))
            sent += n
            cmd.sendall(wire.encode(wire.ConfirmRequest(sent)))
        chunk = cmd.recv(65536)
        if not chunk:
            raise ConnectionError(f"the broker closed the command socket at {confirmed}")
        buf += chunk
        while len(buf) >= _CONFIRMED.size:
            code, n = _CONFIRMED.unpack_from(buf)
            if code != wire.Cmd.CONFIRMED:
                raise ConnectionError(f"confirm of {n} refused: {buf!r}")
            confirmed = n
            buf = buf[_CONFIRMED.size :]
    end = time.monotonic_ns()
    report(sent=sent, confirmed=confirmed, start_ns=start, end_ns=end)
    wait_go()  # keep the connection until the harness is done with the run


def run_sub(args: argparse.Namespace) -> None:
    queue = f"{args.topic}-durable".encode() + b"\0" + args.queue_type.encode()
    client = FqClient(args.port, b"sub", queue, args.topic.encode())
    sock = client.open_data()
    size, count = args.size, args.count
    ready()
    wait_go()
    data = bytearray()
    received = first = last = at = fsize = 0
    whole = True
    while received < count:
        chunk = sock.recv(READ_SIZE)
        if not chunk:
            break
        first = first or time.monotonic_ns()
        data += chunk
        if not at:
            if len(data) < 64:
                continue
            fsize = frame_length(data)  # every delivered frame the same size
            at = fsize - size
        n = len(data) // fsize
        for i in range(n):
            if _SEQ.unpack_from(data, i * fsize + at)[0] != received + i:
                whole = False
        received += n
        del data[: n * fsize]
        last = time.monotonic_ns()
    report(received=received, first_ns=first, last_ns=last, whole=whole and not data)
    wait_go()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.fqdurable")
    p.add_argument("role", choices=("pub", "sub"))
    p.add_argument("--proto", default="fq")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--topic", default="durable")
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--window", type=int, default=1000)
    p.add_argument("--queue-type", default="disk")
    args = p.parse_args(argv)
    {"pub": run_pub, "sub": run_sub}[args.role](args)


if __name__ == "__main__":
    main()
