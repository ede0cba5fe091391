"""The JetStream load generator: raw NATS protocol bytes in a process of its own.

    python -m bench.jsload pub --proto jetstream --port P --stream S --count N --size 100 \
        --window 256
    python -m bench.jsload sub --proto jetstream --port P --stream S --count N [--replay]

``pub`` creates the stream if it is missing (file storage, limits retention, no limits on
messages or bytes, discard old), then publishes ``--count`` messages to it, each with a
reply subject of its own under one wildcard inbox subscription, at most ``--window``
without their PubAck. The frames are built before ``READY`` (one bytes object, every frame
the same length), so a send is a slice of it; the PubAcks are counted in bulk over the
buffer (one ``"seq":`` per ack), the exact frame walk taking over whenever anything else
is in it, so an error reply still fails the run.

``sub`` is an ephemeral push consumer: deliver policy all, ack policy none, flow control
(the server stops at its pending limit until the flow-control request is answered, so a
slow reader is paced, never dropped as a slow consumer) and idle heartbeats, as the NATS
clients' ordered consumer reads a stream from the start. It was the faster of the two on
nats-server 2.9.10 here: a pull consumer (ack policy none, batches of 50,000 or 200,000
kept two ahead) replayed 1,000,000 messages at 0.7 to 0.87 of its rate, the server's CPU
lower too, so the pull side waited on its requests. Without ``--replay`` the consumer is
made before ``READY`` and drains while the publisher runs; with it, at ``go``. Deliveries
are walked over one buffer, no object per message, most of them BLOCK at a time in a few C
calls (Reader.scan); the publisher's 8-byte big-endian sequence number (from 1) at the
start of each payload says whether every message came, in order (``whole``).

Like the other generators: ``READY``, a line on stdin (``go``), one JSON line, then the
connection is kept until stdin closes (docs/bench.md, "Durable peers: JetStream").
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import sys
import time
from typing import Any

from .loadgen import ready, report, wait_eof, wait_go

CRLF = b"\r\n"
PING = b"PING\r\n"
PONG = b"PONG\r\n"
READ_SIZE = 1 << 20
_U64 = struct.Struct(">Q")
# Deliveries checked at once when they are as long as the one before (docs in Reader.scan).
BLOCK = 32
CONNECT = (
    b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true,'
    b'"echo":false,"lang":"python-raw","version":"0"}\r\n'
)
API = b"$JS.API."
# A push consumer's idle heartbeat: also what carries a stalled flow control's subject.
HEARTBEAT_NS = 5_000_000_000


class JetStreamError(Exception):
    """An error reply from the server: an API or PubAck error, a status, or -ERR."""


# --- frames ----------------------------------------------------------------------------------


def pub_frame(subject: bytes, reply: bytes | None, payload: bytes) -> bytes:
    """A PUB frame, with a reply subject when ``reply`` is given."""
    if reply is None:
        return b"PUB %s %d\r\n%s\r\n" % (subject, len(payload), payload)
    return b"PUB %s %s %d\r\n%s\r\n" % (subject, reply, len(payload), payload)


def publish_block(
    subject: bytes, inbox: bytes, count: int, size: int, first: int = 1
) -> tuple[bytes, int]:
    """``count`` PUB frames in one bytes object, and the length of each: message ``i`` has
    the reply subject ``inbox.i`` (zero-padded, so every frame has one length) and the
    payload ``i`` (8 bytes, big-endian) then filler up to ``size`` bytes."""
    if size < 8:
        raise ValueError("--size must leave room for the 8-byte sequence number")
    width = len(str(first + count - 1))
    head = b"PUB %s %s.%%0%dd %d\r\n" % (subject, inbox, width, size)
    tail = b"x" * (size - 8) + CRLF
    pack = _U64.pack
    block = b"".join([head % i + pack(i) + tail for i in range(first, first + count)])
    return block, len(block) // count if count else 0


def stream_config(stream: str) -> dict[str, Any]:
    """The stream of the rows: on file, kept by limits, with no limit on count or bytes."""
    return {
        "name": stream,
        "subjects": [stream],
        "retention": "limits",
        "storage": "file",
        "discard": "old",
        "max_msgs": -1,
        "max_bytes": -1,
        "max_age": 0,
        "max_msgs_per_subject": -1,
        "max_msg_size": -1,
        "max_consumers": -1,
        "num_replicas": 1,
    }


def consumer_config(stream: str, deliver: bytes) -> dict[str, Any]:
    """An ephemeral push consumer of the whole stream, unacknowledged, flow-controlled."""
    return {
        "stream_name": stream,
        "config": {
            "deliver_subject": deliver.decode(),
            "deliver_policy": "all",
            "ack_policy": "none",
            "replay_policy": "instant",
            "flow_control": True,
            "idle_heartbeat": HEARTBEAT_NS,
            "mem_storage": True,
            "num_replicas": 1,
        },
    }


def _error_text(doc: dict[str, Any]) -> str:
    err = doc.get("error")
    if not isinstance(err, dict):
        return str(err)
    codes = " ".join(str(err[k]) for k in ("code", "err_code") if k in err)
    return f"{codes}: {err.get('description')}" if codes else str(err.get("description"))


# --- the reader ------------------------------------------------------------------------------


class Reader:
    """Server frames walked over one buffer: bytes in (:meth:`feed`), counts and replies
    out. What must be sent back (PONGs, flow-control answers) collects in ``out``.

    ``inbox`` is this connection's wildcard inbox: a reply to ``inbox.api-*`` is kept in
    ``replies``, a reply to any other token is a PubAck. Messages on subscription id 2 (a
    push consumer's deliver subject) are counted in ``received``, with ``whole`` false once
    a sequence number is not the one after the last; they come with the subject they were
    published on, ``subject``, which the inline walk looks for.
    """

    def __init__(self, inbox: bytes, subject: bytes = b"") -> None:
        self.buf = bytearray()
        self.pos = 0
        self.inbox = inbox + b"."
        self._data_prefix = b"MSG %s 2 " % subject if subject else b"\0"
        # The size of the last delivery (as its header line ends) and its frame after the
        # line: a run's messages have one size, so one endswith replaces a parse.
        self._size_suffix = b"\0"
        self._tail = 0
        # The last delivery's header line and whole frame lengths, and a Struct reading the
        # sequence numbers of BLOCK frames of that length in a row, by those lengths.
        self._head = self._flen = 0
        self._blocks: dict[tuple[int, int], struct.Struct] = {}
        self.out: list[bytes] = []
        self.replies: dict[bytes, dict[str, Any]] = {}
        self.pongs = 0
        self.acks = 0
        self.received = 0
        self.expected = 0  # the next sequence number; 0 before the first message
        self.first_seq = 0
        self.whole = True
        self.flow_controls = 0

    def feed(self, data: bytes) -> None:
        """Buffer ``data`` and walk every whole frame in the buffer."""
        buf = self.buf
        if self.pos:
            del buf[: self.pos]
            self.pos = 0
        buf += data
        self.scan()

    def feed_acks(self, data: bytes) -> None:
        """As :meth:`feed` for a publisher's buffer of PubAcks, counted in bulk."""
        buf = self.buf
        if self.pos:
            del buf[: self.pos]
            self.pos = 0
        buf += data
        self.scan_acks()

    def scan_acks(self) -> None:
        """PubAcks counted with a few C calls: each whole one ends in ``}\\r\\n`` and has one
        ``"seq":``. When the region holds anything but acks (and PINGs), an ``"error"``, or
        the rest holds what has no ``}`` to end it (a status, -ERR), the exact walk does it."""
        buf, pos = self.buf, self.pos
        cut = buf.rfind(b"}\r\n", pos) + 3
        if cut >= 3:
            n = buf.count(b'"seq":', pos, cut)
            pings = buf.count(PING, pos, cut)
            if (
                buf.count(b"MSG ", pos, cut) == n
                and buf.count(CRLF, pos, cut) == 2 * n + pings
                and buf.find(b'"error"', pos, cut) < 0
            ):
                self.acks += n
                self.out += [PONG] * pings
                self.pos = pos = cut
            else:
                self.scan()
                return
        if buf.find(b"HMSG", pos) >= 0 or buf.find(b"-ERR", pos) >= 0 or buf.find(PING, pos) >= 0:
            self.scan()

    def _block(self, head: int, flen: int) -> struct.Struct:
        key = (head, flen)
        if key not in self._blocks:
            self._blocks[key] = struct.Struct(">" + f"Q{flen - 8}x" * (BLOCK - 1) + "Q")
        return self._blocks[key]

    def scan(self) -> None:
        """Deliveries inline, any other frame by :meth:`_frame`.

        The headers of a run's deliveries change length only when a number in their reply
        subject gains or loses a digit, so most follow one as long as themselves. BLOCK of
        them are taken at once when the span holds BLOCK - 1 more delivery starts, its last
        header ends with the last size, and at the stride of the last frame's length are
        the sequence numbers that follow the last one's: a frame of another length would
        put the next reads in headers or filler. Otherwise (a size change, a gap, a
        flow-control request among them) the next BLOCK are walked one by one, which also
        says where a gap is.
        """
        buf = self.buf
        have = len(buf)
        pos = self.pos
        find, starts, ends, count = buf.find, buf.startswith, buf.endswith, buf.count
        u64 = _U64.unpack_from
        prefix, suffix, tail = self._data_prefix, self._size_suffix, self._tail
        marker = CRLF + prefix
        received, expected, whole = self.received, self.expected, self.whole
        head, flen = self._head, self._flen
        span = BLOCK * flen
        seqs = self._block(head, flen).unpack_from if flen else None
        exact = 0
        while True:
            if (
                not exact
                and seqs is not None
                and pos + span <= have
                and starts(prefix, pos)
                and count(marker, pos, pos + span) == BLOCK - 1
                and ends(suffix, pos + span - flen, pos + span - flen + head)
                and seqs(buf, pos + head + 2) == tuple(range(expected, expected + BLOCK))
            ):
                received += BLOCK
                expected += BLOCK
                pos += span
                continue
            exact = exact - 1 if exact else BLOCK
            nl = find(CRLF, pos, have)
            if nl < 0:
                break
            if starts(prefix, pos):
                # MSG <subject> 2 <$JS.ACK... reply> <size>
                if not ends(suffix, pos, nl):
                    size = int(buf[buf.rfind(b" ", pos, nl) + 1 : nl])
                    suffix, tail = b" %d" % size, size + 4
                    self._size_suffix, self._tail = suffix, tail
                end = nl + tail
                if end > have:
                    break
                seq = u64(buf, nl + 2)[0]
                if seq != expected:
                    if expected:
                        whole = False
                    else:
                        self.first_seq = seq
                expected = seq + 1
                received += 1
                if end - pos != flen or nl - pos != head:
                    head, flen = nl - pos, end - pos
                    span = BLOCK * flen
                    seqs = self._block(head, flen).unpack_from
                    self._head, self._flen = head, flen
                pos = end
                continue
            self.received, self.expected, self.whole = received, expected, whole
            end = self._frame(pos, nl, have)
            if end < 0:
                break
            received, expected, whole = self.received, self.expected, self.whole
            pos = end
        self.received, self.expected, self.whole = received, expected, whole
        self.pos = pos

    def _frame(self, pos: int, nl: int, have: int) -> int:
        """One frame that is not a plain delivery: where it ends, or -1 if not all in."""
        buf = self.buf
        line = bytes(buf[pos:nl])
        op = line[:5].split(b" ", 1)[0].upper()
        if op in (b"MSG", b"HMSG"):
            parts = line.split()
            total = int(parts[-1])
            end = nl + 2 + total + 2
            if end > have:
                return -1
            hlen = int(parts[-2]) if op == b"HMSG" else 0
            with_reply = len(parts) == (6 if op == b"HMSG" else 5)
            reply = parts[3] if with_reply else None
            headers = bytes(buf[nl + 2 : nl + 2 + hlen])
            payload = bytes(buf[nl + 2 + hlen : nl + 2 + total])
            self._message(parts[1], parts[2], reply, headers, payload)
            return end
        if op == b"PING":
            self.out.append(PONG)
        elif op == b"PONG":
            self.pongs += 1
        elif op == b"-ERR":
            raise JetStreamError(line.decode(errors="replace"))
        elif op not in (b"+OK", b"INFO"):
            raise JetStreamError(f"unexpected from the server: {line[:80]!r}")
        return nl + 2

    def _message(
        self, subject: bytes, sid: bytes, reply: bytes | None, headers: bytes, payload: bytes
    ) -> None:
        inbox = self.inbox
        token = subject[len(inbox) :] if subject.startswith(inbox) else None
        if headers:
            status = headers.split(CRLF, 1)[0]
            if status.startswith(b"NATS/1.0 100"):
                self._control(reply, headers)
                return
            if status.strip() != b"NATS/1.0":  # 503 no responders, 404, 408, 409 ...
                text = status.decode(errors="replace")
                if token is not None and token.startswith(b"api-"):
                    self.replies[token] = {"error": {"description": text}}
                    return
                raise JetStreamError(f"{subject.decode()}: {text}")
        if sid == b"2":
            seq = _U64.unpack_from(payload)[0]
            if seq != self.expected:
                if self.expected:
                    self.whole = False
                else:
                    self.first_seq = seq
            self.expected = seq + 1
            self.received += 1
            return
        if token is None:
            return
        if token.startswith(b"api-"):  # its caller decides what an error means (take_reply)
            self.replies[token] = json.loads(payload)
        elif b'"error"' in payload:
            raise JetStreamError(f"{token.decode()}: {_error_text(json.loads(payload))}")
        elif b'"seq":' in payload:
            self.acks += 1
        else:
            raise JetStreamError(f"not a PubAck on {token.decode()}: {payload[:200]!r}")

    def take_reply(self, token: bytes) -> dict[str, Any]:
        """The API reply kept under ``token``, taken; an error reply raises."""
        doc = self.replies.pop(token)
        if "error" in doc:
            raise JetStreamError(f"{token.decode()}: {_error_text(doc)}")
        return doc

    def _control(self, reply: bytes | None, headers: bytes) -> None:
        """A flow-control request is answered on its reply subject; an idle heartbeat that
        names a stalled flow control's subject, there."""
        if b"FlowControl" in headers and reply:
            self.flow_controls += 1
            self.out.append(pub_frame(reply, None, b""))
            return
        for line in headers.split(CRLF):
            if line.lower().startswith(b"nats-consumer-stalled:"):
                self.out.append(pub_frame(line.split(b":", 1)[1].strip(), None, b""))


# --- the connection --------------------------------------------------------------------------


class Conn:
    """A NATS connection: INFO read, CONNECT sent, the wildcard inbox subscribed (sid 1)
    and, for a consumer, its deliver subject (sid 2)."""

    def __init__(self, port: int, deliver: bool = False, subject: bytes = b"") -> None:
        tag = os.urandom(6).hex().encode()
        self.inbox = b"_INBOX." + tag
        self.deliver = b"_DLV." + tag if deliver else b""
        self.reader = Reader(self.inbox, subject)
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._requests = 0
        out = CONNECT + b"SUB %s.* 1\r\n" % self.inbox
        if deliver:
            out += b"SUB %s 2\r\n" % self.deliver
        self.sock.sendall(out + PING)
        while not self.reader.pongs:  # INFO, then the PONG: connected and subscribed
            self.pump()

    def pump(self) -> None:
        """One read walked, and whatever it asks for sent back."""
        chunk = self.sock.recv(READ_SIZE)
        if not chunk:
            raise ConnectionError(f"the server closed the connection: {bytes(self.reader.buf)!r}")
        self.reader.feed(chunk)
        self.flush()

    def flush(self) -> None:
        if self.reader.out:
            self.sock.sendall(b"".join(self.reader.out))
            self.reader.out.clear()

    def send_request(self, subject: bytes, body: dict[str, Any]) -> bytes:
        """A JetStream API request sent; the token its reply will be kept under."""
        self._requests += 1
        token = b"api-%d" % self._requests
        self.sock.sendall(pub_frame(subject, self.inbox + b"." + token, json.dumps(body).encode()))
        return token

    def await_reply(self, token: bytes) -> dict[str, Any]:
        while token not in self.reader.replies:
            self.pump()
        return self.reader.take_reply(token)

    def ensure_stream(self, stream: str) -> None:
        """The stream created, or there already with this configuration; else an error."""
        config = stream_config(stream)
        subject = API + b"STREAM.CREATE." + stream.encode()
        for attempt in range(3):
            try:
                self.await_reply(self.send_request(subject, config))
                return
            except JetStreamError:
                # Two connections creating it at once: 2.9 may refuse the second with
                # "subjects overlap" while the first is being made; once made, a create
                # of the same configuration succeeds.
                if attempt == 2:
                    raise
                time.sleep(0.1)


# --- roles -----------------------------------------------------------------------------------


def run_pub(args: argparse.Namespace) -> None:
    count, window = args.count, args.window
    conn = Conn(args.port)
    conn.ensure_stream(args.stream)
    block, flen = publish_block(args.stream.encode(), conn.inbox, count, args.size)
    view = memoryview(block)
    sock, reader = conn.sock, conn.reader
    recv, feed = sock.recv, reader.feed_acks
    ready()
    wait_go()
    start = time.monotonic_ns()
    sent = 0
    while reader.acks < count:
        room = min(window - (sent - reader.acks), count - sent)
        if room > 0:
            sock.sendall(view[sent * flen : (sent + room) * flen])
            sent += room
        chunk = recv(READ_SIZE)
        if not chunk:
            raise ConnectionError(f"the server closed the connection at ack {reader.acks}")
        feed(chunk)
        if reader.out:
            conn.flush()
    end = time.monotonic_ns()
    result = {"sent": sent, "confirmed": reader.acks, "start_ns": start, "end_ns": end}
    report(**result)
    wait_eof()
    sock.close()


def run_sub(args: argparse.Namespace) -> None:
    count = args.count
    conn = Conn(args.port, deliver=True, subject=args.stream.encode())
    conn.ensure_stream(args.stream)
    consumer = API + b"CONSUMER.CREATE." + args.stream.encode()
    body = consumer_config(args.stream, conn.deliver)
    start_ns = 0
    if not args.replay:
        # Live: the consumer is there before READY, so it drains while the publisher runs.
        conn.await_reply(conn.send_request(consumer, body))
        ready()
        wait_go()
    else:
        # Replay: timed from go, the consumer's creation included.
        ready()
        wait_go()
        start_ns = time.monotonic_ns()
        conn.send_request(consumer, body)  # its reply is walked with the deliveries
    sock, reader = conn.sock, conn.reader
    sock.settimeout(args.idle_timeout)
    recv, feed = sock.recv, reader.feed
    first_ns = 0
    # Heartbeats come while nothing does: a stall is no new message for the idle timeout.
    stall_ns = int(args.idle_timeout * 1e9)
    seen, seen_ns = 0, time.monotonic_ns()
    try:
        while reader.received < count:
            chunk = recv(READ_SIZE)
            if not chunk:
                raise ConnectionError(f"the server closed the connection after {reader.received}")
            feed(chunk)
            if reader.out:
                conn.flush()
            if reader.replies:  # the consumer's creation, walked with the deliveries
                reader.take_reply(next(iter(reader.replies)))
            if reader.received != seen:
                seen, seen_ns = reader.received, time.monotonic_ns()
                first_ns = first_ns or seen_ns
            elif time.monotonic_ns() - seen_ns > stall_ns:
                raise TimeoutError
    except TimeoutError:
        raise JetStreamError(
            f"no message for {args.idle_timeout} s after {reader.received} of {count}"
        ) from None
    last_ns = time.monotonic_ns()
    result = {
        "received": reader.received,
        "start_ns": start_ns,
        "first_ns": first_ns,
        "last_ns": last_ns,
        "whole": reader.whole and reader.received == count,
        "first_seq": reader.first_seq,
        "flow_controls": reader.flow_controls,
    }
    report(**result)
    sock.settimeout(None)
    wait_eof()
    sock.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.jsload")
    p.add_argument("role", choices=["pub", "sub"])
    p.add_argument("--proto", default="jetstream", help="ignored: the harness passes it")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--stream", default="bench")
    p.add_argument("--count", type=int, default=300_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--replay", action="store_true", help="sub: the consumer made at go")
    p.add_argument("--idle-timeout", type=float, default=30.0)
    args = p.parse_args(argv)
    try:
        (run_pub if args.role == "pub" else run_sub)(args)
    except (JetStreamError, ConnectionError) as exc:
        sys.exit(f"jsload {args.role}: {exc}")


if __name__ == "__main__":
    main()
