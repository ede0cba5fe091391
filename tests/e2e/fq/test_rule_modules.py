"""A user's rule function, loaded the documented way (`fqd -m NAME`), routes messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from fqbroker.protocols.fq import wire
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import NODE_ID, open_session

PLUGIN_DIR = Path(__file__).resolve().parents[3] / "examples" / "rules_plugin"


async def test_module_loaded_with_m_routes_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    settings = Settings(
        port=0, node_id=NODE_ID, config_db=tmp_path / "db", modules=["fqbroker_rules_example"]
    )
    async with Broker(settings) as broker:
        consumer = await open_session(broker.port)
        route_id = await consumer.bind(b"logs", b'prefix:"http." route_endswith(".json")')
        assert route_id != wire.BIND_ILLEGAL
        publisher = await open_session(broker.port)
        for route in (b"http.a.json", b"http.b.txt", b"http.c.json"):
            await publisher.publish(b"logs", route, route)
        got = await consumer.receive(2)
        assert [m.payload for m in got] == [b"http.a.json", b"http.c.json"]
        await consumer.close()
        await publisher.close()


async def test_without_the_module_the_function_does_not_bind(broker: Broker) -> None:
    session = await open_session(broker.port)
    assert await session.bind(b"logs", b'prefix: route_endswith(".json")') == wire.BIND_ILLEGAL
    await session.close()


def test_unknown_module_is_a_clear_startup_error(tmp_path: Path) -> None:
    settings = Settings(port=0, node_id=NODE_ID, modules=["no_such_rules_module"])
    with pytest.raises(ImportError, match="no_such_rules_module"):
        Broker(settings)
