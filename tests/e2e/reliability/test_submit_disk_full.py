"""/submit on a full disk: a 200 only for what is stored, a 507 with the reason for the
rest, and every 200 read back after a restart.

The broker's queue directory is a real 1 MiB tmpfs (tests/smalldisk.py), so its writes
fail in the kernel with ENOSPC as on any full disk. The disk alarm is off: it would refuse
every write on so small a disk before the kernel does (its own test is test_disk_alarm.py).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
from pathlib import Path

from fqbroker.clients.fq.client import Client
from fqbroker.protocols.fq import wire
from tests.e2e.http.test_http import get
from tests.procs import Proc
from tests.smalldisk import small_disk

SIZE = 1 << 20
PAYLOAD = b"x" * 1000
SOURCE = "u/full/disk:permanent,backlog=-1"
HEADERS = [("X-Fq-Route", "r"), ("X-Fq-Exchange", "logs")]


async def _read_stderr(fqd: Proc) -> None:
    # A broker that logs a line per failed write must not stall on a full pipe.
    assert fqd.proc.stderr is not None
    while line := await fqd.proc.stderr.readline():
        fqd.err_lines.append(line.decode().rstrip("\n"))


async def test_submit_answers_507_on_a_full_disk_and_200_only_for_what_it_stored(
    tmp_path: Path,
) -> None:
    answered: dict[int, tuple[int, bytes]] = {}
    conf = tmp_path / "fqd.toml"
    conf.write_text("[fqd]\ndisk_free_limit = 0\n")
    with small_disk(tmp_path / "queues", SIZE):
        fqd, port = await Proc.start_fqd(tmp_path, "--config", str(conf))
        reading = asyncio.ensure_future(_read_stderr(fqd))
        try:
            async with asyncio.timeout(120):
                async with Client(port=port, source=SOURCE) as setup:
                    await setup.bind(b"logs", b"prefix:", wire.BindFlags.PERM)
                # Until the disk has been full for a while: twice what it holds at most.
                refused = 0
                for n in range(1, 2 * SIZE // len(PAYLOAD)):
                    response, body = await get(port, "/submit", HEADERS, b"%06d " % n + PAYLOAD)
                    answered[n] = (response.status_code, body)
                    refused = refused + 1 if response.status_code != 200 else 0
                    if refused == 20:
                        break
        finally:
            fqd.proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(10):
                await reading
                await fqd.proc.wait()
        # What the broker wrote, kept past the tmpfs.
        shutil.copytree(tmp_path / "queues", tmp_path / "kept")
    ok = [n for n, (status, _) in answered.items() if status == 200]
    failed = {n: answer for n, answer in answered.items() if answer[0] != 200}
    assert ok and failed, answered
    for status, body in failed.values():
        assert status == 507, (status, body)
        assert json.loads(body)["error"] == "disk queue write failed: disk full"

    # On a disk with room again, every message answered 200 is there, in order.
    shutil.copytree(tmp_path / "kept", tmp_path / "queues", dirs_exist_ok=True)
    fqd, port = await Proc.start_fqd(tmp_path, "--config", str(conf))
    try:
        async with asyncio.timeout(60):
            response, _ = await get(port, "/submit", HEADERS, b"999999 the end")
            assert response.status_code == 200
            got: list[int] = []
            async with Client(port=port, source=SOURCE) as reader:
                while (number := int((await reader.receive()).payload[:6])) != 999999:
                    got.append(number)
        assert set(ok) <= set(got), sorted(set(ok) - set(got))
        assert got == sorted(got)
    finally:
        fqd.kill()
        await fqd.proc.wait()


async def test_submit_answers_507_while_the_disk_alarm_is_set(tmp_path: Path) -> None:
    """The default disk_free_limit (256 MiB) is more than the whole disk: the alarm is set
    from the start, the store refuses the write, and /submit says the disk is full."""
    with small_disk(tmp_path / "queues", SIZE):
        fqd, port = await Proc.start_fqd(tmp_path)
        reading = asyncio.ensure_future(_read_stderr(fqd))
        try:
            async with asyncio.timeout(60):
                async with Client(port=port, source=SOURCE) as setup:
                    await setup.bind(b"logs", b"prefix:", wire.BindFlags.PERM)
                response, body = await get(port, "/submit", HEADERS, b"000001 " + PAYLOAD)
                assert response.status_code == 507, body
                assert json.loads(body)["error"] == "disk queue write failed: disk full"
        finally:
            fqd.proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(10):
                await reading
                await fqd.proc.wait()
