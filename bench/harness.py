"""Processes for the suite: the systems under test, load generators, /proc readings.

A :class:`System` is a server process on a free loopback port: fqbroker (``python -m
fqbroker``, uvloop when installed), the Python-hop relay, redis-server or nats-server.
Load generators are ``python -m bench.loadgen`` processes (see there); :func:`run_clients`
starts them, lines them up on ``READY``, says go to all at once and collects their JSON.
CPU is utime + stime of the server process from /proc/PID/stat, RSS is VmRSS.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def env_for(tree: Path) -> dict[str, str]:
    """The environment of a process that imports fqbroker from ``tree``."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]),
    }


ENV = env_for(ROOT)
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """A process's resident memory now, or with ``field="VmHWM"`` its peak so far."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field}")


def free_port(kind: socket.SocketKind = socket.SOCK_STREAM) -> int:
    """A loopback port nobody holds now: TCP, or with ``SOCK_DGRAM`` UDP."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_port(port: int, system: System) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
            return
        if system.proc is not None and system.proc.poll() is not None:
            err = system.proc.stderr.read().decode() if system.proc.stderr else ""
            raise RuntimeError(f"{system.name} exited: {err[-2000:]}")
        time.sleep(0.05)
    raise RuntimeError(f"{system.name} did not listen on {port}")


