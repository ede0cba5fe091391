"""The fq sink exactly once on a standalone cluster: a master and two workers on
127.0.0.1, the write's broker killed (kill -9) and restarted under it, one worker killed
while its executor writes, and a partition that fails its first attempt: the queue holds
each row once, and the counts say what was sent again."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fqbroker.clients.http.replay import ReplayClient
from tests.prereqs import missing, require_module
from tests.procs import ENV
from tests.spark.conftest import FqBroker, java_problem, stop_fqd
from tests.spark.test_cluster_recipe import Procs, free_port, stop, wait_for
from tests.spark.test_sink_once import ROWS, RestartingRelay, held, queue_stats, run_job

pytestmark = pytest.mark.spark


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    running = Procs(tmp_path)
    try:
        yield running
    finally:
        running.stop_all()


def test_a_cluster_write_survives_a_broker_restart_and_a_lost_worker_once(
    tmp_path: Path, procs: Procs, own_fq: Callable[..., FqBroker]
) -> None:
    require_module("pyspark", "the spark extra is not installed (`make spark`)")
    problem = java_problem()
    if problem:
        missing(f"Spark needs Java 17+ ({problem}); `make java` installs it")
    venv = Path(sys.prefix)
    conf = tmp_path / "spark-conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(
        "spark.ui.enabled false\nspark.master.rest.enabled false\nspark.executor.memory 512m\n"
    )
    base = {k: v for k, v in ENV.items() if not k.startswith(("PYSPARK_", "SPARK_"))}
    python = str(venv / "bin" / "python")
    env = base | {
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_CONF_DIR": str(conf),
        "SPARK_DAEMON_MEMORY": "256m",
        "PYSPARK_PYTHON": python,
        "PYSPARK_DRIVER_PYTHON": python,
    }
    spark_class = str(venv / "bin" / "spark-class")
    master_port = free_port()
    master = f"spark://127.0.0.1:{master_port}"
    procs.start(
        "master",
        [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
         "--port", str(master_port), "--webui-port", str(free_port())],
        env,
    )  # fmt: skip
    workers = []
    for i in (1, 2):
        (tmp_path / f"work{i}").mkdir()
        log = procs.start(
            f"worker{i}",
            [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
             "--webui-port", str(free_port()), "--cores", "1", "--memory", "512m",
             "--work-dir", str(tmp_path / f"work{i}"), master],
            env,
        )  # fmt: skip
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
