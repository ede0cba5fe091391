"""The OpenCluster listener's settings: bad values as clear errors, its table and flag,
fqd stopping in one line when the store cannot be opened, and the listener over TLS.
The protocol itself: test_opencluster.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fqbroker.frontends.opencluster.settings import OpenCluster
from fqbroker.protocols.opencluster import wire
from fqbroker.settings.broker import Settings
from tests.conftest import port_of, running
from tests.e2e.opencluster.test_opencluster import HELLO_REPLY, Conn, acked, get_string
from tests.procs import Proc


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("lisen = 1", "unknown opencluster setting 'lisen'"),
        ('sync = "sometimes"', "opencluster sync must be full or normal"),
        ("max_keys = 0", "opencluster max_keys must be a positive integer"),
        ('max_inflight = "x"', "opencluster max_inflight must be a positive integer"),
        (
            "max_name = 5000\nmax_payload = 1000",
            "opencluster max_payload must hold a set of a max_name name",
        ),
        ("max_payload = 4294967296", "opencluster max_payload must fit"),
        ('listen = "host:port"', "opencluster listen 'host:port' is not HOST:PORT"),
        ('tls_key = "k.pem"', "opencluster tls_key needs tls_cert"),
        ("inline_sync_ms = -1", "opencluster inline_sync_ms must be 0 or more"),
        ("inline_sync_ms = nan", "opencluster inline_sync_ms must be 0 or more"),
    ],
)
def test_bad_opencluster_settings_are_clear_errors(
    tmp_path: Path, table: str, message: str
) -> None:
    conf = tmp_path / "fqd.toml"
    conf.write_text(f"[fqd]\n[opencluster]\n{table}\n")
    with pytest.raises(ValueError, match=message):
        Settings.from_toml(conf)


def test_opencluster_table_and_flag(tmp_path: Path) -> None:
    from fqbroker.cli.fqd import settings_from_args

    conf = tmp_path / "fqd.toml"
    conf.write_text(
        '[fqd]\n[opencluster]\nlisten = "0.0.0.0:"\nsync = "normal"\nmax_keys = 5\n'
        "inline_sync_ms = 0\n"
    )
    table = Settings.from_toml(conf).section(OpenCluster)
    assert (table.sync, table.max_keys, table.inline_sync_ms) == ("normal", 5, 0.0)
    assert Settings().section(OpenCluster).inline_sync_ms == 1.0
    assert table.address("127.0.0.1") == ("0.0.0.0", 13600)  # the protocol's port
    assert Settings.from_toml(conf).open_to_anyone() == ["0.0.0.0"]
    flagged = settings_from_args(["--config", str(conf), "--opencluster", "127.0.0.2:9"])
    assert flagged.section(OpenCluster).address("x") == ("127.0.0.2", 9)
    assert flagged.section(OpenCluster).max_keys == 5
    assert Settings().section(OpenCluster).address("127.0.0.1") is None  # off by default


async def test_a_store_that_cannot_be_opened_stops_fqd_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "queues").mkdir()
    (tmp_path / "queues" / "opencluster").write_text("a file where the directory goes")
    fqd = await Proc.start(
        "-m", "fqbroker", "-p", "0", "-n", "10.254.254.1", "-c", str(tmp_path / "fqd.sqlite"),
        "-q", str(tmp_path / "queues"), "--opencluster", "127.0.0.1:0",
    )  # fmt: skip
    status, _, err = await fqd.finish()
    assert status == 2
    assert "fqd: opencluster store" in err and "cannot be opened" in err
    assert "Traceback" not in err


async def test_opencluster_listener_over_tls(settings: Settings, tmp_path: Path) -> None:
    import ssl

    trustme = pytest.importorskip("trustme")
    from tests.pki import make_pki

    pki = make_pki(trustme.CA(), tmp_path)
    settings.set_section(
        OpenCluster().updated(
            {"listen": "127.0.0.1:0", "tls_cert": str(pki["cert"]), "tls_key": str(pki["key"])}
        )
    )
    async with running(settings) as broker:
        live = broker.front_ends["opencluster"]
        assert live.transport == "tls"
        context = ssl.create_default_context(cafile=str(pki["ca"]))
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port_of(broker, "opencluster"), ssl=context
        )
        c = Conn(reader, writer)
        try:
            await c.send(wire.hello(0))
            assert await c.raw(len(HELLO_REPLY)) == HELLO_REPLY
            await acked(c, wire.set_string(0, b"secret", b"over tls"))
            assert await get_string(c, b"secret") == b"over tls"
        finally:
            await c.close()