def _raise_nofile() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@dataclass
class System:
    """A server under test. ``proto`` is what the load generators speak to it."""

    name: str
    proto: str
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0
    workdir: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def available(self) -> str | None:
        """None when it can run here, else why not."""
        return None

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        return ENV

    def start(self) -> None:
        self.workdir = Path(
            tempfile.mkdtemp(prefix=f"bench-{self.name.replace('/', '-')}-", dir=_var())
        )
        self.port = free_port()
        self.proc = subprocess.Popen(
            self.command(),
            cwd=self.workdir,
            env=self.environment(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=_raise_nofile,
        )
        self._wait_listening()

    def _wait_listening(self) -> None:
        _wait_port(self.port, self)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
        self.proc = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


class FqBroker(System):
    """fqbroker from this tree, or with ``tree`` from another checkout (``--baseline``):
    the broker process imports that tree's package; load generators stay this tree's."""

    def __init__(
        self,
        fsync: str = "interval",
        *,
        tree: Path | None = None,
        name: str = "fqbroker",
        lumberjack: bool = False,
        figg: bool = False,
        fyrehose: bool = False,
        opencluster: str | None = None,
    ) -> None:
        super().__init__(name, "fq")
        self.fsync = fsync
        self.tree = tree
        self.lumberjack = lumberjack  # also a Lumberjack listener, on ``lj_port``
        self.lj_port = 0
        self.figg = figg  # also a Figg listener, on ``figg_port``
        self.figg_port = 0
        # Also a fyrehose listener on UDP ``fh_port``; UDP has nothing to connect to, so
        # whoever uses it waits for a KEEPALIVE-ACK (bench/fyrehoseload.py).
        self.fyrehose = fyrehose
        self.fh_port = 0
        # Also an OpenCluster listener on ``oc_port``, its store's ``[opencluster] sync``
        # this ("full" or "normal").
        self.opencluster = opencluster
        self.oc_port = 0

    def start(self) -> None:
        if self.lumberjack:
            self.lj_port = free_port()
        if self.figg:
            self.figg_port = free_port()
        if self.fyrehose:
            self.fh_port = free_port(socket.SOCK_DGRAM)
        if self.opencluster:
            self.oc_port = free_port()
        super().start()
        if self.lumberjack:
            _wait_port(self.lj_port, self)
        if self.figg:
            _wait_port(self.figg_port, self)
        if self.opencluster:
            _wait_port(self.oc_port, self)

    def environment(self) -> dict[str, str]:
        return ENV if self.tree is None else env_for(self.tree)

    def command(self) -> list[str]:
        assert self.workdir is not None
        return [
            sys.executable, "-m", "fqbroker", "-p", str(self.port), "-n", "10.0.0.1",
            "-c", str(self.workdir / "db.sqlite"), "-q", str(self.workdir / "queues"),
            "--config", str(self._config()),
        ] + (["--lumberjack", f"127.0.0.1:{self.lj_port}"] if self.lumberjack else []) + (
            ["--figg", f"127.0.0.1:{self.figg_port}"] if self.figg else []
        ) + (["--fyrehose", f"127.0.0.1:{self.fh_port}"] if self.fyrehose else []) + (
            ["--opencluster", f"127.0.0.1:{self.oc_port}"] if self.opencluster else []
        )  # fmt: skip

    def _config(self) -> Path:
        assert self.workdir is not None
        path = self.workdir / "fqd.toml"
        # Topics have a policy of their own; a row's names both.
        figg = f'[figg]\nfsync = "{self.fsync}"\n' if self.figg else ""
        oc = f'[opencluster]\nsync = "{self.opencluster}"\n' if self.opencluster else ""
        path.write_text(f'[fqd]\nfsync = "{self.fsync}"\n{figg}{oc}')
        return path


class Relay(System):
    def __init__(self, loop: str = "uvloop") -> None:
        super().__init__(f"py-relay/{loop}", "fq")
        self.loop = loop

    def command(self) -> list[str]:
        return [sys.executable, "-m", "bench.relay", "--port", str(self.port), "--loop", self.loop]


class Redis(System):
    """Without persistence (as the pub/sub rows want it), or with an append-only file
    fsynced as ``appendfsync`` says (as the OpenCluster rows compare promises)."""

    def __init__(self, appendfsync: str | None = None) -> None:
        name = "redis" if appendfsync is None else f"redis, appendfsync {appendfsync}"
        super().__init__(name, "redis")
        self.appendfsync = appendfsync

    def available(self) -> str | None:
        if shutil.which("redis-server") is None:
            return "skipped: redis-server not installed (make bench-peers)"
        return None

    def command(self) -> list[str]:
        aof = ["--appendonly", "no"]
        if self.appendfsync is not None:  # its file in the workdir, on the disk under ./var
            aof = ["--appendonly", "yes", "--appendfsync", self.appendfsync]
        return [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
            *aof, "--client-output-buffer-limit", "pubsub 0 0 0",
        ]  # fmt: skip


class Nats(System):
    def __init__(self) -> None:
        super().__init__("nats", "nats")

    def available(self) -> str | None:
        if shutil.which("nats-server") is None:
            return "skipped: nats-server not installed (make bench-peers)"
        return None

    def command(self) -> list[str]:
        return ["nats-server", "-a", "127.0.0.1", "-p", str(self.port)]


def _var() -> Path:
    # Under ./var, not /tmp: /tmp may be tmpfs, where fsync costs nothing.
    path = ROOT / "var" / "bench"
    path.mkdir(parents=True, exist_ok=True)
    return path


def version(system: System) -> str:
    exe = {"redis": "redis-server", "nats": "nats-server"}.get(system.name)
    if exe is None:
        return ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=5)
        text = (out.stdout or out.stderr).strip().splitlines()[0]
        return " ".join(w for w in text.split() if w[:2] in ("v=", "v2") or w[:1].isdigit())
    return ""


# --- load generators -------------------------------------------------------------------------


class Client:
    """One load-generator process."""

    def __init__(
        self, role: str, system: System, *, module: str = "bench.loadgen", **options: Any
    ) -> None:
        args = [sys.executable, "-m", module, role, "--proto", system.proto]
        args += ["--port", str(system.port)]
        for key, value in options.items():
            flag = f"--{key.replace('_', '-')}"
            if value is True:
                args.append(flag)
            elif value is not False:
                args += [flag, str(value)]
        self.proc = subprocess.Popen(
            args,
            cwd=ROOT,
            env=ENV,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            preexec_fn=_raise_nofile,
        )
        self.result: dict[str, Any] = {}

    def ready(self) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != b"READY":
            self.proc.wait(5)
            raise RuntimeError(f"load generator failed to start: {line!r}")

    def go(self) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.write(b"go\n")
            self.proc.stdin.flush()

    def collect(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(5)
            raise RuntimeError("load generator died")
        self.result = json.loads(line)
        return self.result

    def finish(self) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def credit_file() -> str:
    from .loadgen import Credit

    fd, path = tempfile.mkstemp(prefix="fqbench-credit-", dir="/dev/shm")
    os.close(fd)
    Credit.create(path)
    return path
