"""``fq-send`` and ``fq-recv``: fq's client tools fqs, fq_sndr and fq_rcvr
(docs/fq-protocol.md §6.2; flags and output formats: docs/cli.md).

Both take the libfq source string ``USER[/QUEUE[/TYPE:PARAMS]]`` as the user and share the
flags naming the broker. Messages go to stdout exactly as fq_rcvr prints them, one flushed
line each, so a pipe reader sees them at once; everything else (bind results, rates,
errors) goes to stderr. Run them as ``fq-send``/``fq-recv`` or as ``python -m
fqbroker.cli.fqtools send|recv ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import socket
import ssl
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from typing import Any

from fqbroker.cli.console import (
    EXIT_FAILURE,
    Parser,
    add_tls_options,
    address_type,
    port_type,
    run_script,
    tls_options,
)
from fqbroker.cli.stdin import lines, stdin_chunks
from fqbroker.clients.fq.client import Client, ClientError
from fqbroker.core.frames import MAX_MESSAGE_SIZE
from fqbroker.core.message import Message, hop_addresses
from fqbroker.core.program import RuleFunction, RuleRegistry, compile_program
from fqbroker.errors import ProgramError
from fqbroker.protocols.fq import wire
from fqbroker.settings.broker import DEFAULT_PORT

__all__ = ["fq_recv", "fq_send", "main", "run_tool"]

FLUSH_EVERY = 1000  # messages published between waits for the socket (--count mode)
PROGRESS_EVERY = 1.0  # seconds between progress lines of fq-send
PASSWORD_ENV = "FQ_PASSWORD"  # the password, kept out of the process list
DEFAULT_HOST = "127.0.0.1"


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run_tool(
    tool: str,
    host: str,
    port: int,
    work: Coroutine[Any, Any, int],
    *,
    on_timeout: str = "cannot reach {where}: timed out",
) -> int:
    """Run a console tool's ``work`` until it ends or SIGINT/SIGTERM (a quiet exit); a
    broker that refuses or cannot be reached is one line on stderr and status 1."""
    where = f"{host}:{port}"
    try:
        return asyncio.run(_until_signal(work))
    except ClientError as exc:
        _log(f"{tool}: refused: {exc.text.rstrip()}")
    except TimeoutError:
        _log(f"{tool}: " + on_timeout.format(where=where))
    except OSError as exc:
        _log(f"{tool}: cannot reach {where}: {os_reason(exc)}")
    return 1


async def _until_signal(work: Coroutine[Any, Any, int]) -> int:
    """Run ``work``; SIGINT or SIGTERM cancels it, a quiet exit with the status a shell
    gives a command the signal ended (128 + its number: 130, 143)."""
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    caught: list[int] = []

    def stop(sig: int) -> None:
        caught.append(sig)
        task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop, sig)
    try:
        return await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
        return 128 + caught[0] if caught else 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


# --- flags both share ---------------------------------------------------------------------


def _number(low: float, kind: type[int] | type[float] = int) -> Callable[[str], Any]:
    """An argparse ``type``: a number of ``kind`` of at least ``low``."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or value < low or value != value:  # NaN is no number
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of at least {low}")
        return value

    return parse


def _connection_arguments(p: argparse.ArgumentParser, *, user: str, password: str) -> None:
    """The flags naming the broker and who we are, spelled the same in both tools."""
    p.add_argument("-H", "--host", help=f"broker host (default {DEFAULT_HOST})")
    p.add_argument("-p", "--port", type=port_type(), help=f"broker port (default {DEFAULT_PORT})")
    p.add_argument(
        "-a",
        "--address",
        type=address_type(DEFAULT_PORT),
        metavar="HOST[:PORT]",
        help="host and port in one, as fqs's -a; --host and --port override it",
    )
    p.add_argument("-u", "--user", default=user, help="USER[/QUEUE[/TYPE:PARAMS]]")
    p.add_argument(
        "-P",
        "--password",
        help='password (checked when fqd runs with auth = "password"); other users of the host'
        f" can see it in the process list: prefer ${PASSWORD_ENV} or --password-stdin"
        f" (default {password!r})",
    )
    p.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the password from the first line of stdin (fq-send: the lines after it"
        " are the messages)",
    )
    p.set_defaults(default_password=password)
    add_tls_options(p, certificate="sent if the server asks (fq logs in with the password)")


