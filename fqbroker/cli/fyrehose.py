"""``fyrehose``: publish lines to a fyrehose backbone, or print its stream.

    fyrehose [--host H] [--port P] push
    fyrehose [--host H] [--port P] sub [--json] [--count N] [--start SEQ]

``push`` re-sends a line after 2 s until it came back in the stream. What each prints and
its exit codes: docs/fyrehose-client.md, "The fyrehose tool". Run it as ``python -m
fqbroker.cli.fyrehose`` too.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Sequence

from fqbroker.cli.console import Parser, port_type, run_script
from fqbroker.cli.fqtools import json_line, reader_went_away, run_tool
from fqbroker.cli.stdin import lines, stdin_chunks
from fqbroker.clients.fyrehose.client import DEFAULT_PORT, Delivered, FyrehoseClient
from fqbroker.errors import FqError
from fqbroker.protocols.fyrehose.wire import MAX_DATA, MAX_SEQUENCE

__all__ = ["format_json", "main"]

IN_FLIGHT = 256  # publishes sent and not yet confirmed, at most


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _number(low: int, high: int, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what} ({low} to {high})")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    p = Parser(
        "fyrehose", description="Publish to and read a fyrehose backbone (UDP, IPv4: no TLS)."
    )
    p.add_argument("--host", default="127.0.0.1", help="broker host (IPv4)")
    p.add_argument("--port", type=port_type(), default=DEFAULT_PORT, help="its fyrehose UDP port")
    sub = p.add_subparsers(dest="command", required=True)
    push = sub.add_parser(
        "push", help="publish each line of stdin; exit once each came back in the stream"
    )
    sub_ = sub.add_parser("sub", help="print the stream, in order")
    for q in (push, sub_):
        q.add_argument("--host", default=argparse.SUPPRESS)
        q.add_argument("--port", type=port_type(), default=argparse.SUPPRESS)
    sub_.add_argument(
        "--json",
        action="store_true",
        help='one JSON object per message: {"seq": N, "data": TEXT}, data as UTF-8 text, or '
        'base64 with "base64": true when it is not UTF-8',
    )
    sub_.add_argument("--count", type=_number(0, 1 << 63, "a count"), help="stop after N")
    sub_.add_argument(
        "--start",
        type=_number(1, MAX_SEQUENCE, "a sequence"),
        help="begin at this sequence (history from the broker's window and journals)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``fyrehose``."""
    return run_script("fyrehose", _main, argv, failures=(OSError, FqError))


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    work = _push(args) if args.command == "push" else _sub(args)
    # A line of stdin too long for a datagram is a ValueError: run_script's bad input.
    return run_tool(
        "fyrehose", args.host, args.port, work,
        on_timeout="no answer from {where} (no KEEPALIVE-ACK)",
    )  # fmt: skip


async def _push(args: argparse.Namespace) -> int:
    client = await FyrehoseClient.connect(args.host, args.port)
    pushed = 0
    try:
        waiting: set[asyncio.Future[int | None]] = set()
        async for line in lines(stdin_chunks(), max_line=MAX_DATA):
            while len(waiting) >= IN_FLIGHT:
                done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                pushed += len(done)
            waiting.add(client.publish_nowait(line))
        if waiting:
            await asyncio.wait(waiting)
            pushed += len(waiting)
    finally:
        await client.close()
    _log(f"pushed {pushed} messages")
    return 0


async def _sub(args: argparse.Namespace) -> int:
    client = await FyrehoseClient.connect(args.host, args.port, start=args.start)
    out = sys.stdout.buffer
    total = 0
    reported = 0
    try:
        while args.count is None or total < args.count:
            msg = await client.next()
            while reported < len(client.lost):
                low, high = client.lost[reported]
                _log(f"fyrehose: lost messages {low} to {high}")
                reported += 1
            out.write(format_json(msg) if args.json else msg.data + b"\n")
            out.flush()
            total += 1
        return 0
    except BrokenPipeError:
        reader_went_away()  # `fyrehose sub | head`
        return 0
    finally:
        await client.close()


def format_json(msg: Delivered) -> bytes:
    """One JSON object and a newline: data as text when it is UTF-8, else base64."""
    return json_line({"seq": msg.seq}, msg.data)


if __name__ == "__main__":
    sys.exit(main())
