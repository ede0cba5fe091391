"""``figg``: publish lines to a topic, or print a topic's messages (the Figg CLI's pub/sub).

    figg pub TOPIC                 each line of stdin (newline dropped) is one message
    figg sub TOPIC [--offset N] [--json] [--count N]

Both reconnect when the broker goes away: ``pub`` re-sends what was not acknowledged and
``sub`` resumes after the last offset it printed. Output and exit codes: docs/figg-client.md,
"The figg tool". Run it as ``python -m fqbroker.cli.figg`` too.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable, Sequence

from fqbroker.cli.console import Parser, add_tls_options, port_type, run_script, tls_options
from fqbroker.cli.fqtools import json_line, reader_went_away, run_tool
from fqbroker.cli.stdin import lines, stdin_chunks
from fqbroker.clients.figg.client import DEFAULT_PORT, FiggClient, Message
from fqbroker.errors import FqError
from fqbroker.protocols.figg.wire import MAX_FRAME, MAX_TOPIC

__all__ = ["format_json", "main"]

RATE_EVERY = 5.0  # seconds between rate lines of `figg pub`
MAX_LINE = MAX_FRAME - 1024  # a frame holds the topic and a header too


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _topic(text: str) -> bytes:
    name = text.encode()
    if not 0 < len(name) <= MAX_TOPIC:
        raise argparse.ArgumentTypeError(f"a topic is 1 to {MAX_TOPIC} bytes")
    return name


def _offset(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < 1 << 64:
        raise argparse.ArgumentTypeError(f"{text!r} is not an offset (0 to 2**64-1)")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count")
    return value


def _parser() -> argparse.ArgumentParser:
    p = Parser("figg", description="Publish to and read Figg topics.")
    p.add_argument("--host", default="127.0.0.1", help="broker host")
    p.add_argument("--port", type=port_type(), default=DEFAULT_PORT, help="its Figg port")
    add_tls_options(p, certificate='the login under auth = "password"')
    sub = p.add_subparsers(dest="command", required=True)
    pub = sub.add_parser("pub", help="publish each line of stdin to TOPIC")
    sub_ = sub.add_parser("sub", help="print the messages of TOPIC")
    for q in (pub, sub_):
        q.add_argument("topic", type=_topic)
        q.add_argument("--host", default=argparse.SUPPRESS)
        q.add_argument("--port", type=port_type(), default=argparse.SUPPRESS)
        add_tls_options(q, top=False)
        q.add_argument("--count", type=_count, help="stop after COUNT messages")
    sub_.add_argument("--offset", type=_offset, help="start after this offset (0: the whole topic)")
    sub_.add_argument("--json", action="store_true", help="one JSON object per message")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``figg``."""
    return run_script("figg", _main, argv, failures=(OSError, FqError))


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    work = _pub(args) if args.command == "pub" else _sub(args)
    return run_tool("figg", args.host, args.port, work)


async def _pub(args: argparse.Namespace) -> int:
    client = FiggClient(args.host, args.port, **tls_options(args))
    await client.connect()
    sent = 0
    start = time.monotonic()
    ticker = asyncio.create_task(_rates(lambda: sent, start))
    try:
        async for line in lines(stdin_chunks(), max_line=MAX_LINE):
            if args.count is not None and sent >= args.count:
                break
            await client.publish(args.topic, line)
            sent += 1
        await client.flush()
    finally:
        ticker.cancel()
        await client.close()
    elapsed = max(time.monotonic() - start, 1e-9)
    _log(f"published {sent} messages in {elapsed:.3f} s ({sent / elapsed:.0f} msg/s)")
    return 0


async def _rates(sent: Callable[[], int], start: float) -> None:
    last, then = 0, start
    while True:
        await asyncio.sleep(RATE_EVERY)
        now, count = time.monotonic(), sent()
        _log(f"published {count} messages ({(count - last) / (now - then):.0f} msg/s)")
        last, then = count, now


async def _sub(args: argparse.Namespace) -> int:
    client = FiggClient(args.host, args.port, **tls_options(args))
    await client.connect()
    out = sys.stdout.buffer
    total = 0
    try:
        if args.count == 0:
            return 0
        async for msg in client.subscribe(args.topic, args.offset):
            out.write(format_json(msg) if args.json else msg.data + b"\n")
            out.flush()
            total += 1
            if args.count is not None and total >= args.count:
                break
        return 0
    except BrokenPipeError:
        reader_went_away()  # `figg sub T | head`
        return 0
    finally:
        await client.close()


def format_json(msg: Message) -> bytes:
    """One JSON object and a newline: data as text when it is UTF-8, else base64."""
    return json_line({"topic": msg.topic.decode(errors="replace"), "offset": msg.offset}, msg.data)


if __name__ == "__main__":
    sys.exit(main())
