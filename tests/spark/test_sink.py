"""The fq sink: batch and streaming writes reach a real fq consumer, confirmed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.spark.conftest import Consumer, FqBroker, run_query

pytestmark = pytest.mark.spark


def rows(spark: Any, n: int, exchange: str) -> Any:
    """n rows over 2 partitions (2 tasks, 2 connections): exchange, route, string payload."""
    return spark.range(0, n, 1, 2).selectExpr(
        f"'{exchange}' AS exchange",
        "concat('r.', CAST(id % 7 AS STRING)) AS route",
        "concat('payload-', CAST(id AS STRING)) AS payload",
        "id AS ignored",
    )


def expected(n: int, exchange: str) -> set[tuple[bytes, bytes, bytes]]:
    return {(exchange.encode(), b"r.%d" % (i % 7), b"payload-%d" % i) for i in range(n)}


def received(consumer: Consumer, n: int) -> set[tuple[bytes, bytes, bytes]]:
    got = consumer.wait(n)
    assert len(got) == n
    return {(m.exchange, m.route, m.payload) for m in got}


def test_batch_write_of_1000_rows_arrives(spark: Any, fq: FqBroker) -> None:
    with Consumer(fq.port, "sink-batch") as consumer:
        rows(spark, 1000, "sink-batch").write.format("fq").options(**fq.options()).mode(
            "append"
        ).save()
        assert received(consumer, 1000) == expected(1000, "sink-batch")
        assert {m.sender for m in consumer.messages} == {b"spark"}


def test_streaming_write_available_now_arrives(spark: Any, fq: FqBroker, tmp_path: Path) -> None:
    rows(spark, 1000, "sink-stream").write.parquet(str(tmp_path / "in"))
    stream = spark.readStream.schema(
        "exchange STRING, route STRING, payload STRING, ignored BIGINT"
    ).parquet(str(tmp_path / "in"))
    with Consumer(fq.port, "sink-stream") as consumer:
        query = run_query(
            stream.writeStream.format("fq")
            .options(**fq.options())
            .option("checkpointLocation", str(tmp_path / "ckpt"))
        )
        assert query.exception() is None
        assert received(consumer, 1000) == expected(1000, "sink-stream")


def test_options_override_columns_and_msgid_and_binary_payload_pass(
    spark: Any, fq: FqBroker
) -> None:
    df = spark.range(0, 5, 1, 1).selectExpr(
        "'elsewhere' AS exchange",
        "'column.route' AS route",
        "CAST(concat('bin-', CAST(id AS STRING)) AS BINARY) AS payload",
        "unhex(concat(repeat('ab', 15), lpad(hex(id), 2, '0'))) AS msgid",
    )
    with Consumer(fq.port, "sink-options") as consumer:
        df.write.format("fq").options(
            **fq.options(exchange="sink-options", route="fixed.route")
        ).mode("append").save()
        got = sorted(consumer.wait(5), key=lambda m: m.payload)
    assert [(m.exchange, m.route) for m in got] == [(b"sink-options", b"fixed.route")] * 5
    assert [m.payload for m in got] == [b"bin-%d" % i for i in range(5)]
    assert [m.msgid for m in got] == [b"\xab" * 15 + bytes([i]) for i in range(5)]


@pytest.mark.parametrize(
    ("columns", "options", "mode", "error"),
    [
        ("'x' AS exchange, 'r' AS route", {}, "append", "'payload' column"),
        ("'r' AS route, 'p' AS payload", {}, "append", "option 'exchange' or give a string"),
        ("'x' AS exchange, 'p' AS payload", {"route": "r"}, "overwrite", 'mode("append")'),
        ("'x' AS exchange, 'r' AS route, 'p' AS payload", {"port": "x"}, "append", "'port'"),
    ],
)
def test_sink_refuses_bad_input_before_publishing(
    spark: Any, fq: FqBroker, columns: str, options: dict[str, str], mode: str, error: str
) -> None:
    df = spark.range(1).selectExpr(*columns.split(", "))
    with pytest.raises(Exception, match=r"(?s)fq sink|fq option") as exc:
        df.write.format("fq").options(**{**fq.options(), **options}).mode(mode).save()
    assert error in str(exc.value)


def test_sink_fails_the_job_when_the_broker_is_gone(spark: Any) -> None:
    df = spark.range(1).selectExpr("'x' AS exchange", "'r' AS route", "'p' AS payload")
    with pytest.raises(Exception, match=r"fq sink: publishing to 127\.0\.0\.1:1 failed"):
        df.write.format("fq").option("port", "1").mode("append").save()
