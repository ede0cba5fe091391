"""Interop with an independent fq client: the npm package ``fq@0.4.1``.

The Makefile installs it into tests/interop/node_modules; the test drives it with node
against a real broker on loopback.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from fqbroker.server.broker import Broker

INTEROP = Path(__file__).resolve().parents[3] / "tests" / "interop"
SCRIPT = INTEROP / "npm_fq_roundtrip.js"
COUNT = 1000


def _node() -> str:
    node = shutil.which("node")
    if node is None or not (INTEROP / "node_modules" / "fq").is_dir():
        pytest.fail("node and the npm fq client are required: run `make node` (make test does)")
    return node


async def test_npm_fq_client_binds_publishes_consumes_and_reads_status(broker: Broker) -> None:
    proc = await asyncio.create_subprocess_exec(
        _node(),
        str(SCRIPT),
        str(broker.port),
        str(COUNT),
        "npm-interop",
        cwd=INTEROP,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(60):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode(errors="replace")
    result = json.loads(out)

    assert result["bind"] == 1
    received = result["received"]
    assert len(received) == COUNT
    assert sorted(int(m["payload"].split()[1]) for m in received) == list(range(COUNT))
    for m in received:
        n = int(m["payload"].split()[1])
        assert m["route"] == f"npm.route.{n % 10}"
        assert m["exchange"] == "npm-interop"
        assert m["sender"] == "npm-publisher"
        assert m["hops"] == ["10.254.254.1", "127.0.0.1"]

    status = result["status"]
    assert status["msgs_out"] == COUNT
    assert status["dropped_in"] == 0
    publisher = result["publisher_status"]
    assert publisher["msgs_in"] == COUNT
    assert publisher["routed"] == COUNT
    assert publisher["no_route"] == 0
