"""The README's Spark cluster recipe, run as written on a standalone cluster on 127.0.0.1.

A Spark master and one worker (``spark-class`` from the pyspark install, as a pip user
without a Spark distribution starts them) and the recipe's own commands, taken from the
README's "Running on a cluster" block: fqd, the example's ``--create-queue``, fq-send and
``spark-submit``. Only the example names in the block are replaced (``/opt/fqenv`` by this
venv, the hosts and ``0.0.0.0`` by 127.0.0.1, the port by a free one, ``/var/lib/fqbroker``
and ``/shared`` by temporary directories); the variables the recipe exports are not given
to it in advance. The cluster's own settings (small memory, no UIs) come from a
spark-defaults.conf in ``SPARK_CONF_DIR``, as an operator's would.

Messages published before the queue exists must not be counted, those published after
must be, exactly; a second ``spark-submit``, as cron would run it, must resume from the
shared checkpoint and add only what came since. Like the other Spark tests it skips
without Java or the spark extra, and fails instead when ``CI`` is set.
"""

from __future__ import annotations

import re
import socket
import sys
from pathlib import Path

import pytest

from tests.prereqs import missing, require_module
from tests.procs import ROOT
from tests.spark.cluster import START_TIMEOUT, Procs, cluster_env, free_port, wait_for
from tests.spark.conftest import java_problem, publish

pytestmark = pytest.mark.spark

SUBMIT_TIMEOUT = 120.0  # one spark-submit (~20 s here); two fit in pytest's 300 s
README_VENV = "/opt/fqenv"


def recipe() -> list[str]:
    """The commands of the README's cluster block, continuation lines joined."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Running on a cluster") :]
    section = section[: section.index("\n## ")]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the cluster section should have one sh block, the recipe"
    commands = []
    for line in blocks[0].replace("\\\n", " ").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            commands.append(" ".join(line.split()))
    return commands


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def test_readme_cluster_recipe_on_a_standalone_master_and_worker(
    tmp_path: Path, procs: Procs
) -> None:
    require_module("pyspark", "the spark extra is not installed (`make spark`)")
    require_module("pyarrow", "the spark extra is not installed (`make spark`)")
    problem = java_problem()
    if problem:
        missing(f"Spark needs Java 17+ ({problem}); `make java` installs it")
    venv = Path(sys.prefix)
    for tool in ("spark-class", "spark-submit", "fqd", "fq-send", "python"):
        if not (venv / "bin" / tool).exists():
            missing(f"{venv}/bin/{tool} is missing: the recipe runs the venv's tools")

    # The cluster's own configuration, not the recipe's: small, quiet and on loopback.
    base = cluster_env(tmp_path, "spark.sql.shuffle.partitions 2")
    base["STATE_DIRECTORY"] = str(tmp_path / "state")  # nothing of fqd's in the checkout
    python = str(venv / "bin" / "python")
    daemon_env = base | {"PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python}
    master_url = procs.master(daemon_env)
    worker_log = procs.worker("worker", master_url, tmp_path / "work", 2, daemon_env)

    fq_port = free_port()
    names = {
        README_VENV: str(venv),
        "spark://spark-master.example.net:7077": master_url,
        "fq.example.net": "127.0.0.1",
        "0.0.0.0": "127.0.0.1",
        "8765": str(fq_port),
        "/var/lib/fqbroker": str(tmp_path / "fqd"),
        "/shared/": f"{tmp_path / 'shared'}/",
    }
    commands = recipe()
    for name in names:
        assert any(name in c for c in commands), f"{name} is no longer in the recipe"
    exports = ""
    steps, shown_out, submit = [], "", ""
    for i, command in enumerate(commands):
        for name, value in names.items():
            command = command.replace(name, value)
        if command.startswith("export "):
            exports += command + "\n"
        elif command.startswith(f"{venv}/bin/fqd "):
            (tmp_path / "fqd").mkdir()
            log = procs.start("fqd", ["bash", "-c", "exec " + command], base)
            wait_for("fqd", lambda: listening(fq_port), log, procs.started[-1])
            publish(fq_port, [("logs", "early", b"x")] * 4)  # no queue yet: not counted
            steps.append("fqd")
        elif "spark-submit" in command:
            # The worker must be up when the application asks for executors.
            wait_for(
                "the worker",
                lambda: "Successfully registered with master" in worker_log.read_text(),
                worker_log,
                procs.started[1],
            )
            submit = command
            shown_out = procs.run(f"step{i}", exports + command, base, SUBMIT_TIMEOUT)
            steps.append("spark-submit")
        else:
            procs.run(f"step{i}", exports + command, base, START_TIMEOUT)
            if "--create-queue" in command:
                publish(fq_port, [("logs", "app.db", b"y" * 7)] * 5)
                steps.append("create-queue")
            elif "fq-send" in command:
                steps.append("fq-send")
    assert steps == ["fqd", "create-queue", "fq-send", "spark-submit"], steps

    expected = {"app.web": [3, 2 + 3 + 4], "app.db": [5, 5 * 7]}
    check_counts(tmp_path / "shared" / "route_stats" / "out", shown_out, expected)

    # Run again, as cron would: it resumes from the shared checkpoint and adds only the new.
    publish(fq_port, [("logs", "app.db", b"y" * 7)] * 2)
    shown_out = procs.run("again", exports + submit, base, SUBMIT_TIMEOUT)
    expected["app.db"] = [7, 7 * 7]
    check_counts(tmp_path / "shared" / "route_stats" / "out", shown_out, expected)
    # The executors ran on the worker, not in the driver.
    assert list((tmp_path / "work").glob("app-*/*/stderr")), "no executor ran on the worker"


def check_counts(out: Path, shown_out: str, expected: dict[str, list[int]]) -> None:
    """Messages and bytes per route, exactly, in the Parquet files the executors wrote and
    in the table ``--show`` printed."""
    pq = require_module("pyarrow.parquet", "the spark extra is not installed")
    written: dict[str, list[int]] = {}
    for row in pq.read_table(out).to_pylist():
        assert row["exchange"] == "logs"
        counts = written.setdefault(row["route"], [0, 0])
        counts[0] += row["messages"]
        counts[1] += row["bytes"]
    assert written == expected
    shown: dict[str, list[int]] = {}
    for route, n, size in re.findall(r"\|logs\s*\|(\S+)\s*\|(\d+)\s*\|(\d+)\s*\|", shown_out):
        counts = shown.setdefault(route, [0, 0])
        counts[0] += int(n)
        counts[1] += int(size)
    assert shown == expected, shown_out[-3000:]
