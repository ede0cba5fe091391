"""De-duplication by message id against a real fqd process: a publisher with ids is cut
off by kill -9 with its last messages unconfirmed, sends that tail again to the restarted
broker, and the disk queue holds every message once. Publishers that did not opt in (fq's
C tools count ids from 1 in every process) keep their repeats."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from fqbroker.clients.fq.client import Client
from fqbroker.frontends.http.submit import BAD_MSGID
from fqbroker.protocols.fq import wire
from fqbroker.server.broker import Broker
from tests.conftest import TIMEOUT
from tests.e2e.http.test_http import get
from tests.procs import Proc

QUEUE = "keeper/onceq/disk:permanent,backlog=-1"
N = 3000
CONFIRMED = 1500


def msgid(i: int) -> bytes:
    return b"writer-1" + i.to_bytes(8, "big")


async def restart(tmp_path: Path, procs: list[Proc], fqd: Proc | None = None) -> int:
    if fqd is not None:
        fqd.kill()  # kill -9
        await fqd.proc.wait()
    fqd, port = await Proc.start_fqd(tmp_path)
    procs.append(fqd)
    return port


async def held(port: int, n: int) -> Counter[bytes]:
    """What the disk queue holds, read by its consumer until ``n`` came and then a quiet
    moment: more than ``n`` (a duplicate) is seen too."""
    got: Counter[bytes] = Counter()
    async with Client(port=port, source=QUEUE) as consumer:
        async with asyncio.timeout(TIMEOUT):
            while got.total() < n:
                got.update(m.payload for m in await consumer.receive_many(1000))
        try:
            async with asyncio.timeout(0.5):
                while True:
                    got.update(m.payload for m in await consumer.receive_many(1000))
        except TimeoutError:
            pass
    return got


def stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats.json", timeout=10) as reply:
        doc: dict[str, Any] = json.load(reply)
    return doc["queues"]["onceq"]


async def bind(port: int, exchange: bytes) -> None:
    async with Client(port=port, source=QUEUE) as setup:
        await setup.bind(exchange, b"prefix:", wire.BindFlags.PERM)


async def test_the_unconfirmed_tail_sent_again_after_kill_9_is_kept_once(
    tmp_path: Path, procs: list[Proc]
) -> None:
    fqd_port = await restart(tmp_path, procs)
    fqd = procs[-1]
    await bind(fqd_port, b"ex")
    async with asyncio.timeout(TIMEOUT):
        publisher = Client(port=fqd_port, source="writer", reconnect=False, dedup=True)
        await publisher.connect()
        for i in range(CONFIRMED):
            publisher.publish(b"ex", b"r", b"m%d" % i, msgid(i))
        assert await publisher.confirm() == CONFIRMED
        for i in range(CONFIRMED, N):
            publisher.publish(b"ex", b"r", b"m%d" % i, msgid(i))
        await publisher.flush()
        # The broker has read them all (into the log, not yet confirmed): then the crash.
        while (await publisher.status())["msgs_in"] < N:
            await asyncio.sleep(0.01)
    port = await restart(tmp_path, procs, fqd)
    await publisher.close()
    # The publisher knows only that the first CONFIRMED are safe: it sends the rest again,
    # and some new ones.
    async with Client(port=port, source="writer", dedup=True) as again:
        for i in range(CONFIRMED, N + 100):
            again.publish(b"ex", b"r", b"m%d" % i, msgid(i))
        assert await again.confirm() == N + 100 - CONFIRMED
    got = await held(port, N + 100)
    assert got == Counter(b"m%d" % i for i in range(N + 100))
    assert stats(port)["duplicates"] == N - CONFIRMED


async def test_ids_of_publishers_that_did_not_opt_in_are_not_looked_at(
    tmp_path: Path, procs: list[Proc]
) -> None:
    port = await restart(tmp_path, procs)
    await bind(port, b"ex")
    async with Client(port=port, source="writer", dedup=True) as once:
        once.publish(b"ex", b"r", b"first", msgid(1))
        await once.confirm()
    # Two C-like processes, each counting from 1, and the same id as the opted-in one:
    # every message is kept.
    for _ in range(2):
        async with Client(port=port, source="writer") as plain:
            plain.publish(b"ex", b"r", b"plain", msgid(1))
            plain.publish(b"ex", b"r", b"plain", msgid(1))
            await plain.confirm()
    got = await held(port, 5)
    assert got == Counter({b"first": 1, b"plain": 4})
    assert "duplicates" not in stats(port)


async def test_submit_with_an_id_stores_once_across_kill_9(
    tmp_path: Path, procs: list[Proc]
) -> None:
    port = await restart(tmp_path, procs)
    await bind(port, b"web")
    headers = [("X-Fq-Route", "r"), ("X-Fq-Exchange", "web"), ("X-Fq-Msg-Id", "ab" * 16)]
    response, body = await get(port, "/submit", headers, b"once")
    assert (response.status_code, json.loads(body)["routed"]) == (200, 1)
    port = await restart(tmp_path, procs, procs[-1])
    # Sent again (the answer was lost, say): answered 200 like the first, not stored again.
    response, body = await get(port, "/submit", headers, b"once")
    assert (response.status_code, json.loads(body)["routed"]) == (200, 1)
    # Without the header, or from another sender, it is another message.
    _, body = await get(port, "/submit", headers[:2], b"once")
    assert json.loads(body)["routed"] == 1
    response, _ = await get(port, "/submit", [*headers, ("X-Fq-Sender", "other")], b"once")
    assert response.status_code == 200
    assert await held(port, 3) == Counter({b"once": 3})
    assert stats(port)["duplicates"] == 1


async def test_submit_refuses_a_message_id_that_is_not_one(broker: Broker) -> None:
    for value in ("ab" * 15, "zz" * 16, "ab" * 17):
        headers = [("X-Fq-Route", "r"), ("X-Fq-Exchange", "web"), ("X-Fq-Msg-Id", value)]
        response, body = await get(broker.port, "/submit", headers, b"x")
        assert response.status_code == 400
        assert json.loads(body) == {"error": BAD_MSGID}
    assert broker.router.aggregate.messages == 0
