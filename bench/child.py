"""One broker child process for the reliability runs (fuzz, storm, soak).

The broker is ``python -m fqbroker`` on a fixed loopback port with its state under a
directory of its own, so that a restart after ``kill -9`` finds the same queues on the same
port. Its stderr goes to a file, which nothing can fill while it is killed and restarted
and which :meth:`Broker.tracebacks` reads afterwards; RSS and open descriptors come from
``/proc/PID``. Settings, tables and flags the runs do not know pass through to the broker,
and ``--broker-root`` runs it from another tree (docs/reliability.md, "Common options").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .harness import ENV, ROOT, free_port, rss_bytes

# The source tree the broker runs from: this one, or FQ_BROKER_ROOT (tests) / --broker-root.
BROKER_ROOT = Path(os.environ.get("FQ_BROKER_ROOT") or ROOT).resolve()

__all__ = [
    "Broker",
    "Sample",
    "add_run_options",
    "fd_count",
    "fd_kinds",
    "http_reply",
    "parse_setting",
    "print_verdict",
    "raise_nofile",
    "run_main",
    "run_parser",
]


def raise_nofile() -> int:
    """Raise this process's descriptor limit to its hard limit; returns the new limit."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def fd_count(pid: int) -> int:
    """Open descriptors, less the files of retained topics: a topic keeps its segment and
    checkpoint files open while the broker runs (docs/figg.md), so the topics a run
    creates are state, not a leak."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        count += "/topics/" not in target
    return count


def fd_kinds(pid: int) -> dict[str, int]:
    """Open descriptors by kind: ``socket``, ``pipe``, ``anon_inode:...`` or the file path."""
    kinds: dict[str, int] = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        kind = target.split(":", 1)[0] if target.startswith(("socket:", "pipe:")) else target
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


_TCP_STATES = {
    "01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1",
    "05": "FIN_WAIT2", "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT",
    "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING",
}  # fmt: skip


def tcp_sockets(pid: int) -> list[str]:
    """The TCP sockets ``pid`` holds, as ``local -> remote STATE`` (for findings)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as fh:
            for line in list(fh)[1:]:
                f = line.split()
                if f[9] in inodes:
                    local, remote = (f"{int(a.split(':')[1], 16)}" for a in (f[1], f[2]))
                    out.append(f"{local} -> {remote} {_TCP_STATES.get(f[3], f[3])}")
    return sorted(out)


def add_broker_options(p: argparse.ArgumentParser) -> None:
    """The options every run has for the broker it starts."""
    p.add_argument(
        "--setting",
        type=parse_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a broker setting for the [fqd] table, VALUE in TOML (repeat)",
    )
    p.add_argument("--fqd-arg", action="append", default=[], help="a broker flag (repeat)")
    p.add_argument(
        "--broker-root", type=Path, default=BROKER_ROOT, help="run the broker from this tree"
    )


def run_parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    """The command line of ``python -m bench.NAME``, without the options of its own."""
    return argparse.ArgumentParser(
        prog=f"python -m bench.{name}", description=(doc or "").split("\n")[0]
    )


def add_run_options(p: argparse.ArgumentParser, name: str) -> None:
    """The options every run ends with: its state directory, its JSON result, its broker."""
    p.add_argument("--state", default=str(ROOT / "var" / name))
    p.add_argument("--json", help="write the result as JSON here")
    add_broker_options(p)


def print_verdict(name: str, failures: list[str]) -> None:
    """The last lines of every run's summary: each failure, then passed or FAILED."""
    for failure in failures:
        print(f"  FAILED: {failure}")
    print(f"{name}: " + ("FAILED" if failures else "passed"), flush=True)


