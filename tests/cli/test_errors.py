"""Bad input to every console script: one line on stderr naming what is wrong, a non-zero
exit, no traceback (unless FQBROKER_DEBUG=1 asks). Each row runs the script as a real
process, in a directory of its own holding the files the row needs."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.procs import ENV

TIMEOUT = 60
FQD = ("-m", "fqbroker", "-n", "10.254.254.1", "-q", "queues", "-c", "fqd.sqlite")
SEND = ("-m", "fqbroker.cli.fqtools", "send")
RECV = ("-m", "fqbroker.cli.fqtools", "recv")
FIGG = ("-m", "fqbroker.cli.figg")
FYREHOSE = ("-m", "fqbroker.cli.fyrehose")
OPENCLUSTER = ("-m", "fqbroker.cli.opencluster")


def _closed_port() -> int:
    """A TCP port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CLOSED = str(_closed_port())


def _file(name: str, text: str) -> Callable[[Path], None]:
    def make(where: Path) -> None:
        (where / name).write_text(text)

    return make


def _dir(name: str) -> Callable[[Path], None]:
    def make(where: Path) -> None:
        (where / name).mkdir()

    return make


def _pki(where: Path) -> None:
    import trustme

    from tests.pki import make_pki

    make_pki(trustme.CA(), where)


@dataclass(frozen=True)
class Row:
    args: tuple[str, ...]
    status: int
    says: str  # stderr's one line holds this (the setting or file, and what is wrong)
    setup: Callable[[Path], None] | None = None


