"""The Lumberjack listener's settings: its table and flag, bad values refused at start-up
(in the broker and in fqd), where it listens (/frontends.json, fqd's stderr), and the
shipped config listing every setting. What it does with events: test_lumberjack.py."""

from __future__ import annotations

import asyncio
from dataclasses import fields
from pathlib import Path

import pytest

from fqbroker.cli.fqd import settings_from_args
from fqbroker.frontends.lumberjack.settings import Lumberjack
from fqbroker.protocols.lumberjack import encoder
from fqbroker.protocols.lumberjack.encoder import AckReader
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import TIMEOUT, port_of
from tests.e2e.lumberjack.test_lumberjack import events, with_lumberjack
from tests.procs import Proc
from tests.server.test_frontends import front_ends_json

pytestmark = pytest.mark.on("lumberjack", ack_idle_ms=50.0)


@pytest.fixture
def lj(broker_on: Broker) -> Broker:
    return broker_on


def test_off_by_default_and_on_by_flag_or_table(tmp_path: Path) -> None:
    assert Settings().section(Lumberjack).address("127.0.0.1") is None
    s = settings_from_args(["--lumberjack", "0.0.0.0:5044"])
    assert s.section(Lumberjack).address(s.bind) == ("0.0.0.0", 5044)
    conf = tmp_path / "fqd.toml"
    conf.write_text(
        '[fqd]\nport = 1\n\n[lumberjack]\nlisten = "5055"\nexchange = "beats"\n'
        'route = "{type}"\nmax_window = 10\ntls_cert = "c.pem"\n'
    )
    s = Settings.from_toml(conf)
    assert s.section(Lumberjack) == Lumberjack(listen="5055", exchange="beats", route="{type}",
                                      max_window=10, tls_cert=Path("c.pem"))  # fmt: skip
    assert s.section(Lumberjack).address("10.0.0.1") == ("10.0.0.1", 5055)
    # The flag overrides the table's address and keeps the rest.
    s = settings_from_args(["--config", str(conf), "--lumberjack", "[::1]:0"])
    lumberjack = s.section(Lumberjack)
    assert lumberjack.address(s.bind) == ("::1", 0) and lumberjack.exchange == "beats"


@pytest.mark.parametrize(
    ("table", "error"),
    [
        ('listn = "1"', "listn"),
        ('listen = "a:b"', "HOST:PORT"),
        ('listen = "::1:5"', "IPv6"),
        ('listen = "70000"', "range"),
        ("max_window = 0", "max_window"),
        ('exchange = ""', "exchange"),
        ("exchange = 5", "exchange"),
        ('ack_idle_ms = "soon"', "ack_idle_ms"),
        ('tls_key = "k.pem"', "tls_cert"),
    ],
)
def test_bad_lumberjack_table(tmp_path: Path, table: str, error: str) -> None:
    conf = tmp_path / "fqd.toml"
    conf.write_text(f"[fqd]\n\n[lumberjack]\n{table}\n")
    with pytest.raises(ValueError, match=error):
        Settings.from_toml(conf)


async def test_a_bad_route_template_stops_the_start(settings: Settings) -> None:
    with_lumberjack(settings, route="{unclosed")
    broker = Broker(settings)
    with pytest.raises(ValueError):
        await broker.start()
    await broker.stop()


async def test_off_means_no_port(broker: Broker) -> None:
    fe = (await front_ends_json(broker))["lumberjack"]
    assert fe["host"] is None and fe["port"] is None and fe["connections"] == []
    assert fe["transport"] == "tcp"  # off: listed as a plain port
    assert broker.settings.section(Lumberjack).listen == ""


async def test_a_plain_listener_says_tcp(lj: Broker) -> None:
    fe = (await front_ends_json(lj))["lumberjack"]
    assert (fe["transport"], fe["host"], fe["port"]) == (
        "tcp",
        "127.0.0.1",
        port_of(lj, "lumberjack"),
    )


def test_the_shipped_config_lists_every_lumberjack_setting() -> None:
    text = (Path(__file__).resolve().parents[3] / "conf" / "fqd.toml").read_text()
    table = text[text.index("[lumberjack]") :]
    for f in fields(Lumberjack):
        assert f"\n{f.name} = " in table or f"\n# {f.name} = " in table, f.name


async def test_fqd_says_where_it_listens_and_refuses_a_bad_template(
    tmp_path: Path, procs: list[Proc]
) -> None:
    fqd, port = await Proc.start_fqd(tmp_path, "--lumberjack", "127.0.0.1:0")
    procs.append(fqd)
    line = await fqd.wait_stderr("Lumberjack listening on port: ")
    lj_port = int(line.rsplit(" ", 1)[1])
    assert lj_port not in (0, port)
    reader, writer = await asyncio.open_connection("127.0.0.1", lj_port)
    writer.write(encoder.batch(events(1)))
    async with asyncio.timeout(TIMEOUT):
        assert AckReader().feed(await reader.readexactly(6)) == [(2, 1)]
    writer.close()
    fqd.kill()

    conf = tmp_path / "bad.toml"
    conf.write_text('[fqd]\n\n[lumberjack]\nlisten = "127.0.0.1:0"\nroute = "{unclosed"\n')
    state = ["-c", str(tmp_path / "b.sqlite"), "-q", str(tmp_path / "bq")]
    bad = await Proc.start("-m", "fqbroker", "--config", str(conf), "-p", "0", *state)
    procs.append(bad)
    async with asyncio.timeout(TIMEOUT * 2):
        status, _, err = await bad.finish()
    assert status == 2 and "fqd: " in err and "Traceback" not in err, err
