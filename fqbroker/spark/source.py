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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from fqbroker.clients.http.replay import QueueInfo, ReplayClient
from fqbroker.errors import BrokerError, DataLossError, DataLost, SparkOptionError

from .options import SourceOptions, first_line, name_the_right
from .schema import record_batch

__all__ = ["DataLossError", "FqBatchReader", "FqRange", "FqStreamReader", "plan", "share"]

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


def share(limit: int, wants: Mapping[str, int], turn: int = 0) -> dict[str, int]:
    """``limit`` rows shared fairly among topics that have ``wants`` rows each to read.

    Max-min fair, not in proportion to the backlog as Kafka's split over partitions: each
    topic gets an equal share, or all it has when that is less, and what those leave goes
    to the others; so a busy topic never holds back a quiet one. Units too few to go round
    (``limit`` below the number of topics with rows) go one each in a rotating order
    that starts at ``turn``, so that none is left out batch after batch. The shares add up
    to ``min(limit, sum(wants))`` exactly.
    """
    got = dict.fromkeys(wants, 0)
    left = limit
    active = [name for name, n in wants.items() if n > 0]
    while left > 0 and active:
        each = left // len(active)
        if each == 0:
            for i in range(left):
                got[active[(turn + i) % len(active)]] += 1
            break
        for name in active:
            take = min(each, wants[name] - got[name])
            got[name] += take
            left -= take
        active = [name for name in active if got[name] < wants[name]]
    return got


