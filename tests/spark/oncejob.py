"""A batch write through the fq sink in a Spark of its own, ``local[2,4]`` (four attempts
per task, where the shared session of these tests, local[2], gives one) or the master
``ONCE_MASTER`` names. Run by test_sink_once*.py as ``python -m tests.spark.oncejob PORT
EXCHANGE ROWS FAIL_PARTITION FAIL_ROW [option=value ...]``; the partition FAIL_PARTITION
raises at row FAIL_ROW of its first attempt (-1: none does), after its earlier rows were
published."""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> None:
    port, exchange, rows, fail_partition, fail_row = argv[:5]
    options = dict(arg.split("=", 1) for arg in argv[5:])
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark import TaskContext
    from pyspark.sql import SparkSession
    from pyspark.sql.functions import udf

    spark = (
        SparkSession.builder.master(os.environ.get("ONCE_MASTER", "local[2,4]"))
        .appName("fqbroker-once")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "1g")
        # Small Arrow batches: the sink publishes (and flushes) each before the next, so a
        # task that fails halfway has published its first rows.
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    failing, at = int(fail_partition), int(fail_row)

    @udf("string")
    def payload(n: int) -> str:
        context = TaskContext.get()
        if (
            context is not None
            and context.partitionId() == failing
            and context.attemptNumber() == 0
            and n % (1 << 20) == at
        ):
            raise RuntimeError(f"a forced failure at row {n} of the first attempt")
        return f"{n:08d}" + "x" * 200

    # Row n of partition p is id p << 20 | n, so the UDF knows its row by the id alone.
    quarter = int(rows) // 4
    df = spark.range(0, 4 * quarter, 1, 4).selectExpr(
        f"'{exchange}' AS exchange",
        "'r' AS route",
        f"(CAST(id DIV {quarter} AS BIGINT) * 1048576 + id % {quarter}) AS key",
    )
    df = df.select("exchange", "route", payload("key").alias("payload"))
    writer = df.write.format("fq").option("host", "127.0.0.1").option("port", port)
    writer.options(**options).mode("append").save()
    spark.stop()
    print("fq sink: the write succeeded", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
