"""The fq source on a retained topic: independent streaming queries, restarts, batch reads
by index range, and data loss after retention, against real brokers and real Spark."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.spark.conftest import QUERY_TIMEOUT, FqBroker, publish, run_query, start_fqd, stop_fqd

pytestmark = pytest.mark.spark

FIGG = '[fqd]\nsegment_bytes = 16384\n[figg]\nlisten = "127.0.0.1:0"\n'
# Segments of about 8 messages of 500 bytes (the smallest segments allowed), 2 of them kept.
TINY_RETENTION = '[figg]\nlisten = "127.0.0.1:0"\nsegment_bytes = 4096\nretention_bytes = 8192\n'

Row = tuple[Any, ...]


@pytest.fixture(scope="module")
def figg_fq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FqBroker]:
    broker = start_fqd(tmp_path_factory.mktemp("fqd-topics"), conf_text=FIGG)
    try:
        yield broker
    finally:
        stop_fqd(broker.proc)


def messages(topic: str, first: int, n: int, size: int = 0) -> list[tuple[str, str, bytes]]:
    """fq publishes to the Figg exchange with route = topic land in the topic."""
    return [("figg", topic, b"msg-%04d." % i + b"x" * size) for i in range(first, first + n)]


@dataclass
class Sink:
    """A foreachBatch sink made idempotent by batch id, as an exactly-once sink must be: a
    batch Spark runs again after a stop replaces its own rows and must bring the same."""

    batches: dict[int, list[Row]] = field(default_factory=dict)
    replays: list[tuple[int, bool]] = field(default_factory=list)  # (id, same rows)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = sorted((tuple(r) for r in df.collect()), key=lambda r: (r[6], r[7]))
        with self.lock:
            if batch_id in self.batches:
                self.replays.append((batch_id, self.batches[batch_id] == rows))
            self.batches[batch_id] = rows

    def rows(self) -> list[Row]:
        with self.lock:
            return [r for _, rows in sorted(self.batches.items()) for r in rows]

    def sizes(self) -> list[int]:
        with self.lock:
            return [len(rows) for _, rows in sorted(self.batches.items())]


def topic_stream(spark: Any, fq: FqBroker, topic: str, **options: object) -> Any:
    opts = fq.options(topic=topic, startingOffsets="earliest", **options)
    return spark.readStream.format("fq").options(**opts).load()


def start_query(
    spark: Any, fq: FqBroker, topic: str, sink: Sink, ckpt: Path, per_trigger: int = 40
) -> Any:
    return (
        topic_stream(spark, fq, topic, maxOffsetsPerTrigger=per_trigger)
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(ckpt))
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def wait_until(what: str, check: Callable[[], bool], queries: list[Any]) -> None:
    deadline = time.monotonic() + QUERY_TIMEOUT
    while not check():
        for query in queries:
            assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_two_queries_one_restarted_each_write_every_message_once(
    spark: Any, figg_fq: FqBroker, tmp_path: Path
) -> None:
    topic, total = "shared", 400
    publish(figg_fq.port, messages(topic, 0, 50))  # the topic exists before the queries
    steady, restarted = Sink(), Sink()
    a = start_query(spark, figg_fq, topic, steady, tmp_path / "a")
    b = start_query(spark, figg_fq, topic, restarted, tmp_path / "b")
    queries = [a, b]
    published = [50]
    done = threading.Event()
    errors: list[BaseException] = []

    def keep_publishing() -> None:
        try:
            while published[0] < total:
                publish(figg_fq.port, messages(topic, published[0], 10))
                published[0] += 10
                time.sleep(0.05)
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    publisher = threading.Thread(target=keep_publishing, daemon=True)
    publisher.start()
    try:
        # Stop one query while messages keep arriving, once it has read some of them.
        wait_until("a first batch of query b", lambda: len(restarted.rows()) >= 40, queries)
        b.stop()
        stopped_at = len(restarted.rows())
        wait_until("more messages", lambda: published[0] >= min(total, stopped_at + 60), [a])
        b = start_query(spark, figg_fq, topic, restarted, tmp_path / "b")
        queries = [a, b]
        assert done.wait(QUERY_TIMEOUT) and not errors, errors
        for sink in (steady, restarted):
            wait_until("every message", lambda s=sink: len(s.rows()) >= total, queries)
    finally:
        done.wait(QUERY_TIMEOUT)
        for query in queries:
            if query.isActive:
                query.stop()

    want = [m[2] for m in messages(topic, 0, total)]
    for sink in (steady, restarted):
        rows = sink.rows()
        assert [r[7] for r in rows] == list(range(total))  # indexes: none missed, none twice
        assert [r[2] for r in rows] == want
        assert all(r[0] == "figg" and r[1] == topic and r[6] == topic for r in rows)
        assert all(same for _, same in sink.replays)  # a replayed batch brought the same rows
    assert stopped_at < total  # the restart happened mid-stream
    # Readers of a topic hold nothing on the broker: no queue, no checkpoint, no consumer.
    info = figg_fq.client.topic_info(topic)
    assert (info.first, info.next) == (0, total)
    stats = json.loads(_get(figg_fq.port, "/stats.json"))
    assert stats["topics"][topic]["last_offset"] == total
    assert not any(name.startswith("spark") for name in stats["queues"])


def test_two_topics_in_one_query_each_row_once_across_a_restart(
    spark: Any, figg_fq: FqBroker, tmp_path: Path
) -> None:
    news, small, late = "multi-news", "multi-small", "multi-late"
    publish(figg_fq.port, messages(news, 0, 45) + messages(small, 0, 6) + messages(late, 0, 4))
    sink, ckpt = Sink(), tmp_path / "ckpt"

    def start(names: str) -> Any:
        return start_query(spark, figg_fq, names, sink, ckpt, per_trigger=10)

    def got(topic: str) -> list[int]:
        return [r[7] for r in sink.rows() if r[9] == topic]

    query = start(f"{news},{small}")
    try:
        wait_until("both topics", lambda: len(got(news)) + len(got(small)) == 51, [query])
    finally:
        query.stop()
    first_run = len(sink.rows())
    # The limit is shared: no batch over 10 rows, and the small topic is not kept waiting
    # until the big one is read.
    assert max(sink.sizes()) == 10
    assert {r[9] for r in sink.rows()[:10]} == {news, small}

    # A new query on the same checkpoint, with a third topic in the list, while more
    # messages arrive: only those, and the whole of the new topic, are read, each once.
    query = start(f"{news},{small},{late}")
    try:
        publish(figg_fq.port, messages(news, 45, 15) + messages(small, 6, 5))
        want = 60 + 11 + 4
        wait_until("the new rows", lambda: len(sink.rows()) >= want, [query])
        time.sleep(1)  # a few more triggers: nothing more may arrive
    finally:
        query.stop()
    assert first_run == 51
    assert got(news) == list(range(60)) and got(small) == list(range(11))
    assert got(late) == list(range(4))
    rows = sink.rows()
    assert len(rows) == want
    assert all(r[6] == r[9] == r[1] and r[0] == "figg" for r in rows)
    assert [r[2] for r in rows if r[9] == news] == [m[2] for m in messages(news, 0, 60)]
    assert all(same for _, same in sink.replays)
    offsets = json.loads(
        (ckpt / "offsets" / max(os.listdir(ckpt / "offsets"))).read_text().splitlines()[-1]
    )
    assert offsets == {news: 60, small: 11, late: 4}


def test_batch_read_of_two_topics(spark: Any, figg_fq: FqBroker) -> None:
    publish(figg_fq.port, messages("batch-a", 0, 8) + messages("batch-b", 0, 5))
    df = (
        spark.read.format("fq")
        .options(**figg_fq.options(topic="batch-a, batch-b"))
        .option("startingOffsets", '{"batch-a": 2, "batch-b": -2}')
        .option("endingOffsets", '{"batch-a": 6, "batch-b": -1}')
        .load()
    )
    rows = sorted(df.collect(), key=lambda r: (r.topic, r.offset))
    assert [(r.topic, r.offset) for r in rows] == [("batch-a", i) for i in range(2, 6)] + [
        ("batch-b", i) for i in range(5)
    ]
    assert df.rdd.getNumPartitions() == 2  # one per topic at least


def _get(port: int, path: str) -> bytes:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        return conn.getresponse().read()
    finally:
        conn.close()


def test_batch_read_by_index_range(spark: Any, figg_fq: FqBroker) -> None:
    publish(figg_fq.port, messages("batcht", 0, 20))
    df = (
        spark.read.format("fq")
        .options(**figg_fq.options(topic="batcht", numPartitions=3))
        .option("startingOffsets", '{"batcht": 5}')
        .option("endingOffsets", '{"batcht": 15}')
        .load()
    )
    rows = sorted(df.collect(), key=lambda r: r.offset)
    assert [r.offset for r in rows] == list(range(5, 15))
    assert [r.payload for r in rows] == [m[2] for m in messages("batcht", 5, 10)]
    assert all(r.route == "batcht" and r.queue == "batcht" for r in rows)
    assert all(r.timestamp is not None for r in rows)
    everything = spark.read.format("fq").options(**figg_fq.options(topic="batcht")).load()
    assert everything.count() == 20
    # Reading twice consumes nothing.
    assert everything.count() == 20
    first = spark.read.format("fq").options(**figg_fq.options(topic="batcht"))
    assert first.option("endingOffsets", '{"batcht": 1}').load().collect()[0].offset == 0


def test_source_on_a_topic_that_does_not_exist_yet_waits_for_it(
    spark: Any, figg_fq: FqBroker, tmp_path: Path
) -> None:
    sink = Sink()  # waitForTopic: without it a missing topic is refused (test_options)
    query = run_query(
        topic_stream(spark, figg_fq, "notyet", waitForTopic=True)
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
    )
    assert query.exception() is None and sink.rows() == []
    publish(figg_fq.port, messages("notyet", 0, 3))
    query = run_query(
        topic_stream(spark, figg_fq, "notyet")
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
    )
    assert query.exception() is None
    assert [r[7] for r in sink.rows()] == [0, 1, 2]


def test_data_loss_after_retention_fails_or_is_skipped(
    spark: Any, own_fq: Callable[..., FqBroker], tmp_path: Path
) -> None:
    fq = own_fq(conf_text=TINY_RETENTION)
    topic, ckpt, sink = "lossyt", tmp_path / "ckpt", Sink()

    def run(**options: object) -> Any:
        return run_query(
            topic_stream(spark, fq, topic, **options)
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(ckpt))
        )

    publish(fq.port, messages(topic, 0, 5))
    assert run().exception() is None
    assert [r[7] for r in sink.rows()] == list(range(5))
    # Retention (over retention_bytes: whole old segments go) passes the query's position.
    publish(fq.port, messages(topic, 5, 60, size=500))
    deadline = time.monotonic() + 30
    while (first := fq.client.topic_info(topic).first) <= 5:
        assert time.monotonic() < deadline, "retention deleted nothing"
        time.sleep(0.1)

    failed = run()
    error = str(failed.exception())
    assert f"offsets 5 to {first - 1} of topic 'lossyt' are no longer stored" in error
    assert "failOnDataLoss=false" in error

    first = fq.client.topic_info(topic).first
    skipped = run(failOnDataLoss=False)
    assert skipped.exception() is None
    offsets = [r[7] for r in sink.rows()]
    assert offsets[:5] == list(range(5)) and offsets[5:] == list(range(first, 65))

    batch = spark.read.format("fq").options(**fq.options(topic=topic))
    with pytest.raises(Exception, match="no longer stored"):
        batch.option("startingOffsets", json.dumps({topic: 0})).load().collect()
    lenient = batch.option("startingOffsets", json.dumps({topic: 0}))
    got = lenient.option("failOnDataLoss", "false").load().collect()
    assert sorted(r.offset for r in got) == list(range(first, 65))


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"topic": "t", "queue": "q"}, "not both"),
        ({"topic": "t", "exchange": "x"}, "'exchange' is for queues"),
        ({"topic": "t", "startingOffsets": '{"t": -5}'}, "indexes start at 0"),
    ],
)
def test_topic_option_errors(
    spark: Any, figg_fq: FqBroker, options: dict[str, str], error: str
) -> None:
    with pytest.raises(Exception, match="fq") as exc:
        spark.read.format("fq").options(**figg_fq.options(**options)).load().collect()
    assert error in str(exc.value)
