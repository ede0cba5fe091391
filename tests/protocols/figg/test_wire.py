"""The Figg wire format: the golden vectors of the reference implementation (andydunstall/figg
``utils/codec.go``) and the server replies derived from them, encoded byte for byte and
decoded in any split; round trips; and every kind of bad input the decoder refuses."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fqbroker.core.frames import encode_peer
from fqbroker.errors import FiggProtocolError, ProtocolError
from fqbroker.protocols.figg import wire
from fqbroker.protocols.figg.wire import (
    Ack,
    Attach,
    Attached,
    Data,
    Detach,
    Detached,
    Frame,
    FrameDecoder,
    Ping,
    Pong,
    Publish,
)

# What the reference client sends (its codec's output), then what our server answers,
# offsets in the message-counter model (docs/figg.md).
GOLDEN: list[tuple[str, Frame]] = [
    ("0001 0001 00000012 0000 00000004 6e657773 0000000000000000", Attach(b"news", None)),
    ("0001 0001 00000010 8000 00000002 7432     0000000000000000", Attach(b"t2", 0)),
    ("0003 0001 00000006 00000002 7432", Detach(b"t2")),
    (
        "0005 0001 00000014 00000002 7432 0000000000000000 00000002 6d30",
        Publish(b"t2", 0, b"m0"),
    ),
    ("0008 0001 00000008 18ea5623a618afbe", Ping(0x18EA5623A618AFBE)),
]
DERIVED: list[tuple[str, Frame]] = [
    ("0002 0001 00000010 00000004 6e657773 0000000000000000", Attached(b"news", 0)),
    ("0004 0001 00000006 00000002 7432", Detached(b"t2")),
    ("0006 0001 00000008 0000000000000000", Ack(0)),
    ("0007 0001 00000014 00000002 7432 0000000000000001 00000002 6d30", Data(b"t2", 1, b"m0")),
    ("0009 0001 00000008 18ea5623a618afbe", Pong(0x18EA5623A618AFBE)),
]
VECTORS = GOLDEN + DERIVED


def _hex(text: str) -> bytes:
    return bytes.fromhex("".join(text.split()))


def _decode_all(data: bytes, chunk: int | None = None) -> list[Frame]:
    decoder = FrameDecoder()
    frames: list[Frame] = []
    pieces = [data] if chunk is None else [data[i : i + chunk] for i in range(0, len(data), chunk)]
    for piece in pieces:
        decoder.receive_data(piece)
        while (frame := decoder.next_frame()) is not None:
            frames.append(frame)
    assert decoder.buffered == 0
    return frames


@pytest.mark.parametrize(("text", "frame"), VECTORS, ids=[type(f).__name__ for _, f in VECTORS])
def test_each_vector_is_encoded_exactly(text: str, frame: Frame) -> None:
    assert wire.encode(frame) == _hex(text)


@pytest.mark.parametrize(("text", "frame"), VECTORS, ids=[type(f).__name__ for _, f in VECTORS])
def test_each_vector_decodes_all_at_once_and_one_byte_at_a_time(text: str, frame: Frame) -> None:
    data = _hex(text)
    assert _decode_all(data) == [frame]
    decoder = FrameDecoder()
    for i, byte in enumerate(data):
        assert decoder.next_frame() is None  # nothing until the last byte
        assert decoder.buffered == i
        decoder.receive_data(bytes((byte,)))
    assert decoder.next_frame() == frame
    assert decoder.next_frame() is None


def test_all_vectors_in_one_stream_in_any_split() -> None:
    data = b"".join(_hex(text) for text, _ in VECTORS)
    frames = [frame for _, frame in VECTORS]
    for chunk in (None, 1, 3, 7, 8, 13):
        assert _decode_all(data, chunk) == frames


def test_the_fast_encoders_match_encode() -> None:
    assert wire.encode_publish(b"t2", 0, b"m0") == _hex(GOLDEN[3][0])
    assert wire.encode_data(b"t2", 1, b"m0") == _hex(DERIVED[3][0])
    assert wire.encode_ack(0) == _hex(DERIVED[2][0])
    # data_head then the data's u32 length and bytes, as a stored fq frame ends
    head = wire.data_head(b"t2", 1, 2)
    assert head + b"m0" == _hex(DERIVED[3][0])
    assert head[:-4] + struct.pack(">I", 2) + b"m0" == _hex(DERIVED[3][0])


def test_data_frames_are_the_data_frames_of_stored_frames_in_a_row() -> None:
    # Sizes change within the batch (the head is packed again), senders and hops differ.
    payloads = [b"m0", b"m1", b"", b"x" * 300, b"m4"]
    frames = [
        encode_peer(b"figg", b"t2", bytes(16), b"u" * i, b"\x0a\x00\x00\x01" * (i % 3), p)
        for i, p in enumerate(payloads)
    ]
    expected = b"".join(wire.encode_data(b"t2", 7 + i, p) for i, p in enumerate(payloads))
    assert wire.data_frames(b"t2", 7, frames) == expected
    assert wire.data_frames(b"t2", 7, frames[:1]) == _hex(DERIVED[3][0]).replace(
        struct.pack(">Q", 1), struct.pack(">Q", 7)
    )
    assert wire.data_frames(b"t2", 1, []) == b""


def test_the_version_is_ignored_on_read_and_other_attach_flags_too() -> None:
    data = bytearray(_hex(GOLDEN[3][0]))
    data[2:4] = b"\x00\x07"
    assert _decode_all(bytes(data)) == [Publish(b"t2", 0, b"m0")]
    attach = bytearray(_hex(GOLDEN[1][0]))
    attach[8:10] = b"\x80\x01"  # the offset flag and an unknown one
    attach[-1] = 5
    assert _decode_all(bytes(attach)) == [Attach(b"t2", 5)]
    attach[8:10] = b"\x7f\xff"  # every flag but the offset's: latest
    assert _decode_all(bytes(attach)) == [Attach(b"t2", None)]


def test_take_publishes_reads_a_run_and_stops_at_other_frames() -> None:
    decoder = FrameDecoder()
    run = [Publish(b"t", i, b"x" * i) for i in range(5)]
    stream = b"".join(wire.encode(p) for p in run)
    ping = wire.encode(Ping(9))
    decoder.receive_data(stream + ping + stream[:-1])
    out: list[tuple[bytes, int, bytes]] = []
    assert decoder.take_publishes(out, limit=3) == 3
    assert decoder.take_publishes(out) == 2
    assert out == [(p.topic, p.seq, p.data) for p in run]
    assert decoder.take_publishes(out) == 0  # a PING is next
    assert decoder.next_frame() == Ping(9)
    assert decoder.take_publishes(out) == 4  # the fifth has not all arrived
    decoder.receive_data(stream[-1:])
    assert decoder.take_publishes(out) == 1
    assert decoder.buffered == 0


topics = st.binary(min_size=1, max_size=wire.MAX_TOPIC)
u64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
frames = st.one_of(
    st.builds(Attach, topics, st.one_of(st.none(), u64)),
    st.builds(Attached, topics, u64),
    st.builds(Detach, topics),
    st.builds(Detached, topics),
    st.builds(Publish, topics, u64, st.binary(max_size=300)),
    st.builds(Ack, u64),
    st.builds(Data, topics, u64, st.binary(max_size=300)),
    st.builds(Ping, u64),
    st.builds(Pong, u64),
)


@given(st.lists(frames, max_size=12), st.integers(min_value=1, max_value=40))
def test_round_trip_in_any_split(sent: list[Frame], chunk: int) -> None:
    data = b"".join(wire.encode(frame) for frame in sent)
    assert _decode_all(data, chunk) == sent
    decoder = FrameDecoder()
    decoder.receive_data(data)
    out: list[tuple[bytes, int, bytes]] = []
    got: list[Frame] = []
    while True:  # the server's way: runs of PUBLISH fast, anything else one by one
        if decoder.take_publishes(out):
            got += [Publish(*fields) for fields in out]
            out.clear()
        elif (frame := decoder.next_frame()) is not None:
            got.append(frame)
        else:
            break
    assert got == sent


def _header(kind: int, size: int) -> bytes:
    return struct.pack(">HHI", kind, 1, size)


def _topic(topic: bytes) -> bytes:
    return struct.pack(">I", len(topic)) + topic


BAD: list[tuple[str, bytes, str]] = [
    ("unknown type 0", _header(0, 0), "unknown frame type 0"),
    ("unknown type 10", _header(10, 8) + bytes(8), "unknown frame type 10"),
    ("over max_frame", _header(wire.PUBLISH, 1025), "over the limit"),
    ("ping short", _header(wire.PING, 4) + bytes(4), "not 8"),
    ("ack long", _header(wire.ACK, 9) + bytes(9), "not 8"),
    (
        "topic length past payload",
        _header(wire.DETACH, 6) + struct.pack(">I", 3) + b"t2",
        "runs past",
    ),
    ("topic length missing", _header(wire.DETACH, 2) + b"t2", "too short"),
    ("bytes after detach", _header(wire.DETACH, 7) + _topic(b"t2") + b"!", "past its fields"),
    ("topic 128", _header(wire.DETACH, 132) + _topic(b"t" * 128), "topic of 128"),
    ("empty topic", _header(wire.DETACH, 4) + _topic(b""), "topic of 0"),
    ("attach no offset", _header(wire.ATTACH, 8) + b"\x80\x00" + _topic(b"t2"), "offset"),
    ("attach no flags", _header(wire.ATTACH, 1) + b"\x80", "flags"),
    ("attach extra", _header(wire.ATTACH, 17) + b"\0\0" + _topic(b"t2") + bytes(9), "past its"),
    ("attached short", _header(wire.ATTACHED, 10) + _topic(b"t2") + bytes(4), "offset"),
    (
        "publish data short",
        _header(wire.PUBLISH, 20) + _topic(b"t2") + struct.pack(">QI", 0, 3) + b"m0",
        "data of 3",
    ),
    (
        "publish data long",
        _header(wire.PUBLISH, 20) + _topic(b"t2") + struct.pack(">QI", 0, 1) + b"m0",
        "data of 1",
    ),
    ("publish no data length", _header(wire.PUBLISH, 14) + _topic(b"t2") + bytes(8), "too short"),
    (
        "data data short",
        _header(wire.DATA, 20) + _topic(b"t2") + struct.pack(">QI", 0, 3) + b"m0",
        "data of 3",
    ),
]


@pytest.mark.parametrize(("name", "data", "reason"), BAD, ids=[name for name, _, _ in BAD])
def test_bad_input_raises_and_stays_raised(name: str, data: bytes, reason: str) -> None:
    for chunk in (None, 1):
        decoder = FrameDecoder(max_frame=1024)
        pieces = [data] if chunk is None else [data[i : i + 1] for i in range(len(data))]
        with pytest.raises(FiggProtocolError, match=reason):
            for piece in pieces:
                decoder.receive_data(piece)
                while decoder.next_frame() is not None:
                    pass
        decoder.receive_data(wire.encode(Ping(1)))  # ignored: the error is final
        with pytest.raises(FiggProtocolError, match=reason):
            decoder.next_frame()
        with pytest.raises(FiggProtocolError, match=reason):
            decoder.take_publishes([])


def test_a_bad_publish_stops_the_fast_path_and_next_frame_names_it() -> None:
    good = wire.encode_publish(b"t2", 0, b"m0")
    bad = _header(wire.PUBLISH, 20) + _topic(b"t2") + struct.pack(">QI", 0, 3) + b"m0"
    decoder = FrameDecoder()
    decoder.receive_data(good + bad)
    out: list[tuple[bytes, int, bytes]] = []
    assert decoder.take_publishes(out) == 1
    assert decoder.take_publishes(out) == 0
    with pytest.raises(FiggProtocolError, match="data of 3"):
        decoder.next_frame()


def test_the_length_limit_is_checked_on_the_header_alone() -> None:
    decoder = FrameDecoder(max_frame=100)
    decoder.receive_data(_header(wire.PUBLISH, 101))
    with pytest.raises(FiggProtocolError):
        decoder.next_frame()
    decoder = FrameDecoder(max_frame=100)
    decoder.receive_data(_header(wire.PUBLISH, 100))
    assert decoder.next_frame() is None  # within the limit: waits for the payload


def test_the_error_is_a_protocol_error() -> None:
    assert issubclass(FiggProtocolError, ProtocolError)
