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
from fqbroker.spark import register

STOP_MARGIN = 0.3  # seconds: the least time left before a trigger to stop the query in


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


class CtrlC:
    """Ctrl-C (SIGINT) as a flag, from :meth:`arm` on.

    Raised inside py4j's read (what pyspark's own handler does), or while pyspark waits for
    its JVM to start, the interrupt leaves pages of Python and Java traceback and a gateway
    mid-answer; a flag is seen between steps instead. A second Ctrl-C interrupts at once."""

    def __init__(self) -> None:
        self.pressed = threading.Event()

    def arm(self) -> None:
        if not self.pressed.is_set():
            signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum: int, frame: object) -> None:
        self.pressed.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)


def run_until_interrupted(query: Any, ctrl_c: CtrlC) -> bool:
    """Wait for the query to end; True if Ctrl-C ended the wait instead. The wait polls
    once a second so the flag is seen."""
    ctrl_c.arm()
    while not ctrl_c.pressed.is_set():
        if query.awaitTermination(1):
            return False
    return True


def stop_between_batches(query: Any, every: float | None = None, wait: float = 30.0) -> None:
    """Stop the query while it waits for its next trigger: interrupted inside one, Spark
    prints pages of Java stack on its way out.

    Seeing the query idle and stopping it are two calls, and a trigger may start between
    them. With a processing-time trigger (``every`` seconds) Spark starts triggers at
    multiples of the interval since the epoch, so stopping only well before the next one
    closes that window."""
    deadline = time.monotonic() + wait
    while query.isActive and time.monotonic() < deadline:
        soon = every is not None and every - time.time() % every < STOP_MARGIN
        if not soon and not query.status["isTriggerActive"]:
            break
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
    ctrl_c = CtrlC()
    ctrl_c.arm()
    spark = SparkSession.builder.appName("fq-route-stats").getOrCreate()
    ctrl_c.arm()  # again: the SparkContext installs a handler of its own
    if ctrl_c.pressed.is_set():
        spark.stop()
        raise SystemExit("route_stats: stopped (Ctrl-C) before the query started")
    # Spark finds "fq" itself where pyspark_fqbroker is installed; this covers the rest.
    register(spark)
    query = start(spark, args)
    if run_until_interrupted(query, ctrl_c):
        spark.sparkContext.setLogLevel("ERROR")  # its warnings about stopping: we mean to
        stop_between_batches(query, None if args.available_now else args.trigger_seconds)
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
    try:
        main()
    except KeyboardInterrupt:
        # Ctrl-C before the query runs, or a second one while it stops: Spark goes with
        # this process, and the traceback would only show where Python was waiting.
        raise SystemExit("route_stats: interrupted (Ctrl-C)") from None