def _password(args: argparse.Namespace) -> str:
    """--password-stdin's line, else -P, else $FQ_PASSWORD, else the tool's default."""
    if args.password_stdin:
        return _stdin_line()
    if args.password is not None:
        return str(args.password)
    return os.environ.get(PASSWORD_ENV, str(args.default_password))


def _stdin_line() -> str:
    # A byte at a time from the descriptor: nothing past the newline is taken from what
    # fq-send then reads as messages.
    line = bytearray()
    try:
        while (byte := os.read(0, 1)) and byte != b"\n":
            line += byte
    except OSError as exc:  # stdin closed, or a directory
        raise ValueError(f"--password-stdin: cannot read stdin: {os_reason(exc)}") from None
    if not line and byte != b"\n":
        raise ValueError("--password-stdin: stdin ended before a password line")
    return line.decode("utf-8", "surrogateescape").removesuffix("\r")


def _client(args: argparse.Namespace) -> Client:
    host, port = args.address or (DEFAULT_HOST, DEFAULT_PORT)
    host = args.host or host
    port = args.port if args.port is not None else port
    return Client(host, port, args.user, _password(args), **tls_options(args))


# --- fq-send ------------------------------------------------------------------------------


def _send_parser() -> argparse.ArgumentParser:
    p = Parser(
        "fq-send",
        description="Publish each line of stdin (newline included) as one message, like fqs; "
        "or, with --count, COUNT messages of SIZE zero bytes, like fq_sndr.",
    )
    _connection_arguments(p, user="user", password="pass")
    p.add_argument("-x", "-e", "--exchange", default="maryland", help="exchange to publish on")
    p.add_argument("-r", "--route", default="test.prefix.boo", help="route of every message")
    p.add_argument("--count", type=_number(0), help="send COUNT generated messages, ignore stdin")
    p.add_argument("--size", type=_number(0), default=0, help="payload bytes with --count")
    p.add_argument(
        "--rate",
        type=_number(1e-3, float),
        metavar="MSGS_PER_SEC",
        help="send at most this many messages a second (default: as fast as the broker takes)",
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        help="print the count and rate on stderr every second (default: when stderr is a terminal)",
    )
    p.add_argument(
        "--confirm",
        action="store_true",
        help="wait for publisher confirms (fqbroker extension); exit 1 if one fails",
    )
    p.add_argument(
        "--confirm-every",
        type=_number(1),
        default=10000,
        help="confirm after this many messages",
    )
    return p


def fq_send(argv: list[str] | None = None) -> int:
    """Entry point of ``fq-send``."""
    return run_script("fq-send", _send_main, argv)


def _send_main(argv: Sequence[str] | None) -> int:
    args = _send_parser().parse_args(argv)
    if args.progress is None:
        args.progress = sys.stderr.isatty()
    client = _client(args)
    return run_tool("fq-send", client.host, client.port, _send(client, args))


async def _send(client: Client, args: argparse.Namespace) -> int:
    exchange, route = args.exchange.encode(), args.route.encode()
    sent = confirmed = 0
    await client.connect()
    progress = None
    try:
        start = time.monotonic()
        if args.count is not None:
            _log(f"payload size -> {args.size}\nmessage count -> {args.count}")
            messages: AsyncIterator[bytes] = _repeat(bytes(args.size), args.count)
        else:
            messages = lines(stdin_chunks(), max_line=MAX_MESSAGE_SIZE, keep_newline=True)
        if args.progress:
            progress = asyncio.create_task(_progress(lambda: sent, args.count, start))
        async for payload in messages:
            if args.rate is not None:
                await _pace(client, start + sent / args.rate)
            await _publish(client, exchange, route, payload)
            sent += 1
            if args.confirm and sent % args.confirm_every == 0:
                confirmed = await _confirm(client, sent)
            elif sent % FLUSH_EVERY == 0:
                await client.flush()
        await client.flush()
        if args.confirm:
            confirmed = await _confirm(client, sent)
        if progress is not None:
            progress.cancel()
            _end_progress()
        elapsed = max(time.monotonic() - start, 1e-9)
        _log(f"sent {sent} messages in {elapsed:.3f} s ({sent / elapsed:.0f} msg/s)")
        if args.confirm:
            _log(f"confirmed {confirmed} messages")
        return 0
    except (ClientError, ConnectionError) as exc:
        if not args.confirm:
            raise
        _log(f"fq-send: confirm failed after {sent} messages ({confirmed} confirmed): {exc}")
        return 1
    finally:
        if progress is not None:
            progress.cancel()
        await client.close()


