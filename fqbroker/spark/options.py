"""The ``fq`` data source's options, checked once on the driver.

Spark hands every option over as a string in a case-insensitive mapping. Parsing them into
frozen dataclasses here means a typo fails the query at once with the option's name, not
halfway through a task, and the readers and writers Spark pickles carry plain values.
Names follow Spark's Kafka connector where the meaning is the same. The source reads a
disk queue (``queue``) or retained topics (``topic``, a comma-separated list as Kafka's
``subscribe``), never both; a topic has no broker checkpoint, so ``checkpointName``,
``exchange`` and ``program`` are refused with it.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from fqbroker.clients.http.replay import ReplayClient
from fqbroker.errors import BrokerError, DataLossError, SparkOptionError

__all__ = [
    "ANY",
    "EARLIEST",
    "LATEST",
    "READ",
    "READS",
    "STREAM",
    "STREAM_WRITE",
    "WRITE",
    "BrokerOptions",
    "Offsets",
    "SinkOptions",
    "SourceOptions",
    "check_exists",
    "check_names",
    "first_line",
    "headline",
    "name_the_right",
    "topic_list",
]

EARLIEST = -2  # in startingOffsets/endingOffsets JSON, as Kafka's
LATEST = -1
EACH = -3  # Offsets.seq of JSON naming several topics: see Offsets.each
DEFAULT_PORT = 8765
BROKER_RETRY = 60.0  # seconds the source and its readers wait for an unreachable broker


# Where an option applies: batch read, stream read, batch write, stream write.
READ, STREAM, WRITE, STREAM_WRITE = "read", "stream", "write", "stream write"
READS = frozenset({READ, STREAM})
WRITES = frozenset({WRITE, STREAM_WRITE})
ANY = READS | WRITES

# Every option the data source takes, by its lower-case name (Spark lowers them all), with
# its spelling in the docs and where it has an effect. An option given where it has none is
# refused rather than ignored: a job that silently does something else is worse than one
# that does not start.
KNOWN: dict[str, tuple[str, frozenset[str]]] = {
    name.lower(): (name, uses)
    for name, uses in [
        ("host", ANY),
        ("port", ANY),
        ("user", ANY),
        ("password", ANY),
        ("tls", ANY),
        ("cafile", ANY),
        ("adminToken", READS),
        ("queue", READS),
        ("topic", READS),
        ("startingOffsets", READS),
        ("failOnDataLoss", READS),
        ("numPartitions", READS),
        ("waitForTopic", READS),
        ("endingOffsets", frozenset({READ})),
        ("exchange", frozenset({STREAM}) | WRITES),
        ("program", frozenset({STREAM})),
        ("checkpointName", frozenset({STREAM})),
        ("maxOffsetsPerTrigger", frozenset({STREAM})),
        ("route", WRITES),
        ("dedup", WRITES),
        ("writeId", WRITES),
        ("checkpointLocation", frozenset({STREAM_WRITE})),  # Spark's own, passed along
    ]
}

STREAM_USE = frozenset({STREAM})
READ_USE = frozenset({READ})

_WHERE = {
    READS: "for reading",
    WRITES: "for writing",
    frozenset({STREAM}): "for streams (readStream)",
    frozenset({READ}): "for batch reads (spark.read)",
    frozenset({STREAM_WRITE}): "Spark's own, for writeStream",
    frozenset({STREAM}) | WRITES: "for streams (which bind the queue to it) and for writing",
}

_NO_TIMESTAMPS = "not supported: fq reads by offset; use startingOffsets/endingOffsets"
_NO_KAFKA = "not supported: fq has no Kafka client settings (see host, port, user, tls, cafile)"

# Spark's Kafka connector's options, answered with what to use instead.
KAFKA: dict[str, str] = {
    "subscribe": "use 'topic' (a retained topic) or 'queue' (a disk queue)",
    "subscribepattern": "not supported: name the topic with 'topic'",
    "assign": "not supported: fq topics have no partitions; use 'topic' and startingOffsets",
    "kafka.bootstrap.servers": "use 'host' and 'port'",
    "startingtimestamp": _NO_TIMESTAMPS,
    "startingoffsetsbytimestamp": _NO_TIMESTAMPS,
    "startingoffsetsbytimestampstrategy": _NO_TIMESTAMPS,
    "endingtimestamp": _NO_TIMESTAMPS,
    "endingoffsetsbytimestamp": _NO_TIMESTAMPS,
    "minoffsetspertrigger": "not supported: a micro-batch takes what has arrived, up to "
    "maxOffsetsPerTrigger",
    "maxtriggerdelay": "not supported (it goes with minOffsetsPerTrigger)",
    "includeheaders": "not supported: fq messages have no headers (the 'sender' and 'hops' "
    "columns are always there)",
    "groupidprefix": "not supported: a query holds no consumer group (a queue's broker "
    "checkpoint is 'checkpointName')",
    "kafka.group.id": "not supported: a query holds no consumer group (a queue's broker "
    "checkpoint is 'checkpointName')",
    "minpartitions": "use 'numPartitions'",
    "maxrecordsperpartition": "not supported: use 'numPartitions'",
    "fetchoffset.numretries": "not supported: the source waits up to 60 s for the broker",
    "fetchoffset.retryintervalms": "not supported: the source waits up to 60 s for the broker",
    "kafkaconsumer.polltimeoutms": "not supported: the source waits up to 60 s for the broker",
    "path": "not supported: fq takes no path; name the queue or topic with 'queue' or "
    "'topic', the destination with 'exchange'",
}
_WRITE_KAFKA = {"topic": "use 'exchange' (and 'route', or the columns of those names)"}


def check_names(options: Mapping[str, str], uses: frozenset[str]) -> None:
    """Refuse an option the data source does not know, or that has no effect in ``uses``
    (where it is given; ``ANY`` when Spark has not said yet)."""
    for given in options:
        key = given.lower()
        if uses <= WRITES and key in _WRITE_KAFKA:
            raise SparkOptionError(f"fq option {given!r} is Kafka's: {_WRITE_KAFKA[key]}")
        if key not in KNOWN:
            if key in KAFKA or key.startswith("kafka."):
                raise SparkOptionError(f"fq option {given!r}: {KAFKA.get(key, _NO_KAFKA)}")
            names = [name for name, _ in KNOWN.values()]
            close = difflib.get_close_matches(key, [n.lower() for n in names], n=1)
            hint = f"; did you mean {KNOWN[close[0]][0]!r}?" if close else ""
            raise SparkOptionError(
                f"fq option {given!r} is not known{hint} (options: {', '.join(names)})"
            )
        name, where = KNOWN[key]
        if not where & uses:
            if name == "endingOffsets":
                raise SparkOptionError(
                    "fq option 'endingOffsets' is for batch reads: a stream runs on, as with "
                    "Kafka (trigger(availableNow=True) stops at the end of what is there)"
                )
            text = _WHERE.get(where, "for " + " and ".join(sorted(where)))
            raise SparkOptionError(f"fq option {name!r} is {text}")


def headline(exc: BaseException) -> BaseException:
    """``exc``, made to show its message first where Spark reports it (see
    :class:`~fqbroker.errors.SparkOptionError`'s base); other errors are left as they are."""
    if isinstance(exc, (SparkOptionError, DataLossError)):
        copy = BaseException.__new__(type(exc))
        copy.args = exc.args
        exc.__context__ = copy
        exc.lead = True
    return exc


@contextmanager
def first_line() -> Iterator[None]:
    """Put the message of a refusal raised inside first where Spark shows it. Done as the
    error leaves: Python sets the context when an error is raised while another is handled."""
    try:
        yield
    except (SparkOptionError, DataLossError) as exc:
        headline(exc)
        raise


def _get(options: Mapping[str, str], key: str, default: str = "") -> str:
    # Spark's mapping ignores case; a plain dict in tests does not, so look both ways.
    value = options.get(key)
    if value is None:
        value = options.get(key.lower())
    return default if value is None else str(value)


def _int(options: Mapping[str, str], key: str, default: int, *, least: int) -> int:
    text = _get(options, key, str(default))
    try:
        value = int(text)
    except ValueError:
        raise SparkOptionError(f"fq option {key!r} must be an integer, not {text!r}") from None
    if value < least:
        raise SparkOptionError(f"fq option {key!r} must be at least {least}, not {value}")
    return value


def topic_list(text: str) -> tuple[str, ...]:
    """The ``topic`` option's names: comma-separated, as Kafka's ``subscribe``; blanks
    around a name are dropped, and so is a name given twice (Kafka subscribes a set)."""
    names = (name.strip() for name in text.split(","))
    return tuple(dict.fromkeys(name for name in names if name))


def _bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    text = _get(options, key, str(default)).strip().lower()
    if text not in ("true", "false"):
        raise SparkOptionError(f"fq option {key!r} must be true or false, not {text!r}")
    return text == "true"


@dataclass(frozen=True, slots=True)
class BrokerOptions:
    host: str
    port: int
    user: str
    password: str
    token: str
    tls: bool = False  # TLS to the broker (fq and HTTPS on its main port)
    cafile: str = ""  # trust only this PEM file's CAs; implies tls

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> BrokerOptions:
        return cls(
            host=_get(options, "host", "127.0.0.1"),
            port=_int(options, "port", DEFAULT_PORT, least=1),
            user=_get(options, "user", "spark"),
            password=_get(options, "password"),
            token=_get(options, "adminToken"),
            tls=_bool(options, "tls", False) or bool(_get(options, "cafile")),
            cafile=_get(options, "cafile"),
        )

    def client(self) -> ReplayClient:
        # A stream outlives broker restarts: its requests wait this long for the broker.
        return ReplayClient(
            self.host,
            self.port,
            token=self.token,
            user=self.user,
            password=self.password,
            retry_seconds=BROKER_RETRY,
            tls=self.tls,
            cafile=self.cafile,
        )


@dataclass(frozen=True, slots=True)
class Offsets:
    """``earliest``, ``latest`` or a position (a seq or an index) of each queue or topic."""

    seq: int  # EARLIEST, LATEST, a position of the one queue or topic, or EACH
    each: tuple[tuple[str, int], ...] = ()  # with EACH: (topic, EARLIEST/LATEST/position)

    @classmethod
    def parse(cls, text: str, queue: str | Sequence[str], key: str, *, least: int = 1) -> Offsets:
        """``queue``: the name, or the topics' names (JSON must give each of them, as
        Kafka's does every partition); ``least``: the smallest position (1 for a queue's
        seqs, 0 for topic indexes)."""
        names = (queue,) if isinstance(queue, str) else tuple(queue)
        word = text.strip().lower()
        if word == "earliest":
            return cls(EARLIEST)
        if word == "latest":
            return cls(LATEST)
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        if not (
            isinstance(doc, dict)
            and set(doc) == set(names)
            and all(isinstance(doc[name], int) for name in names)
        ):
            example = json.dumps(dict.fromkeys(names, 42))
            raise SparkOptionError(
                f'fq option {key!r} must be "earliest", "latest" or JSON like '
                f"{example} (-2 earliest, -1 latest), not {text!r}"
            )
        for name in names:
            seq = doc[name]
            if seq < EARLIEST or 0 <= seq < least:
                what = "seqs start at 1" if least else "indexes start at 0"
                raise SparkOptionError(f"fq option {key!r}: {seq} is not a position ({what})")
        if len(names) == 1:
            return cls(doc[names[0]])
        return cls(EACH, tuple((name, doc[name]) for name in names))

    def at(self, name: str) -> Offsets:
        """The offset of one of the topics."""
        return Offsets(dict(self.each)[name]) if self.seq == EACH else self

    def resolve(self, first: int, end: int) -> int:
        if self.seq == EARLIEST:
            return first
        if self.seq == LATEST:
            return end
        return self.seq


@dataclass(frozen=True, slots=True)
class SourceOptions:
    broker: BrokerOptions
    queue: str
    exchange: str  # bound on start when set; else the queue must exist
    program: str
    starting: Offsets
    ending: Offsets  # batch reads only
    max_offsets: int | None  # per trigger
    fail_on_data_loss: bool
    partitions: int
    checkpoint: str  # the broker checkpoint commit() moves (queues only)
    topics: tuple[str, ...] = ()  # retained topics, read instead of a queue
    wait_for_topic: bool = False  # a missing topic reads as empty until it appears

    @property
    def topic(self) -> str:
        """The topics as the option gives them (empty for a queue)."""
        return ",".join(self.topics)

    @property
    def names(self) -> tuple[str, ...]:
        """What the offsets are keyed by: the topics, or the queue."""
        return self.topics or (self.queue,)

    @property
    def name(self) -> str:
        """The topics, or the queue, as one name for messages and single-topic offsets."""
        return self.topic or self.queue

    def label_of(self, name: str) -> str:
        """``topic 'T'`` or ``queue 'Q'``, for messages."""
        return f"topic {name!r}" if self.topics else f"queue {name!r}"

    @property
    def label(self) -> str:
        return ", ".join(self.label_of(name) for name in self.names)

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool | None) -> SourceOptions:
        """``streaming`` None: a read, batch or stream, Spark has not said yet."""
        check_names(options, READS if streaming is None else STREAM_USE if streaming else READ_USE)
        queue, topic = _get(options, "queue"), _get(options, "topic")
        topics = topic_list(topic)
        if queue and topic:
            raise SparkOptionError(
                "fq source: set option 'queue' (a disk queue) or 'topic' (a retained topic), "
                "not both"
            )
        if not (queue or topics):
            raise SparkOptionError(
                "fq source: option 'queue' (a disk queue name) or 'topic' (a retained topic "
                "name, or several separated by commas) is required"
            )
        key = "topic" if topics else "queue"
        names = topics or (queue,)
        if any(len(name.encode()) > 127 for name in names):
            raise SparkOptionError(f"fq source: {key!r} is at most 127 bytes")
        if topics:
            for other in ("exchange", "program", "checkpointName"):
                if _get(options, other):
                    raise SparkOptionError(
                        f"fq source: option {other!r} is for queues; a topic is read as it "
                        "is (its messages arrive on the Figg exchange) and keeps no "
                        "broker checkpoint"
                    )
        elif _get(options, "waitForTopic"):
            raise SparkOptionError(
                "fq option 'waitForTopic' is for topics: a stream given 'exchange' creates "
                "its queue"
            )
        least = 0 if topics else 1
        limit = _get(options, "maxOffsetsPerTrigger")
        source = cls(
            broker=BrokerOptions.parse(options),
            topics=topics,
            queue=queue,
            exchange=_get(options, "exchange"),
            program=_get(options, "program", "prefix:"),
            starting=Offsets.parse(
                _get(options, "startingOffsets", "latest" if streaming else "earliest"),
                names,
                "startingOffsets",
                least=least,
            ),
            ending=Offsets.parse(
                _get(options, "endingOffsets", "latest"), names, "endingOffsets", least=least
            ),
            max_offsets=_int(options, "maxOffsetsPerTrigger", 1, least=1) if limit else None,
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            partitions=_int(options, "numPartitions", 1, least=1),
            checkpoint="" if topics else _get(options, "checkpointName", f"spark-{queue}"),
            wait_for_topic=_bool(options, "waitForTopic", False),
        )
        # Before Spark says, only a batch read may have endingOffsets (a stream refuses it).
        batch = streaming is False or (streaming is None and bool(_get(options, "endingOffsets")))
        if batch:
            several = len(source.names) > 1
            for name in source.names:
                start, end = source.starting.at(name).seq, source.ending.at(name).seq
                _check_range(start, end, name if several else "")
        return source


