"""Fixtures for the Spark tests: one local[2] SparkSession and one real broker per session.

SparkSession start-up costs seconds and the first query of a session more, so both are
shared by every test here; tests keep apart by using their own exchanges, queues and
checkpoint directories. They skip, saying why, without pyspark (the
``spark`` extra) or Java 17+ (``make java``); with ``CI`` set they fail instead (tests/prereqs.py).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fqbroker.clients.fq.client import Client, ClientClosed
from fqbroker.clients.http.replay import ReplayClient
from fqbroker.core.message import Message
from tests.prereqs import missing, require_module
from tests.procs import ENV, ROOT
from tests.spark.cluster import Procs

TIMEOUT = 10.0
QUERY_TIMEOUT = 180.0  # one streaming query, the session's first included


def java_problem() -> str | None:
    """Why Spark cannot start here, or None."""
    java = shutil.which("java")
    if java is None and os.environ.get("JAVA_HOME"):
        java = str(Path(os.environ["JAVA_HOME"], "bin", "java"))
    if java is None or not Path(java).exists():
        return "no java on PATH"
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"java -version failed: {exc}"
    m = re.search(r'version "(\d+)', out.stderr + out.stdout)
    if m is None or int(m.group(1)) < 17:
        return f"Java 17 or later is needed, found: {out.stderr.strip()[:80]}"
    return None


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    require_module("pyspark", "the spark extra is not installed (`make spark`)")
    require_module("pyarrow", "the spark extra is not installed (`make spark`)")
    problem = java_problem()
    if problem:
        missing(f"Spark needs Java 17+ ({problem}); `make java` installs it")
    from pyspark.sql import SparkSession

    # Workers must run this venv's Python, not the first python3 on PATH; the repository
    # on PYTHONPATH lets Spark find the pyspark_fqbroker shim, as a regular install would.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYTHONPATH"] = ENV["PYTHONPATH"]
    session = (
        SparkSession.builder.master("local[2]")
        .appName("fqbroker-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@dataclass
class FqBroker:
    port: int
    state: Path
    proc: subprocess.Popen[bytes]

    @property
    def client(self) -> ReplayClient:
        return ReplayClient(port=self.port)

    def options(self, **more: object) -> dict[str, str]:
        return {"host": "127.0.0.1", "port": str(self.port), **{k: str(v) for k, v in more.items()}}


SMALL_SEGMENTS = "[fqd]\nsegment_bytes = 16384\n"


def start_fqd(
    state: Path,
    *,
    port: int = 0,
    conf_text: str = SMALL_SEGMENTS,
    preexec_fn: Callable[[], None] | None = None,
) -> FqBroker:
    """A real broker process with its data under ``state``; by default small segments, so
    that checkpoints trim in these tests. ``port`` 0 picks a free one; a restart passes the
    old one."""
    conf = state / "fqd.toml"
    conf.write_text(conf_text)
    log_path = state / "fqd.log"
    before = log_path.stat().st_size if log_path.exists() else 0
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fqbroker", "-p", str(port), "-n", "10.254.254.1",
             "--config", str(conf), "-c", str(state / "fqd.sqlite"), "-q", str(state / "queues")],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=ENV, cwd=ROOT,
            preexec_fn=preexec_fn,
        )  # fmt: skip
    deadline = time.monotonic() + TIMEOUT
    while (m := re.search(rb"Listening on port: (\d+)", log_path.read_bytes()[before:])) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_fqd(proc)
            raise AssertionError(f"fqd did not start: {log_path.read_text()[-2000:]}")
        time.sleep(0.05)
    return FqBroker(int(m.group(1)), state, proc)


def stop_fqd(proc: subprocess.Popen[bytes], *, kill: bool = False) -> None:
    """SIGTERM (or SIGKILL, as a crash) and reap."""
    if kill:
        proc.kill()
    else:
        proc.terminate()
    try:
        proc.wait(TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def fq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FqBroker]:
    """The broker every test here shares."""
    broker = start_fqd(tmp_path_factory.mktemp("fqd"))
    try:
        yield broker
    finally:
        stop_fqd(broker.proc)


@pytest.fixture
def own_fq(tmp_path: Path) -> Iterator[Callable[..., FqBroker]]:
    """Brokers of one test (to kill, restart or starve); all stopped at its end."""
    started: list[FqBroker] = []

    def start(**kwargs: Any) -> FqBroker:
        state = tmp_path / "fqd"
        state.mkdir(exist_ok=True)
        broker = start_fqd(state, **kwargs)
        started.append(broker)
        return broker

    yield start
    for broker in started:
        stop_fqd(broker.proc)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    """A test's cluster processes (tests/spark/cluster.py), all stopped at its end."""
    running = Procs(tmp_path)
    try:
        yield running
    finally:
        running.stop_all()


def publish(port: int, messages: list[tuple[str, str, bytes]]) -> None:
    """Publish (exchange, route, payload) messages and wait for the broker's confirm."""

    async def run() -> None:
        async with asyncio.timeout(TIMEOUT), Client(port=port, source="tester") as client:
            for exchange, route, payload in messages:
                client.publish(exchange.encode(), route.encode(), payload)
            assert await client.confirm() == len(messages)

    asyncio.run(run())


@dataclass
class Consumer:
    """An fq consumer on its own thread and event loop, bound before the test publishes."""

    port: int
    exchange: str
    program: str = "prefix:"
    messages: list[Message] = field(default_factory=list)
    _ready: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    _error: list[BaseException] = field(default_factory=list)

    def __enter__(self) -> Consumer:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(TIMEOUT), self._error
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(TIMEOUT)

    def wait(self, n: int, timeout: float = 60.0) -> list[Message]:
        deadline = time.monotonic() + timeout
        while len(self.messages) < n and time.monotonic() < deadline and not self._error:
            time.sleep(0.05)
        assert not self._error, self._error
        return list(self.messages)

    def _run(self) -> None:
        async def main() -> None:
            queue = f"test-{self.exchange}/mem:backlog=-1"
            async with Client(port=self.port, source=f"tester/{queue}") as client:
                await client.bind(self.exchange.encode(), self.program.encode())
                self._ready.set()
                while not self._stop.is_set():
                    try:
                        async with asyncio.timeout(0.1):
                            self.messages.append(await client.receive())
                    except (TimeoutError, ClientClosed):
                        pass

        try:
            asyncio.run(main())
        except BaseException as exc:
            self._error.append(exc)
            self._ready.set()


def run_query(writer: Any, timeout: float = QUERY_TIMEOUT) -> Any:
    """Start a streaming query (availableNow), wait for it to end, and return it.

    A query that died says nothing unless asked: check ``exception()``.
    """
    query = writer.trigger(availableNow=True).start()
    try:
        assert query.awaitTermination(timeout), "the query did not finish in time"
    except Exception:
        if query.exception() is None:
            raise
        # A failed query re-raises its error here; callers read it from query.exception().
    finally:
        if query.isActive:
            query.stop()
    return query
