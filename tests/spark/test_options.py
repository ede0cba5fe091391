"""Options of the fq data source: parsing and range splitting (pure), then every refused
option as a user sees it through a real SparkSession, its first line naming the option."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.prereqs import require_module

require_module("pyspark", "the spark extra is not installed (`make spark`)")
require_module("pyarrow", "the spark extra is not installed (`make spark`)")

from fqbroker.spark.options import EARLIEST, LATEST, Offsets, SinkOptions, SourceOptions  # noqa: E402
from fqbroker.spark.source import FqRange, split  # noqa: E402
from tests.spark.conftest import FqBroker, publish, run_query, start_fqd, stop_fqd  # noqa: E402

pytestmark = pytest.mark.spark


def test_source_defaults_follow_kafka() -> None:
    stream = SourceOptions.parse({"queue": "q"}, streaming=True)
    batch = SourceOptions.parse({"queue": "q"}, streaming=False)
    assert (stream.starting, batch.starting, batch.ending) == (
        Offsets(LATEST),
        Offsets(EARLIEST),
        Offsets(LATEST),
    )
    assert stream.broker.host == "127.0.0.1" and stream.broker.port == 8765
    assert stream.broker.user == "spark" and stream.program == "prefix:"
    assert stream.fail_on_data_loss and stream.max_offsets is None
    assert stream.checkpoint == "spark-q" and stream.partitions == 1


def test_source_options_are_read_whatever_their_case() -> None:
    from pyspark.sql.datasource import CaseInsensitiveDict  # what Spark hands the source

    given = {"queue": "q", "MAXOFFSETSPERTRIGGER": "7", "FailOnDataLoss": "False", "Port": "9"}
    opts = SourceOptions.parse(CaseInsensitiveDict(given), streaming=True)
    assert (opts.max_offsets, opts.fail_on_data_loss, opts.broker.port) == (7, False, 9)


@pytest.mark.parametrize(
    ("text", "seq"),
    [("earliest", EARLIEST), (" LATEST ", LATEST), ('{"q": 42}', 42), ('{"q": -2}', EARLIEST)],
)
def test_offsets(text: str, seq: int) -> None:
    assert Offsets.parse(text, "q", "startingOffsets") == Offsets(seq)


@pytest.mark.parametrize("text", ["", "first", '{"q": 0}', '{"q": -3}', '{"q": "1"}', "[1]"])
def test_bad_offsets(text: str) -> None:
    with pytest.raises(ValueError, match="startingOffsets"):
        Offsets.parse(text, "q", "startingOffsets")


def test_offsets_resolve() -> None:
    assert [Offsets(s).resolve(5, 9) for s in (EARLIEST, LATEST, 7)] == [5, 9, 7]


def test_topic_source_options() -> None:
    stream = SourceOptions.parse({"topic": "t", "startingOffsets": '{"t": 0}'}, streaming=True)
    assert (stream.topic, stream.queue, stream.name, stream.label) == ("t", "", "t", "topic 't'")
    assert stream.starting == Offsets(0) and stream.checkpoint == ""
    batch = SourceOptions.parse({"topic": "t"}, streaming=False)
    assert (batch.starting, batch.ending) == (Offsets(EARLIEST), Offsets(LATEST))


@pytest.mark.parametrize(
    ("given", "error"),
    [
        ({"topic": "t", "queue": "q"}, "not both"),
        ({}, "'queue' .* or 'topic'"),
        ({"topic": "t" * 128}, "'topic' is at most 127 bytes"),
        ({"topic": "t", "exchange": "x"}, "'exchange' is for queues"),
        ({"topic": "t", "checkpointName": "c"}, "'checkpointName' is for queues"),
        ({"topic": "t", "startingOffsets": '{"t": -3}'}, "indexes start at 0"),
        ({"topic": "t", "startingOffsets": '{"q": 3}'}, "startingOffsets"),
        ({"queue": "q", "startingOffsets": '{"q": 0}'}, "seqs start at 1"),
    ],
)
def test_bad_topic_source_options(given: dict[str, str], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        SourceOptions.parse(given, streaming=True)


def test_sink_needs_a_destination_and_a_payload() -> None:
    cols = {"exchange": "string", "route": "string", "payload": "binary"}
    assert SinkOptions.parse({}, cols).exchange == ""
    assert SinkOptions.parse({"route": "r"}, {**cols, "route": "int"}).route == "r"
    with pytest.raises(ValueError, match="'route'"):
        SinkOptions.parse({}, {**cols, "route": "int"})
    with pytest.raises(ValueError, match="'payload'"):
        SinkOptions.parse({}, {**cols, "payload": "int"})
    with pytest.raises(ValueError, match="'msgid' must be binary"):
        SinkOptions.parse({}, {**cols, "msgid": "string"})
    with pytest.raises(ValueError, match="over 127 bytes"):
        SinkOptions.parse({"exchange": "x" * 128}, cols)


@pytest.mark.parametrize(
    ("start", "end", "parts", "ranges"),
    [
        (1, 1, 4, []),
        (1, 2, 4, [(1, 2)]),
        (1, 11, 3, [(1, 4), (4, 7), (7, 11)]),
        (5, 9, 1, [(5, 9)]),
    ],
)
def test_split_is_contiguous_and_even(
    start: int, end: int, parts: int, ranges: list[tuple[int, int]]
) -> None:
    assert split("q", start, end, parts) == [FqRange("q", a, b) for a, b in ranges]


def test_split_of_a_topic_starts_at_index_0() -> None:
    assert split("t", 0, 3, 2, topic=True) == [FqRange("t", 0, 1, True), FqRange("t", 1, 3, True)]


def test_every_documented_option_is_known_where_it_applies() -> None:
    from fqbroker.spark.options import ANY, READ, STREAM, STREAM_WRITE, WRITE, check_names

    check_names({"queue": "q", "exchange": "x", "maxOffsetsPerTrigger": "1"}, frozenset({STREAM}))
    check_names({"queue": "q", "endingOffsets": "latest"}, frozenset({READ}))
    check_names({"exchange": "x", "route": "r"}, frozenset({WRITE}))
    check_names({"checkpointLocation": "/c", "ROUTE": "r"}, frozenset({STREAM_WRITE}))
    check_names({"waitForTopic": "true", "adminToken": "t"}, ANY)


@pytest.mark.parametrize(
    ("given", "uses", "error"),
    [
        ({"startingOffset": "1"}, "any", "did you mean 'startingOffsets'"),
        ({"zzz": "1"}, "any", "fq option 'zzz' is not known (options: host, port"),
        ({"subscribe": "t"}, "any", "use 'topic'"),
        ({"kafka.ssl.truststore.location": "f"}, "any", "no Kafka client settings"),
        ({"topic": "t"}, "write", "fq option 'topic' is Kafka's: use 'exchange'"),
        ({"endingOffsets": "latest"}, "stream", "'endingOffsets' is for batch reads"),
        ({"adminToken": "t"}, "write", "'adminToken' is for reading"),
        ({"exchange": "x"}, "read", "'exchange' is for streams (which bind the queue to it)"),
    ],
)
def test_check_names_refuses(given: dict[str, str], uses: str, error: str) -> None:
    from fqbroker.errors import SparkOptionError
    from fqbroker.spark.options import ANY, READ, STREAM, WRITE, check_names

    where = {"any": ANY, "read": frozenset({READ}), "stream": frozenset({STREAM})}
    with pytest.raises(SparkOptionError, match=re.escape(error)):
        check_names(given, where.get(uses, frozenset({WRITE})))


# --- refused options, as a user sees them through a SparkSession -----------------------------
#
# Spark wraps a data source's error in one of its own; what a user reads first (the last line
# of a failed script, the first of the exception's text) must be the option's name and the
# reason, not "Traceback (most recent call last):".


def first_line(exc: BaseException) -> str:
    line = str(exc).splitlines()[0]
    assert "Traceback" not in line, str(exc)
    return line


def load_error(reader: Any) -> str:
    """The first line of the error of ``reader.load()``, where Spark first asks the source."""
    with pytest.raises(Exception) as exc:
        reader.load()
    return first_line(exc.value)


def collect_error(reader: Any) -> str:
    """The first line of the error of a batch read's first action (its ``load()`` passes)."""
    df = reader.load()
    with pytest.raises(Exception) as exc:
        df.collect()
    return first_line(exc.value)