def run_main(
    parser: argparse.ArgumentParser,
    run: Callable[[argparse.Namespace], Coroutine[Any, Any, dict[str, Any]]],
    print_summary: Callable[[dict[str, Any]], None],
    argv: list[str] | None,
) -> int:
    """Run, print the summary, write ``--json``; exit status 1 when anything failed."""
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    print_summary(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 1 if result["failures"] else 0


def own_port_args() -> list[str]:
    """The flags that turn on the front ends of ports of their own, which the runs reach
    through bench/frontends.py like the others: each on a fixed free port, so that a broker
    restarted after kill -9 listens where it did."""
    return [
        "--lumberjack", f"127.0.0.1:{free_port()}",
        "--figg", f"127.0.0.1:{free_port()}",
        "--fyrehose", f"127.0.0.1:{free_port(socket.SOCK_DGRAM)}",
        "--opencluster", f"127.0.0.1:{free_port()}",
    ]  # fmt: skip


# The fyrehose window is memory by design (32 MiB of data by default): a small one is full
# long before the fuzzer's warm-up sample, so RSS stays flat after it, and REQUESTs for
# evicted ranges (FORWARDs) are fuzzed too.
# The OpenCluster store keeps what is set, and a frame one byte past max_value is read
# whole before it is refused: with the default 1 MiB values a short run's RSS is those
# buffers' high water, not a leak, and over the short run's RSS limit (bench/RESULTS.md,
# figures behind comments). 64 KiB values fuzz the same limits (bench/ocfuzz.py reads these).
OC_MAX_NAME = 1024
OC_MAX_VALUE = 64 << 10
OC_MAX_PAYLOAD = OC_MAX_VALUE + OC_MAX_NAME + 64
OWN_PORT_TABLES = {
    "fyrehose": {"window_bytes": str(1 << 20)},
    "opencluster": {
        "max_name": str(OC_MAX_NAME),
        "max_value": str(OC_MAX_VALUE),
        "max_payload": str(OC_MAX_PAYLOAD),
    },
}


def broker_from(args: argparse.Namespace, state: Path) -> Broker:
    extra = list(args.fqd_arg)
    tables: dict[str, dict[str, str]] = {}
    if "--lumberjack" not in extra:
        extra += own_port_args()
        tables = OWN_PORT_TABLES
    return Broker(state, dict(args.setting), extra, root=args.broker_root, tables=tables)


def parse_setting(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` from the command line; VALUE is TOML (``5``, ``"x"``, ``true``)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"a setting is KEY=VALUE (TOML value), not {text!r}")
    return key.strip(), value.strip()


@dataclass(frozen=True)
class Sample:
    at: float  # seconds since the run started
    rss: int
    fds: int


@dataclass
class Broker:
    """A broker child; :meth:`start` again after :meth:`kill9` restarts it on its state."""

    state: Path
    settings: dict[str, str] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)
    node_id: str = "10.254.254.1"
    root: Path = field(default_factory=lambda: BROKER_ROOT)  # where the broker's code is
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    tables: dict[str, dict[str, str]] = field(default_factory=dict)  # other TOML tables

    def __post_init__(self) -> None:
        self.state = self.state.resolve()  # the broker may run in another directory
        self.state.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def log_path(self) -> Path:
        return self.state / "fqd.log"

    def command(self) -> list[str]:
        config = self.state / "fqd.toml"
        lines = ["[fqd]"] + [f"{k} = {v}" for k, v in self.settings.items()]
        for name, table in self.tables.items():
            lines += [f"[{name}]"] + [f"{k} = {v}" for k, v in table.items()]
        config.write_text("\n".join(lines) + "\n")
        return [
            sys.executable, "-m", "fqbroker", "--config", str(config),
            "-p", str(self.port), "-n", self.node_id,
            "-c", str(self.state / "fqd.sqlite"), "-q", str(self.state / "queues"),
            *self.extra_args,
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        if self.root == ROOT.resolve():
            return ENV
        # Another tree's broker: its code first, and no bytecode written into that tree.
        path = os.pathsep.join([str(self.root), os.environ.get("PYTHONPATH", "")])
        return {**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"}

    def start(self, timeout: float = 30.0) -> None:
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"--- start {self.starts} at {time.time():.3f}\n".encode())
            log.flush()
            start_at = log.tell()
            self.proc = subprocess.Popen(
                self.command(),
                cwd=self.root,
                env=self.env(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                preexec_fn=raise_nofile,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the broker exited with {self.proc.returncode}: {self.tail()}")
            # fqd says "Listening on port" once every listener is open: the main port
            # accepts before the ports of their own do, and a run that read
            # /frontends.json then missed them.
            if self._said_listening(start_at):
                return
            time.sleep(0.05)
        raise RuntimeError(f"the broker did not listen on port {self.port}: {self.tail()}")

    def _said_listening(self, offset: int) -> bool:
        with open(self.log_path, "rb") as log:
            log.seek(offset)
            said = b"Listening on port: " in log.read()
        if said:  # and the main port takes connections (what the runs reach first)
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return True
        return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL if it does not exit; the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def sample(self, t0: float) -> Sample:
        return Sample(time.monotonic() - t0, rss_bytes(self.pid), fd_count(self.pid))

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, chars: int = 2000) -> str:
        return self.log_text()[-chars:]

    def tracebacks(self) -> dict[str, int]:
        """Every traceback in the log, counted by its last line (the exception)."""
        return count_tracebacks(self.log_text())


_TB_START = re.compile(r"^Traceback \(most recent call last\):", re.M)


def count_tracebacks(text: str) -> dict[str, int]:
    """Tracebacks in a log, counted by signature: the exception line ending each one."""
    found: dict[str, int] = {}
    for match in _TB_START.finditer(text):
        body = text[match.end() :].splitlines()
        last = ""
        for line in body[1:]:
            if line.startswith((" ", "\t")) or not line.strip():
                continue
            if line.startswith(("The above exception", "During handling")):
                continue
            last = line.strip()
            break
        signature = normalized(last)
        found[signature] = found.get(signature, 0) + 1
    return found


_QUOTED = re.compile(r"(bytearray\()?b?'(?:[^'\\]|\\.)*'\)?|\"(?:[^\"\\]|\\.)*\"")
_NUMBER = re.compile(r"\b\d+\b")


def normalized(line: str) -> str:
    """An exception line with its quoted values and numbers blanked: one signature per bug
    rather than one per input (``key of 145 bytes`` and ``key of 28871 bytes`` are one)."""
    return _NUMBER.sub("N", _QUOTED.sub("...", line))


async def http_reply(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """Status and body of one HTTP/1.1 reply with a Content-Length."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length = 0
    for line in lines[1:]:
        key, _, value = line.partition(":")
        if key.strip().lower() == "content-length":
            length = int(value)
    return status, await reader.readexactly(length)
