"""TLS on the shared main port: TLS and plain clients side by side, HTTPS, a client that
does not trust the certificate, ``tls_required``, and fqd with its TLS flags.

Certificates come from trustme: a throwaway CA and a certificate for 127.0.0.1 it signs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import ssl
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
import trustme

from fqbroker.clients.figg.client import FiggClient
from fqbroker.clients.fq.client import Client
from fqbroker.errors import ClientError
from fqbroker.frontends.figg.settings import Figg
from fqbroker.frontends.kit.component import preambles
from fqbroker.frontends.kit.tls import looks_like_tls
from fqbroker.server.broker import Broker
from fqbroker.server.frontends import FRONT_ENDS
from fqbroker.settings.broker import Settings, Upstream
from fqbroker.storage.configdb.users import Users
from tests.conftest import TIMEOUT, RawConn, running
from tests.pki import make_pki
from tests.procs import Proc


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def pki(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_pki(ca, tmp_path_factory.mktemp("pki"))


@pytest.fixture
async def tls_broker(settings: Settings, pki: dict[str, Path]) -> AsyncIterator[Broker]:
    async with running(replace(settings, tls_cert=pki["cert"], tls_key=pki["key"])) as b:
        yield b


def test_client_hello_is_told_from_every_preamble() -> None:
    assert looks_like_tls(b"\x16\x03\x01")
    assert looks_like_tls(b"\x16")  # only one byte came yet: decided on it
    assert not looks_like_tls(b"\x16\x01")  # not a TLS record version
    claimed = preambles(FRONT_ENDS)
    assert claimed  # fq's command, data and peer preambles, HTTP's methods
    for first4 in claimed:
        assert not looks_like_tls(first4[:3]), first4


async def test_tls_and_plain_clients_share_the_port(
    tls_broker: Broker, pki: dict[str, Path]
) -> None:
    port = tls_broker.port
    tls = Client("127.0.0.1", port, "tlsuser", cafile=pki["ca"], reconnect=False)
    plain = Client("127.0.0.1", port, "plainuser", reconnect=False)
    async with asyncio.timeout(TIMEOUT), tls, plain:
        assert tls.ssl is not None and plain.ssl is None
        await tls.bind(b"x", b"prefix:")
        await plain.bind(b"x", b"prefix:")
        tls.publish(b"x", b"a.b", b"over tls")
        plain.publish(b"x", b"a.c", b"in the clear")
        await tls.flush()
        await plain.flush()
        for client in (tls, plain):
            got = sorted([(await client.receive()).payload for _ in range(2)])
            assert got == [b"in the clear", b"over tls"]
        status = await tls.status()
        assert status  # the command channel answers over TLS too
        # Both channels of the TLS client are TLS connections in the broker.
        link = tls._link
        assert link is not None
        assert link.cmd_w.get_extra_info("ssl_object") is not None
        assert link.data_w.get_extra_info("ssl_object") is not None


async def test_https_stats(tls_broker: Broker, pki: dict[str, Path]) -> None:
    context = ssl.create_default_context(cafile=str(pki["ca"]))
    async with asyncio.timeout(TIMEOUT):
        reader, writer = await asyncio.open_connection("127.0.0.1", tls_broker.port, ssl=context)
        writer.write(b"GET /stats.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = await reader.read()
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert isinstance(json.loads(body), dict)
    # Plain HTTP still works beside it.
    raw = await RawConn.open(tls_broker.port)
    await raw.send(b"GET /stats.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert (await raw.closed()).startswith(b"HTTP/1.1 200")


async def test_untrusted_certificate_fails_cleanly(
    tls_broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    other = trustme.CA()  # the client trusts only a CA that did not sign the broker's
    context = ssl.create_default_context()
    other.configure_trust(context)
    client = Client("127.0.0.1", tls_broker.port, "u", tls=context, reconnect=False)
    with pytest.raises(ssl.SSLCertVerificationError):
        async with asyncio.timeout(TIMEOUT):
            await client.connect()
    await client.close()
    await wait_until(lambda: tls_broker.limits.bad_input["tls"] >= 1)
    lines = [r for r in caplog.records if "TLS handshake" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None
    assert "127.0.0.1" in lines[0].getMessage()
    assert not [r for r in caplog.records if r.exc_info is not None]
    # The broker still serves everyone else.
    async with asyncio.timeout(TIMEOUT), Client("127.0.0.1", tls_broker.port, "u") as plain:
        assert await plain.status() is not None
    await wait_until(lambda: not tls_broker.listeners.unclaimed)


async def test_tls_required_refuses_plain_connections(
    settings: Settings, pki: dict[str, Path]
) -> None:
    strict = replace(settings, tls_cert=pki["cert"], tls_key=pki["key"], tls_required=True)
    async with running(strict) as broker:
        raw = await RawConn.open(broker.port)
        await raw.send(b"GET /stats.json HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await raw.closed() == b""
        assert broker.limits.bad_input["tls"] == 1
        client = Client("127.0.0.1", broker.port, "u", cafile=pki["ca"], reconnect=False)
        async with asyncio.timeout(TIMEOUT), client:
            await client.bind(b"x", b"prefix:")
        await wait_until(lambda: not broker.listeners.unclaimed)


def test_tls_settings_are_checked(pki: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="tls_required needs tls_cert"):
        Settings().updated({"tls_required": True})
    with pytest.raises(ValueError, match="tls_key needs tls_cert"):
        Settings().updated({"tls_key": str(pki["key"])})
    made = Settings().updated({"tls_cert": str(pki["cert"]), "tls_key": str(pki["key"])})
    assert made.tls_cert == pki["cert"]


async def test_fqd_serves_tls_with_its_flags(
    tmp_path: Path, pki: dict[str, Path], procs: list[Proc]
) -> None:
    """The subprocess runs on uvloop when installed: the peek and the TLS wrap work there too."""
    fqd, port = await Proc.start_fqd(
        tmp_path, "--tls-cert", str(pki["cert"]), "--tls-key", str(pki["key"])
    )
    procs.append(fqd)
    async with asyncio.timeout(2 * TIMEOUT):
        tls = Client("127.0.0.1", port, "a", cafile=pki["ca"], reconnect=False)
        async with tls, Client("127.0.0.1", port, "b", reconnect=False) as plain:
            await plain.bind(b"x", b"prefix:")
            tls.publish(b"x", b"r", b"from tls")
            await tls.flush()
            assert (await plain.receive()).payload == b"from tls"
        bad = Client("127.0.0.1", port, "c", tls=True, reconnect=False)  # system CAs only
        with pytest.raises(ssl.SSLCertVerificationError):
            await bad.connect()
        await bad.close()
        async with Client("127.0.0.1", port, "d", cafile=pki["ca"], reconnect=False) as again:
            assert await again.status() is not None  # still serving, over TLS too
        # Garbage after a ClientHello's first bytes: the handshake fails, the connection closes.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"\x16\x03\x01" + b"\xff" * 64)
        assert await reader.read() == b""
        writer.close()
        fqd.proc.send_signal(signal.SIGTERM)
        status, _, err = await fqd.finish()
    # One uvloop broker, two failed handshakes: nothing it logs is a traceback or an
    # unexpected error (the lines are INFO, below fqd's default level).
    assert status == 0 and "Traceback" not in err and "unexpected" not in err, err


async def test_fqd_refuses_a_missing_certificate(tmp_path: Path, procs: list[Proc]) -> None:
    fqd = await Proc.start("-m", "fqbroker", "-p", "0", "--tls-cert", str(tmp_path / "none.pem"))
    procs.append(fqd)
    async with asyncio.timeout(TIMEOUT):
        status, _, err = await fqd.finish()
    assert status == 2
    assert "fqd: " in err and "Traceback" not in err


async def wait_until(predicate, timeout: float = TIMEOUT) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


async def test_fq_send_and_fq_recv_over_tls(
    tmp_path: Path, pki: dict[str, Path], procs: list[Proc]
) -> None:
    # Five processes, each a Python start: a budget for each, not one for all.
    async with asyncio.timeout(5 * TIMEOUT):
        fqd, port = await Proc.start_fqd(
            tmp_path, "--tls-cert", str(pki["cert"]), "--tls-key", str(pki["key"]), "--tls-required"
        )
        procs.append(fqd)
        tool = ("-m", "fqbroker.cli.fqtools")
        recv = await Proc.start(
            *tool, "recv", "--host", "127.0.0.1", "--port", str(port), "--cafile", str(pki["ca"]),
            "--count", "2", "-e", "ex", "-b", "prefix:",
        )  # fmt: skip
        procs.append(recv)
        await recv.wait_stderr("route set -> ")
        sender = await Proc.start(
            *tool, "send", "-a", f"127.0.0.1:{port}", "--cafile", str(pki["ca"]),
            "-x", "ex", "-r", "r", stdin=asyncio.subprocess.PIPE,
        )  # fmt: skip
        procs.append(sender)
        status, _, err = await sender.finish(b"one\ntwo\n")
        assert status == 0, err
        status, out, err = await recv.finish()
        assert status == 0, err
        assert out == b"[r] one\n[r] two\n"
        # Without --tls the broker (tls_required) closes the connection: one line, exit 1.
        plain = await Proc.start(*tool, "send", "-a", f"127.0.0.1:{port}", "--count", "1")
        procs.append(plain)
        status, _, err = await plain.finish()
        assert status == 1 and "Traceback" not in err
        # --tls alone trusts the system's CAs, which did not sign this certificate.
        untrusted = await Proc.start(
            *tool, "send", "-a", f"127.0.0.1:{port}", "--tls", "--count", "1"
        )
        procs.append(untrusted)
        status, _, err = await untrusted.finish()
        assert status == 1 and "CERTIFICATE_VERIFY_FAILED" in err and "Traceback" not in err


async def test_peering_over_tls_with_passwords(settings: Settings, pki: dict[str, Path]) -> None:
    """The upstream requires TLS and passwords: the downstream's link logs in over TLS."""
    users = Users(settings.config_db)
    for name, password in (("linker", "s3cret"), ("writer", "w")):
        users.add(name, password)
        for kind in ("publish", "consume", "queue"):
            users.allow(name, kind, "*")
    users.close()
    up_settings = replace(
        settings, tls_cert=pki["cert"], tls_key=pki["key"], tls_required=True, auth="password"
    )
    async with running(up_settings) as upstream:
        link = {
            "host": "127.0.0.1",
            "port": upstream.port,
            "source": "linker//mem:drop,private,backlog=-1",
            "password": "s3cret",
            "exchange": "peered",
            "program": 'prefix:""',
            "cafile": str(pki["ca"]),
        }
        down_settings = replace(
            settings,
            node_id="10.254.254.2",
            config_db=settings.config_db.with_name("down.sqlite"),
            queue_dir=settings.queue_dir.with_name("down-queues"),
            upstream=[Upstream.from_table(link)],
        )
        assert down_settings.upstream[0].tls
        async with running(down_settings) as downstream, asyncio.timeout(TIMEOUT):
            consumer = Client("127.0.0.1", downstream.port, "c", reconnect=False)
            publisher = Client(
                "127.0.0.1", upstream.port, "writer", "w", cafile=pki["ca"], reconnect=False
            )
            async with consumer, publisher:
                await consumer.bind(b"peered", b'prefix:""')
                # The link binds on the upstream once connected: publish until one arrives.
                while True:
                    publisher.publish(b"peered", b"r", b"across")
                    await publisher.flush()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(0.2):
                            msg = await consumer.receive()
                            break
                assert msg.payload == b"across"
                assert len(msg.hops) >= 8  # it passed through both brokers
            assert upstream.limits.refused["auth"] == 0
            # Over TLS as in the clear, a wrong password gets fq's error frame.
            wrong = Client("127.0.0.1", upstream.port, "writer", "x", cafile=pki["ca"])
            with pytest.raises(ClientError, match="authentication failed"):
                await wrong.connect()
            await wrong.close()


