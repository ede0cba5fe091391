"""The fyrehose datagram format: the derived datagrams byte for byte, round trips, bad input."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fqbroker.errors import FyrehoseProtocolError, ProtocolError
from fqbroker.protocols.fyrehose import wire
from fqbroker.protocols.fyrehose.wire import (
    MAX_DATA,
    MAX_DATAGRAM,
    MAX_SEQUENCE,
    ZERO_TOKEN,
    Datagram,
    Deliver,
    Flags,
    Forward,
    Keepalive,
    KeepaliveAck,
    Push,
    Request,
    decode,
    encode,
)

TOKEN = bytes(range(16))

# Datagrams derived by hand from the layouts (127.0.0.1:2323, token 000102...0f): both
# forms of KEEPALIVE and PUSH, both KEEPALIVE-ACKs, DELIVER, REQUEST and FORWARD.
DERIVED: list[tuple[str, Datagram]] = [
    ("10 7f000001 0913", Keepalive("127.0.0.1", 2323, seed=True)),
    (
        "10 7f000001 0913 000000000002 000102030405060708090a0b0c0d0e0f",
        Keepalive("127.0.0.1", 2323, Flags.NOJOURNAL, TOKEN),
    ),
    ("20 000102030405060708090a0b0c0d0e0f", KeepaliveAck(TOKEN)),
    ("20 00000000000000000000000000000000", KeepaliveAck(ZERO_TOKEN)),
    ("02 0002 6869", Push(b"hi", seed=True)),
    ("02 0002 000000000000 6869", Push(b"hi")),
    ("01 0002 000000000001 6869", Deliver(1, b"hi")),
    ("04 7f000001 0913 000000000005 000000000007", Request("127.0.0.1", 2323, 5, 7)),
    ("08 7f000001 0913 000000000005 000000000007", Forward("127.0.0.1", 2323, 5, 7)),
]
SIZES = [7, 29, 17, 17, 5, 11, 11, 19, 19]


@pytest.mark.parametrize(("hexed", "datagram"), DERIVED)
def test_the_derived_datagrams_byte_for_byte(hexed: str, datagram: Datagram) -> None:
    raw = bytes.fromhex(hexed)
    assert encode(datagram) == raw
    assert decode(raw) == datagram


def test_the_derived_sizes() -> None:
    assert [len(bytes.fromhex(h)) for h, _ in DERIVED] == SIZES


def test_keepalive_ack_echoes_the_token_and_zeros_for_the_seed_form() -> None:
    final = decode(bytes.fromhex(DERIVED[1][0]))
    seed = decode(bytes.fromhex(DERIVED[0][0]))
    assert isinstance(final, Keepalive) and isinstance(seed, Keepalive)
    assert encode(final.ack()) == bytes.fromhex(DERIVED[2][0])
    assert encode(seed.ack()) == bytes.fromhex(DERIVED[3][0])
    assert seed.flags == Flags(0) and seed.seed and not final.seed


def test_the_push_forms_are_told_apart_by_size() -> None:
    # The same 9 bytes after the LENGTH are data in the seed form and unused+data in the final.
    assert decode(bytes.fromhex("02 0008 000000000000 6869")) == Push(bytes(6) + b"hi", seed=True)
    assert decode(bytes.fromhex("02 0002 000000000000 6869")) == Push(b"hi")
    assert decode(b"\x02\x00\x00") == Push(b"", seed=True)
    assert decode(b"\x02\x00\x00" + bytes(6)) == Push(b"")


def test_the_unused_bytes_of_a_push_are_ignored_and_written_as_zeros() -> None:
    got = decode(bytes.fromhex("02 0002 ffffffffffff 6869"))
    assert got == Push(b"hi")
    assert encode(got) == bytes.fromhex("02 0002 000000000000 6869")


def test_unknown_flag_bits_are_dropped_and_flags_combine() -> None:
    raw = bytes.fromhex("10 00000000 0000 0000000000ff") + TOKEN
    assert decode(raw) == Keepalive("0.0.0.0", 0, Flags.NOSUBSCRIBE | Flags.NOJOURNAL, TOKEN)


def test_the_limits() -> None:
    assert MAX_DATAGRAM == 65535 - 20 - 8
    assert MAX_DATA == MAX_DATAGRAM - 9
    big = Deliver(MAX_SEQUENCE, bytes(MAX_DATA))
    assert len(encode(big)) == MAX_DATAGRAM
    assert decode(encode(big)) == big
    assert decode(encode(Push(bytes(MAX_DATA), seed=True))) == Push(bytes(MAX_DATA), seed=True)


# --- round trips ---------------------------------------------------------------------------

seqs = st.integers(1, MAX_SEQUENCE)
datas = st.binary(max_size=300) | st.binary(min_size=MAX_DATA - 2, max_size=MAX_DATA)
addrs = st.ip_addresses(v=4).map(str) | st.sampled_from(["0.0.0.0", "127.0.0.1"])
ports = st.integers(0, 0xFFFF)
tokens = st.binary(min_size=16, max_size=16)
flags = st.sampled_from([*Flags, Flags(0), Flags.NOSUBSCRIBE | Flags.NOJOURNAL])


@st.composite
def ranges(draw: st.DrawFn, cls: type[Request] | type[Forward]) -> Request | Forward:
    a, b = sorted((draw(seqs), draw(seqs)))
    return cls(draw(addrs), draw(ports), a, b)


datagrams: st.SearchStrategy[Datagram] = st.one_of(
    st.builds(Deliver, seqs, datas),
    st.builds(Push, datas, st.booleans()),
    ranges(Request),
    ranges(Forward),
    st.builds(Keepalive, addrs, ports, flags, tokens),
    st.builds(lambda a, p: Keepalive(a, p, seed=True), addrs, ports),
    st.builds(KeepaliveAck, tokens),
)


@given(datagrams)
def test_round_trip(d: Datagram) -> None:
    raw = encode(d)
    assert len(raw) <= MAX_DATAGRAM
    assert decode(raw) == d
    assert encode(decode(raw)) == raw


@given(st.binary(max_size=64))
def test_decode_raises_only_the_protocol_error_and_round_trips_what_it_accepts(
    raw: bytes,
) -> None:
    try:
        d = decode(raw)
    except FyrehoseProtocolError:
        return
    assert decode(encode(d)) == d


# --- bad input -----------------------------------------------------------------------------

FULL = [bytes.fromhex(h) for h, _ in DERIVED]


def _reforms(raw: bytes, cut: bytes) -> Datagram | None:
    """What a datagram of ``raw``'s kind cut or grown to ``cut`` is, where size decides the form.

    A final KEEPALIVE cut to 7 bytes is a whole seed KEEPALIVE, and a PUSH whose size
    changed by exactly 6 bytes is the other form of PUSH: the datagram's size is all that
    tells the forms apart (wire.py says why). Everything else is refused.
    """
    if raw[0] == wire.KEEPALIVE and len(cut) == 7:
        return Keepalive("127.0.0.1", 2323, seed=True)
    length = int.from_bytes(raw[1:3], "big")
    if raw[0] == wire.PUSH and len(cut) == 3 + length:
        return Push(cut[3:], seed=True)
    if raw[0] == wire.PUSH and len(cut) == 9 + length:
        return Push(cut[9:])
    return None


CUTS = [(raw, raw[:n]) for raw in FULL for n in range(len(raw))]
GROWN = [(raw, raw + bytes(extra)) for raw in FULL for extra in (1, 5, 6, 7, 30)]


def test_the_cases_where_size_decides_the_form_are_there() -> None:
    assert sum(_reforms(raw, cut) is not None for raw, cut in CUTS) == 2  # a KEEPALIVE, a PUSH
    assert sum(_reforms(raw, cut) is not None for raw, cut in GROWN) == 1  # the seed PUSH + 6


@pytest.mark.parametrize(("raw", "cut"), CUTS, ids=lambda r: r.hex() or "empty")
def test_every_truncation_of_every_kind_is_refused(raw: bytes, cut: bytes) -> None:
    other_form = _reforms(raw, cut)
    if other_form is not None:
        assert decode(cut) == other_form
        return
    with pytest.raises(FyrehoseProtocolError):
        decode(cut)


@pytest.mark.parametrize(("raw", "grown"), GROWN, ids=lambda r: r.hex())
def test_trailing_bytes_are_refused(raw: bytes, grown: bytes) -> None:
    other_form = _reforms(raw, grown)
    if other_form is not None:
        assert decode(grown) == other_form
        return
    with pytest.raises(FyrehoseProtocolError):
        decode(grown)


def test_a_seed_push_grown_by_six_bytes_reads_as_the_final_form() -> None:
    assert decode(bytes.fromhex("02 0002 6869") + bytes(6)) == Push(bytes(2))
    assert decode(bytes.fromhex("02 0002 000000000000 6869")[:5]) == Push(bytes(2), seed=True)


@pytest.mark.parametrize("kind", [0x00, 0x03, 0x05, 0x40, 0x80, 0xFF, 0x11, 0x21])
def test_unknown_types_are_refused(kind: int) -> None:
    for body in (b"", bytes(16), bytes(28)):
        with pytest.raises(FyrehoseProtocolError, match="unknown"):
            decode(bytes((kind,)) + body)


@pytest.mark.parametrize(
    "hexed",
    [
        "01 0002 000000000001 68",  # DELIVER shorter than its LENGTH
        "01 0002 000000000001 686969",  # longer
        "01 0002 6869",  # DELIVER has no seed form
        "01 0002 000000000000 6869",  # sequence 0
        "02 0003 000000000000 6869",  # PUSH of neither size
        "02 0000 00",
        "04 7f000001 0913 000000000000 000000000007",  # FROM_SEQ 0
        "08 7f000001 0913 000000000007 000000000005",  # an empty range
        "10 7f000001 0913 00",  # KEEPALIVE of neither size
        "20 00",
    ],
)
def test_malformed_datagrams_are_refused(hexed: str) -> None:
    with pytest.raises(FyrehoseProtocolError):
        decode(bytes.fromhex(hexed))


def test_oversized_datagrams_and_lengths_are_refused() -> None:
    with pytest.raises(FyrehoseProtocolError, match="over the limit"):
        decode(b"\x02\xff\xff" + bytes(MAX_DATAGRAM - 3 + 1))
    with pytest.raises(FyrehoseProtocolError, match="over the limit"):
        decode(b"\x02" + (MAX_DATA + 1).to_bytes(2, "big") + bytes(MAX_DATA + 1))  # seed form
    with pytest.raises(FyrehoseProtocolError, match="over the limit"):
        decode(encode(Push(b"x")) + bytes(MAX_DATAGRAM))


def test_the_error_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        decode(b"")


@pytest.mark.parametrize(
    "d",
    [
        Deliver(MAX_SEQUENCE + 1, b"x"),
        Deliver(0, b"x"),
        Deliver(-1, b"x"),
        Request("127.0.0.1", 1, 1, MAX_SEQUENCE + 1),
        Forward("127.0.0.1", 1, 0, 5),
        Forward("127.0.0.1", 1, 6, 5),
        Request("127.0.0.1", 65536, 1, 1),
        Request("::1", 1, 1, 1),
        Request("127.1", 1, 1, 1),
        Deliver(1, bytes(MAX_DATA + 1)),
        Push(bytes(MAX_DATA + 1), seed=True),
        Keepalive("127.0.0.1", 1, Flags.NOJOURNAL, seed=True),
        Keepalive("127.0.0.1", 1, token=TOKEN, seed=True),
        Keepalive("127.0.0.1", 1, Flags(1 << 48)),
        Keepalive("127.0.0.1", 1, token=b"short"),
        KeepaliveAck(bytes(17)),
    ],
    ids=repr,
)
def test_encode_refuses_fields_out_of_range(d: Datagram) -> None:
    with pytest.raises(ValueError):
        encode(d)


@given(st.ip_addresses(v=4))
def test_addresses_are_ipv4_dotted_quads(addr: ipaddress.IPv4Address) -> None:
    got = decode(encode(Request(str(addr), 1, 1, 1)))
    assert isinstance(got, Request) and ipaddress.IPv4Address(got.addr) == addr
