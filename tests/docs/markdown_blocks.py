"""Runs the ``sh``, ``console`` and ``python`` blocks of a Markdown document as a reader
would, and loads its ``toml`` blocks as settings.

Sybil (https://sybil.readthedocs.io) reads the document: its Markdown lexers find the
fenced blocks, its ``<!-- skip: next "why" -->`` comment marks a block that does not run
(the reason is required: :func:`skip_reasons`), and its ``<!-- invisible-code-block: sh -->``
comment runs what the text takes for granted ("with `make run` going"). The evaluators here
are ours, since what a shell block means is this project's business:

* each command of an ``sh`` block runs with ``sh -c`` in a scratch directory where
  ``.venv`` is the venv running the tests, in order, and must exit 0;
* ``fqd`` and ``make run`` are terminal 1: they run in the background, and a new one
  stops what the document's earlier blocks left running; ``fq-recv`` (without
  ``--count``), ``figg sub`` and ``fyrehose sub`` run in the background too, once bound;
* ``console`` blocks: each ``$ command`` runs, and the lines under it are what it must
  print on stdout and stderr, as a terminal shows them (``...`` stands for anything);
* ``python`` blocks run as a file with the venv's Python (one with ``await`` at the top
  level as the body of a coroutine, as ``python -m asyncio`` runs it); a ``# -> text`` comment on a
  ``print(...)`` line is a line it must print. A block that keeps running after printing
  (a subscriber) is left running like a terminal;
* the prose after a block, "`tool` prints `text`", is checked against what that tool
  printed;
* ``toml`` blocks are settings files, or parts of one: fqd's loader must take each.

Every broker listens where the document says (127.0.0.1:8765 and the rest), so the run
happens in a network namespace of its own (tests/docs/test_markdown.py); this module is
what runs inside it, as a script that prints a JSON report of every block.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.client
import json
import os
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import SkipTest

from sybil import Document, Example, Region, Sybil
from sybil.example import NotEvaluated
from sybil.parsers.markdown import CodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
RUN = ("sh", "console", "python", "toml")  # toml: loaded as settings; the rest are not read
TIMEOUT = 30.0
PASSWORD = "correct horse"  # $PASSWORD of the examples, and what fq-admin reads when it asks


# --- the processes ---------------------------------------------------------------------------


@dataclass
class Proc:
    """A command and what it printed so far (threads drain its pipes)."""

    command: str
    popen: subprocess.Popen[bytes]
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    changed: threading.Condition = field(default_factory=threading.Condition)
    drains: list[threading.Thread] = field(default_factory=list)

    def __post_init__(self) -> None:
        for pipe, buf in ((self.popen.stdout, self.out), (self.popen.stderr, self.err)):
            drain = threading.Thread(target=self._drain, args=(pipe, buf), daemon=True)
            drain.start()
            self.drains.append(drain)

    def drained(self) -> None:
        """After it exited: everything it printed is in ``out`` and ``err``."""
        for drain in self.drains:
            drain.join(TIMEOUT)

    def _drain(self, pipe: Any, buf: bytearray) -> None:
        for chunk in iter(lambda: os.read(pipe.fileno(), 65536), b""):
            with self.changed:
                buf += chunk
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def wait_for(self, done: Callable[[], bool], timeout: float = TIMEOUT) -> bool:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not done():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(min(left, 0.1))
        return True

    def stop(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()

    def said(self) -> str:
        return f"{self.command!r} printed:\n{self.out.decode(errors='replace')}" + (
            f"\nand on stderr:\n{self.err.decode(errors='replace')}"
        )


def _bound(exchange: str, port: int = 8765) -> bool:
    """Whether the broker on ``port`` has a binding on ``exchange`` (/stats.json)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/stats.json")
        stats = json.load(conn.getresponse())
    except (OSError, http.client.HTTPException, ValueError):
        return False
    finally:
        conn.close()
    return bool(stats.get("exchanges", {}).get(exchange, {}).get("routes"))


