"""Standard input of every tool that reads it, each way it comes: a file, a pipe, a
terminal, /dev/null and /dev/zero. Real processes against a real broker on loopback: EOF
ends the input, an endless source is bounded by --count, a line limit or a signal, and
no way prints a traceback or hangs."""

from __future__ import annotations

import asyncio
import os
import pty
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import on, port_of, running
from tests.procs import Proc

TIMEOUT = 30.0
LINES = b"one\ntwo\n"
KINDS = ("file", "pipe", "pty", "devnull")


@pytest.fixture
async def broker(settings: Settings) -> AsyncIterator[Broker]:
    async with running(on(on(settings, "figg"), "fyrehose")) as b:
        yield b


def tool_args(broker: Broker, tool: str) -> tuple[str, ...]:
    """How to run ``tool`` (as its ``python -m``) against ``broker``, reading lines."""
    match tool:
        case "fq-send":
            return ("-m", "fqbroker.cli.fqtools", "send", "-p", str(broker.port))
        case "figg pub":
            port = str(port_of(broker, "figg"))
            return ("-m", "fqbroker.cli.figg", "--port", port, "pub", "t")
        case "fyrehose push":
            port = str(port_of(broker, "fyrehose"))
            return ("-m", "fqbroker.cli.fyrehose", "--port", port, "push")
        case "fq-admin publish":
            url = f"http://127.0.0.1:{broker.port}"
            return ("-m", "fqbroker.cli.admin", "--url", url, "publish", "ex", "r", "--file", "-")
    raise AssertionError(tool)


# How many messages each tool says it sent, in its last line.
SENT = {
    "fq-send": "sent {} messages in ",
    "figg pub": "published {} messages in ",
    "fyrehose push": "pushed {} messages",
}


class Stdin:
    """One kind of standard input for a child: what to pass as its stdin, what to write
    to it once started (a pipe, a terminal), and what to close after."""

    def __init__(self, kind: str, tmp_path: Path, data: bytes) -> None:
        self.kind, self.data = kind, data
        self.fds: list[int] = []
        self.master: int | None = None
        match kind:
            case "file":
                path = tmp_path / "stdin.txt"
                path.write_bytes(data)
                self.arg: int = self._open(str(path))
            case "pipe":
                self.arg = asyncio.subprocess.PIPE
            case "pty":
                self.master, slave = pty.openpty()
                self.fds += [self.master, slave]
                self.arg = slave
            case "devnull" | "zero":
                self.arg = self._open(f"/dev/{'null' if kind == 'devnull' else 'zero'}")

    def _open(self, path: str) -> int:
        fd = os.open(path, os.O_RDONLY)
        self.fds.append(fd)
        return fd

    def feed(self) -> bytes | None:
        """After the start: the bytes for ``Proc.finish`` (a pipe), or written to the
        terminal, its end of input (Ctrl-D) after them."""
        if self.master is not None:
            os.write(self.master, self.data + b"\x04")
        return self.data if self.kind == "pipe" else None

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()


@pytest.fixture
def stdins(tmp_path: Path) -> Iterator[list[Stdin]]:
    made: list[Stdin] = []
    yield made
    for stdin in made:
        stdin.close()


async def run_with(
    procs: list[Proc], stdins: list[Stdin], tmp_path: Path, args: tuple[str, ...], kind: str,
    data: bytes = LINES,
) -> tuple[int, bytes, str]:  # fmt: skip
    stdin = Stdin(kind, tmp_path, data)
    stdins.append(stdin)
    proc = await Proc.start(*args, stdin=stdin.arg)
    procs.append(proc)
    async with asyncio.timeout(TIMEOUT):  # a hang fails here
        return await proc.finish(stdin.feed())


def no_traceback(err: str) -> None:
    assert "Traceback" not in err, err


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tool", list(SENT))
async def test_lines_from_each_kind_of_stdin(
    broker: Broker, procs: list[Proc], stdins: list[Stdin], tmp_path: Path, tool: str, kind: str
) -> None:
    status, _, err = await run_with(procs, stdins, tmp_path, tool_args(broker, tool), kind)
    assert status == 0, err
    no_traceback(err)
    count = 0 if kind == "devnull" else 2
    assert SENT[tool].format(count) in err.splitlines()[-1], err


@pytest.mark.parametrize("kind", KINDS)
async def test_fq_admin_publishes_stdin_of_each_kind(
    broker: Broker, procs: list[Proc], stdins: list[Stdin], tmp_path: Path, kind: str
) -> None:
    args = tool_args(broker, "fq-admin publish")
    status, out, err = await run_with(procs, stdins, tmp_path, args, kind)
    assert status == 0, err
    no_traceback(err)
    assert out.startswith(b"published"), out


