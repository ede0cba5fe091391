"""Who reads what over HTTP: message contents and the statistics (docs/security.md, "Who
reads what over HTTP").

The levels of :mod:`fqbroker.frontends.http.auth` decide first, for every path. Under
``auth = "password"`` these paths then look at who is asking, with or without
``http_auth_reads``: ``/queue/*`` and ``/topic/*`` need the fq right on the name
(auth.content_outcome), and the statistics name users, clients and files only to a user
or the admin token (auth.sees_names). :func:`answer` is called for :data:`PATHS` only.
"""

from __future__ import annotations

import json
import math
from urllib.parse import parse_qs

from fqbroker.frontends.http import auth
from fqbroker.frontends.http.host import HttpHost
from fqbroker.frontends.http.reads import queues, topics
from fqbroker.frontends.http.reads.queues import Answer
from fqbroker.frontends.http.stats import node
from fqbroker.frontends.http.stats.frontends import render_front_ends_json
from fqbroker.frontends.http.stats.snapshot import render_stats_json

__all__ = ["CONTENT_PATHS", "PATHS", "STATS_PATHS", "answer"]

STATS_PATHS = frozenset({"/stats.json", "/frontends.json", node.PATH, "/metrics"})
CONTENT_PATHS = queues.PATHS | topics.PATHS
PATHS = STATS_PATHS | CONTENT_PATHS


async def answer(
    broker: HttpHost, path: str, query: str, headers: dict[bytes, bytes], source: str
) -> Answer | None:
    """The statistics, or a 401 or 403 for message contents; None: the contents may be
    read (the read itself answers).

    Credentials are checked through the broker's login throttle here too, and given and
    wrong they are refused, as the levels' check does (auth.attempt): else a wrong password
    would be answered with a plainer document, an oracle for guessing that no throttle
    counts. ``source`` is the client's address.
    """
    users = broker.users
    identity = auth.Identity(auth.Who.ANONYMOUS)
    if users is not None:
        creds = auth.credentials(headers)
        logins = broker.logins
        checked = await auth.identify_attempt(creds, broker.settings, users, logins, source)
        if checked is None:
            broker.limits.refuse(
                "http_auth_throttled", "HTTP: %s from %s refused unchecked: too many failed logins",
                creds.user or "a token", source,
            )  # fmt: skip
            retry = max(1, math.ceil(logins.retry_after(source)))
            body = json.dumps({"error": auth.THROTTLED_TEXT}).encode() + b"\n"
            return 429, body, "application/json", [(b"retry-after", str(retry).encode())]
        identity = checked
        if identity.who is auth.Who.INVALID:
            broker.limits.refuse(
                "http_auth_failed", "HTTP: authentication failed for %s from %s",
                creds.user or ("a token" if creds.token else "a malformed header"), source,
            )  # fmt: skip
            return _refused(broker, 401)
    if path in CONTENT_PATHS:
        return _content_refusal(broker, path, query, identity, source)
    names = auth.sees_names(identity, users)
    if path == "/stats.json":
        return 200, render_stats_json(broker, names=names), "application/json", []
    if path == "/frontends.json":
        return 200, render_front_ends_json(broker, names=names), "application/json", []
    if path == node.PATH:
        return 200, await node.render_node_json(broker, names=names), "application/json", []
    # /metrics. prometheus_client costs memory a broker never scraped does without:
    # loaded here (bench/RESULTS.md, "Figures behind comments in the code").
    from fqbroker.frontends.http.stats.metrics import render_metrics

    body, content_type = render_metrics(
        broker, headers.get(b"accept", b"").decode("latin-1"), names=names
    )
    return 200, body, content_type, []


def _content_refusal(
    broker: HttpHost, path: str, query: str, identity: auth.Identity, source: str
) -> Answer | None:
    users = broker.users
    if users is None:
        return None  # auth = "none": anyone may attach any queue over fq, and read here
    kind = "queue" if path in queues.PATHS else "topic"
    given = parse_qs(query, keep_blank_values=True).get(kind)
    if not (given and given[0]) and identity.who is auth.Who.USER:
        return None  # the read says what is missing (400)
    name = given[0].encode() if given else b""
    queue = broker.queues.get(name) if kind == "queue" else None
    owner = queue.owner if queue is not None and queue.private else None
    outcome = auth.content_outcome(identity, users, kind, name, owner)
    if outcome is auth.Outcome.ALLOWED:
        return None
    if outcome is auth.Outcome.FORBIDDEN:
        broker.limits.refuse(
            "http_forbidden", "HTTP: %s from %s may not read %s %r",
            identity.user.decode(errors="replace") or identity.who.value, source, kind,
            name.decode(errors="replace"),
        )  # fmt: skip
        return _refused(broker, 403)
    return _refused(broker, 401)


def _refused(broker: HttpHost, status: int) -> Answer:
    """The answers of auth.py's levels: 403, or 401 with the schemes accepted."""
    if status == 403:
        return 403, b'{"error": "forbidden"}\n', "application/json", []
    body = json.dumps({"error": "authentication required"}).encode() + b"\n"
    return 401, body, "application/json", auth.challenge(broker.settings, broker.users)
