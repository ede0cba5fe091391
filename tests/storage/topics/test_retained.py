"""Retained topics on real files: offsets, reads, retention, restart, the sink, the broker."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fqbroker.clients.fq.client import Client
from fqbroker.core.budget import MemoryBudget
from fqbroker.core.frames import encode_peer, peer_fields
from fqbroker.core.router import Router
from fqbroker.frontends.figg.settings import Figg, topic_config
from fqbroker.frontends.http.stats.snapshot import take_snapshot
from fqbroker.settings.broker import Settings
from fqbroker.storage.store import DiskStore
from fqbroker.storage.topics import retained as topics_module
from fqbroker.storage.topics.retained import Topic, Topics
from tests.conftest import NODE_ID, running
from tests.e2e.http.test_http import get
from tests.e2e.http.test_metrics import scrape, value

SEGMENT = 4096


def frame(route: bytes, payload: bytes, exchange: bytes = b"figg") -> bytes:
    return encode_peer(exchange, route, bytes(16), b"test", b"", payload)


def figg_settings(tmp_path: Path, **figg: object) -> Settings:
    settings = Settings(
        port=0,
        node_id=NODE_ID,
        config_db=tmp_path / "fqd.sqlite",
        queue_dir=tmp_path / "queues",
    )
    settings.set_section(settings.section(Figg).updated({"listen": "127.0.0.1:0", **figg}))
    return settings


class Harness:
    """Topics as a broker holds them: a router, the shared dirty set and budget."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.router = Router()
        self.dirty: set[DiskStore] = set()
        self.budget = MemoryBudget(1 << 30)
        self.topics = Topics(topic_config(settings), self.router, self.dirty, self.budget)

    def publish(self, route: bytes, payloads: list[bytes]) -> None:
        """Offer and write, as a publisher's flush would: durable comes later."""
        self.topics.sink.offer([frame(route, p) for p in payloads])
        self.flush()

    def flush(self) -> None:
        while self.dirty:
            self.dirty.pop().flush()

    async def durable(self, route: bytes) -> Topic:
        topic = self.topics.get(route)
        assert topic is not None
        async with asyncio.timeout(10):
            assert await topic.store.wait_durable(topic.store.written_seq)
        return topic

    async def publish_durably(self, route: bytes, payloads: list[bytes]) -> Topic:
        self.publish(route, payloads)
        return await self.durable(route)


@contextlib.asynccontextmanager
async def harness(settings: Settings) -> AsyncIterator[Harness]:
    h = Harness(settings)
    h.topics.start()
    try:
        yield h
    finally:
        await h.topics.close()


def payloads_of(batch: list[tuple[int, bytes]]) -> list[bytes]:
    return [peer_fields(f)[2] for _, f in batch]


def read_all(topic: Topic, after: int = 0, **kw: int) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    while batch := topic.read(after, **kw):
        assert batch[0][0] > after
        out += batch
        after = batch[-1][0]
    return out


# --- offsets and reads ---------------------------------------------------------------------


async def test_offsets_count_messages_and_reads_return_frames(tmp_path: Path) -> None:
    async with harness(figg_settings(tmp_path)) as h:
        h.publish(b"t", [b"a"])
        topic = h.topics.get(b"t")
        assert topic is not None
        assert (topic.first_offset, topic.last_offset) == (0, 0)
        topic = await h.publish_durably(b"t", [b"b", b"c"])
        assert (topic.first_offset, topic.last_offset, topic.messages_in) == (0, 3, 3)
        batch = topic.read(0)
        assert [o for o, _ in batch] == [1, 2, 3]
        assert payloads_of(batch) == [b"a", b"b", b"c"]
        assert peer_fields(batch[0][1])[:2] == (b"figg", b"t")
        assert payloads_of(topic.read(2)) == [b"c"]
        assert topic.read(3) == [] and topic.read(99) == []
        assert (h.settings.queue_dir / "topics" / b"t".hex()).is_dir()


