"""The admin API's queues and bindings (docs/admin.md); routes filed in base.py's table.

A queue made here is what an fq client's attach would make from the same queue field
(``NAME\\0TYPE:ATTRIBUTES``, parsed by the same parser), stored in fqd's sqlite ``queue``
table when permanent. A binding is made by the catalog's bind, as a command channel's
BIND: permanent ones into permanent queues land in the ``binding`` table and come back
after a restart. Peek reads a queue's next messages without taking them: no consumer's
cursor, no checkpoint, no order changes. Purge drops the backlog (docs/admin.md says what
that means for a disk queue and its checkpoints).
"""

from __future__ import annotations

import base64
import contextlib
from typing import Any, Protocol, runtime_checkable

from fqbroker.core.bindflags import BIND_ILLEGAL, BindFlags
from fqbroker.core.frames import peer_fields
from fqbroker.core.program import compile_program
from fqbroker.core.queue import Queue
from fqbroker.core.queuespec import MAX_QUEUE_NAME, QueueKind, parse_queue_field
from fqbroker.errors import AuthError, ProgramError, QueueError
from fqbroker.frontends.http.admin.base import Params, Refused, changed, route, text
from fqbroker.frontends.http.host import HttpHost
from fqbroker.storage.store import disk_log

__all__ = ["MAX_PEEK", "queue_json"]

DEFAULT_PEEK = 10
MAX_PEEK = 100


@runtime_checkable
class Closable(Protocol):
    """A queue's client (an fq command session) as a forced delete ends it."""

    def close(self) -> None: ...


def find_queue(broker: HttpHost, params: Params, key: str = "name") -> Queue:
    name = params.name(key, limit=MAX_QUEUE_NAME)
    queue = broker.queues.get(name)
    if queue is None:
        raise Refused(404, f"no queue {text(name)!r}")
    return queue


def queue_json(queue: Queue) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": text(queue.name),
        "type": str(queue.kind),
        "policy": str(queue.policy),
        "public": not queue.private,
        "permanent": queue.permanent,
        "backlog": queue.backlog,
        "backlog_limit": queue.backlog_limit,
        "clients": len(queue.clients),
        "max_clients": queue.max_clients,
        "dropped": queue.dropped_to,
    }
    if queue.kind is QueueKind.DISK:
        out["fsync"] = queue.fsync
        out["size_bytes"] = getattr(queue.store, "size_bytes", None)
        try:
            out["checkpoints"] = sorted(disk_log(queue).checkpoints)
        except (TypeError, ValueError, OSError):
            out["checkpoints"] = []
    else:
        out["backlog_bytes"] = queue.store.held_bytes
    return out


# --- queues ------------------------------------------------------------------------------------


@route("GET", "queues")
async def _queues(broker: HttpHost, params: Params, who: str) -> dict[str, Any]:
    queues = sorted(broker.queues.values(), key=lambda q: q.name)
    return {"queues": [queue_json(q) for q in queues]}


@route("POST", "queues/create")
async def _create(broker: HttpHost, params: Params, who: str) -> dict[str, Any]:
    name = params.name("name", limit=MAX_QUEUE_NAME)
    if b"\x00" in name:
        raise Refused(400, "a queue name holds no NUL")
    kind = params.choice("type", "mem", ("mem", "disk"))
    policy = params.choice("policy", "drop", ("drop", "block", "reject"))
    public = params.flag("public", False)
    permanent = params.flag("permanent", False)
    attributes = ["public" if public else "private", policy]
    attributes.append("permanent" if permanent else "transient")
    if "backlog_limit" in params.values:
        attributes.append(f"backlog={params.number('backlog_limit', None, high=0xFFFFFFFF)}")
    if "fsync" in params.values:
        attributes.append("fsync=" + params.choice("fsync", "", ("always", "interval", "never")))
    # The queue field an fq client would send: the same parser decides what it means.
    field = name + b"\x00" + f"{kind}:{','.join(attributes)}".encode()
    try:
        spec = parse_queue_field(field)
    except AuthError as exc:
        raise Refused(400, exc.text.strip()) from None
    if spec.name in broker.queues:
        raise Refused(409, f"queue {text(name)!r} exists")
    try:
        queue = broker.catalog.create(spec)
    except QueueError as exc:
        raise Refused(409, exc.text.strip()) from None
    changed(who, "created queue %r (%s)", name, spec.attributes)
    return {"queue": queue_json(queue)}


@route("POST", "queues/delete")
async def _delete(broker: HttpHost, params: Params, who: str) -> dict[str, Any]:
    queue = find_queue(broker, params)
    force = params.flag("force", False)
    clients = list(queue.clients)
    if clients and not force:
        raise Refused(
            409, f'queue {text(queue.name)!r} has {len(clients)} client(s); "force": true ends them'
        )
    broker.catalog.remove(queue)  # transient now: it goes with the last client's leaving
    for client in clients:
        if isinstance(client, Closable):
            client.close()
    # Normally gone by now (a session's close detaches at once); if not, when they leave.
    gone = broker.queues.get(queue.name) is not queue
    changed(who, "deleted queue %r (%d clients ended)", queue.name, len(clients))
    return {"deleted": text(queue.name), "clients_closed": len(clients), "gone": gone}


