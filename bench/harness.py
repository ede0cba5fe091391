"""Processes for the suite: the systems under test, load generators, /proc readings.

A :class:`System` is a server process on a free loopback port (fqbroker, the Python-hop
relay, redis-server or nats-server); :func:`run_clients` starts load generators, lines them
up on ``READY``, says go to all at once and collects their JSON. Every process is started
by :func:`spawn` in a process group of its own and stopped, whole group, however the run
ends (docs/bench.md, "The suite").
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib.util
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
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
    """The CPU time (user + system) of ``pid``, all its threads, live and ended, in seconds.

    Read from the kernel's clock of that process (what glibc's clock_getcpuclockid names:
    nanoseconds of run time), else utime + stime from /proc/PID/stat, which count 10 ms
    ticks: 1 to 3% of a run at scale 1, more in a short run, too coarse for an A/B.
    """
    with contextlib.suppress(OSError):
        return time.clock_gettime(((~pid) << 3) | 2)  # CPUCLOCK_SCHED of the whole process
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


# --- processes -------------------------------------------------------------------------------

# Every process spawn() started and stop_process() has not stopped yet, by pid.
LIVE: dict[int, subprocess.Popen[bytes]] = {}
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _child_setup(parent: int, die_with_parent: bool) -> Callable[[], None]:
    def setup() -> None:
        _raise_nofile()
        if _LIBC is not None and die_with_parent:
            _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:  # the bench died before the prctl: nobody to tell
                os._exit(1)

    return setup


def spawn(args: list[str], **options: Any) -> subprocess.Popen[bytes]:
    """Start a process of the bench: in a process group of its own, so that stopping it stops
    whatever it started too, and a terminal's Ctrl-C reaches the bench alone (which then
    stops it in order). The kernel sends it SIGKILL when the thread that started it ends,
    so only a child of the main thread asks for that (fuzz/soak start brokers in workers).
    """
    die_with_parent = threading.current_thread() is threading.main_thread()
    proc = subprocess.Popen(
        args, process_group=0, preexec_fn=_child_setup(os.getpid(), die_with_parent), **options
    )
    LIVE[proc.pid] = proc
    return proc


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Stop ``proc`` and its process group: SIGTERM, SIGKILL after ``timeout``; then SIGKILL
    to whatever it left in its group; its pipes closed. Nothing to do if it has exited."""
    try:
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
        _signal_group(proc.pid, signal.SIGKILL)
    finally:
        if proc.returncode is not None:  # else (interrupted) still stop_all()'s to stop
            LIVE.pop(proc.pid, None)
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()


def stop_all(timeout: float = 5.0) -> None:
    """Stop every process the bench started and has not stopped: all told at once, then each
    waited for up to what is left of ``timeout``."""
    procs = list(LIVE.values())
    for proc in procs:
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        stop_process(proc, max(0.1, deadline - time.monotonic()))


atexit.register(stop_all)


def exit_on_signals() -> None:
    """SIGTERM and SIGHUP end the bench as an exception would (SystemExit), so that every
    ``finally`` and :func:`stop_all` run; a second one while that runs is ignored."""

    def handler(signum: int, _frame: object) -> None:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


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
        # A name's spaces kept out of the path: RabbitMQ's disk monitor runs df on its data
        # directory unquoted ("rabbitmq classic").
        slug = re.sub(r"[^\w.-]+", "-", self.name)
        self.workdir = Path(tempfile.mkdtemp(prefix=f"bench-{slug}-", dir=_var()))
        self.port = free_port()
        try:
            self.proc = spawn(
                self.command(),
                cwd=self.workdir,
                env=self.environment(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            self._wait_listening()
        except BaseException:
            self.stop()
            raise

    def _wait_listening(self) -> None:
        _wait_port(self.port, self)

    def stop(self) -> None:
        """Idempotent: nothing to do once stopped (or when never started)."""
        if self.proc is not None:
            stop_process(self.proc)
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

    def _wait_listening(self) -> None:
        super()._wait_listening()
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

    def available(self) -> str | None:
        if self.loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
            return "skipped: uvloop not installed (pip install uvloop)"
        return None

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
    """The release of a peer's server as the table prints it, or "" when unknown: the
    durable peers say their own (``version()``), Redis and NATS ask the executable."""
    own = getattr(system, "version", None)
    if callable(own):
        return str(own())
    exe = {"redis": "redis-server", "nats": "nats-server"}.get(system.name)
    if exe is None:
        return ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=5)
        text = (out.stdout or out.stderr).strip().splitlines()[0]
        return " ".join(w for w in text.split() if w[:2] in ("v=", "v2") or w[:1].isdigit())
    return ""


def build_of(tree: Path | None = None) -> str:
    """Which build of fqbroker a broker from ``tree`` (None: this one) runs, as its
    ``fqd --version`` says: "compiled: N of N modules, mypyc" or "pure Python: why"."""
    code = "from fqbroker.accel import describe; print(describe())"
    env = ENV if tree is None else env_for(tree)
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"
    lines = done.stdout.strip().splitlines()
    return lines[-1] if done.returncode == 0 and lines else "unknown (fqbroker does not import)"


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
        self.proc = spawn(args, cwd=ROOT, env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.result: dict[str, Any] = {}

    def ready(self) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != b"READY":
            stop_process(self.proc, 5)
            raise RuntimeError(f"load generator failed to start: {line!r}")

    def go(self) -> None:
        stdin = self.proc.stdin
        if stdin is not None and not stdin.closed:
            with contextlib.suppress(OSError):
                stdin.write(b"go\n")
                stdin.flush()

    def collect(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            stop_process(self.proc, 5)
            raise RuntimeError("load generator died")
        self.result = json.loads(line)
        return self.result

    def finish(self) -> None:
        """Its stdin closed, and up to 30 s to exit on its own; then stopped."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)
        stop_process(self.proc, 5)

    def stop(self) -> None:
        """Stopped now, not asked: after a failure it may be blocked on a read forever."""
        stop_process(self.proc, 5)


def finish_all(clients: Iterable[Client], *, failed: bool) -> None:
    """A run's load generators told to go on (past their last wait) and finished; after a
    failure (``failed``) stopped at once instead."""
    for c in clients:
        if failed:
            c.stop()
        else:
            c.go()
            c.finish()


def credit_file() -> str:
    from .loadgen import Credit

    fd, path = tempfile.mkstemp(prefix="fqbench-credit-", dir="/dev/shm")
    os.close(fd)
    Credit.create(path)
    return path
