"""``fq-admin``: administer a broker's config database (users and permissions, P12).

Works on the sqlite file named with ``-c``, as fqd's flag names it; a running broker
reads the changes on its next connection, without a restart (storage/users.py)::

    fq-admin -c DB user add NAME [--password-stdin] [--iterations N]
    fq-admin -c DB user remove NAME
    fq-admin -c DB user list
    fq-admin -c DB user allow NAME KIND PATTERN
    fq-admin -c DB user deny NAME KIND PATTERN

KIND is publish (exchange pattern), consume (bind on an exchange pattern), queue (attach
to a queue-name pattern) or admin (pattern ``*``). A password comes from a prompt, or
from one line of stdin with ``--password-stdin``, never from the command line (where
``ps`` and shell history would show it).
"""

from __future__ import annotations

import argparse
import getpass
import sqlite3
import sys
from pathlib import Path

from fqbroker.core.permissions import KINDS
from fqbroker.storage.users import DEFAULT_ITERATIONS, Users

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fq-admin", description="administer an fqbroker")
    p.add_argument(
        "-c",
        "--config-db",
        type=Path,
        default=Path("var/fqd.sqlite"),
        help="sqlite configuration database (fqd's -c; default var/fqd.sqlite)",
    )
    top = p.add_subparsers(dest="area", required=True)
    user = top.add_parser("user", help="users and their permissions").add_subparsers(
        dest="action", required=True
    )
    add = user.add_parser("add", help="add a user, or set a user's password")
    add.add_argument("name")
    add.add_argument(
        "--password-stdin", action="store_true", help="read the password from one line of stdin"
    )
    add.add_argument(
        "--iterations",
        type=int,
        default=DEFAULT_ITERATIONS,
        help=f"PBKDF2 iterations (default {DEFAULT_ITERATIONS}; docs/security.md)",
    )
    user.add_parser("remove", help="remove a user and its permissions").add_argument("name")
    user.add_parser("list", help="list users and their permissions")
    for verb in ("allow", "deny"):
        rule = user.add_parser(verb, help=f"{verb} a user KIND on names matching PATTERN")
        rule.add_argument("name")
        rule.add_argument("kind", choices=KINDS)
        rule.add_argument("pattern", help="a glob: *, logs.*, or an exact name")
    return p


def _password(from_stdin: bool) -> str:
    if from_stdin:
        line = sys.stdin.readline()
        password = line[:-1] if line.endswith("\n") else line
        password = password.removesuffix("\r")
    else:
        password = getpass.getpass("Password: ")
        if getpass.getpass("Again: ") != password:
            raise ValueError("the passwords differ")
    if not password:
        raise ValueError("empty password")
    return password


def _run(args: argparse.Namespace) -> int:
    if args.action != "add" and not args.config_db.exists():
        raise ValueError(f"no config database at {args.config_db}")
    users = Users(args.config_db)
    try:
        match args.action:
            case "add":
                users.add(args.name, _password(args.password_stdin), args.iterations)
            case "remove":
                if not users.remove(args.name):
                    print(f"fq-admin: no user {args.name!r}", file=sys.stderr)
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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except (ValueError, OSError, sqlite3.Error) as exc:  # one line, no traceback
        print(f"fq-admin: {exc}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, EOFError):
        print("fq-admin: cancelled", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
