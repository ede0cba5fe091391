"""The AMQP 0-9-1 load generator: a lean publisher or consumer in a process of its own.

    python -m bench.amqpload pub --port P --queue Q --queue-type classic|quorum \\
        --count N --size 100 --window 1000
    python -m bench.amqpload sub --port P --queue Q --queue-type classic|quorum --count N

Raw protocol bytes, no client library (docs/bench.md, "Durable peers"). Both log in as
guest/guest on vhost "/", take the server's frame_max, switch heartbeats off (a generator
waits on stdin between READY and go), open channel 1 and declare the queue durable, with
``x-queue-type: quorum`` when asked.

- ``pub`` turns on publisher confirms (confirm.select) and, at go, publishes ``--count``
  persistent messages (delivery_mode 2) of ``--size`` bytes to the default exchange with
  the queue's name as routing key, never more than ``--window`` unconfirmed. Each message
  is three frames (basic.publish, its content header, its body) encoded from a template
  made once: per message only the sequence number in the body's first 8 bytes changes,
  and the messages a window lets go are written with one sendall. basic.ack (single or
  multiple) counts confirms; a basic.nack fails the run. JSON: ``sent``, ``confirmed``,
  ``start_ns`` (go), ``end_ns`` (the last confirm's arrival).
- ``sub`` consumes with ``no_ack`` (auto-ack) by default, which RabbitMQ 3.10 serves
  faster than manual acks (``--ack manual``: basic.qos ``--prefetch``, one basic.ack with
  ``multiple`` every ``--ack-every`` deliveries): on a classic queue 29k to 52k against
  15k to 24k msg/s, the server's CPU 20 to 28 against 35 to 51 us a message (300,000
  messages of 100 B, window 1000, prefetch 2,000 or 20,000); on a quorum queue the same
  within the noise. It is READY once basic.consume-ok arrived and counts deliveries until
  ``--count``. JSON: ``received``,
  ``first_ns``, ``last_ns`` (the first and last delivery's arrival), ``whole`` (every body
  had the expected size and the next sequence number).

Incoming bytes go to one buffer that is walked with struct at an offset, no object per
frame, so the generator spends its time on the socket. Like bench/loadgen.py it prints
``READY``, waits for ``go`` on stdin, prints one JSON line and then waits for stdin to
close before it closes the connection (connection.close, close-ok).
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import time
from collections.abc import Mapping

from .loadgen import ready, report, wait_eof, wait_go

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_END = 0xCE
METHOD, HEADER, BODY, HEARTBEAT = 1, 2, 3, 8
CHANNEL = 1  # the one channel a generator uses
READ_SIZE = 1 << 20

_FRAME = struct.Struct(">BHI")  # type, channel, payload size; the payload; 0xCE
_CLASS_METHOD = struct.Struct(">I")  # class id and method id as one number
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_ACK = struct.Struct(">QB")  # delivery tag, bits (multiple first)
# A delivery's three frames, each head and what a consumer reads of it in one call.
_METHOD_HEAD = struct.Struct(">BHII")  # type, channel, size, class and method
_HEADER_HEAD = struct.Struct(">BHIHHQ")  # type, channel, size, class, weight, body size
_BODY_HEAD = struct.Struct(">BHIQ")  # type, channel, size, the sequence number


def _id(class_id: int, method_id: int) -> int:
    return class_id << 16 | method_id


CONNECTION_START = _id(10, 10)
CONNECTION_TUNE = _id(10, 30)
CONNECTION_OPEN_OK = _id(10, 41)
CONNECTION_CLOSE = _id(10, 50)
CONNECTION_CLOSE_OK = _id(10, 51)
CHANNEL_OPEN_OK = _id(20, 11)
CHANNEL_CLOSE = _id(20, 40)
QUEUE_DECLARE_OK = _id(50, 11)
BASIC_QOS_OK = _id(60, 11)
BASIC_CONSUME_OK = _id(60, 21)
BASIC_DELIVER = _id(60, 60)
BASIC_ACK = _id(60, 80)
BASIC_NACK = _id(60, 120)
CONFIRM_SELECT_OK = _id(85, 11)


class AmqpError(Exception):
    """The server refused or closed: its reply code and text, or a frame out of place."""


# --- encoding ----------------------------------------------------------------------------------


def shortstr(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    if len(raw) > 255:
        raise ValueError(f"a shortstr holds at most 255 bytes, not {len(raw)}")
    return bytes([len(raw)]) + raw


def longstr(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return _U32.pack(len(raw)) + raw


def table(fields: Mapping[str, str | bool]) -> bytes:
    """A field table of long strings ('S') and booleans ('t'), what a generator sends."""
    out = bytearray()
    for name, value in fields.items():
        out += shortstr(name)
        if isinstance(value, bool):
            out += b"t" + bytes([value])
        else:
            out += b"S" + longstr(value)
    return longstr(bytes(out))


def frame(kind: int, channel: int, payload: bytes) -> bytes:
    return _FRAME.pack(kind, channel, len(payload)) + payload + b"\xce"


def method(channel: int, class_id: int, method_id: int, args: bytes = b"") -> bytes:
    return frame(METHOD, channel, struct.pack(">HH", class_id, method_id) + args)


def start_ok(user: str = "guest", password: str = "guest") -> bytes:
    props = table({"product": "fqbroker bench/amqpload", "platform": "Python"})
    response = b"\x00" + user.encode() + b"\x00" + password.encode()
    return method(0, 10, 11, props + shortstr("PLAIN") + longstr(response) + shortstr("en_US"))


def tune_ok(channel_max: int, frame_max: int, heartbeat: int = 0) -> bytes:
    return method(0, 10, 31, struct.pack(">HIH", channel_max, frame_max, heartbeat))


def connection_open(vhost: str = "/") -> bytes:
    return method(0, 10, 40, shortstr(vhost) + shortstr("") + b"\x00")


def connection_close() -> bytes:
    return method(0, 10, 50, struct.pack(">H", 200) + shortstr("bye") + struct.pack(">HH", 0, 0))


def channel_open(channel: int = CHANNEL) -> bytes:
    return method(channel, 20, 10, shortstr(""))


def queue_declare(queue: str, queue_type: str, channel: int = CHANNEL) -> bytes:
    """Durable, not exclusive, not auto-delete; a quorum queue says so in its arguments."""
    args = {"x-queue-type": "quorum"} if queue_type == "quorum" else {}
    durable = 0x02  # bits: passive, durable, exclusive, auto-delete, no-wait
    return method(channel, 50, 10, b"\x00\x00" + shortstr(queue) + bytes([durable]) + table(args))


def confirm_select(channel: int = CHANNEL) -> bytes:
    return method(channel, 85, 10, b"\x00")


def basic_qos(prefetch: int, channel: int = CHANNEL) -> bytes:
    return method(channel, 60, 10, struct.pack(">IHB", 0, prefetch, 0))


def basic_consume(queue: str, no_ack: bool, channel: int = CHANNEL) -> bytes:
    bits = 0x02 if no_ack else 0x00  # bits: no-local, no-ack, exclusive, no-wait
    args = b"\x00\x00" + shortstr(queue) + shortstr("") + bytes([bits]) + table({})
    return method(channel, 60, 20, args)


def basic_ack(tag: int, multiple: bool, channel: int = CHANNEL) -> bytes:
    return method(channel, 60, 80, _ACK.pack(tag, multiple))


def content_header(body_size: int, channel: int = CHANNEL) -> bytes:
    """basic's content header with one property, delivery_mode 2 (persistent)."""
    flags = 0x1000  # property flags, highest bit first: content-type, content-encoding,
    # headers, delivery-mode, ...
    return frame(HEADER, channel, struct.pack(">HHQHB", 60, 0, body_size, flags, 2))


