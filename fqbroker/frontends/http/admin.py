"""The admin API: JSON over HTTP under ``/admin/``, what ``fq-admin`` and the web UI call.

Every path here is an admin path (auth.py: the ``admin_token`` or an admin user, once
either exists); endpoints.py has checked that before :func:`respond` runs. Reads are GET
with their parameters in the query string; changes are POST with a JSON object body (the
listener sniffs GET, HEAD, POST and PUT only). Success is ``{"status": "success", ...}``
with 200; a refusal is ``{"status": "error", "error": "<one line>"}`` with 400 (bad
request), 404 (no such queue, binding, ...), 405 (wrong method) or 409 (a conflict).
docs/admin.md lists every endpoint and what each change promises.

Each change goes through the code path its fq counterpart takes, so an admin's work is
indistinguishable from a client's: queues are made and stored by the catalog as an
attach makes them, bindings by the catalog's bind as a command channel's BIND, messages
published by a publisher as /submit publishes. This module dispatches and answers the
status and publish endpoints; the queues and bindings are in adminqueues.py, checkpoints,
peers, users and topics in adminconfig.py, what they share in adminbase.py.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import resource
import sys
import time
from typing import Any
from urllib.parse import parse_qs

from fqbroker.core.message import Message, runs_of
from fqbroker.frontends.http import adminconfig, adminqueues
from fqbroker.frontends.http.adminbase import PREFIX, ROUTES, Params, Refused, changed, route
from fqbroker.frontends.http.host import HttpHost
from fqbroker.version import FQ_COMPAT_VERSION, __version__

__all__ = ["PREFIX", "body_limit", "respond"]

# Their endpoints are filed in ROUTES as they are imported.
_ENDPOINT_MODULES = (adminqueues, adminconfig)

MAX_BODY_OVERHEAD = 64 * 1024  # a JSON body's room beside a publish's base64 payload


def payload_limit(broker: HttpHost) -> int:
    """The largest payload published here: what /submit takes."""
    return min(broker.settings.max_message_size, broker.settings.http_max_body)


def body_limit(broker: HttpHost) -> int:
    """The largest request body read: a publish's payload in base64, and its fields."""
    return payload_limit(broker) * 4 // 3 + MAX_BODY_OVERHEAD


async def respond(
    broker: HttpHost, method: str, path: str, query: str, body: bytes, who: str
) -> tuple[int, dict[str, Any]]:
    """(status, JSON object) for an admin request; ``who`` names the caller in the log."""
    try:
        found = ROUTES.get(path)
        if found is None:
            raise Refused(404, f"no admin endpoint {path}")
        method = "GET" if method == "HEAD" else method
        if method != found.method:
            raise Refused(405, f"{path} takes {found.method}")
        params = _params(query) if method == "GET" else _body(body)
        answer = await found.handler(broker, params, who)
    except Refused as exc:
        return exc.status, {"status": "error", "error": exc.text}
    return 200, {"status": "success", **answer}


def _params(query: str) -> Params:
    values = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
    return Params(dict(values), from_query=True)


def _body(body: bytes) -> Params:
    if not body.strip():
        return Params({}, from_query=False)
    try:
        values = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Refused(400, f"the body is not JSON: {exc}") from None
    if not isinstance(values, dict):
        raise Refused(400, "the body must be a JSON object")
    return Params(values, from_query=False)


# --- status ------------------------------------------------------------------------------------


@route("GET", "status")
async def _status(broker: HttpHost, params: Params, who: str) -> dict[str, Any]:
    listeners = []
    front_ends = []
    for live in broker.front_ends.values():
        address = None if live.address is None else f"{live.address[0]}:{live.address[1]}"
        if address is not None:
            listeners.append({"name": live.name, "address": address})
        front_ends.append(
            {
                "name": live.name,
                "transport": live.transport,
                "address": address,
                "connections": len(live.connections),
            }
        )
    peers = [
        {
            "host": link.address.host,
            "port": link.address.port,
            "source": link.address.source,
            "state": str(link.state),
            "reconnects": link.reconnects,
        }
        for link in broker.peering.links.values()
    ]
    node = {
        "version": __version__,
        "fq_version": FQ_COMPAT_VERSION,
        "node_id": ".".join(str(b) for b in broker.node_id),  # 4 bytes, written as an IPv4
        "uptime_seconds": _uptime(),
        "rss_bytes": _rss_bytes(),
        "queue_dir": str(broker.settings.queue_dir),
        "queue_dir_bytes": _queue_dir_bytes(broker),
        "queues": len(broker.queues),
        "clients": len(broker.clients),
        "listeners": listeners,
        "front_ends": front_ends,
        "peers": peers,
    }
    return {"node": node}


_IMPORTED = time.time()


def _uptime() -> float:
    """Seconds since the process started (the kernel's count; else since this import)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        with open("/proc/uptime", "rb") as f:
            system_up = float(f.read().split()[0])
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
        return round(max(0.0, system_up - started), 1)
    except (OSError, ValueError, IndexError):
        return round(time.time() - _IMPORTED, 1)


def _rss_bytes() -> int:
    """Resident memory now (Linux), else the peak the kernel reports."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def _queue_dir_bytes(broker: HttpHost) -> int:
    """Bytes of the open disk queues' and topics' segment files: what the stores count
    as they write, so no directory walk (1,000 queues) holds the loop."""
    total = 0
    for queue in broker.queues.values():
        size = getattr(queue.store, "size_bytes", None)
        if isinstance(size, int):
            total += size
    topics = broker.topics
    if topics is not None:
        total += sum(topic.size_bytes for topic in topics)
    return total


# --- publish -----------------------------------------------------------------------------------


@route("POST", "publish")
async def _publish(broker: HttpHost, params: Params, who: str) -> dict[str, Any]:
    exchange = params.name("exchange")
    route_ = params.name("route", allow_empty=True)
    sender = params.name("sender", allow_empty=True) if "sender" in params.values else b"_admin"
    if "payload_base64" in params.values:
        try:
            payload = base64.b64decode(
                params.text("payload_base64", allow_empty=True), validate=True
            )
        except (binascii.Error, ValueError):
            raise Refused(400, "'payload_base64' is not base64") from None
    else:
        payload = params.raw("payload", allow_empty=True)
    if len(payload) > payload_limit(broker):
        raise Refused(400, f"the payload is over {payload_limit(broker)} bytes (http_max_body)")
    # As /submit: the budget holds the payload and its frame while it is routed, and the
    # answer waits until disk queues have it durably (and, under block, for room).
    reserve = 2 * len(payload)
    await broker.budget.acquire(reserve)
    try:
        msg = Message(exchange, route_, payload, broker.msgids.next(), sender, broker.node_id)
        publisher = broker.make_publisher()
        room = publisher.publish(runs_of([msg]), len(payload))
        if not await publisher.durable():
            raise Refused(409, "a disk queue's write failed: the message is not stored")
        if not room:
            await publisher.finish()  # block policy: the answer waits for room
    finally:
        broker.budget.release(reserve)
    result = publisher.stats
    changed(who, "published %d bytes to %r route %r", len(payload), exchange, route_)
    return {
        "published": 1,
        "routed": result.routed,
        "dropped": result.dropped,
        "no_route": result.no_route,
        "no_exchange": result.no_exchange,
    }
