"""The rows the ``fq`` source produces: one per message, as Arrow record batches.

The columns mirror the Kafka source's in fq's words: ``exchange``/``route`` for the topic,
``payload`` for the value, ``offset`` for the position in the queue, and ``timestamp``
for when the broker received the message; ``topic`` names the retained topic a row was
read from (null for a queue), last so that the columns before it keep their places. Names
are bytes on the wire and become text here, with invalid UTF-8 as U+FFFD; ``payload`` and
``msgid`` stay bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from fqbroker.core.message import hop_addresses
from fqbroker.protocols.replay import Entry

__all__ = ["SCHEMA", "record_batch"]

SCHEMA = StructType(
    [
        StructField("exchange", StringType()),
        StructField("route", StringType()),
        StructField("payload", BinaryType()),
        StructField("msgid", BinaryType()),
        StructField("sender", StringType()),
        StructField("hops", ArrayType(StringType())),
        StructField("queue", StringType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("topic", StringType()),
    ]
)
# Spark compares a batch's schema with exactly this one (timestamps in UTC), so build it
# with Spark's own conversion rather than by hand.
ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")


def record_batch(queue: str, entries: Sequence[Entry], *, topic: bool = False) -> pa.RecordBatch:
    """``queue``: the queue's or (with ``topic``) the topic's name."""
    msgs = [e.message for e in entries]
    columns = [
        [m.exchange.decode(errors="replace") for m in msgs],
        [m.route.decode(errors="replace") for m in msgs],
        [m.payload for m in msgs],
        [m.msgid for m in msgs],
        [m.sender.decode(errors="replace") for m in msgs],
        [hop_addresses(m.hops) for m in msgs],
        [queue] * len(msgs),
        [e.seq for e in entries],
        [e.arrival_us for e in entries],  # microseconds, as the timestamp type counts
        [queue if topic else None] * len(msgs),
    ]
    arrays = [
        pa.array(values, type=field.type)
        for values, field in zip(columns, ARROW_SCHEMA, strict=True)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)
