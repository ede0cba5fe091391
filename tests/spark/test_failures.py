"""What the fq sink and source do when things go wrong: a broker that refuses the confirm
or dies in the middle of a write (the job must fail, never report success), null columns,
and a broker restarted under a running stream (it goes on, losing nothing confirmed)."""

from __future__ import annotations

import resource
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fqbroker.clients.http.replay import ReplayClient
from tests.spark.conftest import Consumer, FqBroker, publish, stop_fqd
from tests.spark.relay import CuttingRelay
from tests.spark.test_source import Capture, messages

pytestmark = pytest.mark.spark

FILE_LIMIT = 1 << 20  # bytes any one file of a starved broker may grow to


def small_disk() -> None:
    # As tests/e2e/reliability/test_disk_full.py: writes past the limit fail in the kernel (EFBIG,
    # as ENOSPC would), with SIGXFSZ ignored as a server would.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))


def big_rows(spark: Any, n: int, exchange: str, size: int = 1000) -> Any:
    return spark.range(0, n, 1, 2).selectExpr(
        f"'{exchange}' AS exchange",
        "'r' AS route",
        f"concat(CAST(id AS STRING), repeat('x', {size})) AS payload",
    )


def test_sink_fails_the_job_when_the_broker_refuses_the_confirm(
    spark: Any, own_fq: Callable[..., FqBroker]
) -> None:
    # 64 MiB segments on a disk that takes 1 MiB: the disk queue's writes fail, and with
    # them the confirm the task waits for.
    broker = own_fq(conf_text="[fqd]\n", preexec_fn=small_disk)
    ReplayClient(port=broker.port).ensure_queue("full", exchange="full")
    df = big_rows(spark, 2000, "full")
    with pytest.raises(Exception, match=r"fq sink: publishing to 127\.0\.0\.1:\d+ failed") as exc:
        df.write.format("fq").options(**broker.options()).mode("append").save()
    assert "disk queue write failed" in str(exc.value)


def test_sink_fails_the_job_when_the_broker_dies_mid_write(
    spark: Any, own_fq: Callable[..., FqBroker]
) -> None:
    broker = own_fq()
    relay = CuttingRelay(broker.port, 256 << 10, lambda: stop_fqd(broker.proc, kill=True))
    try:
        df = big_rows(spark, 4000, "dies", size=200)  # about 1 MB toward the broker
        with pytest.raises(Exception, match=rf"fq sink: publishing to 127\.0\.0\.1:{relay.port}"):
            df.write.format("fq").option("port", relay.port).mode("append").save()
        assert relay.tripped.is_set() and broker.proc.returncode == -signal.SIGKILL
    finally:
        relay.close()


@pytest.mark.parametrize("column", ["exchange", "route", "payload"])
def test_a_null_in_a_required_column_fails_the_job_and_publishes_nothing_of_its_batch(
    spark: Any, fq: FqBroker, column: str
) -> None:
    exchange = f"nulls-{column}"
    values = {"exchange": f"'{exchange}'", "route": "'r'", "payload": "'p'"}
    values[column] = f"IF(id = 1, NULL, {values[column]})"
    df = spark.range(0, 3, 1, 1).selectExpr(*(f"{v} AS {k}" for k, v in values.items()))
    with Consumer(fq.port, exchange) as consumer:
        with pytest.raises(Exception, match=f"fq sink: '{column}' is null in row 1 of a batch"):
            df.write.format("fq").options(**fq.options()).mode("append").save()
        # One task, one batch: checked before any of it went out. A marker published now
        # is the first thing the consumer gets.
        publish(fq.port, [(exchange, "r", b"marker")])
        assert [m.payload for m in consumer.wait(1)] == [b"marker"]


def test_a_null_msgid_gets_a_fresh_id(spark: Any, fq: FqBroker) -> None:
    df = spark.range(0, 3, 1, 1).selectExpr(
        "'nulls-msgid' AS exchange",
        "'r' AS route",
        "CAST(id AS STRING) AS payload",
        "IF(id = 1, NULL, unhex(concat(repeat('cd', 15), lpad(hex(id), 2, '0')))) AS msgid",
    )
    with Consumer(fq.port, "nulls-msgid") as consumer:
        df.write.format("fq").options(**fq.options()).mode("append").save()
        got = {m.payload: m.msgid for m in consumer.wait(3)}
    assert got[b"0"] == b"\xcd" * 15 + b"\x00" and got[b"2"] == b"\xcd" * 15 + b"\x02"
    assert len(got[b"1"]) == 16 and got[b"1"] not in (bytes(16), got[b"0"], got[b"2"])


def wait_rows(capture: Capture, query: Any, n: int, timeout: float = 120.0) -> list[Any]:
    """Rows the running query has handed to foreachBatch, once there are ``n`` (or it died)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = [r for batches in capture.runs for _, rs in batches for r in rs]
        if len(rows) >= n or query.exception() is not None or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)


def test_source_goes_on_across_a_broker_restart_and_loses_nothing_confirmed(
    spark: Any, own_fq: Callable[..., FqBroker], tmp_path: Path
) -> None:
    broker = own_fq()
    queue, capture = "restarts", Capture()
    broker.client.ensure_queue(queue, exchange=queue)
    publish(broker.port, messages(queue, 0, 100))
    query = (
        spark.readStream.format("fq")
        .options(**broker.options(queue=queue, exchange=queue, startingOffsets="earliest"))
        .load()
        .writeStream.foreachBatch(capture.new_run())
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        assert len(wait_rows(capture, query, 100)) == 100, query.exception()
        stop_fqd(broker.proc, kill=True)  # kill -9: only what was confirmed must survive
        again = own_fq(port=broker.port)
        publish(again.port, messages(queue, 100, 100))
        rows = wait_rows(capture, query, 200)
        assert query.exception() is None and query.isActive
    finally:
        query.stop()
    assert [r[7] for r in rows] == list(range(1, 201))  # offsets: none lost, none twice
    assert [r[2] for r in rows] == [m[2] for m in messages(queue, 0, 200)]
