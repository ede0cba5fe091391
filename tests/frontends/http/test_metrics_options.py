"""/metrics options: per-connection series only up to ``metrics_client_series_max`` clients,
and routing time as a histogram (``fq_route_eval_seconds``) that counts real traffic."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math

from fqbroker.core.router import RouteTimes
from fqbroker.settings.broker import Settings
from tests.conftest import Session, open_session, running, wait_for
from tests.e2e.http.test_metrics import Samples, scrape, value

CLIENT_FAMILY = "fq_client_in_messages_total"


def client_series(samples: Samples) -> set[str]:
    return {dict(labels)["client"] for name, labels in samples if name == CLIENT_FAMILY}


async def test_client_series_are_left_out_above_the_limit(settings: Settings) -> None:
    settings = dataclasses.replace(settings, metrics_client_series_max=2)
    async with running(settings) as broker:
        sessions: list[Session] = []
        try:
            for i in range(2):
                sessions.append(await open_session(broker.port, b"u%d" % i, b"q%d" % i))
            await wait_for(lambda: len(broker.clients) == 2)
            samples, _ = await scrape(broker)
            assert value(samples, "fq_client_series_enabled") == 1
            assert len(client_series(samples)) == 2

            # A third client: over the limit, so no per-connection series at all.
            sessions.append(await open_session(broker.port, b"u2", b"q2"))
            await wait_for(lambda: len(broker.clients) == 3)
            samples, _ = await scrape(broker)
            assert value(samples, "fq_client_series_enabled") == 0
            assert client_series(samples) == set()
            others = {name for name, _ in samples if name.startswith("fq_client_")}
            assert others == {"fq_client_series_enabled"}
            # What does not grow with connections stays.
            assert value(samples, "fq_queue_clients", queue="q2") == 1

            # Back to the limit: the series return.
            await sessions.pop().close()
            await wait_for(lambda: len(broker.clients) == 2)
            samples, _ = await scrape(broker)
            assert value(samples, "fq_client_series_enabled") == 1
            assert len(client_series(samples)) == 2
        finally:
            for s in sessions:
                await s.close()


async def test_client_series_off_with_zero(settings: Settings) -> None:
    settings = dataclasses.replace(settings, metrics_client_series_max=0)
    async with running(settings) as broker:
        session = await open_session(broker.port, b"u", b"q")
        try:
            await wait_for(lambda: len(broker.clients) == 1)
            samples, _ = await scrape(broker)
            assert value(samples, "fq_client_series_enabled") == 0
            assert client_series(samples) == set()
        finally:
            await session.close()


def route_histogram(samples: Samples) -> tuple[list[tuple[float, float]], float, float]:
    buckets = sorted(
        (float(dict(labels)["le"]), v)
        for (name, labels), v in samples.items()
        if name == "fq_route_eval_seconds_bucket"
    )
    return (
        buckets,
        value(samples, "fq_route_eval_seconds_count"),
        value(samples, "fq_route_eval_seconds_sum"),
    )


async def test_route_evaluation_time_is_a_histogram_that_counts(settings: Settings) -> None:
    async with running(settings) as broker:
        samples, _ = await scrape(broker)
        buckets, count, total = route_histogram(samples)
        assert len(buckets) == RouteTimes.BUCKETS and buckets[-1][0] == math.inf
        assert count == 0 and total == 0

        consumer = await open_session(broker.port, b"reader", b"hist\x00mem:backlog=-1")
        publisher = await open_session(broker.port, b"writer")
        try:
            await consumer.bind(b"hist", b"prefix:")
            # One message a batch (each awaited into the broker before the next), for
            # long enough that the broker's timer asked for several samples.
            sent = 0
            loop = asyncio.get_running_loop()
            started = loop.time()
            until = started + 12 * RouteTimes.SAMPLE_SECONDS
            while loop.time() < until or broker.router.times.messages < 5:
                await publisher.publish(b"hist", b"r", b"m%d" % sent)
                sent += 1
                await wait_for(lambda sent=sent: broker.router.aggregate.messages == sent)
            elapsed = loop.time() - started
            samples, _ = await scrape(broker)
        finally:
            await consumer.close()
            await publisher.close()
        buckets, count, total = route_histogram(samples)
        # A batch timed each time the broker's timer asked, not every batch.
        assert 5 <= count < sent
        assert count <= elapsed / RouteTimes.SAMPLE_SECONDS + 2
        assert buckets[-1][1] == count
        assert all(a[1] <= b[1] for a, b in itertools.pairwise(buckets))
        assert 0 < total < 1  # a few microseconds each on any machine
        assert value(samples, "fq_route_eval_messages_total") == count  # one message each


def test_route_times_buckets() -> None:
    times = RouteTimes()
    for ns in (0, 1023, 1024, 2047, 2048, 10**6, 10**12):
        times.observe(ns, 3)
    bounds = RouteTimes.bounds_seconds()
    assert bounds[0] == 1.024e-6 and len(bounds) == RouteTimes.BUCKETS - 1
    assert times.buckets[:3] == [2, 2, 1]
    assert times.buckets[10] == 1  # 1 ms: under 1024 << 10 ns (1.05 ms)
    assert times.buckets[-1] == 1  # 1000 s: past every bound
    assert times.messages == 21 and times.sum_ns == sum((0, 1023, 1024, 2047, 2048, 10**6, 10**12))
