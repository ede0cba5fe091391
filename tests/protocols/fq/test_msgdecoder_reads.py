"""Reads sized to the message: the data channel read through ``room()`` (asyncio's
BufferedProtocol, a large message read straight into its frame) decodes any byte stream
to the same messages as the same stream fed as bytes, however the reads split it."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as examples
from hypothesis import strategies as st

from fqbroker.core.frames import encode_publish
from fqbroker.frontends.fq.datachannel import Batch, DataChannel, Oversized
from fqbroker.protocols.fq.largeframe import LARGE_FRAME
from fqbroker.protocols.fq.msgdecoder import BIG_READ, SIZED_FRAME, SMALL_READ
from fqbroker.settings.broker import Settings
from tests.frontends.fq.test_datachannel import streaming

# Payload sizes around every edge the two paths treat differently: the 1 KiB copy
# threshold of the decoder, the size from which a message is read in place, the spill.
EDGES = [0, 1, 1023, 1024, 1025, SIZED_FRAME - 60, SIZED_FRAME - 40, SIZED_FRAME, 300_000]
sizes = st.one_of(st.sampled_from(EDGES), st.integers(0, SIZED_FRAME + 50_000), st.integers(0, 300))
names = st.sampled_from([b"", b"x", b"ex", b"e" * 127])


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    count = draw(st.integers(1, 6))
    frames = []
    for i in range(count):
        size = draw(sizes)
        payload = random.Random(i * 7919 + size).randbytes(size)
        frames.append(encode_publish(draw(names), draw(names), bytes(16), payload))
    return b"".join(frames)


Out = tuple[list[tuple[bytes, bytes, bytes]], int, int]  # frames, octets, oversized


def drain(channel: DataChannel, frames: list[tuple[bytes, bytes, bytes]]) -> tuple[int, int]:
    octets = oversized = 0
    while (event := channel.next_event()) is not None:
        if isinstance(event, Batch):
            octets += event.octets
            frames.extend((ex, route, f) for ex, route, fs, _ in event.runs for f in fs)
        else:
            assert isinstance(event, Oversized)
            oversized += event.count
    return octets, oversized


def fed(stream: bytes, cuts: Callable[[int], int], max_payload: int) -> Out:
    """The stream as bytes reads (data_received), ``cuts(limit)`` bytes at a time."""
    channel = streaming(max_payload=max_payload)
    frames: list[tuple[bytes, bytes, bytes]] = []
    octets = oversized = pos = 0
    while pos < len(stream):
        n = cuts(BIG_READ)
        channel.receive_data(stream[pos : pos + n])
        pos += n
        o, s = drain(channel, frames)
        octets, oversized = octets + o, oversized + s
    return frames, octets, oversized


def buffered(
    stream: bytes, cuts: Callable[[int], int], max_payload: int, hold_view: bool = True
) -> Out:
    """The stream read as BufferedProtocol reads it: into room() when there is one (as
    much as the socket has, at most its size), else ``read_size`` bytes of scratch.
    ``hold_view``: the loop lets go of the room only after buffer_updated (uvloop)."""
    channel = streaming(max_payload=max_payload)
    frames: list[tuple[bytes, bytes, bytes]] = []
    octets = oversized = pos = 0
    while pos < len(stream):
        room = channel.room()
        if room is not None:
            n = min(cuts(len(room)), len(stream) - pos)
            room[:n] = stream[pos : pos + n]  # the kernel's recv_into
            pos += n
            if not hold_view:
                room.release()
            if channel.filled_in(n):
                o, s = drain(channel, frames)
                octets, oversized = octets + o, oversized + s
            room.release()
            continue
        n = cuts(channel.read_size)
        channel.receive_data(stream[pos : pos + n])
        pos += n
        o, s = drain(channel, frames)
        octets, oversized = octets + o, oversized + s
    return frames, octets, oversized


def whole(stream: bytes, max_payload: int = 1 << 20) -> list[tuple[bytes, bytes, bytes]]:
    """The frames of ``stream`` fed in one read."""
    return fed(stream, lambda limit: len(stream), max_payload)[0]


def random_cuts(seed: int, small: bool) -> Callable[[int], int]:
    rng = random.Random(seed)

    def cut(limit: int) -> int:
        # What a socket has ready: often all that is asked, else any part of it.
        if rng.random() < 0.4:
            return limit
        return rng.randint(1, min(limit, 3000) if small else limit)

    return cut


@examples(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    stream=streams(),
    seed=st.integers(0, 2**32),
    small=st.booleans(),
    hold_view=st.booleans(),
    max_payload=st.sampled_from([1 << 20, SIZED_FRAME + 20_000]),
)
def test_buffered_reads_decode_as_fed_reads(
    stream: bytes, seed: int, small: bool, hold_view: bool, max_payload: int
) -> None:
    expect = fed(stream, lambda limit: len(stream), max_payload)  # one read of it all
    assert fed(stream, random_cuts(seed, small), max_payload) == expect
    assert buffered(stream, random_cuts(seed, small), max_payload, hold_view) == expect


def test_a_large_message_in_many_small_reads_is_read_in_place() -> None:
    payload = random.Random(1).randbytes(SIZED_FRAME + 30_000)
    stream = encode_publish(b"ex", b"r", bytes(16), payload) * 3
    channel = streaming()
    frames: list[tuple[bytes, bytes, bytes]] = []
    pos = into_room = 0
    while pos < len(stream):
        room = channel.room()
        if room is None:
            n = min(channel.read_size, 100, len(stream) - pos)
            channel.receive_data(stream[pos : pos + n])
            drain(channel, frames)
        else:
            n = min(len(room), 100, len(stream) - pos)  # 100 bytes a read
            room[:n] = stream[pos : pos + n]
            into_room += n
            if channel.filled_in(n):
                drain(channel, frames)
            room.release()
        pos += n
    assert len(frames) == 3
    assert frames == whole(stream)
    # All but the heads (and the ordinary reads before the first room) went in place.
    assert into_room > len(stream) - 3 * SMALL_READ - 3 * 100


def test_a_frame_of_a_megabyte_or_more_leaves_its_last_byte_to_an_ordinary_read() -> None:
    payload = random.Random(2).randbytes(LARGE_FRAME + 5)
    frame = encode_publish(b"ex", b"r", bytes(16), payload)
    stream = frame + encode_publish(b"ex", b"r", bytes(16), b"after")
    channel = streaming(max_payload=2 << 20)
    channel.receive_data(stream[:100])
    assert drain(channel, []) == (0, 0)
    room = channel.room()
    assert room is not None and len(room) == len(frame) - 100 - 1
    room[:] = stream[100 : len(frame) - 1]
    assert not channel.filled_in(len(room))
    room.release()
    assert channel.room() is None  # the last byte: an ordinary read, a small one
    assert channel.read_size == SMALL_READ
    channel.receive_data(stream[len(frame) - 1 :])
    frames: list[tuple[bytes, bytes, bytes]] = []
    drain(channel, frames)
    assert frames == whole(stream, 2 << 20)


def test_two_sessions_reading_in_place_at_once_keep_their_own_frames() -> None:
    streams_ = [
        b"".join(
            encode_publish(
                b"ex",
                bytes([65 + k]),
                bytes(16),
                random.Random(k * 10 + i).randbytes(SIZED_FRAME + 7000),
            )
            for i in range(4)
        )
        for k in range(2)
    ]
    channels = [streaming(), streaming()]
    got: list[list[tuple[bytes, bytes, bytes]]] = [[], []]
    pos = [0, 0]
    rng = random.Random(5)
    while any(p < len(s) for p, s in zip(pos, streams_, strict=True)):
        k = rng.randrange(2)
        channel, stream = channels[k], streams_[k]
        if pos[k] >= len(stream):
            continue
        room = channel.room()
        n = rng.randint(1, 50_000)
        if room is None:
            n = min(n, channel.read_size, len(stream) - pos[k])
            channel.receive_data(stream[pos[k] : pos[k] + n])
            drain(channel, got[k])
        else:
            n = min(n, len(room), len(stream) - pos[k])
            room[:n] = stream[pos[k] : pos[k] + n]
            if channel.filled_in(n):
                drain(channel, got[k])
            room.release()
        pos[k] += n
    for k, stream in enumerate(streams_):
        assert got[k] == whole(stream)


def test_the_data_session_is_a_buffered_protocol() -> None:
    # uvloop reads into get_buffer() only for a protocol that is not an asyncio.Protocol.
    from fqbroker.frontends.fq.data import DataSession

    assert issubclass(DataSession, asyncio.BufferedProtocol)
    assert not issubclass(DataSession, asyncio.Protocol)


# --- end to end, on both loops ------------------------------------------------------------


@contextlib.asynccontextmanager
async def consumer_and_publisher(
    settings: Settings, queue: bytes
) -> AsyncIterator[tuple[Any, Any]]:
    """A broker, a consumer of ``queue`` bound to every route of ``ex``, a publisher."""
    from tests.conftest import open_session, running

    async with running(settings) as broker:
        consumer = await open_session(broker.port, b"u", b"q\x00" + queue)
        await consumer.bind(b"ex", b"prefix:")
        publisher = await open_session(broker.port)
        yield consumer, publisher
        await publisher.close()
        await consumer.close()


def on_both_loops(scenario: Callable[[Settings], Awaitable[None]], settings: Settings) -> None:
    """``scenario`` on asyncio's loop, then on uvloop's."""
    uvloop = pytest.importorskip("uvloop")
    for factory in (asyncio.new_event_loop, uvloop.new_event_loop):
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(asyncio.wait_for(scenario(settings), 60))


async def _round_trip(settings: Settings) -> None:
    async with consumer_and_publisher(settings, b"mem:backlog=-1") as (consumer, publisher):
        rng = random.Random(3)
        sizes_ = [100, 40_000, 300_000, 4096, 131_072, LARGE_FRAME + 3, 0, 700_000] * 2
        payloads = [rng.randbytes(n) for n in sizes_]
        stream = b"".join(encode_publish(b"ex", b"r", bytes(16), p) for p in payloads)
        pos = 0
        while pos < len(stream):  # odd pieces: heads and payloads split anywhere
            n = rng.randint(1, 300_000)
            await publisher.data.send(stream[pos : pos + n])
            pos += n
        got = await consumer.receive(len(payloads))
        assert [m.payload for m in got] == payloads
        assert all(m.sender == b"user" for m in got)


def test_messages_of_every_size_arrive_whole_on_asyncios_loop(settings: Settings) -> None:
    with asyncio.Runner() as runner:
        runner.run(asyncio.wait_for(_round_trip(settings), 60))


def test_messages_of_every_size_arrive_whole_on_uvloop(settings: Settings) -> None:
    uvloop = pytest.importorskip("uvloop")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(asyncio.wait_for(_round_trip(settings), 60))


async def _blocked(settings: Settings) -> None:
    queue = b"mem:block,backlog=2"
    async with consumer_and_publisher(settings, queue) as (consumer, publisher):
        rng = random.Random(4)
        payloads = [rng.randbytes(rng.choice([100, 300_000, SIZED_FRAME + 1])) for _ in range(12)]
        stream = b"".join(encode_publish(b"ex", b"r", bytes(16), p) for p in payloads)
        publisher.data.writer.write(stream)  # far past what the queue takes: reading pauses
        got = []
        while len(got) < len(payloads):
            got += await consumer.receive(1)
            await asyncio.sleep(0.01)  # a slow consumer: the publisher is held meanwhile
        assert [m.payload for m in got] == payloads


def test_a_block_queue_holds_a_publisher_of_large_messages_on_both_loops(
    settings: Settings,
) -> None:
    on_both_loops(_blocked, settings)
