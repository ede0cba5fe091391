"""The OpenCluster listener under auth = "password": clients log in with TLS client
certificates (the subject CN is the user); a get needs the consume right on the table's
``namespace``, a set the publish right. Real sockets on loopback, our own client."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest

from fqbroker.clients.opencluster.client import OpenClusterClient
from fqbroker.errors import ClientError
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import TIMEOUT, on, port_of, running
from tests.pki import Logins, password_logins
from tests.procs import Proc

RIGHTS = {
    "alice": [("publish", "opencluster"), ("consume", "opencluster")],
    "reader": [("consume", "opencluster")],
    "nobody": [("publish", "elsewhere")],
}


@pytest.fixture
def logins(settings: Settings, tmp_path: Path) -> Logins:
    logins = password_logins(settings, tmp_path, RIGHTS)
    on(settings, "opencluster", tls_cert=logins.cert, tls_key=logins.key)
    return logins


async def connect(broker: Broker, logins: Logins, user: str | None) -> OpenClusterClient:
    port = port_of(broker, "opencluster")
    if user is None:
        return await OpenClusterClient.connect("127.0.0.1", port, cafile=logins.cafile)
    return await OpenClusterClient.connect(
        "127.0.0.1", port, cafile=logins.cafile, certfile=logins.client(user)
    )


async def test_a_client_without_a_login_is_refused(settings: Settings, logins: Logins) -> None:
    async with running(settings) as broker:
        for user in (None, "mallory", "nobody"):  # no certificate, no such user, no right
            with pytest.raises((ClientError, ConnectionError, ssl.SSLError)):
                await connect(broker, logins, user)
        assert broker.limits.refused["auth"] == 3
        stranger = logins.context("alice", ca=logins.stranger)
        with pytest.raises((ClientError, ConnectionError, ssl.SSLError)):
            await OpenClusterClient.connect(
                "127.0.0.1", port_of(broker, "opencluster"), tls=stranger
            )


async def test_a_user_sets_and_gets_with_its_certificate(
    settings: Settings, logins: Logins
) -> None:
    async with running(settings) as broker:
        async with await connect(broker, logins, "alice") as alice:
            await alice.set("greeting", "hello")
            assert await alice.get("greeting") == b"hello"
        async with await connect(broker, logins, "reader") as reader:
            assert await reader.get("greeting") == b"hello"
            # No publish right: the set is answered failinfo and nothing changes.
            with pytest.raises(ClientError, match="permission denied"):
                await reader.set("greeting", "changed")
            assert await reader.get("greeting") == b"hello"


async def _tool(*args: str) -> tuple[int, bytes, str]:
    proc = await Proc.start("-m", "fqbroker.cli.opencluster", *args)
    async with asyncio.timeout(TIMEOUT * 3):
        return await proc.finish()


async def test_the_opencluster_tool_logs_in_with_its_certificate(
    settings: Settings, logins: Logins
) -> None:
    async with running(settings) as broker:
        to = ("--port", str(port_of(broker, "opencluster")), "--cafile", str(logins.cafile))
        alice = ("--certfile", str(logins.client("alice")))
        assert await _tool(*to, *alice, "set", "k", "v") == (0, b"", "")
        assert await _tool(*to, *alice, "get", "k") == (0, b"v\n", "")
        status, out, err = await _tool(*to, "get", "k")  # no certificate: refused
        assert status == 1 and out == b"" and len(err.strip().splitlines()) == 1, err
