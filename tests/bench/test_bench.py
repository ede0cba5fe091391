"""The bench suite still runs: every scenario once with tiny counts, fqbroker and the relay.

Speed itself is measured only by `make bench`, never asserted here.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.harness import ROOT, build_of, env_for
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
    table = run(["1to1-100", "disk", "latency", "memory", "idle", "lumberjack"], cfg)
    lines = table.splitlines()
    assert lines[0].startswith("scenario")
    for label in ("1 to 1, 100 B", "fsync=interval", "latency", "memory", "idle", "Lumberjack"):
        assert any(label in line for line in lines), (label, table)
    assert "no data" not in table


def test_bench_baseline_is_a_column_of_the_same_table() -> None:
    # This tree as its own baseline: the column and the ratio appear, figures for both.
    cfg = Config(runs=1, scale=0.001, peers=False, baseline=ROOT)
    table = run(["1to1-100"], cfg)
    head, _, row = table.splitlines()[:3]
    assert "| before " in head and "vs before" in head, table
    cells = [c.strip() for c in row.split("|")]
    assert cells[0] == "1 to 1, 100 B" and cells[3] not in ("", "-"), table
    # Which build each column measured, as fqd --version says it.
    build = build_of()
    assert f"\nfqbroker: {build} (fqd --version)\n" in table, table
    assert f"in the same runs; {build}\n" in table, table


def test_bench_says_which_build_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FQBROKER_PURE", "1")
    assert build_of(ROOT) == "pure Python: FQBROKER_PURE is set"
    monkeypatch.setenv("FQBROKER_PURE", "0")
    assert build_of(ROOT) == describe_child()


def describe_child() -> str:
    """What ``fqd --version`` of this tree says of its build (after the protocol's)."""
    done = subprocess.run(
        [sys.executable, "-m", "fqbroker", "--version"],
        env=env_for(ROOT), cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout.strip().split(", ", 2)[2].removesuffix(")")


def test_bench_figg_rows_run_tiny(capsys: pytest.CaptureFixture[str]) -> None:
    table = run(["figg"], Config(runs=1, scale=0.001, peers=False))
    for label in ("Figg publish", "Figg replay", "Figg live fan-out"):
        assert any(line.startswith(label) for line in table.splitlines()), (label, table)
    # Every message delivered, in offset order, or the run says so with a "!" line.
    assert "  ! figg" not in capsys.readouterr().out


def test_bench_fyrehose_rows_run_tiny(capsys: pytest.CaptureFixture[str]) -> None:
    """PUSH to DELIVER for 4 subscribers, then the same behind 5% loss each way: every
    message reaches every subscriber once (the lossy ones by REQUESTing their gaps), or
    the run says so with a "!" line."""
    table = run(["fyrehose"], Config(runs=1, scale=0.002, peers=False))
    lines = table.splitlines()
    lossless = next(line for line in lines if line.startswith("fyrehose PUSH to DELIVER"))
    assert "lost on loopback: 0 of" in lossless, table
    lossy = next(line for line in lines if line.startswith("fyrehose, 5% loss"))
    assert "recovered 100.0% of" in lossy, table
    assert "  ! fyrehose" not in capsys.readouterr().out


def test_bench_opencluster_rows_run_tiny(capsys: pytest.CaptureFixture[str]) -> None:
    """Pipelined SET then GET through the OpenCluster listener, every reply checked byte
    for byte by the generator, or the run says so with a "!" line. Redis is left out
    (peers=False): its column is measured by `make bench` only."""
    table = run(["opencluster"], Config(runs=1, scale=0.001, peers=False))
    rows = [line for line in table.splitlines() if line.startswith("OpenCluster")]
    labels = [row.split("|")[0].strip() for row in rows]
    assert [label.split(",")[0] for label in labels] == [
        "OpenCluster SET", "OpenCluster GET", "OpenCluster SET"
    ], table  # fmt: skip
    assert labels[0].endswith("sync=full") and labels[2].endswith("sync=normal"), table
    for row in rows:
        assert float(row.split("|")[1].strip().rstrip("k").replace(",", "")) > 0, table
    assert "  ! opencluster" not in capsys.readouterr().out
