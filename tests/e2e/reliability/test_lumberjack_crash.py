"""kill -9 fqd while a Lumberjack shipper publishes into a permanent disk queue: every
event it was acknowledged is there after a restart, once, in order (docs/lumberjack.md,
"What an ACK promises").

Each kill point is an event the test sees, never a pause: the ACK of a given batch, with
more batches written behind it (pipelined, not yet acknowledged) or none.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import pytest

from fqbroker.clients.fq.client import Client
from fqbroker.protocols.lumberjack import encoder
from tests.conftest import TIMEOUT
from tests.procs import Proc

SOURCE = "u/ljcrash/disk:permanent,backlog=-1,public"
BATCH = 200


async def start(state: Path) -> tuple[Proc, int, int]:
    fqd, port = await Proc.start_fqd(state, "--lumberjack", "127.0.0.1:0")
    line = await fqd.wait_stderr("Lumberjack listening on port: ")
    return fqd, port, int(line.rsplit(" ", 1)[1])


def batch_of(b: int) -> bytes:
    """Batch ``b`` the go-lumber way (seq from 1), events numbered across batches."""
    payloads = [
        json.dumps({"@metadata": {"beat": "crash"}, "n": b * BATCH + i}).encode()
        for i in range(BATCH)
    ]
    return encoder.batch(payloads, first_seq=1)


@pytest.mark.parametrize(("acked", "in_flight"), [(1, 0), (7, 0), (3, 6), (12, 3)])
async def test_acknowledged_events_survive_kill_9(
    tmp_path: Path, procs: list[Proc], acked: int, in_flight: int
) -> None:
    fqd, port, lj_port = await start(tmp_path)
    procs.append(fqd)
    async with Client(port=port, source=SOURCE, reconnect=False) as setup:
        await setup.bind(b"logging", b"prefix:", 0x0110)  # permanent: outlives us and fqd
    reader, writer = await asyncio.open_connection("127.0.0.1", lj_port)
    acks = encoder.AckReader()
    got: list[tuple[int, int]] = []
    async with asyncio.timeout(TIMEOUT * 3):
        for b in range(acked - 1):
            writer.write(batch_of(b))
            while len(got) <= b:
                got += acks.feed(await reader.read(4096))
        # The last acknowledged batch with others written behind it: the kill comes the
        # moment its ACK is read.
        for b in range(acked - 1, acked + in_flight):
            writer.write(batch_of(b))
        await writer.drain()
        while len(got) < acked:
            data = await reader.read(4096)
            assert data, "closed before the ACKs"
            got += acks.feed(data)
    fqd.kill()
    await fqd.proc.wait()
    writer.close()
    assert got[:acked] == [(2, BATCH)] * acked

    fqd, port, _ = await start(tmp_path)
    procs.append(fqd)
    seen: list[int] = []
    async with Client(port=port, source=SOURCE, reconnect=False) as consumer:
        await consumer.bind(b"logging", b"prefix:", 0x0110)
        with contextlib.suppress(TimeoutError):
            while True:
                # Every acknowledged event first; then whatever else made it, until quiet.
                wait = TIMEOUT if len(seen) < acked * BATCH else 1.0
                async with asyncio.timeout(wait):
                    msg = await consumer.receive()
                seen.append(json.loads(msg.payload)["n"])
    assert seen == list(range(len(seen))), "lost, reordered or repeated"
    assert len(seen) >= acked * BATCH
    assert len(seen) <= (acked + in_flight) * BATCH
