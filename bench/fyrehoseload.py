"""The fyrehose load generator: a publisher or a subscriber on a raw UDP socket, in a process
of its own (bench/fyrehosesuite.py runs them).

    python -m bench.fyrehoseload fhpub --fh-port P --count N --size 100 --tag T \\
        --credit FILE --subs 4 [--window 256]
    python -m bench.fyrehoseload fhsub --fh-port P --count N --tag T --credit FILE \\
        --slot I [--loss 0.05] [--seed S]

docs/bench.md, "fyrehose rows", says how each works and what its JSON line holds.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import struct
import sys
import threading
import time
from typing import Any

from fqbroker.protocols.fyrehose import wire as fh

from .loadgen import Credit

RECEIVE_BUFFER = 4 << 20
KEEPALIVE_SECONDS = 1.0
REREQUEST_NS = 200_000_000
TAIL_NS = 200_000_000
READY_SECONDS = 30.0
_PUSH = struct.Struct(">BH6xQQ")  # a final-form PUSH's header, then the tag and the index
_DELIVER = struct.Struct(">BH6sQQ")  # type, LENGTH, SEQUENCE, tag, index
MARK = 16  # the tag and the index


def _socket(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
    sock.bind(("127.0.0.1", 0))
    sock.connect(("127.0.0.1", port))
    return sock


def run_pub(args: argparse.Namespace) -> None:
    count, window = args.count, args.window
    pad = b"x" * max(0, args.size - MARK)
    credit = Credit(args.credit)
    slots = range(args.subs)
    sock = _socket(args.fh_port)
    print("READY", flush=True)
    sys.stdin.readline()
    start = time.monotonic_ns()
    pack, send, length = _PUSH.pack, sock.send, MARK + len(pad)
    sent = 0
    low, progress_at = 0, time.monotonic()
    while sent < count:
        room = min(window - (sent - low), count - sent)
        for i in range(sent, sent + room):
            send(pack(fh.PUSH, length, args.tag, i) + pad)
        sent += max(0, room)
        seen = min(credit.get(s) for s in slots)
        if seen > low:
            low, progress_at = seen, time.monotonic()
        elif room <= 0:
            if time.monotonic() - progress_at > 5.0:
                break  # the subscribers are gone or stuck: report what was sent
            time.sleep(0.0002)
    end = time.monotonic_ns()
    print(json.dumps({"sent": sent, "start_ns": start, "end_ns": end}), flush=True)
    sys.stdin.readline()
    sock.close()


class Sub:
    """One subscriber's state: the run's messages seen, and with loss its gaps."""

    def __init__(self, args: argparse.Namespace, sock: socket.socket) -> None:
        self.args = args
        self.sock = sock
        self.rng = random.Random(args.seed)
        self.loss = args.loss
        host, port = sock.getsockname()
        self.token = self.rng.randbytes(fh.TOKEN_SIZE)
        self.keepalive = fh.encode(fh.Keepalive(host, port, token=self.token))
        self.addr = (host, port)
        self.seen = bytearray(args.count)
        self.received = self.duplicates = self.shifted = 0
        self.first_ns = self.last_ns = 0
        self.base = 0  # the sequence of index 0, from the first message of the run
        self.high = 0  # the highest sequence of the run seen
        self.missing: dict[int, int] = {}  # sequence: when its gap was detected (ns)
        self.asked: dict[int, int] = {}  # sequence: when it was last REQUESTed (ns)
        self.went_missing = self.recovered = self.requests = 0
        self.dropped_in = self.dropped_out = 0
        self.fill_us: list[int] = []
        self.keepalive_at = 0.0

    def send(self, datagram: bytes) -> None:
        if self.loss and self.rng.random() < self.loss:
            self.dropped_out += 1
            return
        self.sock.send(datagram)

    def tick(self) -> None:
        now = time.monotonic()
        if now >= self.keepalive_at:
            self.send(self.keepalive)
            self.keepalive_at = now + KEEPALIVE_SECONDS

    def acked(self, deadline: float) -> None:
        """KEEPALIVE until its KEEPALIVE-ACK: the broker is up and this one subscribed."""
        ack = fh.encode(fh.KeepaliveAck(self.token))
        self.sock.settimeout(0.2)
        while time.monotonic() < deadline:
            self.tick()
            try:
                if self.sock.recv(65535) == ack:
                    return
            except TimeoutError:
                self.keepalive_at = 0.0
        raise TimeoutError("no KEEPALIVE-ACK from the broker")

    def detect(self, upto: int, now: int) -> None:
        """Sequences after the highest seen up to ``upto`` (exclusive) are missing."""
        for seq in range(self.high + 1, upto):
            self.missing[seq] = now
        self.went_missing += max(0, upto - self.high - 1)

    def arrived(self, seq: int, index: int, now: int) -> None:
        if self.base == 0:
            self.base = seq - index
            self.high = self.base - 1  # the run's first messages may be missing already
        elif seq - index != self.base:
            self.shifted += 1
        if index >= len(self.seen) or self.seen[index]:
            self.duplicates += 1
            return
        self.seen[index] = 1
        self.received += 1
        if self.first_ns == 0:
            self.first_ns = now
        self.last_ns = now
        if seq in self.missing:
            self.fill_us.append((now - self.missing.pop(seq)) // 1000)
            self.asked.pop(seq, None)
            self.recovered += 1
        elif seq > self.high:
            if self.loss:
                self.detect(seq, now)
            self.high = seq

    def request(self, now: int) -> None:
        """REQUEST every missing sequence not asked for within REREQUEST_NS, as ranges."""
        due = sorted(s for s in self.missing if now - self.asked.get(s, 0) >= REREQUEST_NS)
        first = last = 0
        for seq in [*due, 0]:
            if first and seq == last + 1 and seq - first < 4096:
                last = seq
                continue
            if first:
                self.send(fh.encode(fh.Request(*self.addr, first, last)))
                self.requests += 1
            first = last = seq
        for seq in due:
            self.asked[seq] = now

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "received": self.received, "duplicates": self.duplicates, "shifted": self.shifted,
            "first_ns": self.first_ns, "last_ns": self.last_ns,
        }  # fmt: skip
        if self.loss:
            out.update(
                missing=self.went_missing, recovered=self.recovered, fill_us=self.fill_us,
                requests=self.requests, dropped_in=self.dropped_in, dropped_out=self.dropped_out,
            )  # fmt: skip
        return out


def run_sub(args: argparse.Namespace) -> None:
    sock = _socket(args.fh_port)
    sub = Sub(args, sock)
    sub.acked(time.monotonic() + READY_SECONDS)
    credit = Credit(args.credit)
    go = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), go.set()), daemon=True).start()
    print("READY", flush=True)
    count, tag, loss, rng = args.count, args.tag, args.loss, sub.rng
    unpack, deliver, size = _DELIVER.unpack_from, fh.DELIVER, _DELIVER.size
    gaps = 0
    sock.settimeout(0.05)
    idle_ns = int(args.idle * 1e9)
    while not go.wait(0.2):
        sub.tick()  # still subscribed when the run starts
    quiet_since = asked_at = time.monotonic_ns()
    give_up = quiet_since + int((READY_SECONDS + count / 1000) * 1e9)
    while sub.received < count:
        sub.tick()
        now = time.monotonic_ns()
        if loss and now - asked_at > REREQUEST_NS // 4:
            asked_at = now
            if sub.base and now - quiet_since > TAIL_NS:
                sub.detect(sub.base + count, now)  # a lost tail: every one not seen
                sub.high = max(sub.high, sub.base + count - 1)
            sub.request(now)
        try:
            data = sock.recv(65535)
        except TimeoutError:
            if (sub.received and now - quiet_since > idle_ns) or now > give_up:
                break  # nothing for a long while: the rest is not coming
            continue
        if loss and rng.random() < loss:
            sub.dropped_in += 1
            continue
        if len(data) >= size and data[0] == deliver:
            _, _, seq, t, index = unpack(data)
            if t == tag:
                quiet_since = now = time.monotonic_ns()
                sub.arrived(int.from_bytes(seq, "big"), index, now)
                credit.set(args.slot, max(credit.get(args.slot), index + 1))
                if loss and sub.went_missing > gaps:
                    gaps = sub.went_missing
                    sub.request(now)  # a new gap is asked for at once
    print(json.dumps(sub.result()), flush=True)
    sys.stdin.readline()
    sock.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.fyrehoseload")
    p.add_argument("role", choices=["fhpub", "fhsub"])
    p.add_argument("--proto", default="fq", help="ignored: the harness passes it to every role")
    p.add_argument("--port", type=int, help="the broker's fq port (unused)")
    p.add_argument("--fh-port", type=int, required=True)
    p.add_argument("--count", type=int, default=100_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--tag", type=int, default=1)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--credit", required=True)
    p.add_argument("--subs", type=int, default=4)
    p.add_argument("--slot", type=int, default=0)
    p.add_argument("--loss", type=float, default=0.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--idle", type=float, default=3.0, help="fhsub: give up after this quiet")
    args = p.parse_args(argv)
    if args.role == "fhpub":
        run_pub(args)
    else:
        run_sub(args)


if __name__ == "__main__":
    main()