def publish_template(queue: str, size: int, frame_max: int) -> tuple[bytes, bytes]:
    """``(before, after)``: a message with sequence number ``seq`` is ``before +
    seq.to_bytes(8, "big") + after`` (basic.publish to the default exchange, the content
    header, the body in frames of at most ``frame_max`` bytes; the body is the sequence
    number then ``size - 8`` bytes of x)."""
    if size < 8:
        raise ValueError("a message holds at least its 8-byte sequence number")
    publish = method(CHANNEL, 60, 40, b"\x00\x00" + shortstr("") + shortstr(queue) + b"\x00")
    body = b"x" * (size - 8)
    room = frame_max - 8  # a frame's header and end
    first, rest = body[: room - 8], body[room - 8 :]
    before = publish + content_header(size) + _FRAME.pack(BODY, CHANNEL, 8 + len(first))
    after = first + b"\xce"
    for at in range(0, len(rest), room):
        after += frame(BODY, CHANNEL, rest[at : at + room])
    return before, after


# --- decoding ----------------------------------------------------------------------------------


def parse_close(payload: bytes | bytearray | memoryview, at: int = 4) -> str:
    """A connection.close or channel.close's reply code and text, for an error."""
    code = _U16.unpack_from(payload, at)[0]
    text = bytes(payload[at + 3 : at + 3 + payload[at + 2]]).decode(errors="replace")
    return f"{code} {text}"


