"""HTTP on the broker's port: stats, metrics, submit, checkpoints, the web UI (fqd_http.c).

The listener hands us a connection whose first 4 bytes said ``GET ``, ``HEAD``, ``POST`` or
``PUT `` (docs/fq-protocol.md §4.1). h11 does the parsing, sans I/O: we feed it those 4
bytes and then whatever the socket gives, and this module only moves bytes and picks
endpoints (:class:`_Connection`). The broker is reached through the narrow Protocols of
:mod:`fqbroker.frontends.http.host`, never imported.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from urllib.parse import unquote, urlsplit

import aiofiles.os
import h11

from fqbroker.frontends.http import auth, checkpoints, crosssite, submit
from fqbroker.frontends.http.admin import routes as admin
from fqbroker.frontends.http.host import HttpHost
from fqbroker.frontends.http.reads import guard, topics
from fqbroker.frontends.http.reads import queues as replay
from fqbroker.frontends.http.stats.snapshot import http_counters
from fqbroker.frontends.kit.connections import peer_address

__all__ = ["serve"]

log = logging.getLogger(__name__)

READ_SIZE = 65536
LINGER_SECONDS = 1.0  # how long a close waits for the client to read the last reply
MAX_HEADER_BYTES = 32 * 1024  # request line plus headers
MAX_OTHER_BODY = 64 * 1024  # bodies nobody reads (GET with a body, checkpoints, ...)
PACKAGED_WEB_ROOT = Path(__file__).parent / "web"

CHECKPOINT_PATHS = checkpoints.PATHS
ADMIN_PATHS = CHECKPOINT_PATHS | {"/submit"}

# fqd's table (docs/fq-protocol.md §4.2), then what a modern UI adds. Text types say UTF-8
# so that names in the UI render the same in every browser; fqd sends no charset.
MIME_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".json": "application/json",
    ".css": "text/css; charset=utf-8",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".png": "image/png",
    ".html": "text/html; charset=utf-8",
    ".htm": "text/html; charset=utf-8",
    ".svg": "image/svg+xml",
    ".ico": "image/x-icon",
    ".woff2": "font/woff2",
    ".txt": "text/plain; charset=utf-8",
}


@dataclass(slots=True)
class Reply:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    reason: bytes = b""  # empty: the standard phrase
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    close: bool = False  # end the connection after this reply


class _BodyTooLarge(Exception):
    pass


class _BodyCut(Exception):
    """The client closed the connection before the body it announced was complete."""


def _json_reply(status: int, obj: object, *, close: bool = False) -> Reply:
    return Reply(status, json.dumps(obj).encode() + b"\n", close=close)


def _refused_reply(status: int, text: str) -> Reply:
    # The admin API's error shape, which fq-admin and the web UI show as they are.
    return _json_reply(status, {"status": "error", "error": text})


NOT_FOUND = Reply(404, content_type="text/html")


async def serve(
    broker: HttpHost, first4: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Serve HTTP requests on a connection until the client or an error ends it."""
    counters = http_counters(broker)
    counters.accepted += 1
    counters.open_connections += 1
    try:
        await _Connection(broker, reader, writer, first4).run()
    finally:
        counters.open_connections -= 1
        writer.close()


