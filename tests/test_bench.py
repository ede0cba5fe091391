"""The bench suite still runs: every scenario once with tiny counts, fqbroker and the relay.

Speed itself is measured only by `make bench`, never asserted here.
"""

from __future__ import annotations

from bench.suite import Config, run


def test_bench_suite_runs_every_scenario_tiny() -> None:
    cfg = Config(
        runs=1,
        scale=0.001,
        peers=False,
        latency_seconds=0.3,
        idle_clients=10,
        idle_seconds=2.2,
    )
    table = run(["1to1-100", "disk", "latency", "memory", "idle"], cfg)
    lines = table.splitlines()
    assert lines[0].startswith("scenario")
    for label in ("1 to 1, 100 B", "fsync=interval", "latency", "memory", "idle"):
        assert any(label in line for line in lines), (label, table)
    assert "no data" not in table
