"""The ``fq`` source: a permanent disk queue or a retained topic read by position, streaming
or in batch (the README's Spark section).

Spark runs each class in a process of its own, which shapes them: :class:`FqStreamReader`
lives on the driver, makes sure the queue exists and is bound, answers offsets from
``/queue/info`` and on ``commit`` moves the broker checkpoint that bounds deletion; ``read``
runs on executors with all it needs in the options and the :class:`FqRange` partition, and
reads with ``/queue/read``, which consumes nothing, so a batch run again gets the same rows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from fqbroker.clients.http.replay import QueueInfo, ReplayClient
from fqbroker.errors import BrokerError, DataLossError, DataLost, SparkOptionError

from .options import SourceOptions, first_line
from .schema import record_batch

__all__ = ["DataLossError", "FqBatchReader", "FqRange", "FqStreamReader"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FqRange(InputPartition):
    """Positions ``[start, end)`` of one queue (seqs) or topic (indexes): one task's share."""

    queue: str  # the queue's or the topic's name
    start: int
    end: int
    topic: bool = False


def split(queue: str, start: int, end: int, parts: int, *, topic: bool = False) -> list[FqRange]:
    """``[start, end)`` as up to ``parts`` contiguous ranges of near-equal size."""
    total = end - start
    n = max(1, min(parts, total)) if total > 0 else 0
    bounds = [start + total * i // n for i in range(n + 1)] if n else []
    return [FqRange(queue, bounds[i], bounds[i + 1], topic) for i in range(n)]


def _loss(options: SourceOptions, start: int, first: int) -> int:
    """Where to go on when ``[start, first)`` is gone: ``first``, or raise if told to fail."""
    text = (
        f"fq source: offsets {start} to {first - 1} of {options.label} are no longer "
        f"stored (it now starts at {first}); some data was lost."
    )
    if options.fail_on_data_loss:
        raise DataLossError(f"{text} Set failOnDataLoss=false to skip it and go on.")
    log.warning("%s Skipping it (failOnDataLoss=false).", text)
    return first


def read_range(options: SourceOptions, part: InputPartition) -> Iterator[pa.RecordBatch]:
    """The rows of ``part``: one Arrow batch per broker response."""
    if not isinstance(part, FqRange):
        return  # with no partitions to read, Spark still runs one task, with a placeholder
    with first_line():
        yield from _read(options, part)


def _read(options: SourceOptions, part: FqRange) -> Iterator[pa.RecordBatch]:
    client = options.broker.client()
    start = part.start
    while start < part.end:
        try:
            reads = client.read_topic_range if part.topic else client.read_range
            for entries in reads(part.queue, start, part.end):
                yield record_batch(part.queue, entries)
                start = entries[-1].seq + 1
        except DataLost as exc:
            if exc.first <= start:
                # Not trimmed but missing at the end: the broker lost records it had
                # confirmed (a crash) or the queue was recreated. Nothing more to read.
                if options.fail_on_data_loss:
                    raise DataLossError(
                        f"fq source: {exc.text}. Set failOnDataLoss=false to skip it."
                    ) from exc
                log.warning("fq source: %s; skipping to the end of the batch", exc.text)
                return
            start = _loss(options, start, exc.first)


def _past_end(options: SourceOptions, start: int, end: int, *, batch: bool = False) -> bool:
    """Whether ``startingOffsets`` is past the end (``end``, the next offset): a stream
    waits for it, a batch reads nothing. Raises, as Kafka does, unless failOnDataLoss is
    false."""
    if start <= end:
        return False
    text = (
        f"fq option 'startingOffsets': offset {start} is past the end of {options.label} "
        f"(next offset {end})"
    )
    if options.fail_on_data_loss:
        then = "read nothing" if batch else "wait for it"
        raise SparkOptionError(f"{text}. Set failOnDataLoss=false to {then}.")
    log.warning("%s; %s (failOnDataLoss=false).", text, "nothing read" if batch else "waiting")
    return True


def _topic_info(client: ReplayClient, topic: str) -> QueueInfo:
    # A topic appears with its first message: until then it reads as empty from index 0.
    info = client.topic_info(topic, missing_ok=True)
    return QueueInfo(info.first, info.next)


class FqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The stream's reader on the driver, one long-lived process.

    Offsets are ``{"<queue>": seq}``, the next sequence number to read. Spark's checkpoint
    is the truth; the broker checkpoint lags it by a batch (``commit`` comes late, and
    never for the last batch before a stop) and only bounds deletion. With a topic the
    offsets are ``{"T": index}``, the 0-based index of the next message (a Figg offset is
    the same number), and nothing is created, bound or committed on the broker, so any
    number of queries read one topic independently; retention alone decides what is
    deleted, and ``failOnDataLoss`` what happens when it deleted what a query needed.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._ready = False  # queue and binding ensured by this process (with an exchange)
        self._target: int | None = None  # availableNow: the end to stop at
        self._latest: int | None = None  # the end seen last, for progress reports

    def _info(self) -> QueueInfo:
        opts = self.options
        client = opts.broker.client()
        if opts.topic:
            info = _topic_info(client, opts.topic)
            self._latest = info.next
            return info
        if not self._ready and opts.exchange:
            client.ensure_queue(
                opts.queue,
                user=opts.broker.user,
                password=opts.broker.password,
                exchange=opts.exchange,
                program=opts.program,
            )
            self._ready = True
        info = client.info(opts.queue)
        self._latest = info.next
        return info

    def _seq(self, offset: dict[str, int]) -> int:
        name = self.options.name
        if name not in offset:
            raise ValueError(
                f"fq source: the checkpoint's offsets {offset} are not for "
                f"{self.options.label}; use a new checkpoint location for another source"
            )
        return int(offset[name])

    @first_line()
    def initialOffset(self) -> dict[str, int]:
        opts = self.options
        info = self._info()
        start = opts.starting.resolve(info.first, info.next)
        _past_end(opts, start, info.next)
        if not opts.topic and opts.checkpoint not in info.checkpoints:
            # Hold on to what this new query will read before its first commit.
            opts.broker.client().set_checkpoint(
                opts.queue, opts.checkpoint, min(max(start, info.first), info.next)
            )
        return {opts.name: start}

    @first_line()
    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        info = self._info()
        begin = self._seq(start)
        if begin < info.first:
            begin = _loss(self.options, begin, info.first)
        end = info.next if self._target is None else min(info.next, self._target)
        if begin > end:
            if self.options.fail_on_data_loss and begin > info.next:
                # The query read there before (a new one is checked in initialOffset).
                raise DataLossError(
                    f"fq source: the query's position {begin} is past the end of "
                    f"{self.options.label} (next offset {info.next}): it was emptied "
                    "or recreated since. Set failOnDataLoss=false to wait for new "
                    "messages past that position."
                )
            return start
        if isinstance(limit, ReadMaxRows):
            end = min(end, begin + limit.max_rows)
        return {self.options.name: end}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets is None:
            return super().getDefaultReadLimit()
        return ReadMaxRows(self.options.max_offsets)

    def reportLatestOffset(self) -> dict[str, int] | None:
        return None if self._latest is None else {self.options.name: self._latest}

    @first_line()
    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._info().next

    @first_line()
    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[FqRange]:
        opts = self.options
        return split(
            opts.name, self._seq(start), self._seq(end), opts.partitions, topic=bool(opts.topic)
        )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self.options, partition)

    def commit(self, end: dict[str, int]) -> None:
        opts = self.options
        if opts.topic:
            return  # readers of a topic hold nothing on the broker: retention alone deletes
        try:
            opts.broker.client().set_checkpoint(opts.queue, opts.checkpoint, self._seq(end))
        except BrokerError as exc:
            # Only a deletion hint: the query is right without it, the disk just fills up.
            log.warning("fq source: could not move the broker checkpoint: %s", exc.text)


class FqBatchReader(DataSourceReader):
    """``spark.read.format("fq")``: the queue or topic between startingOffsets and
    endingOffsets."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    @first_line()
    def partitions(self) -> Sequence[FqRange]:
        opts = self.options
        client = opts.broker.client()
        info = _topic_info(client, opts.topic) if opts.topic else client.info(opts.queue)
        start = opts.starting.resolve(info.first, info.next)
        end = min(opts.ending.resolve(info.first, info.next), info.next)
        if _past_end(opts, start, info.next, batch=True):
            return []
        if start < info.first:
            start = _loss(opts, start, info.first)
        return split(opts.name, start, end, opts.partitions, topic=bool(opts.topic))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self.options, partition)
