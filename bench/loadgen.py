"""Load generators: separate processes speaking raw protocol bytes, cheap enough not to limit.

    python -m bench.loadgen ROLE --proto fq|redis|nats --port P [options]

Roles ``pub``, ``sub``, ``latpub``/``latsub``, ``hold`` and ``idle`` (docs/bench.md, "The
suite"). Each prints ``READY`` when set up (subscribers: bound and listening) and, at the
end, one JSON line with its figures. Times are ``time.monotonic_ns()``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import mmap
import os
import resource
import selectors
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable

from fqbroker.protocols.fq import wire

CHUNK = 256 * 1024
_U32 = struct.Struct(">I")
_Q = struct.Struct("<Q")
_TS = struct.Struct(">Q")

# --- shared credit counters ------------------------------------------------------------------


class Credit:
    """Per-subscriber received counts in a small shared file (one u64 per slot)."""

    SLOTS = 64

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDWR)
        self.map = mmap.mmap(self.fd, 8 * self.SLOTS)

    def set(self, slot: int, value: int) -> None:
        _Q.pack_into(self.map, 8 * slot, value)

    def get(self, slot: int) -> int:
        value: int = _Q.unpack_from(self.map, 8 * slot)[0]
        return value

    @staticmethod
    def create(path: str) -> None:
        with open(path, "wb") as fh:
            fh.write(bytes(8 * Credit.SLOTS))


# --- protocol adapters -----------------------------------------------------------------------


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read_until(sock: socket.socket, marker: bytes, buf: bytes = b"") -> tuple[bytes, bytes]:
    """Read until ``marker``; returns (through the marker, what came after)."""
    while marker not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed during handshake")
        buf += chunk
    i = buf.index(marker) + len(marker)
    return buf[:i], buf[i:]


class FqClient:
    """The handshake of an fq client (command + data socket); the data socket for traffic."""

    def __init__(
        self, port: int, user: bytes, queue: bytes, bind: bytes | None, hb_ms: int = 0
    ) -> None:
        self.cmd = _connect(port)
        self.decoder = wire.ClientCommandDecoder()
        out = wire.encode_hello(wire.Mode.CMD, b"")[:4]
        out += wire.encode(wire.AuthPlain(user, queue, b""))
        if hb_ms:
            out += wire.encode(wire.HeartbeatRequest(hb_ms))
        self.cmd.sendall(out)
        key = self._await(wire.AuthResponse).key
        self.key = key
        if bind is not None:
            self.cmd.sendall(wire.encode(wire.BindRequest(0, bind, b"prefix:")))
            self._await(wire.BindResponse)
        self.data: socket.socket | None = None

    def open_data(self) -> socket.socket:
        self.data = _connect(self.cmd.getpeername()[1])
        self.data.sendall(wire.encode_hello(wire.Mode.DATA, self.key))
        return self.data

    def _await(self, kind: type) -> wire.Frame:
        while True:
            while (frame := self.decoder.next_frame()) is not None:
                if isinstance(frame, kind):
                    return frame
                if isinstance(frame, wire.ErrorReply):
                    raise ConnectionError(frame.text)
            chunk = self.cmd.recv(65536)
            if not chunk:
                raise ConnectionError("command channel closed")
            self.decoder.feed(chunk)


def _drain_forever(sock: socket.socket) -> None:
    """Read and discard (publisher-side replies) so the server never blocks on us."""

    def run() -> None:
        try:
            while sock.recv(1 << 20):
                pass
        except OSError:
            pass

    threading.Thread(target=run, daemon=True).start()


class Proto:
    """One system's publisher and subscriber wire format."""

    name = ""
    trailer = 0  # bytes after the payload in a delivered frame

    def __init__(self, port: int, topic: bytes) -> None:
        self.port = port
        self.topic = topic

    def publisher(self, ident: int) -> socket.socket:
        raise NotImplementedError

    def subscriber(self, queue: str) -> tuple[socket.socket, bytes]:
        """A subscribed socket, and bytes already read past the handshake."""
        raise NotImplementedError

    def frame(self, payload: bytes) -> bytes:
        raise NotImplementedError


