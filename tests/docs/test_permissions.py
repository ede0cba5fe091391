"""What docs/permissions.md says about the queue names a user needs rights on, checked
against a broker under auth = "password": our tools and client, naming no queue, attach
to ``q-<uuid>`` (so ``queue q-*`` lets them in and ``queue auto-*`` does not), and a
client sending an empty queue name gets the broker's ``auto-<uuid>``."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fqbroker.clients.fq.client import Client, ClientError
from fqbroker.protocols.fq import wire
from fqbroker.settings.broker import Settings
from fqbroker.storage.configdb.users import Users
from tests.conftest import authenticate, running

PASSWORD = "pw"


def _user(settings: Settings, name: str, queue_pattern: str) -> None:
    users = Users(settings.config_db)
    try:
        users.add(name, PASSWORD)
        users.allow(name, "queue", queue_pattern)
        users.allow(name, "publish", "logs*")
    finally:
        users.close()


async def _login(port: int, source: str) -> None:
    async with Client(port=port, source=source, password=PASSWORD, reconnect=False) as client:
        client.publish("logs", "r", b"x")
        await client.confirm()


async def test_the_tools_queue_is_q_uuid(settings: Settings) -> None:
    _user(settings, "alice", "q-*")
    _user(settings, "carol", "auto-*")
    async with running(replace(settings, auth="password")) as broker:
        port = broker.port
        await _login(port, "alice")  # no queue named: q-<uuid>, allowed by q-*
        with pytest.raises(ClientError, match=r"permission denied: queue q-[0-9a-f-]{36}"):
            await _login(port, "carol")
        # An empty queue name on the wire (our client fills one in; others need not): the
        # broker's auto-<uuid>, which auto-* allows.
        cmd = await authenticate(port, b"carol", b"\0mem", PASSWORD.encode())
        try:
            assert isinstance(await cmd.reply(), wire.AuthResponse)
        finally:
            await cmd.close()
        assert any(name.startswith(b"auto-") for name in broker.queues), broker.queues


def test_the_doc_names_them() -> None:
    from tests.docs.markdown_blocks import ROOT

    text = " ".join((ROOT / "docs" / "permissions.md").read_text(encoding="utf-8").split())
    assert "`q-<uuid>`, so such users need `queue q-*`" in text
    assert "`auto-<uuid>` queue from the broker, which takes `queue auto-*`" in text
