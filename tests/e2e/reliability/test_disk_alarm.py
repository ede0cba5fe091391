"""The disk alarm on a real small file system: below disk_free_limit, publishers into disk
queues are refused (an fq confirm fails), Lumberjack shippers are held back (no ACK, ACK(0)
keepalives), OpenCluster sets are answered failinfo, all before the disk is full; one log
line when it is set and one when it clears, and then everything works again.

fqd runs as a process with its state on a tmpfs (tests/smalldisk.py) that a ballast file
fills most of; deleting the ballast clears the alarm.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path

import pytest

from fqbroker.clients.fq.client import Client, ClientError
from fqbroker.clients.opencluster.client import OpenClusterClient
from fqbroker.protocols.lumberjack import encoder
from fqbroker.protocols.lumberjack.encoder import AckReader
from tests.procs import Proc
from tests.smalldisk import small_disk

MiB = 1 << 20
DISK = 32 * MiB
LIMIT = 8 * MiB
PAYLOAD = b"x" * 1000


def free(path: Path) -> int:
    vfs = os.statvfs(path)
    return vfs.f_bavail * vfs.f_frsize


async def port_line(fqd: Proc, title: str) -> int:
    line = await fqd.wait_stderr(f"{title} listening on port: ")
    return int(line.rsplit(" ", 1)[1])


async def get(port: int, path: str) -> str:
    """The body of a GET of ``path`` on the main port."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n" % path.encode())
    answer = await reader.read()
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    return body.decode()


async def metrics(port: int) -> str:
    return await get(port, "/metrics")


def gauge(text: str, name: str) -> float:
    (line,) = [line for line in text.splitlines() if line.startswith(name + " ")]
    return float(line.split()[1])


class Shipper:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.acks = AckReader()

    async def read_acks(self, seconds: float) -> list[tuple[int, int]]:
        """Every ACK that comes within ``seconds``."""
        got: list[tuple[int, int]] = []
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                while data := await self.reader.read(65536):
                    got += self.acks.feed(data)
        return got

    async def ack(self) -> tuple[int, int]:
        """The next ACK that is not a keepalive."""
        async with asyncio.timeout(20):
            while True:
                data = await self.reader.read(65536)
                assert data, "the broker closed the connection"
                for ack in self.acks.feed(data):
                    if ack[1]:
                        return ack


async def test_the_alarm_refuses_and_holds_back_before_the_disk_fills(tmp_path: Path) -> None:
    conf = tmp_path / "fqd.toml"
    conf.write_text(f"[fqd]\ndisk_free_limit = {LIMIT}\n\n[lumberjack]\nkeepalive_seconds = 0.2\n")
    with small_disk(tmp_path / "disk", DISK) as disk:
        ballast = disk / "ballast"
        ballast.write_bytes(b"\0" * (DISK - LIMIT - 4 * MiB))  # 4 MiB above the limit left
        state = disk / "state"
        state.mkdir()
        fqd, port = await Proc.start_fqd(
            state, "--config", str(conf), "--lumberjack", "127.0.0.1:0",
            "--opencluster", "127.0.0.1:0",
        )  # fmt: skip
        try:
            async with asyncio.timeout(120):
                lj_port = await port_line(fqd, "Lumberjack")
                oc_port = await port_line(fqd, "OpenCluster")
                await run(fqd, port, lj_port, oc_port, disk, ballast)
        finally:
            fqd.proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(20):
                await fqd.finish()
    lines = fqd.err_lines
    assert len([line for line in lines if "disk alarm set: " in line]) == 1, lines
    assert len([line for line in lines if "disk alarm cleared: " in line]) == 1, lines
    # No write ever failed on the disk itself: each failure was the alarm's refusal.
    failed = [line for line in lines if "failed" in line]
    assert all("disk_free_limit" in line for line in failed), failed
    assert not [line for line in lines if "No space left" in line or "Traceback" in line], lines


async def run(fqd: Proc, port: int, lj_port: int, oc_port: int, disk: Path, ballast: Path) -> None:
    source = "u/full/disk:permanent,backlog=-1"
    async with Client(port=port, source=source) as setup:
        await setup.bind(b"logs", b"prefix:", 0x0110)
        await setup.bind(b"logging", b"prefix:", 0x0110)  # Lumberjack's exchange
    oc = await OpenClusterClient.connect(port=oc_port)
    await oc.set("before", 1)
    assert gauge(await metrics(port), "fq_disk_alarm") == 0

    # Publish until the file system is below the limit; the alarm is set within a second,
    # long before the 4 MiB left above it would fill.
    publisher = Client(port=port, source="pub", reconnect=False)
    await publisher.connect()
    n = 0
    while free(disk) >= LIMIT:
        for _ in range(100):
            n += 1
            publisher.publish(b"logs", b"r", b"%06d " % n + PAYLOAD)
        assert await publisher.confirm() == n
    await fqd.wait_stderr("disk alarm set: ", anywhere=True)
    with pytest.raises(ClientError, match="disk queue write failed"):
        for _ in range(100):
            n += 1
            publisher.publish(b"logs", b"r", b"%06d " % n + PAYLOAD)
        await publisher.confirm()
    await publisher.close()
    assert free(disk) > LIMIT // 2  # refused with room to spare: not a full disk

    text = await metrics(port)
    assert gauge(text, "fq_disk_alarm") == 1
    assert gauge(text, "fq_disk_alarm_refusals_total") >= 100
    assert 'fq_disk_free_bytes{filesystem="0",path="' in text

    # OpenCluster: sets fail, gets still answer.
    with pytest.raises(ClientError, match="disk_free_limit"):
        await oc.set("during", 2)
    assert await oc.get("before", kind=int) == 1

    # Lumberjack: the batch is held, only keepalives come.
    reader, writer = await asyncio.open_connection("127.0.0.1", lj_port)
    shipper = Shipper(reader, writer)
    writer.write(encoder.batch([b'{"message":"held"}'] * 3))
    keepalives = await shipper.read_acks(1.0)
    assert len(keepalives) >= 2 and set(keepalives) == {(2, 0)}, keepalives
    fronts = {f["name"]: f for f in json.loads(await get(port, "/frontends.json"))["frontends"]}
    (held,) = fronts["lumberjack"]["connections"]
    assert held["held"] == "disk" and held["acked"] == 0

    # Room again: the alarm clears, the held batch is acknowledged, all publish again.
    ballast.unlink()
    await fqd.wait_stderr("disk alarm cleared: ", anywhere=True)
    assert await shipper.ack() == (2, 3)
    writer.close()
    await oc.set("after", 3)
    assert await oc.get("after", kind=int) == 3
    await oc.close()
    async with Client(port=port, source="pub2", reconnect=False) as again:
        for i in range(100):
            again.publish(b"logs", b"r", b"again %d" % i)
        assert await again.confirm() == 100
    assert gauge(await metrics(port), "fq_disk_alarm") == 0
