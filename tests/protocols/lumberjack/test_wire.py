"""The Lumberjack wire format without a socket: the encoder's bytes, the receiver's answers.

Golden vectors are the examples of docs/lumberjack.md's "Wire format": the encoder must write
exactly these bytes and the receiver must decode them, whole and split anywhere.
"""

from __future__ import annotations

import json
import random
import struct
import time
import tracemalloc
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fqbroker.protocols.lumberjack import encoder
from fqbroker.protocols.lumberjack.wire import (
    Event,
    Events,
    Limits,
    Receiver,
    Violation,
    Window,
    encode_ack,
)

Answer = Window | Events | Violation
DEFAULT = Limits()

GOLDEN_W = bytes.fromhex("32 57 00000002")
GOLDEN_J = bytes.fromhex("32 4a 00000001 00000010 7b226d657373616765223a226869227d")
GOLDEN_A2 = bytes.fromhex("32 41 00000002")
GOLDEN_D = bytes.fromhex("31 44 00000001 00000001 00000004 6c696e65 00000005 68656c6c6f")
GOLDEN_A1 = bytes.fromhex("31 41 00000001")


def drain(receiver: Receiver) -> list[Answer]:
    out: list[Answer] = []
    while (answer := receiver.next_event()) is not None:
        out.append(answer)
        if isinstance(answer, Violation):
            break
    return out


def decode(data: bytes, chunks: list[int] | None = None, limits: Limits = DEFAULT) -> list[Answer]:
    """Feed ``data`` whole or cut at ``chunks`` (sizes), draining after each piece."""
    receiver = Receiver(limits)
    out: list[Answer] = []
    pos = 0
    for size in [*(chunks or []), len(data)]:
        receiver.receive_data(data[pos : pos + size])
        pos += size
        out += drain(receiver)
        if out and isinstance(out[-1], Violation):
            break
    return out


def flat(answers: list[Answer]) -> list[object]:
    """Answers with the Events runs joined, so different splits compare equal."""
    out: list[object] = []
    for a in answers:
        if isinstance(a, Events):
            out += [(a.version, e) for e in a.events]
        else:
            out.append(a)
    return out


def one_byte_at_a_time(data: bytes) -> list[Answer]:
    return decode(data, [1] * len(data))


# --- golden vectors ---------------------------------------------------------------------


def test_encoder_writes_the_golden_vectors() -> None:
    assert encoder.window(2, 2) == GOLDEN_W
    assert encoder.json_frame(1, b'{"message":"hi"}') == GOLDEN_J
    assert encoder.data_frame(1, {"line": "hello"}) == GOLDEN_D
    assert encode_ack(2, 2) == GOLDEN_A2
    assert encode_ack(1, 1) == GOLDEN_A1
    c = encoder.compressed(2, GOLDEN_J)
    assert c[:2] == b"2C" and struct.unpack(">I", c[2:6])[0] == len(c) - 6
    assert c[6:8] == b"\x78\x9c"  # zlib with its header (RFC 1950), not raw deflate
    assert zlib.decompress(c[6:]) == GOLDEN_J


@pytest.mark.parametrize("split", ["whole", "bytewise"])
def test_receiver_decodes_the_golden_vectors(split: str) -> None:
    run = one_byte_at_a_time if split == "bytewise" else decode
    assert run(GOLDEN_W + GOLDEN_J) == [
        Window(2, 2),
        Events(2, [Event(1, b'{"message":"hi"}', None)]),
    ]
    assert run(GOLDEN_D) == [Events(1, [Event(1, b'{"line":"hello"}', {"line": "hello"})])]
    assert run(encoder.compressed(2, GOLDEN_J)) == [
        Events(2, [Event(1, b'{"message":"hi"}', None)])
    ]


# --- every frame type, any split ----------------------------------------------------------


FRAMES = {
    "1W": encoder.window(1, 5),
    "2W": encoder.window(2, 0),
    "1D": encoder.data_frame(7, {"line": "héllo", "": "", "type": "syslog"}),
    "2J": encoder.json_frame(9, '{"message":"ünï"}'.encode()),
    "2J-empty": encoder.json_frame(1, b""),
    "1C": encoder.compressed(1, encoder.data_frame(1, {"a": "b"}) + encoder.data_frame(2, {})),
    "2C": encoder.compressed(2, encoder.json_frame(1, b"{}") + encoder.json_frame(2, b"[1]")),
    "2C-empty": encoder.compressed(2, b""),
}


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_each_frame_type_decodes_fed_one_byte_at_a_time(name: str) -> None:
    data = FRAMES[name]
    whole = decode(data)
    assert not any(isinstance(a, Violation) for a in whole)
    assert whole or name == "2C-empty"
    assert one_byte_at_a_time(data) == whole
    # Nothing is answered before the frame's last byte arrives.
    receiver = Receiver()
    receiver.receive_data(data[:-1])
    assert receiver.next_event() is None
    assert receiver.buffered == len(data) - 1