async def test_reads_see_only_durable_messages(tmp_path: Path) -> None:
    async with harness(figg_settings(tmp_path)) as h:
        topic = await h.publish_durably(b"t", [b"a"])
        h.publish(b"t", [b"b"])  # written, its fsync not yet run: the loop has not turned
        assert topic.store.written_seq == 2
        assert topic.last_offset == 1
        assert [o for o, _ in topic.read(0)] == [1]
        assert topic.read(1) == []
        await h.durable(b"t")
        assert payloads_of(topic.read(1)) == [b"b"]


async def test_start_offset(tmp_path: Path) -> None:
    async with harness(figg_settings(tmp_path, segment_bytes=SEGMENT)) as h:
        topic = await h.publish_durably(b"t", [b"%d" % i + b"x" * 200 for i in range(100)])
        assert topic.start_offset(None) == 100  # latest
        assert topic.start_offset(0) == 0
        assert topic.start_offset(57) == 57
        assert topic.start_offset(100) == 100
        assert topic.start_offset(10**12) == 100  # past the end: clamped
        topic.retention_bytes = SEGMENT * 2
        assert h.topics.enforce_retention() > 0
        first = topic.first_offset
        assert 0 < first < 100
        assert topic.start_offset(0) == first  # expired: the oldest kept
        assert topic.start_offset(first + 1) == first + 1
        assert payloads_of(topic.read(0))[0] == b"%d" % first + b"x" * 200


async def test_read_across_segments_from_file_and_memory(tmp_path: Path) -> None:
    async with harness(figg_settings(tmp_path, segment_bytes=SEGMENT)) as h:
        sent = [b"m%05d" % i * 20 for i in range(2000)]
        topic = await h.publish_durably(b"t", sent)
        assert len(topic.store.log.segment_info()) > 10
        cached = read_all(topic, max_records=333)
        # Windows from anywhere in the cache, walked into from either end.
        starts = [*range(0, 2000, 37), 1999, 1998, 1000, 999]
        windows = [topic.read(after, 50) for after in starts]
        topic.store.drop_recent()  # now every read goes to the files
        assert topic.store.held_bytes == 0
        from_file = read_all(topic, max_records=333)
        assert cached == from_file
        for after, window in zip(starts, windows, strict=True):
            assert window == from_file[after : after + 50]
        assert [o for o, _ in from_file] == list(range(1, 2001))
        assert payloads_of(from_file) == sent
        assert payloads_of(read_all(topic, 1500)) == sent[1500:]


async def test_read_max_bytes_returns_at_least_one(tmp_path: Path) -> None:
    async with harness(figg_settings(tmp_path)) as h:
        topic = await h.publish_durably(b"t", [b"x" * 1000] * 10)
        for drop in (False, True):
            if drop:
                topic.store.drop_recent()
            assert len(topic.read(0, max_bytes=1)) == 1
            batch = topic.read(0, max_bytes=3500)
            assert 1 < len(batch) <= 4
            assert sum(map(len, (f for _, f in batch))) <= 3500 + len(batch[-1][1])


async def test_wait_beyond_wakes_on_durability_and_on_close(tmp_path: Path) -> None:
    async with harness(figg_settings(tmp_path)) as h:
        topic = await h.publish_durably(b"t", [b"a"])
        async with asyncio.timeout(10):
            await topic.wait_beyond(0)  # already past: at once
            waiter = asyncio.create_task(topic.wait_beyond(1))
            await asyncio.sleep(0.05)
            assert not waiter.done()
            h.publish(b"t", [b"b"])
            await waiter
            assert topic.last_offset == 2
            closing = asyncio.create_task(topic.wait_beyond(2))
            await asyncio.sleep(0.05)
            assert not closing.done()
        await h.topics.close()
        async with asyncio.timeout(10):
            await closing
        assert topic.closed and topic.read(0) == []


# --- retention -----------------------------------------------------------------------------


