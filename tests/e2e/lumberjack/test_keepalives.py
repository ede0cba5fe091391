"""Lumberjack keepalives while the broker holds a shipper back (docs/lumberjack.md,
"Backpressure"): whatever holds it, a full block-policy queue, the memory budget or an
fsync an ACK waits for, a v2 shipper gets ``ACK(0)`` every ``keepalive_seconds`` until the
real ACK, and nothing is lost. The full-queue case with the project's encoder is in
test_lumberjack.py; here the memory budget, spent by a block-policy queue nobody reads,
holds the shipper back between batches (the next batch unread, or partly read), seen from
the raw shipper and from PyPI ``pylogbeat``, whose socket timeout is shorter than the hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from fqbroker.protocols.lumberjack import encoder
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from fqbroker.storage.segments import log as segmentlog
from tests.conftest import port_of, running, wait_for
from tests.e2e.interop.test_lumberjack_npm import receive_exactly
from tests.e2e.lumberjack.test_lumberjack import Shipper, consumer, events, receive, with_lumberjack
from tests.prereqs import require_module

KEEPALIVE = 0.2
# A permanent block-policy queue nobody reads, whose backlog the budget runs out before.
HOARD = "c/kq/mem:permanent,block,backlog=1000000,public"


async def spend_the_budget(broker: Broker, shipper: Shipper) -> int:
    """Publish batches of 200 until the queue holds more than the memory budget: each is
    acknowledged once in the queue. Returns the events sent."""
    sent = 0
    while broker.budget.used <= broker.budget.limit:
        await shipper.send(encoder.batch(events(200, first=sent), first_seq=sent + 1))
        sent += 200
        assert await shipper.ack() == (2, sent)
    return sent


async def test_keepalives_flow_while_the_budget_holds_the_next_batch(settings: Settings) -> None:
    settings.memory_budget = 256 << 10
    async with running(with_lumberjack(settings, keepalive_seconds=KEEPALIVE)) as broker:
        await (await consumer(broker, HOARD, flags=0x0110)).close()
        shipper = await Shipper.open(broker)
        sent = await spend_the_budget(broker, shipper)
        # The next batch is not read while the budget is spent: its ACK waits, kept alive.
        await shipper.send(encoder.batch(events(200, first=sent), first_seq=sent + 1))
        keepalives = await shipper.no_ack(6 * KEEPALIVE)
        assert len(keepalives) >= 3 and set(keepalives) == {(2, 0)}
        c = await consumer(broker, HOARD, flags=0x0110)
        got = await receive(c, sent + 200)
        assert await shipper.ack() == (2, sent + 200)
        assert [m.payload for m in got] == events(sent + 200)
        await shipper.close()
        await c.close()
        await wait_for(lambda: broker.budget.used == 0)


async def test_a_batch_partly_read_when_the_budget_ran_out_is_kept_alive(
    settings: Settings,
) -> None:
    """A batch larger than what is left of the budget: its W and part of its C frame are
    read, then reading waits for the budget, with nothing of it decoded yet."""
    settings.memory_budget = 256 << 10
    async with running(with_lumberjack(settings, keepalive_seconds=KEEPALIVE)) as broker:
        await (await consumer(broker, HOARD, flags=0x0110)).close()
        shipper = await Shipper.open(broker)
        sent = 0
        while broker.budget.used < broker.budget.limit - (64 << 10):
            await shipper.send(encoder.batch(events(200, first=sent), first_seq=sent + 1))
            sent += 200
            assert await shipper.ack() == (2, sent)
        big = [
            json.dumps({"n": sent + i, "pad": os.urandom(300).hex()}).encode() for i in range(400)
        ]
        await shipper.send(encoder.batch(big, first_seq=sent + 1))
        keepalives = await shipper.no_ack(6 * KEEPALIVE)
        assert len(keepalives) >= 3 and set(keepalives) == {(2, 0)}
        c = await consumer(broker, HOARD, flags=0x0110)
        got = await receive(c, sent + 400)
        assert await shipper.ack() == (2, sent + 400)
        assert [m.payload for m in got] == events(sent) + big
        await shipper.close()
        await c.close()


async def test_pylogbeat_outlives_its_timeout_while_the_budget_holds_it(
    settings: Settings,
) -> None:
    """pylogbeat reads with a 1 s socket timeout and its second batch is held for 3 s: it
    only survives because ACK(0) comes every 0.2 s; then a consumer drains the queue,
    send() returns, and every event arrives once."""
    pylogbeat = require_module("pylogbeat", "pylogbeat is the PyPI Beats client under test")
    settings.memory_budget = 256 << 10
    async with running(with_lumberjack(settings, keepalive_seconds=KEEPALIVE)) as broker:
        await (await consumer(broker, HOARD, flags=0x0110)).close()
        shipper = await Shipper.open(broker)
        sent = await spend_the_budget(broker, shipper)
        await shipper.close()
        mine = [{"n": sent + i, "message": f"held {i}"} for i in range(100)]
        port = port_of(broker, "lumberjack")

        def send() -> None:
            with pylogbeat.PyLogBeatClient("127.0.0.1", port, timeout=1.0) as client:
                client.send(mine[:50])  # read, queued, acknowledged: then reading waits
                client.send(mine[50:])

        sending = asyncio.ensure_future(asyncio.to_thread(send))
        try:
            done, _ = await asyncio.wait([sending], timeout=3.0)
            assert not done, f"send() ended while held back: {sending.exception()!r}"
            c = await consumer(broker, HOARD, flags=0x0110)
            got = await receive_exactly(c, sent + len(mine))
            async with asyncio.timeout(30):
                await sending  # the ACK, and no timeout in the client before it
        finally:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(30):
                    await sending
        assert [m.payload for m in got[:sent]] == events(sent)
        assert [json.loads(m.payload) for m in got[sent:]] == mine
        await c.close()


class GatedFsync:
    """Stands in for the os module in fqbroker.storage.segments.log: fsync waits until
    the test opens the gate (it runs in a worker thread, the broker's loop goes on)."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def fsync(self, fd: int) -> None:
        self.gate.wait(30)
        os.fsync(fd)


@contextlib.contextmanager
def gated(monkeypatch: pytest.MonkeyPatch) -> Iterator[GatedFsync]:
    fake = GatedFsync()
    monkeypatch.setattr(segmentlog, "os", fake)
    try:
        yield fake
    finally:
        fake.gate.set()


async def test_keepalives_flow_while_an_ack_waits_for_an_fsync(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running(with_lumberjack(settings, keepalive_seconds=KEEPALIVE)) as broker:
        source = "c/kdq/disk:permanent,fsync=always,public"
        await (await consumer(broker, source, flags=0x0110)).close()
        shipper = await Shipper.open(broker)
        with gated(monkeypatch) as fsync:
            await shipper.send(encoder.batch(events(5)))
            keepalives = await shipper.no_ack(6 * KEEPALIVE)
            assert len(keepalives) >= 3 and set(keepalives) == {(2, 0)}
            fsync.gate.set()
            assert await shipper.ack() == (2, 5)
        c = await consumer(broker, source, flags=0x0110)
        assert [m.payload for m in await receive(c, 5)] == events(5)
        await shipper.close()
        await c.close()
