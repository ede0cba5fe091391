"""The README's examples, run as the README writes them.

The blocks are read from README.md itself, not copied here, so an edit to the README that
breaks them fails this test: the ``sh`` and ``python`` blocks of "Quick start" (against the
broker ``make run`` starts, its install step skipped), then those of the Lumberjack and the
Figg sections (against the ``fqd`` line of each). The venv running the tests is the one
used, linked as ``.venv`` in a scratch directory, and every broker listens on
127.0.0.1:8765 as the README says.

The port is the README's 8765, not one the test picks: the blocks name no port, and
changing them would not test what a reader runs. So that 8765 never collides with a
broker the developer has running, everything runs in a network namespace of its own
(``unshare --net``, as root or with ``--map-root-user``). Where no namespace can be made
(a container without the privilege), it runs on the host's loopback if 8765 is free there,
and otherwise skips (fails on CI). The test runs this file as a script in that namespace
(:func:`drive`) and checks what it reports.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.client
import json
import os
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PORT = 8765  # the README's
TIMEOUT = 30.0


# --- the blocks ------------------------------------------------------------------------------


def section(text: str, title: str) -> str:
    """The body of the ``## title...`` section (up to the next ``## ``)."""
    match = re.search(rf"^## {re.escape(title)}[^\n]*\n(.*?)(?=^## )", text, re.M | re.S)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.M | re.S)


def commands_of(shell: str) -> list[str]:
    return [line for line in shell.splitlines() if line.strip() and not line.startswith("#")]


def section_blocks(title: str) -> tuple[list[str], str]:
    """A section's first shell block, as commands, and its first Python block."""
    body = section(README.read_text(encoding="utf-8"), title)
    return commands_of(blocks(body, "sh")[0]), blocks(body, "python")[0]


def quick_start() -> tuple[list[str], str]:
    """The quick start's shell commands (comments dropped) and its Python example."""
    body = section(README.read_text(encoding="utf-8"), "Quick start")
    (shell,) = blocks(body, "sh")
    (python,) = blocks(body, "python")
    return commands_of(shell), python


def lumberjack() -> tuple[list[str], str]:
    return section_blocks("Log shippers")


def figg() -> tuple[list[str], str]:
    return section_blocks("Retained topics")


def test_the_examples_are_what_this_test_expects() -> None:
    """The shape :func:`drive` relies on: which command is which terminal."""
    commands, python = quick_start()
    assert len(commands) == 2, commands
    assert "fq-recv" in commands[0] and "fq-send" in commands[1], commands
    assert "Client(port=8765" in python
    shell, python = lumberjack()
    assert "--lumberjack" in shell[0] and "fq-recv" in shell[1], shell
    assert "PyLogBeatClient" in python
    shell, python = figg()
    assert "--figg" in shell[0], shell
    assert "FiggClient" in python


def test_every_python_block_of_the_readme_compiles() -> None:
    text = README.read_text(encoding="utf-8")
    for number, block in enumerate(blocks(text, "python")):
        compile(block, f"README.md python block {number}", "exec")


# --- the run ---------------------------------------------------------------------------------


def _lo_up() -> None:
    """A new network namespace's loopback is down: bring it up (SIOCSIFFLAGS)."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, siocgifflags, req)[:18])[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH", b"lo", flags | iff_up))


def _bound(exchange: str) -> bool:
    """Whether the broker on the README's port has a binding on ``exchange``."""
    # http.client, not urllib: no proxy from the environment can come between.
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=2)
    try:
        conn.request("GET", "/stats.json")
        stats = json.load(conn.getresponse())
    except (OSError, http.client.HTTPException, ValueError):
        return False
    finally:
        conn.close()
    return bool(stats.get("exchanges", {}).get(exchange, {}).get("routes"))