async def test_retention_by_size_drops_oldest_segments_keeps_active(tmp_path: Path) -> None:
    async with harness(figg_settings(tmp_path, segment_bytes=SEGMENT)) as h:
        sent = [b"%06d" % i + b"y" * 100 for i in range(1000)]
        topic = await h.publish_durably(b"t", sent)
        before = topic.store.log.segment_info()
        topic.retention_bytes = 5 * SEGMENT
        gone = h.topics.enforce_retention()
        after = topic.store.log.segment_info()
        assert gone == len(before) - len(after) > 0
        assert after == before[gone:]  # the oldest went, in order; the active one stays
        assert after[-1] == before[-1]
        assert topic.size_bytes <= 5 * SEGMENT
        assert topic.size_bytes + before[gone - 1].size > 5 * SEGMENT  # no more than needed
        assert topic.first_offset == after[0].first - 1
        kept = read_all(topic, 0)
        assert [o for o, _ in kept] == list(range(after[0].first, 1001))
        assert payloads_of(kept) == sent[after[0].first - 1 :]
        assert h.topics.enforce_retention() == 0  # nothing more to do
        # Never the active segment, however small the limit.
        topic.retention_bytes = 1
        h.topics.enforce_retention()
        assert len(topic.store.log.segment_info()) == 1
        assert topic.last_offset == 1000 and topic.first_offset == after[-1].first - 1


async def test_retention_runs_after_an_append_that_goes_over_the_size(tmp_path: Path) -> None:
    settings = figg_settings(tmp_path, segment_bytes=SEGMENT, retention_bytes=3 * SEGMENT)
    async with harness(settings) as h:
        await h.publish_durably(b"t", [b"z" * 200] * 10)
        h.publish(b"t", [b"z" * 200] * 200)  # over the limit: the sink asks for a pass
        topic = await h.durable(b"t")
        async with asyncio.timeout(10):
            while topic.first_offset == 0:
                await asyncio.sleep(0)
        assert topic.size_bytes <= 3 * SEGMENT
        assert topic.segments_deleted > 0


async def test_retention_by_age(tmp_path: Path) -> None:
    async with harness(figg_settings(tmp_path, segment_bytes=SEGMENT)) as h:
        topic = await h.publish_durably(b"t", [b"a" * 300] * 100)
        segments = topic.store.log.segment_info()
        assert len(segments) > 4
        assert h.topics.enforce_retention() == 0  # all young
        old = time.time() - topic.retention_seconds - 60
        for seg in segments[:3]:
            os.utime(seg.path, (old, old))
        assert h.topics.enforce_retention() == 3
        assert topic.store.log.segment_info() == segments[3:]
        assert topic.start_offset(0) == segments[3].first - 1
        # Older than the limit but the active segment: it stays.
        for seg in segments:
            with contextlib.suppress(FileNotFoundError):
                os.utime(seg.path, (old, old))
        assert h.topics.enforce_retention() == len(segments) - 4
        assert topic.store.log.segment_info() == segments[-1:]


async def test_per_topic_retention_overrides(tmp_path: Path) -> None:
    settings = figg_settings(
        tmp_path,
        segment_bytes=SEGMENT,
        topics={"small": {"retention_bytes": 2 * SEGMENT}, "young": {"retention_seconds": 1}},
    )
    async with harness(settings) as h:
        small = await h.publish_durably(b"small", [b"s" * 300] * 100)
        big = await h.publish_durably(b"big", [b"b" * 300] * 100)
        young = await h.publish_durably(b"young", [b"y" * 300] * 100)
        assert (small.retention_bytes, young.retention_seconds) == (2 * SEGMENT, 1)
        assert big.retention_bytes == settings.section(Figg).retention_bytes
        h.topics.enforce_retention(time.time() + 30)
        assert small.first_offset > 0 and small.size_bytes <= 2 * SEGMENT
        assert big.first_offset == 0
        assert len(young.store.log.segment_info()) == 1  # all but the active one expired


# --- restart, the set, the sink --------------------------------------------------------------