class _Connection:
    """One HTTP connection: requests read, authorized and answered in order.

    Where fqd answers one request per connection, this is a real HTTP/1.1 server: keep-alive
    and pipelining work, every reply has a Content-Length, and an HTTP/1.0 request gets its
    reply and a close. Endpoints, bodies and error texts are fqd's (docs/fq-protocol.md §4.2);
    the differences (status line version, HEAD without body, errors where fqd crashes) are
    listed in docs/http.md. Limits keep a bad client from hurting anyone else: headers are
    bounded (431), bodies are bounded (413), and each read waits at most
    ``idle_sniff_timeout``.

    Admin endpoints (/submit, checkpoints, /shutdown) need the ``admin_token`` or an admin
    user once either exists; the rest (/stats.json, /frontends.json, /node.json, /metrics,
    the replay and topic reads, the static files) need credentials only with
    ``http_auth_reads``. :mod:`fqbroker.frontends.http.auth` decides, before anything of the
    request is acted on. Under ``auth = "password"`` the contents and the statistics then
    look at who asks (:mod:`fqbroker.frontends.http.reads.guard`). Before that,
    :mod:`fqbroker.frontends.http.crosssite` refuses what another web site's page may have sent
    (:meth:`_foreign`), and after it a change asked by GET or with a body that is not JSON
    (:meth:`_misused`).
    """

    def __init__(
        self,
        broker: HttpHost,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        first4: bytes,
    ) -> None:
        self.broker = broker
        self.reader = reader
        self.writer = writer
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        self.conn.receive_data(first4)
        self.eof = False

    async def run(self) -> None:
        conn = self.conn
        first = True
        while True:
            head = False  # a reply to HEAD has no body, an error reply neither
            try:
                event = await self._next_request(first)
                first = False
                if not isinstance(event, h11.Request):
                    return  # ConnectionClosed: the client is done
                head = event.method == b"HEAD"
                await self._respond(event)
                if conn.our_state is h11.DONE and conn.their_state is h11.SEND_BODY:
                    await self._drain_small_body()
            except h11.RemoteProtocolError as exc:
                # Unparseable, or a head over the limit: say so if we still may, then close.
                self.broker.limits.bad("http", "closing HTTP connection: %s", exc)
                if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    reply = _json_reply(exc.error_status_hint, {"error": str(exc)}, close=True)
                    await self._send(reply, head=head)
                await self._close()
                return
            except (ConnectionError, TimeoutError):
                return  # gone, stalled, or idle too long between requests
            except Exception as exc:
                self.broker.limits.bug(exc, "HTTP request")
                if conn.our_state is h11.SEND_RESPONSE:
                    reply = _json_reply(500, {"error": "internal error"}, close=True)
                    await self._send(reply, head=head)
                await self._close()
                return
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                # HTTP/1.0, "Connection: close", or a body we chose not to read.
                await self._close()
                return
            conn.start_next_cycle()

    # --- I/O ------------------------------------------------------------------------------

    async def _next_request(self, first: bool) -> h11.Event | type[h11.PAUSED]:
        """The next request's head, within the deadlines: between requests the connection
        waits at most ``http_keepalive_timeout`` for a first byte, and a head, once begun
        (or from the start of the connection), must be whole within ``http_header_timeout``
        however slowly it trickles in (a slowloris holds no connection for long)."""
        settings = self.broker.settings
        if not first and not self.conn.trailing_data[0]:
            async with asyncio.timeout(settings.http_keepalive_timeout):
                await self._read_more()
        try:
            async with asyncio.timeout(settings.http_header_timeout):
                return await self._next_event()
        except TimeoutError:
            self.broker.limits.bad(
                "http", "closing HTTP connection from %s:%d: no whole request head after %gs",
                *peer_address(self.writer.transport), settings.http_header_timeout,
            )  # fmt: skip
            raise

    async def _next_event(self) -> h11.Event | type[h11.PAUSED]:
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event  # type: ignore[return-value]  # mypy cannot narrow sentinels
            await self._read_more()

    async def _read_more(self) -> None:
        # Every read waits at most idle_sniff_timeout: a body too must keep arriving.
        async with asyncio.timeout(self.broker.settings.idle_sniff_timeout):
            data = await self.reader.read(READ_SIZE)
        self.eof = not data
        self.conn.receive_data(data)

    async def _read_body(self, limit: int) -> bytes:
        """The whole request body; raises _BodyTooLarge past ``limit`` bytes."""
        if self.conn.they_are_waiting_for_100_continue:
            self.writer.write(
                self.conn.send(
                    h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue")
                )
            )
        chunks: list[bytes] = []
        size = 0
        while True:
            try:
                event = await self._next_event()
            except h11.RemoteProtocolError:
                if self.eof:
                    raise _BodyCut from None
                raise
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > limit:
                    raise _BodyTooLarge
                chunks.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(chunks)
            else:  # ConnectionClosed: h11 reports a cut body as an error, so not reached
                raise _BodyCut

    async def _drain_small_body(self) -> None:
        """After an early reply, read what is left of a small body so keep-alive goes on."""
        if self.conn.they_are_waiting_for_100_continue:
            return  # the client holds its body back; closing is cheaper than inviting it
        with contextlib.suppress(_BodyTooLarge, _BodyCut):
            await self._read_body(MAX_OTHER_BODY)

    async def _send(self, reply: Reply, *, head: bool = False) -> None:
        headers = [
            (b"content-type", reply.content_type.encode()),
            (b"content-length", str(len(reply.body)).encode()),
            *reply.headers,
            *crosssite.SECURITY_HEADERS,  # every reply: pages, JSON, errors
        ]
        if reply.close:
            headers.append((b"connection", b"close"))
        conn = self.conn
        # h11 writes an empty reason phrase unless given one.
        reason = reply.reason or HTTPStatus(reply.status).phrase.encode()
        out = [conn.send(h11.Response(status_code=reply.status, headers=headers, reason=reason))]
        if reply.body and not head:
            out.append(conn.send(h11.Data(data=reply.body)))
        out.append(conn.send(h11.EndOfMessage()))
        self.writer.write(b"".join(b for b in out if b))
        http_counters(self.broker).responses[reply.status] += 1
        await self.writer.drain()

    async def _close(self) -> None:
        # Unread input at close() makes the kernel send RST, which can destroy the reply
        # before the client reads it; linger_close flushes and drains first.
        await linger_close(self.reader, self.writer)

    # --- endpoints ------------------------------------------------------------------------

    async def _respond(self, request: h11.Request) -> None:
        target = request.target.decode("ascii", errors="replace")
        if not target.startswith("/"):
            target = urlsplit(target).path or "/"  # absolute-form: GET http://host/path
        # fqd compares the URL exactly once the query string is split off
        # (docs/fq-protocol.md §4.1).
        path, _, query = target.partition("?")
        headers = {name: value for name, value in request.headers}  # names come lower-case
        head = request.method == b"HEAD"
        log.debug("HTTP %s %s", request.method.decode(errors="replace"), target)

        admin_path = (
            path in ADMIN_PATHS
            or path.startswith(admin.PREFIX)
            or (path == "/shutdown" and self.broker.settings.http_shutdown)
        )
        refusal = self._foreign(request, headers)
        if refusal is None:
            refusal = await self._refusal(headers, admin_path=admin_path)
        if refusal is None:
            refusal = self._misused(request, path, headers)
        if refusal is not None:
            await self._send(refusal, head=head)
            return
        if path == "/submit":  # an admin path: the check above let it through
            await self._send(await self._submit(headers), head=head)
            return
        if path.startswith(admin.PREFIX):  # the admin API (admin.py), checked above too
            await self._send(await self._admin(request, path, query, headers), head=head)
            return
        reply = await self._discard_body(headers)
        if reply is None and path in guard.PATHS:
            # Who asks, beyond the level: contents need the right on the name, and the
            # statistics name people only to some (reads/guard.py).
            peer = self.writer.get_extra_info("peername")
            source = peer[0] if isinstance(peer, tuple) else "?"
            answer = await guard.answer(self.broker, path, query, headers, source)
            if answer is not None:
                status, body, content_type, extra = answer
                reply = Reply(status, body, content_type, headers=extra)
        if reply is None:
            if path in CHECKPOINT_PATHS:
                reply = Reply(200, checkpoints.respond(self.broker, path, query))
            elif path in replay.PATHS:
                status, body, content_type, extra = replay.respond(self.broker, path, query)
                reply = Reply(status, body, content_type, headers=extra)
            elif path in topics.PATHS:
                status, body, content_type, extra = topics.respond(self.broker, path, query)
                reply = Reply(status, body, content_type, headers=extra)
            elif path == "/shutdown" and self.broker.settings.http_shutdown:
                await self._send(
                    _json_reply(200, {"status": "success", "message": "shutting down"}, close=True),
                    head=head,
                )
                self._request_shutdown()
                return
            else:
                reply = await self._static(path)
        await self._send(reply, head=head)

    def _foreign(self, request: h11.Request, headers: dict[bytes, bytes]) -> Reply | None:
        """A refusal for a request another web site's page may have sent (crosssite.py): a
        name the broker does not answer to (421, every plain request), or a change asked
        from another origin (403)."""
        tls = self.writer.get_extra_info("ssl_object") is not None
        # Over TLS the name is the certificate's business: a browser sends nothing to a
        # rebound name the broker's certificate is not for.
        problem = None if tls else crosssite.host_problem(self.broker.settings, headers)
        if problem is not None:
            self.broker.limits.refuse("http_host", "HTTP: %s", problem)
            return _refused_reply(421, problem)
        if request.method in crosssite.CHANGING_METHODS:
            problem = crosssite.cross_site_problem(headers, tls=tls)
            if problem is not None:
                self.broker.limits.refuse("http_cross_site", "HTTP: %s", problem)
                return _refused_reply(403, problem)
        return None

    def _misused(
        self, request: h11.Request, path: str, headers: dict[bytes, bytes]
    ) -> Reply | None:
        """A 405 or 415 for a state-changing endpoint reached by GET or with a body that is
        not JSON (crosssite.py). /submit is left as fq tools use it."""
        post_only = path in CHECKPOINT_PATHS or (
            path == "/shutdown" and self.broker.settings.http_shutdown
        )
        admin_api = path.startswith(admin.PREFIX)
        found = crosssite.misuse_problem(path, request.method, headers, post_only, admin_api)
        if found is None:
            return None
        reply = _refused_reply(*found)
        if found[0] == 405:
            reply.headers.append((b"allow", b"POST"))
        return reply

    async def _discard_body(self, headers: dict[bytes, bytes]) -> Reply | None:
        """Read and drop a body nobody wants; a 413 reply if it is too big to bother."""
        try:
            if int(headers.get(b"content-length", b"0")) > MAX_OTHER_BODY:
                raise _BodyTooLarge
            await self._read_body(MAX_OTHER_BODY)
        except _BodyTooLarge:
            return _json_reply(413, {"error": "request body too large"}, close=True)
        except _BodyCut:
            return _json_reply(400, {"error": "request body cut short"}, close=True)
        return None

    async def _refusal(self, headers: dict[bytes, bytes], *, admin_path: bool) -> Reply | None:
        """A 401 or 403 when the request may not use this path (auth.py); None: go on."""
        settings, users = self.broker.settings, self.broker.users
        level = auth.needs(settings, users, admin_path=admin_path)
        if level is auth.Level.OPEN:
            return None
        creds = auth.credentials(headers)
        peer = self.writer.get_extra_info("peername")
        source = peer[0] if isinstance(peer, tuple) else "?"
        logins = self.broker.logins
        outcome = await auth.attempt(level, creds, settings, users, logins, source)
        if outcome is auth.Outcome.ALLOWED:
            return None
        if outcome is auth.Outcome.THROTTLED:
            # Refused before the credentials were looked at: the right ones as the wrong.
            retry = max(1, math.ceil(logins.retry_after(source)))
            self.broker.limits.refuse(
                "http_auth_throttled", "HTTP: %s from %s refused unchecked: too many failed logins",
                creds.user or "a token", source,
            )  # fmt: skip
            reply = _json_reply(429, {"error": auth.THROTTLED_TEXT})
            reply.headers.append((b"retry-after", str(retry).encode()))
            return reply
        if outcome is auth.Outcome.FORBIDDEN:
            self.broker.limits.refuse(
                "http_forbidden", "HTTP: %s from %s lacks the right to %s",
                creds.user or "a read token", source, level.value,
            )  # fmt: skip
            return _json_reply(403, {"error": "forbidden"})
        if creds.token is not None or creds.user is not None or creds.malformed:
            # Given and wrong: worth a line (rate-limited) naming where it came from. The
            # failure spent one of its network's checks (kit/logins.py): no answer waits.
            self.broker.limits.refuse(
                "http_auth_failed", "HTTP: authentication failed for %s from %s",
                creds.user or ("a token" if creds.token else "a malformed header"), source,
            )  # fmt: skip
        if users is None and not settings.http_auth_reads:
            # Only admin_token guards, under auth = "none": the answer it had before users
            # existed, which scripts written against it expect (the suite, unchanged).
            return _json_reply(403, {"error": "forbidden"})
        reply = _json_reply(401, {"error": "authentication required"})
        reply.headers.extend(auth.challenge(settings, users))
        return reply

    async def _submit(self, headers: dict[bytes, bytes]) -> Reply:
        """/submit (submit.py): one message, answered as a publisher confirm is."""
        expects_continue = self.conn.they_are_waiting_for_100_continue
        answer = await submit.submit(self.broker, headers, expects_continue, self._submitted)
        return Reply(answer.status, answer.body, reason=answer.reason, close=answer.close)

    async def _submitted(self, length: int) -> bytes | None:
        """/submit's body; None if the client cut it short."""
        try:
            return await self._read_body(length)
        except _BodyCut:
            return None

    async def _admin(
        self, request: h11.Request, path: str, query: str, headers: dict[bytes, bytes]
    ) -> Reply:
        limit = admin.body_limit(self.broker)
        try:
            if int(headers.get(b"content-length", b"0")) > limit:
                raise _BodyTooLarge
            body = await self._read_body(limit)
        except _BodyTooLarge:
            return _json_reply(
                413, {"status": "error", "error": "request body too large"}, close=True
            )
        except _BodyCut:
            return _json_reply(
                400, {"status": "error", "error": "request body cut short"}, close=True
            )
        creds = auth.credentials(headers)
        peer = self.writer.get_extra_info("peername")
        source = peer[0] if isinstance(peer, tuple) else "?"
        who = f"{creds.user or ('token' if creds.token else 'open')}@{source}"
        method = request.method.decode("ascii", "replace")
        status, answer = await admin.respond(self.broker, method, path, query, body, who)
        reply = _json_reply(status, answer)
        if status == 405:
            reply.headers.append((b"allow", admin.allowed_methods(path).encode()))
        return reply

    def _request_shutdown(self) -> None:
        log.warning("/shutdown: stopping the broker")
        self.broker.shutdown_requested.set()

    async def _static(self, path: str) -> Reply:
        root = self.broker.settings.web_root or PACKAGED_WEB_ROOT
        found: tuple[bytes, str] | None = await _read_static_in_thread(root, path)
        if found is None:
            return NOT_FOUND
        body, content_type = found
        return Reply(200, body, content_type, headers=[(b"cache-control", b"no-cache")])