class FqProto(Proto):
    name = "fq"

    def __init__(self, port: int, topic: bytes, queue_type: str = "mem") -> None:
        super().__init__(port, topic)
        self.queue_type = queue_type
        self._clients: list[FqClient] = []

    def publisher(self, ident: int) -> socket.socket:
        client = FqClient(self.port, b"pub", b"", None)
        self._clients.append(client)
        sock = client.open_data()
        _drain_forever(client.cmd)
        return sock

    def subscriber(self, queue: str) -> tuple[socket.socket, bytes]:
        field = queue.encode() + b"\0" + self.queue_type.encode()
        client = FqClient(self.port, b"sub", field, self.topic)
        self._clients.append(client)
        _drain_forever(client.cmd)
        return client.open_data(), b""

    def frame(self, payload: bytes, route: int | None = None) -> bytes:
        t = self.topic
        rt = b"r.k" if route is None else b"%03d" % route  # one length: one frame size
        return b"".join(
            (bytes((len(t),)), t, b"\x03", rt, bytes(16), _U32.pack(len(payload)), payload)
        )


class RedisProto(Proto):
    name = "redis"
    trailer = 2

    def publisher(self, ident: int) -> socket.socket:
        sock = _connect(self.port)
        _drain_forever(sock)
        return sock

    def subscriber(self, queue: str) -> tuple[socket.socket, bytes]:
        sock = _connect(self.port)
        t = self.topic
        sock.sendall(b"*2\r\n$9\r\nSUBSCRIBE\r\n$%d\r\n%s\r\n" % (len(t), t))
        _, rest = _read_until(sock, b":1\r\n")
        return sock, rest

    def frame(self, payload: bytes) -> bytes:
        t = self.topic
        return b"*3\r\n$7\r\nPUBLISH\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
            len(t),
            t,
            len(payload),
            payload,
        )


class NatsProto(Proto):
    name = "nats"
    trailer = 2
    CONNECT = b'CONNECT {"verbose":false,"pedantic":false,"echo":false}\r\n'

    def publisher(self, ident: int) -> socket.socket:
        sock = _connect(self.port)
        _, rest = _read_until(sock, b"\r\n")  # INFO
        sock.sendall(self.CONNECT + b"PING\r\n")
        _read_until(sock, b"PONG\r\n", rest)
        _drain_forever(sock)
        return sock

    def subscriber(self, queue: str) -> tuple[socket.socket, bytes]:
        sock = _connect(self.port)
        _, rest = _read_until(sock, b"\r\n")
        sock.sendall(self.CONNECT + b"SUB %s 1\r\nPING\r\n" % self.topic)
        _, rest = _read_until(sock, b"PONG\r\n", rest)
        return sock, rest

    def frame(self, payload: bytes) -> bytes:
        return b"PUB %s %d\r\n%s\r\n" % (self.topic, len(payload), payload)


def make_proto(args: argparse.Namespace) -> Proto:
    topic = args.topic.encode()
    if args.proto == "fq":
        return FqProto(args.port, topic, args.queue_type)
    if args.proto == "redis":
        return RedisProto(args.port, topic)
    return NatsProto(args.port, topic)


def ready() -> None:
    print("READY", flush=True)


def report(**figures: object) -> None:
    print(json.dumps(figures), flush=True)


def wait_go() -> None:
    """Block until the harness says go (a line on stdin): every process starts together."""
    sys.stdin.readline()


def wait_eof() -> None:
    """Keep the connections until the harness closes stdin (it may say go first)."""
    while sys.stdin.readline():
        pass


# --- roles -----------------------------------------------------------------------------------