def _check_range(start: int, end: int, name: str) -> None:
    """As Kafka: a batch range that can only be empty is a mistake, not a result. ``name``
    says which topic, when several are read."""
    of = f" (topic {name!r})" if name else ""
    if start == LATEST:
        raise SparkOptionError(
            f"fq option 'startingOffsets' cannot be latest in a batch read{of}: it would "
            "read nothing"
        )
    if end == EARLIEST:
        raise SparkOptionError(
            f"fq option 'endingOffsets' cannot be earliest{of}: a batch read would read nothing"
        )
    if start >= 0 and end >= 0 and start > end:
        raise SparkOptionError(
            f"fq option 'startingOffsets' ({start}) is after 'endingOffsets' ({end}){of}"
        )


@dataclass(frozen=True, slots=True)
class SinkOptions:
    broker: BrokerOptions
    exchange: str  # overrides the column when set
    route: str  # overrides the column when set
    # Exactly once (docs/confirms.md): rows get ids the broker de-duplicates by, derived
    # from ``write_id`` (else the streaming query's id, or one per batch write), the batch,
    # the partition and the row; ``dedup = false`` publishes at least once.
    dedup: bool = True
    write_id: str = ""

    @classmethod
    def parse(
        cls, options: Mapping[str, str], columns: Mapping[str, str], *, streaming: bool = False
    ) -> SinkOptions:
        """``columns`` maps the DataFrame's column names to their Spark type names."""
        check_names(options, frozenset({STREAM_WRITE if streaming else WRITE}))
        sink = cls(
            BrokerOptions.parse(options),
            _get(options, "exchange"),
            _get(options, "route"),
            dedup=_bool(options, "dedup", True),
            write_id=_get(options, "writeId"),
        )
        for name, value in (("exchange", sink.exchange), ("route", sink.route)):
            if len(value.encode()) > 127:
                raise SparkOptionError(f"fq sink: option {name!r} is over 127 bytes")
            if not value and columns.get(name) != "string":
                raise SparkOptionError(
                    f"fq sink: set option {name!r} or give a string column {name!r}"
                    f" (got {columns.get(name, 'none')})"
                )
        if columns.get("payload") not in ("binary", "string"):
            raise SparkOptionError(
                "fq sink: a 'payload' column of type binary or string is required"
                f" (got {columns.get('payload', 'none')})"
            )
        if columns.get("msgid", "binary") != "binary":
            raise SparkOptionError(f"fq sink: 'msgid' must be binary (got {columns['msgid']})")
        return sink


