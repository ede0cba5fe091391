"""kill -9 the broker while publishers with confirms and a consumer run on a permanent
disk queue, at many different points: no confirmed message is lost, order is kept, and
at most the batches in flight are delivered twice. kill -9 a process updating checkpoints:
every update that returned is kept.

Every kill point is an event the test sees, never a pause: a confirm answered, all
messages written with the last confirm still asked, the consumer reading a given message.
Each point has at least one confirm answered before the kill, so "no confirmed message
lost" is never checked against nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fqbroker.clients.fq.client import Client, ClientError
from fqbroker.storage.segments.log import SegmentLog
from tests.procs import ENV, Proc

SOURCE = "u/crashq/disk:permanent,backlog=-1,public"
BATCH = 1024  # the broker's delivery batch: what may be delivered twice


@dataclass(frozen=True)
class KillPoint:
    """Publish ``messages`` messages, asking to confirm every ``every`` of them (the next
    request once the previous is answered, the last one left outstanding); kill once
    ``confirmed`` messages are confirmed, the consumer (if ``reading``) has read message
    ``read``, and, if ``written``, every message is written to the socket."""

    messages: int
    every: int
    confirmed: int
    reading: bool
    read: int = 0
    written: bool = False

    def __str__(self) -> str:
        parts = [f"{self.messages}by{self.every}", f"confirmed{self.confirmed}"]
        parts += [f"read{self.read}"] if self.read else []
        parts += ["written"] if self.written else []
        parts += ["reading"] if self.reading else ["backlog"]
        return "-".join(parts)


# At least 10 different points: right after the first confirm, while publishing goes on,
# with the last confirm outstanding and a tail never asked about, with the backlog on disk
# and nobody reading it, and with a consumer halfway through it.
KILL_POINTS = [
    KillPoint(1, 1, confirmed=1, reading=False),
    KillPoint(7, 1, confirmed=3, reading=True),
    KillPoint(50, 50, confirmed=50, reading=True),
    KillPoint(100, 50, confirmed=50, reading=False, written=True),
    KillPoint(123, 10, confirmed=110, reading=False, written=True),
    KillPoint(499, 50, confirmed=50, reading=True, read=200),
    KillPoint(1000, 50, confirmed=500, reading=False),
    KillPoint(1777, 50, confirmed=1700, reading=True, written=True),
    KillPoint(2600, 100, confirmed=100, reading=True, read=2000),
    KillPoint(4000, 50, confirmed=4000, reading=True),
    KillPoint(6001, 50, confirmed=5950, reading=False, written=True),
    KillPoint(9000, 1000, confirmed=1000, reading=True, read=3000),
]


def seq_of(payload: bytes) -> int:
    return int(payload.split(b" ", 1)[0])


class Progress:
    """Counts that only grow, and a wait until one reaches a value."""

    def __init__(self) -> None:
        self.value = 0
        self._changed = asyncio.Event()

    def advance(self, value: int) -> None:
        if value > self.value:
            self.value = value
            self._changed.set()
            self._changed = asyncio.Event()

    async def reach(self, value: int) -> None:
        while self.value < value:
            await self._changed.wait()


@dataclass
class Run:
    confirmed: Progress = field(default_factory=Progress)
    read: Progress = field(default_factory=Progress)
    written: asyncio.Event = field(default_factory=asyncio.Event)
    ready: asyncio.Event = field(default_factory=asyncio.Event)


async def consume(port: int, into: list[int], run: Run, stop_at: int | None = None) -> None:
    async with Client(port=port, source=SOURCE, reconnect=False) as consumer:
        await consumer.bind(b"crash", b"prefix:", 0x0110)
        run.ready.set()
        with contextlib.suppress(ConnectionError):
            async for msg in consumer.messages():
                seq = seq_of(msg.payload)
                into.append(seq)
                run.read.advance(seq)
                if stop_at is not None and seq == stop_at:
                    return


async def publish(port: int, point: KillPoint, run: Run) -> None:
    """Publish and confirm until done or the broker is gone; answered confirms go to run."""
    publisher = Client(port=port, source="pub", reconnect=False)
    await publisher.connect()
    pending: asyncio.Future[int] | None = None
    try:
        for seq in range(1, point.messages + 1):
            publisher.publish(b"crash", b"r", b"%d payload" % seq)
            if seq % point.every == 0:
                if pending is not None:
                    run.confirmed.advance(await pending)
                pending = asyncio.ensure_future(publisher.confirm())
        await publisher.flush()
        run.written.set()
        if pending is not None:
            run.confirmed.advance(await pending)
    except (ConnectionError, OSError, ClientError):
        pass  # the kill
    finally:
        if pending is not None:  # answered just before the kill, or failed by it
            with contextlib.suppress(ConnectionError, OSError, ClientError):
                run.confirmed.advance(await pending)
        with contextlib.suppress(ConnectionError, OSError, ClientError):
            await publisher.close()


@pytest.mark.parametrize("point", KILL_POINTS, ids=str)
async def test_kill_9_loses_no_confirmed_message(tmp_path: Path, point: KillPoint) -> None:
    fqd, port = await Proc.start_fqd(tmp_path)
    before: list[int] = []
    run = Run()
    try:
        async with asyncio.timeout(60):
            # The queue and its binding exist first, whether or not anyone reads.
            async with Client(port=port, source=SOURCE, reconnect=False) as setup:
                await setup.bind(b"crash", b"prefix:", 0x0110)
            reader = None
            if point.reading:
                reader = asyncio.create_task(consume(port, before, run))
                await run.ready.wait()
            publisher = asyncio.create_task(publish(port, point, run))
            await run.confirmed.reach(point.confirmed)
            await run.read.reach(point.read)
            if point.written:
                await run.written.wait()
            fqd.proc.kill()
            await fqd.proc.wait()
            await publisher
            if reader is not None:
                await reader

            fqd, port = await Proc.start_fqd(tmp_path)
            after: list[int] = []
            restarted = Run()
            reader = asyncio.create_task(consume(port, after, restarted, stop_at=0))
            await restarted.ready.wait()
            async with Client(port=port, source="pub2", reconnect=False) as closer:
                closer.publish(b"crash", b"r", b"0 end")  # the marker: read up to here
                await closer.confirm()
            await reader
    finally:
        fqd.kill()
        await fqd.proc.wait()

    confirmed = run.confirmed.value
    assert confirmed >= point.confirmed > 0  # never a check against nothing
    assert after[-1] == 0
    after = after[:-1]
    seen = set(before) | set(after)
    assert set(range(1, confirmed + 1)) <= seen, "a confirmed message was lost"
    assert before == sorted(before) and len(set(before)) == len(before)
    assert after == sorted(after) and len(set(after)) == len(after)
    duplicates = set(before) & set(after)
    assert len(duplicates) <= BATCH
    assert seen <= set(range(1, point.messages + 1))


# A child that updates checkpoints as fast as it can and prints the number of each update
# once it returns. Update i sets one of 200 named checkpoints when i % 7 == 0 (each name
# about 110 bytes: a state of about 23 KB, six pages, so a kill can land mid-write) and
# "fq" otherwise, always to i: the state after update i follows from i alone.
_CHECKPOINTER = r"""
import sys
import time
from pathlib import Path
from fqbroker.storage.segments.log import SegmentLog

