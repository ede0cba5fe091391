"""Memory bounded in bytes (docs/memory.md): per queue, per read in flight, HTTP bodies, and
the broker-wide budget. RSS is measured in a broker child process (/proc/PID/status)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from pathlib import Path

import pytest

from fqbroker.clients.fq.client import Client
from fqbroker.core.budget import MemoryBudget, fitting
from fqbroker.core.frames import PEER_OVERHEAD
from fqbroker.core.message import Message
from fqbroker.core.queue import Queue
from fqbroker.core.queuespec import Policy, QueueKind, QueueSpec, parse_queue_field
from fqbroker.core.router import ClientStats, Router
from fqbroker.protocols.fq import wire
from fqbroker.protocols.fq.msgdecoder import MessageDecoder
from fqbroker.server.broker import Broker
from tests.conftest import TIMEOUT, RawConn, authenticate, open_session
from tests.procs import Proc

MiB = 1 << 20
KiB = 1 << 10
# What a broker's RSS may grow by beyond the bytes it is allowed to hold: allocator
# slack, socket read buffers, a copy of one read: 4 MiB measured, 32 allowed.
SLACK = 32 * MiB


def memory_kib(pid: int, field: str) -> int:
    """VmRSS or VmHWM of a process, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


async def start_broker(tmp_path: Path, **settings: int) -> tuple[Proc, int]:
    conf = tmp_path / "fqd.toml"
    conf.write_text("[fqd]\n" + "".join(f"{k} = {v}\n" for k, v in settings.items()))
    return await Proc.start_fqd(tmp_path, "--config", str(conf))


async def stop(fqd: Proc) -> None:
    fqd.kill()
    _, _, err = await fqd.finish()
    print(err)  # shown only when the test fails


async def holder(port: int, queue_field: bytes, exchange: bytes) -> RawConn:
    """A command connection owning a queue bound to ``exchange``, with no data channel:
    nothing drains the queue."""
    cmd = await authenticate(port, b"holder", queue_field)
    assert isinstance(await cmd.frame(), wire.AuthResponse)
    await cmd.send(wire.encode(wire.BindRequest(0x100, exchange, b"prefix:")))
    assert isinstance(await cmd.reply(), wire.BindResponse)
    return cmd


