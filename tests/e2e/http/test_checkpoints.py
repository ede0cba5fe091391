"""Checkpoints over HTTP (/add_checkpoint, /remove_checkpoint, /reset_to_checkpoint): errors,
a checkpoint's whole life on a disk queue, and one that outlives a restart."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

import pytest

from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from fqbroker.storage.configdb import checkpoints
from tests.conftest import open_session, wait_for
from tests.e2e.http.test_http import HttpConn, get, header, post


def checkpoint_body(status: str, message: str) -> dict[str, str]:
    return {"status": status, "message": message}


@pytest.mark.parametrize("endpoint", ["add_checkpoint", "remove_checkpoint", "reset_to_checkpoint"])
async def test_checkpoint_errors(broker: Broker, endpoint: str) -> None:
    eph = await open_session(broker.port, b"c", b"eph\x00mem:public")
    mem = await open_session(broker.port, b"c", b"pmem\x00mem:permanent")
    cases = [
        ("cpname=fq&qname=pmem", "'fq' is a reserved name, cannot be used for a checkpoint name"),
        ("cpname=c&qname=nosuch", "Cannot find registered queue 'nosuch'"),
        ("cpname=c&qname=eph", "Checkpoints on ephemeral queues not supported"),
        ("cpname=c&qname=pmem", "Checkpoints on memory queues not supported"),
        ("qname=pmem", "'cpname' parameter is required"),
        ("cpname=&qname=pmem", "'cpname' parameter is required"),
        ("cpname=c", "'qname' parameter is required"),
        ("", "'cpname' parameter is required"),
    ]
    conn = await HttpConn.open(broker.port)
    for query, message in cases:
        response, body = await conn.request("POST", f"/{endpoint}?{query}&chkptid=1:1")
        assert response.status_code == 200
        assert header(response, b"content-type") == b"application/json"
        assert json.loads(body) == checkpoint_body("error", message), query
    await conn.close()
    await eph.close()
    await mem.close()


async def checkpoint_call(port: int, endpoint: str, **query: str) -> dict[str, str]:
    response, body = await post(port, f"/{endpoint}?{urlencode(query)}")
    assert response.status_code == 200
    assert header(response, b"content-type") == b"application/json"
    answer: dict[str, str] = json.loads(body)
    return answer


async def queue_info(port: int, queue: str) -> dict[str, Any]:
    response, body = await get(port, f"/queue/info?queue={queue}")
    assert response.status_code == 200
    info: dict[str, Any] = json.loads(body)
    return info


async def test_checkpoint_add_read_move_reset_remove_over_http(broker: Broker) -> None:
    """A checkpoint's whole life through real requests on a real disk queue, and what a
    reset does to the queue's reader: it gets the messages from the checkpoint on again."""
    port = broker.port
    reader = await open_session(port, b"reader", b"cpq\x00disk:permanent,public")
    await reader.bind(b"cp", b"prefix:")
    publisher = await open_session(port, b"writer")
    for i in range(10):
        await publisher.publish(b"cp", b"r", b"m%d" % i)
    assert [m.payload for m in await reader.receive(10)] == [b"m%d" % i for i in range(10)]
    info = await queue_info(port, "cpq")
    first = info["first"]
    # Sequence numbers are dense: m<i> is first + i. Wait until all are durable (readable).
    await wait_for(lambda: broker.queues[b"cpq"].store.durable_seq >= first + 9)  # type: ignore[attr-defined]
    assert "mark" not in (await queue_info(port, "cpq"))["checkpoints"]

    # Create, and read it back.
    at = checkpoints.format_position(first + 4)
    answer = await checkpoint_call(port, "add_checkpoint", cpname="mark", qname="cpq", chkptid=at)
    assert answer == checkpoint_body("success", "Checkpoint added")
    assert (await queue_info(port, "cpq"))["checkpoints"]["mark"] == first + 4

    # Move it: the same call with a later position.
    at = checkpoints.format_position(first + 6)
    answer = await checkpoint_call(port, "add_checkpoint", cpname="mark", qname="cpq", chkptid=at)
    assert answer == checkpoint_body("success", "Checkpoint added")
    assert (await queue_info(port, "cpq"))["checkpoints"]["mark"] == first + 6

    # Reset the queue's reader to it: m6..m9 come again, in order, then new messages.
    answer = await checkpoint_call(port, "reset_to_checkpoint", cpname="mark", qname="cpq")
    assert answer == checkpoint_body("success", "'cpq' reset to checkpoint 'mark'")
    assert [m.payload for m in await reader.receive(4)] == [b"m6", b"m7", b"m8", b"m9"]
    await publisher.publish(b"cp", b"r", b"m10")
    assert [m.payload for m in await reader.receive(1)] == [b"m10"]
    assert (await queue_info(port, "cpq"))["checkpoints"]["mark"] == first + 6  # not moved

    # Delete it: gone from the queue, and a reset to it is an error now.
    answer = await checkpoint_call(port, "remove_checkpoint", cpname="mark", qname="cpq")
    assert answer == checkpoint_body("success", "Checkpoint removed")
    assert "mark" not in (await queue_info(port, "cpq"))["checkpoints"]
    for endpoint in ("remove_checkpoint", "reset_to_checkpoint"):
        answer = await checkpoint_call(port, endpoint, cpname="mark", qname="cpq")
        assert answer == checkpoint_body("error", "Checkpoint does not exist")
    await publisher.close()
    await reader.close()


async def test_a_checkpoint_outlives_a_restart(settings: Settings) -> None:
    async with Broker(settings) as broker:
        session = await open_session(broker.port, b"reader", b"keep\x00disk:permanent,public")
        await session.bind(b"keep", b"prefix:")
        await session.publish(b"keep", b"r", b"one")
        await session.receive(1)
        first = (await queue_info(broker.port, "keep"))["first"]
        at = checkpoints.format_position(first + 1)
        answer = await checkpoint_call(
            broker.port, "add_checkpoint", cpname="kept", qname="keep", chkptid=at
        )
        assert answer == checkpoint_body("success", "Checkpoint added")
        await session.close()
    async with Broker(settings) as again:
        assert (await queue_info(again.port, "keep"))["checkpoints"]["kept"] == first + 1
        answer = await checkpoint_call(again.port, "remove_checkpoint", cpname="kept", qname="keep")
        assert answer == checkpoint_body("success", "Checkpoint removed")
