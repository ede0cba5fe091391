"""The README's quick start and Python example, run as the README writes them.

The blocks are read from README.md itself (the ``sh`` and ``python`` blocks of its "Quick
start" section), not copied here, so an edit to the README that breaks them fails this
test. They are run unchanged, against the broker ``make run`` starts (its install step
skipped: the venv running the tests is the one used, linked as ``.venv`` in a scratch
directory), which listens on 127.0.0.1:8765 as the README says.

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
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PORT = 8765  # the README's
TIMEOUT = 30.0


# --- the blocks ------------------------------------------------------------------------------


def section(text: str, title: str) -> str:
    """The body of the ``## title`` section (up to the next ``## ``)."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", text, re.M | re.S)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.M | re.S)


def quick_start() -> tuple[list[str], str]:
    """The quick start's shell commands (comments dropped) and its Python example."""
    body = section(README.read_text(encoding="utf-8"), "Quick start")
    (shell,) = blocks(body, "sh")
    (python,) = blocks(body, "python")
    commands = [line for line in shell.splitlines() if line.strip() and not line.startswith("#")]
    return commands, python


def test_the_quick_start_is_what_this_test_expects() -> None:
    """The shape :func:`drive` relies on: a receiver to start first, then a sender."""
    commands, python = quick_start()
    assert len(commands) == 2, commands
    assert "fq-recv" in commands[0] and "fq-send" in commands[1], commands
    assert "Client(port=8765" in python


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
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/stats.json", timeout=2) as r:
            stats = json.load(r)
    except OSError:
        return False
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


def drive(work: Path, venv: Path, netns: bool) -> dict[str, object]:
    """Run ``make run``, then the quick start and the Python example, in ``work``."""
    if netns:
        _lo_up()
    commands, python = quick_start()
    (work / ".venv").symlink_to(venv)
    (work / "example.py").write_text(python, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": f"{venv / 'bin'}:{os.environ['PATH']}"}
    started: list[subprocess.Popen[bytes]] = []

    def start(args: list[str], **kw: object) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(args, env=env, start_new_session=True, **kw)  # type: ignore[call-overload]
        started.append(proc)
        return proc

    report: dict[str, object] = {}
    try:
        # make run, as the quick start has it going in terminal 1 (-o install: no pip).
        make = [shutil.which("make") or "make", "--no-print-directory", "-o", "install", "run"]
        broker = start(
            [*make, f"VENV={work / '.venv'}", f"VARDIR={work / 'var'}"],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        listening = _read_until(broker.stderr, lambda got: b"Listening on port:" in got)
        report["listening"] = re.findall(r"Listening on port: \d+", listening.decode())

        # Terminal 2, then terminal 3 once terminal 2 has bound its queue.
        receiver = start(
            ["sh", "-c", commands[0]],
            cwd=work,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _until(lambda: _bound("maryland") or receiver.poll() is not None, "fq-recv to bind")
        sender = subprocess.run(
            ["sh", "-c", commands[1]], cwd=work, env=env, capture_output=True, timeout=TIMEOUT
        )
        report["send"] = [sender.returncode, sender.stderr.decode()]
        out = _read_until(receiver.stdout, lambda got: got.count(b"\n") >= 2)
        report["recv"] = out.decode().splitlines(keepends=True)
        _stop(receiver)
        report["recv_stderr"] = _read_until(receiver.stderr, lambda got: False).decode()

        # The Python example, as a file run with the venv's Python.
        example = subprocess.run(
            [str(work / ".venv" / "bin" / "python"), "example.py"],
            cwd=work,
            env=env,
            capture_output=True,
            timeout=TIMEOUT,
        )
        report["example"] = [example.returncode, example.stdout.decode(), example.stderr.decode()]
    finally:
        for proc in reversed(started):
            _stop(proc)
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


def test_quick_start_and_python_example_run_as_written(tmp_path: Path) -> None:
    from .prereqs import missing

    prefix = _namespace_command()
    if prefix is None and not _port_free():
        missing(f"no network namespace here, and port {PORT} (the README's) is in use")
    script = [sys.executable, __file__, str(tmp_path), sys.prefix, "netns" if prefix else "host"]
    run = subprocess.run(
        [*(prefix or []), *script], capture_output=True, timeout=4 * TIMEOUT, cwd=ROOT
    )
    assert run.returncode == 0, run.stderr.decode()
    report = json.loads(run.stdout)
    assert report["listening"] == [f"Listening on port: {PORT}"], report
    assert report["send"][0] == 0, report
    assert report["recv"] == ["[test.prefix.boo] hello\n", "[test.prefix.boo] world\n"], report
    code, out, err = report["example"]
    assert (code, out) == (0, "test.one me b'payload'\n"), err
    assert "Traceback" not in err


if __name__ == "__main__":
    work, venv, where = sys.argv[1:4]
    print(json.dumps(drive(Path(work), Path(venv), where == "netns")))
