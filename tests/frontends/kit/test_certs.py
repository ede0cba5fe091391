"""Every listener authenticated: under auth = "password" a front end that cannot tell
who its clients are keeps the broker from starting, in one line naming it and the fix,
unless its table says ``anonymous = true``; under ``tls_required`` so does a TCP port of
its own without TLS. Checked before anything binds, on loopback addresses: neither check
depends on the address."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import trustme

from fqbroker.protocols.figg import wire
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import TIMEOUT, on, port_of, root_and_bob, running
from tests.pki import make_pki

CERT_FRONT_ENDS = ("lumberjack", "figg", "opencluster")


async def refused(settings: Settings, match: str) -> None:
    broker = Broker(settings)
    with pytest.raises(ValueError, match=match):
        await broker.start()
    assert list(broker.listeners.servers()) == []  # nothing bound
    await broker.stop()


@pytest.mark.parametrize("name", CERT_FRONT_ENDS)
async def test_a_front_end_that_cannot_log_clients_in_stops_the_start(
    settings: Settings, tmp_path: Path, name: str
) -> None:
    root_and_bob(settings)
    fix = rf"set tls_client_ca .* and \[{name}\] tls_cert, or \[{name}\] anonymous = true"
    await refused(on(settings, name), f'^{name}: auth = "password", but .*{fix}')
    # TLS without a CA for client certificates cannot log anyone in either.
    pki = make_pki(trustme.CA(), tmp_path)
    await refused(on(settings, name, tls_cert=pki["cert"], tls_key=pki["key"]), fix)
    # With the CA it starts.
    settings.tls_client_ca = pki["ca"]
    async with running(settings) as broker:
        assert broker.front_ends[name].address is not None


async def test_anonymous_true_serves_anyone_on_purpose(settings: Settings) -> None:
    root_and_bob(settings)
    async with running(on(settings, "figg", anonymous=True)) as broker:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(broker, "figg"))
        writer.write(wire.encode(wire.Ping(7)))
        async with asyncio.timeout(TIMEOUT):
            data = await reader.read(65536)
        decoder = wire.FrameDecoder()
        decoder.receive_data(data)
        assert decoder.next_frame() == wire.Pong(7)
        writer.close()


async def test_fyrehose_under_password_needs_anonymous(settings: Settings) -> None:
    root_and_bob(settings)
    await refused(
        on(settings, "fyrehose"),
        r"fyrehose: .* carries no credentials: set \[fyrehose\] anonymous = true",
    )
    async with running(on(settings, "fyrehose", anonymous=True)) as broker:
        assert broker.front_ends["fyrehose"].address is not None


async def test_tls_required_stops_a_plain_port_of_its_own(
    settings: Settings, tmp_path: Path
) -> None:
    pki = make_pki(trustme.CA(), tmp_path)
    settings.tls_cert, settings.tls_key, settings.tls_required = pki["cert"], pki["key"], True
    await refused(
        on(settings, "figg"), r"^figg: tls_required, but its port has no TLS: set \[figg\] tls_cert"
    )
    async with running(on(settings, "figg", tls_cert=pki["cert"], tls_key=pki["key"])) as broker:
        assert broker.front_ends["figg"].transport == "tls"
