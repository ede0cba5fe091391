"""Child processes for tests: started with this interpreter, stderr read as it comes."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


class Proc:
    """A child process whose stderr is read line by line as it comes."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.err_lines: list[str] = []

    @classmethod
    async def start(
        cls,
        *args: str,
        stdin: int | None = None,
        preexec_fn: Callable[[], None] | None = None,
        env: dict[str, str] | None = None,
    ) -> Proc:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *args,
            stdin=stdin if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=ENV if env is None else env,
            preexec_fn=preexec_fn,
        )
        return cls(proc)

    async def wait_stderr(self, text: str, *, anywhere: bool = False) -> str:
        """Read stderr until a line starts with ``text`` (or holds it ``anywhere``); returns
        that line."""
        assert self.proc.stderr is not None
        while True:
            raw = await self.proc.stderr.readline()
            if not raw:
                raise AssertionError(f"no {text!r} line; stderr was {self.err_lines}")
            line = raw.decode().rstrip("\n")
            self.err_lines.append(line)
            if line.startswith(text) or (anywhere and text in line):
                return line

    async def finish(self, stdin: bytes | None = None) -> tuple[int, bytes, str]:
        """Feed stdin, wait for exit: (status, stdout, the rest of stderr)."""
        out, err = await self.proc.communicate(stdin)
        self.err_lines += err.decode().splitlines()
        assert self.proc.returncode is not None
        return self.proc.returncode, out, "\n".join(self.err_lines)

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()

    @classmethod
    async def start_fqd(
        cls, state: Path, *args: str, preexec_fn: Callable[[], None] | None = None
    ) -> tuple[Proc, int]:
        """``python -m fqbroker`` on a free port with its state under ``state``."""
        fqd = await cls.start(
            "-m", "fqbroker", "-p", "0", "-n", "10.254.254.1",
            "-c", str(state / "fqd.sqlite"), "-q", str(state / "queues"), *args,
            preexec_fn=preexec_fn,
        )  # fmt: skip
        line = await fqd.wait_stderr("Listening on port: ")
        return fqd, int(line.rsplit(" ", 1)[1])