def _until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _read_until(pipe: IO[bytes] | None, done: Callable[[bytes], bool]) -> bytes:
    """What ``pipe`` gives until ``done(what so far)`` or the timeout: bounded, whether or
    not the writer flushes."""
    assert pipe is not None
    fd = pipe.fileno()
    got = b""
    deadline = time.monotonic() + TIMEOUT
    while not done(got):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        got += chunk
    return got


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class _Run:
    """The processes one README walk-through starts, in ``work``, all stopped at the end."""

    def __init__(self, work: Path, venv: Path) -> None:
        self.work = work
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "PATH": f"{venv / 'bin'}:{os.environ['PATH']}",
            "XDG_STATE_HOME": str(work / "state"),  # a data directory of the test's own
        }
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, command: str | list[str], cwd: Path | None = None) -> subprocess.Popen[bytes]:
        """A terminal of the README: ``command`` runs in the background."""
        args = ["sh", "-c", command] if isinstance(command, str) else command
        proc = subprocess.Popen(
            args,
            cwd=cwd or self.work,
            env=self.env,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.started.append(proc)
        return proc

    def broker(self, command: str | list[str], cwd: Path | None = None) -> list[str]:
        proc = self.start(command, cwd)
        listening = _read_until(proc.stderr, lambda got: b"Listening on port:" in got)
        return re.findall(r"Listening on port: \d+", listening.decode())

    def run(self, command: str) -> list[object]:
        """A command of the README that ends by itself: [status, stdout, stderr]."""
        done = subprocess.run(
            ["sh", "-c", command], cwd=self.work, env=self.env, capture_output=True, timeout=TIMEOUT
        )
        return [done.returncode, done.stdout.decode(), done.stderr.decode()]

    def lines(self, proc: subprocess.Popen[bytes], n: int) -> list[str]:
        """The first ``n`` lines ``proc`` prints (fewer if it stops or times out)."""
        out = _read_until(proc.stdout, lambda got: got.count(b"\n") >= n)
        return out.decode().splitlines(keepends=True)

    def stop_all(self) -> None:
        for proc in reversed(self.started):
            _stop(proc)
        self.started.clear()


def drive(work: Path, venv: Path, netns: bool) -> dict[str, object]:
    """Walk through the README's examples in ``work``: what each printed."""
    if netns:
        _lo_up()
    (work / ".venv").symlink_to(venv)
    run = _Run(work, venv)
    report: dict[str, object] = {}
    try:
        # The quick start: make run in terminal 1 (-o install: no pip), fq-recv in
        # terminal 2, fq-send in terminal 3 once fq-recv has bound its queue.
        commands, python = quick_start()
        make = [shutil.which("make") or "make", "--no-print-directory", "-o", "install", "run"]
        make += [f"VENV={work / '.venv'}", f"VARDIR={work / 'var'}"]
        report["listening"] = run.broker(make, cwd=ROOT)
        receiver = run.start(commands[0])
        _until(lambda: _bound("maryland") or receiver.poll() is not None, "fq-recv to bind")
        report["send"] = run.run(commands[1])
        report["recv"] = run.lines(receiver, 2)
        # The Python example, as a file run with the venv's Python, with make run going.
        (work / "example.py").write_text(python, encoding="utf-8")
        report["example"] = run.run(".venv/bin/python example.py")
        run.stop_all()

        # Lumberjack: fqd with the listener, fq-recv, then the pylogbeat example.
        shell, python = lumberjack()
        report["lj_listening"] = run.broker(shell[0])
        receiver = run.start(shell[1])
        _until(lambda: _bound("logging") or receiver.poll() is not None, "fq-recv to bind")
        (work / "shipper.py").write_text(python, encoding="utf-8")
        report["lj_example"] = run.run(".venv/bin/python shipper.py")
        report["lj_recv"] = run.lines(receiver, 2)
        run.stop_all()

        # Figg: fqd with the listener, then the Python example, which publishes, then
        # follows the topic for ever: its first line is all there is to see.
        shell, python = figg()
        report["figg_listening"] = run.broker(shell[0])
        (work / "topics.py").write_text(python, encoding="utf-8")
        report["figg_example"] = run.lines(run.start(".venv/bin/python topics.py"), 1)
    finally:
        run.stop_all()
    return report


def _namespace_command() -> list[str] | None:
    """How to run a command in a network namespace of its own here, or None."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    for args in ([unshare, "--net"], [unshare, "--net", "--map-root-user"]):
        probe = subprocess.run([*args, "true"], capture_output=True, timeout=TIMEOUT)
        if probe.returncode == 0:
            return args
    return None


def _port_free() -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", PORT))
        except OSError:
            return False
    return True


def test_the_examples_run_as_written(tmp_path: Path) -> None:
    from tests.prereqs import missing, require_module

    require_module("pylogbeat", "the Lumberjack example's shipper (the dev extra)")

    prefix = _namespace_command()
    if prefix is None and not _port_free():
        missing(f"no network namespace here, and port {PORT} (the README's) is in use")
    script = [sys.executable, __file__, str(tmp_path), sys.prefix, "netns" if prefix else "host"]
    run = subprocess.run(
        [*(prefix or []), *script], capture_output=True, timeout=4 * TIMEOUT, cwd=ROOT
    )
    assert run.returncode == 0, run.stderr.decode()
    report = json.loads(run.stdout)
    listening = [f"Listening on port: {PORT}"]
    assert report["listening"] == listening, report
    assert report["send"][0] == 0, report
    assert report["recv"] == ["[test.prefix.boo] hello\n", "[test.prefix.boo] world\n"], report
    code, out, err = report["example"]
    assert (code, out) == (0, "test.one me b'payload'\n"), err

    assert report["lj_listening"] == listening, report
    assert report["lj_example"][0] == 0, report
    nginx, metricbeat = report["lj_recv"]
    assert nginx.startswith("[nginx] {") and '"GET / 200"' in nginx, report
    assert metricbeat.startswith("[metricbeat] {") and "disk 91% full" in metricbeat, report

    assert report["figg_listening"] == listening, report
    assert report["figg_example"] == ["1 b'hello'\n"], report


if __name__ == "__main__":
    work, venv, where = sys.argv[1:4]
    print(json.dumps(drive(Path(work), Path(venv), where == "netns")))
