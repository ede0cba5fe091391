"""A memory queue packs small frames into chunks and hands out whole regions of them: what
it gives must be what a plain FIFO of frames gives, in the same order, with the same
bytes held and counted, and the memory it keeps beyond them bounded."""

from __future__ import annotations

import asyncio
import bisect
import itertools
import sys
from pathlib import Path
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from fqbroker.core.budget import MemoryBudget
from fqbroker.core.frames import PEER_OVERHEAD
from fqbroker.core.memstore import (
    OPEN_BYTES,
    PACK_BELOW,
    TAKE_BYTES,
    MemoryStore,
    _Chunk,
    split_frames,
)
from fqbroker.core.message import Message
from fqbroker.core.queue import Queue
from fqbroker.core.queuespec import QueueSpec
from fqbroker.storage.segments.log import SegmentLog
from fqbroker.storage.store import DiskStore
from tests.frontends.fq.test_data_path import _consumer, _Transport

PAYLOADS = st.sampled_from(
    [0, 1, 76, 100, PACK_BELOW - PEER_OVERHEAD, PACK_BELOW, 5000, OPEN_BYTES, 400_000]
)


def _reference_take(items: list[bytes], n: int, packed: bool) -> list[bytes]:
    """Up to ``n`` frames and about TAKE_BYTES of them, one at least. From a store with
    chunks (``packed``), until they reach it (the one that crosses it is taken); from one
    of frames alone, as every store took before chunks: as many as the average size
    allows, then cut where they cross it."""
    if packed:
        size = k = 0
        while k < min(n, len(items)) and size < TAKE_BYTES:
            size += len(items[k])
            k += 1
        out = items[:k]
    else:
        held = sum(map(len, items))
        if held <= TAKE_BYTES:
            out = items[:n]
        else:
            k = max(1, min(n, len(items), TAKE_BYTES * len(items) // held))
            out = items[:k]
            if sum(map(len, out)) > TAKE_BYTES and k > 1:
                acc = list(itertools.accumulate(map(len, out)))
                out = out[: bisect.bisect_left(acc, TAKE_BYTES) + 1]
    del items[: len(out)]
    return out


_EMPTY = sys.getsizeof(bytearray())


def _check_bound(store: MemoryStore) -> None:
    """The first chunk keeps no more than is left of it taken (copied out past that); the
    small chunks grown by appends their growth slack, an eighth at most."""
    chunks = 0
    for i, item in enumerate(store._items or ()):
        if isinstance(item, bytes):
            continue
        chunks += 1
        data = item.data
        assert item.pos <= len(data) - item.pos
        assert i == 0 or item.pos == 0
        if isinstance(data, bytearray):
            assert sys.getsizeof(data) - _EMPTY <= len(data) + len(data) // 8 + 16
    assert chunks == store._chunks


@settings(max_examples=400, deadline=None)
# A chunk of small frames, then large ones: a take that ends the chunks must be compared
# with the reference the store had before it.
@example([("extend", [0, 0], False), ("extend", [400_000] * 3, False), ("take", 5)])
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("extend"), st.lists(PAYLOADS, max_size=60), st.booleans()),
            st.tuples(st.just("take_out"), st.integers(1, 120)),
            st.tuples(st.just("take"), st.integers(1, 40)),
            st.tuples(st.just("peek"), st.integers(1, 40)),
            st.tuples(st.just("purge"), st.just(0)),
        ),
        max_size=40,
    )
)
def test_the_memory_store_hands_out_what_a_plain_fifo_does(ops: list[tuple[Any, ...]]) -> None:
    budget = MemoryBudget(1 << 40)
    store = MemoryStore(budget)
    model: list[bytes] = []
    serial = itertools.count()
    for op in ops:
        kind = op[0]
        if kind == "extend":
            frames = [
                Message(b"ex", b"r", next(serial).to_bytes(4, "big") * (p // 4 + 1)).peer_frame()
                for p in op[1]
            ]
            store.extend(frames, sum(map(len, frames)) if op[2] else -1)
            model += frames
        elif kind == "take_out":
            want = _reference_take(model, op[1], store._chunks > 0)
            count, bufs = store.take_out(op[1])
            assert count == len(want)
            assert split_frames(bufs) == want
            assert b"".join(bufs) == b"".join(want)
        elif kind == "take":
            # The reference first: taking may empty the store of chunks, which changes
            # which reference applies.
            want = _reference_take(model, op[1], store._chunks > 0)
            assert store.take(op[1]) == want
        elif kind == "peek":
            assert store.peek(op[1]) == model[: op[1]]
        else:
            assert store.purge() == len(model)
            model.clear()
        assert len(store) == len(model)
        assert store.held_bytes == sum(map(len, model)) == budget.used
        _check_bound(store)
    store.close(destroy=True)
    assert budget.used == 0


def test_a_backlog_of_small_messages_is_packed() -> None:
    store = MemoryStore()
    frame = Message(b"ex", b"r", bytes(100)).peer_frame()
    for _ in range(100):
        store.extend([frame] * 1000)
    assert store._items is not None and len(store._items) == store._chunks == 100
    for _ in range(1000):
        store.extend([frame[:1] + frame[1:]])  # one a read: appended to a small chunk
    assert len(store._items) <= 100 + 1000 * len(frame) // OPEN_BYTES + 2
    out = b""
    while len(store):
        out += b"".join(store.take_out(1 << 30)[1])  # TAKE_BYTES at a time
    assert out == frame * 101_000


def test_a_chunk_handed_out_whole_is_not_copied() -> None:
    store = MemoryStore()
    frames = [Message(b"ex", b"r", bytes([i]) * 100).peer_frame() for i in range(50)]
    store.extend(frames)
    count, bufs = store.take_out(1024)
    assert count == 50 and len(bufs) == 1 and bufs[0] == b"".join(frames)
    store.extend(frames[:1])  # one into an empty queue: held as it is
    assert store.take_out(1024)[1][0] is frames[0]


def test_queue_shares_count_messages_not_buffers() -> None:
    queue = Queue(QueueSpec(b"q"))
    frames = [Message(b"ex", b"r", bytes([i]) * 10).peer_frame() for i in range(10)]
    queue.offer(frames)
    queue._woken = 1  # one other consumer woken: half each
    count, bufs = queue.take_out(100)
    assert count == 5 and split_frames(bufs) == frames[:5]
    assert queue.backlog == 5


async def test_a_disk_store_hands_out_its_frames_as_they_are(tmp_path: Path) -> None:
    store = DiskStore(SegmentLog(tmp_path / "log"))
    frames = [Message(b"ex", b"r", bytes([i]) * 10).peer_frame() for i in range(3)]
    store.extend(frames)
    count, bufs = store.take_out(10)
    assert count == 3 and all(isinstance(b, bytes) for b in bufs)
    store.ack(bufs)
    store.close(destroy=True)


def test_a_batch_routed_to_several_queues_is_packed_once() -> None:
    def frames(tag: int) -> list[bytes]:
        return [Message(b"ex", b"r", bytes([tag, i]) * 100).peer_frame() for i in range(200)]

    stores = [MemoryStore() for _ in range(3)]
    batch = frames(1)
    for store in stores:
        store.extend(batch)
    heads = [s._items[0] if s._items else None for s in stores]
    assert all(isinstance(head, _Chunk) for head in heads)
    assert len({id(head.data) for head in heads if isinstance(head, _Chunk)}) == 1
    # The caller's list changed in place, same length: packed anew, not taken for the last.
    batch[:] = frames(2)
    stores[2].extend(batch)
    batch[100] = frames(3)[100]
    stores[1].extend(batch)
    assert stores[2].take(1000) == frames(1) + frames(2)
    assert (
        stores[1].take(1000) == frames(1) + frames(2)[:100] + frames(3)[100:101] + frames(2)[101:]
    )
    assert stores[0].take(1000) == frames(1)
    # A small batch (and one message) into queues holding others: held once too.
    small = frames(4)[:6]
    for store in stores:
        store.extend(frames(5)[:2])  # something to be behind
    for batch in (small, small[:1]):  # as a router offers them: a batch to each queue
        for store in stores:
            store.extend(batch)
    assert isinstance(stores[2]._items[-2], _Chunk)  # type: ignore[index]
    assert stores[2]._items[-2].data is stores[1]._items[-2].data  # type: ignore[index,union-attr]
    assert stores[2]._items[-1] is small[0]  # type: ignore[index]
    for store in stores:
        assert store.take(1000) == frames(5)[:2] + small + small[:1]
    # Equal frames from another read are another message each: held apart.
    stores[0].extend(frames(1))
    stores[0].extend(frames(1))
    items = stores[0]._items or []
    assert [type(item) for item in items] == [_Chunk, _Chunk]
    assert items[0].data is not items[1].data  # type: ignore[union-attr]


@settings(max_examples=50, deadline=None)
@given(
    batches=st.lists(st.integers(1, 1500), min_size=1, max_size=6),
    payload=st.sampled_from([0, 100, 900, 3000]),
    pause_every=st.sampled_from([1, 5000, 1 << 30]),
)
def test_a_consumer_writes_packed_chunks_in_order(
    batches: list[int], payload: int, pause_every: int
) -> None:
    """Batches past a consumer's BATCH, cut inside chunks, through the real out path."""

    async def run() -> None:
        budget = MemoryBudget(1 << 34)
        queue = Queue(QueueSpec(b"q", backlog=1 << 20, backlog_bytes=0), budget=budget)
        transport = _Transport(pause_every)
        session = _consumer(transport, queue, budget)
        serial = itertools.count()
        sent: list[bytes] = []
        for n in batches:
            frames = [
                Message(
                    b"ex", b"r", next(serial).to_bytes(4, "big") * (payload // 4 + 1)
                ).peer_frame()
                for _ in range(n)
            ]
            queue.offer(frames)
            sent += frames
        session.queue_ready()
        for _ in range(10 * len(sent) + 10):
            await asyncio.sleep(0)
            transport.drain()
            if not queue.backlog and session._out is None:
                break
        assert bytes(transport.out) == b"".join(sent)
        assert session.owner is not None
        assert session.owner.stats.msgs_out == len(sent)
        assert queue.backlog == 0
        assert budget.used == 0

    asyncio.run(run())
