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

from fqbroker.client import Client, ClientError

from .procs import Proc

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