def start_error(spark: Any, options: dict[str, str], ckpt: Path) -> str:
    """The first line of the error of a stream that loads and starts, then fails."""
    df = spark.readStream.format("fq").options(**options).load()
    query = run_query(
        df.writeStream.format("noop").option("checkpointLocation", str(ckpt)), timeout=120
    )
    assert query.exception() is not None
    return first_line(query.exception())


@pytest.fixture(scope="module")
def present(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FqBroker]:
    """A broker keeping topics, with a queue ``optq`` and a topic ``optt`` of 5 messages."""
    conf = '[fqd]\nsegment_bytes = 16384\n[figg]\nlisten = "127.0.0.1:0"\n'
    broker = start_fqd(tmp_path_factory.mktemp("fqd-options"), conf_text=conf)
    try:
        broker.client.ensure_queue("optq", exchange="optx")
        publish(broker.port, [("optx", "r", b"m%d" % i) for i in range(5)])
        publish(broker.port, [("figg", "optt", b"m%d" % i) for i in range(5)])
        yield broker
    finally:
        stop_fqd(broker.proc)


KAFKA_NAMES = [
    ("subscribe", "news", "fq option 'subscribe': use 'topic'"),
    ("subscribePattern", "n.*", "fq option 'subscribepattern': not supported"),
    ("assign", '{"news": [0]}', "fq option 'assign': not supported"),
    ("kafka.bootstrap.servers", "h:9092", "fq option 'kafka.bootstrap.servers': use 'host'"),
    ("startingTimestamp", "1000", "fq option 'startingtimestamp': not supported"),
    ("startingOffsetsByTimestamp", "{}", "'startingoffsetsbytimestamp': not supported"),
    ("endingTimestamp", "1000", "fq option 'endingtimestamp': not supported"),
    ("minOffsetsPerTrigger", "10", "fq option 'minoffsetspertrigger': not supported"),
    ("maxTriggerDelay", "5m", "fq option 'maxtriggerdelay': not supported"),
    ("includeHeaders", "true", "fq option 'includeheaders': not supported"),
    ("groupIdPrefix", "g", "fq option 'groupidprefix': not supported"),
    ("kafka.group.id", "g", "fq option 'kafka.group.id': not supported"),
    ("kafka.security.protocol", "SSL", "fq option 'kafka.security.protocol': not supported"),
    ("minPartitions", "4", "fq option 'minpartitions': use 'numPartitions'"),
    ("failOnDataLos", "false", "fq option 'failondatalos' is not known; did you mean "
     "'failOnDataLoss'?"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "value", "error"), KAFKA_NAMES)