def test_d_frame_becomes_a_json_object_and_its_pairs() -> None:
    [events] = decode(FRAMES["1D"])
    assert isinstance(events, Events) and events.version == 1
    [event] = events.events
    assert event.seq == 7
    assert event.fields == {"line": "héllo", "": "", "type": "syslog"}
    assert json.loads(event.payload) == event.fields


def test_d_frame_with_bad_utf8_is_replaced_not_refused() -> None:
    raw = b"1D" + struct.pack(">II", 1, 1) + struct.pack(">I", 1) + b"k"
    raw += struct.pack(">I", 2) + b"\xe9t"
    [events] = decode(raw)
    assert isinstance(events, Events)
    assert events.events[0].fields == {"k": "\ufffdt"}


def test_go_lumber_and_pylogbeat_sequences_and_pipelined_batches() -> None:
    p = [b'{"n":%d}' % i for i in range(5)]
    # go-lumber: seq restarts at 1 each batch; pylogbeat: cumulative; both pipelined.
    stream = encoder.batch(p[:2]) + encoder.batch(p[2:]) + encoder.batch(p[:2], first_seq=3)
    answers = decode(stream)
    assert answers == [
        Window(2, 2),
        Events(2, [Event(1, p[0], None), Event(2, p[1], None)]),
        Window(2, 3),
        Events(2, [Event(1, p[2], None), Event(2, p[3], None), Event(3, p[4], None)]),
        Window(2, 2),
        Events(2, [Event(3, p[0], None), Event(4, p[1], None)]),
    ]
    assert flat(one_byte_at_a_time(stream)) == flat(answers)


def test_plain_and_compressed_frames_mix_and_versions_split_runs() -> None:
    j = encoder.json_frame
    stream = j(1, b"{}") + encoder.compressed(2, j(2, b"{}") + j(3, b"{}")) + j(4, b"{}")
    stream += encoder.data_frame(1, {}) + j(5, b"{}")
    answers = decode(stream)
    assert [(a.version, [e.seq for e in a.events]) for a in answers if isinstance(a, Events)] == [
        (2, [1, 2, 3, 4]),
        (1, [1]),
        (2, [5]),
    ]


def test_window_is_returned_before_the_events_that_follow_it() -> None:
    receiver = Receiver()
    receiver.receive_data(encoder.json_frame(1, b"{}") + encoder.window(2, 1))
    receiver.receive_data(encoder.json_frame(2, b"{}"))
    assert drain(receiver) == [
        Events(2, [Event(1, b"{}", None)]),
        Window(2, 1),
        Events(2, [Event(2, b"{}", None)]),
    ]


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32), cuts=st.lists(st.integers(0, 64), max_size=40))
def test_any_split_yields_the_same_answers(seed: int, cuts: list[int]) -> None:
    data = encoder.sample_frames(random.Random(seed))
    whole = decode(data)
    assert not any(isinstance(a, Violation) for a in whole)
    assert flat(decode(data, cuts)) == flat(whole)


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=3),
    cut=st.integers(0, 10**6),
    cuts=st.lists(st.integers(0, 64), max_size=40),
)
def test_damaged_input_gives_the_same_answers_however_split(
    seed: int, flips: list[tuple[int, int]], cut: int, cuts: list[int]
) -> None:
    data = bytearray(encoder.sample_frames(random.Random(seed)))
    for at, value in flips:
        if data:
            data[at % len(data)] = value
    damaged = bytes(data[: cut % (len(data) + 1)])
    limits = Limits(max_window=100, max_frame=4096, max_decompressed=8192, max_fields=8)
    whole = decode(damaged, limits=limits)
    assert flat(decode(damaged, cuts, limits)) == flat(whole)


