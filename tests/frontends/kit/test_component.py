"""A front end is one component: the toy (tests/frontends/kit/toy.py), registered by these
tests alone (the table of front ends plus it, handed to what takes a table), shows up in
the settings, fqd's flags and --print-config, the claims check, and its limits, and serves
a connection; no other module names it. test_component_counters.py shows the same toy in
/stats.json, /metrics, /frontends.json and the web UI."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from fqbroker.cli import fqd as cli
from fqbroker.errors import ConfigError
from fqbroker.frontends.figg.settings import Figg
from fqbroker.frontends.lumberjack.settings import Lumberjack
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import TIMEOUT, running, wait_for
from tests.frontends.kit.toy import TABLE, TOY, Toy, toy_port, with_toy
from tests.procs import ENV

ROOT = Path(__file__).resolve().parents[3]


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# --- settings -------------------------------------------------------------------------------


def test_its_table_is_read_with_the_others(tmp_path: Path) -> None:
    conf = tmp_path / "fqd.toml"
    conf.write_text('[fqd]\n[toy]\nlisten = "7100"\ngreeting = "hi"\n[figg]\nmax_topics = 5\n')
    settings = Settings.from_toml(conf, TABLE)
    toy = settings.section(Toy)
    assert (toy.listen, toy.greeting, toy.idle_seconds) == ("7100", "hi", 30.0)
    assert toy.address(settings.bind) == ("127.0.0.1", 7100)
    assert settings.section(Figg).max_topics == 5  # the others' tables beside it
    assert Settings().section(Toy) == Toy()  # no table: its defaults
    # Only a table that lists the toy knows its table.
    with pytest.raises(ConfigError, match=r"unknown table\(s\) \[toy\]"):
        Settings.from_toml(conf)
    for table, error in (
        ("colour = 1", "unknown toy setting 'colour'"),
        ('max_connections = "x"', "toy max_connections must be an integer, not 'x'"),
        ("idle_seconds = 0", "toy idle_seconds must be a positive number"),
        ('greeting = "a\\nb"', "toy greeting must be one line"),
        ('listen = "a:b"', "toy listen 'a:b' is not HOST:PORT"),
        ("toy = 3", "toy must be a table"),
    ):
        conf.write_text(
            f"[fqd]\n{table}\n" if table.startswith("toy") else f"[fqd]\n[toy]\n{table}\n"
        )
        with pytest.raises(ConfigError, match=error):
            Settings.from_toml(conf, TABLE)
    # "" turns an optional setting off; a default table is not kept.
    conf.write_text('[fqd]\n[toy]\nlisten = ""\n')
    assert Settings.from_toml(conf, TABLE) == Settings()


def test_print_config_writes_its_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.fqd(["--print-config"], TABLE) == 0
    text = capsys.readouterr().out
    table = text[text.index("\n[toy]\n") :]
    assert '# The line each connection is greeted with.\ngreeting = "hello"\n' in table
    assert 'listen = ""' in table and "idle_seconds = 30.0" in table
    assert text.startswith(cli.printed_config())  # the broker's own tables, then the toy's
    conf = tmp_path / "fqd.toml"
    conf.write_text(text)
    tomllib.loads(text)
    assert Settings.from_toml(conf, TABLE) == Settings()  # every default, as printed
    assert "[toy]" not in cli.printed_config()


def test_fqd_has_its_flag(capsys: pytest.CaptureFixture[str]) -> None:
    settings = cli.settings_from_args(["--toy", "127.0.0.1:0"], TABLE)
    assert settings.section(Toy).listen == "127.0.0.1:0"
    with pytest.raises(SystemExit):
        cli.settings_from_args(["--help"], TABLE)
    assert "--toy ADDR:PORT" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.settings_from_args(["--toy", "127.0.0.1:0"])  # not the broker's own flag


def test_the_docs_list_the_declared_tables() -> None:
    """docs/cli.md's tables are the front ends' declarations, and a toy's would be too."""
    page = (ROOT / "docs" / "cli.md").read_text()
    begin = page.index("<!-- front-end tables:")
    begin = page.index("\n", begin) + 1
    written = page[begin : page.index("<!-- end of the front-end tables -->")]
    assert written == cli.settings_reference(), (
        "docs/cli.md is not what the declarations say: paste"
        ' python -c "from fqbroker.cli.fqd import settings_reference; print(settings_reference())"'
    )
    assert "#### `[toy]`" in cli.settings_reference(TABLE)
    assert "`fqd --toy ADDR:PORT` sets `listen`." in cli.settings_reference(TABLE)


# --- claims ---------------------------------------------------------------------------------