def test_unknown_and_kafka_options_are_refused_at_load(
    spark: Any, present: FqBroker, name: str, value: str, error: str
) -> None:
    options = present.options(queue="optq", **{name: value})
    assert error in load_error(spark.readStream.format("fq").options(**options))
    assert error in load_error(spark.read.format("fq").options(**options))


def test_a_misspelt_write_option_is_refused_at_save(spark: Any, present: FqBroker) -> None:
    df = spark.createDataFrame(
        [("optx", "r", b"p")], "exchange string, route string, payload binary"
    )
    writer = df.write.format("fq").options(**present.options(rout="r")).mode("append")
    with pytest.raises(Exception) as exc:
        writer.save()
    line = first_line(exc.value)
    assert "fq option 'rout' is not known; did you mean 'route'?" in line


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"queue": "optq", "route": "r"}, "fq option 'route' is for writing"),
        ({"queue": "nosuchq"}, "fq option 'queue': Cannot find registered queue 'nosuchq'"),
        ({"topic": "nosucht"}, "fq option 'topic': the broker at 127.0.0.1:"),
        ({"topic": "optt,nosucht"}, "has no topic 'nosucht'; set waitForTopic=true"),
        ({"queue": "optq", "waitForTopic": "true"}, "'waitForTopic' is for topics"),
        ({"queue": "optq", "startingOffsets": '{"optq": 4}', "endingOffsets": '{"optq": 2}'},
         "fq option 'startingOffsets' (4) is after 'endingOffsets' (2)"),
        ({"queue": "optq", "endingOffsets": "earliest"}, "'endingOffsets' cannot be earliest"),
    ],
)  # fmt: skip
def test_read_options_refused_at_load(
    spark: Any, present: FqBroker, options: dict[str, str], error: str
) -> None:
    line = load_error(spark.read.format("fq").options(**present.options(**options)))
    assert error in line, line


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"maxOffsetsPerTrigger": "3"}, "fq option 'maxOffsetsPerTrigger' is for streams"),
        ({"exchange": "optx"}, "fq option 'exchange' is for streams"),
        ({"checkpointName": "c"}, "fq option 'checkpointName' is for streams"),
        ({"startingOffsets": "latest"}, "'startingOffsets' cannot be latest in a batch read"),
        ({"startingOffsets": '{"optq": 100}'},
         "fq option 'startingOffsets': offset 100 is past the end of queue 'optq' (next "
         "offset 6)"),
    ],
)  # fmt: skip
def test_batch_read_options_refused_at_the_first_action(
    spark: Any, present: FqBroker, options: dict[str, str], error: str
) -> None:
    line = collect_error(
        spark.read.format("fq").options(**present.options(queue="optq", **options))
    )
    assert error in line, line


