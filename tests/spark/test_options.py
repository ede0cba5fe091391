"""Option parsing and range splitting of the fq data source: pure, no SparkSession."""

from __future__ import annotations

import pytest

from tests.prereqs import require_module

require_module("pyspark", "the spark extra is not installed (`make spark`)")
require_module("pyarrow", "the spark extra is not installed (`make spark`)")

from fqbroker.spark.options import EARLIEST, LATEST, Offsets, SinkOptions, SourceOptions  # noqa: E402
from fqbroker.spark.source import FqRange, split  # noqa: E402

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
