"""`make run` starts a broker that clients can use, and SIGTERM stops it cleanly."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

from tests.conftest import open_session

ROOT = Path(__file__).resolve().parents[2]


async def _listening_port(stderr: asyncio.StreamReader) -> int:
    async with asyncio.timeout(60):
        while line := await stderr.readline():
            if m := re.search(rb"Listening on port: (\d+)", line):
                return int(m.group(1))
    raise AssertionError("fqd exited before it listened")


async def test_make_run_starts_a_working_broker(tmp_path: Path) -> None:
    venv = Path(sys.prefix)
    proc = await asyncio.create_subprocess_exec(
        "make",
        "--no-print-directory",
        "run",
        "PORT=0",
        f"VARDIR={tmp_path / 'var'}",
        f"VENV={venv}",
        cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert proc.stderr is not None
        port = await _listening_port(proc.stderr)
        consumer = await open_session(port, b"reader")
        publisher = await open_session(port, b"writer")
        await consumer.bind(b"ex", b"prefix:")
        await publisher.publish(b"ex", b"r", b"via make run")
        (msg,) = await consumer.receive()
        assert (msg.payload, msg.sender) == (b"via make run", b"writer")
        await consumer.close()
        await publisher.close()
        # Stop fqd itself, as an operator's Ctrl-C or service manager would; make then
        # exits with fqd's status.
        for child in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split():
            os.kill(int(child), signal.SIGTERM)
        async with asyncio.timeout(10):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
    assert (tmp_path / "var").is_dir()
