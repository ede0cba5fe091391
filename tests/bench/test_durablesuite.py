"""The durable rows run: fqbroker's confirmed publishes, and a row for each missing peer.

Speed itself is measured only by `make bench`, never asserted here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.durablesuite import durable_peers
from bench.suite import Config, run


def test_durable_row_runs_tiny(capsys: pytest.CaptureFixture[str]) -> None:
    table = run(["durable"], Config(runs=1, scale=0.01, peers=False))
    row = next(line for line in table.splitlines() if line.startswith("confirmed durable"))
    cells = [c.strip() for c in row.split("|")]
    assert cells[1].endswith("k") or cells[1].replace(",", "").isdigit(), table
    assert "fsync=always: confirmed once fsynced" in row, table
    # Every message confirmed and received once, in order, or the run says so.
    assert "  ! " not in capsys.readouterr().out


def test_a_missing_peer_is_a_row_that_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no server on it
    systems, notes = durable_peers()
    assert systems == []
    assert [n[0].strip() for n in notes] == ["rabbitmq classic", "rabbitmq quorum", "jetstream"]
    assert all(n[1].startswith("skipped: ") and "make bench-peers" in n[1] for n in notes)
