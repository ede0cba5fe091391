"""The fq source: streaming with restarts and replays, data loss, and batch reads."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.spark.conftest import FqBroker, publish, run_query

pytestmark = pytest.mark.spark

Rows = list[tuple[Any, ...]]


@dataclass
class Capture:
    """A foreachBatch sink that keeps every micro-batch's rows, per run, in order."""

    runs: list[list[tuple[int, Rows]]] = field(default_factory=list)

    def new_run(self) -> Any:
        batches: list[tuple[int, Rows]] = []
        self.runs.append(batches)

        def keep(df: Any, batch_id: int) -> None:
            # One action only: each would read the batch again and count it in the progress.
            rows = sorted((tuple(r) for r in df.collect()), key=lambda r: r[7])
            batches.append((batch_id, rows))

        return keep


def messages(exchange: str, first: int, n: int, size: int = 0) -> list[tuple[str, str, bytes]]:
    return [
        (exchange, f"r.{i % 3}", b"msg-%04d." % i + b"x" * size) for i in range(first, first + n)
    ]


def stream(spark: Any, fq: FqBroker, queue: str, **options: object) -> Any:
    return (
        spark.readStream.format("fq")
        .options(**fq.options(queue=queue, exchange=queue, startingOffsets="earliest", **options))
        .load()
    )


def run(
    spark: Any, fq: FqBroker, queue: str, ckpt: Path, capture: Capture, **options: object
) -> Any:
    writer = (
        stream(spark, fq, queue, **options)
        .writeStream.foreachBatch(capture.new_run())
        .option("checkpointLocation", str(ckpt))
    )
    return run_query(writer)


@dataclass
class StreamRun:
    queue: str
    ckpt: Path
    capture: Capture
    queries: list[Any]
    started: float
    broker_checkpoint: int


@pytest.fixture(scope="module")
def restarted(
    spark: Any, fq: FqBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StreamRun]:
    """450 messages, a run, 150 more, a run from the same checkpoint; max 100 per batch."""
    queue, ckpt, capture = "src", tmp_path_factory.mktemp("src") / "ckpt", Capture()
    fq.client.ensure_queue(queue, exchange=queue)  # what the first run would do, but earlier
    started = time.time()
    publish(fq.port, messages(queue, 0, 450))
    first = run(spark, fq, queue, ckpt, capture, maxOffsetsPerTrigger=100)
    publish(fq.port, messages(queue, 450, 150))
    second = run(spark, fq, queue, ckpt, capture, maxOffsetsPerTrigger=100)
    point = fq.client.info(queue).checkpoints[f"spark-{queue}"]
    yield StreamRun(queue, ckpt, capture, [first, second], started, point)


def test_restart_reads_exactly_600_contiguous_rows(restarted: StreamRun) -> None:
    assert all(q.exception() is None for q in restarted.queries)
    rows = [row for batches in restarted.capture.runs for _, rs in batches for row in rs]
    assert [r[7] for r in rows] == list(range(1, 601))  # offsets, no gaps, no duplicates
    assert [r[2] for r in rows] == [m[2] for m in messages("src", 0, 600)]
    first = rows[0]
    assert first[:2] == ("src", "r.0")
    assert int.from_bytes(first[3][8:], "big") == 1  # msgid carries the offset
    assert first[4] == "tester" and first[5][0] == "10.254.254.1" and first[6] == "src"
    # PySpark hands timestamps back as naive local times.
    arrived = first[8].timestamp()
    assert restarted.started <= arrived <= time.time()


def test_batches_respect_max_offsets_per_trigger(restarted: StreamRun) -> None:
    counts = [[len(rs) for _, rs in batches] for batches in restarted.capture.runs]
    assert counts == [[100, 100, 100, 100, 50], [100, 50]]
    progress = [p["numInputRows"] for q in restarted.queries for p in q.recentProgress]
    assert max(progress) == 100
    ids = [[bid for bid, _ in batches] for batches in restarted.capture.runs]
    assert ids == [[0, 1, 2, 3, 4], [5, 6]]


def test_commit_moves_the_broker_checkpoint_a_batch_behind(restarted: StreamRun) -> None:
    # Spark commits batch N to the source when it plans N+1: the end of batch 5 here.
    assert restarted.broker_checkpoint == 551