async def test_figg_listener_over_tls(settings: Settings, pki: dict[str, Path]) -> None:
    """[figg] tls_cert/tls_key make the Figg port TLS, as Lumberjack's; the client follows."""
    settings.set_section(
        Figg().updated(
            {"listen": "127.0.0.1:0", "tls_cert": str(pki["cert"]), "tls_key": str(pki["key"])}
        )
    )
    async with running(settings) as broker, asyncio.timeout(TIMEOUT):
        live = broker.front_ends["figg"]
        assert live.address is not None and live.transport == "tls"
        port = live.address[1]
        async with FiggClient("127.0.0.1", port, cafile=pki["ca"]) as client:
            await client.publish("t", b"secret")
            sub = client.subscribe("t", 0)
            got = await sub.__anext__()
            assert got.data == b"secret"
        # A plain client gets nowhere: the handshake fails and the broker carries on.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"\x00" * 64)
        assert await reader.read() == b""
        writer.close()
    with pytest.raises(ValueError, match="figg tls_key needs tls_cert"):
        Figg().updated({"tls_key": str(pki["key"])})


async def test_figg_cli_over_tls(tmp_path: Path, pki: dict[str, Path], procs: list[Proc]) -> None:
    conf = tmp_path / "fqd.toml"
    conf.write_text(
        f'[fqd]\n\n[figg]\nlisten = "127.0.0.1:0"\n'
        f'tls_cert = "{pki["cert"]}"\ntls_key = "{pki["key"]}"\n'
    )
    async with asyncio.timeout(4 * TIMEOUT):
        fqd, _ = await Proc.start_fqd(tmp_path, "--config", str(conf))
        procs.append(fqd)
        line = await fqd.wait_stderr("Figg listening on port: ")
        port = line.rsplit(" ", 1)[1]
        figg = ("-m", "fqbroker.cli.figg", "--port", port, "--cafile", str(pki["ca"]))
        pub = await Proc.start(*figg, "pub", "news", stdin=asyncio.subprocess.PIPE)
        procs.append(pub)
        status, _, err = await pub.finish(b"one\ntwo\n")
        assert status == 0 and "published 2 messages" in err, err
        sub = await Proc.start(*figg, "sub", "news", "--offset", "0", "--count", "2")
        procs.append(sub)
        status, out, err = await sub.finish()
        assert status == 0, err
        assert out.splitlines() == [b"one", b"two"]


