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

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fqbroker.clients.http.replay import ReplayClient

__all__ = [
    "EARLIEST",
    "LATEST",
    "BrokerOptions",
    "Offsets",
    "SinkOptions",
    "SourceOptions",
    "topic_list",
]

EARLIEST = -2  # in startingOffsets/endingOffsets JSON, as Kafka's
LATEST = -1
EACH = -3  # Offsets.seq of JSON naming several topics: see Offsets.each
DEFAULT_PORT = 8765
BROKER_RETRY = 60.0  # seconds the source and its readers wait for an unreachable broker


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
        raise ValueError(f"fq option {key!r} must be an integer, not {text!r}") from None
    if value < least:
        raise ValueError(f"fq option {key!r} must be at least {least}, not {value}")
    return value


def topic_list(text: str) -> tuple[str, ...]:
    """The ``topic`` option's names: comma-separated, as Kafka's ``subscribe``; blanks
    around a name are dropped, and so is a name given twice (Kafka subscribes a set)."""
    names = (name.strip() for name in text.split(","))
    return tuple(dict.fromkeys(name for name in names if name))


def _bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    text = _get(options, key, str(default)).strip().lower()
    if text not in ("true", "false"):
        raise ValueError(f"fq option {key!r} must be true or false, not {text!r}")
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
            raise ValueError(
                f'fq option {key!r} must be "earliest", "latest" or JSON like '
                f"{example} (-2 earliest, -1 latest), not {text!r}"
            )
        for name in names:
            seq = doc[name]
            if seq < EARLIEST or 0 <= seq < least:
                what = "seqs start at 1" if least else "indexes start at 0"
                raise ValueError(f"fq option {key!r}: {seq} is not a position ({what})")
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
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
        queue, topic = _get(options, "queue"), _get(options, "topic")
        topics = topic_list(topic)
        if queue and topic:
            raise ValueError(
                "fq source: set option 'queue' (a disk queue) or 'topic' (a retained topic), "
                "not both"
            )
        if not (queue or topics):
            raise ValueError(
                "fq source: option 'queue' (a disk queue name) or 'topic' (a retained topic "
                "name, or several separated by commas) is required"
            )
        key = "topic" if topics else "queue"
        names = topics or (queue,)
        if any(len(name.encode()) > 127 for name in names):
            raise ValueError(f"fq source: {key!r} is at most 127 bytes")
        if topics:
            for other in ("exchange", "program", "checkpointName"):
                if _get(options, other):
                    raise ValueError(
                        f"fq source: option {other!r} is for queues; a topic is read as it "
                        "is (its messages arrive on the Figg exchange) and keeps no "
                        "broker checkpoint"
                    )
        least = 0 if topics else 1
        limit = _get(options, "maxOffsetsPerTrigger")
        return cls(
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
        )


@dataclass(frozen=True, slots=True)
class SinkOptions:
    broker: BrokerOptions
    exchange: str  # overrides the column when set
    route: str  # overrides the column when set

    @classmethod
    def parse(cls, options: Mapping[str, str], columns: Mapping[str, str]) -> SinkOptions:
        """``columns`` maps the DataFrame's column names to their Spark type names."""
        sink = cls(BrokerOptions.parse(options), _get(options, "exchange"), _get(options, "route"))
        for name, value in (("exchange", sink.exchange), ("route", sink.route)):
            if len(value.encode()) > 127:
                raise ValueError(f"fq sink: option {name!r} is over 127 bytes")
            if not value and columns.get(name) != "string":
                raise ValueError(
                    f"fq sink: set option {name!r} or give a string column {name!r}"
                    f" (got {columns.get(name, 'none')})"
                )
        if columns.get("payload") not in ("binary", "string"):
            raise ValueError(
                "fq sink: a 'payload' column of type binary or string is required"
                f" (got {columns.get('payload', 'none')})"
            )
        if columns.get("msgid", "binary") != "binary":
            raise ValueError(f"fq sink: 'msgid' must be binary (got {columns['msgid']})")
        return sink
