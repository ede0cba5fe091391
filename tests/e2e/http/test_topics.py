"""Retained topics over HTTP: /topic/info and /topic/read with their blocking client, and
topics in /stats.json and /metrics, on a real broker whose topics are filled by fq
publishes to the Figg exchange, with real Figg subscribers (and, for a subscriber far
behind, a reader registered in ``Topic.subscribers`` as a Figg session registers its own)."""

from __future__ import annotations

import asyncio
import http.client
import json
import time
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fqbroker.clients.fq.client import Client
from fqbroker.clients.http.replay import BrokerError, DataLost, ReplayClient
from fqbroker.core.message import hop_addresses
from fqbroker.frontends.figg.settings import Figg
from fqbroker.frontends.http.reads import topics as topics_http
from fqbroker.protocols.figg.wire import Attach, Attached, Data
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import NODE_ID, TIMEOUT, running, wait_for
from tests.e2e.figg.test_figg import conn


def figg_settings(settings: Settings, **figg: object) -> Settings:
    return settings.with_sections(Figg(listen="127.0.0.1:0", **figg))  # type: ignore[arg-type]


@pytest.fixture
def topic_settings(settings: Settings) -> Settings:
    return figg_settings(settings)


async def publish(port: int, topic: str, n: int, *, start: int = 0, size: int = 0) -> None:
    """fq publishes to the Figg exchange, route = topic; confirmed, so durable."""
    async with Client(port=port, source="pub") as client:
        for i in range(start, start + n):
            client.publish(b"figg", topic.encode(), b"m%d." % i + b"x" * size)
        assert await client.confirm() == n


