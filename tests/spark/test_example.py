"""The example pipeline (examples/spark/route_stats.py) on a small input, output checked;
and stopped with Ctrl-C as the README says, with one line."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.procs import ENV, ROOT
from tests.spark.conftest import QUERY_TIMEOUT, FqBroker, publish

pytestmark = pytest.mark.spark


def load_example() -> ModuleType:
    path = ROOT / "examples" / "spark" / "route_stats.py"
    spec = importlib.util.spec_from_file_location("route_stats", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_route_stats_counts_messages_and_bytes_per_route_and_minute(
    spark: Any, fq: FqBroker, tmp_path: Path
) -> None:
    example = load_example()
    sizes = {"web.a": (3, 10), "web.b": (5, 20), "db": (2, 7)}  # route: (messages, bytes each)
    # The queue a first run would have made: what is published before the run is counted.
    fq.client.ensure_queue("stats-route-stats", exchange="stats")
    publish(
        fq.port,
        [("stats", route, b"x" * size) for route, (n, size) in sizes.items() for _ in range(n)],
    )
    args = example.parse_args(
        ["--port", str(fq.port), "--exchange", "stats", "--available-now", "--max-per-batch", "4",
         "--output", str(tmp_path / "out"), "--checkpoint", str(tmp_path / "ckpt")]
    )  # fmt: skip
    query = example.start(spark, args)
    assert query.awaitTermination(QUERY_TIMEOUT)
    assert query.exception() is None
    assert len(list((tmp_path / "out").glob("batch=*"))) == 3  # 10 messages, 4 a batch

    rows = example.totals(spark, str(tmp_path / "out")).collect()
    per_route: dict[str, list[int]] = {}
    for row in rows:
        assert row.exchange == "stats"
        assert (row.minute.second, row.minute.microsecond) == (0, 0)
        counts = per_route.setdefault(row.route, [0, 0])
        counts[0] += row.messages
        counts[1] += row.bytes
    assert per_route == {route: [n, n * size] for route, (n, size) in sizes.items()}


def test_route_stats_stops_on_ctrl_c_with_one_line(fq: FqBroker, tmp_path: Path) -> None:
    # As the README runs it, in a process group of its own that gets the SIGINT a
    # terminal's Ctrl-C sends (Spark's JVM, started by pyspark, ignores it).
    err_path = tmp_path / "stderr"
    checkpoint = tmp_path / "ckpt"
    env = {**ENV, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    with err_path.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "examples" / "spark" / "route_stats.py"),
             "--port", str(fq.port), "--exchange", "ctrl-c", "--trigger-seconds", "1",
             "--output", str(tmp_path / "out"), "--checkpoint", str(checkpoint)],
            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + QUERY_TIMEOUT
        while not (checkpoint / "metadata").exists():  # the query has started
            assert proc.poll() is None, err_path.read_text()
            assert time.monotonic() < deadline, err_path.read_text()
            time.sleep(0.2)
        time.sleep(2)  # a trigger or two
        before = err_path.stat().st_size
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    everything = err_path.read_text(errors="replace")
    # The example registers "fq" only where Spark did not find it itself (here it does).
    assert "replaced a statically registered" not in everything, everything
    after = err_path.read_bytes()[before:].decode(errors="replace")
    # What a terminal shows: a progress bar redrawn with \r leaves its last state only.
    lines = [s for line in after.split("\n") if (s := line.split("\r")[-1].strip())]
    assert "Traceback" not in after and "Exception" not in after, after
    assert len(lines) <= 3, after
    assert lines[-1].startswith("route_stats: stopped (Ctrl-C)"), after


def test_route_stats_stops_on_ctrl_c_before_its_query_runs(fq: FqBroker, tmp_path: Path) -> None:
    # Ctrl-C while the SparkSession starts: one line, no KeyboardInterrupt traceback.
    err_path = tmp_path / "stderr"
    env = {**ENV, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    with err_path.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "examples" / "spark" / "route_stats.py"),
             "--port", str(fq.port), "--exchange", "ctrl-c-early",
             "--output", str(tmp_path / "out"), "--checkpoint", str(tmp_path / "ckpt")],
            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + QUERY_TIMEOUT
        while b"log4j" not in err_path.read_bytes():  # Spark's JVM is starting
            assert proc.poll() is None, err_path.read_text()
            assert time.monotonic() < deadline, err_path.read_text()
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = err_path.read_text(errors="replace")
    lines = [s for line in text.split("\n") if (s := line.split("\r")[-1].strip())]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert lines[-1].startswith("route_stats: "), text
    assert code in (0, 1), text  # 1: interrupted while starting; 0: it had started already
