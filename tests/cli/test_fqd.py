"""The console scripts' common ground: --version, defaults in --help, the flags fq-send and
fq-recv share, fq-recv --json with binary payloads and fq-send --rate against a real fqd,
fqd's own flags (-v, -t, -l, -B, -b, --print-config) and where it keeps its state."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from fqbroker.accel import describe
from fqbroker.cli.fqtools import _recv_parser, _send_parser
from fqbroker.clients.fq.client import Client
from fqbroker.settings.broker import Settings
from fqbroker.settings.datadir import default_data_dir, sample_config
from fqbroker.version import FQ_COMPAT_VERSION, __version__
from tests.procs import ENV, ROOT, Proc

TIMEOUT = 30.0
NODE_ID = "10.254.254.1"
# The console scripts of this package whose flags live in fqbroker.cli.console's Parser.
SCRIPTS = ("fqd", "fq-send", "fq-recv", "fq-admin", "figg", "fyrehose", "opencluster")
STATE_VARS = ("STATE_DIRECTORY", "XDG_STATE_HOME", "FQBROKER_DEBUG", "FQ_DEBUG")
CLEAN_ENV = {k: v for k, v in ENV.items() if k not in STATE_VARS}


def entry_point(name: str) -> tuple[str, str]:
    """(module, function) of a [project.scripts] entry of pyproject.toml."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts[name].partition(":")
    return module, function


