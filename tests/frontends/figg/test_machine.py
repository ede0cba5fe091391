"""The Figg machine without a socket: frames in, batches, events and reply bytes out.

Each case is checked as h11's ``tests/test_io.py`` checks its readers: the whole input in
one read, one byte at a time (nothing comes out before a frame's last byte), and with the
first bytes of another frame behind it (kept, not consumed). Then the rules a read's
bytes do not show: one ACK per batch, of its highest seq, once the tail says its
messages are handled; bad input ends everything; the time of the last input is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from fqbroker.core.frames import peer_fields
from fqbroker.core.message import MsgIdCounter, ipv4_bytes
from fqbroker.frontends.figg.machine import Config, Machine, sender_for
from fqbroker.frontends.kit.acks import BadInput, Batch
from fqbroker.protocols.figg import wire
from fqbroker.protocols.figg.wire import (
    Ack,
    Attach,
    Attached,
    Data,
    Detach,
    Detached,
    Frame,
    Ping,
    Pong,
    Publish,
)

NODE = ipv4_bytes("10.0.0.1")
SENDER = sender_for("192.0.2.7", 40000)
CONFIG = Config(exchange=b"figg", max_frame=4096)
ATTACHED_AT = 7  # where the stand-in shell says delivery starts


def machine(now: float = 0.0) -> Machine:
    return Machine(CONFIG, SENDER, NODE, MsgIdCounter().next, now)


@dataclass
class Outcome:
    """What a machine made of some input, with a stand-in shell that acts on each event
    and says, after each read, that every message is handled."""

    messages: list[tuple[bytes, bytes]] = field(default_factory=list)  # route, payload
    events: list[object] = field(default_factory=list)  # Attach, Detach, BadInput
    replies: list[Frame] = field(default_factory=list)  # all but ACK, in order
    acks: list[int] = field(default_factory=list)
    batches: list[Batch] = field(default_factory=list)


def drive(m: Machine, chunks: list[bytes], out: Outcome | None = None) -> Outcome:
    out = Outcome() if out is None else out
    handled = sum(len(run[2]) for b in out.batches for run in b.runs)
    decoder = wire.FrameDecoder()
    for chunk in chunks:
        m.receive_data(chunk, 0.0)
        while (event := m.next_event()) is not None:
            if isinstance(event, Batch):
                out.batches.append(event)
                for exchange, route, frames, _ in event.runs:
                    for frame in frames:
                        ex, rt, payload, _msgid, sender, hops = peer_fields(frame)
                        assert (ex, rt, sender, hops) == (exchange, route, SENDER, NODE)
                        assert exchange == b"figg"
                        out.messages.append((route, payload))
                        handled += 1
                assert event.octets == sum(len(f) for r in event.runs for f in r[2])
            else:
                out.events.append(event)
                if isinstance(event, Attach):
                    m.attached(event.topic, ATTACHED_AT)
                if isinstance(event, BadInput):
                    break
        m.acknowledge(handled)
        decoder.receive_data(m.data_to_send())
        while (frame := decoder.next_frame()) is not None:
            if isinstance(frame, Ack):
                out.acks.append(frame.seq)
            else:
                out.replies.append(frame)
    return out


def frames(*fs: Frame) -> bytes:
    return b"".join(wire.encode(f) for f in fs)


# (input, the messages (route, payload), the events, the replies but ACKs, the last ACK)
SIMPLE_CASES: dict[str, tuple[bytes, list[tuple[bytes, bytes]], list[object], list[Frame], int]] = {
    "publish": (frames(Publish(b"t", 0, b"m0")), [(b"t", b"m0")], [], [], 0),
    "publishes to topics in turn": (
        frames(Publish(b"t", 0, b"a"), Publish(b"u", 1, b"b"), Publish(b"t", 2, b"")),
        [(b"t", b"a"), (b"u", b"b"), (b"t", b"")],
        [],
        [],
        2,
    ),
    "ping": (frames(Ping(0x18EA5623A618AFBE)), [], [], [Pong(0x18EA5623A618AFBE)], -1),
    "attach": (
        frames(Attach(b"news", None), Attach(b"t2", 3)),
        [],
        [Attach(b"news", None), Attach(b"t2", 3)],
        [Attached(b"news", ATTACHED_AT), Attached(b"t2", ATTACHED_AT)],
        -1,
    ),
    "detach": (frames(Detach(b"t2")), [], [Detach(b"t2")], [Detached(b"t2")], -1),
    "all of them": (
        frames(
            Publish(b"t", 5, b"x"),
            Ping(1),
            Attach(b"t", 0),
            Publish(b"t", 6, b"y"),
            Detach(b"t"),
            Ping(2),
        ),
        [(b"t", b"x"), (b"t", b"y")],
        [Attach(b"t", 0), Detach(b"t")],
        [Pong(1), Attached(b"t", ATTACHED_AT), Detached(b"t"), Pong(2)],
        6,
    ),
}


def _expect(out: Outcome, case: str) -> None:
    _, messages, events, replies, last_ack = SIMPLE_CASES[case]
    assert out.messages == messages
    assert out.events == events
    assert out.replies == replies
    assert (out.acks[-1] if out.acks else -1) == last_ack
    assert out.acks == sorted(out.acks)


@pytest.mark.parametrize("case", list(SIMPLE_CASES))
def test_whole_input(case: str) -> None:
    m = machine()
    out = drive(m, [SIMPLE_CASES[case][0]])
    _expect(out, case)
    assert len(out.batches) <= 1  # a read's publishes are one batch
    assert len(out.acks) == (1 if out.messages else 0)
    assert m.buffered == 0 and m.ack_due is None


@pytest.mark.parametrize("case", list(SIMPLE_CASES))
def test_one_byte_at_a_time(case: str) -> None:
    data = SIMPLE_CASES[case][0]
    m = machine()
    out = Outcome()
    ends = set()
    at = 0
    decoder = wire.FrameDecoder()
    decoder.receive_data(data)
    while (frame := decoder.next_frame()) is not None:
        at += len(wire.encode(frame))
        ends.add(at)
    for i in range(len(data)):
        before = (len(out.messages), len(out.events), len(out.replies))
        drive(m, [data[i : i + 1]], out)
        if i + 1 not in ends:
            assert (len(out.messages), len(out.events), len(out.replies)) == before
    _expect(out, case)


@pytest.mark.parametrize("case", list(SIMPLE_CASES))
def test_trailing_bytes_are_kept(case: str) -> None:
    m = machine()
    partial = frames(Publish(b"later", 99, b"abc"))[:-1]
    out = drive(m, [SIMPLE_CASES[case][0] + partial])
    _expect(out, case)
    assert m.buffered == len(partial)
    drive(m, [b"c"], out)
    assert out.messages[-1] == (b"later", b"abc") and out.acks[-1] == 99


def test_a_batch_is_a_run_per_topic_in_a_row_and_one_ack_of_its_highest_seq() -> None:
    m = machine()
    m.receive_data(frames(Publish(b"a", 5, b"1"), Publish(b"a", 3, b"2"), Publish(b"b", 4, b"")), 0)
    batch = m.next_event()
    assert isinstance(batch, Batch) and m.next_event() is None
    assert [(ex, route, len(fs)) for ex, route, fs, _ in batch.runs] == [
        (b"figg", b"a", 2),
        (b"figg", b"b", 1),
    ]
    for _, _, fs, head in batch.runs:
        assert all(len(f) - head == len(peer_fields(f)[2]) for f in fs)
    ids = [peer_fields(f)[3] for _, _, fs, _ in batch.runs for f in fs]
    assert len(set(ids)) == 3
    assert m.ack_due == 3
    m.acknowledge(2)  # not all of it yet
    assert m.data_to_send() == b"" and m.acked == -1
    m.acknowledge(3)
    assert m.data_to_send() == wire.encode_ack(5) and m.acked == 5 and m.ack_due is None


def test_batches_due_together_are_one_cumulative_ack() -> None:
    m = machine()
    for seq in (0, 1, 2):
        m.receive_data(frames(Publish(b"t", seq, b"x")), 0)
        assert isinstance(m.next_event(), Batch)
    assert m.ack_due == 1
    m.acknowledge(2)
    assert m.data_to_send() == wire.encode_ack(1)
    m.acknowledge(3)
    assert m.data_to_send() == wire.encode_ack(2) and m.data_to_send() == b""


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (frames(Data(b"t", 1, b"x")), "it sent DATA, a server's frame"),
        (frames(Ack(1)), "it sent ACK, a server's frame"),
        (b"\x00\x63\x00\x01\x00\x00\x00\x00", "unknown frame type 99"),
        (b"\x00\x05\x00\x01\x00\x00\x20\x00", "payload of 8192 bytes is over the limit of 4096"),
    ],
)
def test_bad_input_drops_the_read_s_publishes_and_is_final(bad: bytes, reason: str) -> None:
    m = machine()
    out = drive(m, [frames(Publish(b"t", 0, b"x"), Ping(9)) + bad + frames(Ping(10))])
    assert out.messages == [] and out.acks == []
    assert out.replies == [Pong(9)]  # the reply to a frame before it still goes out
    (event,) = out.events
    assert isinstance(event, BadInput) and reason in event.reason
    m.receive_data(frames(Publish(b"t", 1, b"y")), 0)
    assert m.next_event() == event  # final: nothing after it is read


def test_the_time_of_the_last_input_is_kept() -> None:
    # The listeners' idle limit reads it (through the shell); any input moves it on.
    m = machine(now=100.0)
    assert m.last_input == 100.0
    m.receive_data(frames(Ping(1)), 105.0)
    assert m.last_input == 105.0
    m.receive_data(frames(Ping(2)), 107.5)
    assert m.last_input == 107.5