def test_sample_frames_cover_every_frame_type() -> None:
    seen: set[bytes] = set()
    rng = random.Random(1)
    for _ in range(200):
        data = encoder.sample_frames(rng)
        seen |= {data[i : i + 2] for i in range(len(data) - 1)} & {
            b"1W",
            b"2W",
            b"1D",
            b"2J",
            b"1C",
            b"2C",
        }
    assert seen == {b"1W", b"2W", b"1D", b"2J", b"1C", b"2C"}


# --- violations ---------------------------------------------------------------------------


def violation(data: bytes, limits: Limits = DEFAULT) -> str:
    """The reason of the Violation ``data`` ends in, the same whole and split small."""
    whole = decode(data, limits=limits)
    assert isinstance(whole[-1], Violation), whole
    step = 1 if len(data) < 4096 else 4096
    assert flat(decode(data, [step] * (len(data) // step), limits)) == flat(whole)
    return whole[-1].reason


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"3W\x00\x00\x00\x01", "version byte 0x33 ('3')"),
        (b"\x00W\x00\x00\x00\x01", "version byte 0x00"),
        (b"2X\x00\x00\x00\x01", "type 0x58 ('X')"),
        (b"2A\x00\x00\x00\x01", "ACK frame"),
        (b"1A\x00\x00\x00\x01", "ACK frame"),
        (b"1J" + struct.pack(">II", 1, 2) + b"{}", "not a version-1 frame"),
        (b"2D" + struct.pack(">II", 1, 0), "not a version-2 frame"),
    ],
)
def test_bad_headers_are_named(data: bytes, words: str) -> None:
    assert words in violation(data)


def test_limits_are_checked_on_length_fields_before_the_bytes_arrive() -> None:
    limits = Limits(max_window=10, max_frame=100, max_decompressed=1000, max_fields=3)
    cases = {
        "window of 11": encoder.window(2, 11)[:6],
        "J frame of 101": b"2J" + struct.pack(">II", 1, 101),
        "C frame of 101": b"2C" + struct.pack(">I", 101),
        "4 fields": b"1D" + struct.pack(">II", 1, 4),
        "D frame longer than 100": b"1D" + struct.pack(">III", 1, 1, 95),
    }
    for words, head in cases.items():
        receiver = Receiver(limits)
        receiver.receive_data(head)  # the header only: the payload never comes
        answer = receiver.next_event()
        assert isinstance(answer, Violation) and words in answer.reason, (words, answer)
    # At the limits exactly, all is well.
    ok = encoder.window(2, 10) + encoder.json_frame(1, b"x" * 100)
    ok += encoder.data_frame(1, {"a": "", "b": "", "c": "1" * 50})
    assert not any(isinstance(a, Violation) for a in decode(ok, limits=limits))


def test_zip_bomb_stops_at_max_decompressed() -> None:
    limits = Limits(max_decompressed=1 << 20)
    inner = encoder.json_frame(1, b" " * ((1 << 20) - 10))  # exactly the limit: accepted
    [events] = decode(encoder.compressed(2, inner), limits=limits)
    assert isinstance(events, Events) and len(events.events[0].payload) == (1 << 20) - 10
    bomb = encoder.compressed(2, encoder.json_frame(1, b" " * (256 << 20)), level=9)
    assert len(bomb) < 300 << 10  # 256 MiB of spaces in about 256 KiB
    assert "inflates past 1048576 bytes" in violation(bomb, limits)
    # Inflating stopped at the limit: the decode's peak memory is a few MiB, not 256.
    tracemalloc.start()
    try:
        receiver = Receiver(limits)
        receiver.receive_data(bomb)
        assert isinstance(receiver.next_event(), Violation)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


@pytest.mark.parametrize(
    ("inner", "words"),
    [
        (encoder.window(2, 1)[:4], "ends inside a W frame"),
        (encoder.compressed(2, b"")[:4], "ends inside a C frame's header"),
        (encoder.compressed(2, b"")[:-1], "ends inside a C frame"),
        (encoder.window(1, 1), "version 1 frame inside a version 2 C frame"),
        (encoder.data_frame(1, {}), "version 1 frame inside a version 2 C frame"),
        (encoder.json_frame(1, b"{}")[:-1], "ends inside a J frame"),
        (encoder.json_frame(1, b"{}")[:5], "ends inside a J frame"),
        (b"2", "ends inside a frame header"),
        (b"2A\x00\x00\x00\x01", "ACK frame"),
    ],
)
def test_bad_c_frame_contents(inner: bytes, words: str) -> None:
    assert words in violation(encoder.compressed(2, inner))


