"""/metrics: Prometheus text parsed by prometheus-client's own parser, checked against counters."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from pathlib import Path

from prometheus_client import REGISTRY
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from fqbroker.clients.fq.client import Client
from fqbroker.frontends.http.stats.metrics import registry_for
from fqbroker.server.broker import Broker
from fqbroker.storage.store import DiskStore
from tests.conftest import open_session, wait_for
from tests.e2e.http.test_http import get

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(
    broker: Broker, accept: str | None = None, login: Sequence[tuple[str, str]] = ()
) -> tuple[Samples, str]:
    headers = [*login, *([("Accept", accept)] if accept else [])]
    response, body = await get(broker.port, "/metrics", headers=headers)
    assert response.status_code == 200
    content_type = dict(response.headers)[b"content-type"].decode()
    parse = openmetrics_families if accept else text_string_to_metric_families
    samples: Samples = {}
    for family in parse(body.decode()):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in samples, f"duplicate series {key}"
            samples[key] = s.value
    return samples, content_type


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[name, tuple(sorted(labels.items()))]


EX = 'ex "q" ä'
QUEUE = "dröp"


async def test_metrics_match_the_counters_after_known_traffic(broker: Broker) -> None:
    # A drop queue of 2 whose consumer never reads: the third delivery is dropped.
    consumer_cmd = await open_session(broker.port, b"reader", f"{QUEUE}\x00mem:backlog=2".encode())
    await consumer_cmd.data.close()  # no data channel: nothing drains the queue
    await wait_for(lambda: broker.clients[consumer_cmd.key].data is None)
    await consumer_cmd.bind(EX.encode(), b"prefix:")
    publisher = await open_session(broker.port, b"writer")
    for payload in (b"a" * 10, b"b" * 20, b"c" * 30):
        await publisher.publish(EX.encode(), b"r", payload)
    await publisher.publish(b"missing", b"r", b"xyz")
    await wait_for(lambda: broker.router.aggregate.messages == 4)
    # A public queue with no limit and two clients of one user.
    u1 = await open_session(broker.port, b"same", b"unl\x00mem:public,backlog=-1")
    u2 = await open_session(broker.port, b"same", b"unl\x00mem:public,backlog=-1")

    samples, content_type = await scrape(broker)
    assert content_type.startswith("text/plain; version=0.0.4")
    agg = broker.router.aggregate
    assert value(samples, "fq_messages_total") == agg.messages == 4
    assert value(samples, "fq_payload_bytes_total") == agg.octets == 63
    assert value(samples, "fq_routed_total") == agg.routed == 3
    assert value(samples, "fq_dropped_total") == agg.dropped == 1
    assert value(samples, "fq_no_route_total") == agg.no_route == 1
    assert value(samples, "fq_no_exchange_total") == agg.no_exchange == 1
    assert value(samples, "fq_size_dropped_total") == 0

    ex = broker.router.exchanges[EX.encode()]
    assert value(samples, "fq_exchange_messages_total", exchange=EX) == ex.messages == 3
    assert value(samples, "fq_exchange_payload_bytes_total", exchange=EX) == ex.octets == 60
    assert value(samples, "fq_exchange_routed_total", exchange=EX) == ex.routed == 3
    assert value(samples, "fq_exchange_dropped_total", exchange=EX) == ex.dropped == 1
    assert value(samples, "fq_exchange_no_route_total", exchange=EX) == ex.no_route == 0
    route = {"exchange": EX, "route_id": "1", "queue": QUEUE}
    binding = ex.bindings[1]
    assert value(samples, "fq_route_invocations_total", **route) == binding.invocations == 3
    assert value(samples, "fq_route_eval_avg_seconds", **route) == binding.avg_ns / 1e9

    assert value(samples, "fq_queue_backlog_messages", queue=QUEUE) == 2
    assert value(samples, "fq_queue_limit_messages", queue=QUEUE) == 2
    assert value(samples, "fq_queue_dropped_total", queue=QUEUE) == 1
    assert value(samples, "fq_queue_clients", queue=QUEUE) == 1
    assert value(samples, "fq_queue_clients", queue="unl") == 2
    assert value(samples, "fq_queue_limit_messages", queue="unl") == math.inf
    info = {"queue": QUEUE, "type": "mem", "sharing": "private", "policy": "drop"}
    assert value(samples, "fq_queue_info", permanent="false", **info) == 1

    for session in (publisher, consumer_cmd, u1, u2):
        client = broker.clients[session.key]
        assert client.queue is not None
        labels = {
            "user": client.user.decode(),
            "queue": client.queue.name.decode(),
            "client": f"{client.remote_addr}:{client.remote_port}",
        }
        s = client.stats
        for name, field in [
            ("fq_client_in_messages_total", s.msgs_in),
            ("fq_client_in_bytes_total", s.octets_in),
            ("fq_client_out_messages_total", s.msgs_out),
            ("fq_client_out_bytes_total", s.octets_out),
            ("fq_client_routed_total", s.routed),
            ("fq_client_dropped_total", s.dropped),
            ("fq_client_no_route_total", s.no_route),
            ("fq_client_no_exchange_total", s.no_exchange),
            ("fq_client_size_dropped_total", s.size_dropped),
        ]:
            assert value(samples, name, **labels) == field, (name, labels)
    pub = broker.clients[publisher.key].stats
    assert (pub.msgs_in, pub.routed, pub.dropped, pub.no_exchange) == (4, 3, 1, 1)

    assert value(samples, "fq_connections", kind="command") == 4
    assert value(samples, "fq_connections", kind="data") == 3  # the reader closed its own
    assert value(samples, "fq_connections", kind="peer") == 0
    assert value(samples, "fq_connections", kind="http") == 1  # this scrape
    assert value(samples, "fq_http_connections_total") >= 1
    assert (
        value(
            samples,
            "fq_broker_info",
            version="0.13.12",
            fqbroker_version="0.1.0",
            node_id="10.254.254.1",
        )
        == 1
    )
    # Standard process metrics come along in the broker's registry.
    assert any(name == "process_cpu_seconds_total" for name, _ in samples)

    for session in (publisher, consumer_cmd, u1, u2):
        await session.close()


async def test_http_responses_are_counted(broker: Broker) -> None:
    await get(broker.port, "/nosuch")
    await get(broker.port, "/stats.json")
    samples, _ = await scrape(broker)
    assert value(samples, "fq_http_responses_total", code="404") == 1
    assert value(samples, "fq_http_responses_total", code="200") == 1  # the scrape's own is next


async def test_openmetrics_when_asked(broker: Broker) -> None:
    samples, content_type = await scrape(broker, "application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert value(samples, "fq_messages_total") == 0


async def test_each_broker_has_its_own_registry(broker: Broker, tmp_path: Path) -> None:
    other = Broker(
        broker.settings.updated(
            {"port": 0, "config_db": tmp_path / "other.sqlite", "queue_dir": tmp_path / "oq"}
        )
    )
    await other.start()
    try:
        consumer = await open_session(other.port, b"other", b"only-on-other")
        samples, _ = await scrape(other)
        assert value(samples, "fq_queue_clients", queue="only-on-other") == 1
        mine, _ = await scrape(broker)
        assert ("fq_queue_clients", (("queue", "only-on-other"),)) not in mine
        assert registry_for(broker) is not registry_for(other)
        await consumer.close()
    finally:
        async with asyncio.timeout(10):
            await other.stop()
    # Nothing of ours in prometheus-client's global registry.
    assert not [m for m in REGISTRY.collect() if m.name.startswith("fq_")]


async def test_a_real_disk_queue_reports_its_fsyncs(broker: Broker) -> None:
    """The real DiskStore, real fsyncs (fsync=always), scraped over HTTP: every figure
    docs/http.md lists for a disk queue is there and agrees with the store."""
    session = await open_session(broker.port, b"d", b"diskq\x00disk:fsync=always")
    await session.bind(b"ex", b"prefix:")
    async with Client(port=broker.port, source="pub") as client:
        for i in range(3):
            client.publish(b"ex", b"r", b"m%d" % i)
            await client.confirm()  # each waits for its own fsync
    store = broker.queues[b"diskq"].store
    assert isinstance(store, DiskStore)
    samples, _ = await scrape(broker)
    count = value(samples, "fq_queue_fsync_seconds_count", queue="diskq")
    total = value(samples, "fq_queue_fsync_seconds_sum", queue="diskq")
    last = value(samples, "fq_queue_fsync_last_seconds", queue="diskq")
    assert count == store.fsyncs >= 3
    assert total == store.fsync_seconds_total > 0
    assert 0 < last <= total
    assert value(samples, "fq_queue_disk_bytes", queue="diskq") == store.size_bytes > 0
    assert value(samples, "fq_queue_disk_write_errors_total", queue="diskq") == 0
    assert value(samples, "fq_queue_disk_fsync_errors_total", queue="diskq") == 0
    await session.close()
