"""The Figg client's sans-IO core: byte-exact frames against the golden vectors, the publish
window and its cumulative ACKs, what a reconnect re-sends, resume positions, DETACH, pings
and the reconnect backoff. No sockets: bytes in, bytes and events out."""

from __future__ import annotations

import pytest

from fqbroker.clients.figg.machine import Acked, Backoff, FiggMachine, Message, as_topic
from fqbroker.errors import FiggProtocolError
from fqbroker.protocols.figg import wire


def _hex(text: str) -> bytes:
    return bytes.fromhex("".join(text.split()))


ATTACH_NEWS_LATEST = _hex("0001 0001 00000012 0000 00000004 6e657773 0000000000000000")
ATTACH_T2_FROM_0 = _hex("0001 0001 00000010 8000 00000002 7432 0000000000000000")
DETACH_T2 = _hex("0003 0001 00000006 00000002 7432")
PUBLISH_T2_M0 = _hex("0005 0001 00000014 00000002 7432 0000000000000000 00000002 6d30")
PING = _hex("0008 0001 00000008 18ea5623a618afbe")
ATTACHED_NEWS_0 = _hex("0002 0001 00000010 00000004 6e657773 0000000000000000")
DETACHED_T2 = _hex("0004 0001 00000006 00000002 7432")
ACK_0 = _hex("0006 0001 00000008 0000000000000000")
DATA_T2_1_M0 = _hex("0007 0001 00000014 00000002 7432 0000000000000001 00000002 6d30")
PONG = _hex("0009 0001 00000008 18ea5623a618afbe")


def connected(now: float = 0.0, **kw: int | float) -> FiggMachine:
    m = FiggMachine(**kw)  # type: ignore[arg-type]
    m.connection_made(now)
    assert m.data_to_send() == b""
    return m


def events(m: FiggMachine, data: bytes, one_byte_at_a_time: bool = False) -> list[object]:
    out: list[object] = []
    pieces = [data[i : i + 1] for i in range(len(data))] if one_byte_at_a_time else [data]
    for piece in pieces:
        m.receive_data(piece)
        while (event := m.next_event()) is not None:
            out.append(event)
    return out


def test_frames_sent_are_the_golden_vectors() -> None:
    m = connected()
    m.subscribe(b"news")
    assert m.data_to_send() == ATTACH_NEWS_LATEST
    m.subscribe(b"t2", 0)
    assert m.data_to_send() == ATTACH_T2_FROM_0
    assert m.publish(b"t2", b"m0") == 0
    assert m.data_to_send() == PUBLISH_T2_M0
    assert m.unsubscribe(b"t2")
    assert m.data_to_send() == DETACH_T2
    assert m.tick(2.0, timestamp=0x18EA5623A618AFBE)
    assert m.data_to_send() == PING


@pytest.mark.parametrize("one_byte_at_a_time", [False, True])
def test_replies_decoded_in_any_split(one_byte_at_a_time: bool) -> None:
    m = connected()
    m.subscribe(b"news")
    m.subscribe(b"t2", 0)
    m.publish(b"t2", b"m0")
    m.data_to_send()
    stream = ATTACHED_NEWS_0 + DATA_T2_1_M0 + ACK_0 + PONG
    assert events(m, stream, one_byte_at_a_time) == [
        wire.Attached(b"news", 0),
        Message(b"t2", 1, b"m0"),
        Acked(0, 0),
    ]
    assert m.position(b"news") == 0
    assert m.position(b"t2") == 1
    assert m.in_flight == 0 and m.acked == 0


def test_window_of_256_and_cumulative_ack() -> None:
    m = connected()
    seqs = [m.publish(b"t", b"%d" % i) for i in range(256)]
    assert seqs == list(range(256))
    assert m.window_full and m.in_flight == 256
    with pytest.raises(RuntimeError):
        m.publish(b"t", b"one too many")
    assert events(m, wire.encode_ack(9)) == [Acked(9, 246)]
    assert not m.window_full
    # An older ACK (or a repeated one) releases nothing more and moves nothing back.
    assert events(m, wire.encode_ack(3)) == [Acked(3, 246)]
    assert m.acked == 9
    assert events(m, wire.encode_ack(255)) == [Acked(255, 0)]
    assert m.publish(b"t", b"next") == 256


def test_reconnect_resends_unacknowledged_in_order_after_the_attaches() -> None:
    m = connected()
    m.subscribe(b"a")
    for i in range(5):
        m.publish(b"t", b"m%d" % i)
    m.data_to_send()
    events(m, wire.encode_ack(1))
    m.connection_lost()
    # While away: nothing to write, publishes wait in the window, seqs go on.
    assert m.publish(b"t", b"m5") == 5
    m.subscribe(b"b", 7)
    assert m.data_to_send() == b""
    m.connection_made(10.0)
    expected = wire.encode(wire.Attach(b"a", None)) + wire.encode(wire.Attach(b"b", 7))
    expected += b"".join(wire.encode_publish(b"t", s, b"m%d" % s) for s in range(2, 6))
    assert m.data_to_send() == expected
    assert m.resent == range(2, 6)
    assert m.publish(b"t", b"m6") == 6
    assert m.data_to_send() == wire.encode_publish(b"t", 6, b"m6")