async def test_messages_and_offsets_survive_a_clean_restart(tmp_path: Path) -> None:
    settings = figg_settings(tmp_path, segment_bytes=SEGMENT)
    async with harness(settings) as h:
        await h.publish_durably(b"one", [b"%d" % i for i in range(500)])
        topic = await h.publish_durably(b"two\xff", [b"x" * 300] * 100)
        topic.retention_bytes = 4 * SEGMENT
        h.topics.enforce_retention()
        h.publish(b"one", [b"tail"])  # written, not awaited: close syncs it
        expected = {t.name: read_all(t) for t in h.topics}
        first = {t.name: t.first_offset for t in h.topics}
    expected[b"one"] = expected[b"one"] + [(501, frame(b"one", b"tail"))]
    async with harness(settings) as h:
        assert sorted(t.name for t in h.topics) == [b"one", b"two\xff"]
        assert {t.name: read_all(t) for t in h.topics} == expected
        assert {t.name: t.first_offset for t in h.topics} == first
        topic = await h.publish_durably(b"one", [b"next"])
        assert topic.last_offset == 502  # offsets go on, never reused


async def test_directories_that_are_not_topics_are_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = figg_settings(tmp_path)
    topics_dir = settings.queue_dir / "topics"
    (topics_dir / "not-hex").mkdir(parents=True)
    (topics_dir / "ABCD").mkdir()  # fqd's names are lowercase hex
    (topics_dir / b"ok".hex()).mkdir()
    (topics_dir / "stray.txt").write_text("x")
    async with harness(settings) as h:
        assert [t.name for t in h.topics] == [b"ok"]
        assert h.topics.open(b"") is None and h.topics.open(b"x" * 128) is None
    assert caplog.text.count("not a topic's directory") == 3


async def test_sink_splits_mixed_routes_in_order(tmp_path: Path) -> None:
    async with harness(figg_settings(tmp_path)) as h:
        frames = [frame(b"a", b"1"), frame(b"a", b"2"), frame(b"b", b"3"), frame(b"a", b"4")]
        assert h.topics.sink.offer(frames) == 4
        h.flush()
        a, b = await h.durable(b"a"), await h.durable(b"b")
        assert payloads_of(a.read(0)) == [b"1", b"2", b"4"]
        assert payloads_of(b.read(0)) == [b"3"]
        assert len(h.topics) == 2


async def test_past_max_topics_messages_are_dropped_counted_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with harness(figg_settings(tmp_path, max_topics=2)) as h:
        sink = h.topics.sink
        assert sink.offer([frame(b"t1", b"x")]) == 1
        assert sink.offer([frame(b"t2", b"x")]) == 1
        assert sink.offer([frame(b"t3", b"x"), frame(b"t3", b"y")]) == 0
        assert sink.offer([frame(b"t4", b"x")]) == 0
        assert sink.offer([frame(b"t1", b"more")]) == 1  # known topics go on
        assert sink.offer([frame(b"", b"no name")]) == 0
        assert h.topics.dropped == 4
        assert len(h.topics) == 2 and h.topics.get(b"t3") is None
        assert caplog.text.count("max_topics") == 1


# --- in a broker ---------------------------------------------------------------------------


async def test_fq_messages_on_the_figg_exchange_land_in_topics(tmp_path: Path) -> None:
    settings = figg_settings(tmp_path)
    async with running(settings) as broker:
        assert broker.topics is not None
        async with Client(port=broker.port, source="pub", reconnect=False) as publisher:
            for i in range(50):
                publisher.publish(b"figg", b"route", b"m%d" % i)
            publisher.publish(b"figg", b"other", b"o")
            await publisher.confirm()  # routed and durable
        topic = broker.topics.get(b"route")
        assert topic is not None and topic.last_offset == 50
        assert payloads_of(read_all(topic)) == [b"m%d" % i for i in range(50)]
        other = broker.topics.get(b"other")
        assert other is not None and payloads_of(other.read(0)) == [b"o"]
        # The sink's binding is on the router only: nothing persisted.
        assert list(broker.catalog.config.bindings()) == []


