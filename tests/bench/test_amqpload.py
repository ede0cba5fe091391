"""The AMQP 0-9-1 generator's codec against bytes written out from the spec, its roles
against a scripted server, and the RabbitMQ peer's row text where rabbitmq-server is not
installed.

The expected bytes are spelled field by field from AMQP 0-9-1 (section 4.2.3: a frame is
type octet, channel short, size long, payload, 0xCE; 4.2.4: a method payload starts with
class id and method id shorts; 4.2.6: a content header is class id, weight, body size
longlong, property flags, then the properties set) and its class list (basic 60: publish
40, deliver 60, ack 80, nack 120; queue 50: declare 10; channel 20: open 10). No
RabbitMQ: CI has none, and a live run is by hand (docs/bench.md, "Durable peers").
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import amqpload as amqp
from bench.rabbit import RabbitMQ
from tests.bench import roles


def hexb(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


# basic.deliver of consumer tag "ct", delivery tag T, not redelivered, exchange "", routing
# key "q": its payload is 4 + 3 + 8 + 1 + 1 + 2 = 19 bytes.
def deliver(tag: int) -> bytes:
    return hexb(f"01 0001 00000013 003c 003c 02 6374 {tag:016x} 00 00 01 71 ce")


def header(size: int) -> bytes:
    return hexb(f"02 0001 0000000f 003c 0000 {size:016x} 1000 02 ce")


def body(seq: int, size: int = 100) -> bytes:
    return hexb(f"03 0001 {size:08x} {seq:016x}") + b"x" * (size - 8) + b"\xce"


def test_protocol_header_is_amqp_0_9_1() -> None:
    assert hexb("414d5150 00 00 09 01") == amqp.PROTOCOL_HEADER  # "AMQP" 0 0 9 1


def test_method_frames() -> None:
    # channel.open on channel 1: reserved shortstr "".
    assert amqp.channel_open() == hexb("01 0001 00000005 0014 000a 00 ce")
    # confirm.select, nowait off.
    assert amqp.confirm_select() == hexb("01 0001 00000005 0055 000a 00 ce")
    # connection.tune-ok on channel 0: channel-max 2047, frame-max 131072, heartbeat 0.
    assert amqp.tune_ok(2047, 131072, 0) == hexb("01 0000 0000000c 000a 001f 07ff 00020000 0000 ce")
    # basic.ack of tag 300, multiple.
    assert amqp.basic_ack(300, True) == hexb("01 0001 0000000d 003c 0050 000000000000012c 01 ce")
    # basic.qos: prefetch-size 0, prefetch-count 2000, not global.
    assert amqp.basic_qos(2000) == hexb("01 0001 0000000b 003c 000a 00000000 07d0 00 ce")


def test_queue_declare_durable_and_quorum() -> None:
    # reserved short, queue "q", bits with durable (the second) set, arguments table.
    classic = amqp.queue_declare("q", "classic")
    assert classic == hexb("01 0001 0000000d 0032 000a 0000 01 71 02 00000000 ce")
    table = hexb("00000018 0c") + b"x-queue-type" + b"S" + hexb("00000006") + b"quorum"
    quorum = amqp.queue_declare("q", "quorum")
    assert quorum == hexb("01 0001 00000025 0032 000a 0000 01 71 02") + table + b"\xce"


def test_basic_consume_no_ack() -> None:
    # reserved short, queue "q", consumer tag "" (the server names it), bits with no-ack
    # (the second) set, no arguments.
    got = amqp.basic_consume("q", no_ack=True)
    assert got == hexb("01 0001 0000000e 003c 0014 0000 01 71 00 02 00000000 ce")


def test_start_ok_logs_in_with_plain() -> None:
    frame = amqp.start_ok()
    payload = frame[7:-1]
    assert frame[:3] == hexb("01 0000") and frame[-1] == 0xCE
    assert int.from_bytes(frame[3:7], "big") == len(payload)
    assert payload[:4] == hexb("000a 000b")
    table_size = int.from_bytes(payload[4:8], "big")
    rest = payload[8 + table_size :]
    assert rest == b"\x05PLAIN" + hexb("0000000c") + b"\x00guest\x00guest" + b"\x05en_US"


def test_publish_is_method_header_and_body_frames() -> None:
    before, after = amqp.publish_template("q", 100, 131072)
    message = before + (7).to_bytes(8, "big") + after
    # basic.publish: reserved short, exchange "" (the default), routing key "q",
    # mandatory and immediate off.
    publish = hexb("01 0001 0000000a 003c 0028 0000 00 01 71 00 ce")
    # The content header: class 60, weight 0, body size 100, property flags with only
    # delivery-mode (bit 12) set, delivery-mode 2 (persistent).
    assert message == publish + header(100) + body(7)
    assert amqp.content_header(100) == header(100)


def test_publish_body_split_at_frame_max() -> None:
    # frame_max 60 leaves 52 body bytes a frame: the sequence number and 44 x, then 48 x.
    before, after = amqp.publish_template("q", 100, 60)
    message = before + (1).to_bytes(8, "big") + after
    start = len(hexb("01 0001 0000000a 003c 0028 0000 00 01 71 00 ce")) + len(header(100))
    first = hexb("03 0001 00000034 0000000000000001") + b"x" * 44 + b"\xce"
    second = hexb("03 0001 00000030") + b"x" * 48 + b"\xce"
    assert message[start:] == first + second


def test_confirms_multiple_and_single_acks() -> None:
    confirms = amqp.Confirms()
    confirms.feed(hexb("01 0001 0000000d 003c 0050 0000000000000005 01 ce"))  # up to 5
    assert (confirms.confirmed, confirms.upto) == (5, 5)
    confirms.feed(amqp.basic_ack(7, False))  # 7 alone, ahead of 6
    assert (confirms.confirmed, confirms.upto) == (6, 5)
    confirms.feed(amqp.basic_ack(6, False))  # 6 closes the gap
    assert (confirms.confirmed, confirms.upto) == (7, 7)
    confirms.feed(amqp.basic_ack(9, False) + amqp.basic_ack(12, True))  # 9 counted once
    assert (confirms.confirmed, confirms.upto) == (12, 12)
    confirms.feed(amqp.basic_ack(3, True))  # old news
    assert confirms.confirmed == 12


def test_confirms_frame_split_across_reads() -> None:
    stream = amqp.basic_ack(100, True) + hexb("08 0000 00000000 ce") + amqp.basic_ack(250, True)
    for cut in range(1, len(stream)):
        confirms = amqp.Confirms()
        confirms.feed(stream[:cut])
        assert confirms.confirmed == (100 if cut >= 21 else 0)
        confirms.feed(stream[cut:])
        assert confirms.confirmed == 250
        assert not confirms.buf


def test_confirms_fail_on_nack_and_close() -> None:
    nack = hexb("01 0001 0000000d 003c 0078 0000000000000004 01 ce")
    with pytest.raises(amqp.AmqpError, match=r"basic\.nack of delivery tag 4"):
        amqp.Confirms().feed(nack)
    # channel.close 406 PRECONDITION_FAILED, caused by queue.declare.
    text = b"PRECONDITION_FAILED - inequivalent arg 'x-queue-type'"
    close = hexb("0014 0028 0196") + bytes([len(text)]) + text + hexb("0032 000a")
    frame = hexb(f"01 0001 {len(close):08x}") + close + b"\xce"
    with pytest.raises(amqp.AmqpError, match="406 PRECONDITION_FAILED"):
        amqp.Confirms().feed(frame)


def test_deliveries_counted_whole_across_any_split() -> None:
    stream = b"".join(deliver(i + 1) + header(100) + body(i) for i in range(3))
    for cut in range(1, len(stream)):
        got = amqp.Deliveries(100)
        got.feed(stream[:cut])
        got.feed(stream[cut:])
        assert (got.received, got.tag, got.whole) == (3, 3, True)
        assert not got.buf


def test_deliveries_body_in_two_frames() -> None:
    parts = hexb("03 0001 00000034 0000000000000000") + b"x" * 44 + b"\xce"
    parts += hexb("03 0001 00000030") + b"x" * 48 + b"\xce"
    got = amqp.Deliveries(100)
    got.feed(deliver(1) + header(100) + parts + deliver(2) + header(100) + body(1))
    assert (got.received, got.whole) == (2, True)


def test_deliveries_out_of_order_or_wrong_size_are_not_whole() -> None:
    swapped = amqp.Deliveries(100)
    swapped.feed(deliver(1) + header(100) + body(1) + deliver(2) + header(100) + body(0))
    assert (swapped.received, swapped.whole) == (2, False)
    short = amqp.Deliveries(100)
    short.feed(deliver(1) + header(50) + body(0, 50))
    assert (short.received, short.whole) == (1, False)


def test_rabbitmq_row_says_skipped_without_the_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert RabbitMQ().available() == "skipped: rabbitmq-server not installed (make bench-peers)"
    assert RabbitMQ("quorum").name == "rabbitmq quorum"
    assert (RabbitMQ().name, RabbitMQ().proto, RabbitMQ.loadgen) == (
        "rabbitmq classic",
        "amqp",
        "bench.amqpload",
    )


def test_deliveries_fail_on_a_frame_without_its_end() -> None:
    broken = body(0)[:-1] + b"\x00"
    for stream in (deliver(1) + header(100) + broken, deliver(1)[:-1] + b"\x00"):
        with pytest.raises(amqp.AmqpError, match="end octet"):
            amqp.Deliveries(100).feed(stream + deliver(2) + header(100) + body(1))


# --- the roles against a scripted server ---------------------------------------------------------


class ScriptedServer:
    """Just enough of an AMQP 0-9-1 server for one amqpload connection, on a loopback port:
    the handshake (frame_max 4096, so a 5,000-byte body takes two frames), the queue and
    confirm set-up, confirms held until the client stops sending (so a window fills; one
    single ack ahead of a multiple one each time), and for a consumer, ``deliveries``
    messages sent at once."""

    def __init__(self, deliveries: int = 0, size: int = 100) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.deliveries, self.size = deliveries, size
        self.methods: list[tuple[int, int, bytes]] = []  # class, method, arguments
        self.published = self.acked = self.most_outstanding = 0
        self.bodies: list[int] = []  # body bytes of each published message
        self.client_acks: list[tuple[int, int]] = []  # (tag, multiple) from a consumer
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            with self.listener:
                conn, _ = self.listener.accept()
            with conn:
                self._talk(conn)
        except BaseException as exc:  # reported by the test, not lost in the thread
            self.error = exc

    def _frames(self, conn: socket.socket) -> Iterator[tuple[int, bytes]]:
        buf = b""
        while True:
            while len(buf) >= 8 and len(buf) >= 8 + int.from_bytes(buf[3:7], "big"):
                end = 8 + int.from_bytes(buf[3:7], "big")
                assert buf[end - 1] == 0xCE
                yield buf[0], buf[7 : end - 1]
                buf = buf[end:]
            conn.settimeout(0.005 if self.published > self.acked else None)
            try:
                chunk = conn.recv(65536)
            except TimeoutError:  # the client waits for confirms: all of them now
                tags = range(self.acked + 1, self.published + 1)
                if len(tags) > 1:
                    conn.sendall(amqp.basic_ack(tags[1], False))
                conn.sendall(amqp.basic_ack(tags[-1], True))
                self.acked = self.published
                continue
            if not chunk:
                return
            buf += chunk

    def _talk(self, conn: socket.socket) -> None:
        assert conn.recv(8) == amqp.PROTOCOL_HEADER
        mechanisms = amqp.longstr("PLAIN AMQPLAIN") + amqp.longstr("en_US")
        conn.sendall(amqp.method(0, 10, 10, b"\x00\x09" + amqp.table({}) + mechanisms))
        replies = {
            (10, 11): amqp.method(0, 10, 30, hexb("07ff 00001000 003c")),  # tune
            (10, 40): amqp.method(0, 10, 41, b"\x00"),
            (20, 10): amqp.method(1, 20, 11, hexb("00000000")),
            (50, 10): amqp.method(1, 50, 11, b"\x01q" + hexb("00000000 00000000")),
            (85, 10): amqp.method(1, 85, 11),
            (60, 10): amqp.method(1, 60, 11),
            (10, 50): amqp.method(0, 10, 51),
        }
        for kind, payload in self._frames(conn):
            if kind == amqp.BODY:
                self.bodies[-1] += len(payload)
                continue
            if kind != amqp.METHOD:
                continue
            class_id, method_id = struct.unpack_from(">HH", payload)
            self.methods.append((class_id, method_id, payload[4:]))
            if (class_id, method_id) == (60, 40):
                self.published += 1
                self.bodies.append(0)
                self.most_outstanding = max(self.most_outstanding, self.published - self.acked)
            elif (class_id, method_id) == (60, 20):
                conn.sendall(amqp.method(1, 60, 21, b"\x02ct"))
                conn.sendall(b"".join(self._delivery(i) for i in range(self.deliveries)))
            elif (class_id, method_id) == (60, 80):
                self.client_acks.append(struct.unpack_from(">QB", payload, 4))
            elif (class_id, method_id) in replies:
                conn.sendall(replies[class_id, method_id])
                if (class_id, method_id) == (10, 50):
                    return

    def _delivery(self, seq: int) -> bytes:
        body = seq.to_bytes(8, "big") + b"x" * (self.size - 8)
        return deliver(seq + 1) + header(self.size) + amqp.frame(amqp.BODY, 1, body)


def run_role(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str
) -> dict[str, Any]:
    return roles.run_role(amqp.main, monkeypatch, capsys, *argv)


def test_pub_sets_up_confirms_and_keeps_at_most_its_window(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    server = ScriptedServer()
    result = run_role(
        monkeypatch, capsys, "pub", "--port", str(server.port), "--queue", "q",
        "--queue-type", "quorum", "--count", "1000", "--window", "64", "--size", "5000",
    )  # fmt: skip
    server.thread.join(5)
    assert server.error is None
    assert (result["sent"], result["confirmed"], server.acked) == (1000, 1000, 1000)
    assert server.most_outstanding == 64
    assert server.bodies == [5000] * 1000  # in two frames each, under frame_max 4096
    setup = [(c, m) for c, m, _ in server.methods[:6]]
    assert setup == [(10, 11), (10, 31), (10, 40), (20, 10), (50, 10), (85, 10)]
    tune_ok = server.methods[1][2]
    assert tune_ok == hexb("07ff 00001000 0000")  # the server's frame_max, no heartbeats
    assert server.methods[4][2] == amqp.queue_declare("q", "quorum")[11:-1]
    assert server.methods[-1][:2] == (10, 50)  # closed at the end, politely
    assert result["end_ns"] > result["start_ns"]


@pytest.mark.parametrize("ack", ["auto", "manual"])
def test_sub_consumes_and_counts_deliveries(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], ack: str
) -> None:
    server = ScriptedServer(deliveries=1200)
    result = run_role(
        monkeypatch, capsys, "sub", "--port", str(server.port), "--queue", "q",
        "--count", "1200", "--ack", ack, "--ack-every", "500",
    )  # fmt: skip
    server.thread.join(5)
    assert server.error is None
    assert (result["received"], result["whole"]) == (1200, True)
    assert result["first_ns"] <= result["last_ns"]
    consume = next(args for c, m, args in server.methods if (c, m) == (60, 20))
    no_ack = consume[-5] & 0x02
    if ack == "auto":
        assert no_ack and not server.client_acks
        assert (60, 10) not in [(c, m) for c, m, _ in server.methods]
    else:
        assert not no_ack
        assert server.client_acks[-1] == (1200, 1)  # every delivery acked by the end
        assert all(multiple for _, multiple in server.client_acks)
