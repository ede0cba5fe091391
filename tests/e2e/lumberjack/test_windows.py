"""Lumberjack windows of any size and frames nested in ``C`` (docs/lumberjack.md), end to
end: a real broker on loopback, the project's encoder as the shipper, fq consumers.

A window of 100,000 events is routed as it arrives, not held: with the memory budget
small and nobody reading, the broker stops reading once its queue holds the budget, with
what it holds bounded by the budget (not by the window), keeps the shipper alive with
ACK(0) and partial ACKs, and acknowledges the window once a consumer drains the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from fqbroker.clients.fq.client import Client
from fqbroker.frontends.lumberjack.machine import BATCH_OCTETS
from fqbroker.frontends.lumberjack.session import LumberjackSession
from fqbroker.protocols.lumberjack import encoder
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import TIMEOUT, running, wait_for
from tests.e2e.lumberjack.test_lumberjack import Shipper, consumer, events, receive, with_lumberjack

WINDOW = 100_000
CHUNK = 5_000  # events per C frame


def session_of(broker: Broker) -> LumberjackSession:
    (transport,) = broker.front_ends["lumberjack"].connections
    session = transport.get_protocol()
    assert isinstance(session, LumberjackSession)
    return session


def payload(n: int) -> bytes:
    return b'{"n":%d,"message":"one of a large window"}' % n


async def acks_within(shipper: Shipper, seconds: float) -> list[tuple[int, int]]:
    """Every ACK that arrives within ``seconds``."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            while data := await shipper.reader.read(65536):
                shipper.got += shipper.acks.feed(data)
    got, shipper.got = shipper.got, []
    return got


async def receive_all(c: Client, n: int) -> list[bytes]:
    got: list[bytes] = []
    async with asyncio.timeout(TIMEOUT * 2):
        while len(got) < n:
            got += [m.payload for m in await c.receive_many(n - len(got))]
    return got


async def test_a_window_of_100000_events_is_routed_within_the_budget(settings: Settings) -> None:
    settings.memory_budget = 1 << 20
    async with running(with_lumberjack(settings, keepalive_seconds=0.2)) as broker:
        source = "c/wq/mem:permanent,block,backlog=1000000,public"
        await (await consumer(broker, source, flags=0x0110)).close()
        shipper = await Shipper.open(broker)
        frames = [
            encoder.compressed(
                2, b"".join(encoder.json_frame(n + 1, payload(n)) for n in range(k, k + CHUNK))
            )
            for k in range(0, WINDOW, CHUNK)
        ]
        sending = asyncio.ensure_future(shipper.send(encoder.window(2, WINDOW) + b"".join(frames)))
        # Nobody reads: the broker stops reading once its queue holds the budget.
        session = session_of(broker)
        await wait_for(lambda: "budget" in session.held)
        budget = broker.budget
        # What it holds is the budget's, not the window's: over the limit by at most one
        # batch (BATCH_OCTETS, and the C frame that filled it), far from the window's 11 MB.
        one_frame = CHUNK * (len(payload(WINDOW)) + 64)
        assert budget.used <= budget.limit + BATCH_OCTETS + one_frame
        assert session.events < WINDOW
        # Meanwhile the shipper is told the broker is working (ACK(0)), and what is routed
        # so far (a partial ACK once input went idle).
        held = await acks_within(shipper, 1.0)
        assert (2, 0) in held and all(seq < WINDOW for _, seq in held)
        # A consumer drains the queue: the rest is read, routed and acknowledged.
        c = await consumer(broker, source, flags=0x0110)
        payloads = await receive_all(c, WINDOW)
        await sending
        acks = [ack for ack in held if ack[1]]
        while not acks or acks[-1][1] != WINDOW:
            acks.append(await shipper.ack())
        assert acks == sorted(acks) and acks[-1] == (2, WINDOW)
        assert payloads == [payload(n) for n in range(WINDOW)]
        await shipper.close()
        await c.close()
        await wait_for(lambda: broker.budget.used == 0)


async def test_w_and_c_frames_nested_in_a_c_frame(settings: Settings) -> None:
    async with running(with_lumberjack(settings)) as broker:
        c = await consumer(broker)
        shipper = await Shipper.open(broker)
        sent = events(5)
        j = encoder.json_frame
        inner = encoder.compressed(2, encoder.window(2, 3) + j(1, sent[2]) + j(2, sent[3]))
        stream = encoder.compressed(2, encoder.window(2, 2) + j(1, sent[0]) + j(2, sent[1]) + inner)
        await shipper.send(stream + j(3, sent[4]))
        # The nested W ends the first batch (full) and opens the second.
        assert await shipper.ack() == (2, 2)
        assert await shipper.ack() == (2, 3)
        assert [m.payload for m in await receive(c, 5)] == sent
        await shipper.close()
        await c.close()


async def test_a_nesting_bomb_closes_that_connection_only(settings: Settings) -> None:
    async with running(with_lumberjack(settings)) as broker:
        c = await consumer(broker)
        frames = encoder.json_frame(1, b'{"deep":true}')
        for _ in range(50):
            frames = encoder.compressed(2, frames)
        bad = await Shipper.open(broker)
        await bad.send(encoder.window(2, 1) + frames)
        await bad.closed_by_broker()
        await bad.close()
        assert broker.limits.bad_input["lumberjack"] == 1
        assert broker.budget.used == 0
        fresh = await Shipper.open(broker)
        await fresh.send(encoder.batch(events(1)))
        assert await fresh.ack() == (2, 1)
        assert json.loads((await receive(c, 1))[0].payload)["n"] == 0
        await fresh.close()
        await c.close()