async def _pace(client: Client, due: float) -> None:
    """--rate: wait until the next message is due, with what came before on the wire."""
    if due > time.monotonic():
        await client.flush()
        await asyncio.sleep(max(due - time.monotonic(), 0))


async def _progress(sent: Callable[[], int], total: int | None, start: float) -> None:
    """Every second: messages sent (of how many, with --count) and the rate since the last
    line; one line rewritten in place on a terminal, a line each otherwise."""
    tty = sys.stderr.isatty()
    last, then = 0, start
    while True:
        await asyncio.sleep(PROGRESS_EVERY)
        now, count = time.monotonic(), sent()
        of = f"/{total}" if total is not None else ""
        text = f"sent {count}{of} messages, {(count - last) / (now - then):.0f} msg/s"
        if tty:
            sys.stderr.write(f"\r{text}\x1b[K")
            sys.stderr.flush()
        else:
            _log(text)
        last, then = count, now


def _end_progress() -> None:
    if sys.stderr.isatty():
        sys.stderr.write("\r\x1b[K")
        sys.stderr.flush()


async def _repeat(payload: bytes, count: int) -> AsyncIterator[bytes]:
    for _ in range(count):
        yield payload


async def _confirm(client: Client, sent: int) -> int:
    count = await client.confirm()
    if count < sent:
        # A reconnect replaced the data socket: the count covers only the new one.
        raise ConnectionError(f"only {count} of {sent} messages are covered by the confirm")
    return sent


async def _publish(client: Client, exchange: bytes, route: bytes, payload: bytes) -> None:
    # False means disconnected with a full backlog: wait for the reconnect, then retry.
    while not client.publish(exchange, route, payload):
        await client.flush()


# --- fq-recv ------------------------------------------------------------------------------


def _recv_parser() -> argparse.ArgumentParser:
    p = Parser(
        "fq-recv",
        description="Bind a queue to an exchange and print what arrives, like fq_rcvr.",
        epilog="--json prints one object per message: route, exchange, sender, hops, msgid\n"
        'and the payload, as "payload" (text) when it is UTF-8, else as\n'
        '"payload_base64"; with --base64 always as "payload_base64". Exactly one of\n'
        "the two is in each object.",
    )
    _connection_arguments(p, user="guest", password="guest")
    p.add_argument("-x", "-e", "--exchange", default="maryland", help="exchange to bind to")
    p.add_argument("-b", "--program", default='prefix:""', help="route program to bind")
    p.add_argument("-s", "--stats", action="store_true", help="print rates, not messages")
    p.add_argument("--json", action="store_true", help="print one JSON object per message")
    p.add_argument(
        "--base64",
        action="store_true",
        help='with --json: every payload as "payload_base64", text or not',
    )
    p.add_argument("--count", type=_number(1), help="exit after COUNT messages")
    return p


def fq_recv(argv: list[str] | None = None) -> int:
    """Entry point of ``fq-recv``."""
    return run_script("fq-recv", _recv_main, argv)


def _recv_main(argv: Sequence[str] | None) -> int:
    args = _recv_parser().parse_args(argv)
    if args.base64 and not args.json:
        raise ValueError("--base64 goes with --json")
    check_program(args.program)
    client = _client(args)
    return run_tool("fq-recv", client.host, client.port, _recv(client, args))


class _AnyFunction(RuleRegistry):
    """The built-in rule functions, and any other: the broker may have it (``-m``, a
    plugin), so only the broker can refuse an unknown one."""

    def lookup(self, name: str, signature: str) -> RuleFunction | None:
        return super().lookup(name, signature) or _true


def _true(msg: Message) -> bool:
    return True


def check_program(program: str) -> None:
    """Compile ``program`` as the broker will, before binding: a bad one is bad input
    (exit 2), said with the compiler's reason."""
    try:
        compile_program(program.encode(), _AnyFunction())
    except ProgramError as exc:
        raise ValueError(f"bad program {program!r}: {exc}") from None


