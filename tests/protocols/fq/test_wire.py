"""Conformance of the sans-IO codec: exact bytes both ways, any split of the input."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fqbroker.core.message import Message, Run, message_from_frame
from fqbroker.errors import AuthError, FrameTooLarge, ProtocolError
from fqbroker.protocols.fq import wire
from fqbroker.protocols.fq.msgdecoder import MessageDecoder
from tests.vectors import (
    CLIENT_COMMANDS,
    ERROR_TEXTS,
    PEER_MESSAGE,
    PEER_MESSAGE_BYTES,
    PUBLISH_MESSAGE_BYTES,
    SERVER_REPLIES,
    STATUS_KEYS,
)


def _ids(table: list[tuple[str, wire.Frame, bytes]]) -> list[str]:
    return [name for name, _, _ in table]


def decode_all(decoder_factory, data: bytes, chunk: int | None):  # type: ignore[no-untyped-def]
    """Feed ``data`` whole (chunk None) or ``chunk`` bytes at a time; collect every frame."""
    decoder = decoder_factory()
    frames = []
    pieces = [data] if chunk is None else [data[i : i + chunk] for i in range(0, len(data), chunk)]
    for piece in pieces:
        decoder.feed(piece)
        while (frame := _next(decoder)) is not None:
            frames.append(frame)
    return frames, decoder


def _next(decoder):  # type: ignore[no-untyped-def]
    if isinstance(decoder, MessageDecoder):
        return decoder.next_message()
    if isinstance(decoder, wire.DataHelloDecoder):
        return decoder.next_hello()
    return decoder.next_frame()


@pytest.mark.parametrize(("name", "frame", "data"), CLIENT_COMMANDS, ids=_ids(CLIENT_COMMANDS))
def test_client_command_bytes(name: str, frame: wire.Frame, data: bytes) -> None:
    assert wire.encode(frame) == data


@pytest.mark.parametrize(("name", "frame", "data"), SERVER_REPLIES, ids=_ids(SERVER_REPLIES))
def test_server_reply_bytes(name: str, frame: wire.Frame, data: bytes) -> None:
    assert wire.encode(frame) == data


def _server_decoder_after_auth() -> wire.ServerCommandDecoder:
    decoder = wire.ServerCommandDecoder()
    decoder.feed(wire.encode(wire.AuthPlain(b"u", b"q", b"p")))
    assert isinstance(decoder.next_frame(), wire.AuthPlain)
    return decoder


@pytest.mark.parametrize("chunk", [None, 1, 2, 3, 7])
@pytest.mark.parametrize(("name", "frame", "data"), CLIENT_COMMANDS, ids=_ids(CLIENT_COMMANDS))
def test_server_decodes_client_commands(
    name: str, frame: wire.Frame, data: bytes, chunk: int | None
) -> None:
    factory = (
        wire.ServerCommandDecoder
        if isinstance(frame, wire.AuthPlain)
        else _server_decoder_after_auth
    )
    frames, decoder = decode_all(factory, data, chunk)
    assert frames == [frame]
    assert decoder.buffered == 0


@pytest.mark.parametrize("chunk", [None, 1, 5])
@pytest.mark.parametrize(("name", "frame", "data"), SERVER_REPLIES, ids=_ids(SERVER_REPLIES))
def test_client_decodes_server_replies(
    name: str, frame: wire.Frame, data: bytes, chunk: int | None
) -> None:
    frames, decoder = decode_all(wire.ClientCommandDecoder, data, chunk)
    assert frames == [frame]
    assert decoder.buffered == 0


def test_one_byte_at_a_time_yields_nothing_until_the_last_byte() -> None:
    for _, frame, data in SERVER_REPLIES:
        decoder = wire.ClientCommandDecoder()
        for i, byte in enumerate(data):
            decoder.feed(bytes([byte]))
            got = decoder.next_frame()
            assert (got is None) == (i < len(data) - 1), (frame, i)


def test_trailing_bytes_are_left_for_the_next_frame() -> None:
    decoder = wire.ClientCommandDecoder()
    decoder.feed(wire.encode(wire.BindResponse(5)) + b"\xbe")
    assert decoder.next_frame() == wire.BindResponse(5)
    assert decoder.next_frame() is None
    assert decoder.buffered == 1
    decoder.feed(b"\xa7")
    assert decoder.next_frame() == wire.Heartbeat()


def test_pipelined_commands_decode_in_order() -> None:
    frames = [f for _, f, _ in CLIENT_COMMANDS if not isinstance(f, wire.AuthPlain)]
    data = b"".join(wire.encode(f) for f in frames)
    for chunk in (None, 1, 4):
        got, _ = decode_all(_server_decoder_after_auth, data, chunk)
        assert got == frames


def test_status_reply_round_trip_with_all_keys() -> None:
    items = tuple((k, i) for i, k in enumerate(STATUS_KEYS))
    data = wire.encode(wire.Status(items))
    assert data[:2] == b"\x57\xa7" and data[-2:] == b"\x00\x00"
    got, _ = decode_all(wire.ClientCommandDecoder, data, 1)
    assert got == [wire.Status(items)]


def test_status_values_wrap_as_u32() -> None:
    data = wire.encode(wire.Status((("routed", 2**32 + 5),)))
    assert data.endswith(b"\x00\x00\x00\x05\x00\x00")


def test_bind_program_is_cut_at_nul_like_a_c_string() -> None:
    decoder = _server_decoder_after_auth()
    decoder.feed(wire.encode(wire.BindRequest(0, b"ex", b"prefix:a\x00junk")))
    assert decoder.next_frame() == wire.BindRequest(0, b"ex", b"prefix:a")


# --- auth-phase errors (docs/fq-protocol.md §1.8) ---------------------------------------


def _auth_bytes(user: bytes = b"u", qf: bytes = b"q", pw: bytes = b"p") -> bytes:
    return wire.encode(wire.AuthPlain(user, qf, pw))


AUTH_ERRORS = [
    ("auth command expected", b"\xb1\x70\x00\x00"),
    ("unsupported auth method", b"\xaa\xaa\x00\x01"),
    ("user name is too long", _auth_bytes(user=b"u" * 128)),
    ("queue detail is too long", _auth_bytes(qf=b"q" * 1024)),
    ("pass field is too long", _auth_bytes(pw=b"p" * 10241)),
]


@pytest.mark.parametrize(("text", "data"), AUTH_ERRORS, ids=[t for t, _ in AUTH_ERRORS])
def test_auth_errors_have_fq_texts(text: str, data: bytes) -> None:
    decoder = wire.ServerCommandDecoder()
    decoder.feed(data)
    with pytest.raises(AuthError) as info:
        decoder.next_frame()
    assert info.value.text == text


@pytest.mark.parametrize(
    "data",
    [_auth_bytes(user=b"u" * 127), _auth_bytes(qf=b"q" * 1023), _auth_bytes(pw=b"p" * 10240)],
)
def test_auth_limits_are_inclusive(data: bytes) -> None:
    frames, _ = decode_all(wire.ServerCommandDecoder, data, None)
    assert len(frames) == 1


def test_limits_are_checked_before_the_bytes_arrive() -> None:
    decoder = wire.ServerCommandDecoder()
    decoder.feed(b"\xaa\xaa\x00\x00\xff\xff")  # a 65535-byte user name, none of it sent
    with pytest.raises(AuthError, match="user name is too long"):
        decoder.next_frame()


def test_auth_method_read_failed_at_eof() -> None:
    decoder = wire.ServerCommandDecoder()
    decoder.feed(b"\xaa\xaa\x00")
    assert decoder.next_frame() is None
    decoder.feed_eof()
    with pytest.raises(AuthError, match="auth method read failed"):
        decoder.next_frame()


@pytest.mark.parametrize("text", ERROR_TEXTS)
def test_every_error_text_encodes_exactly(text: str) -> None:
    data = wire.encode(wire.ErrorReply(text))
    raw = text.encode()
    assert data == b"\xee\xee" + len(raw).to_bytes(2, "big") + raw
    got, _ = decode_all(wire.ClientCommandDecoder, data, 1)
    assert got == [wire.ErrorReply(text)]


# --- commands after auth ----------------------------------------------------------------


def test_unknown_command_is_a_protocol_error() -> None:
    decoder = _server_decoder_after_auth()
    decoder.feed(b"\x12\x34")
    with pytest.raises(ProtocolError):
        decoder.next_frame()


@pytest.mark.parametrize(
    "data",
    [
        wire.encode(wire.BindRequest(0, b"e" * 128, b"prefix:")),
        wire.encode(wire.UnbindRequest(1, b"e" * 128)),
    ],
    ids=["bind", "unbind"],
)
def test_exchange_over_127_is_a_protocol_error(data: bytes) -> None:
    decoder = _server_decoder_after_auth()
    decoder.feed(data)
    with pytest.raises(FrameTooLarge) as info:
        decoder.next_frame()
    assert (info.value.size, info.value.limit) == (128, 127)


# --- data channel -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "data", "hello"),
    [
        (wire.Mode.DATA, b"\x00\x7f" + bytes(127), wire.DataHello(bytes(127))),
        (wire.Mode.OLD_PEER, b"\x00\x02ab", wire.DataHello(b"ab")),
        (wire.Mode.PEER, b"\x0a\xfe\xfe\x02\x00\x02ab", wire.DataHello(b"ab", b"\x0a\xfe\xfe\x02")),
    ],
)
def test_data_hello(mode: wire.Mode, data: bytes, hello: wire.DataHello) -> None:
    for chunk in (None, 1):
        frames, _ = decode_all(lambda m=mode: wire.DataHelloDecoder(m), data, chunk)
        assert frames == [hello]
    assert wire.encode_hello(mode, hello.key, hello.peer_id)[4:] == data


def test_data_hello_key_over_127_is_refused() -> None:
    decoder = wire.DataHelloDecoder(wire.Mode.DATA)
    decoder.feed(b"\x00\x80")
    with pytest.raises(FrameTooLarge):
        decoder.next_hello()


def test_peer_format_message_matches_the_spec_example() -> None:
    assert PEER_MESSAGE.peer_frame() == PEER_MESSAGE_BYTES
    assert PEER_MESSAGE.peer_octets == len(PEER_MESSAGE_BYTES)


def test_publish_format_message_bytes() -> None:
    assert PEER_MESSAGE.publish_frame() == PUBLISH_MESSAGE_BYTES
    assert PEER_MESSAGE.publish_octets == len(PUBLISH_MESSAGE_BYTES)


@pytest.mark.parametrize("chunk", [None, 1, 3, 17])
@pytest.mark.parametrize("peer_format", [False, True])
def test_message_decoder_any_split(peer_format: bool, chunk: int | None) -> None:
    data = (PEER_MESSAGE_BYTES if peer_format else PUBLISH_MESSAGE_BYTES) * 3
    frames, decoder = decode_all(lambda: MessageDecoder(peer_format=peer_format), data, chunk)
    expected = (
        PEER_MESSAGE if peer_format else Message(b"ex", b"a.b", b"hello", msgid=bytes(range(16)))
    )
    assert frames == [expected] * 3
    assert decoder.buffered == 0


@pytest.mark.parametrize(
    ("peer_format", "data", "field"),
    [
        (False, b"\x80" + b"e" * 128, "exchange"),
        (False, b"\x01e\x80", "route"),
        (True, b"\x01e\x01r" + bytes(16) + b"\x80", "sender"),
        (True, b"\x01e\x01r" + bytes(16) + b"\x01s\x21", "hops"),
    ],
)
def test_message_limits(peer_format: bool, data: bytes, field: str) -> None:
    decoder = MessageDecoder(peer_format=peer_format)
    decoder.feed(data)
    with pytest.raises(FrameTooLarge) as info:
        decoder.next_message()
    assert info.value.field == field


def test_32_hops_is_allowed() -> None:
    msg = Message(b"e", b"r", b"x", sender=b"s", hops=b"\x0a\x00\x00\x01" * 32)
    decoder = MessageDecoder(peer_format=True)
    decoder.feed(msg.peer_frame())
    assert decoder.next_message() == msg


@pytest.mark.parametrize("chunk", [None, 1, 4, 1000])
def test_oversized_payload_is_skipped_and_counted(chunk: int | None) -> None:
    big = Message(b"e", b"r", b"x" * 100).publish_frame()
    small = Message(b"e", b"r", b"ok").publish_frame()
    frames, decoder = decode_all(
        lambda: MessageDecoder(peer_format=False, max_payload=99), small + big + small, chunk
    )
    assert [m.payload for m in frames] == [b"ok", b"ok"]
    assert decoder.oversized == 1


# A publisher's message, as hypothesis draws it.
HOPS = bytes([10, 0, 0, 1, 127, 0, 0, 1])
MESSAGE_FIELDS = {
    "exchange": st.binary(max_size=127),
    "route": st.binary(max_size=127),
    "payload": st.binary(max_size=300),
    "msgid": st.binary(min_size=16, max_size=16),
}


@given(
    messages=st.lists(
        st.builds(
            Message,
            **MESSAGE_FIELDS,
            sender=st.binary(max_size=127),
            hops=st.lists(st.binary(min_size=4, max_size=4), max_size=32).map(b"".join),
        ),
        max_size=5,
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=6),
)
def test_any_chunking_of_valid_messages_decodes_the_same(
    messages: list[Message], cuts: list[int]
) -> None:
    data = b"".join(m.peer_frame() for m in messages)
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    decoder = MessageDecoder(peer_format=True)
    got: list[Message] = []
    for a, b in itertools.pairwise(points):
        decoder.feed(data[a:b])
        got.extend(decoder.messages())
    assert got == messages


@given(st.binary(max_size=400))
def test_garbage_gives_frames_none_or_protocol_error(data: bytes) -> None:
    for factory in (
        wire.ServerCommandDecoder,
        wire.ClientCommandDecoder,
        lambda: MessageDecoder(peer_format=True),
        lambda: wire.DataHelloDecoder(wire.Mode.PEER),
    ):
        decoder = factory()
        decoder.feed(data)
        try:
            for _ in range(len(data) + 1):
                if _next(decoder) is None:
                    break
        except ProtocolError:
            pass


def run_messages(runs: list[Run]) -> list[Message]:
    """The messages of the data path's runs, each frame checked against its run: a
    ``bytes`` of the run's exchange and route, with the run's head size."""
    got: list[Message] = []
    for exchange, route, frames, head in runs:
        for frame in frames:
            assert type(frame) is bytes
            msg = message_from_frame(frame)
            assert (msg.exchange, msg.route, len(frame) - len(msg.payload)) == (
                exchange,
                route,
                head,
            )
            got.append(msg)
    return got


def stamped_messages(decoder: MessageDecoder) -> list[Message]:
    """What next_message() decodes, stamped as the data path stamps (user, HOPS)."""
    want: list[Message] = []
    while (msg := decoder.next_message()) is not None:
        msg.stamp(b"user", HOPS)
        want.append(msg)
    return want


@given(
    messages=st.lists(
        st.builds(Message, **MESSAGE_FIELDS),
        max_size=6,
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=6),
    max_payload=st.integers(min_value=0, max_value=400),
)
def test_runs_decoding_matches_one_at_a_time_and_stamps(
    messages: list[Message], cuts: list[int], max_payload: int
) -> None:
    """runs() (the data path's fast loop) gives what next_message() gives, stamped."""
    data = b"".join(m.publish_frame() for m in messages)
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    fast = MessageDecoder(peer_format=False, max_payload=max_payload)
    slow = MessageDecoder(peer_format=False, max_payload=max_payload)
    got: list[Message] = []
    want: list[Message] = []
    for a, b in itertools.pairwise(points):
        fast.feed(data[a:b])
        slow.feed(data[a:b])
        got += run_messages(fast.runs(b"user", HOPS))
        want += stamped_messages(slow)
    assert got == want
    assert fast.oversized == slow.oversized
    assert fast.octets == sum(m.publish_octets for m in got)
