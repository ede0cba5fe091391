"""The AMQP 0-9-1 generator's codec against bytes written out from the spec, and the
RabbitMQ peer's row text where rabbitmq-server is not installed.

The expected bytes are spelled field by field from AMQP 0-9-1 (section 4.2.3: a frame is
type octet, channel short, size long, payload, 0xCE; 4.2.4: a method payload starts with
class id and method id shorts; 4.2.6: a content header is class id, weight, body size
longlong, property flags, then the properties set) and its class list (basic 60: publish
40, deliver 60, ack 80, nack 120; queue 50: declare 10; channel 20: open 10). No server:
CI has none, and a live run is by hand (docs/bench.md, "Durable peers").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import amqpload as amqp
from bench.rabbit import RabbitMQ


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