class Confirms:
    """Publisher confirms read from the byte stream: ``confirmed`` counts the distinct
    delivery tags acked so far (tags are 1, 2, ...: one per publish since confirm.select).

    A multiple ack covers every tag up to its own; a single ack one tag, maybe ahead of
    the rest, kept in ``ahead`` until a multiple one or the tags before it catch up.
    """

    def __init__(self) -> None:
        self.buf = bytearray()
        self.upto = 0  # every tag <= upto is confirmed
        self.ahead: set[int] = set()  # single acks above upto
        self.confirmed = 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        buf = self.buf
        buf += data
        have = len(buf)
        pos = 0
        unpack_frame, unpack_id, unpack_ack = (
            _FRAME.unpack_from,
            _CLASS_METHOD.unpack_from,
            _ACK.unpack_from,
        )
        while have - pos >= 8:
            kind, _channel, size = unpack_frame(buf, pos)
            end = pos + 8 + size
            if end > have:
                break
            if buf[end - 1] != FRAME_END:
                raise AmqpError(f"frame of type {kind} without its end octet")
            if kind == METHOD:
                what = unpack_id(buf, pos + 7)[0]
                if what == BASIC_ACK:
                    tag, bits = unpack_ack(buf, pos + 11)
                    self._ack(tag, bool(bits & 1))
                elif what == BASIC_NACK:
                    tag, bits = unpack_ack(buf, pos + 11)
                    raise AmqpError(f"basic.nack of delivery tag {tag} (multiple: {bits & 1})")
                elif what in (CONNECTION_CLOSE, CHANNEL_CLOSE):
                    raise AmqpError(f"the server closed: {parse_close(buf[pos + 7 : end])}")
            pos = end
        if pos:
            del buf[:pos]

    def _ack(self, tag: int, multiple: bool) -> None:
        upto = self.upto
        if multiple:
            if tag > upto:
                ahead = self.ahead
                if ahead:
                    covered = {t for t in ahead if t <= tag}
                    ahead -= covered
                    self.confirmed += tag - upto - len(covered)
                else:
                    self.confirmed += tag - upto
                self.upto = upto = tag
        elif tag > upto and tag not in self.ahead:
            self.ahead.add(tag)
            self.confirmed += 1
        ahead = self.ahead
        while upto + 1 in ahead:
            upto += 1
            ahead.discard(upto)
        self.upto = upto