class Session:
    """The terminals of one document: a scratch directory, and what runs in it."""

    def __init__(self, work: Path) -> None:
        self.work = work
        (work / ".venv").symlink_to(sys.prefix)
        (work / "examples").symlink_to(ROOT / "examples")
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "PATH": f"{Path(sys.prefix) / 'bin'}:{os.environ['PATH']}",
            "XDG_STATE_HOME": str(work / "state"),  # the default data directory, of its own
            "HOME": str(work),
            "PWD": str(work),
            "PASSWORD": PASSWORD,
        }
        self.running: list[Proc] = []
        self.finished: list[Proc] = []

    def start(self, command: list[str] | str, cwd: Path | None = None) -> Proc:
        args = ["sh", "-c", command] if isinstance(command, str) else command
        popen = subprocess.Popen(
            args,
            cwd=cwd or self.work,
            env=self.env,
            start_new_session=True,  # no terminal: getpass reads stdin
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert popen.stdin is not None
        # fq-admin asks for a password twice; anything else reading stdin gets EOF after.
        with contextlib.suppress(BrokenPipeError):
            popen.stdin.write(f"{PASSWORD}\n{PASSWORD}\n".encode())
        with contextlib.suppress(BrokenPipeError):
            popen.stdin.close()
        proc = Proc(command if isinstance(command, str) else shlex.join(command), popen)
        self.running.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.running):
            proc.stop()
        self.running.clear()

    def run(self, command: str) -> Proc:
        """A command that ends by itself; it must exit 0."""
        proc = self.start(command)
        self.running.remove(proc)
        try:
            proc.popen.wait(TIMEOUT * 2)
        except subprocess.TimeoutExpired:
            proc.stop()
            raise AssertionError(f"did not end in {TIMEOUT * 2:.0f} s: {proc.said()}") from None
        proc.drained()
        self.finished.append(proc)
        if proc.popen.returncode != 0:
            raise AssertionError(f"exit status {proc.popen.returncode}: {proc.said()}")
        return proc

    def broker(self, command: list[str] | str, cwd: Path | None = None) -> None:
        """Terminal 1: what ran before stops, then the broker starts and listens."""
        self.stop_all()
        proc = self.start(command, cwd)
        if not proc.wait_for(
            lambda: b"Listening on port:" in proc.err or proc.popen.poll() is not None
        ):
            raise AssertionError(f"no 'Listening on port' in {TIMEOUT:.0f} s: {proc.said()}")
        if proc.popen.poll() is not None:
            raise AssertionError(f"the broker exited: {proc.said()}")

    def follower(self, command: str, exchange: str | None) -> None:
        """A command that runs until stopped: started, and bound when it binds."""
        proc = self.start(command)
        if exchange is not None:
            proc.wait_for(lambda: proc.popen.poll() is not None or _bound(exchange))
        else:
            # figg sub, fyrehose sub: up once it holds a connection; nothing to ask for that
            # but its first output or a moment.
            proc.wait_for(lambda: proc.popen.poll() is not None or bool(proc.out), 1.0)
        if proc.popen.poll() is not None:
            raise AssertionError(f"exited with status {proc.popen.returncode}: {proc.said()}")

    def printed_by(self, tool: str) -> list[Proc]:
        return [
            p for p in self.running + self.finished[::-1] if re.search(rf"\b{tool}\b", p.command)
        ]


# --- the blocks ------------------------------------------------------------------------------