async def _recv(client: Client, args: argparse.Namespace) -> int:
    await client.connect()
    total = 0
    ticker = None
    try:
        _log("attempting bind")
        route_id = await client.bind(args.exchange.encode(), args.program.encode())
        _log(f"route set -> {route_id}")
        if route_id == wire.BIND_ILLEGAL:
            _log("Failure to bind...")  # fq_rcvr's line, which scripts may look for
            _log(
                f"fq-recv: the broker refused to bind {args.program!r} on {args.exchange!r}:"
                f" {client.user.decode(errors='replace')} may not consume from it, a binding"
                " limit was reached, or a rule function is unknown there (its log says which)"
            )
            return EXIT_FAILURE
        if args.stats:
            ticker = asyncio.create_task(_rates(client, lambda: total))
        out = sys.stdout.buffer
        async for msg in client.messages():
            total += 1
            if not args.stats:
                out.write(format_json(msg, args.base64) if args.json else format_line(msg))
                out.flush()
            if args.count is not None and total >= args.count:
                break
        return 0
    except BrokenPipeError:
        reader_went_away()  # `fq-recv | head`
        return 0
    finally:
        if ticker is not None:
            ticker.cancel()
            print(f"total: {total}", flush=True)
        await client.close()


def format_line(msg: Message) -> bytes:
    """fq_rcvr's line: ``[route] payload``, one trailing newline dropped, cut at a NUL."""
    payload = msg.payload[:-1] if msg.payload.endswith(b"\n") else msg.payload
    route = msg.route.partition(b"\0")[0]
    return b"[" + route + b"] " + payload.partition(b"\0")[0] + b"\n"


def format_json(msg: Message, base64_always: bool = False) -> bytes:
    """One JSON object and a newline. Names are decoded as UTF-8 with replacement; the
    payload is ``payload`` (its text) when it is UTF-8 and ``base64_always`` is false, else
    ``payload_base64``: never both, so a script reads it back exactly."""
    text: dict[str, object] = {
        "route": msg.route.decode(errors="replace"),
        "exchange": msg.exchange.decode(errors="replace"),
        "sender": msg.sender.decode(errors="replace"),
        "hops": hop_addresses(msg.hops),
        "msgid": msg.msgid.hex(),
    }
    payload = None if base64_always else _utf8(msg.payload)
    if payload is None:
        text["payload_base64"] = base64.b64encode(msg.payload).decode()
    else:
        text["payload"] = payload
    return json.dumps(text, ensure_ascii=False).encode() + b"\n"


def _utf8(data: bytes) -> str | None:
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


async def _rates(client: Client, total: Callable[[], int]) -> None:
    """fq_rcvr -s: each second, the input rate (when there was input) and the total."""
    last_total, last = total(), time.monotonic()
    while True:
        await asyncio.sleep(1)
        now, count = time.monotonic(), total()
        if count > last_total:
            rate = (count - last_total) / (now - last)
            print(f"[{client.received_backlog} backlog]  input {rate:0.2f} msg/sec", flush=True)
        print(f"total: {count}", flush=True)
        last_total, last = count, now


def main(argv: list[str] | None = None) -> int:
    """``python -m fqbroker.cli.fqtools send|recv [options]``."""
    argv = sys.argv[1:] if argv is None else argv
    tools = {"send": fq_send, "fq-send": fq_send, "recv": fq_recv, "fq-recv": fq_recv}
    if not argv or argv[0] not in tools:
        _log("usage: python -m fqbroker.cli.fqtools send|recv [options]")
        return 2
    return tools[argv[0]](argv[1:])


def os_reason(exc: OSError) -> str:
    """What went wrong, without asyncio's "Connect call failed (...)" wrapping."""
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {exc}"
    if isinstance(exc, socket.gaierror) or not exc.errno or exc.errno < 0:
        return exc.strerror or str(exc) or type(exc).__name__
    return os.strerror(exc.errno)


def reader_went_away() -> None:
    """Our reader closed the pipe (``TOOL | head``): stop quietly, as a filter does, with
    stdout pointed at /dev/null so the interpreter's final flush raises nothing."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def json_line(fields: dict[str, object], data: bytes) -> bytes:
    """``fields`` and ``data`` as one JSON object and a newline: the data as text when it
    is UTF-8, else base64 with ``"base64": true`` (the consumers' ``--json`` form)."""
    obj = dict(fields)
    try:
        obj["data"] = data.decode()
    except UnicodeDecodeError:
        obj["data"] = base64.b64encode(data).decode()
        obj["base64"] = True
    return json.dumps(obj, ensure_ascii=False).encode() + b"\n"


if __name__ == "__main__":
    sys.exit(main())