async def linger_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Send what is queued, then close without a reset.

    Closing with unread input makes the kernel send RST, which can destroy the error frame
    before the client reads it (docs/fq-protocol.md §1.8). So: flush, half-close, and
    discard input for a moment so the client sees the frame and then a clean end of stream.
    """
    # OSError, not only ConnectionError: write_eof on a socket the peer reset
    # fails with ENOTCONN.
    with contextlib.suppress(OSError, TimeoutError):
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(LINGER_SECONDS):
            while await reader.read(65536):
                pass
    writer.close()


def _read_static(root: Path, url_path: str) -> tuple[bytes, str] | None:
    """A file under ``root`` for ``url_path``, or None: missing, or outside the root.

    Like fqd, the path is resolved with symlinks followed and must stay inside the
    resolved root, so ``..``, encoded ``%2e%2e`` and symlinks out all end in a 404.
    """
    with contextlib.suppress(OSError, ValueError):  # UnicodeDecodeError is a ValueError
        rel = unquote(url_path, errors="strict")
        if "\x00" in rel:
            return None
        if rel.endswith("/"):
            rel += "index.html"
        base = root.resolve()
        file = (base / rel.lstrip("/")).resolve()
        if file.is_relative_to(base) and file.is_file():
            return file.read_bytes(), _mime_type(file.name)
    return None


# Resolving and reading in one worker-thread call: a web root on a slow or cold disk never
# stalls the loop, and a request cancelled meanwhile leaves no file open (aiofiles's file
# objects hand off open, read and close separately: slower, bench/RESULTS.md).
_read_static_in_thread = aiofiles.os.wrap(_read_static)


def _mime_type(name: str) -> str:
    return MIME_TYPES.get(Path(name).suffix.lower(), "application/octet-stream")