async def _large_over_tls(settings: Settings, pki: dict[str, Path]) -> None:
    # Messages read in place (32 KiB and more, 1 MiB and more) through the TLS transport:
    # its BufferedProtocol reads decrypt into the frame's own memory.
    async with running(replace(settings, tls_cert=pki["cert"], tls_key=pki["key"])) as broker:
        tls = Client("127.0.0.1", broker.port, "tlsuser", cafile=pki["ca"], reconnect=False)
        async with asyncio.timeout(3 * TIMEOUT), tls:
            await tls.bind(b"x", b"prefix:")
            payloads = [bytes([i]) * n for i, n in enumerate([40_000, 300_000, 5, (1 << 20) + 7])]
            for payload in payloads:
                tls.publish(b"x", b"r", payload)
            await tls.flush()
            assert [(await tls.receive()).payload for _ in payloads] == payloads


async def test_large_messages_over_tls(settings: Settings, pki: dict[str, Path]) -> None:
    await _large_over_tls(settings, pki)


def test_large_messages_over_tls_on_uvloop(settings: Settings, pki: dict[str, Path]) -> None:
    uvloop = pytest.importorskip("uvloop")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_large_over_tls(settings, pki))


async def test_what_a_tls_client_publishes_before_close_is_all_delivered(
    tmp_path: Path, pki: dict[str, Path], procs: list[Proc]
) -> None:
    """TLS has no half-close, so close() cannot write_eof the data socket and wait for the
    broker's end as it does in the clear. It used to go straight on to close both sockets:
    a broker that read the command socket's end before it had paired the data socket
    refused that socket, and the messages on it were lost (a flaky fq-send | fq-recv over
    TLS, about 1 run in 10). A real fqd in its own process, as there."""
    fqd, port = await Proc.start_fqd(
        tmp_path, "--tls-cert", str(pki["cert"]), "--tls-key", str(pki["key"])
    )
    procs.append(fqd)
    rounds = 40
    async with asyncio.timeout(6 * TIMEOUT):
        consumer = Client("127.0.0.1", port, "c", cafile=pki["ca"], reconnect=False)
        async with consumer:
            await consumer.bind(b"x", b"prefix:")
            for round_ in range(rounds):
                publisher = Client(
                    "127.0.0.1", port, f"p{round_}", cafile=pki["ca"], reconnect=False
                )
                await publisher.connect()
                publisher.publish(b"x", b"r", b"%d" % round_)
                await publisher.close()
            got: list[bytes] = []
            with contextlib.suppress(TimeoutError):
                while len(got) < rounds:
                    async with asyncio.timeout(2):
                        got += [m.payload for m in await consumer.receive_many(rounds)]
    assert sorted(got, key=int) == [b"%d" % r for r in range(rounds)]