ROWS = {
    # --- fqd: its settings file (the intro) ---
    "fqd-invalid-toml": Row(
        (*FQD, "--config", "bad.toml"),
        2,
        "config file bad.toml: not valid TOML",
        _file("bad.toml", "[fqd]\nport = \n"),
    ),
    "fqd-unknown-setting": Row(
        (*FQD, "--config", "typo.toml"),
        2,
        "config file typo.toml: unknown setting 'prot'",
        _file("typo.toml", "[fqd]\nprot = 1\n"),
    ),
    "fqd-unknown-table": Row(
        (*FQD, "--config", "table.toml"),
        2,
        "config file table.toml: unknown table(s) [figgg]",
        _file("table.toml", "[fqd]\n[figgg]\nlisten = '0'\n"),
    ),
    "fqd-setting-of-wrong-type": Row(
        (*FQD, "--config", "type.toml"),
        2,
        "config file type.toml: max_message_size must be an integer, not 'big'",
        _file("type.toml", '[fqd]\nmax_message_size = "big"\n'),
    ),
    "fqd-port-setting-out-of-range": Row(
        (*FQD, "--config", "port.toml"),
        2,
        "config file port.toml: port must be a port number from 0 to 65535, not 70000",
        _file("port.toml", "[fqd]\nport = 70000\n"),
    ),
    "fqd-upstream-port-out-of-range": Row(
        (*FQD, "--config", "up.toml"),
        2,
        "config file up.toml: upstream port must be a port number from 1 to 65535",
        _file("up.toml", '[fqd]\n[[upstream]]\nhost="a"\nsource="b"\nexchange="c"\nport=0\n'),
    ),
    "fqd-bad-debug-setting": Row(
        (*FQD, "--config", "debug.toml"),
        2,
        "config file debug.toml: debug flag 'loud' is not one of",
        _file("debug.toml", '[fqd]\ndebug = "loud"\n'),
    ),
    "fqd-bad-fsync-setting": Row(
        (*FQD, "--config", "fsync.toml"),
        2,
        "config file fsync.toml: fsync must be always, interval or never, not 'sometimes'",
        _file("fsync.toml", '[fqd]\nfsync = "sometimes"\n'),
    ),
    "fqd-negative-limit-setting": Row(
        (*FQD, "--config", "limit.toml"),
        2,
        "config file limit.toml: max_connections must be 0 or more, not -5",
        _file("limit.toml", "[fqd]\nmax_connections = -5\n"),
    ),
    "fqd-scalar-for-a-table": Row(
        (*FQD, "--config", "scalar.toml"),
        2,
        "config file scalar.toml: figg must be a table, not 5",
        _file("scalar.toml", "[fqd]\nfigg = 5\n"),
    ),
    "fqd-missing-config-file": Row(
        (*FQD, "--config", "nope.toml"), 2, "config file nope.toml: no such file"
    ),
    # --- fqd: a config database it cannot use ---
    "fqd-config-db-is-a-directory": Row(
        (*FQD, "-c", "db"), 2, "config database db: unable to open database file", _dir("db")
    ),
    "fqd-config-db-is-no-database": Row(
        (*FQD, "-c", "junk.sqlite"),
        2,
        "config database junk.sqlite: file is not a database",
        _file("junk.sqlite", "this is no sqlite file, " * 100),
    ),
    "fqd-config-db-under-a-file": Row(
        (*FQD, "-c", "plain/fqd.sqlite"),
        2,
        "config_db: plain is not a directory",
        _file("plain", ""),
    ),
    "fqd-queue-dir-is-a-file": Row(
        (*FQD, "-q", "plain"), 2, "queue_dir: plain is not a directory", _file("plain", "")
    ),
    # --- fqd: flags ---
    "fqd-port-negative": Row((*FQD, "-p", "-5"), 2, "-p/--port: '-5' is not a port (0 to 65535)"),
    "fqd-port-too-high": Row((*FQD, "-p", "70000"), 2, "'70000' is not a port (0 to 65535)"),
    "fqd-port-not-a-number": Row((*FQD, "-p", "http"), 2, "'http' is not a port"),
    "fqd-debug-bogus": Row((*FQD, "-v", "bogus"), 2, "debug flag 'bogus' is not one of mem,"),
    "fqd-debug-unknown-bits": Row((*FQD, "-v", "0x100"), 2, "debug bits '0x100' name no known"),
    "fqd-debug-one-bad-name": Row((*FQD, "-v", "conn,nope"), 2, "debug flag 'nope'"),
    "fqd-threads-zero": Row((*FQD, "-t", "0"), 2, "-t/--threads: '0' is not a number of threads"),
    "fqd-module-dir-missing": Row((*FQD, "-l", "nodir"), 2, "-l nodir: no such directory"),
    "fqd-module-missing": Row(
        (*FQD, "-p", "0", "-m", "no_such_rules"), 2, "cannot import rule module 'no_such_rules'"
    ),
    "fqd-unknown-flag": Row((*FQD, "--prot", "1"), 2, "unrecognized arguments: --prot 1"),
    "fqd-node-id-any": Row((*FQD, "-p", "0", "-n", "0.0.0.0"), 2, "nodeid cannot be INADDR_ANY"),
    "fqd-bad-figg-listen": Row((*FQD, "--figg", "nope:x"), 2, "figg listen 'nope:x' is not HOST"),
    "fqd-missing-certificate": Row(
        (*FQD, "-p", "0", "--tls-cert", "none.pem"), 2, "tls_cert none.pem: no such file"
    ),
    "fqd-certificate-not-pem": Row(
        (*FQD, "-p", "0", "--tls-cert", "junk.pem"),
        2,
        "tls_cert/tls_key junk.pem: will not load: not a PEM certificate",
        _file("junk.pem", "junk\n"),
    ),
    "fqd-bind-unresolvable": Row(
        (*FQD, "-p", "0", "--bind", "no-such-host.invalid"),
        2,
        "bind 'no-such-host.invalid': ",
    ),
    "fqd-web-root-missing": Row((*FQD, "-w", "noweb"), 2, "web_root noweb: no such directory"),
    "fqd-open-network-without-auth": Row(
        (*FQD, "-p", "0", "--bind", "0.0.0.0"),
        2,
        'refusing to listen on 0.0.0.0 with auth = "none"',
    ),
    "fqd-figg-under-password-without-logins": Row(
        (*FQD, "-p", "0", "--auth", "password", "--figg", "127.0.0.1:0"),
        2,
        'figg: auth = "password", but its clients cannot log in: set tls_client_ca',
    ),
    "fqd-figg-plain-under-tls-required": Row(
        (
            *FQD,
            "-p",
            "0",
            "--tls-cert",
            "cert.pem",
            "--tls-key",
            "key.pem",
            "--tls-required",
            "--figg",
            "127.0.0.1:0",
        ),
        2,
        "figg: tls_required, but its port has no TLS: set [figg] tls_cert",
        _pki,
    ),
    "fqd-client-ca-not-pem": Row(
        (*FQD, "-p", "0", "--tls-client-ca", "junk.pem"),
        2,
        "tls_client_ca junk.pem: not PEM certificates",
        _file("junk.pem", "junk\n"),
    ),
    # --- fq-send ---
    "fq-send-address-without-port": Row(
        # The intro's ValueError: -a HOST alone is a host on the default port (here,
        # with -p, one where nobody listens).
        (*SEND, "-a", "127.0.0.1", "-p", CLOSED),
        1,
        f"fq-send: cannot reach 127.0.0.1:{CLOSED}: Connection refused",
    ),
    "fq-send-address-bad-port": Row((*SEND, "-a", "127.0.0.1:x"), 2, "'x' is not a port"),
    "fq-send-address-port-too-high": Row(
        (*SEND, "-a", "127.0.0.1:70000"), 2, "'70000' is not a port (1 to 65535)"
    ),
    "fq-send-address-no-host": Row((*SEND, "-a", ":8765"), 2, "':8765' names no host"),
    "fq-send-port-negative": Row((*SEND, "-p", "-5"), 2, "-p/--port: '-5' is not a port"),
    "fq-send-count-negative": Row((*SEND, "--count", "-1"), 2, "--count: '-1' is not a number"),
    "fq-send-rate-zero": Row((*SEND, "--rate", "0"), 2, "--rate: '0' is not a number"),
    "fq-send-confirm-every-zero": Row(
        (*SEND, "--confirm-every", "0"), 2, "--confirm-every: '0' is not a number"
    ),
    "fq-send-refused": Row(
        (*SEND, "-p", CLOSED), 1, f"fq-send: cannot reach 127.0.0.1:{CLOSED}: Connection refused"
    ),
    # --- fq-recv ---
    "fq-recv-port-too-high": Row((*RECV, "--port", "65536"), 2, "'65536' is not a port"),
    "fq-recv-count-zero": Row((*RECV, "--count", "0"), 2, "--count: '0' is not a number"),
    "fq-recv-base64-without-json": Row((*RECV, "--base64"), 2, "--base64 goes with --json"),
    "fq-recv-refused": Row(
        (*RECV, "-p", CLOSED), 1, f"fq-recv: cannot reach 127.0.0.1:{CLOSED}: Connection refused"
    ),
    "fq-recv-unknown-host": Row(
        (*RECV, "-H", "no-such-host.invalid"), 1, "cannot reach no-such-host.invalid:8765"
    ),
    # --- figg ---
    "figg-port-too-high": Row((*FIGG, "--port", "70000", "sub", "t"), 2, "'70000' is not a port"),
    "figg-port-zero": Row((*FIGG, "sub", "--port", "0", "t"), 2, "'0' is not a port (1 to"),
    "figg-empty-topic": Row((*FIGG, "sub", ""), 2, "a topic is 1 to"),
    "figg-bad-offset": Row((*FIGG, "sub", "t", "--offset", "-1"), 2, "'-1' is not an offset"),
    "figg-no-command": Row(FIGG, 2, "the following arguments are required: command"),
    "figg-refused": Row(
        (*FIGG, "--port", CLOSED, "sub", "t"), 1, f"cannot reach 127.0.0.1:{CLOSED}: Connection"
    ),
    # --- fyrehose ---
    "fyrehose-port-zero": Row((*FYREHOSE, "--port", "0", "sub"), 2, "'0' is not a port"),
    "fyrehose-bad-start": Row((*FYREHOSE, "sub", "--start", "0"), 2, "'0' is not a sequence"),
    "fyrehose-unknown-host": Row(
        (*FYREHOSE, "--host", "no-such-host.invalid", "sub"), 1, "cannot reach no-such-host"
    ),
    # --- opencluster ---
    "opencluster-port-too-high": Row(
        (*OPENCLUSTER, "--port", "99999", "ping"), 2, "'99999' is not a port"
    ),
    "opencluster-int-not-a-number": Row(
        (*OPENCLUSTER, "set", "--int", "k", "v"), 2, "VALUE: 'v' is not an integer"
    ),
    "opencluster-bad-expiry": Row(
        (*OPENCLUSTER, "set", "k", "v", "--expires", "-1"), 2, "'-1' is not a number of seconds"
    ),
    "opencluster-refused": Row(
        (*OPENCLUSTER, "--port", CLOSED, "ping"), 1, f"cannot reach 127.0.0.1:{CLOSED}"
    ),
}