# --- frames nested in C ------------------------------------------------------------------


def j(seq: int) -> bytes:
    return encoder.json_frame(seq, b'{"n":%d}' % seq)


def ev(*seqs: int) -> Events:
    return Events(2, [Event(seq, b'{"n":%d}' % seq, None) for seq in seqs])


def test_a_w_inside_a_c_is_a_new_window_in_order_with_the_events_around_it() -> None:
    stream = j(1) + encoder.compressed(2, j(2) + encoder.window(2, 2) + j(3) + j(4)) + j(5)
    answers = decode(stream)
    assert flat(answers) == flat([ev(1, 2), Window(2, 2), ev(3, 4, 5)])
    assert flat(one_byte_at_a_time(stream)) == flat(answers)
    # A W first in the C, and two in a row.
    stream = encoder.compressed(2, encoder.window(2, 0) + encoder.window(2, 1) + j(1))
    assert decode(stream) == [Window(2, 0), Window(2, 1), ev(1)]


def test_a_c_inside_a_c_is_inflated_with_its_w() -> None:
    inner = encoder.compressed(2, encoder.window(2, 2) + j(2) + j(3))
    stream = encoder.window(2, 1) + encoder.compressed(2, j(1) + inner) + j(4)
    answers = decode(stream)
    assert flat(answers) == flat([Window(2, 1), ev(1), Window(2, 2), ev(2, 3, 4)])
    assert flat(decode(stream, [3, 7, 11])) == flat(answers)
    # Version 1 nests the same way; without a W the events stay one run.
    d = encoder.data_frame
    v1 = encoder.compressed(1, d(1, {"a": "1"}) + encoder.compressed(1, d(2, {"b": "2"})))
    [events] = decode(v1)
    assert isinstance(events, Events) and [e.fields for e in events.events] == [
        {"a": "1"},
        {"b": "2"},
    ]


def nest(frames: bytes, depth: int) -> bytes:
    for _ in range(depth):
        frames = encoder.compressed(2, frames)
    return frames


def test_nesting_is_bounded_in_depth() -> None:
    limits = Limits(max_nesting=3)
    assert decode(nest(j(1), 3), limits=limits) == [ev(1)]
    assert "C frames nested more than 3 deep" in violation(nest(j(1), 4), limits)
    assert "nested more than 4 deep" in violation(nest(j(1), 1000))


def test_a_nested_zip_bomb_stops_at_max_decompressed_in_all() -> None:
    limits = Limits(max_decompressed=1 << 20)
    # Each layer under the limit, together over it: refused.
    half = encoder.json_frame(1, b" " * (600 << 10))
    two = encoder.compressed(2, half) + encoder.compressed(2, half)
    assert "nested C frames inflate past 1048576 bytes in all" in violation(
        encoder.compressed(2, two), limits
    )
    # A bomb inside small layers stops at the limit, never inflated whole.
    bomb = nest(encoder.json_frame(1, b" " * (256 << 20)), 3)
    assert len(bomb) < 300 << 10
    tracemalloc.start()
    try:
        receiver = Receiver(limits)
        receiver.receive_data(bomb)
        answer = receiver.next_event()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(answer, Violation) and "inflate past 1048576" in answer.reason
    assert peak < 6 << 20, peak


def test_a_w_inside_a_c_over_max_window_is_refused() -> None:
    limits = Limits(max_window=10)
    bad = encoder.compressed(2, j(1) + encoder.window(2, 11) + j(2))
    assert "window of 11 events (limit 10)" in violation(bad, limits)


def test_any_window_a_u32_can_say_is_accepted_by_default() -> None:
    assert decode(encoder.window(2, 0xFFFFFFFF) + j(1)) == [Window(2, 0xFFFFFFFF), ev(1)]


def test_bad_zlib_streams() -> None:
    assert "not a zlib stream" in violation(b"2C" + struct.pack(">I", 4) + b"abcd")
    cut = zlib.compress(encoder.json_frame(1, b"{}"))[:-3]
    assert "cut short" in violation(b"2C" + struct.pack(">I", len(cut)) + cut)
    extra = zlib.compress(encoder.json_frame(1, b"{}")) + b"junk"
    after = violation(b"2C" + struct.pack(">I", len(extra)) + extra)
    assert "4 bytes after the zlib stream" in after
    raw_deflate = zlib.compressobj(wbits=-15)
    body = raw_deflate.compress(encoder.json_frame(1, b"{}")) + raw_deflate.flush()
    assert "not a zlib stream" in violation(b"2C" + struct.pack(">I", len(body)) + body)


