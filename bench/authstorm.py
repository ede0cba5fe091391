"""``make authstorm``: authenticated connections per second under auth = "password".

``python -m bench.authstorm [--clients 500] [--users 500] [--seconds 10] [--json FILE]``

First logins of every client at once, then a reconnect storm, against a broker with
passwords and one without (docs/bench.md, "Authentication storm"). Exit status 1 when a
connection was refused or timed out, the first logins took over 60 s, or the broker died.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from fqbroker.clients.fq.client import Client
from fqbroker.protocols.fq import wire
from fqbroker.storage.configdb.users import Users

from .child import Broker, add_run_options, print_verdict, raise_nofile, run_main, run_parser

FIRST_LOGINS_LIMIT = 60.0


def make_users(db: Path, count: int) -> None:
    users = Users(db)
    for i in range(count):
        users.add(f"u{i}", f"password-{i}")
        for kind in ("publish", "consume", "queue"):
            users.allow(f"u{i}", kind, "*")
    users.close()


async def one_mode(args: argparse.Namespace, auth: str) -> dict[str, Any]:
    state = Path(args.state) / auth
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    if auth == "password":
        await asyncio.to_thread(make_users, state / "fqd.sqlite", args.users)
    broker = Broker(state, {"auth": f'"{auth}"', **dict(args.setting)}, list(args.fqd_arg))
    await asyncio.to_thread(broker.start)
    errors: Counter[str] = Counter()

    def client(i: int) -> Client:
        user = i % args.users
        return Client(
            "127.0.0.1", broker.port, f"u{user}/aq{i}/mem:private", f"password-{user}",
            reconnect=False, connect_timeout=FIRST_LOGINS_LIMIT,
        )  # fmt: skip

    async def first(i: int) -> Client | None:
        c = client(i)
        try:
            await c.connect()
        except Exception as exc:  # counted by kind; the others go on
            errors[f"first login: {type(exc).__name__}: {str(exc)[:60]}"] += 1
            return None
        return c

    cycles = 0

    async def reconnecting(i: int, deadline: float) -> None:
        nonlocal cycles
        while time.monotonic() < deadline:
            c = client(i)
            try:
                await c.connect()
                if await c.bind(b"auth.storm", b'prefix:"c%d."' % i) == wire.BIND_ILLEGAL:
                    errors["bind refused"] += 1
                c.publish(b"auth.storm", b"c%d.x" % i, b"storm")
                await c.close()
                cycles += 1
            except Exception as exc:
                errors[f"storm: {type(exc).__name__}: {str(exc)[:60]}"] += 1
                with contextlib.suppress(Exception):
                    await c.close()

    try:
        start = time.monotonic()
        connected = await asyncio.gather(*(first(i) for i in range(args.clients)))
        first_seconds = time.monotonic() - start
        await asyncio.gather(*(c.close() for c in connected if c is not None))
        start = time.monotonic()
        deadline = start + args.seconds
        await asyncio.gather(*(reconnecting(i, deadline) for i in range(args.clients)))
        storm_seconds = time.monotonic() - start
        alive = broker.alive()
        tracebacks = broker.tracebacks()
    finally:
        status = await asyncio.to_thread(broker.stop)
    return {
        "auth": auth,
        "first_logins_seconds": round(first_seconds, 2),
        "first_logins_per_second": round(args.clients / first_seconds),
        "cycles": cycles,
        "connections_per_second": round(cycles / storm_seconds),
        "errors": dict(errors),
        "alive": alive,
        "tracebacks": tracebacks,
        "exit_status": status,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    raise_nofile()
    print(
        f"authstorm: {args.clients} clients as {args.users} users, storm of {args.seconds} s",
        flush=True,
    )
    modes = [await one_mode(args, "password"), await one_mode(args, "none")]
    failures = []
    for m in modes:
        if m["errors"]:
            failures.append(f"auth = {m['auth']}: {m['errors']}")
        if m["first_logins_seconds"] > FIRST_LOGINS_LIMIT:
            failures.append(f"auth = {m['auth']}: first logins took {m['first_logins_seconds']} s")
        if not m["alive"]:
            failures.append(f"auth = {m['auth']}: the broker died")
        if m["tracebacks"]:
            failures.append(f"auth = {m['auth']}: tracebacks {m['tracebacks']}")
    return {"clients": args.clients, "users": args.users, "modes": modes, "failures": failures}


def print_summary(r: dict[str, Any]) -> None:
    for m in r["modes"]:
        print(
            f"  auth = {m['auth']:8}: {r['clients']} first logins in {m['first_logins_seconds']} s"
            f" ({m['first_logins_per_second']}/s); storm {m['connections_per_second']}"
            f" authenticated connections/s ({m['cycles']:,} cycles), errors {m['errors']}"
        )
    print_verdict("authstorm", r["failures"])


def parser() -> argparse.ArgumentParser:
    p = run_parser("authstorm", __doc__)
    p.add_argument("--clients", type=int, default=500)
    p.add_argument("--users", type=int, default=500, help="distinct users (1 to --clients)")
    p.add_argument("--seconds", type=float, default=10.0)
    add_run_options(p, "authstorm")
    return p


def main(argv: list[str] | None = None) -> int:
    return run_main(parser(), run, print_summary, argv)


if __name__ == "__main__":
    sys.exit(main())
