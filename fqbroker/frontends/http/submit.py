"""``POST /submit``: one message published, answered as a publisher confirm is (fqd_http.c).

The body is one message; the ``X-Fq-*`` headers name its route, exchange and sender
(docs/fq-protocol.md §4.2), and ``X-Fq-Msg-Id`` (ours) an id to de-duplicate it by. It
goes through a :class:`~fqbroker.core.publisher.Publisher` like every other publish, and
the answer is that publisher's confirm of it (:meth:`Publisher.confirm`): ``200`` only
when an fq confirm of the same message would succeed, else the confirm's reason with a
status that says who can fix it (docs/http.md, docs/confirms.md). fqd's own refusals
(headers, body) keep fqd's ``500 ERROR``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fqbroker.core.message import Message, runs_of
from fqbroker.core.publisher import DISK_FULL, PUBLISH_DENIED, QUEUE_FULL
from fqbroker.frontends.http import auth
from fqbroker.frontends.http.host import HttpHost
from fqbroker.protocols.fq import wire

__all__ = ["Answer", "error", "failure", "failure_status", "submit"]


@dataclass(frozen=True, slots=True)
class Answer:
    """What /submit answers; endpoints.py sends it as a reply."""

    status: int
    body: bytes
    reason: bytes = b""  # empty: the standard phrase
    close: bool = False  # end the connection after it


# Reads the request's body, at most the bytes given; None when the client cut it short.
ReadBody = Callable[[int], Awaitable[bytes | None]]


def error(text: str, *, close: bool = False) -> Answer:
    """fqd's exact body and status line: "500 ERROR" and { "error": "<msg>" }
    (docs/fq-protocol.md §4.2)."""
    return Answer(500, _error_body(text), b"ERROR", close)


def failure_status(why: str) -> int:
    """The HTTP status of a confirm's failure: 507 when storage is full (the disk, or a
    reject-policy queue), 403 when the publisher may not publish there, 500 for any other
    failed write or fsync. /submit and the admin API's publish answer alike."""
    if why.startswith((DISK_FULL, QUEUE_FULL)):
        return 507
    if why == PUBLISH_DENIED:
        return 403
    return 500


def failure(why: str) -> Answer:
    """A confirm's failure as /submit answers it (:func:`failure_status`); a 500 is fqd's
    ``500 ERROR``, which clients of fqd read as a failure already."""
    status = failure_status(why)
    return error(why) if status == 500 else Answer(status, _error_body(why))


def _error_body(text: str) -> bytes:
    return b'{ "error": ' + json.dumps(text).encode() + b" }\n"


async def submit(
    broker: HttpHost, headers: dict[bytes, bytes], expects_continue: bool, read_body: ReadBody
) -> Answer:
    """Publish the body as one message, as fqd's /submit does
    (docs/fq-protocol.md §4.2, §1.11). ``expects_continue``: the client waits for a
    ``100 Continue`` before it sends the body."""
    if b"transfer-encoding" in headers or b"content-length" not in headers:
        # fqd needs the length up front; chunked bodies get the same answer.
        return error("no message")
    length = int(headers[b"content-length"])  # h11 has checked it is a number
    # The body, and the frame made of it: what the budget holds while we read, as the
    # requester's share of it (capped per connection and per user, docs/memory.md).
    reserve = 2 * length
    user = auth.credentials(headers).user
    share = broker.budget.share(None if user is None else user.encode())
    try:
        if length > min(broker.settings.max_message_size, broker.settings.http_max_body) or (
            reserve > share.cap
        ):
            # fqd takes any size; we refuse before reading, as the data channel would,
            # and the body is discarded as it arrives (docs/memory.md).
            return Answer(413, b'{ "error": "message too large" }\n', close=True)
        await share.acquire(reserve)  # publishers are slowed while it is spent
        return await _publish_body(broker, headers, length, expects_continue, read_body)
    finally:
        share.close()


async def _publish_body(
    broker: HttpHost,
    headers: dict[bytes, bytes],
    length: int,
    expects_continue: bool,
    read_body: ReadBody,
) -> Answer:
    sender = headers.get(b"x-fq-sender") or b"_web"
    route = headers.get(b"x-fq-route")
    exchange = headers.get(b"x-fq-exchange")
    problem = _header_problem(sender, route, exchange)
    msgid = _msgid(headers.get(b"x-fq-msg-id"))
    if msgid == b"" and not problem:
        # An extension of ours, so an HTTP answer of our own: the client can fix it.
        return Answer(400, _error_body(BAD_MSGID), close=True)
    if problem and expects_continue:
        # No need to take a body we will refuse anyway.
        return error(problem, close=True)
    payload = await read_body(length)
    if payload is None:
        return error("short message", close=True)
    if not payload:
        return error("no message")
    if problem:
        return error(problem)
    assert route is not None and exchange is not None
    # One hop, the node id: fqd sends none, which the npm client rejects
    # (docs/fq-protocol.md §9 point 6).
    msg = Message(exchange, route, payload, msgid or broker.msgids.next(), sender, broker.node_id)
    publisher = broker.make_publisher()
    # With an id of the client's: a message a queue took already is dropped, and this
    # answer is still 200 (docs/confirms.md, "Exactly once").
    publisher.dedup = msgid is not None
    # Block policy: the answer waits for room. Then the confirm's own answer: written,
    # durable under each disk queue's fsync policy, and refused by no reject queue.
    await publisher.publish_all(runs_of([msg]), len(payload))
    why = await publisher.confirm(publisher.handled)
    if why is not None:
        return failure(why)
    result = publisher.stats  # this message's outcome
    body = (
        f'{{"routed":{result.routed},"dropped":{result.dropped},'
        f'"no_route":{result.no_route},"no_exchange":{result.no_exchange}}}\n'
    )
    return Answer(200, body.encode())


BAD_MSGID = "X-Fq-Msg-Id must be 32 hex digits (a 16-byte message id)"


def _msgid(value: bytes | None) -> bytes | None:
    """The id ``X-Fq-Msg-Id`` gives: None without the header, b"" when it is not one."""
    if value is None:
        return None
    try:
        msgid = bytes.fromhex(value.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return b""
    return msgid if len(msgid) == 16 else b""


def _header_problem(sender: bytes, route: bytes | None, exchange: bytes | None) -> str | None:
    """fqd's header checks, in fqd's order (docs/fq-protocol.md §4.2); None when all is
    well."""
    if len(sender) > wire.MAX_RK_LEN:
        return "sender too long"
    if route is None:
        return "missing route"
    if len(route) > wire.MAX_RK_LEN:
        return "route too long"
    if exchange is None:
        return "missing exchange"
    if len(exchange) > wire.MAX_RK_LEN:
        return "exchange too long"
    return None
