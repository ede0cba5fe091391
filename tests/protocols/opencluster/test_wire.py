"""The OpenCluster wire codec (protocols/opencluster/wire.py) against the vectors of the
Nov-2011 protocol, byte for byte, and the 2011 C client's FNV-1a hash compiled with gcc."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from fqbroker.errors import OpenClusterProtocolError, ProtocolError
from fqbroker.protocols.opencluster import wire
from fqbroker.protocols.opencluster.wire import Frame, FrameDecoder

MAX = 1 << 20


def h(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", "").replace("|", "").replace("\n", ""))


GOLDEN_SET_INT = h(
    "07d0 0000 00000000 00000020 | 00000000 0a6f8dc5 00000000 00000000 00000008"
    " 7465737464617461 0000002d"
)
HELLO = h("000a 0000 00000000 00000000")
ACK_HELLO = h("0001 000a 00000000 00000000")
SERVERLIST_0 = h("0064 0000 00000000 00000004 00000000")
HASHMASKS_UID1 = h("006e 0000 00000001 00000088 0000000f 00000010") + b"".join(
    struct.pack(">ii", bucket, 0) for bucket in range(16)
)
GET_INT_TESTDATA = h("0834 0000 00000000 00000008 00000000 0a6f8dc5")
DATA_INT_45 = h("0839 0834 00000000 0000000c 00000000 0a6f8dc5 0000002d")
FAIL_GET_INT = h("0002 0834 00000000 00000000")

ALL_BUCKETS = [(bucket, 0) for bucket in range(16)]


# --- the vectors of the protocol notes, byte for byte --------------------------------------


def test_the_golden_vector_set_int_testdata_45() -> None:
    assert wire.set_int(0, b"testdata", 45) == GOLDEN_SET_INT
    assert len(GOLDEN_SET_INT) == wire.HEADER_SIZE + 0x20


def test_the_derived_vectors() -> None:
    assert wire.hello(0) == HELLO
    assert wire.ack(wire.HELLO, 0) == ACK_HELLO
    assert wire.serverlist(0, []) == SERVERLIST_0
    assert wire.hashmasks(1, 0x0F, ALL_BUCKETS) == HASHMASKS_UID1
    assert len(HASHMASKS_UID1) == 12 + 0x88
    assert wire.get_int(0, b"testdata") == GET_INT_TESTDATA
    assert wire.data_int(0, 0, 0x0A6F8DC5, 45) == DATA_INT_45
    assert wire.fail(wire.GET_INT, 0) == FAIL_GET_INT


def test_the_vectors_decode_to_what_they_say() -> None:
    stream = GOLDEN_SET_INT + HELLO + ACK_HELLO + SERVERLIST_0 + HASHMASKS_UID1 + GET_INT_TESTDATA
    stream += DATA_INT_45 + FAIL_GET_INT
    decoder = FrameDecoder(MAX)
    decoder.receive_data(stream)
    frames = []
    while (frame := decoder.next_frame()) is not None:
        frames.append(frame)
    assert [(f.command, f.repcmd, f.userid) for f in frames] == [
        (2000, 0, 0),
        (10, 0, 0),
        (1, 10, 0),
        (100, 0, 0),
        (110, 0, 1),
        (2100, 0, 0),
        (2105, 2100, 0),
        (2, 2100, 0),
    ]
    assert decoder.buffered == 0
    assert wire.decode_set(wire.SET_INT, frames[0].payload) == wire.SetValue(
        0, 0x0A6F8DC5, 0, 0, b"testdata", 45
    )
    assert wire.set_fields(wire.SET_INT, frames[0].payload) == (
        0,
        0x0A6F8DC5,
        0,
        0,
        b"testdata",
        45,
    )
    assert frames[1].payload == frames[2].payload == b""
    assert wire.decode_serverlist(frames[3].payload) == []
    assert wire.decode_hashmasks(frames[4].payload) == (0x0F, ALL_BUCKETS)
    assert wire.decode_get(frames[5].payload) == (0, 0x0A6F8DC5)
    assert wire.decode_data_int(frames[6].payload) == (0, 0x0A6F8DC5, 45)
    assert frames[7].payload == b""


def test_every_other_frame_round_trips() -> None:
    name = b"clientname"
    key = 0x29F6A27D
    cases: list[tuple[bytes, Frame]] = [
        (wire.set_string(7, name, b"v\x00\xff", expires=30, map_hash=5), Frame(2020, 0, 7, b"")),
        (wire.get_string(8, name), Frame(2120, 0, 8, struct.pack(">II", 0, key))),
        (wire.data_str(8, 0, key, b"xyz"), Frame(2125, 2120, 8, b"")),
        (wire.failinfo(2100, 9, 1, b"wrong type: string"), Frame(3, 2100, 9, b"")),
        (wire.tryelsewhere(2000, 2, b"10.0.0.1:13600"), Frame(4, 2000, 2, b"")),
        (wire.unknown(1000, 3), Frame(9, 1000, 3, b"")),
        (wire.capabilities(4, wire.SET_INT), Frame(11, 0, 4, b"\x07\xd0")),
        (wire.serverhello(5, b"127.0.0.1:13600"), Frame(50, 0, 5, b"")),
        (wire.ping(6), Frame(30, 0, 6, b"")),
        (wire.goodbye(6), Frame(20, 0, 6, b"")),
        (wire.shuttingdown(6), Frame(15, 0, 6, b"")),
        (wire.serverlist(2, [b"a:1", b"bb:2"]), Frame(100, 0, 2, b"")),
        (wire.set_int(-1, name, -(2**31), expires=0), Frame(2000, 0, -1, b"")),
    ]
    for data, want in cases:
        decoder = FrameDecoder(MAX)
        decoder.receive_data(data)
        got = decoder.next_frame()
        assert got is not None
        assert (got.command, got.repcmd, got.userid) == (want.command, want.repcmd, want.userid)
        if want.payload:
            assert got.payload == want.payload
        assert wire.HEADER_SIZE + len(got.payload) == len(data)
    set_str = wire.decode_set(
        wire.SET_STRING, wire.set_string(7, name, b"v\x00\xff", expires=30, map_hash=5)[12:]
    )
    assert set_str == wire.SetValue(5, key, 30, 0, name, b"v\x00\xff")
    assert wire.decode_data_str(wire.data_str(8, 0, key, b"xyz")[12:]) == (0, key, b"xyz")
    assert wire.decode_failinfo(wire.failinfo(2100, 9, 1, b"wrong type")[12:]) == (1, b"wrong type")
    assert wire.decode_tryelsewhere(wire.tryelsewhere(1, 2, b"h:1")[12:]) == b"h:1"
    assert wire.decode_capabilities(wire.capabilities(4, 2020)[12:]) == 2020
    assert wire.decode_serverhello(wire.serverhello(5, b"x:1")[12:]) == b"x:1"
    assert wire.decode_serverlist(wire.serverlist(2, [b"a:1", b"bb:2"])[12:]) == [b"a:1", b"bb:2"]
    negative = wire.decode_set(wire.SET_INT, wire.set_int(0, name, -(2**31))[12:])
    assert negative.value == -(2**31)


def test_hashes_are_written_as_the_c_int_and_read_unsigned() -> None:
    # A hash over 2**31 is the same 32 bits whether given signed or unsigned.
    assert wire.data_int(0, -1, 0x8000_0000, 1) == wire.data_int(0, 0xFFFF_FFFF, -(2**31), 1)
    assert wire.decode_data_int(wire.data_int(0, -1, -(2**31), -5)[12:]) == (
        0xFFFF_FFFF,
        0x8000_0000,
        -5,
    )


# --- FNV-1a ---------------------------------------------------------------------------------


def test_fnv1a_check_values() -> None:
    assert wire.fnv1a32(b"testdata") == 0x0A6F8DC5
    assert wire.fnv1a32(b"clientname") == 0x29F6A27D
    assert wire.fnv1a32(b"") == 2166136261


def _standard_fnv1a(data: bytes) -> int:
    value = 2166136261
    for b in data:
        value = ((value ^ b) * 16777619) & 0xFFFFFFFF
    return value


def test_bytes_over_0x7f_are_sign_extended_as_the_c_client_did() -> None:
    # ASCII agrees with the textbook FNV-1a; a byte >= 0x80 does not (the C char is signed).
    assert wire.fnv1a32(b"abc") == _standard_fnv1a(b"abc")
    assert wire.fnv1a32("é".encode()) != _standard_fnv1a("é".encode())


# The hash exactly as the 2011 C client (clients/c/libopencluster.c, generate_hash_str) has
# it: a signed int accumulator and a (signed) char cast to int.
C_HASH = r"""
#include <stdio.h>
#include <string.h>
unsigned int generate_hash_str(const char *str, const int length)
{
	register int i;
	register int hash = 2166136261l;
	for (i=0; i<length; i++)  {
		hash ^= (int)str[i];
		hash *= 16777619;
	}
	return(hash);
}
int main(int argc, char **argv)
{
	int i;
	for (i = 1; i < argc; i++) printf("%08x\n", generate_hash_str(argv[i], strlen(argv[i])));
	return 0;
}
"""


def test_fnv1a_matches_the_2011_c_code_compiled_with_gcc(tmp_path: Path) -> None:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed")
    source = tmp_path / "hash.c"
    source.write_text(C_HASH)
    binary = tmp_path / "hash"
    # -fsigned-char: the 2011 client ran on x86, where char is signed (it is not on ARM);
    # -fwrapv: the signed overflow the code relies on, defined as the machine did it.
    subprocess.run(
        [gcc, "-O0", "-fsigned-char", "-fwrapv", "-o", str(binary), str(source)],
        check=True,
        timeout=60,
    )
    names = [b"testdata", b"clientname", "héllo wörld".encode(), bytes(range(0x80, 0x100))[:64]]
    names.append(b"\xff")
    out = subprocess.run(
        [str(binary), *names], check=True, capture_output=True, timeout=30
    ).stdout.split()
    assert [int(x, 16) for x in out] == [wire.fnv1a32(n) for n in names]
    assert int(out[0], 16) == 0x0A6F8DC5


# --- the decoder: any split, strict, final --------------------------------------------------


def _every_frame() -> bytes:
    return b"".join(
        [
            GOLDEN_SET_INT,
            HELLO,
            ACK_HELLO,
            SERVERLIST_0,
            HASHMASKS_UID1,
            GET_INT_TESTDATA,
            DATA_INT_45,
            FAIL_GET_INT,
            wire.set_string(3, b"k", b"value"),
            wire.get_string(4, b"k"),
            wire.data_str(4, 0, wire.fnv1a32(b"k"), b"value"),
            wire.failinfo(2100, 5, 1, b"wrong type: string"),
            wire.unknown(1000, 6),
            wire.capabilities(7, 2000),
            wire.serverhello(8, b"127.0.0.1:13600"),
            wire.encode_frame(12345, 0, 9, b"opaque"),  # an unknown command is still framed
            wire.ping(10),
            wire.goodbye(11),
        ]
    )


def _drain(decoder: FrameDecoder) -> list[Frame]:
    frames = []
    while (frame := decoder.next_frame()) is not None:
        frames.append(frame)
    return frames


def test_each_frame_decodes_fed_one_byte_at_a_time() -> None:
    stream = _every_frame()
    whole = FrameDecoder(MAX)
    whole.receive_data(stream)
    want = _drain(whole)
    assert len(want) == 18
    decoder = FrameDecoder(MAX)
    got: list[Frame] = []
    for i in range(len(stream)):
        decoder.receive_data(stream[i : i + 1])
        got.extend(_drain(decoder))
    assert got == want
    assert decoder.buffered == 0


def test_take_gives_the_same_frames_as_tuples_in_any_split() -> None:
    stream = _every_frame()
    whole = FrameDecoder(MAX)
    whole.receive_data(stream)
    want = [(f.command, f.repcmd, f.userid, f.payload) for f in _drain(whole)]
    for step in (1, 5, 13, 100, len(stream)):
        decoder = FrameDecoder(MAX)
        got: list[tuple[int, int, int, bytes]] = []
        for i in range(0, len(stream), step):
            decoder.receive_data(stream[i : i + step])
            decoder.take(got)
        assert got == want, step
    limited = FrameDecoder(MAX)
    limited.receive_data(stream)
    some: list[tuple[int, int, int, bytes]] = []
    assert limited.take(some, 3) == 3
    assert limited.take(some) == len(want) - 3
    assert some == want


def _assert_final(decoder: FrameDecoder) -> None:
    with pytest.raises(OpenClusterProtocolError) as first:
        decoder.next_frame()
    decoder.receive_data(HELLO)  # nothing after the error is decoded
    with pytest.raises(OpenClusterProtocolError) as again:
        decoder.next_frame()
    assert again.value is first.value
    with pytest.raises(OpenClusterProtocolError):
        decoder.take([])


def test_a_negative_length_is_a_protocol_error() -> None:
    decoder = FrameDecoder(MAX)
    decoder.receive_data(struct.pack(">hhii", wire.PING, 0, 0, -1))
    _assert_final(decoder)
    assert issubclass(OpenClusterProtocolError, ProtocolError)


def test_an_oversize_length_fails_on_the_header_before_its_bytes_arrive() -> None:
    decoder = FrameDecoder(100)
    decoder.receive_data(HELLO + struct.pack(">hhii", wire.SET_STRING, 0, 1, 101))
    assert decoder.next_frame() == Frame(wire.HELLO, 0, 0, b"")
    with pytest.raises(OpenClusterProtocolError, match="over the limit of 100"):
        decoder.next_frame()
    _assert_final(decoder)
    exact = FrameDecoder(100)
    exact.receive_data(struct.pack(">hhii", wire.SET_STRING, 0, 1, 100))
    assert exact.next_frame() is None  # at the limit: waits for its bytes


def test_take_hands_out_the_good_frames_before_the_bad_one() -> None:
    decoder = FrameDecoder(MAX)
    decoder.receive_data(HELLO + GET_INT_TESTDATA + struct.pack(">hhii", wire.PING, 0, 0, -7))
    got: list[tuple[int, int, int, bytes]] = []
    with pytest.raises(OpenClusterProtocolError):
        decoder.take(got)
    assert [t[0] for t in got] == [wire.HELLO, wire.GET_INT]
    _assert_final(decoder)


def _set_payload(name_len: int, name: bytes, tail: bytes) -> bytes:
    return struct.pack(">IIiii", 0, 1, 0, 0, name_len) + name + tail


@pytest.mark.parametrize(
    ("command", "payload"),
    [
        (wire.SET_INT, b""),
        (wire.SET_INT, b"\x00" * 19),
        (wire.SET_INT, _set_payload(-1, b"", b"\x00\x00\x00\x01")),
        (wire.SET_INT, _set_payload(4, b"name", b"\x00\x00\x00")),  # value short
        (wire.SET_INT, _set_payload(4, b"name", b"\x00" * 5)),  # a byte past the value
        (wire.SET_INT, _set_payload(100, b"name", b"\x00\x00\x00\x01")),  # over-long name
        (wire.SET_STRING, _set_payload(4, b"name", b"")),  # no value length
        (wire.SET_STRING, _set_payload(4, b"name", struct.pack(">i", -3))),
        (wire.SET_STRING, _set_payload(4, b"name", struct.pack(">i", 9) + b"short")),
        (wire.SET_STRING, _set_payload(4, b"name", struct.pack(">i", 1) + b"ab")),
        (wire.SET_STRING, _set_payload(99, b"name", struct.pack(">i", 0))),
        (wire.SET_STRING, _set_payload(2**31 - 1, b"name", b"")),
        (wire.GET_INT, b"\x00" * 4),  # decode_set refuses what is not a set
    ],
)
def test_bad_set_payloads_are_protocol_errors(command: int, payload: bytes) -> None:
    with pytest.raises(OpenClusterProtocolError):
        wire.decode_set(command, payload)
    with pytest.raises(OpenClusterProtocolError):
        wire.set_fields(command, payload)


def test_other_bad_payloads_are_protocol_errors() -> None:
    bad = [
        (wire.decode_get, b"\x00" * 7),
        (wire.decode_get, b"\x00" * 9),
        (wire.decode_capabilities, b"\x00"),
        (wire.decode_capabilities, b"\x00" * 4),
        (wire.decode_serverhello, b""),
        (wire.decode_serverhello, struct.pack(">i", -1)),
        (wire.decode_serverhello, struct.pack(">i", 5) + b"abcd"),
        (wire.decode_serverhello, struct.pack(">i", 1) + b"ab"),
        (wire.decode_failinfo, b"\x00\x00\x00"),
        (wire.decode_failinfo, struct.pack(">ii", 1, -2)),
        (wire.decode_failinfo, struct.pack(">ii", 1, 3) + b"ab"),
        (wire.decode_data_int, b"\x00" * 11),
        (wire.decode_data_int, b"\x00" * 13),
        (wire.decode_data_str, b"\x00" * 11),
        (wire.decode_data_str, struct.pack(">IIi", 0, 0, -1)),
        (wire.decode_data_str, struct.pack(">IIi", 0, 0, 4) + b"abc"),
        (wire.decode_serverlist, b"\x00"),
        (wire.decode_serverlist, struct.pack(">i", -1)),
        (wire.decode_serverlist, struct.pack(">i", 2) + wire.encode_string(b"a")),
        (wire.decode_serverlist, struct.pack(">i", 0) + b"x"),
        (wire.decode_hashmasks, struct.pack(">i", 15)),
        (wire.decode_hashmasks, struct.pack(">ii", 15, -1)),
        (wire.decode_hashmasks, struct.pack(">iii", 15, 1, 0)),
        (wire.decode_hashmasks, struct.pack(">iiiii", 15, 1, 0, 0, 0)),
    ]
    for decode, payload in bad:
        with pytest.raises(OpenClusterProtocolError):
            decode(payload)  # type: ignore[operator]


def test_never_specified_commands() -> None:
    assert {130, 200, 1000, 1010, 2010, 2110, 2200} == wire.NEVER_SPECIFIED
