"""The Lumberjack load generator: a Beats-like shipper in a process of its own.

    python -m bench.ljload ljpub --port FQ_PORT --lj-port P --count N --size 300 --batch 2048

It sends what Filebeat's Logstash output sends (go-lumber's client), with ``--pipeline K``
batches in flight, from batches built and compressed before ``READY``. Like
bench/loadgen.py it prints ``READY``, waits for ``go`` on stdin, and prints one JSON line
(docs/bench.md, "Lumberjack row").
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections import deque

from fqbroker.protocols.lumberjack.encoder import AckReader, batch

DISTINCT_BATCHES = 4


def event(i: int, size: int) -> bytes:
    """A Filebeat-like event of exactly ``size`` bytes (JSON object, ASCII)."""
    head = {
        "@timestamp": f"2026-11-25T00:00:00.{i % 1000:03d}Z",
        "@metadata": {"beat": "filebeat", "type": "_doc", "version": "8.15.0"},
        "log": {"offset": i * size, "file": {"path": "/var/log/nginx/access.log"}},
        "id": os.urandom(8).hex(),
        "message": "",
    }
    base = json.dumps(head, separators=(",", ":")).encode()
    pad = size - len(base)
    if pad < 0:
        raise ValueError(f"--size {size} is below a Beats event's {len(base)} bytes")
    # An access-log line (no quotes or backslashes: it goes into the JSON as it is).
    text = b"10.1.2.3 - - [25/Nov/2026] GET /api/v1/items?page=%d HTTP/1.1 200 512 curl/8.5 " % i
    message = (text * (pad // len(text) + 1))[:pad]
    return base.replace(b'"message":""', b'"message":"' + message + b'"')


def run_ljpub(args: argparse.Namespace) -> None:
    n = args.batch
    frames = [
        batch([event(k * n + i, args.size) for i in range(n)], first_seq=1, version=2)
        for k in range(DISTINCT_BATCHES)
    ]
    sock = socket.create_connection(("127.0.0.1", args.lj_port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    acks = AckReader()
    print("READY", flush=True)
    sys.stdin.readline()
    start = time.monotonic_ns()
    batches = -(-args.count // n)
    sent = done = acked = keepalives = 0
    in_flight: deque[int] = deque()  # last seq of each batch sent and not yet acknowledged
    while done < batches:
        while sent < batches and len(in_flight) < args.pipeline:
            sock.sendall(frames[sent % DISTINCT_BATCHES])
            in_flight.append(n)
            sent += 1
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"the broker closed the connection after {done} batches")
        for _version, seq in acks.feed(chunk):
            acked += 1
            if seq == 0:
                keepalives += 1
            elif in_flight and seq == in_flight[0]:
                in_flight.popleft()
                done += 1
    end = time.monotonic_ns()
    print(
        json.dumps(
            {
                "sent": batches * n,
                "start_ns": start,
                "end_ns": end,
                "acks": acked,
                "keepalives": keepalives,
            }
        ),
        flush=True,
    )
    sys.stdin.readline()  # keep the connection until the harness is done with the run
    sock.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.ljload")
    p.add_argument("role", choices=["ljpub"])
    p.add_argument("--proto", default="fq", help="ignored: the harness passes it to every role")
    p.add_argument("--port", type=int, help="the broker's fq port (unused)")
    p.add_argument("--lj-port", type=int, required=True)
    p.add_argument("--count", type=int, default=300_000)
    p.add_argument("--size", type=int, default=300)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--pipeline", type=int, default=2)
    run_ljpub(p.parse_args(argv))


if __name__ == "__main__":
    main()