async def test_fq_send_counts_and_ignores_an_endless_stdin(
    broker: Broker, procs: list[Proc], stdins: list[Stdin], tmp_path: Path
) -> None:
    args = (*tool_args(broker, "fq-send"), "--count", "5")
    status, _, err = await run_with(procs, stdins, tmp_path, args, "zero")
    assert status == 0, err
    assert "sent 5 messages in " in err


@pytest.mark.parametrize(
    ("tool", "status", "limit"),
    [("figg pub", 2, 16 << 20), ("fyrehose push", 2, 65507)],
)
async def test_an_endless_line_ends_with_the_limit(
    broker: Broker, procs: list[Proc], stdins: list[Stdin], tmp_path: Path,
    tool: str, status: int, limit: int,
) -> None:  # fmt: skip
    # /dev/zero never ends a line: what one message can carry bounds it.
    code, _, err = await run_with(procs, stdins, tmp_path, tool_args(broker, tool), "zero")
    assert code == status, err
    (line,) = err.splitlines()
    assert line.startswith(f"{tool.split()[0]}: line 1 of stdin is over "), err
    assert int(line.split(" is over ")[1].split()[0]) <= limit


async def test_figg_pub_stops_at_its_count(
    broker: Broker, procs: list[Proc], stdins: list[Stdin], tmp_path: Path
) -> None:
    args = (*tool_args(broker, "figg pub"), "--count", "1")
    status, _, err = await run_with(procs, stdins, tmp_path, args, "pty")
    assert status == 0, err
    assert "published 1 messages in " in err


def _catches_sigterm(pid: int) -> bool:
    """Whether ``pid`` has a SIGTERM handler: the tool's event loop runs (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("tool", list(SENT))
async def test_a_signal_ends_a_tool_reading_a_terminal(
    broker: Broker, procs: list[Proc], stdins: list[Stdin], tmp_path: Path,
    tool: str, sig: signal.Signals,
) -> None:  # fmt: skip
    # A terminal left open is an input without end: only a signal stops the tool.
    stdin = Stdin("pty", tmp_path, b"")
    stdins.append(stdin)
    proc = await Proc.start(*tool_args(broker, tool), stdin=stdin.arg)
    procs.append(proc)
    async with asyncio.timeout(TIMEOUT):
        while not _catches_sigterm(proc.proc.pid):
            assert proc.proc.returncode is None
            await asyncio.sleep(0.05)
        assert stdin.master is not None
        os.write(stdin.master, b"one\n")
        await asyncio.sleep(0.2)  # not needed for the outcome: a line may be in flight
        proc.proc.send_signal(sig)
        status, _, err = await proc.finish()
    assert status == 128 + sig, err
    assert "Traceback" not in err, err


@pytest.mark.parametrize(
    "args",
    [
        ("-m", "fqbroker.cli.fqtools", "send", "--password-stdin"),
        ("-m", "fqbroker.cli.fqtools", "recv", "--password-stdin"),
    ],
    ids=["fq-send", "fq-recv"],
)
async def test_password_stdin_with_no_line_is_said(
    broker: Broker, procs: list[Proc], stdins: list[Stdin], tmp_path: Path, args: tuple[str, ...]
) -> None:
    args = (*args, "-p", str(broker.port))
    status, _, err = await run_with(procs, stdins, tmp_path, args, "devnull")
    assert status == 2, err
    assert err.endswith(": --password-stdin: stdin ended before a password line"), err


async def test_fq_admin_password_stdin_with_no_line_is_said(
    broker: Broker, procs: list[Proc], stdins: list[Stdin], tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{broker.port}"
    args = ("-m", "fqbroker.cli.admin", "--url", url, "--user", "root", "--password-stdin")
    status, _, err = await run_with(procs, stdins, tmp_path, (*args, "status"), "devnull")
    assert status == 2, err
    assert err == "fq-admin: stdin ended before the password line (--password-stdin)"


@pytest.mark.parametrize("kind", ["devnull", "pty"])
async def test_opencluster_ignores_its_stdin(
    settings: Settings, procs: list[Proc], stdins: list[Stdin], tmp_path: Path, kind: str
) -> None:
    async with running(on(settings, "opencluster")) as broker:
        port = str(port_of(broker, "opencluster"))
        args = ("-m", "fqbroker.cli.opencluster", "--port", port, "ping")
        status, _, err = await run_with(procs, stdins, tmp_path, args, kind)
    assert status == 0, err


async def test_lines_are_bounded_and_scanned_once() -> None:
    from fqbroker.cli.stdin import lines

    async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
        for part in parts:
            yield part

    got = [x async for x in lines(chunks(b"ab", b"c\nde", b"f\n", b"g"), max_line=3)]
    assert got == [b"abc", b"def", b"g"]
    with pytest.raises(ValueError, match="line 2 of stdin is over 3 bytes"):
        [x async for x in lines(chunks(b"abc\nde", b"fg"), max_line=3)]
    with pytest.raises(ValueError, match="line 1 of stdin is over 3 bytes"):
        [x async for x in lines(chunks(b"abcd\n"), max_line=3)]
