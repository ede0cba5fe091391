"""The ``fq`` sink: DataFrame rows published to exchanges, batch and streaming.

Each Spark task opens its own fq connection, publishes its rows and waits for a publisher
confirm covering all of them, so delivery is at least once (the README's Spark section).
Writers are built on the driver and pickled to executors, so they hold options only; the
connection lives inside ``write``. The Arrow writer classes take whole record batches,
many times faster than a writer given one row at a time (bench/RESULTS.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from fqbroker.clients.fq.client import Client
from fqbroker.errors import FqError
from fqbroker.protocols.fq.wire import MAX_RK_LEN

from .options import SinkOptions

__all__ = ["FqStreamWriter", "FqWriter", "Published"]

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


async def publish(options: SinkOptions, batches: Iterator[pa.RecordBatch]) -> int:
    """Publish every row and return the count once the broker confirmed them all."""
    broker = options.broker
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
    )
    rows = 0
    try:
        async with client:
            for batch in batches:
                exchanges = _names(batch, "exchange", options.exchange)
                routes = _names(batch, "route", options.route)
                columns = zip(exchanges, routes, _payloads(batch), _msgids(batch), strict=True)
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

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        return Published(asyncio.run(publish(self.options, iterator)))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, Published))
        log.info("fq sink: %d messages published and confirmed", rows)


class FqStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("fq")``: each micro-batch is published like a batch write."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        return Published(asyncio.run(publish(self.options, iterator)))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, Published))
        log.info("fq sink: batch %d: %d messages published and confirmed", batchId, rows)
