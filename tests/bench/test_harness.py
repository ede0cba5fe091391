"""The bench stops every process it started, however a run ends.

A run that failed midway (the relay without uvloop: ModuleNotFoundError) used to leave
its fqbroker running. Here runs fail on purpose, in the process (an exception, a
KeyboardInterrupt) and from outside (SIGTERM, SIGKILL to `python -m bench`), and every
process they started, and its process group, must be gone. Processes are looked up in
/proc (psutil is no dependency of ours).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

import pytest

from bench import harness, suite
from bench.flame import py_spy
from bench.suite import Config, run

TINY = Config(runs=1, scale=0.001, peers=False)


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, process group, start time) of ``pid``, or None when there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = text.rsplit(")", 1)[1].split()
    return rest[0], int(rest[1]), int(rest[2]), int(rest[19])


def _pids() -> Iterator[tuple[int, tuple[str, int, int, int]]]:
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            yield int(entry), st


def _alive(pid: int, started: int) -> bool:
    """The same process (not a later one with its pid) and not a zombie."""
    st = _stat(pid)
    return st is not None and st[3] == started and st[0] not in "ZX"


def _group_alive(pgid: int) -> bool:
    """A process of group ``pgid`` runs (a zombie no longer does: once its parent is gone,
    init may take its time to reap it)."""
    return any(st[2] == pgid and st[0] not in "ZX" for _, st in _pids())


def _descendants(root: int) -> dict[int, tuple[int, str]]:
    """Every process under ``root`` now: pid -> (start time, command line)."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for pid, st in _pids():
        children.setdefault(st[1], []).append(pid)
        starts[pid] = st[3]
    found: dict[int, tuple[int, str]] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        found[pid] = (starts[pid], cmd)
        todo += children.get(pid, [])
    return found


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Every process the harness starts during the test."""
    started: list[subprocess.Popen[bytes]] = []
    real = harness.spawn

    def spy(args: list[str], **options: Any) -> subprocess.Popen[bytes]:
        proc = real(args, **options)
        started.append(proc)
        return proc

    monkeypatch.setattr(harness, "spawn", spy)
    workdirs = set(harness._var().iterdir())
    yield started
    # Whatever a failed test left: not for the next one to find.
    harness.stop_all()
    assert set(harness._var().iterdir()) <= workdirs, "a server's workdir was left behind"


def _command(proc: subprocess.Popen[bytes]) -> str:
    args = proc.args
    assert isinstance(args, list)
    return " ".join(map(str, args))


def _assert_all_stopped(started: list[subprocess.Popen[bytes]]) -> None:
    assert started
    for proc in started:
        assert proc.returncode is not None, (_command(proc), "still running or not waited for")
        assert not _group_alive(proc.pid), (_command(proc), "left something in its group")
    assert not harness.LIVE


class NoUvloopRelay(harness.Relay):
    """The relay where uvloop cannot be imported: the run that once left its broker behind."""

    shim: Path

    def environment(self) -> dict[str, str]:
        path = os.pathsep.join([str(self.shim), harness.ENV["PYTHONPATH"]])
        return {**harness.ENV, "PYTHONPATH": path}


def test_a_relay_without_uvloop_fails_the_run_and_stops_the_broker(
    spawned: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "uvloop").mkdir()
    (tmp_path / "uvloop" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'uvloop'\", name='uvloop')\n"
    )
    NoUvloopRelay.shim = tmp_path
    monkeypatch.setattr(suite, "Relay", NoUvloopRelay)
    with pytest.raises(RuntimeError, match="ModuleNotFoundError"):
        run(["1to1-100"], TINY)
    names = [_command(p) for p in spawned]
    assert any("-m fqbroker" in n for n in names) and any("bench.relay" in n for n in names)
    _assert_all_stopped(spawned)


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_run_failing_midway_stops_servers_and_load_generators(
    spawned: list[subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch,
    error: type[BaseException],
) -> None:
    # Raised where the run reads the broker's CPU clock: the broker and the relay are
    # listening, the subscriber and the publisher connected and waiting for go.
    def fail(pid: int) -> float:
        raise error("midway")

    monkeypatch.setattr(suite, "cpu_seconds", fail)
    with pytest.raises(error, match="midway"):
        run(["1to1-100"], TINY)
    names = " | ".join(_command(p) for p in spawned)
    for role in ("-m fqbroker", "bench.relay", "bench.loadgen sub", "bench.loadgen pub"):
        assert role in names, names
    _assert_all_stopped(spawned)


def test_a_load_generator_that_dies_fails_the_run_and_the_servers_stop(
    spawned: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_collect = harness.Client.collect

    def die_then_collect(self: harness.Client) -> dict[str, Any]:  # a subscriber killed
        if " sub " in _command(self.proc):
            self.proc.kill()
        return real_collect(self)

    monkeypatch.setattr(harness.Client, "collect", die_then_collect)
    with pytest.raises(RuntimeError, match="load generator died"):
        run(["1to1-100"], TINY)
    _assert_all_stopped(spawned)


def _bench_until_loaded() -> tuple[subprocess.Popen[bytes], dict[int, Any]]:
    """`python -m bench idle` (a broker and a load generator of idle clients for 5 s), once
    its load generator runs: the bench and every process under it then."""
    bench = subprocess.Popen(
        [sys.executable, "-m", "bench", "--runs", "1", "--scale", "0.001", "--no-peers", "idle"],
        cwd=harness.ROOT,
        env=harness.ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        under = _descendants(bench.pid)
        if any("bench.loadgen idle" in cmd for _, cmd in under.values()):
            return bench, under
        assert bench.poll() is None, bench.communicate()[1].decode()
        time.sleep(0.05)
    bench.kill()
    raise AssertionError("no load generator under the bench in 30 s")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_signal_to_the_bench_leaves_nothing_running(sig: int) -> None:
    workdirs = set(harness._var().iterdir())
    bench, under = _bench_until_loaded()
    assert any("-m fqbroker" in cmd for _, cmd in under.values()), under
    bench.send_signal(sig)
    _, err = bench.communicate(timeout=60)
    if sig == signal.SIGTERM:
        assert bench.returncode == 128 + sig, err.decode()
    # SIGKILL: nothing of the bench runs, the kernel kills its children (PR_SET_PDEATHSIG).
    deadline = time.monotonic() + 10
    while (left := [c for p, (s, c) in under.items() if _alive(p, s)]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert not left, left
    for pid in under:
        assert not _group_alive(pid), under[pid]
    left_behind = set(harness._var().iterdir()) - workdirs
    if sig == signal.SIGKILL:  # nothing ran that could remove them
        for path in left_behind:
            shutil.rmtree(path)
    else:
        assert not left_behind


@pytest.mark.skipif(py_spy() is None, reason="py-spy not installed")
def test_flame_writes_an_svg_of_the_broker(
    spawned: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    run(["1to1-100"], Config(runs=1, scale=0.2, peers=False, flame=tmp_path))
    svg = (tmp_path / "1to1-100.svg").read_text()
    assert "<svg" in svg and "fqbroker" in svg
    assert any("py-spy record" in _command(p) for p in spawned)
    _assert_all_stopped(spawned)


def test_without_uvloop_the_relay_is_a_note_not_a_failure(
    spawned: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # What `python -m bench` does where uvloop is not installed (Relay.available).
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
        return None if name == "uvloop" else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    table = run(["1to1-100"], TINY)
    assert "py-relay/uvloop: skipped: uvloop not installed" in table, table
    assert "vs py-relay" not in table.splitlines()[0], table
    assert not any("bench.relay" in _command(p) for p in spawned)
    _assert_all_stopped(spawned)
