"""The ``fq`` sink: DataFrame rows published to exchanges, batch and streaming.

Each Spark task opens its own fq connection, publishes its rows and waits for a publisher
confirm covering all of them. Every row carries an id derived from the write (the
streaming query's id and the batch, or the batch write's ``writeId``), its partition and
its index in the partition, and the connection asks the broker to de-duplicate by it: a
task Spark retries (a lost executor, a broker restarted mid-write) sends the same ids, and
each queue keeps one copy of each row (docs/confirms.md, "Exactly once"). With
``dedup = false`` the ids are not derived nor asked to be de-duplicated, and delivery is
at least once. Writers are built on the driver and pickled to executors, so they hold
options only; the connection lives inside ``write``. The Arrow writer classes take whole
record batches, many times faster than a writer given one row at a time (bench/RESULTS.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from fqbroker.clients.fq.client import Client
from fqbroker.errors import FqError
from fqbroker.protocols.fq.wire import MAX_RK_LEN

from .options import SinkOptions

__all__ = ["FqStreamWriter", "FqWriter", "Published", "RowIds"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Published(WriterCommitMessage):
    """What one task published, all of it confirmed by the broker."""

    rows: int


def _names(batch: pa.RecordBatch, column: str, fixed: str) -> list[bytes]:
    if fixed:
        return [fixed.encode()] * batch.num_rows
    values = batch.column(column).to_pylist()
    out = []
    for i, value in enumerate(values):
        if value is None:
            raise ValueError(f"fq sink: {column!r} is null in row {i} of a batch")
        name = value.encode()
        if len(name) > MAX_RK_LEN:
            raise ValueError(f"fq sink: {column!r} {value[:40]!r}... is over 127 bytes")
        out.append(name)
    return out


def _payloads(batch: pa.RecordBatch) -> list[bytes]:
    out = []
    for i, value in enumerate(batch.column("payload").to_pylist()):
        if value is None:
            raise ValueError(f"fq sink: 'payload' is null in row {i} of a batch")
        out.append(value.encode() if isinstance(value, str) else value)
    return out


def _msgids(batch: pa.RecordBatch) -> list[bytes | None]:
    if "msgid" not in batch.schema.names:
        return [None] * batch.num_rows
    values: list[bytes | None] = batch.column("msgid").to_pylist()
    for value in values:
        if value is not None and len(value) != 16:
            raise ValueError(f"fq sink: a 'msgid' is 16 bytes, not {len(value)}")
    return values


# Spark's local properties of a micro-batch's tasks: the query's id, kept in its
# checkpoint across restarts, and the batch's.
QUERY_ID = "sql.streaming.queryId"
BATCH_ID = "streaming.sql.batchId"


class RowIds:
    """The ids of one task's rows: 8 bytes naming the write, the batch and the partition,
    then the row's index in the partition. A retry of the task (same partition, same
    rows in the same order) makes the same ids."""

    def __init__(self, write: str, partition: int) -> None:
        name = f"{write}/{partition}".encode()
        self.prefix = hashlib.blake2b(name, digest_size=8).digest()
        self.next = 0

    def take(self, n: int) -> list[bytes]:
        first, self.next = self.next, self.next + n
        prefix = self.prefix
        return [prefix + i.to_bytes(8, "big") for i in range(first, first + n)]


def task_ids(write: str) -> RowIds:
    """The row ids of the running task, ``write`` naming the batch write or the query."""
    context = TaskContext.get()
    if context is None:  # not in a Spark task (a test calling write() itself)
        return RowIds(write, 0)
    batch = context.getLocalProperty(BATCH_ID)
    if batch is not None:
        write = f"{write}/{batch}"
    return RowIds(write, context.partitionId())


def stream_write_id(options: SinkOptions) -> str:
    """What names a streaming query's writes: ``writeId``, else the query's own id."""
    if options.write_id:
        return options.write_id
    context = TaskContext.get()
    query = context.getLocalProperty(QUERY_ID) if context is not None else None
    if query is None:
        raise RuntimeError("fq sink: a streaming write without a query id; set 'writeId'")
    return str(query)


async def publish(
    options: SinkOptions, batches: Iterator[pa.RecordBatch], write: str | None = None
) -> int:
    """Publish every row and return the count once the broker confirmed them all.

    ``write`` names the write the row ids are derived from; None when ids are not derived
    (``dedup = false``)."""
    broker = options.broker
    ids = task_ids(write) if write is not None else None
    # No reconnects: what was written to a lost connection is unconfirmed, and failing the
    # task makes Spark (or the caller) send all of it again.
    client = Client(
        broker.host,
        broker.port,
        broker.user,
        broker.password,
        reconnect=False,
        tls=broker.tls,
        cafile=broker.cafile or None,
        dedup=ids is not None,
    )
    rows = 0
    try:
        async with client:
            for batch in batches:
                exchanges = _names(batch, "exchange", options.exchange)
                routes = _names(batch, "route", options.route)
                msgids = _msgids(batch)
                if ids is not None:
                    # A row's own msgid wins; one without gets its derived id.
                    derived = ids.take(batch.num_rows)
                    msgids = [
                        m if m is not None else d for m, d in zip(msgids, derived, strict=True)
                    ]
                columns = zip(exchanges, routes, _payloads(batch), msgids, strict=True)
                for exchange, route, payload, msgid in columns:
                    client.publish(exchange, route, payload, msgid)
                rows += batch.num_rows
                await client.flush()  # one batch in memory at a time
            confirmed = await client.confirm()
    except (OSError, FqError) as exc:
        where = f"{broker.host}:{broker.port}"
        raise ConnectionError(f"fq sink: publishing to {where} failed: {exc!r}") from exc
    if confirmed != rows:
        raise RuntimeError(f"fq sink: the broker confirmed {confirmed} of {rows} messages")
    return rows


class FqWriter(DataSourceArrowWriter):
    """``df.write.format("fq")``: append only."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        # Made once on the driver and pickled into every task: a retried task derives
        # the same ids. A job run again is a new write unless it gives 'writeId'.
        self.write_id = options.write_id or str(uuid.uuid4())

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        write = self.write_id if self.options.dedup else None
        return Published(asyncio.run(publish(self.options, iterator, write)))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, Published))
        log.info("fq sink: %d messages published and confirmed", rows)


class FqStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("fq")``: each micro-batch is published like a batch write."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        # The query's id and the batch's: a batch run again after a restart from the
        # checkpoint sends the ids it sent before.
        write = stream_write_id(self.options) if self.options.dedup else None
        return Published(asyncio.run(publish(self.options, iterator, write)))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, Published))
        log.info("fq sink: batch %d: %d messages published and confirmed", batchId, rows)
