"""A disk that fills up: the publisher is told (failed confirm, dropped count, a log
line), other queues keep flowing, and nothing confirmed before is lost.

The broker runs with RLIMIT_FSIZE, so its writes past the limit really fail in the
kernel (EFBIG, as ENOSPC would), with SIGXFSZ ignored as a server would.
"""

from __future__ import annotations

import asyncio
import resource
import signal
from pathlib import Path

import pytest

from fqbroker.clients.fq.client import Client, ClientError
from tests.conftest import wait_for
from tests.procs import Proc

LIMIT = 1 << 20  # bytes any one file of the broker may grow to
PAYLOAD = b"x" * 1000


def _small_disk() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


async def test_disk_full(tmp_path: Path) -> None:
    fqd, port = await Proc.start_fqd(tmp_path, preexec_fn=_small_disk)
    confirmed = 0
    try:
        async with asyncio.timeout(60):
            async with Client(port=port, source="u/full/disk:permanent,backlog=-1") as setup:
                await setup.bind(b"logs", b"prefix:", 0x0110)
            other = Client(port=port, source="reader/other/mem")
            await other.connect()
            await other.bind(b"metrics", b"prefix:")
            publisher = Client(port=port, source="pub", reconnect=False)
            await publisher.connect()
            with pytest.raises(ClientError, match="disk queue write failed"):
                for n in range(1, 5000):
                    publisher.publish(b"logs", b"r", b"%06d " % n + PAYLOAD)
                    if n % 100 == 0:
                        confirmed = await publisher.confirm()
            assert 0 < confirmed < 5000
            status = await publisher.status()
            assert status["dropped"] > 0
            # Everyone else is still served.
            async with Client(port=port, source="pub2") as second:
                for i in range(10):
                    second.publish(b"metrics", b"m", b"%d" % i)
                await second.confirm()
            assert [(await other.receive()).payload for _ in range(10)] == [
                b"%d" % i for i in range(10)
            ]
            await publisher.close()
            await other.close()
    finally:
        fqd.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(10):
            await fqd.finish()
    assert any("disk queue write failed" in line for line in fqd.err_lines), fqd.err_lines

    # With room again, every confirmed message is there, in order.
    fqd, port = await Proc.start_fqd(tmp_path)
    try:
        async with asyncio.timeout(60):
            async with Client(port=port, source="u/full/disk:permanent,backlog=-1") as reader:
                got = [int((await reader.receive()).payload[:6]) for _ in range(confirmed)]
        assert got == list(range(1, confirmed + 1))
    finally:
        fqd.kill()
        await fqd.proc.wait()


async def test_a_drained_queue_gives_its_disk_back(tmp_path: Path) -> None:
    """The queue fills the disk; once its consumer has read everything, the segment it
    filled is deleted (a new, empty one takes the writes) and publishing works again.

    The segments are the default 64 MiB, far past the 1 MiB the disk holds, so before
    this the full segment was the newest one, which nothing ever deleted."""
    fqd, port = await Proc.start_fqd(tmp_path, preexec_fn=_small_disk)
    directory = tmp_path / "queues" / b"drain".hex()
    source = "u/drain/disk:permanent,backlog=-1"
    try:
        async with asyncio.timeout(60):
            async with Client(port=port, source=source) as setup:
                await setup.bind(b"logs", b"prefix:", 0x0110)
            # The consumer comes only once the disk is full.
            publisher = Client(port=port, source="pub", reconnect=False)
            await publisher.connect()
            confirmed = 0
            with pytest.raises(ClientError, match="disk queue write failed"):
                for n in range(1, 5000):
                    publisher.publish(b"logs", b"r", b"%06d " % n + PAYLOAD)
                    if n % 100 == 0:
                        confirmed = await publisher.confirm()
            await publisher.close()
            full = sum(p.stat().st_size for p in directory.glob("*.seg"))
            assert full > LIMIT // 2
            consumer = Client(port=port, source=source, reconnect=False)
            await consumer.connect()
            got = [int((await consumer.receive()).payload[:6]) for _ in range(confirmed)]
            assert got == list(range(1, confirmed + 1))
            # The checkpoint moves once the consumer's socket took the messages; at the end,
            # the full segment goes (a bounded wait on the files: no event tells a test).
            await wait_for(lambda: sum(p.stat().st_size for p in directory.glob("*.seg")) == 0)
            async with Client(port=port, source="pub2", reconnect=False) as second:
                for n in range(500):  # half the disk again: more than was free before
                    second.publish(b"logs", b"r", b"again %04d " % n + PAYLOAD)
                assert await second.confirm() == 500
            again = [(await consumer.receive()).payload[:10] for _ in range(500)]
            assert again == [b"again %04d" % n for n in range(500)]
            await consumer.close()
    finally:
        fqd.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(10):
            await fqd.finish()