def run_pub(args: argparse.Namespace) -> None:
    proto = make_proto(args)
    sock = proto.publisher(args.ident)
    payload = os.urandom(args.size // 2 + 1).hex()[: args.size].encode()
    frame = proto.frame(payload)
    per_send = max(1, CHUNK // len(frame))
    block = frame * per_send
    if args.routes > 1:
        # Each message on the next of --routes routes: no two in a row share one.
        assert isinstance(proto, FqProto), "routes are an fq notion"
        per_send -= per_send % args.routes
        block = b"".join(proto.frame(payload, i % args.routes) for i in range(per_send))
    credit = Credit(args.credit) if args.credit else None
    subs, pubs = args.subs, args.pubs
    ready()
    wait_go()
    start = time.monotonic_ns()
    sent = 0
    count = args.count
    window = args.window
    while sent < count:
        n = min(per_send, count - sent)
        if credit is not None:
            while True:
                done = min(credit.get(i) for i in range(subs))
                if (sent + n) * pubs - done <= window:
                    break
                time.sleep(0.0002)
        sock.sendall(block if n == per_send else block[: n * len(frame)])
        sent += n
    end = time.monotonic_ns()
    tail = 0
    if args.tail and credit is not None:
        # Once everything is delivered, one more message: how long until it arrives?
        while min(credit.get(i) for i in range(subs)) < sent * pubs:
            time.sleep(0.0005)
        tail = time.monotonic_ns()
        sock.sendall(frame)
    report(sent=sent, start_ns=start, end_ns=end, tail_ns=tail)
    wait_go()  # keep the connection until the harness is done with the run


def _frame_size(proto: Proto, size: int, buf: bytes) -> int:
    """The size of each delivered frame, read from the first one in ``buf``."""
    if proto.name == "fq":
        # u8 ex, ex, u8 rt, rt, 16 id, u8 sender, sender, u8 nhops, hops, u32 len, payload
        pos = 1 + buf[0]
        pos += 1 + buf[pos] + 16
        pos += 1 + buf[pos]
        pos += 1 + 4 * buf[pos]
        return pos + 4 + size
    if proto.name == "redis":
        # *3 $7 message $n topic $size payload
        return len(b"*3\r\n$7\r\nmessage\r\n$%d\r\n%s\r\n$%d\r\n" % (
            len(proto.topic), proto.topic, size)) + size + 2  # fmt: skip
    head = buf[: buf.index(b"\r\n") + 2]
    return len(head) + size + 2


def run_sub(args: argparse.Namespace) -> None:
    proto = make_proto(args)
    sock, buf = proto.subscriber(f"{args.topic}-{args.slot}")
    credit = Credit(args.credit) if args.credit else None
    slot = args.slot
    ready()
    expected = args.count
    data = bytearray(buf)
    first = 0
    sock.settimeout(args.idle_timeout)
    while True:  # learn the frame size from the first frame
        try:
            fsize = _frame_size(proto, args.size, bytes(data))
            break
        except (IndexError, ValueError):
            chunk = sock.recv(CHUNK)
            if not chunk:
                raise ConnectionError("closed before the first frame") from None
            first = first or time.monotonic_ns()
            data += chunk
    total = len(data)
    target = expected * fsize
    if credit is not None:
        credit.set(slot, total // fsize)
    last = time.monotonic_ns()
    buffer = bytearray(1 << 20)
    view = memoryview(buffer)
    recv_into = sock.recv_into
    try:
        while total < target:
            n = recv_into(view)
            if not n:
                break
            total += n
            if credit is not None:
                credit.set(slot, total // fsize)
            last = time.monotonic_ns()
    except TimeoutError:
        pass
    if credit is not None:
        credit.set(slot, total // fsize)
    report(
        received=total // fsize,
        whole=total % fsize == 0,
        frame=fsize,
        first_ns=first,
        last_ns=last,
    )


def run_latpub(args: argparse.Namespace) -> None:
    proto = make_proto(args)
    sock = proto.publisher(args.ident)
    filler = b"x" * (args.size - 8)
    tick = 0.001
    ready()
    wait_go()
    start = time.monotonic_ns()
    end = start + int(args.seconds * 1e9)
    sent = 0
    frame = proto.frame
    rate = args.rate
    while True:
        now = time.monotonic_ns()
        if now >= end:
            break
        due = (now - start) * rate // 1_000_000_000 - sent
        if due > 0:
            ts = _TS.pack(now)
            one = frame(ts + filler)
            sock.sendall(one * due)
            sent += due
        time.sleep(max(0.0, tick - (time.monotonic_ns() - now) / 1e9) if due > 0 else tick / 4)
    report(sent=sent, start_ns=start, end_ns=time.monotonic_ns())
    wait_go()


def run_latsub(args: argparse.Namespace) -> None:
    proto = make_proto(args)
    sock, buf = proto.subscriber(f"{args.topic}-{args.slot}")
    ready()
    data = bytearray(buf)
    sock.settimeout(args.idle_timeout)
    fsize = 0
    latencies: list[int] = []
    pos = 0
    expected = args.count
    try:
        while len(latencies) < expected:
            chunk = sock.recv(CHUNK)
            if not chunk:
                break
            now = time.monotonic_ns()
            data += chunk
            if not fsize:
                try:
                    fsize = _frame_size(proto, args.size, bytes(data))
                except (IndexError, ValueError):
                    continue
            ts_at = fsize - proto.trailer - args.size
            while pos + fsize <= len(data):
                latencies.append(now - _TS.unpack_from(data, pos + ts_at)[0])
                pos += fsize
            del data[:pos]
            pos = 0
    except TimeoutError:
        pass
    report(received=len(latencies), lat_ns=latencies)


def run_hold(args: argparse.Namespace) -> None:
    field = b"hold\0mem:private,drop,backlog=%d,backlog_bytes=0" % args.backlog
    client = FqClient(args.port, b"hold", field, args.topic.encode())
    ready()
    wait_go()
    client.cmd.close()


def run_idle(args: argparse.Namespace) -> None:
    """Many quiet fq clients: set up, then answer heartbeats and time them."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sel = selectors.DefaultSelector()
    clients: list[FqClient] = []
    batch = 200
    for base in range(0, args.clients, batch):
        group = []
        for i in range(base, min(base + batch, args.clients)):
            group.append(FqClient(args.port, b"idle", b"idle%d" % i, None))
        for client in group:
            client.open_data()
        clients += group
    arrivals: list[list[int]] = [[] for _ in clients]
    for i, client in enumerate(clients):
        client.cmd.setblocking(False)
        sel.register(client.cmd, selectors.EVENT_READ, i)
    ready()
    wait_go()
    # Heartbeats asked for only now: while the others were being set up, nobody answered.
    hbreq = wire.encode(wire.HeartbeatRequest(args.hb_ms))
    for client in clients:
        client.cmd.sendall(hbreq)
    hb = wire.encode(wire.Heartbeat())
    errors = 0
    closed: set[int] = set()
    end = time.monotonic() + args.seconds
    while (left := end - time.monotonic()) > 0:
        for key, _ in sel.select(left):
            i = key.data
            client = clients[i]
            try:
                chunk = client.cmd.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                closed.add(i)
                sel.unregister(client.cmd)
                continue
            now = time.monotonic_ns()
            client.decoder.feed(chunk)
            while (frame := client.decoder.next_frame()) is not None:
                if isinstance(frame, wire.Heartbeat):
                    arrivals[i].append(now)
                    with contextlib.suppress(OSError):
                        client.cmd.send(hb)
                elif isinstance(frame, wire.ErrorReply):
                    errors += 1
    interval = args.hb_ms * 1_000_000
    gaps = [b - a for times in arrivals for a, b in itertools.pairwise(times)]
    late = [g - interval for g in gaps]
    report(
        clients=len(clients),
        connections=2 * len(clients),
        heartbeats=sum(map(len, arrivals)),
        gaps=len(gaps),
        max_late_ns=max(late) if late else None,
        p50_late_ns=sorted(late)[len(late) // 2] if late else None,
        p99_late_ns=sorted(late)[int(len(late) * 0.99)] if late else None,
        errors=errors,
        closed=len(closed),
    )
    wait_go()


ROLES: dict[str, Callable[[argparse.Namespace], None]] = {
    "pub": run_pub,
    "sub": run_sub,
    "latpub": run_latpub,
    "latsub": run_latsub,
    "hold": run_hold,
    "idle": run_idle,
}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.loadgen")
    p.add_argument("role", choices=sorted(ROLES))
    p.add_argument("--proto", choices=("fq", "redis", "nats"), default="fq")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--topic", default="bench")
    p.add_argument("--queue-type", default="mem", help="fq queue type and params")
    p.add_argument("--count", type=int, default=100_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--routes", type=int, default=1, help="fq publishers: routes to cycle")
    p.add_argument("--credit", help="shared credit file")
    p.add_argument("--window", type=int, default=50_000)
    p.add_argument("--subs", type=int, default=1, help="subscriber slots a publisher watches")
    p.add_argument("--pubs", type=int, default=1, help="publishers sharing the window")
    p.add_argument("--slot", type=int, default=0)
    p.add_argument("--tail", action="store_true", help="then time one more message")
    p.add_argument("--ident", type=int, default=0)
    p.add_argument("--rate", type=int, default=10_000)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--idle-timeout", type=float, default=10.0)
    p.add_argument("--backlog", type=int, default=2_000_000)
    p.add_argument("--clients", type=int, default=5_000)
    p.add_argument("--hb-ms", type=int, default=1000)
    args = p.parse_args(argv)
    ROLES[args.role](args)


if __name__ == "__main__":
    main()