def name_the_right(options: SourceOptions, name: str, exc: BrokerError) -> None:
    """When the broker refused reading ``name`` for want of a right, raise an error saying
    which right; else return, and the caller raises ``exc`` as it is (a 401 for a wrong
    password and the rest say what they are)."""
    if not exc.text.endswith(": forbidden"):
        return
    broker = options.broker
    kind = "consume" if options.topics else "queue"
    who = "the adminToken" if broker.token else f"user {broker.user!r}"
    # The queue a source creates is private: its creator's alone (docs/permissions.md).
    private = "" if options.topics else " and, for a private queue, to be the one who made it"
    raise BrokerError(
        f"fq source: the broker refused {who} reading {options.label_of(name)} "
        f"({exc.text}): that needs the {kind!r} right on {name!r} "
        f"(fq-admin user allow {broker.user} {kind} '{name}'){private}, the admin right, or "
        "the broker's admin_token as option adminToken"
    ) from exc


def check_exists(opts: SourceOptions) -> None:
    """Refuse a source whose queue or topics the broker does not have (asked over HTTP, as
    the reads are), unless it will make them: a stream given ``exchange`` creates its
    queue, and ``waitForTopic`` reads a topic as empty until its first message."""
    client = opts.broker.client()
    where = f"the broker at {opts.broker.host}:{opts.broker.port}"
    if opts.topic:
        if opts.wait_for_topic:
            return
        # A topic is created by its first message: before it, info answers an empty one.
        missing = []
        for name in opts.topics:
            try:
                info = client.topic_info(name, missing_ok=True)
            except BrokerError as exc:
                name_the_right(opts, name, exc)
                raise
            if info.first == info.next == 0:
                missing.append(name)
        if missing:
            raise SparkOptionError(
                f"fq option 'topic': {where} has no topic {', '.join(map(repr, missing))}; "
                "set waitForTopic=true to read it from its first message"
            )
    elif not opts.exchange:
        try:
            client.info(opts.queue)
        except BrokerError as exc:
            if "Cannot find registered queue" not in exc.text:
                name_the_right(opts, opts.queue, exc)
                raise
            raise SparkOptionError(
                f"fq option 'queue': Cannot find registered queue {opts.queue!r} at {where} "
                "(a stream given option 'exchange' creates it and binds it)"
            ) from None
