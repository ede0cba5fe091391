"""The ``cluster`` fixture of the peering tests (the brokers are in cluster.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.peering.cluster import Cluster
from tests.procs import Proc


@pytest.fixture
def cluster(tmp_path: Path, procs: list[Proc]) -> Cluster:
    return Cluster(tmp_path, procs)
