"""The fq sink exactly once on a standalone cluster: a master and two workers on
127.0.0.1, the write's broker killed (kill -9) and restarted under it, one worker killed
while its executor writes, and a partition that fails its first attempt: the queue holds
each row once, and the counts say what was sent again."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fqbroker.clients.http.replay import ReplayClient
from tests.prereqs import missing, require_module
from tests.spark.cluster import Procs, cluster_env, stop, wait_for
from tests.spark.conftest import FqBroker, java_problem, stop_fqd
from tests.spark.relay import RestartingRelay
from tests.spark.test_sink_once import ROWS, held, queue_stats, run_job

pytestmark = pytest.mark.spark


def test_a_cluster_write_survives_a_broker_restart_and_a_lost_worker_once(
    tmp_path: Path, procs: Procs, own_fq: Callable[..., FqBroker]
) -> None:
    require_module("pyspark", "the spark extra is not installed (`make spark`)")
    problem = java_problem()
    if problem:
        missing(f"Spark needs Java 17+ ({problem}); `make java` installs it")
    venv = Path(sys.prefix)
    python = str(venv / "bin" / "python")
    env = cluster_env(tmp_path) | {"PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python}
    master = procs.master(env)
    workers = []
    for i in (1, 2):
        log = procs.worker(f"worker{i}", master, tmp_path / f"work{i}", 1, env)
        workers.append((log, procs.started[-1]))
    for log, proc in workers:
        wait_for(
            "a worker", lambda log=log: "Successfully registered" in log.read_text(), log, proc
        )

    broker = own_fq()
    ReplayClient(port=broker.port).ensure_queue("cluster", exchange="cluster")
    brokers = [broker]

    def restart() -> int:
        stop_fqd(brokers[-1].proc, kill=True)
        brokers.append(own_fq(port=brokers[0].port))
        return brokers[-1].port

    relay = RestartingRelay(broker.port, 1 << 20, restart)
    lost = threading.Event()

    def lose_a_worker() -> None:
        # Once the restarted broker has taken another megabyte: the second worker goes,
        # with its executor and the task it runs.
        while not relay.tripped.is_set() or relay.sent < 2 << 20:
            if lost.is_set():
                return
            time.sleep(0.01)
        stop(workers[1][1])
        lost.set()

    killer = threading.Thread(target=lose_a_worker, daemon=True)
    killer.start()
    try:
        job = run_job(relay.port, "cluster", env=env | {"ONCE_MASTER": master})
    finally:
        lost.set()
        killer.join()
        relay.close()
    assert job.returncode == 0, job.stderr[-3000:]
    assert relay.tripped.is_set()
    assert workers[1][1].poll() is not None, "the second worker was not lost mid-write"
    # Both workers ran executors.
    for i in (1, 2):
        assert list((tmp_path / f"work{i}").glob("app-*/*/stderr")), f"worker {i} ran nothing"
    counts = held(brokers[-1].port, "cluster")
    dropped = queue_stats(brokers[-1].port, "cluster")["duplicates"]
    print(f"cluster: {len(counts)} rows held, each once; {dropped} repeats dropped")
    assert len(counts) == ROWS
    assert set(counts.values()) == {1}
    assert dropped > 0