def run_script(name: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    module, function = entry_point(name)
    code = f"import sys; from {module} import {function} as f; sys.exit(f())"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=CLEAN_ENV,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# --- every script -------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCRIPTS)
def test_version(name: str) -> None:
    done = run_script(name, "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        f"{name} (fqbroker {__version__}, fq protocol {FQ_COMPAT_VERSION}, {describe()})\n"
    )


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_shows_defaults(name: str) -> None:
    done = run_script(name, "--help")
    assert done.returncode == 0, done.stderr
    assert "--version" in done.stdout
    assert "(default: None)" not in done.stdout  # flags without a default say what applies
    if name in ("fq-send", "fq-recv"):
        assert "(default: maryland)" in done.stdout
        assert "default 127.0.0.1" in done.stdout and "default 8765" in done.stdout
    elif name == "fqd":
        assert "default 8765; 0 picks one" in done.stdout
        assert "~/.local/state/fqbroker" in done.stdout  # where the state goes
    elif name == "fq-admin":
        assert "http://127.0.0.1:8765)" in done.stdout  # the --url default, wrapped
    else:
        assert "(default: 127.0.0.1)" in done.stdout


def test_fq_send_and_fq_recv_share_the_connection_flags() -> None:
    send, recv = _send_parser(), _recv_parser()

    def spelling(parser: argparse.ArgumentParser, dest: str) -> list[list[str]]:
        return [sorted(a.option_strings) for a in parser._actions if a.dest == dest]

    for dest in ("host", "port", "address", "user", "password", "exchange", "tls", "cafile"):
        assert len(spelling(send, dest)) == 1, dest
        assert spelling(send, dest) == spelling(recv, dest), dest
    # The old spellings still work: fqs's -a HOST:PORT, fq_rcvr's -e, fq-send's -x.
    assert send.parse_args(["-a", "h:1", "-x", "e"]).address == ("h", 1)
    assert recv.parse_args(["-e", "e"]).exchange == "e"
    assert send.parse_args(["-a", "[::1]:9"]).address == ("::1", 9)
    assert send.parse_args(["-a", "somehost"]).address == ("somehost", 8765)


# --- against a real fqd -------------------------------------------------------------------


async def start_recv(procs: list[Proc], port: int, *args: str) -> Proc:
    recv = await Proc.start(
        "-m", "fqbroker.cli.fqtools", "recv", "-H", "127.0.0.1", "-p", str(port), *args
    )
    procs.append(recv)
    await recv.wait_stderr("route set -> ")
    return recv


async def publish(port: int, *payloads: bytes) -> None:
    client = Client("127.0.0.1", port, "pub", "pass")
    await client.connect()
    try:
        for payload in payloads:
            assert client.publish(b"maryland", b"bin.route", payload)
        await client.flush()
    finally:
        await client.close()


BINARY = bytes(range(256)) + b"\xff\xfe\x00\n"


@pytest.mark.parametrize("always", [False, True], ids=["auto", "base64-flag"])
async def test_fq_recv_json_carries_binary_payloads(
    tmp_path: Path, procs: list[Proc], always: bool
) -> None:
    async with asyncio.timeout(TIMEOUT):
        fqd, port = await Proc.start_fqd(tmp_path)
        procs.append(fqd)
        flags = ("--json", "--count", "3", *(["--base64"] if always else []))
        recv = await start_recv(procs, port, *flags)
        await publish(port, BINARY, "héllo\n".encode(), b"")
        status, out, err = await recv.finish()
    assert status == 0, err
    objects = [json.loads(line) for line in out.splitlines()]
    for obj in objects:
        # Exactly one of the two: a script decides by which key is there.
        assert ("payload" in obj) != ("payload_base64" in obj), obj
    received = [
        base64.b64decode(o["payload_base64"]) if "payload_base64" in o else o["payload"].encode()
        for o in objects
    ]
    assert received == [BINARY, "héllo\n".encode(), b""]
    assert ("payload_base64" in objects[0]) and ("payload_base64" in objects[1]) == always
    assert objects[0]["route"] == "bin.route" and objects[0]["hops"][0] == NODE_ID


async def test_fq_send_rate_and_progress(tmp_path: Path, procs: list[Proc]) -> None:
    count, rate = 30, 20.0
    async with asyncio.timeout(TIMEOUT):
        fqd, port = await Proc.start_fqd(tmp_path)
        procs.append(fqd)
        recv = await start_recv(procs, port, "--count", str(count))
        args = ("-m", "fqbroker.cli.fqtools", "send", "-a", f"127.0.0.1:{port}")
        start = time.monotonic()
        sender = await Proc.start(*args, "--count", str(count), "--rate", str(rate), "--progress")
        procs.append(sender)
        status, _, err = await sender.finish()
        elapsed = time.monotonic() - start
        assert status == 0, err
        recv_status, out, _ = await recv.finish()
    assert recv_status == 0 and out.count(b"\n") == count  # every message arrived
    # The 30th message is due 29/20 s after the first; it cannot have gone sooner.
    assert elapsed >= (count - 1) / rate
    final = [line for line in err.splitlines() if line.startswith(f"sent {count} messages in ")]
    assert len(final) == 1 and float(final[0].split()[4]) >= (count - 1) / rate, err
    progress = [line for line in err.splitlines() if line.startswith("sent ") and "/30 " in line]
    assert progress, err  # a line a second, with the rate
    assert all(line.endswith(" msg/s") for line in progress), progress


async def test_fq_send_shows_no_progress_on_a_pipe_unless_asked(
    tmp_path: Path, procs: list[Proc]
) -> None:
    async with asyncio.timeout(TIMEOUT):
        fqd, port = await Proc.start_fqd(tmp_path)
        procs.append(fqd)
        args = ("-m", "fqbroker.cli.fqtools", "send", "-a", f"127.0.0.1:{port}")
        sender = await Proc.start(*args, "--count", "15", "--rate", "10")
        procs.append(sender)
        status, _, err = await sender.finish()
    assert status == 0, err
    assert "/15 messages" not in err and "sent 15 messages in " in err


# --- fqd's flags --------------------------------------------------------------------------


async def fqd_lines(cwd: Path, env: dict[str, str], *args: str, until: str) -> list[str]:
    """Start fqd in ``cwd``, read stderr up to the line starting with ``until``, stop it
    with SIGTERM; every stderr line."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fqbroker", "-p", "0", "-n", NODE_ID, *args,
        cwd=cwd, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(TIMEOUT):
            while not (lines and lines[-1].startswith(until)):
                raw = await proc.stderr.readline()
                assert raw, f"fqd ended before {until!r}: {lines}"
                lines.append(raw.decode().rstrip("\n"))
            proc.send_signal(signal.SIGTERM)
            rest = await proc.stderr.read()
            assert await proc.wait() == 0, lines
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return lines + rest.decode().splitlines()


async def test_each_startup_line_once_with_debug_flags(tmp_path: Path) -> None:
    lines = await fqd_lines(
        tmp_path, CLEAN_ENV, "-c", "fqd.sqlite", "-q", "queues", "-v", "conn,route,config",
        "--figg", "0", until="Figg listening on port: ",
    )  # fmt: skip
    text = "\n".join(lines)
    for needle in ("Opening configdb", "Established ", "Listening on port: ", "istening on "):
        counted = text.count(needle)
        wanted = 2 if needle == "istening on " else 1  # fq's port line and Figg's
        assert counted == wanted, (needle, lines)


async def test_fqd_flags_of_fqd_are_accepted(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "p15_cli_rules.py").write_text("def register(registry):\n    pass\n")
    lines = await fqd_lines(
        tmp_path, CLEAN_ENV, "-c", "fqd.sqlite", "-q", "queues", "-D", "-t", "4", "-B",
        "-l", str(rules), "-m", "p15_cli_rules", until="Listening on port: ",
    )  # fmt: skip
    said = [line for line in lines if "ignored" in line]
    assert len(said) == 2, lines
    assert "-t 4 ignored: one event loop routes every message here" in said[0]
    assert "-B ignored: no libbcd crash reporting here" in said[1]


def test_fqd_freezes_what_it_made_to_start_and_lets_it_go_when_it_stops(tmp_path: Path) -> None:
    # The collector's pauses: what starting made is frozen once the broker listens (never
    # walked again), and thawed when it stops (fqd run again in one process).
    code = """if True:
        import gc, os, signal, sys
        import fqbroker.cli.fqd as cli
        say = cli._say
        def said(text):
            say(text)
            if text.startswith("Listening on port: "):
                say(f"frozen {gc.get_freeze_count()}")
                os.kill(os.getpid(), signal.SIGTERM)
        cli._say = said
        code = cli.fqd(sys.argv[1:])
        print(f"frozen after {gc.get_freeze_count()}", file=sys.stderr)
        sys.exit(code)
    """
    done = subprocess.run(
        [sys.executable, "-c", code, "-p", "0", "-n", NODE_ID, "-c", "fqd.sqlite", "-q", "q"],
        env=CLEAN_ENV, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = dict(line.rsplit(" ", 1) for line in done.stderr.splitlines() if "frozen" in line)
    assert int(said["frozen"]) > 10_000, done.stderr  # modules, settings, catalog, router
    assert said["frozen after"] == "0", done.stderr


def test_print_config_writes_the_packaged_sample() -> None:
    done = run_script("fqd", "--print-config")
    assert done.returncode == 0 and done.stderr == ""
    packaged = ROOT / "fqbroker" / "data" / "fqd.toml"
    assert done.stdout == packaged.read_text() == sample_config()
    assert done.stdout == (ROOT / "conf" / "fqd.toml").read_text()  # the link docs point at
    tomllib.loads(done.stdout)  # parses


def test_printed_config_is_the_defaults(tmp_path: Path) -> None:
    conf = tmp_path / "fqd.toml"
    conf.write_text(run_script("fqd", "--print-config").stdout)
    assert Settings.from_toml(conf) == Settings()


# --- the data directory -------------------------------------------------------------------


def test_default_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    home = {"HOME": "/home/u"}
    assert default_data_dir(home) == Path("/home/u/.local/state/fqbroker")
    assert default_data_dir({**home, "XDG_STATE_HOME": "/xdg"}) == Path("/xdg/fqbroker")
    assert default_data_dir({**home, "XDG_STATE_HOME": "rel"}) == Path(  # relative: ignored
        "/home/u/.local/state/fqbroker"
    )
    state = {**home, "XDG_STATE_HOME": "/xdg", "STATE_DIRECTORY": "/var/lib/fqbroker:/other"}
    assert default_data_dir(state) == Path("/var/lib/fqbroker")
    # At the top of a source checkout: ./var, as `make run` has it.
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "fqbroker").mkdir()
    assert default_data_dir(home) == Path("var")
    assert default_data_dir({**home, "STATE_DIRECTORY": "/s"}) == Path("/s")


def test_config_db_and_queue_dir_follow_data_dir() -> None:
    moved = Settings().updated({"data_dir": "/d"})
    assert (moved.config_db, moved.queue_dir) == (Path("/d/fqd.sqlite"), Path("/d/queues"))
    own = Settings().updated({"data_dir": "/d", "config_db": "/c.sqlite"})
    assert (own.config_db, own.queue_dir) == (Path("/c.sqlite"), Path("/d/queues"))
    again = own.updated({"data_dir": "/e"})  # what was set on its own stays put
    assert (again.config_db, again.queue_dir) == (Path("/c.sqlite"), Path("/e/queues"))


@pytest.mark.parametrize("where", ["home", "state-directory", "flag", "setting"])
async def test_fqd_keeps_its_state_in_the_data_dir(tmp_path: Path, where: str) -> None:
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = {**CLEAN_ENV, "HOME": str(tmp_path / "home")}
    args: list[str] = []
    expected = tmp_path / "home" / ".local" / "state" / "fqbroker"
    if where == "state-directory":
        env["STATE_DIRECTORY"] = str(tmp_path / "state")
        expected = tmp_path / "state"
    elif where == "flag":
        args = ["--data-dir", str(tmp_path / "flagged")]
        expected = tmp_path / "flagged"
    elif where == "setting":
        (cwd / "fqd.toml").write_text(f'[fqd]\ndata_dir = "{tmp_path / "set"}"\n')
        args = ["--config", "fqd.toml"]
        expected = tmp_path / "set"
    lines = await fqd_lines(cwd, env, *args, until="Listening on port: ")
    assert f"Opening configdb {expected / 'fqd.sqlite'}" in lines
    assert (expected / "fqd.sqlite").is_file() and (expected / "queues").is_dir()
    assert sorted(os.listdir(cwd)) == (["fqd.toml"] if where == "setting" else [])  # no ./var