def commands_of(source: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, comment lines dropped."""
    commands: list[str] = []
    pending = ""
    for line in source.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        commands.append(pending + line)
        pending = ""
    return commands


def _words(command: str) -> list[str]:
    code = command.split(" #", 1)[0]
    try:
        return shlex.split(code)
    except ValueError:
        return code.split()


def _exchange_of(words: list[str]) -> str | None:
    for flag in ("-e", "-x", "--exchange"):
        if flag in words[:-1]:
            return words[words.index(flag) + 1]
    return None


def run_command(session: Session, command: str) -> None:
    words = _words(command)
    tool = Path(words[0]).name if words else ""
    if tool == "export":
        for assignment in words[1:]:
            name, _, value = assignment.partition("=")
            session.env[name] = value.replace("$PWD", str(session.work))
    elif tool == "make" and words[1:2] == ["run"]:
        make = [shutil.which("make") or "make", "--no-print-directory", "-o", "install", "run"]
        make += [f"VENV={session.work / '.venv'}", f"VARDIR={session.work / 'var'}"]
        session.broker(make, cwd=ROOT)
    elif tool == "fqd" and not {"--version", "--help", "--print-config"} & set(words):
        session.broker(command)
    elif tool == "fq-recv" and "--count" not in words:
        session.follower(command, _exchange_of(words))
    elif tool in ("figg", "fyrehose") and "sub" in words:
        session.follower(command, None)
    else:
        session.run(command)


def _pattern(expected: str) -> re.Pattern[str]:
    """``expected`` as a whole line, ``...`` standing for anything."""
    return re.compile(".*".join(map(re.escape, expected.split("..."))) + r"\Z")


def _lines(proc: Proc) -> list[str]:
    return proc.out.decode(errors="replace").splitlines()


def evaluate_sh(example: Example) -> None:
    session: Session = example.namespace["session"]
    for command in commands_of(example.parsed):
        run_command(session, command)


def evaluate_console(example: Example) -> None:
    session: Session = example.namespace["session"]
    steps: list[tuple[str, list[str]]] = []
    for line in str(example.parsed).splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps and line.strip():
            steps[-1][1].append(line)
    for command, expected in steps:
        got = _lines(session.run(f"{{ {command}\n}} 2>&1"))  # a terminal shows both
        patterns = [_pattern(e) for e in expected]
        if len(got) != len(patterns) or not all(
            p.match(g) for p, g in zip(patterns, got, strict=True)
        ):
            raise AssertionError(
                f"{command!r} printed\n{chr(10).join(got)}\nnot\n{chr(10).join(expected)}"
            )


# A block written with ``await`` at the top level, as in ``python -m asyncio``, runs as the
# body of a coroutine (compile's PyCF_ALLOW_TOP_LEVEL_AWAIT, what that REPL uses).
AWAIT_AT_TOP_LEVEL = """
import ast, asyncio, sys
path = sys.argv[1]
code = compile(open(path).read(), path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
body = eval(code, {"__name__": "__main__"})
if body is not None:
    asyncio.run(body)
"""


def _awaits_at_top_level(source: str) -> bool:
    try:
        compile(source, "<block>", "exec")
    except SyntaxError as exc:
        return "outside" in str(exc.msg) and ("await" in str(exc.msg) or "async" in str(exc.msg))
    return False


def evaluate_python(example: Example) -> None:
    session: Session = example.namespace["session"]
    source = str(example.parsed)
    script = session.work / f"block_{example.line}.py"
    script.write_text(source, encoding="utf-8")
    # "# -> text (a remark)": the remark in parentheses is not part of the line
    expected = [
        re.sub(r"\s+\([^)]*\)$", "", m.group(1).strip())
        for m in re.finditer(r"print\(.*\)\s*#\s*->\s*(.+)$", source, re.M)
    ]
    python = [str(Path(sys.prefix) / "bin" / "python")]
    if _awaits_at_top_level(source):
        python += ["-c", AWAIT_AT_TOP_LEVEL]
    proc = session.start([*python, script.name])
    lines_in = lambda: proc.out.count(b"\n") >= max(1, len(expected))  # noqa: E731
    proc.wait_for(lambda: proc.popen.poll() is not None or lines_in())
    if proc.popen.poll() is None:  # a subscriber: a moment to end by itself, else it runs on
        proc.wait_for(lambda: proc.popen.poll() is not None, 1.0)
    if proc.popen.poll() is not None:
        session.running.remove(proc)
        proc.drained()
        if proc.popen.returncode != 0:
            raise AssertionError(f"exit status {proc.popen.returncode}: {proc.said()}")
    got = _lines(proc)
    for want in expected:
        if not any(_pattern(want).match(line) for line in got):
            raise AssertionError(f"no line {want!r}: {proc.said()}")


def evaluate_toml(example: Example) -> None:
    """A TOML block is a settings file, or a part of one: fqd's loader must take it (a
    pyproject.toml table, only TOML's parser)."""
    from fqbroker.server.frontends import FRONT_ENDS
    from fqbroker.settings.broker import Settings

    source = str(example.parsed)
    if re.match(r"\[+(project|tool|build-system)\b", source.lstrip()):  # a pyproject.toml's
        tomllib.loads(source)
        return
    session: Session = example.namespace["session"]
    path = session.work / f"block_{example.line}.toml"
    path.write_text(source, encoding="utf-8")
    Settings.from_toml(path, FRONT_ENDS)


# "`fq-recv` prints `[test.prefix.boo] hello`": the prose after a block says what a tool shows.
PRINTS = re.compile(r"`((?:[\w-]+)(?: sub)?)` prints `([^`]+)`")


def prints_parser(document: Document) -> list[Region]:
    return [
        Region(m.start(), m.end(), (m.group(1), m.group(2)), evaluate_prints)
        for m in PRINTS.finditer(document.text)
    ]


def evaluate_prints(example: Example) -> None:
    session: Session = example.namespace["session"]
    tool, expected = example.parsed
    pattern = _pattern(expected)
    procs = session.printed_by(tool)
    if not procs:
        raise AssertionError(f"the text says what {tool} prints, but no {tool} ran")
    proc = procs[0]
    if not proc.wait_for(lambda: any(pattern.match(line) for line in _lines(proc))):
        raise AssertionError(f"no line {expected!r}: {proc.said()}")


def sybil() -> Sybil:
    return Sybil(
        parsers=[
            SkipParser(),
            CodeBlockParser("sh", evaluate_sh),
            CodeBlockParser("console", evaluate_console),
            CodeBlockParser("python", evaluate_python),
            CodeBlockParser("toml", evaluate_toml),
            prints_parser,
        ],
        path=str(ROOT),
        patterns=DOCUMENTS,
    )


def parse(name: str) -> Document:
    return sybil().parse(ROOT / name)


def runnable_blocks(document: Document) -> list[Example]:
    """The examples of ``sh``, ``console``, ``python`` and ``toml`` blocks (shown or
    invisible)."""
    evaluators = (evaluate_sh, evaluate_console, evaluate_python, evaluate_toml)
    return [e for e in document.examples() if e.region.evaluator in evaluators]


def fences(text: str) -> list[int]:
    """The lines of the fences of the languages that run, found without Sybil."""
    return [
        text.count("\n", 0, m.start()) + 1
        for m in re.finditer(rf"^```(?:{'|'.join(RUN)})[ \t]*$", text, re.M)
    ]


SKIP = re.compile(r"<!--\s*skip:\s*(\w+)(.*?)-->", re.S)


def skip_reasons(text: str) -> list[tuple[int, str, str]]:
    """Every skip marker: (line, action, reason as written)."""
    return [
        (text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2).strip())
        for m in SKIP.finditer(text)
    ]


# --- the run, inside the namespace -----------------------------------------------------------


def _lo_up() -> None:
    """A new network namespace's loopback is down: bring it up (SIOCSIFFLAGS)."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, siocgifflags, req)[:18])[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH", b"lo", flags | iff_up))


def run_document(name: str, work: Path) -> dict[int, list[str]]:
    """Evaluate the document's examples in order: {line: [outcome, detail]} of each."""
    document = parse(name)
    session = Session(work)
    document.namespace["session"] = session
    report: dict[int, list[str]] = {}
    try:
        for example in document.examples():
            try:
                example.evaluate()
            except SkipTest as marked:
                report[example.line] = ["marked", str(marked)]
            except NotEvaluated:
                report[example.line] = ["marked", "not evaluated"]
            except Exception as exc:  # a block's failure, reported whole
                report[example.line] = ["failed", f"{type(exc).__name__}: {exc}"]
            else:
                report[example.line] = ["ran", ""]
    finally:
        session.stop_all()
    return report


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # fqbroker, for the TOML blocks
    name, work, where = sys.argv[1:4]
    if where == "netns":
        _lo_up()
    print(json.dumps(run_document(name, Path(work))))