def _loss(options: SourceOptions, start: int, first: int, name: str) -> int:
    """Where to go on when ``[start, first)`` is gone: ``first``, or raise if told to fail."""
    text = (
        f"fq source: offsets {start} to {first - 1} of {options.label_of(name)} "
        f"are no longer stored (it now starts at {first}); some data was lost."
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
                yield record_batch(part.queue, entries, topic=part.topic)
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
            start = _loss(options, start, exc.first, part.queue)
        except BrokerError as exc:
            name_the_right(options, part.queue, exc)
            raise


def _past_end(
    options: SourceOptions, name: str, start: int, end: int, *, batch: bool = False
) -> bool:
    """Whether ``startingOffsets`` is past the end (``end``, the next offset): a stream
    waits for it, a batch reads nothing. Raises, as Kafka does, unless failOnDataLoss is
    false."""
    if start <= end:
        return False
    text = (
        f"fq option 'startingOffsets': offset {start} is past the end of {options.label_of(name)} "
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


def plan(
    options: SourceOptions,
    start: Mapping[str, int],
    infos: Mapping[str, QueueInfo],
    *,
    target: Mapping[str, int] | None = None,
    limit: int | None = None,
) -> dict[str, int]:
    """The end of the next micro-batch: the offset JSON of every name read.

    ``start`` is where the last batch ended (an old single-topic checkpoint is the same
    JSON with one topic); ``infos`` what each queue or topic holds now; ``target`` where
    availableNow stops; ``limit`` maxOffsetsPerTrigger, shared among the topics
    (:func:`share`). A topic the start does not name (added to the ``topic`` list of a
    query restarted on its checkpoint) enters at its earliest retained index, as Kafka's
    new partitions do; the batch that adds it reads none of it, so that the rows of a
    batch depend only on its start and end. A topic no longer in the list is dropped.
    """
    end: dict[str, int] = {}
    wants: dict[str, int] = {}
    for name in options.names:
        info = infos[name]
        if name not in start:
            log.info("fq source: %s joins the query at %d", options.label_of(name), info.first)
            end[name] = info.first
            continue
        was = int(start[name])
        begin = _loss(options, was, info.first, name) if was < info.first else was
        top = info.next if target is None else min(info.next, target.get(name, info.next))
        if begin > top:
            if options.fail_on_data_loss and begin > info.next:
                raise DataLossError(
                    f"fq source: {options.label_of(name)} ends at {info.next}, before "
                    f"the query's position {begin}: it was emptied or recreated. Set "
                    "failOnDataLoss=false to wait for new messages past that position."
                )
            end[name] = was
            continue
        end[name] = begin
        wants[name] = top - begin
    turn = sum(end.values())  # moves on with every batch that reads something
    counts = wants if limit is None else share(limit, wants, turn)
    for name, n in counts.items():
        end[name] += n
    return end


class FqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The stream's reader on the driver, one long-lived process.

    Offsets are ``{"<queue>": seq}``, the next sequence number to read. Spark's checkpoint
    is the truth; the broker checkpoint lags it by a batch (``commit`` comes late, and
    never for the last batch before a stop) and only bounds deletion. With topics the
    offsets are ``{"T1": index, "T2": index}``, the 0-based index of each topic's next
    message (a Figg offset is the same number), and nothing is created, bound or committed
    on the broker, so any number of queries read a topic independently; retention alone
    decides what is deleted, and ``failOnDataLoss`` what happens when it deleted what a
    query needed.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._ready = False  # queue and binding ensured by this process (with an exchange)
        self._target: dict[str, int] | None = None  # availableNow: the ends to stop at
        self._latest: dict[str, int] | None = None  # the ends seen last, for progress reports

    def _infos(self) -> dict[str, QueueInfo]:
        opts = self.options
        client = opts.broker.client()
        infos: dict[str, QueueInfo] = {}
        for name in opts.names:
            try:
                infos[name] = _topic_info(client, name) if opts.topics else self._queue_info(client)
            except BrokerError as exc:
                name_the_right(opts, name, exc)
                raise
        self._latest = {name: info.next for name, info in infos.items()}
        return infos

    def _queue_info(self, client: ReplayClient) -> QueueInfo:
        opts = self.options
        if not self._ready and opts.exchange:
            try:
                client.ensure_queue(
                    opts.queue,
                    user=opts.broker.user,
                    password=opts.broker.password,
                    exchange=opts.exchange,
                    program=opts.program,
                )
            except BrokerError as exc:
                if not exc.text.startswith("cannot bind"):
                    raise
                # fq answers a bind it refuses as it answers a bad program: say both.
                user = opts.broker.user
                raise BrokerError(
                    f'fq source: {exc.text}: under auth = "password" binding needs the '
                    f"'consume' right on {opts.exchange!r} (fq-admin user allow {user} "
                    f"consume '{opts.exchange}'); else check option 'program'"
                ) from exc
            self._ready = True
        return client.info(opts.queue)

    def _start(self, offset: Mapping[str, int]) -> dict[str, int]:
        """A checkpoint's offsets: those of a queue must name it; topics may come and go."""
        name = self.options.queue
        if not self.options.topics and name not in offset:
            raise ValueError(
                f"fq source: the checkpoint's offsets {dict(offset)} are not for "
                f"{self.options.label}; use a new checkpoint location for another source"
            )
        return {k: int(v) for k, v in offset.items()}

    @first_line()
    def initialOffset(self) -> dict[str, int]:
        opts = self.options
        infos = self._infos()
        start = {
            name: opts.starting.at(name).resolve(info.first, info.next)
            for name, info in infos.items()
        }
        for name, info in infos.items():
            _past_end(opts, name, start[name], info.next)
        if not opts.topics:
            info, seq = infos[opts.queue], start[opts.queue]
            if opts.checkpoint not in info.checkpoints:
                # Hold on to what this new query will read before its first commit.
                self._set_checkpoint(min(max(seq, info.first), info.next))
        return start

    @first_line()
    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return plan(
            self.options, self._start(start), self._infos(), target=self._target, limit=rows
        )

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets is None:
            return super().getDefaultReadLimit()
        return ReadMaxRows(self.options.max_offsets)

    def reportLatestOffset(self) -> dict[str, int] | None:
        return self._latest

    @first_line()
    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {name: info.next for name, info in self._infos().items()}

    @first_line()
    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[FqRange]:
        opts = self.options
        begin = self._start(start)
        self._start(end)
        return [
            part
            for name, stop in end.items()
            if name in begin  # a topic joining in this batch: nothing of it yet (see plan)
            for part in split(
                name, begin[name], int(stop), opts.partitions, topic=bool(opts.topics)
            )
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self.options, partition)

    def commit(self, end: dict[str, int]) -> None:
        if self.options.topics:
            return  # readers of a topic hold nothing on the broker: retention alone deletes
        try:
            self._set_checkpoint(self._start(end)[self.options.queue])
        except BrokerError as exc:
            # Only a deletion hint: the query is right without it, the disk just fills up.
            log.warning("fq source: could not move the broker checkpoint: %s", exc.text)

    def _set_checkpoint(self, seq: int) -> None:
        opts = self.options
        try:
            opts.broker.client().set_checkpoint(opts.queue, opts.checkpoint, seq)
        except BrokerError as exc:
            if "forbidden" not in exc.text:
                raise
            who = "the adminToken" if opts.broker.token else f"user {opts.broker.user!r}"
            raise BrokerError(
                f"fq source: the broker refused {who} moving checkpoint {opts.checkpoint!r} "
                f"of {opts.label} ({exc.text}): the checkpoint endpoints need the admin "
                f"right (fq-admin user allow {opts.broker.user} admin '*') or the broker's "
                "admin_token as option adminToken"
            ) from exc


class FqBatchReader(DataSourceReader):
    """``spark.read.format("fq")``: each queue or topic between startingOffsets and
    endingOffsets."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    @first_line()
    def partitions(self) -> Sequence[FqRange]:
        opts = self.options
        client = opts.broker.client()
        parts: list[FqRange] = []
        for name in opts.names:
            try:
                info = _topic_info(client, name) if opts.topics else client.info(name)
            except BrokerError as exc:
                name_the_right(opts, name, exc)
                raise
            start = opts.starting.at(name).resolve(info.first, info.next)
            end = min(opts.ending.at(name).resolve(info.first, info.next), info.next)
            if _past_end(opts, name, start, info.next, batch=True):
                continue
            if start < info.first:
                start = _loss(opts, start, info.first, name)
            parts += split(name, start, end, opts.partitions, topic=bool(opts.topics))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self.options, partition)
