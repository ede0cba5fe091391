"""The admin API: JSON over HTTP under ``/admin/``, what ``fq-admin`` and the web UI call.

Each change goes through the code path its fq counterpart takes, so an admin's work is
indistinguishable from a client's: queues are made and stored by the catalog as an attach
makes them, bindings by the catalog's bind as a command channel's BIND, messages by a
publisher as /submit publishes (docs/admin.md lists every endpoint and what each promises).
This module answers the status and publish endpoints; :mod:`.queues` has queues and
bindings, :mod:`.config` checkpoints, peers, users and topics, :mod:`.base` what they share.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any
from urllib.parse import parse_qs

from fqbroker.core.message import Message, runs_of
from fqbroker.frontends.http.admin import config as adminconfig
from fqbroker.frontends.http.admin import queues as adminqueues
from fqbroker.frontends.http.admin.base import PREFIX, ROUTES, Params, Refused, changed, route
from fqbroker.frontends.http.host import HttpHost
from fqbroker.frontends.http.stats.node import node_status
from fqbroker.frontends.http.submit import failure_status

__all__ = ["PREFIX", "allowed_methods", "body_limit", "respond"]

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
    """(status, JSON object) for an admin request; ``who`` names the caller in the log.

    Every path here is an admin path (:mod:`fqbroker.frontends.http.auth`: the
    ``admin_token`` or an admin user, once either exists), checked before this runs. Reads
    are GET with their parameters in the query string; changes are POST with a JSON object
    body, ``Content-Type: application/json`` (checked before this runs, with the request's
    origin: docs/security.md; the listener sniffs GET, HEAD, POST and PUT only). Success is
    ``{"status": "success", ...}`` with 200; a refusal is
    ``{"status": "error", "error": "<one line>"}`` with 400 (bad request), 404 (no such
    queue, binding, ...), 405 (wrong method) or 409 (a conflict).
    """
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


def allowed_methods(path: str) -> str:
    """The methods ``path`` takes, as a 405's ``Allow`` header says them."""
    found = ROUTES.get(path)
    if found is None or found.method == "GET":
        return "GET, HEAD"
    return found.method


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
    # /node.json's account of the node: the web UI and fq-admin read one and the same.
    return {"node": await node_status(broker)}


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
    # answer is the publisher's confirm: written, durable, refused by no reject queue,
    # after room under the block policy.
    reserve = 2 * len(payload)
    await broker.budget.acquire(reserve)
    try:
        msg = Message(exchange, route_, payload, broker.msgids.next(), sender, broker.node_id)
        publisher = broker.make_publisher()
        await publisher.publish_all(runs_of([msg]), len(payload))
        why = await publisher.confirm(publisher.handled)
    finally:
        broker.budget.release(reserve)
    if why is not None:
        raise Refused(failure_status(why), why)
    result = publisher.stats
    changed(who, "published %d bytes to %r route %r", len(payload), exchange, route_)
    return {
        "published": 1,
        "routed": result.routed,
        "dropped": result.dropped,
        "no_route": result.no_route,
        "no_exchange": result.no_exchange,
    }