def test_replay_of_the_last_batch_is_byte_identical(
    spark: Any, fq: FqBroker, restarted: StreamRun
) -> None:
    last_id, last_rows = restarted.capture.runs[-1][-1]
    commits = restarted.ckpt / "commits"
    (commits / str(last_id)).unlink()
    (commits / f".{last_id}.crc").unlink()  # or Spark sees two writers of the log
    query = run(spark, fq, restarted.queue, restarted.ckpt, restarted.capture)
    assert query.exception() is None
    assert restarted.capture.runs[-1] == [(last_id, last_rows)]


def test_data_loss_fails_the_query_or_is_skipped(spark: Any, fq: FqBroker, tmp_path: Path) -> None:
    queue, ckpt, capture = "lossy", tmp_path / "ckpt", Capture()
    fq.client.ensure_queue(queue, exchange=queue)
    publish(fq.port, messages(queue, 0, 60, size=500))  # about 30 records a segment
    assert run(spark, fq, queue, ckpt, capture, maxOffsetsPerTrigger=30).exception() is None
    publish(fq.port, messages(queue, 60, 60, size=500))
    # Someone else's retention: another reader's checkpoint passes the query's position.
    fq.client.set_checkpoint(queue, f"spark-{queue}", 100)
    first = fq.client.info(queue).first
    assert 61 < first <= 100

    failed = run(spark, fq, queue, ckpt, capture, maxOffsetsPerTrigger=30)
    error = str(failed.exception())
    assert f"offsets 61 to {first - 1} of queue 'lossy' are no longer stored" in error
    assert "failOnDataLoss=false" in error

    skipped = run(spark, fq, queue, ckpt, capture, maxOffsetsPerTrigger=30, failOnDataLoss=False)
    assert skipped.exception() is None
    offsets = [r[7] for _, rs in capture.runs[-1] for r in rs]
    assert offsets == list(range(first, 121))

    batch = spark.read.format("fq").options(**fq.options(queue=queue))
    with pytest.raises(Exception, match="no longer stored"):
        batch.option("startingOffsets", json.dumps({queue: 1})).load().collect()


def test_batch_read_between_offsets(spark: Any, fq: FqBroker) -> None:
    from fqbroker.spark import FqDataSource

    spark.dataSource.register(FqDataSource)  # as without the pyspark_fqbroker shim
    fq.client.ensure_queue("batchq", exchange="batchq")
    publish(fq.port, messages("batchq", 0, 20))
    df = (
        spark.read.format("fq")
        .options(**fq.options(queue="batchq", numPartitions=3))
        .option("startingOffsets", '{"batchq": 5}')
        .option("endingOffsets", '{"batchq": 15}')
        .load()
    )
    rows = sorted(df.collect(), key=lambda r: r.offset)
    assert [r.offset for r in rows] == list(range(5, 15))
    assert [r.payload for r in rows] == [m[2] for m in messages("batchq", 4, 10)]
    assert all(r.queue == "batchq" and r.topic is None for r in rows)
    assert df.schema.simpleString() == (
        "struct<exchange:string,route:string,payload:binary,msgid:binary,sender:string,"
        "hops:array<string>,queue:string,offset:bigint,timestamp:timestamp,topic:string>"
    )
    everything = spark.read.format("fq").options(**fq.options(queue="batchq")).load()
    assert everything.count() == 20


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({}, "option 'queue' (a disk queue name) or 'topic'"),
        ({"queue": "q", "startingOffsets": "soon"}, "'startingOffsets' must be"),
        ({"queue": "q", "startingOffsets": '{"other": 3}'}, "'startingOffsets' must be"),
        ({"queue": "q", "maxOffsetsPerTrigger": "0"}, "'maxOffsetsPerTrigger' must be at least 1"),
        ({"queue": "q", "failOnDataLoss": "maybe"}, "'failOnDataLoss' must be true or false"),
        ({"queue": "nosuchqueue"}, "Cannot find registered queue 'nosuchqueue'"),
    ],
)
def test_source_option_errors(
    spark: Any, fq: FqBroker, options: dict[str, str], error: str
) -> None:
    with pytest.raises(Exception, match="fq") as exc:
        spark.read.format("fq").options(**fq.options(**options)).load().collect()
    assert error in str(exc.value)