def get(port: int, target: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", target)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


async def durable(broker: Broker, topic: str, n: int) -> None:
    assert broker.topics is not None
    await wait_for(lambda: (t := broker.topics.get(topic.encode())) is not None  # type: ignore[union-attr]
                   and t.last_offset >= n)  # fmt: skip


async def test_info_and_read_by_message_index(topic_settings: Settings) -> None:
    async with running(topic_settings) as broker:
        rc = ReplayClient(port=broker.port)
        before = time.time_ns() // 1000
        await publish(broker.port, "t1", 10)
        after = time.time_ns() // 1000
        await durable(broker, "t1", 10)

        info = await asyncio.to_thread(rc.topic_info, "t1")
        assert (info.first, info.next, info.subscribers) == (0, 10, 0)
        assert info.size_bytes > 0
        entries = await asyncio.to_thread(rc.read_topic, "t1", 3, 7)
        assert [e.seq for e in entries] == [3, 4, 5, 6]
        assert [e.message.payload for e in entries] == [b"m3.", b"m4.", b"m5.", b"m6."]
        assert all(e.message.route == b"t1" and e.message.exchange == b"figg" for e in entries)
        assert all(e.message.sender == b"pub" for e in entries)
        assert all(hop_addresses(e.message.hops)[0] == NODE_ID for e in entries)
        arrivals = [e.arrival_us for e in entries]
        assert all(a is not None and before <= a <= after for a in arrivals)

        # Reading consumes nothing: the same again, and the whole range in chunks.
        again = await asyncio.to_thread(rc.read_topic, "t1", 3, 7)
        assert [e.message.payload for e in again] == [e.message.payload for e in entries]
        chunks = await asyncio.to_thread(lambda: list(rc.read_topic_range("t1", 0, 10)))
        assert [e.seq for chunk in chunks for e in chunk] == list(range(10))
        assert await asyncio.to_thread(rc.read_topic, "t1", 10, 20) == []
        assert [e.seq for e in await asyncio.to_thread(rc.read_topic, "t1", 8, 99)] == [8, 9]
        # max_bytes bounds a response, yet always gives one message.
        assert [e.seq for e in await asyncio.to_thread(rc.read_topic, "t1", 2, 10, 1)] == [2]

        status, headers, body = await asyncio.to_thread(
            get, broker.port, "/topic/read?topic=t1&from=0"
        )
        assert status == 200 and headers["content-type"] == topics_http.CONTENT_TYPE
        assert (headers["x-fq-first"], headers["x-fq-next"]) == ("0", "10")
        status, _, body = await asyncio.to_thread(get, broker.port, "/topic/info?topic=t1")
        doc = json.loads(body)
        assert status == 200 and set(doc) == {"topic", "first", "next", "size_bytes", "subscribers"}
        assert (doc["topic"], doc["first"], doc["next"]) == ("t1", 0, 10)


@pytest.mark.parametrize(
    ("target", "status", "error"),
    [
        ("/topic/info", 400, "'topic' parameter is required"),
        ("/topic/info?topic=nope", 404, "Cannot find topic 'nope'"),
        ("/topic/info?topic=" + "x" * 128, 400, "a topic name is at most 127 bytes"),
        ("/topic/read?topic=known", 400, "'from' must be a non-negative integer"),
        ("/topic/read?topic=known&from=-1", 400, "'from' must be a non-negative integer"),
        ("/topic/read?topic=known&from=1&to=x", 400, "'to' must be a non-negative integer"),
        ("/topic/read?topic=known&from=" + "9" * 21, 400, "'from' must be a non-negative integer"),
        ("/topic/read?topic=nope&from=0", 404, "Cannot find topic 'nope'"),
    ],
)
async def test_request_errors(
    topic_settings: Settings, target: str, status: int, error: str
) -> None:
    async with running(topic_settings) as broker:
        await publish(broker.port, "known", 1)
        got = await asyncio.to_thread(get, broker.port, target)
        assert got[0] == status, got
        assert json.loads(got[2])["error"] == error


async def test_unknown_topics_read_as_empty_when_asked_and_brokers_without_topics(
    topic_settings: Settings, settings: Settings
) -> None:
    async with running(topic_settings) as broker:
        rc = ReplayClient(port=broker.port)
        with pytest.raises(BrokerError, match="Cannot find topic 'later'"):
            await asyncio.to_thread(rc.topic_info, "later")
        empty = await asyncio.to_thread(lambda: rc.topic_info("later", missing_ok=True))
        assert (empty.first, empty.next) == (0, 0)
    async with running(settings) as broker:
        assert broker.topics is None
        rc = ReplayClient(port=broker.port)
        with pytest.raises(BrokerError, match="the Figg listener is not configured"):
            await asyncio.to_thread(lambda: rc.topic_info("later", missing_ok=True))
        doc = json.loads((await asyncio.to_thread(get, broker.port, "/stats.json"))[2])
        assert "topics" not in doc  # fq's shape, untouched
        metrics = (await asyncio.to_thread(get, broker.port, "/metrics"))[2].decode()
        assert "fq_topic_" not in metrics


async def test_retention_deleted_reads_are_gone(settings: Settings) -> None:
    small = figg_settings(settings, segment_bytes=1024, retention_bytes=2048)
    async with running(small) as broker:
        rc = ReplayClient(port=broker.port)
        await publish(broker.port, "ret", 200, size=100)
        await durable(broker, "ret", 200)
        assert broker.topics is not None
        broker.topics.enforce_retention()  # if growth's own pass did not do it all yet
        info = await asyncio.to_thread(rc.topic_info, "ret")
        assert 0 < info.first < info.next == 200
        with pytest.raises(DataLost) as lost:
            await asyncio.to_thread(rc.read_topic, "ret", 0, 10)
        assert lost.value.first == info.first
        entries = await asyncio.to_thread(rc.read_topic, "ret", info.first, info.first + 1)
        assert [e.message.payload.split(b".")[0] for e in entries] == [b"m%d" % info.first]


@dataclass
class Reader:
    """What a Figg session registers in ``Topic.subscribers``."""

    remote: str
    offset: int

    def __hash__(self) -> int:
        return id(self)


def metric_values(text: str) -> dict[tuple[str, str], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("fq_topic_"):
                out[(sample.name, sample.labels.get("topic", ""))] = sample.value
    return out


async def test_stats_and_metrics_show_topics_and_subscribers(topic_settings: Settings) -> None:
    async with running(topic_settings) as broker:
        await publish(broker.port, "a", 5)
        await publish(broker.port, "b", 3)
        await durable(broker, "a", 5)
        await durable(broker, "b", 3)
        assert broker.topics is not None
        topic_a = broker.topics.get(b"a")
        assert topic_a is not None
        behind, caught_up = Reader("10.0.0.1:5000", 2), Reader("10.0.0.2:6000", 5)
        topic_a.subscribers.update((behind, caught_up))  # type: ignore[arg-type]
        try:
            doc = json.loads((await asyncio.to_thread(get, broker.port, "/stats.json"))[2])
            assert set(doc) >= {"version", "exchanges", "queues", "topics"}
            a = doc["topics"]["a"]
            assert {k: a[k] for k in ("first_offset", "last_offset", "messages")} == {
                "first_offset": 0,
                "last_offset": 5,
                "messages": 5,
            }
            assert a["size_bytes"] > 0 and a["publish_rate"] >= 0
            assert a["subscribers"] == [
                {"remote": "10.0.0.1:5000", "offset": 2, "behind": 3},
                {"remote": "10.0.0.2:6000", "offset": 5, "behind": 0},
            ]
            assert (
                doc["topics"]["b"]["last_offset"] == 3 and doc["topics"]["b"]["subscribers"] == []
            )

            text = (await asyncio.to_thread(get, broker.port, "/metrics"))[2].decode()
            values = metric_values(text)
            assert values[("fq_topic_last_offset", "a")] == 5
            assert values[("fq_topic_first_offset", "a")] == 0
            assert values[("fq_topic_messages_total", "a")] == 5
            assert values[("fq_topic_messages_total", "b")] == 3
            assert values[("fq_topic_subscribers", "a")] == 2
            assert values[("fq_topic_subscribers", "b")] == 0
            assert values[("fq_topic_subscriber_lag_messages", "a")] == 3
            assert values[("fq_topic_bytes", "a")] == a["size_bytes"]
        finally:
            topic_a.subscribers.difference_update((behind, caught_up))  # type: ignore[arg-type]


async def test_publish_rate_is_over_the_stats_interval(topic_settings: Settings) -> None:
    async with running(topic_settings) as broker:
        await publish(broker.port, "r", 1)
        await durable(broker, "r", 1)

        def rate() -> float:
            doc = json.loads(get(broker.port, "/stats.json")[2])
            return float(doc["topics"]["r"]["publish_rate"])

        assert await asyncio.to_thread(rate) == 0  # first sample: nothing to compare with
        await publish(broker.port, "r", 50, start=1)
        await asyncio.sleep(1.1)  # past the stats window: the next sample measures it
        measured = await asyncio.to_thread(rate)
        assert measured > 0
        await asyncio.sleep(1.1)
        assert await asyncio.to_thread(rate) == 0  # nothing published in the last window


async def test_a_real_figg_subscriber_shows_in_stats_info_and_metrics(
    topic_settings: Settings,
) -> None:
    async with running(topic_settings) as broker:
        await publish(broker.port, "live", 5)
        await durable(broker, "live", 5)
        async with conn(broker) as sub:
            await sub.send(Attach(b"live", 2))
            assert await sub.next() == Attached(b"live", 2)
            got = await sub.frames(3)
            assert [(f.offset, f.data) for f in got if isinstance(f, Data)] == [
                (3, b"m2."),
                (4, b"m3."),
                (5, b"m4."),
            ]
            local = sub.writer.get_extra_info("sockname")
            remote = f"{local[0]}:{local[1]}"

            def stats() -> dict[str, Any]:
                doc: dict[str, Any] = json.loads(get(broker.port, "/stats.json")[2])
                return doc["topics"]["live"]

            # The session moves its reader's offset once the DATA frames are written.
            deadline = asyncio.get_running_loop().time() + TIMEOUT
            while (subs := (await asyncio.to_thread(stats))["subscribers"]) != [
                {"remote": remote, "offset": 5, "behind": 0}
            ]:
                assert asyncio.get_running_loop().time() < deadline, subs
                await asyncio.sleep(0.05)
            info = await asyncio.to_thread(ReplayClient(port=broker.port).topic_info, "live")
            assert info.subscribers == 1
            text = (await asyncio.to_thread(get, broker.port, "/metrics"))[2].decode()
            values = metric_values(text)
            assert values[("fq_topic_subscribers", "live")] == 1
            assert values[("fq_topic_subscriber_lag_messages", "live")] == 0

            # Live: what fq publishes next reaches it, and the HTTP reader reads it too.
            await publish(broker.port, "live", 1, start=5)
            (frame,) = await sub.frames(1)
            assert isinstance(frame, Data) and (frame.offset, frame.data) == (6, b"m5.")
            entries = await asyncio.to_thread(
                ReplayClient(port=broker.port).read_topic, "live", 5, 6
            )
            assert [(e.seq, e.message.payload) for e in entries] == [(5, b"m5.")]
        await wait_for(lambda: not any(t.subscribers for t in broker.topics or ()))
        assert (await asyncio.to_thread(stats))["subscribers"] == []


async def test_a_closing_topic_is_503_not_a_traceback(topic_settings: Settings) -> None:
    async with running(topic_settings) as broker:
        await publish(broker.port, "closing", 2)
        assert broker.topics is not None
        topic = broker.topics.get(b"closing")
        assert topic is not None
        topic.close()  # as the broker's stop does, while a request is on its way
        for target in ("/topic/info?topic=closing", "/topic/read?topic=closing&from=0"):
            status, _, body = await asyncio.to_thread(get, broker.port, target)
            assert status == 503 and "is closing" in json.loads(body)["error"]
        assert broker.limits.bad_input["internal"] == 0
