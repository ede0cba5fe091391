"""The fq sink exactly once: a batch write whose broker is killed (kill -9) and restarted
under it, with a partition that fails its first attempt, leaves each row in the queue
once; with ``dedup = false`` the same write leaves the rows its retries sent again twice.

The write runs in a Spark of its own (tests/spark/oncejob.py, ``local[2,4]``): the shared
session gives a task one attempt. The broker is reached through a relay that kills it once
enough bytes went its way, starts it again and holds new connections meanwhile, so every
task retry finds a broker, whatever the machine's speed."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from fqbroker.clients.http.replay import ReplayClient
from tests.procs import ENV, ROOT
from tests.spark.conftest import FqBroker, stop_fqd
from tests.spark.relay import RestartingRelay

pytestmark = pytest.mark.spark

ROWS = 20_000
JOB_TIMEOUT = 300.0


def run_job(
    port: int, exchange: str, *options: str, env: dict[str, str] = ENV
) -> subprocess.CompletedProcess[str]:
    args = [str(port), exchange, str(ROWS), "1", "1200", *options]
    return subprocess.run(
        [sys.executable, "-m", "tests.spark.oncejob", *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=JOB_TIMEOUT,
    )  # fmt: skip


def held(port: int, queue: str) -> Counter[bytes]:
    """How many times the queue holds each payload."""
    client = ReplayClient(port=port)
    info = client.info(queue)
    return Counter(
        e.message.payload
        for batch in client.read_range(queue, info.first, info.next)
        for e in batch
    )


def queue_stats(port: int, queue: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats.json", timeout=10) as reply:
        doc: dict[str, Any] = json.load(reply)
    return doc["queues"][queue]


def kill_and_restart(
    own_fq: Callable[..., FqBroker], queue: str, *options: str
) -> tuple[subprocess.CompletedProcess[str], FqBroker]:
    broker = own_fq()
    ReplayClient(port=broker.port).ensure_queue(queue, exchange=queue)
    brokers = [broker]

    def restart() -> int:
        stop_fqd(brokers[-1].proc, kill=True)  # kill -9: a crash mid-write
        brokers.append(own_fq(port=brokers[0].port))
        return brokers[-1].port

    relay = RestartingRelay(broker.port, 1 << 20, restart)  # about a fifth of the write
    try:
        job = run_job(relay.port, queue, *options)
        assert relay.tripped.is_set(), job.stderr[-3000:]
    finally:
        relay.close()
    return job, brokers[-1]


def test_a_broker_restart_and_a_task_retry_leave_each_row_once(
    own_fq: Callable[..., FqBroker],
) -> None:
    job, broker = kill_and_restart(own_fq, "once")
    assert job.returncode == 0, job.stderr[-3000:]
    counts = held(broker.port, "once")
    assert len(counts) == ROWS
    assert set(counts.values()) == {1}
    # The retries did send rows again: the restarted broker dropped them as repeats.
    assert queue_stats(broker.port, "once")["duplicates"] > 0


def test_without_dedup_the_retries_duplicate_rows(own_fq: Callable[..., FqBroker]) -> None:
    job, broker = kill_and_restart(own_fq, "twice", "dedup=false")
    assert job.returncode == 0, job.stderr[-3000:]
    counts = held(broker.port, "twice")
    assert len(counts) == ROWS  # nothing lost: at least once
    assert max(counts.values()) > 1
