"""A standalone Spark cluster on 127.0.0.1 for the tests: a master and workers started
with ``spark-class`` from the pyspark install (as a pip user without a Spark distribution
starts them), each process in its own session and all stopped at the end."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.procs import ENV, ROOT

START_TIMEOUT = 60.0  # the master, a worker, fqd
STOP_TIMEOUT = 10.0
SPARK_CLASS = str(Path(sys.prefix) / "bin" / "spark-class")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process's group (a JVM's children, an executor's Python workers), then
    SIGKILL whatever of the group is left."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(STOP_TIMEOUT)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(STOP_TIMEOUT)


def cluster_env(tmp_path: Path, *conf: str) -> dict[str, str]:
    """The environment for the cluster's processes: none of the caller's Spark settings,
    on loopback, and a spark-defaults.conf in ``SPARK_CONF_DIR`` (small, no UIs, plus the
    ``conf`` lines), as an operator's would be."""
    conf_dir = tmp_path / "spark-conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(
        "spark.ui.enabled false\n"
        "spark.master.rest.enabled false\n"
        "spark.executor.memory 512m\n" + "".join(f"{line}\n" for line in conf)
    )
    base = {k: v for k, v in ENV.items() if not k.startswith(("PYSPARK_", "SPARK_"))}
    return base | {
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_CONF_DIR": str(conf_dir),
        "SPARK_DAEMON_MEMORY": "256m",
    }


class Procs:
    """Every process the test starts, each in its own session, all stopped at the end."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, args: list[str], env: dict[str, str]) -> Path:
        log = self.logs / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=env, cwd=ROOT, start_new_session=True,
            )  # fmt: skip
        self.started.append(proc)
        return log

    def master(self, env: dict[str, str]) -> str:
        """Starts a master; its URL."""
        port = free_port()
        self.start(
            "master",
            [SPARK_CLASS, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(port), "--webui-port", str(free_port())],
            env,
        )  # fmt: skip
        return f"spark://127.0.0.1:{port}"

    def worker(self, name: str, master: str, work: Path, cores: int, env: dict[str, str]) -> Path:
        """Starts a worker of ``master`` with 512 MB and ``work`` as its work directory;
        its log."""
        work.mkdir()
        return self.start(
            name,
            [SPARK_CLASS, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
             "--webui-port", str(free_port()), "--cores", str(cores), "--memory", "512m",
             "--work-dir", str(work), master],
            env,
        )  # fmt: skip

    def run(self, name: str, command: str, env: dict[str, str], timeout: float) -> str:
        """One command under bash; its output, or the test fails with it."""
        log = self.start(name, ["bash", "-euo", "pipefail", "-c", command], env)
        proc = self.started[-1]
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            stop(proc)
            pytest.fail(f"{name} ran over {timeout:.0f} s: {log.read_text()[-3000:]}")
        out = log.read_text()
        assert proc.returncode == 0, f"{name} failed ({proc.returncode}): {out[-3000:]}"
        return out

    def stop_all(self) -> None:
        for proc in reversed(self.started):
            stop(proc)


def wait_for(
    what: str, ready: Callable[[], bool], log: Path, proc: subprocess.Popen[bytes]
) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"{what} did not start: {log.read_text()[-3000:]}")
        time.sleep(0.2)
