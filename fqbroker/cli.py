"""``fqd``: run the broker (fqd.c). Flags follow fqd's where they mean the same thing."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import resource
import signal
import sys
from pathlib import Path

from fqbroker.config import DEFAULT_PORT, Settings

__all__ = ["fqd"]

DEBUG_FLAGS = ("mem", "msg", "route", "io", "conn", "config", "peer", "http")


def _fqd_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fqd", description="fq-compatible message broker")
    p.add_argument("--config", type=Path, help="TOML settings file (see conf/fqd.toml)")
    p.add_argument("-p", "--port", type=int, help=f"port (default {DEFAULT_PORT}; 0 picks one)")
    p.add_argument("--bind", help="address to listen on (default 127.0.0.1)")
    p.add_argument("-n", "--node-id", help="IPv4 node id used in hops")
    p.add_argument("-c", "--config-db", type=Path, help="sqlite configuration database")
    p.add_argument("-q", "--queue-dir", type=Path, help="disk queue directory")
    p.add_argument("-w", "--web-root", type=Path, help="web UI root directory")
    p.add_argument(
        "-m", "--module", dest="modules", action="append", help="rule-function module to load"
    )
    p.add_argument(
        "-D",
        "--foreground",
        action="store_true",
        help="accepted; fqd always runs in the foreground",
    )
    p.add_argument("-v", "--debug", help="debug flags: " + ",".join(DEBUG_FLAGS))
    p.add_argument(
        "--lumberjack",
        metavar="ADDR:PORT",
        help="serve Lumberjack/Beats log shippers here (off by default; port 0 picks one)",
    )
    p.add_argument(
        "--figg",
        metavar="ADDR:PORT",
        help="serve retained topics to Figg clients here (off by default; port 0 picks one)",
    )
    p.add_argument(
        "--fyrehose",
        metavar="ADDR:PORT",
        help="serve the fyrehose backbone over UDP here (off by default; port 0 picks one)",
    )
    p.add_argument(
        "--opencluster",
        metavar="ADDR:PORT",
        help="serve the OpenCluster key/value store here (off by default; port 0 picks one)",
    )
    p.add_argument("--tls-cert", type=Path, help="PEM certificate chain: TLS on the main port")
    p.add_argument("--tls-key", type=Path, help="PEM private key (default: in --tls-cert)")
    p.add_argument(
        "--tls-required",
        action="store_true",
        default=None,
        help="refuse plain connections on the main port",
    )
    p.add_argument(
        "--auth",
        choices=("none", "password"),
        help='"password": clients log in as users of fq-admin (default "none", as fqd)',
    )
    return p


def settings_from_args(argv: list[str] | None = None) -> Settings:
    args = _fqd_parser().parse_args(argv)
    settings = Settings.from_toml(args.config) if args.config else Settings()
    overrides = {
        "port": args.port,
        "bind": args.bind,
        "node_id": args.node_id,
        "config_db": args.config_db,
        "queue_dir": args.queue_dir,
        "web_root": args.web_root,
        "debug": args.debug,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
        "tls_required": args.tls_required,
        "auth": args.auth,
    }
    settings = settings.updated(overrides)
    if args.lumberjack is not None:
        settings.lumberjack = settings.lumberjack.updated({"listen": args.lumberjack})
    if args.figg is not None:
        settings.figg = settings.figg.updated({"listen": args.figg})
    if args.fyrehose is not None:
        settings.fyrehose = settings.fyrehose.updated({"listen": args.fyrehose})
    if args.opencluster is not None:
        settings.opencluster = settings.opencluster.updated({"listen": args.opencluster})
    if args.modules:
        settings.modules = [*settings.modules, *args.modules]
    return settings


def _configure_logging(debug: str) -> None:
    level = logging.DEBUG if debug else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")


async def _run(settings: Settings) -> None:
    from fqbroker.server.broker import Broker

    print(f"Opening configdb {settings.config_db}", file=sys.stderr, flush=True)
    broker = Broker(settings)
    print(
        "Established {} exchanges, {} queues, {} bindings".format(*broker.established),
        file=sys.stderr,
        flush=True,
    )
    await broker.start()
    print(f"Listening on port: {broker.port}", file=sys.stderr, flush=True)
    if broker.users is not None:
        count = len(broker.users.names())
        hint = "" if count else ": nobody can log in until `fq-admin -c DB user add NAME`"
        print(f"Authenticating {count} users{hint}", file=sys.stderr, flush=True)
    # Front ends on ports of their own say where they listen too, beside fq's line (port
    # 0 picks one, and whoever started fqd reads it here).
    lumberjack = broker.front_ends.get("lumberjack")
    if lumberjack is not None and lumberjack.address is not None:
        print(f"Lumberjack listening on port: {lumberjack.address[1]}", file=sys.stderr, flush=True)
    figg = broker.front_ends.get("figg")
    if figg is not None and figg.address is not None:
        print(f"Figg listening on port: {figg.address[1]}", file=sys.stderr, flush=True)
    fyrehose = broker.front_ends.get("fyrehose")
    if fyrehose is not None and fyrehose.address is not None:
        print(f"fyrehose listening on port: {fyrehose.address[1]}", file=sys.stderr, flush=True)
    opencluster = broker.front_ends.get("opencluster")
    if opencluster is not None and opencluster.address is not None:
        port = opencluster.address[1]
        print(f"OpenCluster listening on port: {port}", file=sys.stderr, flush=True)
    stop = broker.shutdown_requested
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await broker.stop()


def fqd(argv: list[str] | None = None) -> int:
    try:
        settings = settings_from_args(argv)
    except (ValueError, OSError) as exc:  # a bad setting, flag or file: one line, no traceback
        print(f"fqd: {exc}", file=sys.stderr)
        return 2
    _configure_logging(settings.debug)
    _raise_descriptor_limit()
    try:
        runner = _event_loop_runner()
        with runner:
            runner.run(_run(settings))
    except (ValueError, ImportError, OSError) as exc:
        print(f"fqd: {exc}", file=sys.stderr)
        return 2
    return 0


def _raise_descriptor_limit() -> None:
    # Every connection and every disk-queue file is a descriptor, and many systems start a
    # process with a soft limit of 1,024 under a far higher hard one. The broker takes what
    # it is allowed (as Go programs do), and max_connections is derived from it.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard and (soft != resource.RLIM_INFINITY):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _event_loop_runner() -> asyncio.Runner:
    # uvloop when installed: same semantics, a faster loop.
    with contextlib.suppress(ImportError):
        import uvloop

        return asyncio.Runner(loop_factory=uvloop.new_event_loop)
    return asyncio.Runner()