log = SegmentLog(Path(sys.argv[1]))
if log.next_seq == 1:
    log.append([b""] * 200_000)
i = max(log.checkpoints.values(), default=0)
print("ready", flush=True)
while i < 200_000:
    i += 1
    name = "reader-%03d-%s" % (i // 7 % 200, "x" * 100) if i % 7 == 0 else "fq"
    log.set_checkpoint(name, i)
    print(i, flush=True)
time.sleep(60)
"""


def _state_after(last: int) -> dict[str, int]:
    state: dict[str, int] = {}
    for i in range(1, last + 1):
        name = f"reader-{i // 7 % 200:03d}-{'x' * 100}" if i % 7 == 0 else "fq"
        state[name] = i
    return state


# Updates read from the child before the kill: it runs on meanwhile (up to a pipe's worth
# of lines ahead), so the kill lands somewhere after each of these.
CHECKPOINT_KILLS = [1, 2, 10, 100, 700, 2000, 5000, 12000]


def test_kill_9_keeps_every_completed_checkpoint_update(tmp_path: Path) -> None:
    for kill_after in CHECKPOINT_KILLS:
        with subprocess.Popen(
            [sys.executable, "-c", _CHECKPOINTER, str(tmp_path)],
            env=ENV, stdout=subprocess.PIPE, text=True,
        ) as child:  # fmt: skip
            assert child.stdout is not None
            assert child.stdout.readline() == "ready\n"
            lines = [child.stdout.readline() for _ in range(kill_after)]
            child.kill()
            lines += child.stdout.read().split()
        assert all(lines), "the child stopped early"
        done = int(lines[-1])
        log = SegmentLog(tmp_path)
        assert log.recovery == []
        found = dict(log.checkpoints)
        log.close()
        # The last update printed, or the one after it (killed between it and the print).
        assert found in (_state_after(done), _state_after(done + 1)), done