async def test_fq_consumer_and_topic_both_get_figg_messages(tmp_path: Path) -> None:
    settings = figg_settings(tmp_path)
    async with running(settings) as broker:
        assert broker.topics is not None
        async with (
            Client(port=broker.port, source="u/q/mem", reconnect=False) as consumer,
            Client(port=broker.port, source="pub", reconnect=False) as publisher,
        ):
            await consumer.bind(b"figg", b'exact:"T"')
            for i in range(20):
                publisher.publish(b"figg", b"T", b"%d" % i)
                publisher.publish(b"figg", b"U", b"u%d" % i)
            await publisher.confirm()
            async with asyncio.timeout(10):
                got = [await consumer.receive() for _ in range(20)]
            # Stats walk the router's bindings: the sink is there, named as no queue is.
            snap = take_snapshot(broker)
            (figg,) = [ex for ex in snap.exchanges if ex.name == b"figg"]
            assert sorted(r.queue for r in figg.routes) == [b"(figg topics)", b"q"]
        assert [m.payload for m in got] == [b"%d" % i for i in range(20)]
        t = broker.topics.get(b"T")
        assert t is not None and payloads_of(t.read(0)) == [m.payload for m in got]
        assert broker.topics.get(b"U") is not None


async def test_no_topics_without_figg(tmp_path: Path) -> None:
    settings = figg_settings(tmp_path)
    settings.set_section(settings.section(Figg).updated({"listen": ""}))
    async with running(settings) as broker:
        assert broker.topics is None
        assert b"figg" not in broker.router.exchanges


async def test_stats_metrics_and_web_json_cope_with_the_sink(tmp_path: Path) -> None:
    async with running(figg_settings(tmp_path)) as broker:
        async with Client(port=broker.port, source="pub", reconnect=False) as publisher:
            publisher.publish(b"figg", b"T", b"x")
            await publisher.confirm()
        response, body = await get(broker.port, "/stats.json")
        assert response.status_code == 200
        routes = json.loads(body)["exchanges"]["figg"]["routes"]
        assert [r["queue"] for r in routes.values()] == ["(figg topics)"]
        samples, _ = await scrape(broker)
        assert value(samples, "fq_route_invocations_total", exchange="figg",
                     route_id=next(iter(routes)), queue="(figg topics)") == 1  # fmt: skip