async def http_get(port: int, path: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.0\r\n\r\n".encode())
    async with asyncio.timeout(TIMEOUT):
        data = await reader.read()
    writer.close()
    return data.partition(b"\r\n\r\n")[2]


async def queue_stats(port: int, name: str) -> dict[str, object]:
    queues = json.loads(await http_get(port, "/stats.json"))["queues"]
    result: dict[str, object] = queues[name]
    return result


async def poll(check: object, port: int, name: str) -> dict[str, object]:
    """Queue stats once ``check(stats)`` holds (bounded)."""
    async with asyncio.timeout(TIMEOUT * 3):
        while True:
            stats = await queue_stats(port, name)
            if check(stats):  # type: ignore[operator]
                return stats
            await asyncio.sleep(0.02)


# --- sans-IO: the byte limits of a queue -----------------------------------------------------


def test_fitting_takes_the_message_that_crosses_the_limit() -> None:
    frames = [b"x" * 10] * 5
    assert fitting(frames, 0) == 0
    assert fitting(frames, 1) == 1
    assert fitting(frames, 10) == 1
    assert fitting(frames, 11) == 2
    assert fitting(frames, 1000) == 5


async def test_resize_grows_shrinks_and_says_what_to_wait_for() -> None:
    budget = MemoryBudget(100)
    assert budget.resize(0, 60) == (60, None)  # fits: held at once
    assert budget.used == 60
    assert budget.resize(60, 120) == (60, 60)  # 60 more do not fit: acquire them first
    assert budget.used == 60
    assert budget.resize(60, 20) == (20, None)  # shrinking gives back the rest
    assert budget.used == 20
    budget.used = 150  # spent by others
    assert budget.resize(20, 0) == (0, 0)  # holding nothing, it waits until not spent
    assert budget.used == 130
    assert budget.resize(0, 0) == (0, 0)
    budget.used = 0
    waiter = asyncio.ensure_future(budget.acquire(200))  # more than the limit: waits
    await asyncio.sleep(0)
    assert budget.waiting == 1
    assert budget.resize(0, 10) == (10, None)  # a small one may pass those waiting
    assert budget.resize(10, 20, behind_waiters=True) == (10, 10)  # a large one queues
    waiter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiter


def test_backlog_bytes_is_a_queue_param_that_round_trips() -> None:
    spec = parse_queue_field(b"q\0mem:drop,backlog_bytes=8m")
    assert spec.backlog_bytes == 8 * MiB
    assert "backlog_bytes=8388608" in spec.attributes
    assert parse_queue_field(b"q\0mem:" + spec.attributes.encode()).backlog_bytes == 8 * MiB
    assert parse_queue_field(b"q\0mem:backlog_bytes=2k").backlog_bytes == 2048
    with pytest.raises(Exception, match="backlog_bytes=lots"):
        parse_queue_field(b"q\0mem:backlog_bytes=lots")


def _frame(size: int) -> bytes:
    """A peer frame of ``size`` bytes (24 at least): what queues hold."""
    frame = Message(b"", b"", b"a" * (size - PEER_OVERHEAD)).peer_frame()
    assert len(frame) == size
    return frame


def test_drop_queue_refuses_past_its_bytes_and_counts_them() -> None:
    budget = MemoryBudget(1 << 40)
    queue = Queue(QueueSpec(b"q", backlog_bytes=100), budget=budget)
    assert queue.offer([_frame(40)] * 5) == 3  # 40, 80, 120: the third crosses the limit
    assert queue.dropped_to == 2
    assert queue.store.held_bytes == budget.used == 120
    assert queue.offer([_frame(40)]) == 0
    assert queue.dropped_to == 3
    queue.take(10)
    assert budget.used == 0
    assert queue.offer([_frame(24)]) == 1


def test_block_queue_is_full_at_its_bytes() -> None:
    queue = Queue(QueueSpec(b"q", policy=Policy.BLOCK, backlog_bytes=100), budget=None)
    frames = [_frame(40)] * 5
    assert queue.takes(frames) == 3
    assert queue.offer(frames[:3]) == 3
    assert queue.is_full
    assert queue.takes(frames) == 1  # it always takes the one that fills it
    queue.take(1)
    assert not queue.is_full


def test_disk_queue_has_no_byte_limit_on_its_files() -> None:
    queue = Queue(QueueSpec(b"q", kind=QueueKind.DISK, backlog_bytes=100))
    assert queue.room_bytes > 1 << 40


def test_router_counts_byte_drops_as_one_by_one() -> None:
    """Gathered runs drop the same messages, with the same counters, as one at a time."""
    frames_in = [(b"r", b"p" * size) for size in (30, 50, 40, 10, 70, 5)]
    results = []
    for one_by_one in (False, True):
        router = Router()
        queue = Queue(QueueSpec(b"q", backlog_bytes=200))
        router.bind(b"ex", b"prefix:", queue)
        client = ClientStats()
        msgs = [Message(b"ex", route, payload) for route, payload in frames_in]
        if one_by_one:
            for msg in msgs:
                router.publish(msg, client)
        else:
            from fqbroker.core.message import runs_of

            router.publish_runs(runs_of(msgs), 0, client)
        taken = [len(f) for f in queue.take(100)]
        results.append((taken, queue.dropped_to, client.dropped, router.aggregate.dropped))
    assert results[0] == results[1]
    assert results[0][1] > 0


# --- a broker child: RSS under the byte limits -----------------------------------------------


async def test_queued_64k_messages_hold_only_the_queues_bytes(tmp_path: Path) -> None:
    """1,600 queued 64 KiB messages (100 MiB) into a queue limited to 8 MiB: dropped past
    it and counted, and the broker's RSS grows by the limit, not by 100 MiB."""
    fqd, port = await start_broker(tmp_path)
    try:
        cmd = await holder(port, b"q64\0mem:public,drop,backlog_bytes=8m", b"big")
        async with Client(port=port, source="pub") as pub:
            await pub.confirm()
            before = memory_kib(fqd.proc.pid, "VmRSS")
            payload = b"m" * (64 * KiB)
            for i in range(1600):
                pub.publish(b"big", b"r", payload)
                if i % 100 == 99:
                    await pub.confirm()  # routed: held or dropped
            await pub.confirm()
            grown = memory_kib(fqd.proc.pid, "VmHWM") - before
        stats = await queue_stats(port, "q64")
        assert isinstance(stats["backlog"], int)
        assert stats["backlog"] <= 8 * MiB // (64 * KiB) + 1
        assert stats["dropped_to"] == 1600 - stats["backlog"]
        metrics = (await http_get(port, "/metrics")).decode()
        held = next(
            float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith('fq_queue_held_bytes{queue="q64"}')
        )
        assert 0 < held <= 8 * MiB + 65 * KiB
        assert "fq_memory_limit_bytes 1.073741824e+09" in metrics
        assert grown * KiB < 8 * MiB + SLACK, f"RSS grew by {grown} KiB"
        await cmd.close()
    finally:
        await stop(fqd)


def _publisher_head(exchange: bytes, route: bytes, size: int) -> bytes:
    return (
        bytes((len(exchange),)) + exchange + bytes((len(route),)) + route + bytes(16)
    ) + struct.pack(">I", size)


async def _send_large(
    port: int, payload: memoryview, started: asyncio.Event, conns: list[RawConn]
) -> None:
    cmd = await authenticate(port, b"big")
    conns.append(cmd)
    reply = await cmd.frame()
    assert isinstance(reply, wire.AuthResponse)
    data = await RawConn.open(port)
    conns.append(data)
    await data.send(wire.encode_hello(wire.Mode.DATA, reply.key))
    await data.send(_publisher_head(b"huge", b"r", len(payload)))
    started.set()
    with contextlib.suppress(ConnectionError):
        for i in range(0, len(payload), MiB):
            await data.send(payload[i : i + MiB])


async def test_two_100mib_messages_are_held_within_the_budget(tmp_path: Path) -> None:
    """Two connections announce and send 100 MiB payloads against a 160 MiB budget: one is
    read and queued, the other waits (its publisher slowed, not refused), RSS stays under
    the budget, and another client is served meanwhile. Once a consumer drains the first,
    the second is read too."""
    budget = 160 * MiB
    fqd, port = await start_broker(tmp_path, memory_budget=budget)
    senders: list[asyncio.Task[None]] = []
    conns: list[RawConn] = []
    try:
        conns.append(await holder(port, b"huge\0mem:public,drop,backlog_bytes=0", b"huge"))
        before = memory_kib(fqd.proc.pid, "VmRSS")
        payload = memoryview(b"p" * (100 * MiB))
        for _ in range(2):
            started = asyncio.Event()
            senders.append(asyncio.ensure_future(_send_large(port, payload, started, conns)))
            await started.wait()
        await poll(lambda s: s["backlog"] == 1, port, "huge")
        # One is in the queue; the other cannot be granted its 100 MiB: it waits.
        done, _ = await asyncio.wait(senders, timeout=0)
        assert len(done) <= 1
        # Someone else publishes and receives meanwhile.
        async with Client(port=port, source="other") as other:
            await other.bind(b"small", b"prefix:")
            other.publish(b"small", b"r", b"hello")
            async with asyncio.timeout(TIMEOUT):
                assert (await other.receive()).payload == b"hello"
        peak = memory_kib(fqd.proc.pid, "VmHWM") - before
        assert peak * KiB < budget + SLACK, f"RSS grew by {peak} KiB"
        assert (await queue_stats(port, "huge"))["backlog"] == 1
        # A consumer drains the queue: the waiting message is read and arrives as well.
        consumer = await open_session(port, b"holder2", b"huge\0mem:public,drop,backlog_bytes=0")
        got = await consumer.receive(1)
        assert len(got[0].payload) == 100 * MiB
        got = await consumer.receive(1)
        assert len(got[0].payload) == 100 * MiB
        await consumer.close()
        # Written out a piece at a time: the consumer's socket buffer holds no copy.
        peak = memory_kib(fqd.proc.pid, "VmHWM") - before
        assert peak * KiB < budget + SLACK, f"RSS grew by {peak} KiB"
    finally:
        for task in senders:
            task.cancel()
        await asyncio.gather(*senders, return_exceptions=True)
        for conn in conns:
            await conn.close()
        await stop(fqd)


async def test_message_larger_than_the_budget_is_refused_unbuffered(tmp_path: Path) -> None:
    """A message the budget could never hold is read and discarded, counted as
    size_dropped; the channel carries on."""
    fqd, port = await start_broker(tmp_path, memory_budget=32 * MiB)
    try:
        session = await open_session(port, b"u", b"me\0mem:public")
        await session.bind(b"ex", b"prefix:")
        before = memory_kib(fqd.proc.pid, "VmRSS")
        await session.data.send(_publisher_head(b"ex", b"r", 64 * MiB))
        chunk = bytes(MiB)
        for _ in range(64):
            await session.data.send(chunk)
        await session.publish(b"ex", b"r", b"after")
        assert (await session.receive(1))[0].payload == b"after"
        assert (await session.status())["size_dropped"] == 1
        assert (memory_kib(fqd.proc.pid, "VmHWM") - before) * KiB < 32 * MiB
        await session.close()
    finally:
        await stop(fqd)


async def test_http_submit_over_the_body_limit_gets_413_unbuffered(tmp_path: Path) -> None:
    """A 64 MiB /submit body against the 16 MiB default: 413 before the body is read, and
    what the client sends anyway is discarded, not buffered."""
    fqd, port = await start_broker(tmp_path)
    try:
        before = memory_kib(fqd.proc.pid, "VmRSS")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        size = 64 * MiB
        writer.write(
            b"POST /submit HTTP/1.1\r\nHost: x\r\nX-Fq-Exchange: ex\r\nX-Fq-Route: r\r\n"
            b"Content-Length: %d\r\n\r\n" % size
        )
        chunk = bytes(MiB)

        async def body() -> None:
            with contextlib.suppress(ConnectionError):
                for _ in range(size // MiB):
                    writer.write(chunk)
                    await writer.drain()

        sending = asyncio.ensure_future(body())
        async with asyncio.timeout(TIMEOUT):
            status = await reader.readline()
        assert status.startswith(b"HTTP/1.1 413"), status
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
        writer.close()
        assert (memory_kib(fqd.proc.pid, "VmHWM") - before) * KiB < 16 * MiB
    finally:
        await stop(fqd)


async def test_submit_under_the_limit_still_works(settings: object, tmp_path: Path) -> None:
    from fqbroker.settings.broker import Settings

    assert isinstance(settings, Settings)
    async with Broker(settings) as broker:
        async with Client(port=broker.port, source="u") as c:
            await c.bind(b"ex", b"prefix:")
            reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
            body = b"x" * MiB
            writer.write(
                b"POST /submit HTTP/1.0\r\nX-Fq-Exchange: ex\r\nX-Fq-Route: r\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body) + body
            )
            async with asyncio.timeout(TIMEOUT):
                reply = await reader.read()
                assert reply.startswith(b"HTTP/1.1 200"), reply[:80]
                assert (await c.receive()).payload == body
            writer.close()
        assert broker.budget.used == 0  # every reservation given back


# --- the decoder's large frames ---------------------------------------------------------------


def _publisher_frame(route: bytes, payload: bytes) -> bytes:
    return Message(b"ex", route, payload).publish_frame()


@pytest.mark.parametrize("chunk", [7, 4096, 65536, 1_000_003, 1 << 30])
def test_large_frames_decode_alike_however_split(chunk: int) -> None:
    big = _publisher_frame(b"big", bytes(range(256)) * (3 * 4096 + 7))  # 3 MiB
    small = _publisher_frame(b"small", b"hello")
    stream = small + big + small + big + big[:10]
    whole = MessageDecoder(peer_format=False)
    whole.feed(stream)
    expected = whole.runs(b"user", b"HOPS")
    decoder = MessageDecoder(peer_format=False)
    got = []
    for i in range(0, len(stream), chunk):
        decoder.feed(stream[i : i + chunk])
        got += decoder.runs(b"user", b"HOPS")

    def frames(runs: list[tuple[bytes, bytes, list[bytes], int]]) -> list[tuple[object, ...]]:
        return [(ex, rt, f, head) for ex, rt, fs, head in runs for f in fs]

    assert frames(got) == frames(expected)
    assert decoder.octets == whole.octets


def test_in_flight_announces_a_large_frame_before_it_arrives() -> None:
    decoder = MessageDecoder(peer_format=False)
    head = _publisher_head(b"ex", b"r", 100 * MiB)
    decoder.feed(head + bytes(1000))
    assert decoder.runs(b"u", b"HOPS") == []
    assert decoder.in_flight >= 100 * MiB
    assert decoder._large is None  # nothing allocated until more bytes are let in
    decoder.feed(bytes(1000))
    assert decoder._large is not None
    assert decoder.in_flight == len(head) + 100 * MiB + 2 + 1 + 4  # + sender and hops


# --- the budget -------------------------------------------------------------------------------


async def test_budget_wakes_waiters_in_order_and_each_checks_again() -> None:
    budget = MemoryBudget(100)
    budget.used = 100
    order: list[str] = []

    async def want(name: str, n: int) -> None:
        await budget.acquire(n)
        order.append(name)

    big = asyncio.ensure_future(want("big", 80))
    await asyncio.sleep(0)
    small = asyncio.ensure_future(want("small", 30))
    await asyncio.sleep(0)
    assert budget.waiting == 2
    budget.release(90)  # 10 used: both look as if they fit; big claims first
    await asyncio.wait_for(big, TIMEOUT)
    await asyncio.sleep(0)
    assert order == ["big"]  # small checked again: 90 + 30 is over, so it waits on
    assert budget.waiting == 1 and budget.used == 90
    budget.release(60)
    await asyncio.wait_for(small, TIMEOUT)
    assert order == ["big", "small"]
    assert budget.paused == 2


async def test_a_cancelled_waiter_passes_its_turn_on() -> None:
    budget = MemoryBudget(100)
    budget.used = 100
    first = asyncio.ensure_future(budget.wait(50))
    await asyncio.sleep(0)
    second = asyncio.ensure_future(budget.wait(50))
    await asyncio.sleep(0)
    budget.release(50)
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    await asyncio.wait_for(second, TIMEOUT)
    assert budget.waiting == 0


# --- an in-process broker: slowed, then resumed -------------------------------------------------


async def test_publisher_waits_while_the_budget_is_spent_and_loses_nothing(
    settings: object,
) -> None:
    """A 1 MiB budget, a queue with no byte limit and no consumer yet: the publisher of
    64 KiB messages is paused once the queue has spent the budget, and resumes as a
    consumer drains; every message arrives."""
    from fqbroker.settings.broker import Settings

    assert isinstance(settings, Settings)
    settings.memory_budget = 1 * MiB
    async with Broker(settings) as broker:
        cmd = await holder(broker.port, b"all\0mem:public,block,backlog_bytes=0", b"ex")
        payload = b"m" * (64 * KiB)
        async with Client(port=broker.port, source="pub") as pub:
            for _ in range(64):  # 4 MiB
                pub.publish(b"ex", b"r", payload)
            flushed = asyncio.ensure_future(pub.confirm())
            async with asyncio.timeout(TIMEOUT):
                while not broker.budget.waiting:
                    await asyncio.sleep(0.01)
            assert not flushed.done()
            assert broker.budget.used <= 1 * MiB + 256 * KiB
            consumer = await open_session(
                broker.port, b"c", b"all\0mem:public,block,backlog_bytes=0"
            )
            got = await consumer.receive(64)
            assert [m.payload for m in got] == [payload] * 64
            assert await asyncio.wait_for(flushed, TIMEOUT) == 64
            await consumer.close()
        await cmd.close()
        assert broker.budget.paused >= 1


async def test_block_queue_holds_its_bytes_and_loses_nothing(settings: object) -> None:
    from fqbroker.settings.broker import Settings

    assert isinstance(settings, Settings)
    async with Broker(settings) as broker:
        cmd = await holder(broker.port, b"blk\0mem:public,block,backlog_bytes=256k", b"ex")
        queue = broker.queues[b"blk"]
        payload = b"b" * (64 * KiB)
        async with Client(port=broker.port, source="pub") as pub:
            for _ in range(40):
                pub.publish(b"ex", b"r", payload)
            confirmed = asyncio.ensure_future(pub.confirm())
            async with asyncio.timeout(TIMEOUT):
                while not queue.is_full:
                    await asyncio.sleep(0.01)
            assert queue.store.held_bytes <= 256 * KiB + 64 * KiB + 200
            assert not confirmed.done()
            consumer = await open_session(broker.port, b"c", b"blk\0mem:public,block")
            got = await consumer.receive(40)
            assert len(got) == 40
            assert await asyncio.wait_for(confirmed, TIMEOUT) == 40
            await consumer.close()
        assert queue.dropped_to == 0
        await cmd.close()


async def test_a_peers_large_message_is_held_within_the_budget(tmp_path: Path) -> None:
    """A peer-mode data channel decodes large messages with copies; its reservation
    covers them, so the broker stays within the budget: one is decoded, the others wait."""
    budget = 64 * MiB
    fqd, port = await start_broker(tmp_path, memory_budget=budget)
    try:
        cmd = await holder(port, b"pq\0mem:public,drop,backlog_bytes=0", b"ex")
        peer = await authenticate(port, b"peer")
        reply = await peer.frame()
        assert isinstance(reply, wire.AuthResponse)
        data = await RawConn.open(port)
        await data.send(wire.encode_hello(wire.Mode.PEER, reply.key, bytes([10, 9, 9, 9])))
        before = memory_kib(fqd.proc.pid, "VmRSS")
        payload = bytes(20 * MiB)
        frame = Message(b"ex", b"r", payload, sender=b"s", hops=bytes([10, 9, 9, 9])).peer_frame()
        data.writer.write(frame * 3)  # the broker reads it as its budget allows
        await poll(lambda s: s["backlog"] >= 1, port, "pq")
        peak = memory_kib(fqd.proc.pid, "VmHWM") - before
        assert peak * KiB < budget + SLACK, f"RSS grew by {peak} KiB"
        data.writer.transport.abort()  # what it still has to send will never be read
        await peer.close()
        await cmd.close()
    finally:
        await stop(fqd)


def test_a_zero_budget_means_no_broker_wide_limit(settings: object) -> None:
    from fqbroker.settings.broker import Settings

    assert isinstance(settings, Settings)
    settings.memory_budget = 0
    broker = Broker(settings)
    try:
        assert broker.budget.fits(1 << 40)
    finally:
        broker.catalog.close()


def test_a_head_that_arrives_in_pieces_is_never_assembled_past_the_size_limit() -> None:
    """The data socket reserves what ``in_flight`` announces, then reads on. A frame whose
    head was still incomplete at that moment was assembled at the next read at whatever
    size its head then said, over ``max_payload`` too: the fuzz found the broker at 12 GB
    of RSS under a 1 GiB budget. It must be refused (skipped, counted) instead."""
    limit = 2 << 20
    decoder = MessageDecoder(peer_format=False, max_payload=limit)
    head = bytes([2]) + b"ex" + bytes([1]) + b"r" + bytes(16) + struct.pack(">I", 50 << 20)
    decoder.feed(head[:5])
    assert decoder.runs(b"u", bytes(8)) == []
    decoder.feed(head[5:] + bytes(1 << 20))
    assert decoder.runs(b"u", bytes(8)) == []
    assert decoder.in_flight <= limit + 1024
    assert decoder.oversized == 1