async def test_two_front_ends_on_one_address_are_refused_before_anything_binds(
    settings: Settings,
) -> None:
    port = free_port()
    both = with_toy(settings, listen=f"127.0.0.1:{port}").with_sections(
        Lumberjack(listen=f"127.0.0.1:{port}")
    )
    main = free_port()
    both.port = main
    broker = Broker(both, TABLE)
    with pytest.raises(ValueError, match=f"lumberjack and toy both claim tcp 127.0.0.1:{port}"):
        await broker.start()
    assert list(broker.listeners.servers()) == []
    await broker.stop()
    for taken in (port, main):  # nothing bound: both still free
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", taken))
    # The main port is claimed by the front ends sniffed on it, together.
    on_main = with_toy(settings, listen=str(main))
    on_main.port = main
    with pytest.raises(ValueError, match=r"the main port \(fq-command, fq-data, http\) and toy"):
        on_main.check(TABLE)
    # Port 0 picks a free port for each: no claim collides.
    with_toy(settings).with_sections(Lumberjack(listen="127.0.0.1:0")).check(TABLE)


def test_fqd_refuses_two_front_ends_on_one_address_in_one_line(tmp_path: Path) -> None:
    port = free_port()
    done = subprocess.run(
        [sys.executable, "-m", "fqbroker", "-q", str(tmp_path), "-p", "0",
         "--figg", f"127.0.0.1:{port}", "--opencluster", f"127.0.0.1:{port}"],
        env=ENV, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"fqd: figg and opencluster both claim tcp 127.0.0.1:{port}: give one another address"
    ]


# --- serving, and its limits --------------------------------------------------------------


async def test_it_serves_a_loopback_connection(settings: Settings) -> None:
    async with running(with_toy(settings, greeting="hi"), TOY) as broker:
        reader, writer = await connect(toy_port(broker))
        async with asyncio.timeout(TIMEOUT):
            assert await reader.readline() == b"hi\n"
            writer.write(b"HELLO ann\nline one\n")
            assert await reader.readline() == b"HELLO ann\n"
            assert await reader.readline() == b"line one\n"
        live = broker.front_ends["toy"]
        assert (live.counters.open, live.counters.accepted) == (1, 1)
        writer.close()
        await wait_for(lambda: live.counters.open == 0)


async def test_its_connection_limit_is_applied(settings: Settings) -> None:
    async with running(with_toy(settings, max_connections=1), TOY) as broker:
        port = toy_port(broker)
        first_reader, first = await connect(port)
        async with asyncio.timeout(TIMEOUT):
            assert await first_reader.readline() == b"hello\n"
            reader, writer = await connect(port)
            assert await reader.read() == b""  # refused: closed without a greeting
        live = broker.front_ends["toy"]
        assert live.counters.refused == 1 and live.counters.open == 1
        assert broker.limits.refused["frontend_connections"] == 1
        writer.close()
        first.close()
        await wait_for(lambda: live.counters.open == 0)
        reader, writer = await connect(port)  # room again
        async with asyncio.timeout(TIMEOUT):
            assert await reader.readline() == b"hello\n"
        writer.close()


async def test_its_idle_and_login_deadlines_are_applied(settings: Settings) -> None:
    toy = with_toy(settings, idle_seconds=0.3, login_seconds=0.3)
    async with running(toy, TOY) as broker:
        port = toy_port(broker)
        silent_reader, silent = await connect(port)
        talker_reader, talker = await connect(port)
        async with asyncio.timeout(TIMEOUT):
            talker.write(b"HELLO bob\n")
            assert await talker_reader.readline() == b"hello\n"
            assert await talker_reader.readline() == b"HELLO bob\n"
            for _ in range(5):  # well past both deadlines, never idle for one
                await asyncio.sleep(0.15)
                talker.write(b"still here\n")
                assert await talker_reader.readline() == b"still here\n"
            assert await silent_reader.readline() == b"hello\n"
            assert await silent_reader.read() == b""  # closed: never logged in
        talker.close()
        silent.close()
        await wait_for(lambda: broker.front_ends["toy"].counters.open == 0)
        # Logged in but silent: the idle deadline closes it.
        reader, writer = await connect(port)
        started = asyncio.get_running_loop().time()
        async with asyncio.timeout(TIMEOUT):
            writer.write(b"HELLO cy\n")
            assert await reader.readline() == b"hello\n"
            assert await reader.readline() == b"HELLO cy\n"
            assert await reader.read() == b""
        assert asyncio.get_running_loop().time() - started >= 0.3
        writer.close()


# --- what stats, /metrics, /frontends.json and the web UI show of it ----------------------
# (its counters, rendered from the same table: the tests of those go here)
