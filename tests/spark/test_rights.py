"""The rights the fq source and sink need under ``auth = "password"``, as the README's Spark
section lists them: users holding exactly those rights read and write through Spark, and
users without one of them are refused with an error naming it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fqbroker.settings.broker import Settings
from fqbroker.storage.configdb.users import Users
from tests.conftest import root_and_bob
from tests.spark.conftest import FqBroker, run_query, start_fqd, stop_fqd
from tests.spark.test_topics import Sink

pytestmark = pytest.mark.spark

TOKEN = "spark-rights-token"
CONF = f"""[fqd]
auth = "password"
admin_token = "{TOKEN}"
segment_bytes = 16384
[figg]
listen = "127.0.0.1:0"
anonymous = true
"""
EXCHANGE, QUEUE, TOPIC = "sales", "sales-for-spark", "news"
# The README's lines, as an operator pastes them (fq-admin -c DB user allow NAME KIND PATTERN).
RIGHTS = {
    "writer": [("publish", EXCHANGE), ("publish", "figg"), ("queue", "q-*")],
    "reader": [("queue", QUEUE), ("consume", EXCHANGE), ("consume", TOPIC)],
    # Everything but the publish right, and everything but the queue the login needs.
    "nopublish": [("queue", "q-*")],
    "noqueue": [("publish", EXCHANGE)],
}


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FqBroker]:
    state = tmp_path_factory.mktemp("fqd-rights")
    root_and_bob(Settings(config_db=state / "fqd.sqlite", queue_dir=state / "queues"))
    users = Users(state / "fqd.sqlite")
    for name, rights in RIGHTS.items():
        users.add(name, f"{name}pw")
        for kind, pattern in rights:
            users.allow(name, kind, pattern)
    users.close()
    broker = start_fqd(state, conf_text=CONF)
    # The queue, private to the reader who creates it, as the source's first start does.
    login = {"user": "reader", "password": "readerpw", "exchange": EXCHANGE}
    broker.client.ensure_queue(QUEUE, **login)
    try:
        yield broker
    finally:
        stop_fqd(broker.proc)


def login(fq: FqBroker, user: str, **more: object) -> dict[str, str]:
    return fq.options(user=user, password=f"{user}pw", **more)


def write(spark: Any, fq: FqBroker, user: str, exchange: str, route: str, n: int) -> None:
    df = spark.range(0, n, 1, 2).selectExpr(
        f"'{exchange}' AS exchange", f"'{route}' AS route", "CAST(id AS STRING) AS payload"
    )
    df.write.format("fq").options(**login(fq, user)).mode("append").save()


def test_the_documented_rights_read_and_write(spark: Any, locked: FqBroker, tmp_path: Path) -> None:
    sink, ckpt = Sink(), tmp_path / "ckpt"

    def stream() -> Any:
        opts = login(locked, "reader", queue=QUEUE, exchange=EXCHANGE, adminToken=TOKEN)
        df = spark.readStream.format("fq").options(**opts, startingOffsets="earliest").load()
        writer = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(ckpt))
        query = run_query(writer)
        assert query.exception() is None, query.exception()

    stream()  # creates the queue and binds it, as the reader: nothing to read yet
    write(spark, locked, "writer", EXCHANGE, "r", 20)
    write(spark, locked, "writer", "figg", TOPIC, 5)  # a topic's messages: exchange figg
    stream()
    assert sorted(int(r[2]) for r in sink.rows()) == list(range(20))

    # Batch reads log in as the user alone: the queue right, and consume on the topic.
    queue = spark.read.format("fq").options(**login(locked, "reader", queue=QUEUE)).load()
    assert queue.count() == 20
    topic = spark.read.format("fq").options(**login(locked, "reader", topic=TOPIC)).load()
    assert sorted(int(r.payload) for r in topic.collect()) == list(range(5))


@pytest.mark.parametrize(
    ("user", "error"),
    [
        ("nopublish", "publish denied"),
        ("noqueue", "permission denied: queue q-"),
    ],
)
def test_the_sink_without_a_right_is_refused_naming_it(
    spark: Any, locked: FqBroker, user: str, error: str
) -> None:
    with pytest.raises(Exception, match="fq sink: publishing to") as exc:
        write(spark, locked, user, EXCHANGE, "r", 3)
    assert error in str(exc.value)


def test_a_batch_read_without_the_right_is_refused_naming_it(spark: Any, locked: FqBroker) -> None:
    opts = login(locked, "bob", topic=TOPIC)
    with pytest.raises(Exception, match="refused user 'bob' reading topic 'news'") as exc:
        spark.read.format("fq").options(**opts).load().collect()
    assert "needs the 'consume' right on 'news' (fq-admin user allow bob consume 'news')" in str(
        exc.value
    )


# Without Spark: what the source's driver and tasks do, with each right missing in turn.


def source(fq: FqBroker, user: str, **more: str) -> Any:
    from fqbroker.spark.options import SourceOptions

    return SourceOptions.parse(login(fq, user, **more), streaming=True)


def test_source_refusals_name_the_right(locked: FqBroker) -> None:
    from fqbroker.spark.source import FqBatchReader, FqStreamReader, read_range

    cases = [
        # (user, options, what the error must say)
        ("bob", {"queue": QUEUE}, "needs the 'queue' right on 'sales-for-spark'"),
        ("bob", {"topic": f"{TOPIC},other"}, "needs the 'consume' right on 'news'"),
    ]
    for user, more, error in cases:
        with pytest.raises(Exception, match=error):
            FqBatchReader(source(locked, user, **more)).partitions()
    # Moving the broker checkpoint (on a new query's start and every commit): admin.
    opts = source(locked, "reader", queue=QUEUE, checkpointName="spark-new")
    with pytest.raises(Exception, match=r"need the admin right .* or .* adminToken"):
        FqStreamReader(opts).initialOffset()
    # Creating and binding the queue: the queue right, then consume on the exchange.
    opts = source(locked, "nopublish", queue="other-q", exchange=EXCHANGE)
    with pytest.raises(Exception, match="permission denied: queue other-q"):
        FqStreamReader(opts).initialOffset()
    opts = source(locked, "reader", queue=QUEUE, exchange="other-x", adminToken=TOKEN)
    with pytest.raises(Exception, match="binding needs the 'consume' right on 'other-x'"):
        FqStreamReader(opts).initialOffset()
    # A task's read, when the rights changed under a running query.
    from fqbroker.spark.source import FqRange

    opts = source(locked, "bob", topic=TOPIC)
    with pytest.raises(Exception, match="needs the 'consume' right on 'news'"):
        list(read_range(opts, FqRange(TOPIC, 0, 1, True)))


def test_the_python_client_names_its_queue_as_docs_permissions_says(locked: FqBroker) -> None:
    # "queue q-*" lets a client that names no queue in, as docs/permissions.md says.
    from fqbroker.clients.fq.client import Client

    async def run() -> bytes:
        client = Client(port=locked.port, source="nopublish", password="nopublishpw")
        async with asyncio.timeout(10), client:
            await client.status()  # logged in, its queue attached
            return client.queue_field

    assert asyncio.run(run()).startswith(b"q-")
