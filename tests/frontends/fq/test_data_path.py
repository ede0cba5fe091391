"""The fq data path's copy-saving shortcuts give exactly what the careful paths give.

* A publisher's read is decoded where it lies (only the partial frame it ends with is
  buffered), and payloads from ``frames._VIEW_FROM`` on are joined from a view of it:
  the frames, runs and octets must equal decoding one message at a time, however the
  bytes are cut.
* A consumer's batch goes out joined (small frames), as scatter writes (larger ones) or,
  past ``OUT_CHUNK``, about a chunk at a time as the transport drains: the bytes the
  socket gets must be the frames in order, whatever the transport pauses on, and the
  budget a large batch held must be given back.
"""

from __future__ import annotations

import asyncio
import itertools
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fqbroker.core import frames as frames_module
from fqbroker.core.budget import MemoryBudget
from fqbroker.core.message import Message
from fqbroker.core.queue import Queue
from fqbroker.core.queuespec import QueueSpec
from fqbroker.core.router import ClientStats
from fqbroker.frontends.fq.data import OUT_CHUNK, DataSession
from fqbroker.protocols.fq import wire
from fqbroker.protocols.fq.msgdecoder import MessageDecoder
from tests.protocols.fq.test_wire import HOPS, run_messages, stamped_messages

SIZES = st.sampled_from([0, 1, 100, frames_module._VIEW_FROM - 1, frames_module._VIEW_FROM, 5000])


@st.composite
def publisher_messages(draw: st.DrawFn) -> Message:
    return Message(
        draw(st.sampled_from([b"ex", b"other", b"x" * 127])),
        draw(st.sampled_from([b"a", b"b.c", b""])),
        bytes([draw(st.integers(0, 255))]) * draw(SIZES),
        draw(st.binary(min_size=16, max_size=16)),
    )


@settings(max_examples=300, deadline=None)
@given(
    messages=st.lists(publisher_messages(), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=20_000), max_size=8),
    max_payload=st.sampled_from([0, 100, 5000, 1 << 20]),
    settle=st.booleans(),
)
def test_reads_decoded_in_place_match_one_at_a_time(
    messages: list[Message], cuts: list[int], max_payload: int, settle: bool
) -> None:
    data = b"".join(m.publish_frame() for m in messages)
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    fast = MessageDecoder(peer_format=False, max_payload=max_payload)
    slow = MessageDecoder(peer_format=False, max_payload=max_payload)
    got: list[Message] = []
    want: list[Message] = []
    for a, b in itertools.pairwise(points):
        fast.feed(data[a:b])
        if settle:
            _ = fast.in_flight  # the careful paths see the read in the buffer
        slow.feed(bytearray(data[a:b]))  # not bytes: always buffered, never held
        got += run_messages(fast.runs(b"user", HOPS))
        want += stamped_messages(slow)
    assert got == want
    assert fast.oversized == slow.oversized
    assert fast.octets == sum(m.publish_octets for m in got)
    assert fast.buffered == slow.buffered


def test_a_read_completing_a_buffered_frame_continues_its_run() -> None:
    frame = Message(b"ex", b"r", b"p" * 100, bytes(16)).publish_frame()
    data = frame * 10
    decoder = MessageDecoder(peer_format=False)
    decoder.feed(data[:150])
    first = decoder.runs(b"u", HOPS)
    decoder.feed(data[150:])
    second = decoder.runs(b"u", HOPS)
    assert [len(r[2]) for r in first] == [1]
    assert [len(r[2]) for r in second] == [9]  # one run, not the completed frame's own
    assert decoder.buffered == 0


class _Transport:
    """Records what is written; pauses its protocol after every ``pause_every`` bytes."""

    def __init__(self, pause_every: int) -> None:
        self.out = bytearray()
        self.calls: list[str] = []
        self.pause_every = pause_every
        self.since = 0
        self.protocol: DataSession | None = None
        self.paused = False

    def _took(self, n: int) -> None:
        self.since += n
        if self.since >= self.pause_every and not self.paused:
            self.paused = True
            assert self.protocol is not None
            self.protocol.pause_writing()

    def write(self, data: bytes | bytearray) -> None:
        assert isinstance(data, (bytes, bytearray))  # a copy or a chunk, not a view
        self.calls.append("write")
        self.out += data
        self._took(len(data))

    def writelines(self, lines: list[bytes | bytearray]) -> None:
        self.calls.append("writelines")
        for line in lines:
            self.out += line
        self._took(sum(map(len, lines)))

    def drain(self) -> None:
        self.since = 0
        if self.paused:
            self.paused = False
            assert self.protocol is not None
            self.protocol.resume_writing()

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def _consumer(transport: _Transport, queue: Queue, budget: MemoryBudget) -> DataSession:
    host = SimpleNamespace(budget=budget, node_id=bytes(4))
    session = DataSession(host, wire.Mode.DATA, transport)  # type: ignore[arg-type]
    transport.protocol = session
    session.owner = SimpleNamespace(queue=queue, stats=ClientStats(), data=session)  # type: ignore[assignment]
    session.channel.paired(b"sub", wire.NO_PEER)
    return session


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(
        st.sampled_from(
            [10, 100, 3000, 100_000, 131_072, OUT_CHUNK - 50, OUT_CHUNK + 1, 3 * OUT_CHUNK]
        ),
        min_size=1,
        max_size=20,
    ),
    pause_every=st.sampled_from([1, 5000, OUT_CHUNK, 1 << 30]),
)
def test_a_consumer_writes_its_frames_in_order_however_the_transport_pauses(
    sizes: list[int], pause_every: int
) -> None:
    async def run() -> None:
        budget = MemoryBudget(1 << 34)
        queue = Queue(QueueSpec(b"q", backlog=1000, backlog_bytes=0), budget=budget)
        transport = _Transport(pause_every)
        session = _consumer(transport, queue, budget)
        frames = [
            Message(b"ex", b"r", bytes([i % 251]) * size, bytes(16), b"s", HOPS).peer_frame()
            for i, size in enumerate(sizes)
        ]
        session.queue_ready()
        queue.offer(frames)
        for _ in range(10 * len(frames) + 10):
            await asyncio.sleep(0)
            transport.drain()
        assert bytes(transport.out) == b"".join(frames)
        assert queue.backlog == 0
        assert budget.used == 0
        assert session._out is None

    asyncio.run(run())


def test_small_frames_go_out_joined_large_ones_scattered() -> None:
    async def run(size: int) -> list[str]:
        budget = MemoryBudget(1 << 34)
        queue = Queue(QueueSpec(b"q", backlog=1000, backlog_bytes=0), budget=budget)
        transport = _Transport(1 << 30)
        session = _consumer(transport, queue, budget)
        session.queue_ready()
        queue.offer([Message(b"ex", b"r", bytes(size)).peer_frame()] * 20)
        await asyncio.sleep(0)
        return transport.calls

    assert asyncio.run(run(100)) == ["write"]
    assert asyncio.run(run(4096)) == ["writelines"]
    assert "writelines" in asyncio.run(run(100_000))  # in chunks: a batch is over OUT_CHUNK
