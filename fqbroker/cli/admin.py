"""``fq-admin``: administer a running broker over its admin API, or a config database.

Over HTTP (docs/admin.md, "fq-admin", lists every command), as fqtool and rabbitmqadmin
do, with tables for people and ``--json`` for scripts. With ``-c DB``, as fqd's flag names
it, it changes users and permissions in the sqlite file without a running broker
(docs/security.md); a running broker reads the changes on its next connection. Passwords
never come from the command line, where ``ps`` and shell history would show them. Exit
status: 0 done, 1 refused by the broker or unreachable, 2 bad input.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fqbroker.cli.admintables import print_answer
from fqbroker.cli.console import Parser, add_tls_options, run_script, tls_options
from fqbroker.clients.http.admin import DEFAULT_URL, AdminClient
from fqbroker.core.frames import MAX_MESSAGE_SIZE
from fqbroker.core.permissions import KINDS
from fqbroker.errors import AdminError, BrokerError
from fqbroker.storage.configdb.users import DEFAULT_ITERATIONS, Users

__all__ = ["main"]

PROG = "fq-admin"
TOKEN_ENV = "FQ_ADMIN_TOKEN"
PASSWORD_ENV = "FQ_ADMIN_PASSWORD"


def _parser() -> argparse.ArgumentParser:
    p = Parser(
        PROG,
        description="administer an fqbroker: over its admin API (docs/admin.md), or, with "
        "-c, the users of a config database",
    )
    p.add_argument(
        "-c",
        "--config-db",
        type=Path,
        help="work on this sqlite config database (fqd's -c) instead of a running broker: "
        "user commands only",
    )
    p.add_argument(
        "--url", default=DEFAULT_URL, help="the broker's HTTP address (https://...: over TLS)"
    )
    p.add_argument("--token", help=f"the broker's admin_token (better: ${TOKEN_ENV})")
    p.add_argument("--user", help="an admin user's name (its password: see --password-stdin)")
    p.add_argument(
        "--password-stdin",
        dest="admin_password_stdin",
        action="store_true",
        help=f"read --user's password from the first line of stdin (else ${PASSWORD_ENV}, "
        "else a prompt)",
    )
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the broker")
    add_tls_options(p, certificate="sent if the broker asks (it logs in --token or --user)")
    # Also after the command (fq-admin queues --json); SUPPRESS keeps the top's value.
    common = argparse.ArgumentParser(add_help=False)
    for parser, default in ((p, False), (common, argparse.SUPPRESS)):
        parser.add_argument(
            "--json", action="store_true", default=default, help="print the answer as JSON"
        )
    top = p.add_subparsers(dest="area", required=True, metavar="COMMAND")

    def command(parent: Any, name: str, text: str) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = parent.add_parser(name, help=text, parents=[common])
        return sub

    command(top, "status", "the node: version, uptime, memory, listeners, peers")
    command(top, "queues", "every queue with its backlog and clients")
    queue = command(top, "queue", "create, delete, purge or peek at a queue").add_subparsers(
        dest="action", required=True
    )
    create = command(queue, "create", "create a queue (as an fq client's attach would)")
    create.add_argument("name")
    create.add_argument("--type", choices=("mem", "disk"), default="mem", help="where it keeps")
    create.add_argument(
        "--policy",
        choices=("drop", "block", "reject"),
        default="drop",
        help="what a full queue does",
    )
    create.add_argument("--public", action="store_true", help="up to 16 clients share it")
    create.add_argument("--permanent", action="store_true", help="kept across restarts")
    create.add_argument("--backlog-limit", type=int, help="messages held at most")
    create.add_argument("--fsync", choices=("always", "interval", "never"), help="disk queues")
    delete = command(queue, "delete", "delete a queue, its bindings and its messages")
    delete.add_argument("name")
    delete.add_argument("--force", action="store_true", help="even with clients: ends them")
    command(queue, "purge", "drop every message not yet delivered").add_argument("name")
    peek = command(queue, "peek", "show the next messages without consuming them")
    peek.add_argument("name")
    peek.add_argument("--count", type=int, default=10, help="how many (at most 100)")

    command(top, "bindings", "every binding of an exchange to a queue")
    binding = command(top, "binding", "add or remove a binding").add_subparsers(
        dest="action", required=True
    )
    for verb, text in (("add", "bind PROGRAM on EXCHANGE to QUEUE"), ("remove", "unbind")):
        sub = command(binding, verb, text)
        sub.add_argument("exchange")
        sub.add_argument("program", help='e.g. prefix:"logs." (docs/programs.md)')
        sub.add_argument("queue")
        if verb == "add":
            sub.add_argument("--permanent", action="store_true", help="kept across restarts")

    publish = command(top, "publish", "publish one message")
    publish.add_argument("exchange")
    publish.add_argument("route")
    publish.add_argument("payload", nargs="?", help="the message text (or --file)")
    publish.add_argument("--file", type=Path, help="the payload's file; - for stdin")
    publish.add_argument("--sender", help="the sender field (default _admin)")

    command(top, "checkpoints", "disk queues' checkpoints").add_argument("queue", nargs="?")
    checkpoint = command(top, "checkpoint", "add, remove or reset to a checkpoint")
    verbs = checkpoint.add_subparsers(dest="action", required=True)
    for verb, text in (
        ("add", "name a position of a disk queue (default: where its consumers read)"),
        ("remove", "remove a checkpoint"),
        ("reset", "deliver the queue again from a checkpoint"),
    ):
        sub = command(verbs, verb, text)
        sub.add_argument("queue")
        sub.add_argument("name")
        if verb == "add":
            sub.add_argument("--position", help="LOG:MARKER, as a message id's bytes 8-15")

    command(top, "peers", "upstream rows and their links")
    peer = command(top, "peer", "add or remove an upstream row").add_subparsers(
        dest="action", required=True
    )
    for verb in ("add", "remove"):
        sub = command(peer, verb, f"{verb} an upstream row (pull EXCHANGE from HOST)")
        sub.add_argument("host")
        sub.add_argument("exchange")
        sub.add_argument("--port", type=int, default=8765)
        sub.add_argument("--program", default="prefix:" if verb == "add" else None)
        sub.add_argument("--source", required=verb == "add", help="the user we log in as")
        if verb == "add":
            sub.add_argument("--permanent", action="store_true", help="a permanent binding")
            sub.add_argument(
                "--peer-password-stdin",
                action="store_true",
                help="read the upstream's password from a line of stdin",
            )

    command(top, "users", "users and their permissions")
    command(top, "topics", "retained topics (Figg)")
    _user_parser(command(top, "user", "users and their permissions (-c: in DB)"), command)
    return p


def _user_parser(area: argparse.ArgumentParser, command: Any) -> None:
    user = area.add_subparsers(dest="action", required=True)
    add = command(user, "add", "add a user, or set a user's password")
    add.add_argument("name")
    add.add_argument(
        "--password-stdin", action="store_true", help="read the password from one line of stdin"
    )
    add.add_argument(
        "--iterations",
        type=int,
        default=DEFAULT_ITERATIONS,
        help="PBKDF2 iterations (docs/security.md)",
    )
    command(user, "remove", "remove a user and its permissions").add_argument("name")
    command(user, "list", "list users and their permissions")
    for verb in ("allow", "deny"):
        rule = command(user, verb, f"{verb} a user KIND on names matching PATTERN")
        rule.add_argument("name")
        rule.add_argument("kind", choices=KINDS)
        rule.add_argument("pattern", help="a glob: *, logs.*, or an exact name")


def _line() -> str:
    line = sys.stdin.readline() if sys.stdin is not None else ""
    if not line:
        # /dev/null, a closed pipe: no line at all is not an empty password.
        raise ValueError("stdin ended before the password line (--password-stdin)")
    return line.removesuffix("\n").removesuffix("\r")


def _password(from_stdin: bool) -> str:
    if from_stdin:
        password = _line()
    else:
        password = getpass.getpass("Password: ")
        if getpass.getpass("Again: ") != password:
            raise ValueError("the passwords differ")
    if not password:
        raise ValueError("empty password")
    return password


# --- on a config database (-c) ---------------------------------------------------------------


def _local(args: argparse.Namespace) -> int:
    if args.area != "user":
        raise ValueError(f"-c works on users only; '{args.area}' needs a running broker (--url)")
    if args.action != "add" and not args.config_db.exists():
        raise ValueError(f"no config database at {args.config_db}")
    users = Users(args.config_db)
    try:
        match args.action:
            case "add":
                users.add(args.name, _password(args.password_stdin), args.iterations)
            case "remove":
                if not users.remove(args.name):
                    print(f"{PROG}: no user {args.name!r}", file=sys.stderr)
                    return 1
            case "list":
                for name in users.names():
                    rules = users.rules(name)
                    said = " ".join(
                        f"{'allow' if allow else 'deny'}:{kind}:{pattern}"
                        for kind, pattern, allow in rules
                    )
                    print(f"{name}\t{said}" if said else name)
            case "allow":
                users.allow(args.name, args.kind, args.pattern)
            case "deny":
                users.deny(args.name, args.kind, args.pattern)
    finally:
        users.close()
    return 0


# --- over HTTP ---------------------------------------------------------------------------------


def _client(args: argparse.Namespace) -> AdminClient:
    token = args.token or os.environ.get(TOKEN_ENV) or None
    password = None
    if args.user is not None and token is None:
        if args.admin_password_stdin:
            password = _line()
        elif PASSWORD_ENV in os.environ:
            password = os.environ[PASSWORD_ENV]
        elif sys.stdin.isatty():
            password = getpass.getpass(f"{args.user}'s password: ")
        else:
            raise ValueError(f"--user needs a password: --password-stdin or ${PASSWORD_ENV}")
    if args.timeout <= 0:
        raise ValueError("--timeout must be more than 0")
    return AdminClient(
        args.url,
        token=token,
        user=args.user,
        password=password,
        timeout=args.timeout,
        **tls_options(args),
    )


def _payload(args: argparse.Namespace) -> str | bytes:
    if args.file is not None:
        if args.payload is not None:
            raise ValueError("give the payload or --file, not both")
        if str(args.file) == "-":
            # Bounded: an endless stdin (/dev/zero, `yes`) is no message.
            data = sys.stdin.buffer.read(MAX_MESSAGE_SIZE + 1) if sys.stdin is not None else b""
            if len(data) > MAX_MESSAGE_SIZE:
                raise ValueError(f"--file -: stdin is over {MAX_MESSAGE_SIZE} bytes")
            return data
        path: Path = args.file
        try:
            return path.read_bytes()
        except OSError as exc:
            raise ValueError(f"--file {path}: {exc.strerror or exc}") from None
    if args.payload is None:
        raise ValueError("give the payload, or --file")
    payload: str = args.payload
    return payload


def _call(admin: AdminClient, args: argparse.Namespace) -> dict[str, Any]:
    """The API call the command names; the broker's whole answer."""
    area, action = args.area, getattr(args, "action", None)
    match (area, action):
        case ("status" | "queues" | "bindings" | "peers" | "users" | "topics", _):
            return admin.get(area)
        case ("queue", "create"):
            return admin.create_queue(
                args.name,
                type=args.type,
                policy=args.policy,
                public=args.public,
                permanent=args.permanent,
                backlog_limit=args.backlog_limit,
                fsync=args.fsync,
            )
        case ("queue", "delete"):
            return admin.delete_queue(args.name, force=args.force)
        case ("queue", "purge"):
            return admin.post("queues/purge", {"name": args.name})
        case ("queue", "peek"):
            return admin.get("queues/peek", name=args.name, count=args.count)
        case ("binding", "add"):
            return admin.bind(args.exchange, args.program, args.queue, permanent=args.permanent)
        case ("binding", "remove"):
            return admin.unbind(args.exchange, args.program, args.queue)
        case ("publish", _):
            return admin.publish(args.exchange, args.route, _payload(args), sender=args.sender)
        case ("checkpoints", _):
            return admin.get("checkpoints", queue=args.queue)
        case ("checkpoint", "add"):
            return admin.add_checkpoint(args.queue, args.name, args.position)
        case ("checkpoint", "remove"):
            return admin.remove_checkpoint(args.queue, args.name)
        case ("checkpoint", "reset"):
            return admin.reset_checkpoint(args.queue, args.name)
        case ("peer", "add"):
            password = _line() if args.peer_password_stdin else ""
            return admin.add_peer(
                args.host,
                args.exchange,
                args.source,
                port=args.port,
                password=password,
                program=args.program,
                permanent=args.permanent,
            )
        case ("peer", "remove"):
            removed = admin.remove_peer(
                args.host, args.exchange, port=args.port, program=args.program, source=args.source
            )
            return {"status": "success", "removed": removed}
        case ("user", "list"):
            return admin.get("users")
        case ("user", "add"):
            password = _password(args.password_stdin)
            return admin.add_user(args.name, password, iterations=args.iterations)
        case ("user", "remove"):
            return admin.remove_user(args.name)
        case ("user", "allow"):
            return admin.allow(args.name, args.kind, args.pattern)
        case ("user", "deny"):
            return admin.deny(args.name, args.kind, args.pattern)
    raise ValueError(f"unknown command {area} {action or ''}".strip())


def _remote(args: argparse.Namespace) -> int:
    admin = _client(args)
    try:
        answer = _call(admin, args)
    except AdminError as exc:
        if exc.status == 400:  # the request was bad: the same exit as a bad flag
            raise ValueError(exc.text) from None
        raise
    if args.json:
        print(json.dumps(answer, indent=2, ensure_ascii=False))
    else:
        area = (
            "users" if (args.area, getattr(args, "action", None)) == ("user", "list") else args.area
        )
        print_answer(area, getattr(args, "action", None), answer)
    return 0


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.config_db is not None:
            return _local(args)
        return _remote(args)
    except EOFError:
        print(f"{PROG}: cancelled", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader (head, grep -q) is gone: nothing left to say, and no one to say it to.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_script(
        PROG,
        _main,
        argv,
        usage_errors=(ValueError, sqlite3.Error),
        failures=(OSError, BrokerError),
    )


if __name__ == "__main__":
    sys.exit(main())
