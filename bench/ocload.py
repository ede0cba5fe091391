"""The OpenCluster load generator: pipelined set then get, as redis-benchmark -P does.

    python -m bench.ocload ocload --oc-port P --conns 25 --depth 16 --count N --size 100

A round costs the generator a send of pre-encoded bytes and a few ``recv_into``, and every
reply is checked against the pre-encoded replies it must equal. ``--proto redis`` speaks
RESP to a redis-server the same way (docs/bench.md, "OpenCluster rows").
"""

from __future__ import annotations

import argparse
import json
import selectors
import socket
import sys
import time
from typing import Any

from fqbroker.protocols.opencluster import wire as oc

STALL_SECONDS = 10.0


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _hello(sock: socket.socket) -> None:
    """hello; its ack, serverlist and hashmasks read; the pushes acked as 2011's client did."""
    sock.sendall(oc.hello(0))
    decoder = oc.FrameDecoder(1 << 20)
    seen: list[oc.Frame] = []
    while len(seen) < 3:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("the broker closed the connection at hello")
        decoder.receive_data(data)
        while (frame := decoder.next_frame()) is not None:
            seen.append(frame)
    if [f.command for f in seen] != [oc.ACK, oc.SERVERLIST, oc.HASHMASKS]:
        raise ConnectionError(f"hello answered by {seen}")
    sock.sendall(b"".join(oc.ack(oc.SERVERLIST, f.userid) for f in seen[1:]))


def _resp(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def batches(
    proto: str, conn: int, depth: int, size: int, tag: int
) -> tuple[tuple[bytes, bytes], tuple[bytes, bytes]]:
    """((sets, their replies), (gets, their replies)) of one connection, pre-encoded."""
    names = [b"oc.%x.%d.%d" % (tag, conn, i) for i in range(depth)]
    values = [(name + b"=").ljust(size, b"v")[:size] for name in names]
    if proto == "redis":
        sets = b"".join(_resp(b"SET", n, v) for n, v in zip(names, values, strict=True))
        gets = b"".join(_resp(b"GET", n) for n in names)
        got = b"".join(b"$%d\r\n%s\r\n" % (len(v), v) for v in values)
        return (sets, b"+OK\r\n" * depth), (gets, got)
    pairs = list(zip(names, values, strict=True))
    sets = b"".join(oc.set_string(i, n, v) for i, (n, v) in enumerate(pairs))
    acks = b"".join(oc.ack(oc.SET_STRING, i) for i in range(depth))
    gets = b"".join(oc.get_string(i, n) for i, n in enumerate(names))
    got = b"".join(oc.data_str(i, 0, oc.fnv1a32(n), v) for i, (n, v) in enumerate(pairs))
    return (sets, acks), (gets, got)


def phase(
    socks: list[socket.socket], work: list[tuple[bytes, bytes]], rounds: int
) -> dict[str, Any]:
    """``rounds`` rounds on every connection: write the batch, read its replies, again."""
    sel = selectors.DefaultSelector()
    bufs = [bytearray(len(replies)) for _, replies in work]
    views = [memoryview(b) for b in bufs]
    got = [0] * len(socks)
    left = [rounds] * len(socks)
    active = len(socks)
    result: dict[str, Any] = {"bad": 0}
    start = time.monotonic_ns()
    for i, sock in enumerate(socks):
        sel.register(sock, selectors.EVENT_READ, i)
        sock.sendall(work[i][0])
    while active:
        events = sel.select(STALL_SECONDS)
        if not events:
            stalled = [i for i in range(len(socks)) if left[i]]
            i = stalled[0]
            result.update(bad=1, error=f"stalled: {got[i]} bytes of a round: {bufs[i][:256]!r}")
            break
        for key, _ in events:
            i = key.data
            n = socks[i].recv_into(views[i][got[i] :])
            if not n:
                raise ConnectionError(f"the server closed connection {i}")
            got[i] += n
            if got[i] < len(bufs[i]):
                continue
            got[i] = 0
            if bufs[i] != work[i][1]:
                result.update(bad=1, error=f"replies {bytes(bufs[i][:256])!r}")
                active = 0
                break
            left[i] -= 1
            if left[i]:
                socks[i].sendall(work[i][0])
            else:
                sel.unregister(socks[i])
                active -= 1
    end = time.monotonic_ns()
    sel.close()
    result.update(rounds=sum(rounds - n for n in left), start_ns=start, end_ns=end)
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.ocload")
    p.add_argument("role", choices=["ocload"])
    p.add_argument("--proto", default="opencluster", choices=["opencluster", "redis", "fq"])
    p.add_argument("--port", type=int, help="the server's port (Redis), else unused")
    p.add_argument("--oc-port", type=int, help="the broker's OpenCluster port")
    p.add_argument("--conns", type=int, default=25)
    p.add_argument("--depth", type=int, default=16)
    p.add_argument("--count", type=int, default=300_000, help="sets (and gets) in this process")
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--tag", type=int, default=0, help="keys of this run, told from others")
    p.add_argument("--slot", type=int, default=0, help="this process's keys, told from others'")
    args = p.parse_args(argv)
    proto = "redis" if args.proto == "redis" else "opencluster"
    port = args.port if proto == "redis" else args.oc_port
    socks = [_connect(port) for _ in range(args.conns)]
    if proto == "opencluster":
        for sock in socks:
            _hello(sock)
    work = [
        batches(proto, args.slot * args.conns + i, args.depth, args.size, args.tag)
        for i in range(args.conns)
    ]
    rounds = max(1, args.count // (args.conns * args.depth))
    print("READY", flush=True)
    for which in (0, 1):  # SET, then GET of the keys set
        sys.stdin.readline()
        result = phase(socks, [w[which] for w in work], rounds)
        result["ops"] = result.pop("rounds") * args.depth
        print(json.dumps(result), flush=True)
    sys.stdin.readline()  # keep the connections until the harness is done with the run
    for sock in socks:
        sock.close()


if __name__ == "__main__":
    main()