def test_violation_is_final_and_good_frames_before_it_come_first() -> None:
    receiver = Receiver()
    receiver.receive_data(encoder.json_frame(1, b"{}") + b"2Z" + encoder.json_frame(2, b"{}"))
    first = receiver.next_event()
    assert first == Events(2, [Event(1, b"{}", None)])
    bad = receiver.next_event()
    assert isinstance(bad, Violation) and "0x5a ('Z')" in bad.reason
    receiver.receive_data(encoder.json_frame(3, b"{}"))
    assert receiver.next_event() == bad
    assert receiver.buffered == 0


def test_a_bad_c_frame_yields_none_of_its_events() -> None:
    inner = encoder.json_frame(1, b"{}") + encoder.json_frame(2, b"{}")[:-1]
    answers = decode(encoder.json_frame(9, b"{}") + encoder.compressed(2, inner))
    assert answers[0] == Events(2, [Event(9, b"{}", None)])
    assert isinstance(answers[1], Violation) and len(answers) == 2


def test_encode_ack_and_ack_reader() -> None:
    with pytest.raises(ValueError):
        encode_ack(3, 1)
    reader = encoder.AckReader()
    data = encode_ack(2, 0) + encode_ack(2, 2048) + encode_ack(1, 2**32 - 1)
    assert reader.feed(data[:7]) == [(2, 0)]
    assert reader.feed(data[7:]) == [(2, 2048), (1, 2**32 - 1)]
    with pytest.raises(ValueError):
        reader.feed(b"2W\x00\x00\x00\x01")


def test_batch_rejects_payloads_of_the_wrong_kind() -> None:
    with pytest.raises(TypeError):
        encoder.batch([{"a": "b"}], version=2)
    with pytest.raises(TypeError):
        encoder.batch([b"{}"], version=1)
    assert decode(encoder.batch([{"a": "b"}], version=1, compress=False)) == [
        Window(1, 1),
        Events(1, [Event(1, b'{"a":"b"}', {"a": "b"})]),
    ]


def test_decoding_a_compressed_batch_costs_microseconds_per_event() -> None:
    # Beats' shape: W(2048) + C{2048 J frames of 300-byte JSON}. The decoder inflates once
    # and slices; about 0.8 us per event on the 2-core test machine. The bound is loose
    # (a loaded box), but per-byte Python work would cost hundreds of microseconds.
    rng = random.Random(7)
    payloads = []
    for i in range(2048):
        head = f'{{"@timestamp":"2026-11-25T00:00:{i % 60:02d}Z","n":{rng.randint(0, 10**9)},'
        payloads.append((head + '"message":"' + "x" * (300 - len(head) - 13) + '"}').encode())
    assert {len(p) for p in payloads} == {300}
    data = encoder.batch(payloads)
    best = float("inf")
    for _ in range(5):
        receiver = Receiver()
        start = time.perf_counter()
        receiver.receive_data(data)
        window, events = receiver.next_event(), receiver.next_event()
        best = min(best, time.perf_counter() - start)
        assert window == Window(2, 2048)
        assert isinstance(events, Events) and [e.payload for e in events.events] == payloads
    assert best / 2048 < 10e-6, f"{best / 2048 * 1e6:.2f} us per event"


def test_a_d_frame_dripped_a_byte_at_a_time_costs_each_pair_once() -> None:
    # 1,024 pairs (the default max_fields) of one-byte strings, about 10 KiB, fed one byte
    # per call: decoding from the frame's start on every call would read ~2 million
    # strings (seconds); resuming where the last call stopped reads each once.
    pairs = {f"{i:x}": "v" for i in range(1024)}
    data = encoder.data_frame(1, pairs)
    receiver = Receiver()
    start = time.perf_counter()
    answers: list[Answer] = []
    for i in range(len(data)):
        receiver.receive_data(data[i : i + 1])
        answers += drain(receiver)
    elapsed = time.perf_counter() - start
    assert answers == [Events(1, [Event(1, json.dumps(pairs).replace(" ", "").encode(), pairs)])]
    assert elapsed < 0.5, f"{elapsed:.2f} s"