@route("POST", "queues/purge")
async def _purge(broker: HttpHost, params: Params, who: str) -> dict[str, Any]:
    queue = find_queue(broker, params)
    try:
        purged = queue.purge()
    except OSError as exc:  # a disk queue's checkpoint could not be written
        raise Refused(409, f"cannot purge queue {text(queue.name)!r}: {exc}") from None
    changed(who, "purged %d messages from queue %r", purged, queue.name)
    return {"purged": purged}


@route("GET", "queues/peek")
async def _peek(broker: HttpHost, params: Params, who: str) -> dict[str, Any]:
    queue = find_queue(broker, params)
    count = min(params.number("count", DEFAULT_PEEK, low=1), MAX_PEEK)
    try:
        frames = queue.peek(count)
    except OSError as exc:
        raise Refused(409, f"cannot read queue {text(queue.name)!r}: {exc}") from None
    return {
        "queue": text(queue.name),
        "backlog": queue.backlog,
        "messages": [_message(f) for f in frames],
    }


def _message(frame: bytes) -> dict[str, Any]:
    exchange, route_, payload, msgid, sender, hops = peer_fields(frame)
    out: dict[str, Any] = {
        "exchange": text(exchange),
        "route": text(route_),
        "sender": text(sender),
        "msgid": msgid.hex(),
        "hops": [".".join(str(b) for b in hops[i : i + 4]) for i in range(0, len(hops), 4)],
        "size": len(payload),
        "payload_base64": base64.b64encode(payload).decode("ascii"),
    }
    with contextlib.suppress(UnicodeDecodeError):  # for people; scripts use the base64
        out["payload"] = payload.decode("utf-8")
    return out


# --- bindings ----------------------------------------------------------------------------------


@route("GET", "bindings")
async def _bindings(broker: HttpHost, params: Params, who: str) -> dict[str, Any]:
    out = []
    for binding in broker.router.bindings():
        queue = binding.queue
        if not isinstance(queue, Queue):
            continue
        out.append(
            {
                "id": binding.route_id,
                "exchange": text(binding.exchange.name),
                "program": text(binding.program.text),
                "queue": text(queue.name),
                "permanent": binding.permanent,
                "stored": binding.permanent and queue.permanent,
                "peer": binding.peer,
            }
        )
    out.sort(key=lambda b: (b["exchange"], b["queue"], b["program"]))
    return {"bindings": out}


@route("POST", "bindings/add")
async def _bind(broker: HttpHost, params: Params, who: str) -> dict[str, Any]:
    exchange = params.name("exchange")
    program = params.name("program", limit=0xFFFF)
    queue = find_queue(broker, params, "queue")
    permanent = params.flag("permanent", False)
    try:
        compile_program(program, broker.router.registry)
    except ProgramError as exc:
        raise Refused(400, f"the program does not compile: {exc}") from None
    # A command channel's BIND: the catalog stores a permanent binding of a permanent queue.
    flags = BindFlags.PERM if permanent else BindFlags.TRANS
    limits, user = broker.limits, who.encode()
    new = limits.bound(broker.router, exchange, program, queue) is None
    if new and not limits.admit_binding(exchange, queue, user):
        raise Refused(409, "too many bindings (max_bindings_per_queue, max_bindings_per_user)")
    route_id = broker.catalog.bind(exchange, program, queue, flags)
    if route_id == BIND_ILLEGAL:
        raise Refused(400, "the program does not compile")
    if new:
        limits.charge_binding(user, broker.router.exchanges[exchange].bindings[route_id])
    changed(who, "bound %r on %r to queue %r (%s)", program, exchange, queue.name,
            "permanent" if permanent else "transient")  # fmt: skip
    return {
        "binding": {
            "id": route_id,
            "exchange": text(exchange),
            "program": text(program),
            "queue": text(queue.name),
            "permanent": permanent,
            "stored": permanent and queue.permanent,
        }
    }


@route("POST", "bindings/remove")
async def _unbind(broker: HttpHost, params: Params, who: str) -> dict[str, Any]:
    exchange = params.name("exchange")
    program = params.name("program", limit=0xFFFF)
    queue = find_queue(broker, params, "queue")
    for binding in list(broker.router.bindings()):
        if (
            binding.queue is queue
            and binding.exchange.name == exchange
            and binding.program.text == program
        ):
            broker.catalog.unbind(exchange, binding.route_id, queue)
            changed(who, "unbound %r on %r from queue %r", program, exchange, queue.name)
            return {"removed": binding.route_id}
    raise Refused(
        404, f"no binding of {text(program)!r} on {text(exchange)!r} to {text(queue.name)!r}"
    )