async def test_a_topic_that_cannot_be_opened_drops_and_is_tried_again_later(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert topics_module.RETRY_OPEN > 1  # a failing directory is not tried on every message
    async with harness(figg_settings(tmp_path)) as h:
        h.publish(b"ok", [b"x"])  # makes topics/
        blocker = h.settings.queue_dir / "topics" / b"bad".hex()
        blocker.write_text("a file where its directory would be")
        sink = h.topics.sink
        assert sink.offer([frame(b"bad", b"1")]) == 0
        assert sink.offer([frame(b"bad", b"2")]) == 0  # not tried again at once
        assert h.topics.dropped == 2
        assert caplog.text.count("cannot be opened") == 1
        blocker.unlink()
        assert sink.offer([frame(b"bad", b"3")]) == 0  # still waiting to try again
        h.topics._unusable[b"bad"] = 0.0  # the wait is over
        assert sink.offer([frame(b"bad", b"4")]) == 1
        h.flush()
        topic = await h.durable(b"bad")
        assert payloads_of(topic.read(0)) == [b"4"]


async def test_caches_of_idle_topics_and_under_memory_pressure_are_given_back(
    tmp_path: Path,
) -> None:
    async with harness(figg_settings(tmp_path)) as h:
        busy = await h.publish_durably(b"busy", [b"b" * 100] * 100)
        idle = await h.publish_durably(b"idle", [b"i" * 100] * 100)
        held = h.budget.used
        assert held >= busy.store.held_bytes + idle.store.held_bytes > 0
        h.topics.trim_caches()  # both were written since the last pass: both kept
        assert busy.store.held_bytes and idle.store.held_bytes
        h.publish(b"busy", [b"b"])
        h.topics.trim_caches()
        assert busy.store.held_bytes and not idle.store.held_bytes
        assert h.budget.used == busy.store.held_bytes
        assert payloads_of(idle.read(99)) == [b"i" * 100]  # from the file now
        h.publish(b"busy", [b"b"])
        h.budget.limit = h.budget.used  # over half spent: every cache goes
        h.topics.trim_caches()
        assert busy.store.held_bytes == 0 and h.budget.used == 0


class Subscriber:
    """What a Figg session registers in ``Topic.subscribers``."""

    remote = "127.0.0.1:1"
    offset = 0


def open_in(directory: Path) -> int:
    """This process's descriptors open on files in ``directory``."""
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if Path(os.readlink(f"/proc/self/fd/{fd}")).parent == directory:
                found += 1
    return found


async def test_idle_unread_topics_give_their_descriptors_back(tmp_path: Path) -> None:
    """Thousands of quiet topics must not each hold a writer and read descriptors from the
    limit max_connections is derived from; they are opened again on demand."""
    async with harness(figg_settings(tmp_path, segment_bytes=4096)) as h:
        topic = await h.publish_durably(b"quiet", [b"q" * 100] * 200)  # several segments
        topic.store.drop_recent()
        assert len(read_all(topic)) == 200  # from the files: read descriptors open
        directory = topic.store.log.directory
        assert open_in(directory) >= 3  # checkpoints, writer, readers
        topic.subscribers.add(Subscriber())  # read by someone: kept
        h.topics.trim_caches()
        h.topics.trim_caches()
        assert open_in(directory) >= 3
        topic.subscribers.clear()
        h.topics.trim_caches()
        assert open_in(directory) == 1  # the checkpoints file
        await h.publish_durably(b"quiet", [b"after"])  # the writer opens again
        assert payloads_of(read_all(topic, 200)) == [b"after"]
        assert [o for o, _ in read_all(topic)] == list(range(1, 202))


async def test_the_retention_timer_deletes_expired_segments_by_itself(tmp_path: Path) -> None:
    async with harness(figg_settings(tmp_path, segment_bytes=SEGMENT)) as h:
        topic = await h.publish_durably(b"t", [b"a" * 300] * 100)
        segments = topic.store.log.segment_info()
        old = time.time() - topic.retention_seconds - 60
        os.utime(segments[0].path, (old, old))
        async with asyncio.timeout(10):  # the timer passes every second
            while topic.first_offset == 0:
                await asyncio.sleep(0.05)
        assert topic.store.log.segment_info() == segments[1:]


async def test_reads_step_over_damage_and_nothing_trims_a_topic(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with harness(figg_settings(tmp_path, segment_bytes=SEGMENT)) as h:
        sent = [b"%04d" % i + b"d" * 96 for i in range(1, 201)]
        topic = await h.publish_durably(b"t", sent)
        topic.store.drop_recent()
        first = topic.store.log.segment_info()[0]
        record = 16 + 9 + len(frame(b"t", sent[0]))  # header, arrival tag, frame
        with first.path.open("r+b") as f:  # the 5th record's payload rots on disk
            f.seek(4 * record + record - 3)
            f.write(b"\xff")
        got = read_all(topic, max_records=3)
        assert [o for o, _ in got] == [o for o in range(1, 201) if o != 5]
        assert payloads_of(got) == sent[:4] + sent[5:]
        assert topic.store.corrupt_records == 1
        assert "record changed on disk" in caplog.text
        # A subscription's reads: frames of consecutive offsets, up to the one skipped.
        assert topic.read_frames(0, 3) == (1, [f for _, f in got[:3]])
        assert topic.read_frames(3, 3) == (4, [got[3][1]])
        assert topic.read_frames(4, 3) == (6, [f for _, f in got[4:7]])
        assert topic.read_frames(200) == (201, [])
        # Readers never move a checkpoint, so no trim deletes what they read.
        assert dict(topic.store.log.checkpoints) == {}
        assert topic.store.log.trim() == 0
        assert topic.first_offset == 0
