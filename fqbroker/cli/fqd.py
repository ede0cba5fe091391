"""``fqd``: run the broker (fqd.c). Flags follow fqd's where they mean the same thing.

Bad input (a flag, a setting, a settings file, a config database fqd cannot open, two
front ends on one address) is one line on stderr and exit 2; a failure to run (a port in
use, a store another fqd holds) one line and exit 1; ``FQBROKER_DEBUG=1`` adds the
traceback (fqbroker/cli/console.py).

The front ends' part of fqd (their flags, their tables in ``--print-config``, their
"listening on port" lines, the files and addresses checked at start) comes from the
table of front ends (:mod:`fqbroker.server.frontends`, or the one a test passes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import resource
import signal
import socket
import sqlite3
import ssl
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fqbroker.cli.console import Parser, port_type, run_script
from fqbroker.errors import ConfigError
from fqbroker.frontends.kit.component import FrontEnd, Sniffed
from fqbroker.server.frontends import FRONT_ENDS
from fqbroker.settings.broker import DEFAULT_PORT, Settings, debug_flags
from fqbroker.settings.datadir import sample_config
from fqbroker.settings.section import reference, sample
from fqbroker.storage.files import private_dirs
from fqbroker.storage.lock import held

__all__ = ["fqd", "printed_config", "settings_from_args", "settings_reference"]

Table = Sequence[FrontEnd[Any]]

log = logging.getLogger(__name__)

DEBUG_FLAGS = ("mem", "msg", "route", "io", "conn", "config", "peer", "http")

EPILOG = """\
data directory:
  config_db (fqd.sqlite) and queue_dir (queues/) default under the data directory, which
  is --data-dir or the data_dir setting; else $STATE_DIRECTORY (systemd's StateDirectory=);
  else ./var when started at the top of a source checkout (as `make run` does); else
  $XDG_STATE_HOME/fqbroker (~/.local/state/fqbroker).

settings:
  flags override the --config file, which overrides the defaults; `fqd --print-config`
  writes the annotated sample file with every setting and its default. docs/cli.md has it all.
"""


def _debug(text: str) -> str:
    try:
        debug_flags(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _threads(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of threads (1 or more)")
    return value


def _fqd_parser(front_ends: Table = FRONT_ENDS) -> argparse.ArgumentParser:
    p = Parser("fqd", description="fq-compatible message broker (fqd's flags).", epilog=EPILOG)
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="TOML settings file (fqd --print-config writes a sample)",
    )
    p.add_argument(
        "--print-config", action="store_true", help="write the sample settings file and exit"
    )
    p.add_argument(
        "-p",
        "--port",
        type=port_type(zero=True),
        help=f"port (default {DEFAULT_PORT}; 0 picks one)",
    )
    p.add_argument("--bind", metavar="ADDR", help="address to listen on (default 127.0.0.1)")
    p.add_argument(
        "-n", "--node-id", metavar="IP", help="IPv4 node id used in hops (default: the host's)"
    )
    p.add_argument(
        "--data-dir", type=Path, metavar="DIR", help="state directory (default: see below)"
    )
    p.add_argument(
        "-c",
        "--config-db",
        type=Path,
        metavar="FILE",
        help="sqlite configuration database (DATA_DIR/fqd.sqlite)",
    )
    p.add_argument(
        "-q", "--queue-dir", type=Path, metavar="DIR", help="disk queue directory (DATA_DIR/queues)"
    )
    p.add_argument(
        "-w", "--web-root", type=Path, metavar="DIR", help="web UI root (default: the packaged UI)"
    )
    p.add_argument(
        "-m",
        "--module",
        dest="modules",
        action="append",
        metavar="NAME",
        help="rule-function module to load",
    )
    p.add_argument(
        "-l",
        "--module-dir",
        type=Path,
        metavar="DIR",
        help="directory searched first for -m modules",
    )
    p.add_argument(
        "-D", "--foreground", action="store_true", help="accepted; fqd runs in the foreground"
    )
    p.add_argument(
        "-t",
        "--threads",
        type=_threads,
        metavar="N",
        help="fqd's routing threads: accepted, one event loop routes here",
    )
    p.add_argument(
        "-B", dest="bcd", action="store_const", const=True, help="fqd's libbcd on: accepted"
    )
    p.add_argument(
        "-b", dest="bcd", action="store_const", const=False, help="fqd's libbcd off: accepted"
    )
    p.add_argument(
        "-v",
        "--debug",
        type=_debug,
        metavar="FLAGS",
        help="debug flags: comma-separated " + ",".join(DEBUG_FLAGS) + ", or their bits as a"
        " number; overrides $FQ_DEBUG (default: warnings only)",
    )
    for spec in front_ends:
        for flag in spec.flags:
            p.add_argument(
                flag.option, dest=_dest(spec, flag.setting), metavar=flag.metavar, help=flag.help
            )
    p.add_argument(
        "--tls-cert", type=Path, metavar="FILE", help="PEM certificate chain: TLS on the main port"
    )
    p.add_argument(
        "--tls-key", type=Path, metavar="FILE", help="PEM private key (default: in --tls-cert)"
    )
    p.add_argument(
        "--tls-required",
        action="store_true",
        default=None,
        help="refuse plain connections on every TCP port",
    )
    p.add_argument(
        "--tls-client-ca",
        type=Path,
        metavar="FILE",
        help="PEM CA that signs client certificates: TLS ports of their own log users in by them",
    )
    p.add_argument(
        "--auth",
        choices=("none", "password"),
        help='"password": clients log in as users of fq-admin (default "none", as fqd)',
    )
    return p


def _dest(spec: FrontEnd[Any], setting: str) -> str:
    return f"{spec.name}.{setting}"  # no flag of fqd's own has a dot in its name


def settings_from_args(
    argv: Sequence[str] | None = None, front_ends: Table = FRONT_ENDS
) -> Settings:
    """The settings of fqd's command line (and its --config file); ValueError (exit 2
    with fqd) for any that fqd cannot work with."""
    return _settings(_fqd_parser(front_ends).parse_args(argv), front_ends)


def _settings(args: argparse.Namespace, front_ends: Table) -> Settings:
    settings = Settings.from_toml(args.config, front_ends) if args.config else Settings()
    debug = args.debug
    if debug is None and os.environ.get("FQ_DEBUG"):
        # fqd reads FQ_DEBUG when -v is not given.
        try:
            debug_flags(os.environ["FQ_DEBUG"])
        except ValueError as exc:
            raise ValueError(f"FQ_DEBUG: {exc}") from None
        debug = os.environ["FQ_DEBUG"]
    overrides = {
        "port": args.port,
        "bind": args.bind,
        "node_id": args.node_id,
        "data_dir": args.data_dir,
        "config_db": args.config_db,
        "queue_dir": args.queue_dir,
        "web_root": args.web_root,
        "debug": debug,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
        "tls_required": args.tls_required,
        "tls_client_ca": args.tls_client_ca,
        "auth": args.auth,
    }
    settings = settings.updated(overrides, front_ends)
    for spec in front_ends:
        # A flag overrides its setting and keeps the rest of the front end's table.
        for flag in spec.flags:
            value = getattr(args, _dest(spec, flag.setting))
            if value is not None and spec.settings is not None:
                table = settings.section(spec.settings).updated({flag.setting: value})
                settings = settings.with_sections(table)
    if args.modules:
        settings.modules = [*settings.modules, *args.modules]
    settings.check(front_ends)  # the flags' addresses against the others'
    return settings


_TABLES_HEADING = """\
# === The front ends' own tables ==============================================================
# Each front end on a port of its own reads a table of its own below, off until its listen
# is set. Each declares its table beside its code (fqbroker/frontends/NAME/settings.py),
# and fqd --print-config writes them from there.
"""


def printed_config(front_ends: Table = FRONT_ENDS) -> str:
    """What ``fqd --print-config`` writes: the packaged sample's ``[fqd]`` part, then the
    table of each front end that has one, from its declaration."""
    text = sample_config()
    head = text[: text.index(_TABLES_HEADING)] + _TABLES_HEADING
    tables = [sample(spec.settings) for spec in front_ends if spec.settings is not None]
    return "\n".join([head, *tables])


def settings_reference(front_ends: Table = FRONT_ENDS) -> str:
    """docs/cli.md's reference of the front ends' tables and flags, from their declarations
    (tests/frontends/kit/test_component.py keeps the page and this the same)."""
    out = []
    for spec in front_ends:
        if spec.settings is None:
            continue
        table = spec.settings
        flags = "".join(
            f" `fqd {flag.option} {flag.metavar}` sets `{flag.setting}`." for flag in spec.flags
        )
        out.append(f"#### `[{table.NAME}]`: {table.TITLE}\n\n{flags.strip()}\n\n")
        out.append(reference(table) + "\n")
    return "".join(out)


# The broker logs these for whoever embeds it; fqd prints them itself, bare, as fqd.c does
# (scripts wait for "Listening on port: "), so its log handler drops them: once each.
_PRINTED = {
    ("fqbroker.server.broker", "Opening configdb %s"),
    ("fqbroker.server.broker", "Established %d exchanges, %d queues, %d bindings"),
    ("fqbroker.server.broker", "Listening on port: %d"),
    ("fqbroker.server.listeners", "%s listening on %s:%d"),
}


def _not_printed(record: logging.LogRecord) -> bool:
    return (record.name, record.msg) not in _PRINTED


def _configure_logging(debug: str) -> None:
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "fqd", False)]:
        root.removeHandler(old)  # fqd() run again in one process: still one handler
    handler = logging.StreamHandler()
    handler.fqd = True  # type: ignore[attr-defined]
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    handler.addFilter(_not_printed)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if debug_flags(debug) else logging.WARNING)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def _run(settings: Settings, front_ends: Table = FRONT_ENDS) -> None:
    from fqbroker.server.broker import Broker

    try:
        broker = Broker(settings, front_ends)
    except sqlite3.Error as exc:
        raise ConfigError(f"config database {settings.config_db}: {exc}") from None
    stop = broker.shutdown_requested
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await broker.start()
    _freeze_startup_objects()
    # fqd's lines, said once the broker listens, so that when it cannot (a database or a
    # port it cannot use) the error is the only line.
    _say(f"Opening configdb {settings.config_db}")
    _say("Established {} exchanges, {} queues, {} bindings".format(*broker.established))
    _say(f"Listening on port: {broker.port}")
    if broker.users is not None:
        count = len(broker.users.names())
        hint = "" if count else ": nobody can log in until `fq-admin -c DB user add NAME`"
        _say(f"Authenticating {count} users{hint}")
    # Front ends on ports of their own say where they listen too, beside fq's line (port
    # 0 picks one, and whoever started fqd reads it here).
    for live in broker.front_ends.values():
        if not isinstance(live.spec.reach, Sniffed) and live.address is not None:
            _say(f"{live.spec.title or live.name} listening on port: {live.address[1]}")
    _trim_malloc()
    try:
        await stop.wait()
        await broker.stop()
    finally:
        gc.unfreeze()  # fqd run again in one process: what this one made may go


def _main(argv: Sequence[str] | None, front_ends: Table = FRONT_ENDS) -> int:
    args = _fqd_parser(front_ends).parse_args(argv)
    if args.print_config:
        try:
            sys.stdout.write(printed_config(front_ends))
            sys.stdout.flush()
        except BrokenPipeError:  # `fqd --print-config | head`
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    settings = _settings(args, front_ends)
    _configure_logging(settings.debug)
    _accept_fqd_flags(args)
    _make_directories(settings)
    _check_settings(settings, front_ends)
    _raise_descriptor_limit()
    _fix_malloc_thresholds()
    # Before anything opens the store: a second fqd on it would write over this one's
    # records (storage/lock.py).
    with held(settings):
        runner = _event_loop_runner()
        with runner:
            runner.run(_run(settings, front_ends))
    return 0


def fqd(argv: Sequence[str] | None = None, front_ends: Table = FRONT_ENDS) -> int:
    """Entry point of ``fqd``; ``front_ends``: the table to serve (a test's own)."""
    return run_script(
        "fqd",
        lambda args: _main(args, front_ends),
        argv,
        usage_errors=(ValueError, ImportError),
        failures=(OSError, sqlite3.Error),
    )


def _accept_fqd_flags(args: argparse.Namespace) -> None:
    """fqd's flags that mean nothing here are accepted (service files carry them) and
    said once; -l means what it says."""
    if args.threads is not None:
        log.warning("-t %d ignored: one event loop routes every message here", args.threads)
    if args.bcd is not None:
        log.warning("-%s ignored: no libbcd crash reporting here", "B" if args.bcd else "b")
    if args.module_dir is not None:
        if not args.module_dir.is_dir():
            raise ConfigError(f"-l {args.module_dir}: no such directory")
        sys.path.insert(0, str(args.module_dir))


def _make_directories(settings: Settings) -> None:
    # Created here so that a path fqd cannot use is named in one line before anything
    # opens it (the default data directory may not exist yet on a fresh install).
    for what, directory in (
        ("config_db", settings.config_db.parent),
        ("queue_dir", settings.queue_dir),
    ):
        if directory.exists() and not directory.is_dir():
            raise ConfigError(f"{what}: {directory} is not a directory")
        try:
            private_dirs(directory)
        except OSError as exc:
            raise ConfigError(f"{what}: cannot create {directory}: {exc.strerror or exc}") from None


def _check_settings(settings: Settings, front_ends: Table) -> None:
    """The listen addresses resolve, the web root is there, the certificates and keys
    load; else a ConfigError names the setting and its value (what the resolver and ssl
    say names neither)."""
    from fqbroker.frontends.kit.tls import server_context

    addresses = [("bind", settings.bind, settings.port)]
    addresses += [
        (f"{claim.owner} listen", claim.host, claim.port)
        for claim in settings.claims(front_ends)
        if not claim.shared
    ]
    for what, host, port in addresses:
        if host:
            try:
                socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except socket.gaierror as exc:
                raise ConfigError(f"{what} {host!r}: {exc.strerror}") from None
    if settings.web_root is not None and not settings.web_root.is_dir():
        raise ConfigError(f"web_root {settings.web_root}: no such directory")
    # The main port's files, then those of each front end's table that has them.
    tables: list[tuple[str, Any]] = [("", settings)]
    for spec in front_ends:
        if spec.settings is not None and hasattr(spec.settings, "tls_cert"):
            tables.append((f"{spec.settings.NAME} ", settings.section(spec.settings)))
    for what, table in tables:
        cert, key = table.tls_cert, table.tls_key
        for name, path in ((f"{what}tls_cert", cert), (f"{what}tls_key", key)):
            if path is not None and not path.is_file():
                raise ConfigError(f"{name} {path}: no such file")
        try:
            server_context(cert, key)
        except (ssl.SSLError, OSError) as exc:
            files = f"{cert} and {key}" if key is not None else f"{cert}"
            reason = (
                "not a PEM certificate chain and its key"
                if isinstance(exc, ssl.SSLError)
                else exc.strerror or exc
            )
            raise ConfigError(f"{what}tls_cert/tls_key {files}: will not load: {reason}") from None
    if settings.tls_client_ca is not None:
        try:
            ssl.create_default_context(cafile=settings.tls_client_ca)
        except (ssl.SSLError, OSError) as exc:
            why = "not PEM certificates" if isinstance(exc, ssl.SSLError) else exc.strerror
            raise ConfigError(f"tls_client_ca {settings.tls_client_ca}: {why}") from None


def _raise_descriptor_limit() -> None:
    # Every connection and every disk-queue file is a descriptor, and many systems start a
    # process with a soft limit of 1,024 under a far higher hard one. The broker takes what
    # it is allowed (as Go programs do), and max_connections is derived from it.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard and (soft != resource.RLIM_INFINITY):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# glibc's mallopt parameters, and what the broker sets them to.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD = 4 << 20
_TRIM_THRESHOLD = 64 << 20


def _fix_malloc_thresholds() -> None:
    # A message of 128 KiB or more makes frames over glibc's starting mmap threshold, and
    # whether each is an mmap (its pages faulted in and zeroed, then unmapped) depends on
    # the dynamic threshold, which moves with the process's allocation history: the
    # 128 KiB row ran at half speed or full speed from one start to the next
    # (bench/RESULTS.md, "one door, front ends as a table"). Fixed thresholds make it the
    # fast case every time; messages of 4 MiB and more are still mmaps, given back whole
    # when freed. The environment's MALLOC_*_ settings, when given, win.
    if not sys.platform.startswith("linux") or any(
        name in os.environ for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
    ):
        return
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (ImportError, OSError, AttributeError):  # not glibc
        return
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
    mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)


def _trim_malloc() -> None:
    # Starting (imports, the databases, recovering queues) frees memory that the trim
    # threshold above keeps in malloc's heap: given back once, when the broker listens,
    # it is RSS an idle broker does not carry (bench/RESULTS.md, the idle row).
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        trim = ctypes.CDLL(None).malloc_trim
    except (ImportError, OSError, AttributeError):  # not glibc
        return
    trim(0)


def _freeze_startup_objects() -> None:
    # What starting made (modules, settings, the catalog, the router: tens of thousands
    # of objects) lives as long as the broker, and the collector walked all of it on each
    # of its full passes and on the first younger ones, a pause of 1 to 15 ms that every
    # message in flight waited out (bench/RESULTS.md). Frozen, it is never walked again;
    # whatever is made later is collected as always. Collected first, so that no
    # start-up garbage is kept for good.
    gc.collect()
    gc.freeze()


def _event_loop_runner() -> asyncio.Runner:
    # uvloop when installed: same semantics, a faster loop.
    with contextlib.suppress(ImportError):
        import uvloop

        return asyncio.Runner(loop_factory=uvloop.new_event_loop)
    return asyncio.Runner()