def test_resume_from_the_last_offset_received() -> None:
    m = connected()
    m.subscribe(b"t")
    m.subscribe(b"given", 3)
    m.subscribe(b"quiet")
    m.data_to_send()
    stream = wire.encode(wire.Attached(b"t", 5)) + wire.encode_data(b"t", 6, b"x")
    stream += wire.encode_data(b"t", 7, b"y")
    assert events(m, stream) == [
        wire.Attached(b"t", 5),
        Message(b"t", 6, b"x"),
        Message(b"t", 7, b"y"),
    ]
    m.connection_lost()
    m.connection_made(1.0)
    # Flag 0x8000 from 7; the given offset while nothing came; latest for the quiet one.
    assert m.data_to_send() == (
        wire.encode(wire.Attach(b"t", 7))
        + wire.encode(wire.Attach(b"given", 3))
        + wire.encode(wire.Attach(b"quiet", None))
    )
    # The broker may resend what we had: dropped, never delivered twice.
    again = wire.encode(wire.Attached(b"t", 7)) + wire.encode_data(b"t", 7, b"y")
    again += wire.encode_data(b"t", 8, b"z")
    assert events(m, again) == [wire.Attached(b"t", 7), Message(b"t", 8, b"z")]


def test_attached_offset_is_where_a_resume_starts() -> None:
    # An expired offset moved up, or "latest" resolved: the broker's answer counts.
    m = connected()
    m.subscribe(b"t", 2)
    m.data_to_send()
    events(m, wire.encode(wire.Attached(b"t", 40)))
    m.connection_lost()
    m.connection_made(1.0)
    assert m.data_to_send() == wire.encode(wire.Attach(b"t", 40))


def test_detach_drops_the_old_attachment_until_detached() -> None:
    m = connected()
    m.subscribe(b"t2", 0)
    m.data_to_send()
    assert m.unsubscribe(b"t2")
    assert not m.unsubscribe(b"t2")
    m.subscribe(b"t2", 0)
    assert m.data_to_send() == DETACH_T2 + ATTACH_T2_FROM_0
    # In flight from the first attachment, then its DETACHED, then the new one.
    old = wire.encode(wire.Attached(b"t2", 0)) + DATA_T2_1_M0 + DETACHED_T2
    new = wire.encode(wire.Attached(b"t2", 0)) + DATA_T2_1_M0
    assert events(m, old + new) == [
        wire.Detached(b"t2"),
        wire.Attached(b"t2", 0),
        Message(b"t2", 1, b"m0"),
    ]
    with pytest.raises(ValueError):
        m.subscribe(b"t2")


def test_data_for_a_topic_not_subscribed_is_dropped() -> None:
    m = connected()
    assert events(m, DATA_T2_1_M0) == []


def test_ping_every_interval_dead_after_two_unanswered() -> None:
    m = connected(100.0)
    assert m.tick(101.9) and m.data_to_send() == b""
    assert m.tick(102.0, timestamp=1) and m.data_to_send() == wire.encode(wire.Ping(1))
    assert m.next_tick() == 104.0
    assert m.tick(104.0, timestamp=2) and m.data_to_send() == wire.encode(wire.Ping(2))
    assert not m.tick(106.0)


def test_an_answer_keeps_the_connection_alive() -> None:
    m = connected(0.0)
    for n in range(1, 20):
        assert m.tick(2.0 * n, timestamp=n)
        assert m.data_to_send() == wire.encode(wire.Ping(n))
        # A PONG, or any frame at all, proves the broker is there.
        if n % 2:
            assert events(m, wire.encode(wire.Pong(n))) == []
        else:
            seq = m.publish(b"t", b"x")
            m.data_to_send()
            assert events(m, wire.encode_ack(seq)) == [Acked(seq, 0)]


def test_no_pings_while_disconnected_and_a_fresh_clock_on_connect() -> None:
    m = FiggMachine()
    assert m.tick(50.0) and m.data_to_send() == b""
    m.connection_made(60.0)
    assert m.tick(61.0) and m.data_to_send() == b""
    assert m.tick(62.0) and m.data_to_send()


def test_a_frame_only_a_client_sends_is_a_protocol_error() -> None:
    m = connected()
    m.receive_data(PUBLISH_T2_M0)
    with pytest.raises(FiggProtocolError):
        m.next_event()


def test_a_new_connection_gets_a_fresh_decoder() -> None:
    m = connected()
    m.receive_data(ACK_0[:5])  # half a frame, then the connection dies
    m.connection_lost()
    m.publish(b"t", b"m0")
    m.connection_made(0.0)
    m.data_to_send()
    assert events(m, ACK_0) == [Acked(0, 0)]


def test_backoff_doubles_to_the_cap_with_jitter() -> None:
    b = Backoff(0.1, 5.0, jitter=0.2)
    delays = [b.next() for _ in range(10)]
    bases = [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0, 5.0]
    for delay, base in zip(delays, bases, strict=True):
        assert base * 0.8 <= delay <= base * 1.2
    b.reset()
    assert 0.08 <= b.next() <= 0.12


def test_topic_names() -> None:
    assert as_topic("news") == b"news"
    assert as_topic(b"x" * 127) == b"x" * 127
    for bad in (b"", "y" * 128):
        with pytest.raises(ValueError):
            as_topic(bad)
