"""The ``fq`` data source's options, checked once on the driver.

Spark hands every option over as a string in a case-insensitive mapping. Parsing them into
frozen dataclasses here means a typo fails the query at once with the option's name, not
halfway through a task, and the readers and writers Spark pickles carry plain values.
Names follow Spark's Kafka connector where the meaning is the same. The source reads a
disk queue (``queue``) or a retained topic (``topic``), never both; a topic has no broker
checkpoint, so ``checkpointName``, ``exchange`` and ``program`` are refused with it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from fqbroker.clients.http.replay import ReplayClient

__all__ = ["EARLIEST", "LATEST", "BrokerOptions", "Offsets", "SinkOptions", "SourceOptions"]

EARLIEST = -2  # in startingOffsets/endingOffsets JSON, as Kafka's
LATEST = -1
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
    """``earliest``, ``latest`` or a position (a seq) in one queue."""

    seq: int  # EARLIEST, LATEST, or a sequence number

    @classmethod
    def parse(cls, text: str, queue: str, key: str, *, least: int = 1) -> Offsets:
        """``least``: the smallest position (1 for a queue's seqs, 0 for topic indexes)."""
        word = text.strip().lower()
        if word == "earliest":
            return cls(EARLIEST)
        if word == "latest":
            return cls(LATEST)
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        if not (isinstance(doc, dict) and set(doc) == {queue} and isinstance(doc[queue], int)):
            raise ValueError(
                f'fq option {key!r} must be "earliest", "latest" or JSON like '
                f'{{"{queue}": 42}} (-2 earliest, -1 latest), not {text!r}'
            )
        seq = doc[queue]
        if seq < EARLIEST or 0 <= seq < least:
            what = "seqs start at 1" if least else "indexes start at 0"
            raise ValueError(f"fq option {key!r}: {seq} is not a position ({what})")
        return cls(seq)

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
    topic: str = ""  # a retained topic, read instead of a queue

    @property
    def name(self) -> str:
        """What the offsets are keyed by: the topic or the queue."""
        return self.topic or self.queue

    @property
    def label(self) -> str:
        """``topic 'T'`` or ``queue 'Q'``, for messages."""
        return f"topic {self.topic!r}" if self.topic else f"queue {self.queue!r}"

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
        queue, topic = _get(options, "queue"), _get(options, "topic")
        if queue and topic:
            raise ValueError(
                "fq source: set option 'queue' (a disk queue) or 'topic' (a retained topic), "
                "not both"
            )
        if not (queue or topic):
            raise ValueError(
                "fq source: option 'queue' (a disk queue name) or 'topic' (a retained topic "
                "name) is required"
            )
        key, name = ("topic", topic) if topic else ("queue", queue)
        if len(name.encode()) > 127:
            raise ValueError(f"fq source: {key!r} is at most 127 bytes")
        if topic:
            for other in ("exchange", "program", "checkpointName"):
                if _get(options, other):
                    raise ValueError(
                        f"fq source: option {other!r} is for queues; a topic is read as it "
                        "is (its messages arrive on the Figg exchange) and keeps no "
                        "broker checkpoint"
                    )
        least = 0 if topic else 1
        limit = _get(options, "maxOffsetsPerTrigger")
        return cls(
            broker=BrokerOptions.parse(options),
            topic=topic,
            queue=queue,
            exchange=_get(options, "exchange"),
            program=_get(options, "program", "prefix:"),
            starting=Offsets.parse(
                _get(options, "startingOffsets", "latest" if streaming else "earliest"),
                name,
                "startingOffsets",
                least=least,
            ),
            ending=Offsets.parse(
                _get(options, "endingOffsets", "latest"), name, "endingOffsets", least=least
            ),
            max_offsets=_int(options, "maxOffsetsPerTrigger", 1, least=1) if limit else None,
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            partitions=_int(options, "numPartitions", 1, least=1),
            checkpoint="" if topic else _get(options, "checkpointName", f"spark-{queue}"),
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
    def parse(cls, options: Mapping[str, str], columns: Mapping[str, str]) -> SinkOptions:
        """``columns`` maps the DataFrame's column names to their Spark type names."""
        sink = cls(
            BrokerOptions.parse(options),
            _get(options, "exchange"),
            _get(options, "route"),
            dedup=_bool(options, "dedup", True),
            write_id=_get(options, "writeId"),
        )
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
