"""The data-frame format (fqbroker.core.frames): every reader agrees with the builders.

tests/protocols/fq/test_wire.py checks the frames' exact bytes against fq and the decoders on any
split of their input; here each function of the format is checked against the others on
generated messages, so a change to one that the others do not follow fails.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fqbroker.core import frames
from fqbroker.core.message import Message, message_from_frame
from tests.vectors import PEER_MESSAGE, PEER_MESSAGE_BYTES, PUBLISH_MESSAGE_BYTES

names = st.binary(max_size=frames.MAX_RK_LEN)
messages = st.builds(
    Message,
    exchange=names,
    route=names,
    payload=st.binary(max_size=300),
    msgid=st.binary(min_size=16, max_size=16),
    sender=names,
    hops=st.lists(st.binary(min_size=4, max_size=4), max_size=frames.MAX_HOPS).map(b"".join),
)


def test_the_builders_give_fq_s_bytes() -> None:
    m = PEER_MESSAGE
    assert frames.encode_peer(m.exchange, m.route, m.msgid, m.sender, m.hops, m.payload) == (
        PEER_MESSAGE_BYTES
    )
    assert frames.encode_publish(m.exchange, m.route, m.msgid, m.payload) == (PUBLISH_MESSAGE_BYTES)


@given(messages)
def test_a_peer_frame_reads_back(msg: Message) -> None:
    frame = msg.peer_frame()
    assert len(frame) == msg.peer_octets == frames.frame_length(frame)
    assert frames.peer_fields(frame) == (
        msg.exchange,
        msg.route,
        msg.payload,
        msg.msgid,
        msg.sender,
        msg.hops,
    )
    assert frames.frame_hops(frame) == msg.hops
    assert message_from_frame(frame) == msg


@given(messages, st.integers(min_value=0, max_value=(1 << 64) - 1))
def test_a_position_goes_into_bytes_8_to_15_of_the_id(msg: Message, seq: int) -> None:
    placed = frames.place_seq(msg.peer_frame(), seq)
    assert frames.frame_seq(placed) == seq
    got = message_from_frame(placed)
    assert got.msgid == msg.msgid[:8] + seq.to_bytes(8, "big")
    assert (got.exchange, got.route, got.sender, got.hops, got.payload) == (
        msg.exchange,
        msg.route,
        msg.sender,
        msg.hops,
        msg.payload,
    )


@given(messages, st.binary(max_size=8))
def test_stamping_a_publisher_frame_makes_the_peer_frame(msg: Message, before: bytes) -> None:
    published = msg.publish_frame()
    assert len(published) == msg.publish_octets
    data = before + published
    pos = len(before)
    assert frames.frame_length(data, pos, peer=False) == len(published)
    exchange, route, after_id, size = frames.publish_head(data, pos)
    assert (exchange, route, size) == (msg.exchange, msg.route, len(msg.payload))
    stamped = data[pos:after_id] + frames.stamp(msg.sender, msg.hops) + data[after_id:]
    assert stamped == msg.peer_frame()


@given(st.lists(messages, max_size=6), st.integers(min_value=0, max_value=40))
def test_the_scans_read_what_was_built_and_stop_at_a_partial_frame(
    msgs: list[Message], cut: int
) -> None:
    peer_data = b"".join(m.peer_frame() for m in msgs)
    got: list[Message] = []
    end = max(0, len(peer_data) - cut)
    read = frames.scan_messages(peer_data[:end], got, Message, True, {}, frames.MAX_MESSAGE_SIZE)
    assert got == msgs[: len(got)]
    assert read == sum(m.peer_octets for m in got)
    assert cut or got == msgs

    runs: list[tuple[bytes, bytes, list[bytes], int]] = []
    after_id = frames.stamp(b"me", bytes(4))
    published = b"".join(m.publish_frame() for m in msgs)
    end = max(0, len(published) - cut)
    read = frames.scan_runs(published[:end], runs, after_id, {}, frames.MAX_MESSAGE_SIZE)
    stamped = [f for run in runs for f in run[2]]
    for m in msgs:
        m.stamp(b"me", bytes(4))
    assert stamped == [m.peer_frame() for m in msgs[: len(stamped)]]
    assert read == sum(m.publish_octets for m in msgs[: len(stamped)])
    for exchange, route, run_frames, head in runs:
        assert run_frames
        for frame in run_frames:
            assert frames.peer_fields(frame)[:2] == (exchange, route)
            assert len(frame) - len(frames.peer_fields(frame)[2]) == head


def test_scan_runs_stops_at_the_partial_frame_wherever_a_read_ends() -> None:
    # Every offset, so each byte of a length field (read from the bytes, not by struct)
    # is the last one read once; a payload large enough to be joined from a view too.
    msgs = [
        Message(b"ex", b"r", b"a" * 5),
        Message(b"ex", b"r", b"b" * 1500),
        Message(b"ex", b"s", b""),
        Message(b"ex", b"s", b"c" * 7),
    ]
    published = b"".join(m.publish_frame() for m in msgs)
    ends = [0]
    for m in msgs:
        ends.append(ends[-1] + m.publish_octets)
    after_id = frames.stamp(b"me", bytes(4))
    for m in msgs:
        m.stamp(b"me", bytes(4))
    for cut in range(len(published) + 1):
        runs: list[tuple[bytes, bytes, list[bytes], int]] = []
        read = frames.scan_runs(published[:cut], runs, after_id, {}, frames.MAX_MESSAGE_SIZE)
        whole = max(i for i, end in enumerate(ends) if end <= cut)
        assert read == ends[whole]
        assert [f for run in runs for f in run[2]] == [m.peer_frame() for m in msgs[:whole]]
        assert all(run[2] for run in runs)
    # A payload over the limit stops the scan at its frame, for the careful reader.
    runs = []
    assert frames.scan_runs(published, runs, after_id, {}, 1000) == ends[1]
