"""Several topics in one query, without Spark: the topic list, the offset JSON of each
topic, old single-topic checkpoints, and maxOffsetsPerTrigger shared among the topics."""

from __future__ import annotations

import pytest

from tests.prereqs import require_module

require_module("pyspark", "the spark extra is not installed (`make spark`)")
require_module("pyarrow", "the spark extra is not installed (`make spark`)")

from fqbroker.clients.http.replay import QueueInfo  # noqa: E402
from fqbroker.spark.options import EARLIEST, LATEST, Offsets, SourceOptions, topic_list  # noqa: E402
from fqbroker.spark.source import DataLossError, FqRange, plan, share  # noqa: E402

pytestmark = pytest.mark.spark


def topics(*, streaming: bool = True, **options: str) -> SourceOptions:
    return SourceOptions.parse({"topic": "news,small", **options}, streaming=streaming)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("news", ("news",)),
        ("news,small", ("news", "small")),
        (" news , small ,", ("news", "small")),
        ("news,small,news", ("news", "small")),
        (",", ()),
    ],
)
def test_topic_list_is_comma_separated_as_kafka_subscribe(
    text: str, names: tuple[str, ...]
) -> None:
    assert topic_list(text) == names


def test_options_of_two_topics() -> None:
    opts = topics()
    assert opts.topics == ("news", "small") and opts.names == ("news", "small")
    assert opts.topic == "news,small" and opts.queue == "" and opts.checkpoint == ""
    assert opts.label == "topic 'news', topic 'small'"
    single = SourceOptions.parse({"topic": "news"}, streaming=True)
    assert (single.names, single.name, single.label) == (("news",), "news", "topic 'news'")
    queue = SourceOptions.parse({"queue": "q"}, streaming=True)
    assert (queue.topics, queue.names, queue.label) == ((), ("q",), "queue 'q'")


