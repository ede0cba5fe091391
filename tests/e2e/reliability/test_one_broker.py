"""One broker per store: a second fqd given the queue directory or the config database of
a running one refuses to start, in one line naming what is taken and the holder's pid,
and the first serves on with every message it confirmed intact. After a kill -9 the
kernel has let the lock go, and a new fqd starts on the same store."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from fqbroker.clients.fq.client import Client
from tests.procs import Proc

SOURCE = "u/keep/disk:permanent,backlog=-1,public"
ADVICE = "give this one its own data directory (--data-dir, or -c and -q) or stop the other"


async def start(config_db: Path, queue_dir: Path) -> Proc:
    return await Proc.start(
        "-m", "fqbroker", "-p", "0", "-n", "10.254.254.1",
        "-c", str(config_db), "-q", str(queue_dir),
    )  # fmt: skip


async def listening(fqd: Proc) -> int:
    line = await fqd.wait_stderr("Listening on port: ")
    return int(line.rsplit(" ", 1)[1])


async def publish_confirmed(port: int, first: int, count: int) -> None:
    async with Client(port=port, source="pub", reconnect=False) as publisher:
        for seq in range(first, first + count):
            publisher.publish(b"keep", b"r", b"%d" % seq)
        assert await publisher.confirm() == count


async def read_all(port: int, count: int) -> list[int]:
    got: list[int] = []
    async with Client(port=port, source=SOURCE, reconnect=False) as consumer:
        await consumer.bind(b"keep", b"prefix:", 0x0110)
        async for msg in consumer.messages():
            got.append(int(msg.payload))
            if len(got) == count:
                break
    return got


async def stop(fqd: Proc) -> None:
    if fqd.proc.returncode is None:
        fqd.proc.send_signal(signal.SIGTERM)
    await fqd.proc.wait()


async def filled(proc: Proc, count: int) -> int:
    """Once ``proc`` listens: its queue bound for good and ``count`` messages confirmed
    into it (1 to ``count``); its port."""
    port = await listening(proc)
    async with Client(port=port, source=SOURCE, reconnect=False) as setup:
        await setup.bind(b"keep", b"prefix:", 0x0110)
    await publish_confirmed(port, 1, count)
    return port


# What the second fqd shares with the first: both, only the queue directory, only the
# config database (each case names the one it finds taken first).
SHARED = ["both", "queue_dir", "config_db"]


@pytest.mark.parametrize("shared", SHARED)
async def test_a_second_fqd_on_a_store_in_use_refuses_and_the_first_keeps_it(
    tmp_path: Path, shared: str
) -> None:
    config_db, queue_dir = tmp_path / "a" / "fqd.sqlite", tmp_path / "a" / "queues"
    other_db = config_db if shared in ("both", "config_db") else tmp_path / "b" / "fqd.sqlite"
    other_q = queue_dir if shared in ("both", "queue_dir") else tmp_path / "b" / "queues"
    taken = str(queue_dir) if shared != "config_db" else f"config database {config_db}"
    first = await start(config_db, queue_dir)
    try:
        async with asyncio.timeout(60):
            port = await filled(first, 500)

            second = await start(other_db, other_q)
            try:
                code, _out, err = await second.finish()
            finally:
                second.kill()
            assert code == 1
            assert err == (
                f"fqd: {taken} is in use by another fqd (pid {first.proc.pid}): {ADVICE}"
            )

            # fq-admin -c on the running broker's database takes no lock and works on.
            admin = await Proc.start(
                "-m", "fqbroker.cli.admin", "-c", str(config_db), "user", "list"
            )
            status, _out, err = await admin.finish()
            assert status == 0, err

            await publish_confirmed(port, 501, 500)  # the first serves on
            await stop(first)
            first = await start(config_db, queue_dir)
            port = await listening(first)
            assert await read_all(port, 1000) == list(range(1, 1001))
    finally:
        first.kill()
        await first.proc.wait()


async def test_after_kill_9_a_new_fqd_starts_on_the_same_store(tmp_path: Path) -> None:
    config_db, queue_dir = tmp_path / "fqd.sqlite", tmp_path / "queues"
    first = await start(config_db, queue_dir)
    try:
        async with asyncio.timeout(60):
            port = await filled(first, 100)
            first.proc.kill()
            await first.proc.wait()
            # The kernel dropped the lock with the process; its pid left in the file is stale.
            assert (queue_dir / ".fqbroker.lock").read_text() == f"{first.proc.pid}\n"
            first = await start(config_db, queue_dir)
            port = await listening(first)
            assert (queue_dir / ".fqbroker.lock").read_text() == f"{first.proc.pid}\n"
            assert await read_all(port, 100) == list(range(1, 101))
    finally:
        first.kill()
        await first.proc.wait()
