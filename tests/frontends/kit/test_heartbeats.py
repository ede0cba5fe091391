"""Idle clients cost no task and no timer of their own; heartbeats keep a fixed grid."""

from __future__ import annotations

import asyncio

from fqbroker.frontends.kit.heartbeats import Entry, HeartbeatClock
from fqbroker.protocols.fq import wire
from fqbroker.server.broker import Broker
from tests.conftest import open_session, wait_for
from tests.e2e.fq.test_server import paired


async def test_idle_sessions_run_no_tasks(broker: Broker) -> None:
    before = len(asyncio.all_tasks())
    sessions = [await open_session(broker.port) for _ in range(20)]
    for s in sessions:
        await paired(broker, s.key)
        await s.cmd.send(wire.encode(wire.HeartbeatRequest(1000)))
    await wait_for(lambda: all(c.heartbeat_ms == 1000 for c in broker.clients.values()))
    assert len(asyncio.all_tasks()) == before
    for s in sessions:
        await s.close()


class _Recorder:
    """A session as the clock sees it: it holds its live entry, and reschedules."""

    def __init__(self, clock: HeartbeatClock, period: float, times: list[float]) -> None:
        self.clock, self.period, self.times = clock, period, times
        self._beat: Entry | None = None

    def start(self, when: float) -> None:
        self._beat = self.clock.schedule(self, when)

    def heartbeat_due(self, now: float) -> None:
        self._beat = None
        self.times.append(now)
        if len(self.times) < 5:
            self.start(self.times[0] + len(self.times) * self.period)

    def __lt__(self, other: object) -> bool:
        return id(self) < id(other)


async def test_clock_serves_many_sessions_on_their_grid() -> None:
    clock = HeartbeatClock()
    start = clock.time()
    runs: list[list[float]] = [[] for _ in range(50)]
    for i, times in enumerate(runs):
        _Recorder(clock, 0.02, times).start(start + 0.01 + i * 0.0005)
    cancelled: list[float] = []
    gone = _Recorder(clock, 0.02, cancelled)
    gone.start(start + 0.01)
    assert gone._beat is not None
    clock.cancel(gone._beat)
    gone._beat = None
    await wait_for(lambda: all(len(t) == 5 for t in runs))
    assert not cancelled
    for i, times in enumerate(runs):
        due = [start + 0.01 + i * 0.0005 + k * 0.02 for k in range(5)]
        # On time or a little late, never more than the slack early: the grid holds.
        assert all(t >= d - 0.0021 for t, d in zip(times, due, strict=True)), (times, due)
    clock.close()


async def test_an_idle_client_has_no_counters_until_it_counts(broker: Broker) -> None:
    # Made at first use: an idle client holds none, and status reads zeros all the same.
    idle = await open_session(broker.port, b"idle")
    consumer = await open_session(broker.port, b"consumer")
    publisher = await open_session(broker.port, b"publisher")
    try:
        for s in (idle, consumer, publisher):
            await paired(broker, s.key)
        assert await consumer.bind(b"ex", b"prefix:") != wire.BIND_ILLEGAL
        sessions = {s.key: broker.clients[s.key] for s in (idle, consumer, publisher)}
        assert all(c._stats is None for c in sessions.values())
        await publisher.publish(b"ex", b"r", b"payload")
        (msg,) = await consumer.receive()
        assert msg.payload == b"payload"
        assert sessions[idle.key]._stats is None
        assert sessions[publisher.key].stats.msgs_in == 1
        assert sessions[consumer.key].stats.msgs_out == 1
        status = await idle.status()
        zeros = ("no_exchange", "no_route", "routed", "dropped", "msgs_in", "msgs_out")
        assert all(status[k] == 0 for k in zeros), status
        assert (await consumer.status())["msgs_out"] == 1
    finally:
        for s in (idle, consumer, publisher):
            await s.close()


async def test_clients_of_one_user_share_its_name(broker: Broker) -> None:
    sessions = [await open_session(broker.port, b"same", b"q%d" % i) for i in range(3)]
    other = await open_session(broker.port, b"other")
    names = broker.registry._names
    try:
        users = [broker.clients[s.key].user for s in sessions]
        assert users == [b"same"] * 3 and all(u is users[0] for u in users)
        assert names == {b"same": (users[0], 3), b"other": (b"other", 1)}
        await sessions[0].close()
        await wait_for(lambda: names[b"same"][1] == 2)
    finally:
        for s in (*sessions[1:], other):
            await s.close()
    await wait_for(lambda: not names)
