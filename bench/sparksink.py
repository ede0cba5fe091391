"""The Spark sink's throughput with and without de-duplication ids, in one table.

    python -m bench.sparksink [--rows N] [--runs R] [--payload BYTES] [--partitions P]

One fqd process (this checkout, its data in a temporary directory) with a permanent disk
queue bound to the exchange written to, and one ``local[2]`` SparkSession. Each run writes
``rows`` rows with ``df.write.format("fq")``, ``dedup`` true (ids derived per row, the
connection opted in, each queue's window checked and filled) and false (at least once),
interleaved (ABBA, after one warm-up run of each), the write's wall time measured around
``save()``; the table gives each column's median rows/s, the ratio, and the broker
process's CPU time a row (user and system, from /proc), which other load on the machine
disturbs less than the wall time. What the broker did is checked after each run: the
queue grew by exactly ``rows``.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fqbroker.clients.http.replay import ReplayClient

ROOT = Path(__file__).resolve().parents[1]
QUEUE = "bench-sink"


def start_fqd(state: Path) -> tuple[subprocess.Popen[bytes], int]:
    log = (state / "fqd.log").open("wb")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fqbroker", "-p", "0", "-n", "10.254.254.1",
         "-c", str(state / "fqd.sqlite"), "-q", str(state / "queues")],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, cwd=ROOT,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while (m := re.search(rb"Listening on port: (\d+)", (state / "fqd.log").read_bytes())) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"fqd did not start: {(state / 'fqd.log').read_text()[-2000:]}")
        time.sleep(0.05)
    return proc, int(m.group(1))


def spark_session() -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYTHONPATH"] = str(ROOT)
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("bench-sparksink")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def write(spark: Any, port: int, rows: int, payload: int, partitions: int, dedup: bool) -> float:
    df = spark.range(0, rows, 1, partitions).selectExpr(
        f"concat(CAST(id AS STRING), repeat('x', {payload})) AS payload"
    )
    df = df.cache()
    df.count()  # the rows made before the clock starts: the write alone is timed
    writer = df.write.format("fq").options(
        host="127.0.0.1", port=str(port), exchange=QUEUE, route="r", dedup=str(dedup).lower()
    )
    start = time.perf_counter()
    writer.mode("append").save()
    seconds = time.perf_counter() - start
    df.unpersist()
    return seconds


def main(argv: list[str]) -> int:
    from fqbroker.spark import FqDataSource

    p = argparse.ArgumentParser(prog="python -m bench.sparksink", description=__doc__)
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--runs", type=int, default=3, help="interleaved runs per column (median)")
    p.add_argument("--payload", type=int, default=100, help="payload bytes a row, about")
    p.add_argument("--partitions", type=int, default=2)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-sparksink-") as tmp:
        proc, port = start_fqd(Path(tmp))
        try:
            client = ReplayClient(port=port)
            client.ensure_queue(QUEUE, exchange=QUEUE)
            spark = spark_session()
            spark.dataSource.register(FqDataSource)
            for dedup in (False, True):  # warm up: the JVM, the workers, the broker
                write(spark, port, args.rows, args.payload, args.partitions, dedup)
            times: dict[bool, list[float]] = {True: [], False: []}
            cpu: dict[bool, list[float]] = {True: [], False: []}  # the broker's, a row
            for run in range(args.runs):
                # ABBA: neither column always goes first.
                for dedup in (False, True) if run % 2 == 0 else (True, False):
                    before = client.info(QUEUE).next
                    used = cpu_seconds(proc.pid)
                    seconds = write(spark, port, args.rows, args.payload, args.partitions, dedup)
                    cpu[dedup].append((cpu_seconds(proc.pid) - used) / args.rows)
                    grew = client.info(QUEUE).next - before
                    if grew != args.rows:
                        raise SystemExit(f"the queue grew by {grew}, not {args.rows}")
                    times[dedup].append(seconds)
                    print(f"dedup={dedup}: {args.rows / seconds:,.0f} rows/s", file=sys.stderr)
            spark.stop()
        finally:
            proc.terminate()
            proc.wait(30)
    plain = args.rows / statistics.median(times[False])
    once = args.rows / statistics.median(times[True])
    plain_cpu = statistics.median(cpu[False]) * 1e6
    once_cpu = statistics.median(cpu[True]) * 1e6
    print(f"Spark sink, local[2], {args.rows:,} rows of ~{args.payload} B into a disk queue,")
    print(f"{args.partitions} partitions, median of {args.runs} interleaved runs")
    print()
    print("| sink | rows/s | relative | broker CPU us/row |")
    print("|---|---|---|---|")
    print(f"| dedup = false (at least once) | {plain:,.0f} | 1.00 | {plain_cpu:.2f} |")
    print(
        f"| dedup = true (ids, exactly once) | {once:,.0f} | {once / plain:.2f} | {once_cpu:.2f} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
