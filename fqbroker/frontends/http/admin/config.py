"""The admin API's checkpoints, peers, users and topics (docs/admin.md).

Checkpoints go through the functions fqd's /add_checkpoint and friends use
(storage/configdb/checkpoints.py), with their texts; peers are rows of fqd's sqlite ``upstream``
table, applied at once as the next poll would apply them; users are the user and permission
tables (storage/configdb/users.py) as ``fq-admin -c DB user ...`` changes them; topics are
read only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

from fqbroker.core.permissions import KINDS
from fqbroker.core.queue import Queue
from fqbroker.core.queuespec import QueueKind
from fqbroker.errors import CheckpointError
from fqbroker.frontends.http.admin.base import Params, Refused, changed, route, text
from fqbroker.frontends.http.admin.queues import find_queue
from fqbroker.frontends.http.host import HttpHost, UsersAdminView
from fqbroker.settings.broker import Upstream
from fqbroker.storage.configdb import checkpoints
from fqbroker.storage.configdb.users import (
    DEFAULT_ITERATIONS,
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    Users,
)
from fqbroker.storage.store import disk_log

__all__: list[str] = []

READER = checkpoints.RESERVED  # the broker's own reader: shown, never changed here
MAX_HOST = 255


# --- checkpoints -------------------------------------------------------------------------------


def _checkpoint_rows(queue: Queue) -> dict[str, Any]:
    log = disk_log(queue)
    end = log.next_seq
    rows = [
        {
            "name": name,
            "position": checkpoints.format_position(seq),
            "seq": seq,
            "behind": max(0, end - max(seq, log.first_seq)),  # messages from it to the end
            "reader": name == READER,
        }
        for name, seq in sorted(log.checkpoints.items())
    ]
    return {
        "queue": text(queue.name),
        "first": checkpoints.format_position(log.first_seq),
        "next": checkpoints.format_position(end),
        "checkpoints": rows,
    }


@route("GET", "checkpoints")
async def _checkpoints(broker: HttpHost, params: Params, who: str) -> dict[str, Any]:
    if "queue" in params.values:
        queue = find_queue(broker, params, "queue")
        if queue.kind is not QueueKind.DISK:
            raise Refused(400, f"queue {text(queue.name)!r} is a memory queue: no checkpoints")
        return {"queues": [_checkpoint_rows(queue)]}
    disk = [q for q in broker.queues.values() if q.kind is QueueKind.DISK]
    return {"queues": [_checkpoint_rows(q) for q in sorted(disk, key=lambda q: q.name)]}


def _checkpoint_refused(exc: CheckpointError) -> Refused:
    message = exc.message
    missing = message.startswith("Cannot find") or message == "Checkpoint does not exist"
    return Refused(404 if missing else 400, message)


@route("POST", "checkpoints/add")
async def _checkpoint_add(broker: HttpHost, params: Params, who: str) -> dict[str, Any]:
    queue = find_queue(broker, params, "queue")
    name = params.text("name")
    position = params.values.get("position")
    if position is None:
        # Where the broker's consumers read now: a bookmark to come back to.
        if queue.kind is QueueKind.DISK:
            log = disk_log(queue)
            seq = max(log.checkpoints.get(READER, log.first_seq), log.first_seq)
            position = checkpoints.format_position(seq)
        else:
            position = "0:0"  # refused below with fqd's text for a memory queue
    if not isinstance(position, str):
        raise Refused(400, "'position' must be a string LOG:MARKER")
    try:
        message = checkpoints.add_checkpoint(broker, name, text(queue.name), position)
    except CheckpointError as exc:
        raise _checkpoint_refused(exc) from None
    changed(who, "checkpoint %r of queue %r set at %s", name, queue.name, position)
    return {"message": message, "position": position}


@route("POST", "checkpoints/remove")
async def _checkpoint_remove(broker: HttpHost, params: Params, who: str) -> dict[str, Any]:
    queue = find_queue(broker, params, "queue")
    name = params.text("name")
    try:
        message = checkpoints.remove_checkpoint(broker, name, text(queue.name))
    except CheckpointError as exc:
        raise _checkpoint_refused(exc) from None
    changed(who, "checkpoint %r of queue %r removed", name, queue.name)
    return {"message": message}


@route("POST", "checkpoints/reset")
async def _checkpoint_reset(broker: HttpHost, params: Params, who: str) -> dict[str, Any]:
    queue = find_queue(broker, params, "queue")
    name = params.text("name")
    try:
        message = checkpoints.reset_to_checkpoint(broker, name, text(queue.name))
    except CheckpointError as exc:
        raise _checkpoint_refused(exc) from None
    changed(who, "queue %r reset to checkpoint %r", queue.name, name)
    return {"message": message, "backlog": queue.backlog}


# --- peers (upstream rows) ---------------------------------------------------------------------


def _row_json(row: Upstream, origin: str) -> dict[str, Any]:
    return {
        "host": row.host,
        "port": row.port,
        "source": row.source,
        "password_set": bool(row.password),  # never the password itself
        "exchange": text(row.exchange),
        "program": text(row.program),
        "permanent": row.permanent_binding,
        "tls": row.tls,
        "origin": origin,
    }


@route("GET", "peers")
async def _peers(broker: HttpHost, params: Params, who: str) -> dict[str, Any]:
    links = {
        (link.address.host, link.address.port, link.address.source): link
        for link in broker.peering.links.values()
    }
    rows = [_row_json(r, "config_file") for r in broker.settings.upstream]
    rows += [_row_json(r, "config_db") for r in broker.catalog.config.upstreams()]
    for row in rows:
        link = links.get((row["host"], row["port"], row["source"]))
        row["state"] = None if link is None else str(link.state)
        if link is not None:
            bound = {
                (text(b.exchange), text(b.program)): route_id for b, route_id in link.bound.items()
            }
            row["route_id"] = bound.get((row["exchange"], row["program"]))
    return {"peers": rows}


def _port(params: Params) -> int:
    return params.number("port", 8765, low=1, high=65535)


def _host(params: Params) -> str:
    host = params.text("host")
    if len(host) > MAX_HOST or any(c.isspace() for c in host):
        raise Refused(400, "'host' must be a host name or address")
    return host


@route("POST", "peers/add")
async def _peer_add(broker: HttpHost, params: Params, who: str) -> dict[str, Any]:
    row = Upstream(
        host=_host(params),
        port=_port(params),
        source=params.text("source"),
        password=params.text("password", default="", allow_empty=True),
        exchange=params.name("exchange"),
        # Default: every message of the exchange (an empty program binds nothing upstream).
        program=params.name("program", limit=0xFFFF) if "program" in params.values else b"prefix:",
        permanent_binding=params.flag("permanent", False),
    )
    if not broker.catalog.config.add_upstream(row):
        raise Refused(409, "that upstream row exists")
    await broker.peering.reconcile()
    changed(who, "upstream %s:%d exchange %r added", row.host, row.port, row.exchange)
    return {"peer": _row_json(row, "config_db")}


@route("POST", "peers/remove")
async def _peer_remove(broker: HttpHost, params: Params, who: str) -> dict[str, Any]:
    host, port = _host(params), _port(params)
    exchange = params.name("exchange")
    program = params.name("program", limit=0xFFFF, allow_empty=True) if (
        "program" in params.values
    ) else None  # fmt: skip
    source = params.text("source") if "source" in params.values else None
    removed = broker.catalog.config.delete_upstreams(host, port, exchange, program, source)
    if not removed:
        in_file = any(
            r.host == host and r.port == port and r.exchange == exchange
            for r in broker.settings.upstream
        )
        if in_file:
            raise Refused(409, "that upstream is in the config file: edit it there")
        raise Refused(404, f"no upstream row for {host}:{port} exchange {text(exchange)!r}")
    await broker.peering.reconcile()
    changed(who, "upstream %s:%d exchange %r removed (%d rows)", host, port, exchange, removed)
    return {"removed": removed}


# --- users (docs/security.md, docs/permissions.md) ---------------------------------------------


@contextlib.contextmanager
def _users(broker: HttpHost) -> Iterator[UsersAdminView]:
    """The broker's user table; under auth = "none" the config database's, opened for the
    request, so users can be made before the broker is switched to passwords."""
    if broker.users is not None:
        yield broker.users
        return
    users = Users(broker.settings.config_db)
    try:
        yield users
    finally:
        users.close()


@route("GET", "users")
async def _users_list(broker: HttpHost, params: Params, who: str) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    with _users(broker) as users:
        for name in users.names():
            rules = users.rules(name)
            rows.append(
                {
                    "name": name,
                    "admin": any(kind == "admin" and allow for kind, _, allow in rules),
                    "rules": [
                        {"kind": kind, "pattern": pattern, "allow": allow}
                        for kind, pattern, allow in rules
                    ],
                }
            )
    return {"auth": broker.settings.auth, "users": rows}


@route("POST", "users/add")
async def _user_add(broker: HttpHost, params: Params, who: str) -> dict[str, Any]:
    name = params.text("name")
    password = params.text("password")
    iterations = params.number(
        "iterations", DEFAULT_ITERATIONS, low=MIN_ITERATIONS, high=MAX_ITERATIONS
    )
    with _users(broker) as users:
        existed = name in users.names()
        try:
            # PBKDF2 in a thread: a high iteration count must not stall the loop.
            await asyncio.to_thread(users.add, name, password, iterations)
        except ValueError as exc:
            raise Refused(400, str(exc)) from None
    changed(who, "user %r %s", name, "given a new password" if existed else "added")
    return {"user": name, "created": not existed}


@route("POST", "users/remove")
async def _user_remove(broker: HttpHost, params: Params, who: str) -> dict[str, Any]:
    name = params.text("name")
    with _users(broker) as users:
        if not users.remove(name):
            raise Refused(404, f"no user {name!r}")
    changed(who, "user %r removed", name)
    return {"removed": name}


async def _rule(broker: HttpHost, params: Params, who: str, allow: bool) -> dict[str, Any]:
    name = params.text("name")
    kind = params.choice("kind", "", KINDS)
    pattern = params.text("pattern")
    with _users(broker) as users:
        if name not in users.names():
            raise Refused(404, f"no user {name!r}: add it first")
        try:
            (users.allow if allow else users.deny)(name, kind, pattern)
        except ValueError as exc:
            raise Refused(400, str(exc)) from None
    verb = "allow" if allow else "deny"
    changed(who, "user %r: %s %s %r", name, verb, kind, pattern)
    return {"user": name, "rule": {"kind": kind, "pattern": pattern, "allow": allow}}


@route("POST", "users/allow")
async def _user_allow(broker: HttpHost, params: Params, who: str) -> dict[str, Any]:
    return await _rule(broker, params, who, True)


@route("POST", "users/deny")
async def _user_deny(broker: HttpHost, params: Params, who: str) -> dict[str, Any]:
    return await _rule(broker, params, who, False)


# --- topics (docs/topics.md) -------------------------------------------------------------------


@route("GET", "topics")
async def _topics(broker: HttpHost, params: Params, who: str) -> dict[str, Any]:
    topics = broker.topics
    if topics is None:
        return {"configured": False, "topics": []}
    rows = [
        {
            "name": text(topic.name),
            "first": topic.first_offset,
            "next": topic.last_offset,
            "messages": topic.last_offset - topic.first_offset,
            "size_bytes": topic.size_bytes,
            "messages_in": topic.messages_in,
            "subscribers": len(topic.subscribers),
        }
        for topic in sorted(topics, key=lambda t: t.name)
    ]
    return {"configured": True, "topics": rows}