def test_offsets_json_gives_each_topic() -> None:
    opts = topics(
        streaming=False, startingOffsets='{"news": 120, "small": -2}', endingOffsets="latest"
    )
    assert [opts.starting.at(t) for t in opts.topics] == [Offsets(120), Offsets(EARLIEST)]
    assert opts.ending.at("small") == Offsets(LATEST)
    assert opts.starting.at("news").resolve(0, 200) == 120
    assert opts.starting.at("small").resolve(3, 9) == 3
    # One topic's JSON is what it always was.
    assert Offsets.parse('{"news": 7}', ("news",), "startingOffsets", least=0) == Offsets(7)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{"news": 1}', r'JSON like \{"news": 42, "small": 42\}'),  # every topic, as Kafka's
        ('{"news": 1, "small": 2, "other": 3}', "JSON like"),
        ('{"news": 1, "small": "2"}', "JSON like"),
        ('{"news": 1, "small": -3}', "indexes start at 0"),
    ],
)
def test_bad_offsets_json_of_two_topics(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        topics(startingOffsets=text)


@pytest.mark.parametrize(
    ("given", "error"),
    [
        ({"topic": "news,small", "queue": "q"}, "not both"),
        ({"topic": " , "}, "'topic' .* is required"),
        ({"topic": "news," + "t" * 128}, "'topic' is at most 127 bytes"),
    ],
)
def test_bad_topic_lists(given: dict[str, str], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        SourceOptions.parse(given, streaming=True)


@pytest.mark.parametrize(
    ("limit", "wants", "got"),
    [
        (10, {"a": 100, "b": 100}, {"a": 5, "b": 5}),
        (10, {"a": 1000, "b": 1}, {"a": 9, "b": 1}),  # a busy topic holds back no other
        (10, {"a": 3, "b": 4}, {"a": 3, "b": 4}),
        (10, {"a": 0, "b": 50}, {"a": 0, "b": 10}),
        (11, {"a": 100, "b": 100, "c": 2}, {"a": 5, "b": 4, "c": 2}),
        (7, {"a": 100, "b": 100, "c": 100}, {"a": 3, "b": 2, "c": 2}),
        (1, {"a": 5, "b": 5}, {"a": 1, "b": 0}),
        (0, {"a": 5}, {"a": 0}),
    ],
)
def test_share_is_max_min_fair_and_adds_up_to_the_limit(
    limit: int, wants: dict[str, int], got: dict[str, int]
) -> None:
    assert share(limit, wants) == got
    assert sum(got.values()) == min(limit, sum(wants.values()))


def test_share_rotates_units_too_few_to_go_round() -> None:
    wants = {"a": 5, "b": 5, "c": 5}
    firsts = [next(t for t, n in share(1, wants, turn).items() if n) for turn in range(3)]
    assert firsts == ["a", "b", "c"]


def test_plan_shares_the_limit_and_keeps_each_topic_offset() -> None:
    infos = {"news": QueueInfo(0, 500), "small": QueueInfo(0, 7)}
    start = {"news": 100, "small": 2}
    assert plan(topics(), start, infos) == {"news": 500, "small": 7}
    assert plan(topics(), start, infos, limit=10) == {"news": 105, "small": 7}
    assert plan(topics(), start, infos, limit=10, target={"news": 102, "small": 7}) == {
        "news": 102,
        "small": 7,
    }
    # Nothing new: the end is the start, and Spark runs no batch.
    caught_up = {"news": 500, "small": 7}
    assert plan(topics(), caught_up, infos, limit=10) == caught_up


def test_plan_reads_an_old_single_topic_checkpoint_and_adds_a_new_topic() -> None:
    infos = {"news": QueueInfo(0, 150), "small": QueueInfo(4, 9)}
    single = SourceOptions.parse({"topic": "news"}, streaming=True)
    assert plan(single, {"news": 120}, infos) == {"news": 150}
    # The same checkpoint under a longer list: "small" joins at its earliest index and is
    # read from the next batch on (the joining batch reads none of it: see partitions).
    end = plan(topics(), {"news": 120}, infos)
    assert end == {"news": 150, "small": 4}
    assert plan(topics(), end, infos) == {"news": 150, "small": 9}
    # A topic dropped from the list is dropped from the offsets.
    assert plan(single, {"news": 150, "small": 9}, infos) == {"news": 150}


def test_plan_past_a_topic_end_fails_or_waits() -> None:
    infos = {"news": QueueInfo(0, 10), "small": QueueInfo(0, 3)}
    with pytest.raises(DataLossError, match="topic 'small' ends at 3"):
        plan(topics(), {"news": 0, "small": 8}, infos)
    lenient = topics(failOnDataLoss="false")
    assert plan(lenient, {"news": 0, "small": 8}, infos) == {"news": 10, "small": 8}


def test_plan_after_retention_fails_or_skips() -> None:
    infos = {"news": QueueInfo(50, 60), "small": QueueInfo(0, 3)}
    with pytest.raises(DataLossError, match="offsets 10 to 49 of topic 'news'"):
        plan(topics(), {"news": 10, "small": 0}, infos)
    lenient = topics(failOnDataLoss="false")
    assert plan(lenient, {"news": 10, "small": 0}, infos, limit=4) == {"news": 52, "small": 2}


def test_partitions_one_per_topic_at_least() -> None:
    from fqbroker.spark.source import FqStreamReader

    reader = FqStreamReader(topics(numPartitions="2"))
    parts = reader.partitions({"news": 100, "small": 2}, {"news": 104, "small": 3})
    assert parts == [
        FqRange("news", 100, 102, True),
        FqRange("news", 102, 104, True),
        FqRange("small", 2, 3, True),
    ]
    # A topic joining in this batch brings no rows until the next.
    assert reader.partitions({"news": 100}, {"news": 101, "small": 4}) == [
        FqRange("news", 100, 101, True)
    ]


def test_queue_checkpoint_of_another_source_is_refused() -> None:
    from fqbroker.spark.source import FqStreamReader

    reader = FqStreamReader(SourceOptions.parse({"queue": "q"}, streaming=True))
    with pytest.raises(ValueError, match="are not for queue 'q'"):
        reader.partitions({"other": 1}, {"other": 2})