QUIET_ENV = {k: v for k, v in ENV.items() if k not in ("FQBROKER_DEBUG", "FQ_DEBUG")}


def run(args: tuple[str, ...], cwd: Path, env: dict[str, str] = QUIET_ENV) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.stdout == "", done.stdout
    return done.returncode, done.stderr


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_bad_input_is_one_line(row: Row, tmp_path: Path) -> None:
    if row.setup is not None:
        row.setup(tmp_path)
    status, err = run(row.args, tmp_path)
    assert "Traceback" not in err, err
    assert err.endswith("\n") and err.count("\n") == 1, err  # exactly one line
    assert row.says in err, err
    assert status == row.status, err
    prog = err.split(":", 1)[0].split()[0]  # "figg sub: ..." for a subcommand's flags
    assert prog in ("fqd", "fq-send", "fq-recv", "figg", "fyrehose", "opencluster")


def test_debug_flag_adds_the_traceback(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text("[fqd]\nport = \n")
    status, err = run(
        (*FQD, "--config", "bad.toml"), tmp_path, {**QUIET_ENV, "FQBROKER_DEBUG": "1"}
    )
    assert status == 2
    assert "Traceback" in err
    assert err.splitlines()[-1].startswith("fqd: config file bad.toml: not valid TOML")


def test_bad_fq_debug_environment_is_named(tmp_path: Path) -> None:
    status, err = run(FQD, tmp_path, {**QUIET_ENV, "FQ_DEBUG": "chatty"})
    assert status == 2 and err.count("\n") == 1
    assert err.startswith("fqd: FQ_DEBUG: debug flag 'chatty'")


def test_port_in_use_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        status, err = run((*FQD, "-p", port), tmp_path)
    assert status == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("fqd: ") and port in err and "address already in use" in err
