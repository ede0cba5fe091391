"""The data channel's protocol without a socket: bytes in, events out
(docs/fq-protocol.md §1.4, §1.10, §5.3)."""

from __future__ import annotations

from fqbroker.core.message import Message, message_from_frame
from fqbroker.frontends.fq.datachannel import BadInput, Batch, DataChannel, Hello, Oversized, Phase
from fqbroker.protocols.fq import wire

NODE = bytes([10, 0, 0, 1])
OTHER = bytes([10, 0, 0, 2])


def hello_bytes(mode: wire.Mode, key: bytes, peer_id: bytes = bytes(4)) -> bytes:
    return wire.encode_hello(mode, key, peer_id)[4:]  # the magic was read by the sniffer


def events(channel: DataChannel) -> list[object]:
    out = []
    while (event := channel.next_event()) is not None:
        out.append(event)
    return out


def streaming(mode: wire.Mode = wire.Mode.DATA, max_payload: int = 1 << 20) -> DataChannel:
    channel = DataChannel(mode)
    channel.receive_data(hello_bytes(mode, b"k" * 16, OTHER))
    hello = channel.next_event()
    assert isinstance(hello, Hello) and hello.key == b"k" * 16
    assert hello.peer_id == (OTHER if mode is wire.Mode.PEER else wire.NO_PEER)
    assert channel.paired(b"user", hello.peer_id) == b""
    channel.start_reading(NODE, "192.0.2.7", max_payload)
    return channel


def test_hello_comes_whole_and_what_follows_is_kept() -> None:
    channel = DataChannel(wire.Mode.DATA)
    data = hello_bytes(wire.Mode.DATA, b"key") + b"rest"
    channel.receive_data(data[:3])
    assert channel.next_event() is None
    channel.receive_data(data[3:])
    assert channel.next_event() == Hello(b"key", wire.NO_PEER)
    assert channel.paired(b"u", wire.NO_PEER) == b"rest"
    assert channel.phase is Phase.STREAMING


def test_a_key_too_long_is_bad_input() -> None:
    channel = DataChannel(wire.Mode.DATA)
    channel.receive_data(len(b"k" * 200).to_bytes(2, "big") + b"k" * 200)
    assert isinstance(channel.next_event(), BadInput)


def test_a_publishers_messages_come_as_stamped_runs() -> None:
    channel = streaming()
    sent = [Message(b"ex", b"r", b"a"), Message(b"ex", b"r", b"bb"), Message(b"ex", b"s", b"c")]
    wire_bytes = b"".join(m.publish_frame() for m in sent)
    channel.receive_data(wire_bytes)
    (batch,) = events(channel)
    assert isinstance(batch, Batch)
    assert batch.octets == len(wire_bytes)
    assert [(ex, route, len(frames)) for ex, route, frames, _ in batch.runs] == [
        (b"ex", b"r", 2),
        (b"ex", b"s", 1),
    ]
    got = message_from_frame(batch.runs[0][2][0])
    assert (got.sender, got.hops) == (b"user", NODE + bytes([192, 0, 2, 7]))
    assert channel.stamp_size == 2 + len(b"user") + 8
    assert batch.last  # the shell need not ask again: nothing new came
    assert channel.next_event() is None


def test_oversized_messages_are_reported_after_their_batch() -> None:
    channel = streaming(max_payload=10)
    channel.receive_data(
        Message(b"ex", b"r", b"x" * 50).publish_frame()
        + Message(b"ex", b"r", b"ok").publish_frame()
    )
    batch, oversized = events(channel)
    assert isinstance(batch, Batch) and len(batch.runs[0][2]) == 1
    assert not batch.last  # the shell asks again, and hears of the oversized one
    assert oversized == Oversized(1, 10)


def test_good_messages_before_a_bad_frame_come_first() -> None:
    channel = streaming()
    channel.receive_data(Message(b"ex", b"r", b"ok").publish_frame() + b"\xff" * 8)
    first, second = events(channel)
    assert isinstance(first, Batch) and len(first.runs) == 1
    assert not first.last
    assert isinstance(second, BadInput)


def test_a_peers_looped_messages_are_counted_and_left_out() -> None:
    channel = streaming(wire.Mode.PEER)
    looped = Message(b"ex", b"r", b"seen", hops=OTHER + NODE)
    fresh = Message(b"ex", b"r", b"new", hops=OTHER)
    data = looped.peer_frame() + fresh.peer_frame()
    channel.receive_data(data)
    (batch,) = events(channel)
    assert isinstance(batch, Batch)
    assert (batch.octets, batch.read, batch.read_octets) == (-1, 2, len(data))
    assert batch.last
    (run,) = batch.runs
    # We go first (docs/fq-protocol.md §5.2).
    assert message_from_frame(run[2][0]).hops == NODE + OTHER
    assert channel.stamp_size == 0


def test_outgoing_leaves_out_what_the_peer_saw() -> None:
    channel = streaming(wire.Mode.PEER)
    frames = [
        Message(b"ex", b"r", b"a", hops=OTHER).peer_frame(),
        Message(b"ex", b"r", b"b").peer_frame(),
    ]
    assert channel.outgoing(frames) == frames[1:]
    plain = streaming()
    assert plain.outgoing(frames) is frames  # no peer at the other end: as they are
