"""The Lumberjack machine without a socket: bytes in, batches of fq messages and ACK
bytes out.

Each case is checked as h11's ``tests/test_io.py`` checks its readers: the whole input in
one read, one byte at a time (a message comes out only at the last byte of its frame),
and with the first bytes of another frame behind it (kept, not consumed). ACK points do
not depend on how the input was cut: a window that fills, a new ``W``, an empty window.
Then the rules time drives: the idle mark, EOF, and keepalives.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from fqbroker.core.frames import peer_fields
from fqbroker.core.message import MsgIdCounter, ipv4_bytes
from fqbroker.frontends.kit.acks import BadInput, Batch
from fqbroker.frontends.lumberjack.machine import Config, Machine
from fqbroker.frontends.lumberjack.mapping import DEFAULT_ROUTE_TEMPLATE, RouteTemplate, sender_for
from fqbroker.protocols.lumberjack.encoder import (
    AckReader,
    compressed,
    data_frame,
    json_frame,
    window,
)
from fqbroker.protocols.lumberjack.wire import Limits, encode_ack

NODE = ipv4_bytes("10.0.0.1")
SENDER = sender_for("192.0.2.7", 40000)
CONFIG = Config(
    exchange=b"logging",
    template=RouteTemplate(DEFAULT_ROUTE_TEMPLATE),
    limits=Limits(max_window=100, max_frame=4096),
    ack_idle=0.05,
    keepalive=1.0,
)


def machine() -> Machine:
    return Machine(CONFIG, SENDER, NODE, MsgIdCounter().next)


def ev(n: int, beat: str = "filebeat") -> bytes:
    return json.dumps({"@metadata": {"beat": beat}, "n": n}, separators=(",", ":")).encode()


@dataclass
class Outcome:
    """What a machine made of some input, with a stand-in shell that publishes each
    batch and says, after each read, that every message is handled."""

    messages: list[tuple[bytes, bytes]] = field(default_factory=list)  # route, payload
    acks: list[tuple[int, int]] = field(default_factory=list)
    bad: BadInput | None = None
    reader: AckReader = field(default_factory=AckReader)


def drive(m: Machine, chunks: list[bytes], out: Outcome | None = None, now: float = 0.0) -> Outcome:
    out = Outcome() if out is None else out
    for chunk in chunks:
        m.receive_data(chunk, now)
        while (event := m.next_event()) is not None:
            if isinstance(event, BadInput):
                out.bad = event
                break
            assert isinstance(event, Batch)
            for exchange, route, frames, head in event.runs:
                for frame in frames:
                    ex, rt, payload, _msgid, sender, hops = peer_fields(frame)
                    assert (ex, rt, sender, hops) == (exchange, route, SENDER, NODE)
                    assert exchange == b"logging" and len(frame) - head == len(payload)
                    out.messages.append((route, payload))
            assert event.octets == sum(len(f) for r in event.runs for f in r[2])
        m.acknowledge(m.events)
        out.acks += out.reader.feed(m.data_to_send())
    return out


# (frames, the messages (route, payload), the ACKs)
SIMPLE_CASES: dict[str, tuple[list[bytes], list[tuple[bytes, bytes]], list[tuple[int, int]]]] = {
    "v2 batch": (
        [window(2, 2), json_frame(1, ev(1)), json_frame(2, ev(2, "auditbeat"))],
        [(b"filebeat", ev(1)), (b"auditbeat", ev(2, "auditbeat"))],
        [(2, 2)],
    ),
    "v2 compressed": (
        [window(2, 2), compressed(2, json_frame(7, ev(7)) + json_frame(8, ev(8)))],
        [(b"filebeat", ev(7)), (b"filebeat", ev(8))],
        [(2, 8)],
    ),
    "v1": (
        [window(1, 1), data_frame(1, {"type": "syslog", "line": "x"})],
        [(b"syslog", b'{"type":"syslog","line":"x"}')],
        [(1, 1)],
    ),
    "pipelined, seq restarting": (
        [window(2, 1), json_frame(1, ev(1)), window(2, 1), json_frame(1, ev(2))],
        [(b"filebeat", ev(1)), (b"filebeat", ev(2))],
        [(2, 1), (2, 1)],
    ),
    "a W ends a batch that is not full": (
        [window(2, 5), json_frame(1, ev(1)), json_frame(2, ev(2)), window(1, 1)],
        [(b"filebeat", ev(1)), (b"filebeat", ev(2))],
        [(2, 2)],
    ),
    "an empty window": ([window(2, 0)], [], [(2, 0)]),
    "a window that fills twice": (
        [window(2, 2), *(json_frame(i, ev(i)) for i in range(1, 6))],
        [(b"filebeat", ev(i)) for i in range(1, 6)],
        [(2, 2), (2, 4)],  # the fifth waits for idle input
    ),
}


def _frame_ends(frames: list[bytes]) -> set[int]:
    ends, at = set(), 0
    for f in frames:
        at += len(f)
        ends.add(at)
    return ends


@pytest.mark.parametrize("case", list(SIMPLE_CASES))
def test_whole_input(case: str) -> None:
    frames, messages, acks = SIMPLE_CASES[case]
    m = machine()
    out = drive(m, [b"".join(frames)])
    assert (out.messages, out.acks, out.bad) == (messages, acks, None)
    assert m.buffered == 0 and m.ack_due is None
    assert m.acked == (acks[-1][1] if acks else 0)


@pytest.mark.parametrize("case", list(SIMPLE_CASES))
def test_one_byte_at_a_time(case: str) -> None:
    frames, messages, acks = SIMPLE_CASES[case]
    data = b"".join(frames)
    ends = _frame_ends(frames)
    m = machine()
    out = Outcome()
    for i in range(len(data)):
        before = (len(out.messages), len(out.acks))
        drive(m, [data[i : i + 1]], out)
        if i + 1 not in ends:
            assert (len(out.messages), len(out.acks)) == before
    assert (out.messages, out.acks, out.bad) == (messages, acks, None)


@pytest.mark.parametrize("case", list(SIMPLE_CASES))
def test_trailing_bytes_are_kept(case: str) -> None:
    frames, messages, acks = SIMPLE_CASES[case]
    partial = json_frame(99, ev(99))
    m = machine()
    out = drive(m, [b"".join(frames) + partial[:-1]])
    assert (out.messages, out.acks, out.bad) == (messages, acks, None)
    assert m.buffered == len(partial) - 1
    drive(m, [partial[-1:]], out)
    assert out.messages[-1] == (b"filebeat", ev(99)) and out.acks[: len(acks)] == acks


def test_a_mark_is_due_once_its_events_are_handled() -> None:
    m = machine()
    m.receive_data(window(2, 2) + b"".join(json_frame(i, ev(i)) for i in (1, 2, 3, 4)), 0.0)
    batch = m.next_event()
    assert isinstance(batch, Batch) and m.next_event() is None
    assert m.ack_due == 2
    m.acknowledge(1)
    assert m.data_to_send() == b""
    m.acknowledge(3)  # one mark is due, not the other
    assert m.data_to_send() == encode_ack(2, 2) and m.ack_due == 4
    m.acknowledge(4)
    assert m.data_to_send() == encode_ack(2, 4) and m.ack_due is None and m.acked == 4


def test_bad_input_after_events_still_publishes_them_and_is_final() -> None:
    m = machine()
    good = window(2, 5) + json_frame(1, ev(1))
    out = drive(m, [good + window(2, 101) + json_frame(2, ev(2))])
    assert out.messages == [(b"filebeat", ev(1))]
    assert out.bad is not None and "101" in out.bad.reason
    assert out.acks == []  # the event before it was never marked
    m.receive_data(window(2, 1) + json_frame(3, ev(3)), 0.0)
    assert m.next_event() == out.bad


def test_idle_input_marks_what_is_unmarked() -> None:
    m = machine()
    assert m.deadline is None and not m.tick(100.0)
    drive(m, [window(2, 100) + json_frame(1, ev(1))], now=10.0)
    assert m.deadline == pytest.approx(10.05)
    drive(m, [json_frame(2, ev(2))], now=10.03)  # input moves the deadline on
    assert m.deadline == pytest.approx(10.08)
    assert not m.tick(10.05) and m.ack_due is None
    assert m.tick(10.0795)  # a timer that fires a little early
    assert m.deadline is None and m.ack_due == 2
    m.acknowledge(2)
    assert m.data_to_send() == encode_ack(2, 2)
    assert not m.tick(20.0)  # nothing left to mark


def test_eof_marks_what_is_unmarked_and_what_is_decoded_after_it() -> None:
    m = machine()
    m.receive_data(window(2, 100) + json_frame(1, ev(1)) + json_frame(2, ev(2))[:-1], 0.0)
    assert isinstance(m.next_event(), Batch)
    m.receive_eof()
    assert m.ack_due == 1 and m.deadline is None
    m.receive_data(json_frame(2, ev(2))[-1:], 0.0)  # read before the EOF, decoded after
    assert isinstance(m.next_event(), Batch)
    m.acknowledge(2)
    assert m.data_to_send() == encode_ack(2, 1) + encode_ack(2, 2)


@pytest.mark.parametrize(
    ("frames", "keepalive"),
    [
        ([window(2, 2), json_frame(1, ev(1))], encode_ack(2, 0)),  # unmarked
        ([window(2, 1), json_frame(1, ev(1))], encode_ack(2, 0)),  # marked, not acked
        ([window(1, 2), data_frame(1, {"a": "b"})], b""),  # v1 has none
        ([], b""),  # nothing unacknowledged
    ],
)
def test_keepalive_only_while_a_v2_batch_is_unacknowledged(
    frames: list[bytes], keepalive: bytes
) -> None:
    m = machine()
    m.receive_data(b"".join(frames), 0.0)
    while m.next_event() is not None:
        pass
    m.keepalive()
    assert m.data_to_send() == keepalive
