"""``opencluster``: get, set and ping an OpenCluster key/value server (fqd's listener).

    opencluster [--host H] [--port P] [--tls] [--cafile F] [--cert F [--key F]] get NAME [--int]
    opencluster ... set NAME VALUE [--int] [--expires S]
    opencluster ... ping

What each prints and its exit codes: docs/opencluster-client.md, "The opencluster tool".
Run it as ``python -m fqbroker.cli.opencluster`` too.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from fqbroker.cli.console import Parser, add_tls_options, port_type, run_script, tls_options
from fqbroker.cli.fqtools import run_tool
from fqbroker.clients.opencluster.client import DEFAULT_PORT, OpenClusterClient
from fqbroker.clients.opencluster.machine import I32_MAX, I32_MIN
from fqbroker.errors import FqError

__all__ = ["main"]


def _int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not I32_MIN <= value <= I32_MAX:
        raise argparse.ArgumentTypeError(f"{value} does not fit a 32-bit signed int")
    return value


def _seconds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= I32_MAX:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (0 = never)")
    return value


def _parser() -> argparse.ArgumentParser:
    p = Parser("opencluster", description="Get and set values on an OpenCluster server.")
    p.add_argument("--host", default="127.0.0.1", help="server host")
    p.add_argument("--port", type=port_type(), default=DEFAULT_PORT, help="its OpenCluster port")
    add_tls_options(p, certificate='the login under auth = "password"')
    sub = p.add_subparsers(dest="command", required=True)
    get = sub.add_parser("get", help="print the value of NAME")
    get.add_argument("name")
    get.add_argument("--int", action="store_true", help="read it as an int (get_int)")
    set_ = sub.add_parser("set", help="store VALUE under NAME")
    set_.add_argument("name")
    set_.add_argument("value")
    set_.add_argument("--int", action="store_true", help="store VALUE as a 32-bit int")
    set_.add_argument("--expires", type=_seconds, default=0, help="seconds to live (0: never)")
    sub.add_parser("ping", help="check that the server answers")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``opencluster``."""
    return run_script("opencluster", _main, argv, failures=(OSError, FqError))


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command != "ping" and not args.name:
        parser.error("NAME is empty")
    if args.command == "set" and args.int:
        try:
            args.value = _int(args.value)
        except argparse.ArgumentTypeError as exc:
            parser.error(f"VALUE: {exc}")
    # A refusal (an FqError) is run_script's one line, status 1.
    return run_tool("opencluster", args.host, args.port, _run(args))


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def _run(args: argparse.Namespace) -> int:
    client = await OpenClusterClient.connect(args.host, args.port, **tls_options(args))
    try:
        if args.command == "ping":
            await client.ping()
            return 0
        if args.command == "set":
            await client.set(args.name, args.value, expires=args.expires)
            return 0
        value = await client.get(args.name, kind=int if args.int else bytes)
    finally:
        await client.close()
    if value is None:
        _say(f"opencluster: {args.name}: not found")
        return 1
    out = sys.stdout.buffer
    out.write(str(value).encode() if isinstance(value, int) else value)
    out.write(b"\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
