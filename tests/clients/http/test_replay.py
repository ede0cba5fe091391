"""The replay client over HTTP under auth = "password": it logs in as its user."""

from __future__ import annotations

import asyncio

import pytest

from fqbroker.clients.http.replay import ReplayClient
from fqbroker.errors import BrokerError
from fqbroker.settings.broker import Settings
from tests.conftest import root_and_bob, running


async def test_a_user_reads_and_checkpoints_with_its_login(settings: Settings) -> None:
    async with running(root_and_bob(settings)) as broker:
        root = ReplayClient(port=broker.port, user="root", password="rootpw")
        await asyncio.to_thread(
            root.ensure_queue, "q", user="root", password="rootpw", exchange="ex"
        )
        info = await asyncio.to_thread(root.info, "q")
        assert info.next >= 1
        await asyncio.to_thread(root.set_checkpoint, "q", "spark", info.next)

        anonymous = ReplayClient(port=broker.port)
        with pytest.raises(BrokerError):
            await asyncio.to_thread(anonymous.info, "q")
        # bob may publish only: contents and checkpoints are not his
        bob = ReplayClient(port=broker.port, user="bob", password="bobpw")
        with pytest.raises(BrokerError):
            await asyncio.to_thread(bob.info, "q")
        with pytest.raises(BrokerError):
            await asyncio.to_thread(bob.set_checkpoint, "q", "spark", info.next)
