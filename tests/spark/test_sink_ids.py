"""The sink's row ids: derived from the write, the batch, the partition and the row, the
same in a retry; a streaming batch run again from its checkpoint is not stored twice."""

from __future__ import annotations

import hashlib
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from fqbroker.spark.options import SinkOptions
from fqbroker.spark.sink import RowIds
from tests.spark.conftest import Consumer, FqBroker, run_query

pytestmark = pytest.mark.spark

COLUMNS = {"exchange": "string", "route": "string", "payload": "string"}


def test_row_ids_are_the_same_for_the_same_write_and_partition() -> None:
    first, again = RowIds("job-1", 3), RowIds("job-1", 3)
    ids = first.take(2) + first.take(3)
    assert ids == again.take(5)
    assert len(set(ids)) == 5
    assert ids[4] == hashlib.blake2b(b"job-1/3", digest_size=8).digest() + (4).to_bytes(8, "big")
    assert set(ids).isdisjoint(RowIds("job-1", 4).take(5) + RowIds("job-2", 3).take(5))


def test_sink_options_dedup_and_write_id() -> None:
    sink = SinkOptions.parse({"exchange": "e", "route": "r"}, COLUMNS)
    assert (sink.dedup, sink.write_id) == (True, "")
    sink = SinkOptions.parse({"route": "r", "dedup": "false", "writeId": "nightly"}, COLUMNS)
    assert (sink.dedup, sink.write_id) == (False, "nightly")
    with pytest.raises(ValueError, match="'dedup' must be true or false"):
        SinkOptions.parse({"dedup": "maybe"}, COLUMNS)


def duplicates(port: int, queue: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats.json", timeout=10) as reply:
        doc: dict[str, Any] = json.load(reply)
    return int(doc["queues"][queue].get("duplicates", 0))


def test_a_streaming_batch_run_again_is_not_stored_twice(
    spark: Any, fq: FqBroker, tmp_path: Path
) -> None:
    spark.range(0, 1000, 1, 2).selectExpr(
        "'sink-replay' AS exchange", "'r' AS route", "concat('row-', CAST(id AS STRING)) AS payload"
    ).write.parquet(str(tmp_path / "in"))
    stream = spark.readStream.schema("exchange STRING, route STRING, payload STRING").parquet(
        str(tmp_path / "in")
    )
    checkpoint = tmp_path / "ckpt"
    with Consumer(fq.port, "sink-replay") as consumer:
        writer = stream.writeStream.format("fq").options(**fq.options())
        query = run_query(writer.option("checkpointLocation", str(checkpoint)))
        assert query.exception() is None
        consumer.wait(1000)
        # As if the driver died after publishing batch 0 and before committing it: a
        # restart from the checkpoint runs batch 0 again, with the same ids.
        (checkpoint / "commits" / "0").unlink()
        (checkpoint / "commits" / ".0.crc").unlink(missing_ok=True)
        again = run_query(writer.option("checkpointLocation", str(checkpoint)))
        assert again.exception() is None and again.id == query.id
        assert duplicates(fq.port, "test-sink-replay") == 1000
        got = consumer.wait(1000)
    assert sorted(m.payload for m in got) == sorted(b"row-%d" % i for i in range(1000))
    prefixes = {m.msgid[:8] for m in got}
    assert prefixes <= {
        hashlib.blake2b(f"{query.id}/0/{p}".encode(), digest_size=8).digest() for p in range(8)
    }