class Deliveries:
    """basic.deliver messages counted from the byte stream: ``received``, the last
    ``tag``, and ``whole`` while every body had ``size`` bytes and, in its first 8, the
    sequence number after the previous one's, from 0."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.buf = bytearray()
        self.received = 0
        self.tag = 0
        self.whole = True
        self.expected = 0  # the next sequence number: the publisher's start at 0
        self.body_size = 0  # the current message's, from its content header
        self.body_have = -1  # its body bytes read so far; -1: no content header yet

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        buf = self.buf
        buf += data
        have = len(buf)
        pos = 0
        unpack_frame, unpack_id, u64 = (
            _FRAME.unpack_from,
            _CLASS_METHOD.unpack_from,
            _U64.unpack_from,
        )
        method_head, header_head, body_head = (
            _METHOD_HEAD.unpack_from,
            _HEADER_HEAD.unpack_from,
            _BODY_HEAD.unpack_from,
        )
        received, body_size, body_have, expected, tag = (
            self.received,
            self.body_size,
            self.body_have,
            self.expected,
            self.tag,
        )
        whole = self.whole
        want = self.size
        while True:
            # The common case first: a whole message in the buffer, its body in one frame,
            # taken in four struct calls; anything else goes frame by frame below.
            if body_have < 0 and have - pos >= 12:
                kind, _channel, size, what = method_head(buf, pos)
                at_header = pos + 8 + size
                if kind == METHOD and what == BASIC_DELIVER and at_header + 22 <= have:
                    hkind, _channel, size, _class, _weight, bsize = header_head(buf, at_header)
                    at_body = at_header + 8 + size
                    if hkind == HEADER and at_body + 15 <= have:
                        bkind, _channel, size, seq = body_head(buf, at_body)
                        end = at_body + 8 + size
                        if bkind == BODY and size == bsize and end <= have:
                            if not buf[at_header - 1] == buf[at_body - 1] == buf[end - 1] == 0xCE:
                                raise AmqpError("a delivery's frame without its end octet")
                            tag = u64(buf, pos + 12 + buf[pos + 11])[0]  # past the ctag
                            if seq != expected or bsize != want:
                                whole = False
                            expected = seq + 1
                            received += 1
                            pos = end
                            continue
            if have - pos < 8:
                break
            kind, _channel, size = unpack_frame(buf, pos)
            end = pos + 8 + size
            if end > have:
                break
            if kind == BODY:
                if body_have == 0:
                    seq = u64(buf, pos + 7)[0] if size >= 8 else -2
                    if seq != expected:
                        whole = False
                    expected = seq + 1
                elif body_have < 0:  # a body frame without its content header
                    whole = False
                    body_have = 0
                body_have += size
                if body_have >= body_size:
                    if body_have != body_size or body_size != want:
                        whole = False
                    received += 1
                    body_have = -1
            elif kind == HEADER:
                body_size = u64(buf, pos + 11)[0]
                body_have = 0
                if body_size == 0:  # no body frame follows
                    whole = False
                    received += 1
                    body_have = -1
            elif kind == METHOD:
                what = unpack_id(buf, pos + 7)[0]
                if what == BASIC_DELIVER:
                    tag = u64(buf, pos + 12 + buf[pos + 11])[0]  # after the consumer tag
                elif what in (CONNECTION_CLOSE, CHANNEL_CLOSE):
                    raise AmqpError(f"the server closed: {parse_close(buf[pos + 7 : end])}")
            if buf[end - 1] != FRAME_END:
                raise AmqpError(f"frame of type {kind} without its end octet")
            pos = end
        if pos:
            del buf[:pos]
        self.received, self.body_size, self.body_have, self.expected, self.tag = (
            received,
            body_size,
            body_have,
            expected,
            tag,
        )
        self.whole = whole


# --- the connection ----------------------------------------------------------------------------


class Connection:
    """A blocking AMQP connection for the set-up and close: one method at a time."""

    def __init__(self, port: int, timeout: float | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.frame_max = 131072

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_method(self) -> tuple[int, bytes]:
        """The next method frame's class and method as one number, and its payload;
        heartbeats skipped. A close from the server raises with its reason."""
        while True:
            if len(self.buf) >= 8:
                kind, _channel, size = _FRAME.unpack_from(self.buf, 0)
                end = 8 + size
                if len(self.buf) >= end:
                    payload = bytes(self.buf[7 : end - 1])
                    del self.buf[:end]
                    if kind == HEARTBEAT:
                        continue
                    if kind != METHOD:
                        raise AmqpError(f"frame of type {kind} where a method was expected")
                    what = _CLASS_METHOD.unpack_from(payload, 0)[0]
                    if what in (CONNECTION_CLOSE, CHANNEL_CLOSE):
                        raise AmqpError(f"the server closed: {parse_close(payload)}")
                    return what, payload
            chunk = self.sock.recv(65536)
            if not chunk:
                raise AmqpError("the server closed the connection")
            self.buf += chunk

    def expect(self, what: int, name: str) -> bytes:
        got, payload = self.read_method()
        if got != what:
            raise AmqpError(f"{got >> 16}.{got & 0xFFFF} where {name} was expected")
        return payload

    def open(self, queue: str, queue_type: str) -> None:
        """Log in, tune, open channel 1 and declare the queue."""
        self.login()
        self.send(channel_open())
        self.expect(CHANNEL_OPEN_OK, "channel.open-ok")
        self.send(queue_declare(queue, queue_type))
        self.expect(QUEUE_DECLARE_OK, "queue.declare-ok")

    def login(self) -> None:
        """The protocol header, log in, tune, and open the vhost."""
        self.send(PROTOCOL_HEADER)
        self.expect(CONNECTION_START, "connection.start")
        self.send(start_ok())
        tune = self.expect(CONNECTION_TUNE, "connection.tune")
        channel_max, frame_max, _heartbeat = struct.unpack_from(">HIH", tune, 4)
        self.frame_max = frame_max or 131072  # 0: no limit of the server's
        self.send(tune_ok(channel_max, self.frame_max, 0))
        self.send(connection_open())
        self.expect(CONNECTION_OPEN_OK, "connection.open-ok")

    def close(self) -> None:
        """connection.close and its close-ok, or whatever the server does within 5 s."""
        try:
            self.sock.settimeout(5)
            self.send(connection_close())
            while self.read_method()[0] != CONNECTION_CLOSE_OK:
                pass
        except (OSError, AmqpError):
            pass
        finally:
            self.sock.close()


def run_pub(args: argparse.Namespace) -> None:
    count, window = args.count, args.window
    conn = Connection(args.port)
    conn.open(args.queue, args.queue_type)
    conn.send(confirm_select())
    conn.expect(CONFIRM_SELECT_OK, "confirm.select-ok")
    before, after = publish_template(args.queue, args.size, conn.frame_max)
    confirms = Confirms()
    confirms.feed(bytes(conn.buf))  # nothing, unless the server was quick
    sock = conn.sock
    pack = _U64.pack
    parts: list[bytes] = []  # before, seq, after for each message of a write
    scratch = bytearray(65536)
    view = memoryview(scratch)
    ready()
    wait_go()
    start = time.monotonic_ns()
    sent = 0
    while confirms.confirmed < count:
        room = min(window - (sent - confirms.confirmed), count - sent)
        if room > 0:
            if len(parts) != 3 * room:
                parts = [before, b"", after] * room
            parts[1::3] = map(pack, range(sent, sent + room))
            sock.sendall(b"".join(parts))
            sent += room
        n = sock.recv_into(scratch)
        if not n:
            raise AmqpError(f"the server closed the connection at {confirms.confirmed} confirms")
        confirms.feed(view[:n])
    end = time.monotonic_ns()
    result = {"sent": sent, "confirmed": confirms.confirmed, "start_ns": start, "end_ns": end}
    report(**result)
    wait_eof()
    conn.close()


def run_sub(args: argparse.Namespace) -> None:
    count = args.count
    manual = args.ack == "manual"
    conn = Connection(args.port)
    conn.open(args.queue, args.queue_type)
    if manual:
        conn.send(basic_qos(args.prefetch))
        conn.expect(BASIC_QOS_OK, "basic.qos-ok")
    conn.send(basic_consume(args.queue, no_ack=not manual))
    conn.expect(BASIC_CONSUME_OK, "basic.consume-ok")
    got = Deliveries(args.size)
    sock = conn.sock
    ready()
    wait_go()
    if conn.buf:  # deliveries read with the consume-ok (a queue not empty at start)
        got.feed(bytes(conn.buf))
    first_ns = time.monotonic_ns() if got.received else 0
    acked = 0
    ack_every = args.ack_every
    # recv_into a buffer made once: recv(1 MiB) would allocate (mmap) 1 MiB a call.
    scratch = bytearray(READ_SIZE)
    view = memoryview(scratch)
    while got.received < count:
        n = sock.recv_into(scratch)
        if not n:
            raise AmqpError(f"the server closed the connection after {got.received} deliveries")
        if not first_ns:
            first_ns = time.monotonic_ns()
        got.feed(view[:n])
        if manual and got.tag - acked >= ack_every:
            sock.sendall(basic_ack(got.tag, True))
            acked = got.tag
    last_ns = time.monotonic_ns()
    if manual and got.tag > acked:
        sock.sendall(basic_ack(got.tag, True))
    result = {
        "received": got.received,
        "first_ns": first_ns,
        "last_ns": last_ns,
        "whole": got.whole and got.received == count,
    }
    report(**result)
    wait_eof()
    conn.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.amqpload")
    p.add_argument("role", choices=["pub", "sub"])
    p.add_argument("--proto", default="amqp", help="ignored: the harness passes it to every role")
    p.add_argument("--port", type=int, required=True, help="the server's AMQP port")
    p.add_argument("--queue", default="bench")
    p.add_argument("--queue-type", choices=["classic", "quorum"], default="classic")
    p.add_argument("--count", type=int, default=300_000)
    p.add_argument("--size", type=int, default=100, help="body bytes, at least 8")
    p.add_argument("--window", type=int, default=1000, help="pub: unconfirmed at most")
    p.add_argument("--ack", choices=["auto", "manual"], default="auto", help="sub")
    p.add_argument("--prefetch", type=int, default=2000, help="sub, manual acks")
    p.add_argument("--ack-every", type=int, default=500, help="sub, manual acks")
    args = p.parse_args(argv)
    if args.size < 8:
        p.error("--size must be at least 8 (the sequence number)")
    try:
        if args.role == "pub":
            run_pub(args)
        else:
            run_sub(args)
    except AmqpError as exc:
        sys.exit(f"amqpload {args.role}: {exc}")


if __name__ == "__main__":
    main()
