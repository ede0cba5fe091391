"""The Figg listener under auth = "password": clients log in with TLS client certificates
(the broker's ``tls_client_ca``; the subject CN is the user), and their users' publish
and consume rights apply per topic. Real sockets on loopback, our own Figg client for
the round trip, raw frames for what must be refused."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from pathlib import Path

import pytest

from fqbroker.clients.figg.client import FiggClient
from fqbroker.protocols.figg import wire
from fqbroker.protocols.figg.wire import Attach, Attached, Ping, Pong, Publish
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import TIMEOUT, on, port_of, running, wait_for
from tests.pki import Logins, password_logins
from tests.procs import Proc

RIGHTS = {
    "alice": [("publish", "news.*"), ("consume", "news.*")],
    "reader": [("consume", "news.*")],
}


@pytest.fixture
def logins(settings: Settings, tmp_path: Path) -> Logins:
    logins = password_logins(settings, tmp_path, RIGHTS)
    on(settings, "figg", tls_cert=logins.cert, tls_key=logins.key)
    return logins


async def exchange(
    broker: Broker, context: ssl.SSLContext, *frames: wire.Frame
) -> list[wire.Frame]:
    """Send ``frames`` over TLS and read until the broker closes the connection (or a
    TLS alert ends it); the frames it answered with."""
    decoder = wire.FrameDecoder()
    got: list[wire.Frame] = []
    with contextlib.suppress(ssl.SSLError, ConnectionResetError, BrokenPipeError):
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port_of(broker, "figg"), ssl=context, server_hostname="127.0.0.1"
        )
        try:
            writer.write(b"".join(wire.encode(f) for f in frames))
            async with asyncio.timeout(TIMEOUT):
                while data := await reader.read(65536):
                    decoder.receive_data(data)
                    while (frame := decoder.next_frame()) is not None:
                        got.append(frame)
                        if isinstance(frame, Pong):
                            # Logged in and answered: hang up ourselves.
                            writer.close()
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
    return got


async def test_a_client_without_a_login_is_refused(settings: Settings, logins: Logins) -> None:
    async with running(settings) as broker:
        # No certificate, one from another CA, one whose CN is no user: closed unanswered.
        for context in (
            logins.context(None),
            logins.context("alice", ca=logins.stranger),
            logins.context("mallory"),
        ):
            assert await exchange(broker, context, Ping(1)) == []
        assert broker.limits.refused["auth"] >= 2  # the ones the handshake let through
        # Each refused connection was given back to the limits.
        await wait_for(lambda: broker.front_ends["figg"].counters.open == 0)
        assert broker.limits.connections == 0
        # The listener carries on: a user's certificate is answered.
        assert await exchange(broker, logins.context("alice"), Ping(2)) == [Pong(2)]


async def test_a_user_publishes_and_reads_with_its_certificate(
    settings: Settings, logins: Logins
) -> None:
    async with running(settings) as broker:
        port = port_of(broker, "figg")
        alice = logins.client("alice")
        async with FiggClient("127.0.0.1", port, cafile=logins.cafile, certfile=alice) as pub:
            await pub.publish("news.today", b"hello")
            await pub.flush()
        async with FiggClient("127.0.0.1", port, cafile=logins.cafile, certfile=alice) as sub:
            messages = sub.subscribe("news.today", offset=0)
            async with asyncio.timeout(TIMEOUT):
                first = await anext(messages)
        assert first.data == b"hello"


async def test_a_user_without_the_right_is_refused_per_topic(
    settings: Settings, logins: Logins
) -> None:
    async with running(settings) as broker:
        alice, reader = logins.context("alice"), logins.context("reader")
        # Topics outside alice's rights: closed, nothing acknowledged or attached.
        assert await exchange(broker, alice, Publish(b"secret", 0, b"x")) == []
        assert await exchange(broker, alice, Attach(b"secret", 0)) == []
        # reader may consume news.*, not publish there.
        assert await exchange(broker, reader, Publish(b"news.x", 0, b"x")) == []
        got = await exchange(broker, reader, Attach(b"news.x", 0), Ping(3))
        assert isinstance(got[0], Attached) and got[0].topic == b"news.x"
        assert got[-1] == Pong(3)
        assert broker.limits.refused["auth"] == 3


async def test_fqd_and_the_figg_tool_with_a_client_certificate(
    settings: Settings, logins: Logins, tmp_path: Path, procs: list[Proc]
) -> None:
    """fqd as its flags configure it (--auth password --tls-client-ca), and the ``figg``
    tool logging in with --certfile: its lines published and read back."""
    figg_table = f'[figg]\nlisten = "127.0.0.1:0"\ntls_cert = "{logins.cert}"\n'
    conf = tmp_path / "fqd.toml"
    conf.write_text(f'[fqd]\n\n{figg_table}tls_key = "{logins.key}"\n')
    async with asyncio.timeout(4 * TIMEOUT):
        fqd, _ = await Proc.start_fqd(
            tmp_path, "--config", str(conf), "--auth", "password",
            "--tls-client-ca", str(logins.cafile),
        )  # fmt: skip
        procs.append(fqd)
        line = await fqd.wait_stderr("Figg listening on port: ")
        port = line.rsplit(" ", 1)[1]
        figg = ("-m", "fqbroker.cli.figg", "--port", port, "--cafile", str(logins.cafile))
        alice = ("--certfile", str(logins.client("alice")))
        pub = await Proc.start(*figg, *alice, "pub", "news.cli", stdin=asyncio.subprocess.PIPE)
        procs.append(pub)
        status, _, err = await pub.finish(b"one\ntwo\n")
        assert status == 0 and "published 2 messages" in err, err
        sub = await Proc.start(*figg, *alice, "sub", "news.cli", "--offset", "0", "--count", "2")
        procs.append(sub)
        status, out, err = await sub.finish()
        assert status == 0, err
        assert out.splitlines() == [b"one", b"two"]
