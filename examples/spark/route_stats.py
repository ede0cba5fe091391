"""Per-route message counts and payload bytes per minute, from a live fq exchange to Parquet.

    python examples/spark/route_stats.py --port 8765 --exchange logs \\
        --output out/route_stats --checkpoint out/route_stats.ckpt

The source keeps a permanent disk queue (``--queue``, default ``<exchange>-route-stats``)
bound to the exchange, so messages published while the job is down are counted when it
comes back. Each micro-batch's counts go to their own directory ``batch=<id>`` under
``--output``, replaced whole if Spark runs that batch again after a failure, so totals
never count a message twice; ``--show`` (or :func:`totals`) sums them per minute and
route. ``--available-now`` processes what is there and stops, for cron-style runs.

The first run creates the queue, so what was published before it is not counted. To count
from a known moment, create the queue (and its binding) first; this starts no Spark session::

    python examples/spark/route_stats.py --port 8765 --exchange logs --create-queue

See docs/spark-cluster.md for running it with spark-submit on a standalone cluster.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from fqbroker.clients.http.replay import ReplayClient
from fqbroker.errors import BrokerError
from fqbroker.spark import FqDataSource


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--host", default="127.0.0.1", help="fqbroker host")
    p.add_argument("--port", type=int, default=8765, help="fqbroker port")
    p.add_argument("--exchange", required=True, help="exchange to count")
    p.add_argument("--queue", help="disk queue the source keeps (default <exchange>-route-stats)")
    p.add_argument("--output", help="Parquet output directory (shared storage on a cluster)")
    p.add_argument("--checkpoint", help="Spark checkpoint directory (durable, shared)")
    p.add_argument("--max-per-batch", type=int, default=100_000, help="maxOffsetsPerTrigger")
    p.add_argument("--trigger-seconds", type=int, default=10, help="micro-batch interval")
    p.add_argument("--available-now", action="store_true", help="process the backlog, then stop")
    p.add_argument("--show", action="store_true", help="print the totals at the end")
    p.add_argument(
        "--create-queue",
        action="store_true",
        help="create the queue and bind it to the exchange, then exit (before traffic)",
    )
    args = p.parse_args(argv)
    args.queue = args.queue or f"{args.exchange}-route-stats"
    if not args.create_queue and not (args.output and args.checkpoint):
        p.error("--output and --checkpoint are needed (unless --create-queue)")
    return args


def create_queue(args: argparse.Namespace) -> None:
    """The queue and binding the source would make on its first run, made now: messages
    published from here on are counted, and none are consumed meanwhile."""
    try:
        ReplayClient(args.host, args.port).ensure_queue(args.queue, exchange=args.exchange)
    except (OSError, BrokerError) as exc:
        raise SystemExit(f"route_stats: {exc}") from None


def route_stats(messages: DataFrame) -> DataFrame:
    """Counts and payload bytes per (minute of broker arrival, exchange, route)."""
    return messages.groupBy(
        F.date_trunc("minute", "timestamp").alias("minute"), "exchange", "route"
    ).agg(F.count("*").alias("messages"), F.sum(F.length("payload")).alias("bytes"))


def start(spark: SparkSession, args: argparse.Namespace) -> Any:
    """Start the streaming query; returns the StreamingQuery."""
    messages = (
        spark.readStream.format("fq")
        .option("host", args.host)
        .option("port", args.port)
        .option("exchange", args.exchange)
        .option("queue", args.queue)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", args.max_per_batch)
        .load()
    )
    output = args.output.rstrip("/")

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        route_stats(batch).write.mode("overwrite").parquet(f"{output}/batch={batch_id}")

    writer = (
        messages.writeStream.foreachBatch(write_batch)
        .option("checkpointLocation", args.checkpoint)
        .queryName("fq-route-stats")
    )
    if args.available_now:
        return writer.trigger(availableNow=True).start()
    return writer.trigger(processingTime=f"{args.trigger_seconds} seconds").start()


def run_until_interrupted(query: Any) -> bool:
    """Wait for the query to end; True if Ctrl-C (SIGINT) ended the wait instead.

    The signal only sets a flag: raised inside py4j's read (what pyspark's own handler
    does) it leaves pages of traceback and a gateway mid-answer. The wait polls
    once a second so the flag is seen; a second Ctrl-C interrupts at once."""
    interrupted = threading.Event()

    def on_sigint(signum: int, frame: object) -> None:
        interrupted.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        while not interrupted.is_set():
            if query.awaitTermination(1):
                return False
    finally:
        signal.signal(signal.SIGINT, previous)
    return True


def stop_between_batches(query: Any, wait: float = 30.0) -> None:
    """Stop the query while it waits for its next trigger: interrupted inside one, Spark
    prints pages of Java stack on its way out."""
    deadline = time.monotonic() + wait
    while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.05)
    query.stop()


def totals(spark: SparkSession, output: str) -> DataFrame:
    """The batches' counts summed: one row per minute, exchange and route."""
    return (
        spark.read.parquet(output)
        .groupBy("minute", "exchange", "route")
        .agg(F.sum("messages").alias("messages"), F.sum("bytes").alias("bytes"))
        .orderBy("minute", "exchange", "route")
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.create_queue:
        create_queue(args)
        print(f"queue {args.queue} is bound to exchange {args.exchange}")
        return
    spark = SparkSession.builder.appName("fq-route-stats").getOrCreate()
    # Not needed where pyspark_fqbroker is installed (Spark finds "fq" itself); harmless.
    spark.dataSource.register(FqDataSource)
    query = start(spark, args)
    if run_until_interrupted(query):
        spark.sparkContext.setLogLevel("ERROR")  # its warnings about stopping: we mean to
        stop_between_batches(query)
        spark.stop()
        print("route_stats: stopped (Ctrl-C); run it again to go on from the checkpoint",
              file=sys.stderr)  # fmt: skip
        return
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    if args.show:
        totals(spark, args.output).show(100, truncate=False)
    spark.stop()


if __name__ == "__main__":
    main()