def test_a_past_the_end_batch_read_may_read_nothing(spark: Any, present: FqBroker) -> None:
    options = present.options(queue="optq", startingOffsets='{"optq": 100}', failOnDataLoss="false")
    assert spark.read.format("fq").options(**options).load().collect() == []


def test_a_missing_topic_is_refused_unless_waited_for(spark: Any, present: FqBroker) -> None:
    line = load_error(spark.readStream.format("fq").options(**present.options(topic="later")))
    assert "fq option 'topic': the broker at 127.0.0.1:" in line and "no topic 'later'" in line
    waiting = present.options(topic="later", waitForTopic="true")
    assert spark.read.format("fq").options(**waiting).load().collect() == []


def test_stream_options_refused_at_start(spark: Any, present: FqBroker, tmp_path: Path) -> None:
    ending = present.options(queue="optq", endingOffsets='{"optq": 3}')
    line = start_error(spark, ending, tmp_path / "a")
    assert "fq option 'endingOffsets' is for batch reads: a stream runs on" in line, line
    past = present.options(queue="optq", startingOffsets='{"optq": 100}')
    line = start_error(spark, past, tmp_path / "b")
    want = "fq option 'startingOffsets': offset 100 is past the end of queue 'optq' (next offset 6)"
    assert want in line, line


def test_sink_options_refused(spark: Any, present: FqBroker, tmp_path: Path) -> None:
    df = spark.createDataFrame([("r", b"p")], "route string, payload binary")
    for options, error in [
        ({"topic": "t"}, "fq option 'topic' is Kafka's: use 'exchange'"),
        ({"queue": "q"}, "fq option 'queue' is for reading"),
        ({"startingOffsets": "earliest"}, "fq option 'startingOffsets' is for reading"),
        ({"checkpointLocation": str(tmp_path)}, "'checkpointLocation' is Spark's own, for "),
    ]:
        writer = df.write.format("fq").options(**present.options(exchange="optx", **options))
        with pytest.raises(Exception) as exc:
            writer.mode("append").save()
        assert error in first_line(exc.value), exc.value
    with pytest.raises(Exception) as exc:
        df.write.format("fq").options(**present.options(exchange="optx")).mode("append").save(
            "some/where"
        )
    assert "fq option 'path': not supported: fq takes no path" in first_line(exc.value)
