"""Reads and writes of a stream of 128 KiB messages in bulk: an ordinary read of the data
session takes up to ``BULK_READ`` (several such messages a read) while the memory budget
has room for it, and a consumer's large batch goes out up to ``WRITE_GROUP`` a scatter
write. The frames stay exact however the reads split them."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

from hypothesis import HealthCheck, given
from hypothesis import settings as examples
from hypothesis import strategies as st

from fqbroker.core.budget import MemoryBudget
from fqbroker.core.frames import encode_publish
from fqbroker.core.message import Message
from fqbroker.core.queue import Queue
from fqbroker.core.queuespec import QueueSpec
from fqbroker.frontends.fq.data import BULK_READ, WRITE_GROUP, DataSession
from fqbroker.frontends.fq.datainput import BULK_FROM, _Input
from fqbroker.protocols.fq import wire
from fqbroker.protocols.fq.msgdecoder import BIG_READ
from fqbroker.settings.broker import Settings
from tests.frontends.fq.test_data_path import _consumer, _Transport
from tests.frontends.fq.test_datachannel import streaming
from tests.protocols.fq.test_msgdecoder_reads import (
    buffered,
    consumer_and_publisher,
    fed,
    on_both_loops,
    whole,
)

if TYPE_CHECKING:
    from fqbroker.core.publisher import Publisher

KIB = 1 << 10


def _session(budget: MemoryBudget) -> DataSession:
    host: Any = SimpleNamespace(budget=budget, node_id=bytes(4))
    transport: Any = SimpleNamespace(get_extra_info=lambda name, default=None: default)
    return DataSession(host, wire.Mode.DATA, transport)


def _publishing(session: DataSession, bulk: bool) -> None:
    session._in = _Input(cast("Publisher", None), session.broker.budget.share(None))
    session._in.bulk = bulk


def test_an_ordinary_read_is_bulk_for_large_messages_while_the_budget_has_room() -> None:
    budget = MemoryBudget(64 << 20)
    session = _session(budget)
    assert len(session.get_buffer(-1)) == BIG_READ  # nothing published yet
    _publishing(session, bulk=False)
    assert len(session.get_buffer(-1)) == BIG_READ  # small messages
    _publishing(session, bulk=True)
    assert len(session.get_buffer(-1)) == BULK_READ
    # Near the limit a read stays uvloop's size: what the budget may be overshot by.
    budget.used = budget.limit - BULK_READ + 1
    assert len(session.get_buffer(-1)) == BIG_READ
    budget.used = budget.limit - BULK_READ
    assert len(session.get_buffer(-1)) == BULK_READ
    small = _session(MemoryBudget(BULK_READ // 2))
    _publishing(small, bulk=True)
    assert len(small.get_buffer(-1)) == BIG_READ


def test_a_batch_ending_in_a_large_message_makes_reads_bulk() -> None:
    session = _session(MemoryBudget(64 << 20))
    published: list[int] = []
    publisher: Any = SimpleNamespace(publish=lambda runs, octets: published.append(octets) or True)
    session._in = _Input(publisher, session.broker.budget.share(None))
    channel = session.channel = streaming()
    for size, bulk in [(100, False), (BULK_FROM, True), (1000, False), (128 * KIB, True)]:
        channel.receive_data(encode_publish(b"ex", b"r", bytes(16), bytes(size)) * 2)
        session._pump()
        assert session._in.bulk is bulk
    assert len(published) == 4


# Around 128 KiB: the bulk read's case (several whole frames a read, and a partial one).
sizes = st.one_of(
    st.sampled_from([128 * KIB, 128 * KIB - 40, 128 * KIB + 1]),
    st.integers(100 * KIB, 200 * KIB),
    st.integers(0, 5000),
)


@examples(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    payloads=st.lists(sizes, min_size=1, max_size=14),
    first=st.integers(1, 300 * KIB),
    seed=st.integers(0, 2**32),
)
def test_frames_split_by_bulk_reads_at_any_offset_decode_as_one_read(
    payloads: list[int], first: int, seed: int
) -> None:
    rng = random.Random(seed)
    stream = b"".join(encode_publish(b"ex", b"r", bytes(16), rng.randbytes(n)) for n in payloads)
    expect = fed(stream, lambda limit: len(stream), 1 << 20)
    cuts = iter([first])

    def cut(limit: int) -> int:
        # The first read ends anywhere; then a socket with plenty ready fills each read
        # up to BULK_READ, or hands over any part of it.
        n = next(cuts, None)
        if n is None:
            n = BULK_READ if rng.random() < 0.6 else rng.randint(1, BULK_READ)
        # (an ordinary read is asked for BIG_READ, and the session offers BULK_READ; a
        # read into a frame's own room, or a small one, takes at most what it is given)
        return min(n, BULK_READ if limit == BIG_READ else limit)

    assert fed(stream, cut, 1 << 20) == expect
    cuts = iter([first])
    assert buffered(stream, cut, 1 << 20) == expect


def test_a_bulk_read_may_end_at_any_offset_of_a_frame() -> None:
    # Every offset around each head (names, id, length) and a stride through payloads:
    # the first read ends there, the rest come a BULK_READ at a time.
    rng = random.Random(11)
    frames = [
        encode_publish(b"ex", b"route", bytes(16), rng.randbytes(128 * KIB + d))
        for d in (-3, 0, 17, 5000)
    ]
    stream = b"".join(frames)
    expect = whole(stream)
    assert len(expect) == len(frames)
    starts = [sum(map(len, frames[:i])) for i in range(len(frames))]
    offsets = {o for start in starts for o in range(start - 40, start + 80)}
    offsets |= set(range(1, len(stream), 4093)) | {len(stream) - 1, len(stream)}
    for first in sorted(o for o in offsets if 0 < o <= len(stream)):
        reads = iter([first])

        def cut(limit: int) -> int:
            return next(reads, BULK_READ)  # noqa: B023 (this iteration's reads)

        assert fed(stream, cut, 1 << 20)[0] == expect, first


def test_a_large_batch_goes_out_a_write_group_at_a_time() -> None:
    async def run() -> list[str]:
        budget = MemoryBudget(1 << 34)
        queue = Queue(QueueSpec(b"q", backlog=1000, backlog_bytes=0), budget=budget)
        transport = _Transport(1 << 30)
        session = _consumer(transport, queue, budget)
        session.queue_ready()
        frames = [Message(b"ex", b"r", bytes([i]) * (128 * KIB)).peer_frame() for i in range(20)]
        queue.offer(frames)
        await asyncio.sleep(0)
        assert bytes(transport.out) == b"".join(frames)
        assert budget.used == 0
        return transport.calls

    calls = asyncio.run(run())
    per_call = WRITE_GROUP // (128 * KIB + 200)
    assert calls == ["writelines"] * -(-20 // per_call)


async def _bulk_round_trip(settings: Settings) -> None:
    async with consumer_and_publisher(settings, b"mem:backlog=-1") as (consumer, publisher):
        rng = random.Random(7)
        payloads = [rng.randbytes(128 * KIB + rng.randint(-50, 50)) for _ in range(40)]
        stream = b"".join(encode_publish(b"ex", b"r", bytes(16), p) for p in payloads)
        publisher.data.writer.write(stream)  # all at once: the broker reads in bulk
        got = await consumer.receive(len(payloads))
        assert [m.payload for m in got] == payloads


def test_a_stream_of_128_kib_messages_arrives_whole_on_both_loops(settings: Settings) -> None:
    on_both_loops(_bulk_round_trip, settings)
