"""The example pipeline (examples/spark/route_stats.py) on a small input, output checked."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.procs import ROOT
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
