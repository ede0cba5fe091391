"""The fyrehose sequence across a kill -9 of a real fqd, seen by the bundled client: a
subscriber that stays up while the broker is killed and started again on the same data
directory and port sees the numbers go on from the last one it got, with no gap, so it
never REQUESTs numbers that were never given (docs/fyrehose.md, "The sequence across
restarts").
"""

from __future__ import annotations

import asyncio
import signal
import socket
import uuid
from pathlib import Path

from fqbroker.clients.fyrehose.client import FyrehoseClient
from fqbroker.frontends.fyrehose.sequence import LEASE, SequenceFile
from tests.conftest import TIMEOUT
from tests.procs import Proc


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def start_fqd(state: Path, port: int) -> Proc:
    fqd, _ = await Proc.start_fqd(state, "--fyrehose", f"127.0.0.1:{port}")
    await fqd.wait_stderr("fyrehose listening on port: ")
    return fqd


async def subscribed_again(*clients: FyrehoseClient) -> None:
    """Until the new broker has acknowledged a KEEPALIVE of each (they send one a second):
    from then on every DELIVER reaches them."""
    acks = [c.stats.acks for c in clients]
    async with asyncio.timeout(TIMEOUT):
        while any(c.stats.acks <= a for c, a in zip(clients, acks, strict=True)):
            await asyncio.sleep(0.05)


async def received(sub: FyrehoseClient, n: int) -> list[int]:
    """The next ``n`` sequences; after each, the client holds no gap (a gap is what
    makes it REQUEST)."""
    seqs = []
    async with asyncio.timeout(TIMEOUT):
        for _ in range(n):
            seqs.append((await sub.next()).seq)
            assert sub.machine.gaps == [], f"a gap after {seqs[-1]}: {sub.machine.gaps}"
    return seqs


async def test_a_subscriber_sees_no_gap_across_a_kill(tmp_path: Path, procs: list[Proc]) -> None:
    port = free_udp_port()
    fqd = await start_fqd(tmp_path, port)
    procs.append(fqd)
    async with (
        await FyrehoseClient.connect("127.0.0.1", port, gap_seconds=2.0) as sub,
        await FyrehoseClient.connect("127.0.0.1", port, gap_seconds=2.0) as pub,
    ):
        before = [await pub.publish(b"before %d" % i) for i in range(50)]
        assert before == list(range(1, 51))
        assert await received(sub, 50) == before
        assert SequenceFile.under(tmp_path / "queues").read() == 1 + LEASE  # a lease out

        fqd.proc.send_signal(signal.SIGKILL)
        async with asyncio.timeout(TIMEOUT):
            await fqd.proc.wait()
        fqd = await start_fqd(tmp_path, port)
        procs.append(fqd)
        await subscribed_again(sub, pub)

        after = [await pub.publish(b"after %d" % i) for i in range(50)]
        assert after == list(range(51, 101))  # the first new number is the last old one + 1
        assert await received(sub, 50) == after
        assert sub.lost == [] and sub.stats.lost == 0 and sub.stats.recovered == 0


async def test_a_record_from_another_boot_takes_the_lease(
    tmp_path: Path, procs: list[Proc]
) -> None:
    """A power cut, as the next start finds it: sequence.last written in another boot (its
    page may have reached the disk at any moment), so only the lease is safe."""
    port = free_udp_port()
    fqd = await start_fqd(tmp_path, port)
    procs.append(fqd)
    async with await FyrehoseClient.connect("127.0.0.1", port) as pub:
        assert [await pub.publish(b"m") for _ in range(3)] == [1, 2, 3]
    fqd.proc.send_signal(signal.SIGKILL)
    async with asyncio.timeout(TIMEOUT):
        await fqd.proc.wait()
    mark = SequenceFile.under(tmp_path / "queues").mark_path
    record = bytearray(mark.read_bytes())
    record[32:48] = uuid.uuid4().bytes  # the boot id
    mark.write_bytes(bytes(record))
    fqd = await start_fqd(tmp_path, port)
    procs.append(fqd)
    async with await FyrehoseClient.connect("127.0.0.1", port) as pub:
        assert await pub.publish(b"after") == 1 + LEASE
